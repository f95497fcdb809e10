"""Run report: PNG plots and report.html for one and several runs."""

import json

import pytest

from reasonrl.report import write_report

PNG = b"\x89PNG\r\n\x1a\n"


def _write_run(run_dir, adv_estimator, scale):
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(f"algo:\n  adv_estimator: {adv_estimator}\n")
    with open(run_dir / "metrics.jsonl", "w") as f:
        for step in range(1, 5):
            row = {
                "step": step,
                "time": 30.0 * step,
                "critic/score/mean": scale * step,
                "train/acc": 0.1 * step,
                "response_length/mean": 100 + step,
                "actor/entropy": 1.0 / step,
                "actor/pg_clipfrac": 0.01 * step,
                "actor/pg_clipfrac_lower": 0.001 * step,
                "timing_s/gen": 2.0,
                "timing_s/update_actor": 1.0,
                "timing_s/step": 3.5,
            }
            if step % 2 == 0:  # validation only on some steps
                row |= {"val/acc": 0.125 * step, "val/acc_greedy": 0.2 * step, "val/pass@4": 0.25 * step}
            f.write(json.dumps(row) + "\n")


def test_report_for_two_runs(tmp_path):
    _write_run(tmp_path / "runs" / "dapo", "grpo", 0.1)
    _write_run(tmp_path / "runs" / "ppo", "gae", 0.2)
    html_path = write_report([tmp_path / "runs" / "dapo", tmp_path / "runs" / "ppo"])
    out = tmp_path / "runs" / "report"
    assert html_path == out / "report.html"
    pngs = ["reward.png", "accuracy.png", "response_length.png", "entropy.png", "clipfrac.png", "timing.png"]
    for name in pngs:
        assert (out / name).read_bytes().startswith(PNG), name
    assert not (out / "ettr.png").exists() and not (out / "recovery.png").exists()  # no such keys: no plots
    page = html_path.read_text()
    assert "dapo (grpo)" in page and "ppo (gae)" in page
    # val/acc first 0.250, last/best 0.500; greedy first 0.400, last 0.800; score 0.400 / 0.800; 2 min
    for number in ["0.250", "0.500", "0.400", "0.800", "0:02:00"]:
        assert number in page
    for name in pngs:
        assert f'src="{name}"' in page


def test_report_for_one_run_defaults_to_run_dir(tmp_path):
    run = tmp_path / "solo"
    run.mkdir()
    rows = [
        {"step": 1, "critic/score/mean": 0.5, "ettr": 0.9, "time_lost_s": 1.0, "mttr_s": 0.0},
        {"step": 2, "critic/score/mean": 0.6, "ettr": 0.875, "time_lost_s": 6.25, "mttr_s": 5.125},
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    html_path = write_report([run])
    assert html_path == run / "report.html"
    assert (run / "reward.png").read_bytes().startswith(PNG)
    assert (run / "ettr.png").read_bytes().startswith(PNG)
    assert (run / "recovery.png").read_bytes().startswith(PNG)
    assert not (run / "accuracy.png").exists() and not (run / "timing.png").exists()
    page = html_path.read_text()
    assert "solo" in page and 'src="recovery.png"' in page
    for number in ["0.875", "6.250", "5.125"]:  # last ETTR, time lost, MTTR in the summary table
        assert number in page


def test_missing_run_dir_or_metrics(tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere"):
        write_report([tmp_path / "nowhere"])
    (tmp_path / "empty_dir").mkdir()
    with pytest.raises(FileNotFoundError, match="empty_dir"):
        write_report([tmp_path / "empty_dir"])


def test_metrics_without_rows(tmp_path):
    run = tmp_path / "blank"
    run.mkdir()
    (run / "metrics.jsonl").write_text("")
    with pytest.raises(ValueError, match="blank"):
        write_report([run])
