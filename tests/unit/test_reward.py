"""Rule-based math rewards, loading reward functions by spec, batch scoring."""

from __future__ import annotations


import pytest
import torch

from reasonrl.reward import boxed_score, dapo_score, load_reward_fn, normalize_final_answer, score_batch
from tests.conftest import SHARED_DATA as DATA


@pytest.mark.parametrize(
    "response, truth, acc, pred",
    [
        ("Let me think...\nAnswer: 42", "42", True, "42"),
        ("Let me think...\nAnswer: 41", "42", False, "41"),
        ("Answer: 41\nwait, no.\nAnswer: 42", "42", True, "42"),
        ("Answer: 42\nwait, no.\nAnswer: 41", "42", False, "41"),
        ("answer : 1,000", "1000", True, "1000"),
        ("ANSWER:   $\\boxed{7}$.", "7", True, "7"),
        ("Answer: x = 5 \\text{ units}", "5", True, "5"),
        ("Answer: \\frac12", "\\frac{1}{2}", True, "\\frac{1}{2}"),
        ("the answer is 42", "42", False, "[INVALID]"),
        ("Answer: 42" + "." * 400, "42", False, "[INVALID]"),
        ("Answer:", "", False, "[INVALID]"),
    ],
)
def test_dapo_score(response, truth, acc, pred):
    result = dapo_score(response, truth)
    assert result == {"score": 1.0 if acc else -1.0, "acc": acc, "pred": pred}


@pytest.mark.parametrize(
    "response, truth, acc, pred",
    [
        ("so the answer is \\boxed{\\frac{1}{2}}.", "\\frac{1}{2}", True, "\\frac{1}{2}"),
        ("\\boxed{\\frac{1}{2}}", "0.5", False, "\\frac{1}{2}"),
        ("first \\boxed{3}, then \\boxed{42}", "42", True, "42"),
        ("\\boxed{{a}+{b}}", "{a}+{b}", True, "{a}+{b}"),
        ("$\\boxed 5$", "5", True, "5"),
        ("\\fbox{12}", "12", True, "12"),
        ("\\boxed{1,000}", "1000", True, "1000"),
        ("\\boxed{7", "7", False, "[INVALID]"),
        ("\\boxed{}", "", False, "[INVALID]"),
        ("no box here: 42", "42", False, "[INVALID]"),
    ],
)
def test_boxed_score(response, truth, acc, pred):
    assert boxed_score(response, truth) == {"score": 1.0 if acc else -1.0, "acc": acc, "pred": pred}


def test_normalize_final_answer():
    assert normalize_final_answer("\\text{(C)}") == "(C)"
    assert normalize_final_answer("$1,234,567$") == "1234567"
    assert normalize_final_answer("a $x$ and $y$") == "x"
    assert normalize_final_answer("90^\\circ") == "90"
    assert normalize_final_answer("\\sqrt2") == "\\sqrt{2}"


GARBAGE = [
    "",
    None,
    b"\xff\xfe\x00junk",
    12,
    ["a"],
    "\x00\x01\x02" * 100,
    "x" * 1_000_000,
    "{" * 100_000 + "Answer: 5",
    "\\boxed{" * 100_000,
    "\\text{" * 100_000,
    "$" * 100_000,
    "\\boxed{" + "a" * 100_000 + "}",
    "}}\\boxed{",
    "\\boxedx",
]


@pytest.mark.timeout(60)  # a pattern that backtracks without end on some input would hang here: it fails instead
@pytest.mark.parametrize("fn", [dapo_score, boxed_score])
def test_garbage_never_raises_and_never_hangs(fn):
    for junk in GARBAGE:
        for result in (fn(junk, "5"), fn("Answer: 5 \\boxed{5}", junk)):
            assert set(result) == {"score", "acc", "pred"}
            assert result["score"] in (1.0, -1.0) and isinstance(result["pred"], str)


