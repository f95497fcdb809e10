"""run.loggers: the W&B backend (offline, read back from its run files), a missing wandb package,
the samples the controller decodes, and a real run logging to TensorBoard and W&B."""

from __future__ import annotations

import json
import struct
import sys
import time
from pathlib import Path

import pytest
import torch

from reasonrl.cli import RECIPES
from reasonrl.config import load
from reasonrl.controller import Controller, logger_samples, reward_extras, spread_rows
from reasonrl.models.loading import load_tokenizer
from reasonrl.errors import InputError
from reasonrl.loggers import TensorBoardLogger, WandbLogger, open_loggers
from reasonrl.metrics import Sample, read_jsonl
from reasonrl.samples import sample_records
from reasonrl.types import Prompt, ScoredBatch
from tests.conftest import synthetic_rollout, tiny_run

BLOCK, HEADER = 32 * 1024, 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def wandb_records(path: Path) -> list:
    """The protobuf records of an offline ``run-*.wandb`` file: a 7-byte file header, then
    32 KiB blocks of chunks, each with a 7-byte header (crc32, length, type) and a payload
    that is a whole record (FULL) or a piece of one (FIRST, MIDDLE, LAST)."""
    from wandb.proto.wandb_internal_pb2 import Record

    data = path.read_bytes()
    assert data[:4] == b":W&B", data[:HEADER]
    records, pos, pending = [], HEADER, b""
    while pos + HEADER <= len(data):
        if BLOCK - pos % BLOCK < HEADER:  # a block's tail too short for a chunk header is padding
            pos += BLOCK - pos % BLOCK
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + HEADER])
        if kind == 0:  # zero padding up to the end of the block
            pos += BLOCK - pos % BLOCK
            continue
        if pos + HEADER + length > len(data):  # still being written
            break
        pending += data[pos + HEADER:pos + HEADER + length]
        pos += HEADER + length
        if kind in (FULL, LAST):
            records.append(Record.FromString(pending))
            pending = b""
    return records


class OfflineRun:
    """What the offline W&B runs under ``run_dir/wandb`` recorded, in the order they ran.

    ``run.finish()`` returns before wandb's service has written all of a run's file, so this
    waits (up to ``timeout_s``) until every file ends with its exit record."""

    def __init__(self, run_dir: Path, timeout_s: float = 30.0) -> None:
        self.dirs = sorted((run_dir / "wandb").glob("offline-run-*"))
        deadline = time.monotonic() + timeout_s
        while True:
            self.records = [[r for f in sorted(d.glob("run-*.wandb")) for r in wandb_records(f)] for d in self.dirs]
            if all(rs and rs[-1].WhichOneof("record_type") == "exit" for rs in self.records) or time.monotonic() > deadline:
                break
            time.sleep(0.1)

    def of(self, kind: str, attempt: int) -> list:
        return [getattr(r, kind) for r in self.records[attempt] if r.WhichOneof("record_type") == kind]

    def run_ids(self) -> list[str]:
        return [run.run_id for attempt in range(len(self.dirs)) for run in self.of("run", attempt)]

    def config(self, attempt: int) -> dict:
        [run] = self.of("run", attempt)
        return {item.key: json.loads(item.value_json) for item in run.config.update}

    def history(self, attempt: int) -> list[dict]:
        """One dict per history row: dotted keys, decoded JSON values (``_step`` included)."""
        return [{"/".join(i.nested_key) or i.key: json.loads(i.value_json) for i in h.item} for h in self.of("history", attempt)]

    def tables(self, attempt: int) -> list[dict]:
        return [json.loads(p.read_text()) for p in sorted((self.dirs[attempt] / "files/media/table").glob("samples_*.table.json"))]


@pytest.fixture
def offline(monkeypatch):
    pytest.importorskip("wandb", reason="the wandb logger needs the optional wandb package (pip install 'reasonrl[wandb]')")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")


def next_second() -> None:
    """Wait for the clock's next second: an offline run's directory is named after the second
    it started in, and a resume always starts later than that (it loads a model first)."""
    time.sleep(1 - time.time() % 1 + 0.01)


def steps(history: list[dict], key: str) -> list[int]:
    return [row["_step"] for row in history if key in row]


