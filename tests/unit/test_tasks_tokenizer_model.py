"""The embedded task, the character tokenizer and the model loading path."""

from __future__ import annotations

import random

import pytest
import torch

from reasonrl.data import tasks
from reasonrl.models.loading import build_tiny_model, load_model, load_tokenizer
from reasonrl.data.tokenizer import build_char_tokenizer
from reasonrl.reward.math import dapo_score


def test_worked_solutions_are_right_and_graded_correct():
    problems = tasks.generate(("add", "mul", "sum"), 300, seed=3, split="train")
    assert {p.family for p in problems} == {"add", "mul", "sum"}
    for p in problems:
        expr = p.question.split("=")[0]
        assert eval(expr) == p.answer  # the question is a valid Python expression
        assert p.solution.endswith(f"Answer: {p.answer}")
        for line in p.solution.splitlines()[:-1]:  # every worked step is true arithmetic
            lhs, rhs = line.split("=")
            assert eval(lhs) == int(rhs), line
        assert dapo_score(p.solution, str(p.answer))["acc"]


def test_known_problem_layout():
    # 47+38: units 7+8=15 (carry 1), tens 4+3+1=8 -> 85
    rng = random.Random(0)
    p = tasks._problem("47+38", ["7+8=15", "4+3+1=8"], 85, "add")
    assert p.question == "47+38=?\n" and p.solution == "7+8=15\n4+3+1=8\nAnswer: 85"
    assert tasks.FAMILIES["mul"](rng).solution.count("\n") == 3


def test_splits_are_disjoint_deterministic_and_distinct():
    train = tasks.generate(("add", "mul", "sum"), 3000, seed=0, split="train")
    test = tasks.generate(("add", "mul", "sum"), 256, seed=0, split="test")
    assert not {p.question for p in train} & {p.question for p in test}
    assert len({p.question for p in test}) == 256
    again = tasks.generate(("add", "mul", "sum"), 256, seed=0, split="test")
    assert [p.question for p in again] == [p.question for p in test]
    other = tasks.generate(("add", "mul", "sum"), 256, seed=1, split="test")
    assert [p.question for p in other] != [p.question for p in test]


def _hard(p: tasks.Problem) -> bool:
    """The cut of each family's levels, computed from the question."""
    expr = p.question.split("=")[0]
    if p.family == "add":
        a, b = map(int, expr.split("+"))
        return a % 10 + b % 10 >= 10
    if p.family == "mul":
        return int(expr.split("*")[1]) >= 6
    if p.family == "sum":
        return eval(expr) >= 10
    if p.family == "chain":
        return expr.count("+") >= 3
    return int(p.question.split("+")[1]) >= 10  # code: f(x)=a*x+b


def test_difficulty_levels_keep_their_side_of_each_familys_cut():
    families = ("add", "mul", "sum", "chain", "code")
    full = tasks.generate(families, 500, seed=2, split="train")
    assert {_hard(p) for p in full if p.family != "code"} == {False, True}  # full: both sides of every cut
    for level in ("easy", "hard"):
        problems = tasks.generate(families, 500, seed=2, split="train", difficulty={f: level for f in families})
        assert {p.family for p in problems} == set(families)
        assert all(_hard(p) == (level == "hard") for p in problems)
    mixed = tasks.generate(("add", "mul"), 100, seed=2, split="test", difficulty={"mul": "hard"})
    assert {_hard(p) for p in mixed if p.family == "add"} == {False, True}
    assert all(_hard(p) for p in mixed if p.family == "mul")
    assert tasks.generate(families, 50, 2, "train", {f: "full" for f in families}) == tasks.generate(families, 50, 2, "train")
    with pytest.raises(ValueError, match="data.difficulty.div: 'div' is not one of data.families"):
        tasks.generate(("add",), 4, 0, "train", {"div": "easy"})
    with pytest.raises(ValueError, match="data.difficulty.add = 'medium': expected one of easy, full, hard"):
        tasks.generate(("add",), 4, 0, "train", {"add": "medium"})


def test_bad_family_and_split_are_clear_errors():
    with pytest.raises(ValueError, match=r"data.families: unknown task families \['div'\]; allowed: \['add', 'chain', 'code', 'mul', 'sum'\]"):
        tasks.generate(("add", "div"), 4, 0, "train")
    with pytest.raises(ValueError, match="split must be 'train' or 'test'"):
        tasks.generate(("add",), 4, 0, "dev")
    with pytest.raises(ValueError, match="cannot draw 500 distinct test problems"):
        tasks.generate(("sum",), 500, 0, "test")  # only 9**3 sums exist, a fifth of them in test


def test_char_tokenizer_round_trips_and_reloads_identically(tmp_path):
    tok = build_char_tokenizer()
    text = "47*8=?\n7*8=56\nAnswer: 376"
    ids = tok(text)["input_ids"]
    assert len(ids) == len(text) and tok.decode(ids) == text
    assert tok.pad_token_id == 0 and tok.eos_token_id == 1
    assert tok("é")["input_ids"] == [tok.unk_token_id]
    tok.save_pretrained(tmp_path)
    (tmp_path / "config.json").write_text('{"model_type": "qwen2"}')  # as beside a saved model
    loaded = load_tokenizer(tmp_path)
    assert loaded(text)["input_ids"] == ids  # AutoTokenizer would drop the trailing newline of prompts
    assert loaded("12=?\n")["input_ids"][-1] == tok("\n")["input_ids"][0]


def test_tiny_model_saves_and_loads_through_the_hf_path(tmp_path):
    tok = build_char_tokenizer()
    model = build_tiny_model(len(tok), 64, 2, 4, 2, 128, tok.pad_token_id, tok.eos_token_id, seed=0)
    n = sum(p.numel() for p in model.parameters())
    assert 50_000 < n < 200_000
    model.save_pretrained(tmp_path)
    loaded = load_model(tmp_path)
    x = torch.tensor([tok("12+3=?\n")["input_ids"]])
    torch.testing.assert_close(loaded(x).logits, model(x).logits)


def test_missing_model_dir_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="model.path: .* is not a Hugging Face model directory"):
        load_model(tmp_path / "nope")
