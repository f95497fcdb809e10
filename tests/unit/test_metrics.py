"""metrics.jsonl sink (with its console line and TensorBoard logger), events log, timed() stages and the
tolerant JSONL reader."""

import ast
import json
import math
from pathlib import Path

import pytest

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData

from reasonrl.loggers import TensorBoardLogger
import reasonrl
from reasonrl.metrics import (STEP_STAGES, EventLog, MetricsSink, Sample, console_fields, console_line, final_summary,
                              read_jsonl, timed)


def test_rows_written_and_read_back(tmp_path):
    with MetricsSink(tmp_path, total_steps=3, progress=False) as sink:
        sink.log(1, {"critic/score/mean": 0.25, "train/acc": 0.5, "actor/ppo_kl": math.nan})
        sink.log(2, {"critic/score/mean": 0.75, "actor/grad_norm": math.inf, "actor/lr": -math.inf})
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert lines[0] == '{"actor/ppo_kl": "nan", "critic/score/mean": 0.25, "step": 1, "train/acc": 0.5}'
    for line in lines:
        json.loads(line)  # valid JSON even with non-finite values
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    assert rows[0]["critic/score/mean"] == 0.25 and math.isnan(rows[0]["actor/ppo_kl"])
    assert rows[1]["actor/grad_norm"] == math.inf and rows[1]["actor/lr"] == -math.inf


def test_non_number_metric_is_rejected_by_name(tmp_path):
    with MetricsSink(tmp_path, total_steps=1, progress=False) as sink:
        with pytest.raises(TypeError, match="actor/lr"):
            sink.log(1, {"actor/lr": "fast"})


def test_truncate_after_keeps_rows_up_to_step(tmp_path):
    with MetricsSink(tmp_path, total_steps=5, progress=False) as sink:
        for step in range(1, 6):
            sink.log(step, {"critic/score/mean": step / 10})
    with MetricsSink(tmp_path, total_steps=5, progress=False) as sink:
        sink.truncate_after(3)
        sink.log(4, {"critic/score/mean": 0.9})
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert rows[-1]["critic/score/mean"] == 0.9
    assert not list(tmp_path.glob("*.tmp"))