def test_a_resumed_wandb_run_keeps_its_id_and_skips_the_steps_it_has(tmp_path, offline):
    config = {"run": {"seed": 0}, "algo": {"eps_high": 0.28}}
    first = WandbLogger(tmp_path, config, project="reasonrl", mode="offline")
    first.rewind(-1, -1)
    for step in (0, 1, 2, 3):
        first.log_metrics(step, {"train/acc": step / 10})
    first.close()
    first.close()  # closing twice is harmless
    next_second()
    # The checkpoint was at step 1: steps 2 and 3 are redone, then step 4 is new.
    second = WandbLogger(tmp_path, config, project="reasonrl", mode="offline")
    second.rewind(1, 3)
    for step in (2, 3, 4):
        second.log_metrics(step, {"train/acc": 0.9})
        second.log_samples(step, [Sample("1+1=", "2", 1.0, True)])
    second.close()
    run_id = (tmp_path / "wandb" / "run_id").read_text().strip()
    got = OfflineRun(tmp_path)
    assert len(got.dirs) == 2 and got.run_ids() == [run_id, run_id]
    assert second.resumed and not first.resumed
    assert steps(got.history(0), "train/acc") == [0, 1, 2, 3]
    assert [(row["_step"], row["train/acc"]) for row in got.history(1) if "train/acc" in row] == [(4, 0.9)]
    assert [t["data"] for t in got.tables(1)] == [[[4, "1+1=", "2", 1.0, True]]]
    assert got.config(0)["algo"] == {"eps_high": 0.28}


