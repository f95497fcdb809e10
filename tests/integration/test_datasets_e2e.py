"""One training step and the evaluations around it on the real files in ../shared/data (the DAPO
parquet, the ROLL JSONL) and on a saved Hugging Face DatasetDict, with a model of the embedded
kind: a tiny Llama with the character tokenizer, whose context holds these long prompts (up to
1,733 characters, so 2,048 positions instead of the embedded 256)."""

from __future__ import annotations

import pytest

from reasonrl.config import load
from reasonrl.controller import Controller
from reasonrl.data.splits import prompt_identity
from reasonrl.metrics import read_jsonl
from tests.conftest import shared

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def long_model(tmp_path_factory):
    """A tiny random Llama with the embedded character tokenizer and 2,048 positions."""
    from reasonrl.models.loading import build_tiny_model
    from reasonrl.data.tokenizer import build_char_tokenizer

    out = tmp_path_factory.mktemp("long")
    tok = build_char_tokenizer()
    build_tiny_model(len(tok), 32, 2, 4, 2, 64, tok.pad_token_id, tok.eos_token_id, seed=0, max_positions=2048).save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def saved_dict(tmp_path_factory):
    """The first 120 rows of the real DeepMath JSONL saved by datasets as a DatasetDict: 100
    for 'train', 20 for 'test'."""
    import datasets

    whole = datasets.Dataset.from_json(shared("deepmath-5k.jsonl")).select(range(120))
    out = tmp_path_factory.mktemp("hf") / "deepmath"
    datasets.DatasetDict({"train": whole.select(range(100)), "test": whole.select(range(100, 120))}).save_to_disk(str(out))
    return str(out)


def run(model_dir, run_dir, *data) -> Controller:
    """A run of one step, evaluated before and after it (the controller closes itself)."""
    overrides = [
        f"model.path={model_dir}", f"run.dir={run_dir}", "run.progress=false", "run.loggers=[]",
        "rollout.n=2", "rollout.max_new_tokens=8", "data.max_prompt_len=1800",
        "train.prompts_per_step=4", "train.mini_batch_size=4", "train.micro_batch_size=4", "train.total_steps=1",
        "eval.every_steps=1", "eval.n_prompts=4", "eval.k=2", "checkpoint.every_steps=0",
        "reward.fn=tests.reward_fixtures:coin", *data,
    ]
    controller = Controller.from_config(load(None, overrides))
    controller.run()
    return controller


@pytest.mark.parametrize("case", ["parquet", "jsonl", "saved_dict"])
def test_a_step_and_an_evaluation_on_real_data(case, long_model, tmp_path, request):
    dapo = shared("dapo-aime-2024.parquet")
    if case == "parquet":  # 30 problems x 32 copies, 4 held out by prompt
        data = [f"data.source={dapo}", "data.holdout=4"]
    elif case == "jsonl":  # ROLL's layout; DAPO's problems held out, once each (the default keys read both layouts)
        data = [f"data.source={shared('math-benchmarks.jsonl')}", f"data.test_source={dapo}", "data.dedupe=true"]
    else:  # the DatasetDict's 'train' split, its 'test' split held out; ROLL's messages column (chat messages in a JSON string)
        data = [f"data.source={request.getfixturevalue('saved_dict')}", "data.prompt_key=messages"]
    controller = run(long_model, tmp_path, *data)
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1]
    assert all(0 <= r["val/acc"] <= 1 and "val/acc_greedy" in r for r in rows)
    assert "actor/pg_loss" in rows[1] and rows[1]["response_length/mean"] > 0
    assert (tmp_path / "final" / "config.json").is_file()
    evaluated = controller.evaluator.prompts
    assert len(evaluated) == 4 and len({prompt_identity(p) for p in evaluated}) == 4
    if case == "saved_dict":
        assert [p.id for p in evaluated] == ["101", "102", "103", "104"]  # the 'test' split: rows 101-120 of the file
    else:
        assert all(p.data_source == "math_dapo" for p in evaluated)