def test_partial_trailing_line_dropped(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "train/acc": 0.5}\n{"step": 2, "train/a')
    assert read_jsonl(path) == [{"step": 1, "train/acc": 0.5}]
    with MetricsSink(tmp_path, total_steps=3, progress=False) as sink:
        sink.log(2, {"train/acc": 0.6})
    assert read_jsonl(path) == [{"step": 1, "train/acc": 0.5}, {"step": 2, "train/acc": 0.6}]


def test_corrupt_middle_line_names_file_and_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n{oops\n{"step": 3}\n')
    with pytest.raises(ValueError, match=r"metrics\.jsonl: line 2"):
        read_jsonl(path)


def test_timed_accumulates():
    timings = {}
    with timed(timings, "gen"):
        pass
    first = timings["timing_s/gen"]
    with timed(timings, "gen"):
        sum(range(10_000))
    assert list(timings) == ["timing_s/gen"]
    assert timings["timing_s/gen"] > first >= 0.0


def test_event_log_appends_lines(tmp_path):
    events = EventLog(tmp_path)
    events.emit("restart", 3, reason="hang", loss=math.nan)
    events.emit("start", None)
    rows = read_jsonl(tmp_path / "events.jsonl")
    assert [(r["kind"], r["step"]) for r in rows] == [("restart", 3), ("start", None)]
    assert rows[0]["reason"] == "hang" and math.isnan(rows[0]["loss"])
    assert rows[0]["time"] > 1e9


STEP = {"critic/score/mean": 0.25, "train/acc": 0.5, "actor/pg_loss": -0.0123, "actor/grad_norm": 0.75,
        "actor/ppo_kl": 0.00125, "response_length/mean": 23.5, "perf/throughput": 12345.6, "timing_s/step": 1.0}


def test_console_line_shows_the_main_metrics_present():
    line = console_line(10, 150, {**STEP, "val/acc": 0.125})
    assert line == ("step 10/150 reward=0.25 acc=0.5 val=0.125 pg_loss=-0.0123 grad_norm=0.75 kl=0.00125 len=23.5 "
                    "tok/s=12346")
    assert console_line(3, 4, {"train/acc": 0.5, "val/acc": None}) == "step 3/4 acc=0.5"


@pytest.mark.parametrize("progress", [False, True])
def test_console_line_every_log_every_steps_with_the_latest_validation(tmp_path, capsys, progress):
    with MetricsSink(tmp_path, total_steps=4, progress=progress, log_every=2) as sink:
        sink.log(0, {"val/acc": 0.125})
        for step in range(1, 5):
            sink.log(step, {**STEP, "critic/score/mean": step / 10})
    lines = [line for line in capsys.readouterr().err.replace("\r", "\n").splitlines() if line.startswith("step ")]
    assert lines == [
        "step 2/4 reward=0.2 acc=0.5 val=0.125 pg_loss=-0.0123 grad_norm=0.75 kl=0.00125 len=23.5 tok/s=12346",
        "step 4/4 reward=0.4 acc=0.5 val=0.125 pg_loss=-0.0123 grad_norm=0.75 kl=0.00125 len=23.5 tok/s=12346",
    ]


ASYNC = {"staleness/mean": 0.5, "staleness/max": 1.0, "rollout/queue_length": 3.0, "timing_s/trainer_idle": 0.25,
         "timing_s/rollout_idle": 1.5}


@pytest.mark.parametrize("mode", ["async", "lockstep", "sync"])
def test_the_async_and_lockstep_console_line_shows_staleness_queue_and_idle_times(tmp_path, capsys, mode):
    with MetricsSink(tmp_path, total_steps=1, progress=False, log_every=1, fields=console_fields(mode)) as sink:
        sink.log(1, {**STEP, **ASYNC})
    main = "step 1/1 reward=0.25 acc=0.5 pg_loss=-0.0123 grad_norm=0.75 kl=0.00125 len=23.5 tok/s=12346"
    waits = " stale=0.5 queue=3 trainer_idle_s=0.25 rollout_idle_s=1.5" if mode != "sync" else ""
    assert capsys.readouterr().err.splitlines() == [main + waits]


def test_a_run_ends_with_its_validation_or_else_its_last_training_metrics():
    assert final_summary({**STEP, "val/acc": 0.1234567, "forecast/plateau": 0.5}) == {"val/acc": 0.1235,
                                                                                       "forecast/plateau": 0.5}
    assert final_summary({**STEP, "actor/ppo_kl": 0.001234, "timing_s/gen": 0.5}) == {
        "critic/score/mean": 0.25, "train/acc": 0.5, "actor/pg_loss": -0.0123, "actor/grad_norm": 0.75,
        "actor/ppo_kl": 0.0012, "response_length/mean": 23.5, "perf/throughput": 12345.6}
    assert final_summary({**STEP, **ASYNC}, console_fields("async"))["timing_s/trainer_idle"] == 0.25
    assert final_summary({"critic/score/mean": math.nan}) == {"critic/score/mean": "nan"}


def test_the_step_stages_are_the_controllers_own():
    """STEP_STAGES names every ``self.stage(..., "name")`` of the controller, no other."""
    source = (Path(reasonrl.__file__).parent / "controller.py").read_text(encoding="utf-8")
    named = {node.args[1].value for node in ast.walk(ast.parse(source))
             if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "stage" and len(node.args) == 2}
    assert named == set(STEP_STAGES)


def test_console_line_keeps_the_latest_forecast_and_a_resume_finds_it(tmp_path, capsys):
    forecast = {"forecast/plateau": 0.8, "forecast/plateau_lo": 0.7, "forecast/plateau_hi": 0.9}
    with MetricsSink(tmp_path, total_steps=4, progress=False, log_every=2) as sink:
        sink.log(1, {"val/acc": 0.5, **forecast})
        sink.log(2, {"train/acc": 0.5})
        sink.log(3, {"val/acc": 0.6})  # a validation without a forecast clears it
        sink.log(4, {"train/acc": 0.5})
    with MetricsSink(tmp_path, total_steps=4, progress=False, log_every=2) as sink:
        sink.truncate_after(1)  # resumed at step 1: the forecast logged there is the latest again
        sink.log(2, {"train/acc": 0.5})
    assert [line for line in capsys.readouterr().err.splitlines()] == [
        "step 2/4 acc=0.5 val=0.5 plateau=0.800 [0.700, 0.900]", "step 4/4 acc=0.5 val=0.6",
        "step 2/4 acc=0.5 val=0.5 plateau=0.800 [0.700, 0.900]"]


def test_no_console_line_when_log_every_is_zero(tmp_path, capsys):
    with MetricsSink(tmp_path, total_steps=2, progress=False, log_every=0) as sink:
        sink.log(1, STEP)
        sink.log(2, STEP)
    assert capsys.readouterr().err == ""


def test_progress_bar_shows_reward_and_latest_validation(tmp_path, capsys):
    with MetricsSink(tmp_path, total_steps=2, progress=True) as sink:
        sink.log(1, {"critic/score/mean": 0.25, "train/acc": 0.5, "val/acc": 0.125})
        sink.log(2, {"critic/score/mean": 0.5})
    err = capsys.readouterr().err
    assert "reward=0.500" in err and "val=0.125" in err


def events(log_dir):
    accumulator = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "tensors": 0})
    accumulator.Reload()
    return accumulator