@pytest.mark.parametrize("names, kinds", [("[]", []), ("[tensorboard]", [TensorBoardLogger])])
def test_only_the_chosen_loggers_are_opened(tmp_path, names, kinds, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # not chosen: never imported
    loggers = open_loggers(load(None, [f"run.loggers={names}"]), tmp_path)
    assert [type(logger) for logger in loggers] == kinds
    assert not list(tmp_path.iterdir())  # TensorBoard writes nothing before the first row


def test_missing_wandb_is_an_input_error_before_anything_is_built(tmp_path, model_dir, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb raises ImportError
    cfg = load(None, [*tiny_run(model_dir, tmp_path / "run"), "run.loggers=[tensorboard,wandb]"])
    with pytest.raises(InputError, match=r"run\.loggers.*pip install 'reasonrl\[wandb\]'"):
        Controller.from_config(cfg)
    assert not (tmp_path / "run").exists()


def test_wandb_without_a_login_is_an_input_error(tmp_path, offline, monkeypatch):
    import wandb

    def no_login(**kwargs):
        raise wandb.errors.UsageError("No API key configured. Use `wandb login` to log in.")

    monkeypatch.setattr(wandb, "init", no_login)
    with pytest.raises(InputError, match=r"run\.loggers: wandb\.init failed in online mode .*run\.wandb_mode=offline"):
        WandbLogger(tmp_path, {}, project="reasonrl", mode="online")


def test_spread_rows_takes_one_sample_per_prompt_first():
    assert spread_rows([0, 0, 0, 1, 1, 1], 4) == [0, 3, 1, 4]
    assert spread_rows([0, 0, 1, 1], 8) == [0, 2, 1, 3]
    assert spread_rows([0, 0], 0) == []


def test_sample_records_give_prompt_response_answer_and_reward_breakdown(model_dir):
    tokenizer = load_tokenizer(model_dir)
    prompts = ["12+7=", "3*4="]
    rollout = synthetic_rollout(B=4, P=8)
    for row, text in enumerate([prompts[0], prompts[0], prompts[1], prompts[1]]):
        ids = tokenizer(text)["input_ids"]
        rollout.prompt_ids[row] = torch.tensor([tokenizer.pad_token_id] * (8 - len(ids)) + ids)
        rollout.prompt_mask[row] = torch.tensor([0] * (8 - len(ids)) + [1] * len(ids))
    rollout.group_ids = torch.tensor([0, 0, 1, 1])
    rows = [Prompt("a", prompts[0], "19", "add"), Prompt("a", prompts[0], "19", "add"),
            Prompt("m", prompts[1], "12", "mul"), Prompt("m", prompts[1], "12", "mul")]
    scored = ScoredBatch(rollout, rows, ["19", "20", "12", "7"], torch.tensor([1.0, 0.0, 1.0, -0.5]),
                         torch.tensor([True, False, True, False]), torch.zeros(4, dtype=torch.bool),
                         preds=["19", "20", "12", "7"], extras=[{"format": 1.0}, {"format": 0.0}, {}, {"tests_passed": 2}])
    records = sample_records(scored, tokenizer, "train", 5, spread_rows([0, 0, 1, 1], 3))
    assert [(r["prompt_id"], r["sample"], r["prompt"], r["response"], r["pred"], r["score"], r["correct"]) for r in records] == [
        ("a", 0, "12+7=", "19", "19", 1.0, True), ("m", 0, "3*4=", "12", "12", 1.0, True), ("a", 1, "12+7=", "20", "20", 0.0, False)]
    assert records[0]["format"] == 1.0 and records[0]["step"] == 5 and records[0]["split"] == "train"
    assert records[0]["ground_truth"] == "19" and records[0]["data_source"] == "add" and records[0]["length"] == rollout.lengths[0]
    assert logger_samples(records, 2) == [Sample("12+7=", "19", 1.0, True), Sample("3*4=", "12", 1.0, True)]
    assert logger_samples(records, 5, first_of_each=True) == logger_samples(records, 2)
    assert reward_extras(scored) == {"reward/format": 0.5, "reward/tests_passed": 2.0}


@pytest.mark.slow
def test_a_run_logs_config_metrics_and_samples_to_tensorboard_and_wandb(tmp_path, model_dir, offline, capfd):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    def cfg(total_steps: int):
        return load(RECIPES / "dapo.yaml", [*tiny_run(model_dir, tmp_path, steps=total_steps), "run.loggers=[tensorboard,wandb]",
                                            "run.log_every=2", "run.log_samples=3", "algo.max_gen_batches=20", "algo.overlong_buffer=4",
                                            "eval.every_steps=2", "run.keep_samples=5"])

    Controller.from_config(cfg(3)).run()
    console = [line for line in capfd.readouterr().err.splitlines() if line.startswith("step ")]
    assert [line.split()[:2] for line in console] == [["step", "2/3"]]
    assert all(f" {label}=" in console[0] for label in ("reward", "acc", "pg_loss", "grad_norm", "kl", "len", "tok/s"))
    Controller.from_config(cfg(4)).run()  # resumes from the final checkpoint of step 3

    rows = read_jsonl(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1, 2, 3, 4]  # 0: the validation before training
    by_step = {r["step"]: r for r in rows}
    rows = rows[1:]
    for r in rows:
        assert r["perf/total_num_tokens"] > 0 and r["perf/throughput"] == pytest.approx(r["perf/total_num_tokens"] / r["timing_s/step"])

    got = OfflineRun(tmp_path)
    assert len(got.dirs) == 2 and len(set(got.run_ids())) == 1  # one W&B run across the resume
    config = got.config(0)
    assert config["run"]["loggers"] == ["tensorboard", "wandb"] and config["algo"]["eps_high"] == 0.28
    assert config["train"]["total_steps"] == 3 and got.config(1)["train"]["total_steps"] == 4
    history = got.history(0) + got.history(1)
    assert steps(history, "critic/score/mean") == [1, 2, 3, 4]
    assert steps(history, "perf/throughput") == [1, 2, 3, 4]
    assert steps(history, "samples/path") == [2, 4]
    [table] = got.tables(0)
    assert table["columns"] == ["step", "prompt", "response", "reward", "acc"]
    assert len(table["data"]) == 3 and all(row[0] == 2 and isinstance(row[1], str) and row[1] for row in table["data"])
    row2 = next(r for r in rows if r["step"] == 2)
    assert row2["critic/score/mean"] == pytest.approx(next(h for h in history if h["_step"] == 2)["critic/score/mean"])

    tb = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"scalars": 0, "tensors": 0})
    tb.Reload()
    assert [e.step for e in tb.Scalars("perf/throughput")] == [1, 2, 3, 4]
    assert [e.step for e in tb.Tensors("samples/text_summary")] == [2, 4]
    assert [e.step for e in tb.Tensors("config/text_summary")] == [0, 4]
    assert "_hparams_/session_start_info" in tb.PluginTagToContent("hparams")
    # validations at 0, 2, 3 (the last step of the first run) and 4: 3 samples each, one per prompt
    assert [e.step for e in tb.Tensors("val_samples/text_summary")] == [0, 2, 3, 4]
    assert steps(history, "val_samples/path") == [0, 2, 3, 4]

    kept = read_jsonl(tmp_path / "samples.jsonl")  # the resume cut nothing: step 3 had a checkpoint
    train = [r for r in kept if r["split"] == "train"]
    assert [r["step"] for r in train] == [s for s in (1, 2, 3, 4) for _ in range(5)]  # run.keep_samples a step
    assert [r["sample"] for r in train[:5]] == [0, 0, 0, 0, 1]  # distinct prompts first
    val = [r for r in kept if r["split"] == "val"]
    for step in (0, 2, 3, 4):  # eval.n_prompts x eval.k samples, then a greedy decode of each prompt
        at = [r for r in val if r["step"] == step]
        assert len(at) == 8 * 4 + 8 and sum(r["greedy"] for r in at) == 8
        sampled = [r for r in at if not r["greedy"]]
        assert by_step[step]["val/acc"] == pytest.approx(sum(r["correct"] for r in sampled) / len(sampled))
    for r in kept:
        assert r["prompt"] and isinstance(r["response"], str) and "overlong_penalty" in r and "pred" in r
