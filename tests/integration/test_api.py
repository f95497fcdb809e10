"""The Python API: reasonrl.Config.load, reasonrl.train and reasonrl.evaluate against the command line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import get_type_hints

import pytest
import torch
from safetensors.torch import load_file

import reasonrl
from reasonrl.config import ConfigError, TrainConfig
from reasonrl.metrics import read_jsonl
from tests.conftest import tiny_run

ROOT = Path(__file__).resolve().parents[2]
TIMINGS = ("timing_s/", "time", "perf/throughput", "perf/max_memory_gb", "ettr", "time_lost_s", "mttr_s")


def _values(row: dict) -> dict:
    """A metrics row without its wall-clock readings."""
    return {k: v for k, v in row.items() if not k.startswith(TIMINGS) and not k.endswith("/busy_s")}


def _cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """``reasonrl ARGS`` in a fresh interpreter, from the repository root (tests.reward_fixtures importable)."""
    return subprocess.run([sys.executable, "-m", "reasonrl.cli", *args], capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_train_from_python_with_on_step_gets_the_weights_of_reasonrl_train(model_dir, tmp_path):
    def overrides(run_dir):
        return [*tiny_run(model_dir, run_dir, 3), "algo.overlong_buffer=0", "run.threads=1", "eval.every_steps=3"]

    proc = _cli("train", "dapo", *overrides(tmp_path / "cli"))  # supervised, as a user runs it
    assert proc.returncode == 0, proc.stderr
    # The trainer's summary, then the supervisor's (restarts, ETTR).
    [printed, supervisor] = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert supervisor["restarts"] == 0

    cfg = reasonrl.Config.load("dapo", overrides(tmp_path / "api"))
    seen = []
    summary = reasonrl.train(cfg, on_step=lambda step, metrics: seen.append((step, metrics)))

    cli, api = load_file(tmp_path / "cli/final/model.safetensors"), load_file(tmp_path / "api/final/model.safetensors")
    assert cli.keys() == api.keys() and all(torch.equal(cli[k], api[k]) for k in cli)
    assert summary == printed and 0 <= summary["val/acc"] <= 1
    rows = read_jsonl(tmp_path / "api/metrics.jsonl")
    assert [step for step, _ in seen] == [0, 1, 2, 3]  # the step-0 validation, then every step
    assert [{"step": step, **metrics} for step, metrics in seen] == rows  # each row as it was written
    assert [_values(r) for r in rows] == [_values(r) for r in read_jsonl(tmp_path / "cli/metrics.jsonl")]


@pytest.mark.parametrize("recipe, override", [("dapo", "algo.eps_hihg=0.3"), ("dapo", "algo.eps_high=high"),
                                              ("dapo", "rollout.n"), ("dapoo", "train.lr=1e-4")])
def test_a_bad_recipe_or_override_raises_the_message_the_command_line_prints(tmp_path, recipe, override):
    with pytest.raises(ConfigError) as raised:
        reasonrl.Config.load(recipe, [override, f"run.dir={tmp_path}"])
    proc = _cli("train", recipe, override, f"run.dir={tmp_path}", timeout=60)
    assert proc.returncode == 2 and proc.stderr.strip() == f"reasonrl train: error: {raised.value}"


def test_import_reasonrl_is_light_and_loads_the_api_on_first_use():
    script = ("import sys, reasonrl; heavy = ('torch', 'yaml', 'reasonrl.config', 'reasonrl.api'); "
              "print(*(m in sys.modules for m in heavy)); reasonrl.Config.load('dapo'); print(*(m in sys.modules for m in heavy))")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.stdout.splitlines() == ["False False False False", "False True True False"], proc.stderr


def test_config_fields_are_typed_attributes_and_overrides_are_a_list():
    cfg = reasonrl.Config.load("dapo", ["train.lr=3e-4"])
    assert type(cfg) is reasonrl.Config and cfg.train.lr == 3e-4 and cfg.algo.eps_high == 0.28
    assert get_type_hints(reasonrl.Config)["train"] is TrainConfig and get_type_hints(TrainConfig)["lr"] is float
    with pytest.raises(TypeError, match="a list of 'dotted.key=value' strings"):
        reasonrl.Config.load("dapo", "train.lr=3e-4")
    with pytest.raises(ValueError, match="supervise=True trains in a child process"):
        reasonrl.train(cfg, on_step=print, supervise=True)


def test_train_with_supervise_runs_the_trainer_under_the_supervisor(model_dir, tmp_path):
    cfg = reasonrl.Config.load("grpo", tiny_run(model_dir, tmp_path / "run", 1))
    summary = reasonrl.train(cfg, supervise=True)
    [row] = read_jsonl(tmp_path / "run/metrics.jsonl")
    assert summary["critic/score/mean"] == round(row["critic/score/mean"], 4) and "val/acc" not in summary
    events = read_jsonl(tmp_path / "run/events.jsonl")
    [start] = [e for e in events if e["kind"] == "start"]
    assert start["pid"] != os.getpid() and [e["kind"] for e in events][-1] == "done"  # the supervisor's last word
    assert (tmp_path / "run/summary.json").is_file()


def test_sigterm_after_a_steps_checkpoint_was_decided_stops_after_the_next_step_with_its_checkpoint(model_dir, tmp_path):
    # on_step runs once the step's rows are written and its checkpoint, if due, is saved: a
    # signal then must not end the run on a step that no checkpoint holds.
    cfg = reasonrl.Config.load("grpo", [*tiny_run(model_dir, tmp_path / "run", 10), "checkpoint.every_steps=100"])

    def on_step(step, metrics):
        if step == 2:
            os.kill(os.getpid(), signal.SIGTERM)

    with pytest.raises(SystemExit) as stopped:
        reasonrl.train(cfg, on_step=on_step)
    assert stopped.value.code == 143
    checkpoints = [e["step"] for e in read_jsonl(tmp_path / "run/events.jsonl") if e["kind"] == "checkpoint"]
    assert checkpoints == [3] and read_jsonl(tmp_path / "run/metrics.jsonl")[-1]["step"] == 3


def test_a_script_without_a_main_guard_trains_with_worker_processes_and_evaluates(model_dir, tmp_path):
    """The rollout worker is a process of its own (forkserver): it does not run the script again."""
    script = tmp_path / "train_it.py"
    script.write_text(textwrap.dedent(f"""\
        import json
        import reasonrl

        print("top level", flush=True)
        cfg = reasonrl.Config.load("dapo", {[*tiny_run(model_dir, tmp_path / 'run', 2), "algo.overlong_buffer=0"]!r})
        summary = reasonrl.train(cfg, on_step=lambda step, metrics: print("on_step", step, flush=True))
        print("summary", json.dumps(summary), flush=True)
        results = reasonrl.evaluate(cfg, model=cfg.run.dir, limit=4, samples={str(tmp_path / 'eval.jsonl')!r})
        print("eval", json.dumps(results), flush=True)
        """))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines.count("top level") == 1 and [line for line in lines if line.startswith("on_step")] == ["on_step 1",
                                                                                                        "on_step 2"]
    events = read_jsonl(tmp_path / "run/events.jsonl")
    [script_pid] = [e["pid"] for e in events if e["kind"] == "start"]
    [started] = [e for e in events if e["kind"] == "rollout_started"]
    assert started["pids"] and script_pid not in started["pids"]  # a worker process of its own served
    [summary] = [json.loads(line.removeprefix("summary ")) for line in lines if line.startswith("summary ")]
    last = read_jsonl(tmp_path / "run/metrics.jsonl")[-1]
    assert summary["critic/score/mean"] == round(last["critic/score/mean"], 4) and "val/acc" not in summary
    [results] = [json.loads(line.removeprefix("eval ")) for line in lines if line.startswith("eval ")]
    [row] = [r for r in results["results"] if r["data_source"] == "all"]
    assert row["model"] == str(tmp_path / "run/final") and row["prompts"] == 4 and 0 <= row["mean@4"]["mean"] <= 1
    assert len(read_jsonl(tmp_path / "eval.jsonl")) == 4 * (4 + 1)  # k samples and a greedy response per prompt