def texts(accumulator, tag):
    return [(e.step, e.tensor_proto.string_val[0].decode()) for e in accumulator.Tensors(f"{tag}/text_summary")]


CONFIG = {"run": {"seed": 3, "loggers": ["tensorboard"], "deterministic": True}, "algo": {"eps_high": 0.28, "dual_clip": None, "adv_estimator": "grpo"}}


def test_tensorboard_gets_scalars_config_hparams_and_samples(tmp_path):
    logger = TensorBoardLogger(tmp_path / "tb", CONFIG)
    with MetricsSink(tmp_path, total_steps=2, progress=False, loggers=[logger]) as sink:
        sink.truncate_after(-1)
        sink.log(1, {"critic/score/mean": 0.25})
        sink.log_samples(1, [Sample("12+7=", "19|x\ny", 1.0, True), Sample("3*4=", "7", 0.0, False)])
        sink.log(2, {"critic/score/mean": 0.5})
    tb = events(tmp_path / "tb")
    assert [(e.step, e.value) for e in tb.Scalars("critic/score/mean")] == [(1, 0.25), (2, 0.5)]
    [(step, config)] = texts(tb, "config")
    assert step == 0 and config.startswith("```yaml\n") and "eps_high: 0.28" in config and "- tensorboard" in config
    hparams = HParamsPluginData.FromString(tb.PluginTagToContent("hparams")["_hparams_/session_start_info"])
    got = {k: v.number_value if v.HasField("number_value") else v.string_value for k, v in hparams.session_start_info.hparams.items()}
    assert got == {"run.seed": 3, "run.deterministic": 1, "algo.eps_high": 0.28, "algo.adv_estimator": "grpo"}
    [(step, table)] = texts(tb, "samples")
    assert step == 1
    assert table.splitlines() == ["| prompt | response | reward | acc |", "|---|---|---|---|",
                                  "| 12+7= | 19\\|x<br>y | 1.000 | yes |", "| 3*4= | 7 | 0.000 | no |"]


def test_tensorboard_purges_the_steps_a_resume_redoes(tmp_path):
    with MetricsSink(tmp_path, total_steps=3, progress=False, loggers=[TensorBoardLogger(tmp_path / "tb", CONFIG)]) as sink:
        sink.truncate_after(-1)
        for step in (1, 2, 3):
            sink.log(step, {"train/acc": step / 10})
    with MetricsSink(tmp_path, total_steps=3, progress=False, loggers=[TensorBoardLogger(tmp_path / "tb", CONFIG)]) as sink:
        sink.truncate_after(1)
        sink.log(2, {"train/acc": 0.9})
    tb = events(tmp_path / "tb")
    assert [(e.step, round(e.value, 6)) for e in tb.Scalars("train/acc")] == [(1, 0.1), (2, 0.9)]
    assert [step for step, _ in texts(tb, "config")] == [0, 2]  # the resumed run's config, where it starts


class Recorder:
    """A logger that records what the sink sends it."""

    def __init__(self):
        self.calls = []

    def rewind(self, step, last_logged):
        self.calls.append(("rewind", step, last_logged))

    def log_metrics(self, step, values):
        self.calls.append(("metrics", step, values))

    def log_samples(self, step, samples, tag="samples"):
        self.calls.append(("samples", step, list(samples)))

    def close(self):
        self.calls.append(("close",))


def test_sink_tells_the_loggers_the_last_step_logged_before_a_resume(tmp_path):
    with MetricsSink(tmp_path, total_steps=5, progress=False) as sink:
        for step in (1, 2, 3):
            sink.log(step, {"train/acc": 0.5})
    recorder = Recorder()
    with MetricsSink(tmp_path, total_steps=5, progress=False, loggers=[recorder]) as sink:
        sink.truncate_after(1)
        sink.log(2, {"train/acc": 0.75})
        sink.log_samples(2, [Sample("p", "r", 1.0, True)])
    assert recorder.calls == [("rewind", 1, 3), ("metrics", 2, {"train/acc": 0.75}),
                              ("samples", 2, [Sample("p", "r", 1.0, True)]), ("close",)]