def test_dapo_score_on_real_ground_truths():
    file = DATA / "dapo-aime-2024.parquet"
    if not file.is_file():
        pytest.skip(f"{file} is absent")
    import pyarrow.parquet as pq

    truths = [row["ground_truth"] for row in pq.read_table(file, columns=["reward_model"]).column(0).to_pylist()]
    assert len(truths) == 960
    for truth in truths:
        assert dapo_score("Let me solve it.\nAnswer: " + truth, truth)["acc"]
        assert not dapo_score("Let me solve it.\nAnswer: " + truth + "1", truth)["acc"]


def test_load_builtin_reward_fns():
    assert load_reward_fn("dapo") is dapo_score
    assert load_reward_fn("boxed") is boxed_score


def test_load_custom_reward_fn(tmp_path, monkeypatch):
    (tmp_path / "my_rewards.py").write_text(
        "def length_reward(response, ground_truth):\n"
        "    return {'score': float(len(response)), 'acc': response == ground_truth, 'pred': response}\n"
        "NOT_CALLABLE = 3\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    fn = load_reward_fn("my_rewards:length_reward")
    assert fn("abc", "abc") == {"score": 3.0, "acc": True, "pred": "abc"}
    with pytest.raises(ValueError, match=r"'my_rewards:missing'.*no attribute 'missing'"):
        load_reward_fn("my_rewards:missing")
    with pytest.raises(ValueError, match=r"'my_rewards:NOT_CALLABLE'.*int, not a callable"):
        load_reward_fn("my_rewards:NOT_CALLABLE")


@pytest.mark.parametrize(
    "spec, message",
    [
        ("mathverify", r"'mathverify': unknown name; expected 'dapo', 'boxed', 'gsm8k', 'math_verify', 'code' or an import path"),
        ("no_such_module_xyz:fn", r"'no_such_module_xyz:fn': cannot import module 'no_such_module_xyz'"),
        (":fn", r"unknown name"),
        ("module:", r"unknown name"),
    ],
)
def test_load_reward_fn_errors(spec, message):
    with pytest.raises(ValueError, match=message):
        load_reward_fn(spec)


def test_score_batch_marks_failures():
    def flaky(response, truth):
        if response == "raise":
            raise RuntimeError("boom\nsecond line")
        if response == "list":
            return [1.0]
        if response == "noscore":
            return {"acc": True}
        if response == "nan":
            return {"score": float("nan"), "acc": True}
        if response == "text":
            return {"score": "1.0"}
        if response == "noacc":
            return {"score": 0.5}
        return dapo_score(response, truth)

    texts = ["Answer: 1", "raise", "Answer: 2", "list", "noscore", "nan", "text", "noacc"]
    g = score_batch(flaky, texts, ["1"] * len(texts))
    scores, acc, failed, errors = g.scores, g.acc, g.failed, g.errors
    assert scores.dtype == torch.float32 and acc.dtype == torch.bool and failed.dtype == torch.bool
    assert scores.tolist() == [1.0, -1.0, -1.0, -1.0, -1.0, -1.0, -1.0, 0.5]
    assert acc.tolist() == [True, False, False, False, False, False, False, True]
    assert failed.tolist() == [False, True, False, True, True, True, True, False]
    assert len(errors) == 5 and all("\n" not in e for e in errors)
    assert errors[0] == "sample 1: RuntimeError: boom second line"
    assert errors[1].startswith("sample 3: ValueError: reward function returned a list")
    assert "no 'score'" in errors[2] and "not finite" in errors[3] and "not a number" in errors[4]


def test_score_batch_empty_and_length_mismatch():
    g = score_batch(dapo_score, [], [])
    scores, acc, failed, errors = g.scores, g.acc, g.failed, g.errors
    assert scores.shape == acc.shape == failed.shape == (0,) and errors == []
    with pytest.raises(ValueError, match="2 texts but 1 ground truths"):
        score_batch(dapo_score, ["a", "b"], ["1"])
