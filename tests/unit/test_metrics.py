"""metrics.jsonl sink, events log, timed() stages and the tolerant JSONL reader."""

import json
import math

import pytest

from reasonrl.metrics import EventLog, MetricsSink, read_jsonl, timed


def test_rows_written_and_read_back(tmp_path):
    with MetricsSink(tmp_path, total_steps=3, progress=False, tensorboard=False) as sink:
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
    with MetricsSink(tmp_path, total_steps=1, progress=False, tensorboard=False) as sink:
        with pytest.raises(TypeError, match="actor/lr"):
            sink.log(1, {"actor/lr": "fast"})


def test_truncate_after_keeps_rows_up_to_step(tmp_path):
    with MetricsSink(tmp_path, total_steps=5, progress=False, tensorboard=False) as sink:
        for step in range(1, 6):
            sink.log(step, {"critic/score/mean": step / 10})
    with MetricsSink(tmp_path, total_steps=5, progress=False, tensorboard=False) as sink:
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
    with MetricsSink(tmp_path, total_steps=3, progress=False, tensorboard=False) as sink:
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


def test_tensorboard_and_progress(tmp_path, capsys):
    with MetricsSink(tmp_path, total_steps=2, progress=True, tensorboard=True) as sink:
        sink.log(1, {"critic/score/mean": 0.25, "train/acc": 0.5, "val/acc": 0.125})
        sink.log(2, {"critic/score/mean": 0.5})
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    err = capsys.readouterr().err
    assert "reward=0.500" in err and "val=0.125" in err
