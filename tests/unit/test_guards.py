"""Guards: non-finite steps, spikes, sustained slowdowns, and the faulthandler hang watchdog."""

from __future__ import annotations

import math
import random
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from reasonrl.resilience.guards import (
    NonFiniteGuard,
    SlowdownDetector,
    SpikeDetector,
    StageWatchdog,
    read_hang_dump,
    run_detectors,
)
from reasonrl.config import ResilienceConfig
from reasonrl.metrics import EventLog, read_jsonl
from reasonrl.trainer.update import params_finite

NAN, INF = math.nan, math.inf


def test_nonfinite_guard_skips_then_rolls_back(tmp_path):
    guard = NonFiniteGuard(max_consecutive=3, events=EventLog(tmp_path))
    assert guard.check(1, 0.5, 1.0, True) == "ok"
    assert guard.check(2, NAN, 1.0, True) == "skip"
    assert guard.check(3, 0.5, INF, True) == "skip"
    assert guard.check(4, torch.tensor(NAN), torch.tensor(2.0), True) == "rollback"
    assert guard.consecutive == 0  # the count restarts after a rollback
    assert guard.check(5, NAN, 1.0, True) == "skip"
    assert guard.check(6, torch.tensor(0.3), torch.tensor(1.0), True) == "ok"
    assert guard.check(7, NAN, 1.0, True) == "skip"  # a good step reset the count
    events = read_jsonl(tmp_path / "events.jsonl")
    assert [(e["kind"], e["step"], e["action"]) for e in events] == [
        ("nonfinite", 2, "skip"), ("nonfinite", 3, "skip"), ("nonfinite", 4, "rollback"),
        ("nonfinite", 5, "skip"), ("nonfinite", 7, "skip"),
    ]
    assert math.isnan(events[0]["loss"]) and events[1]["grad_norm"] == INF


def test_nonfinite_params_roll_back_at_once_and_state_round_trips():
    guard = NonFiniteGuard(max_consecutive=5)
    assert guard.check(1, 0.5, 1.0, params_finite=False) == "rollback"
    guard.check(2, NAN, 1.0, True)
    restored = NonFiniteGuard(max_consecutive=2)
    restored.load_state_dict(guard.state_dict())
    assert restored.check(3, NAN, 1.0, True) == "rollback"
    with pytest.raises(ValueError, match="max_consecutive=0"):
        NonFiniteGuard(0)


def test_params_finite():
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    assert params_finite(model)
    with torch.no_grad():
        model[1].bias[1] = INF
    assert not params_finite(model)
    assert params_finite(torch.nn.ReLU())  # no parameters


def test_spike_detected_and_kept_out_of_history(tmp_path):
    det = SpikeDetector(window=10, threshold=5.0, min_history=4, min_spread=0.0, min_delta=0.0, events=EventLog(tmp_path))
    values = [1.0, 1.1, 0.9, 1.05]
    # Too little history: even a large value is accepted.
    assert not any(det.update("loss", s, v) for s, v in enumerate(values[:3]))
    assert not det.update("loss", 3, values[3])
    # median 1.025, MAD 0.05 -> scale 0.0741, limit 1.396
    assert not det.update("loss", 4, 1.35)
    assert det.update("loss", 5, 9.0)
    assert det.update("loss", 6, 9.0)  # spikes never enter the history, so still a spike
    assert det.state_dict()["history"]["loss"] == [1.0, 1.1, 0.9, 1.05, 1.35]
    assert not det.update("grad_norm", 7, 9.0)  # series are independent
    assert not det.update("loss", 8, NAN)  # left to NonFiniteGuard
    (event,) = [e for e in read_jsonl(tmp_path / "events.jsonl") if e["step"] == 5]
    assert event["kind"] == "spike" and event["series"] == "loss" and event["value"] == 9.0


def test_spike_floors_keep_tight_and_heavy_tailed_series_quiet():
    det = SpikeDetector(window=8, threshold=3.0, min_history=3, min_spread=0.05, min_delta=0.0)
    for step in range(5):
        assert not det.update("loss", step, 2.0)  # MAD 0: the spread is 5% of |median| = 0.1
    assert not det.update("loss", 5, 2.29)  # limit 2 + 3 * 0.1 = 2.3
    assert det.update("loss", 6, 2.31)
    # A loss that sits at 0 with no spread: only a move of min_delta (0.5) is a spike.
    zeros = SpikeDetector(window=8, threshold=3.0, min_history=3, min_delta=0.5)
    for step in range(3):
        zeros.update("loss", step, 0.0)
    assert not zeros.update("loss", 3, 0.49) and zeros.update("loss", 4, 0.51)
    # A gradient norm 5.8x its median is healthy noise with the default spread floor (half the
    # median): median 0.5, MAD 0.02 -> spread max(0.0297, 0.25) = 0.25, limit 0.5 + 10 * 0.25 = 3.0.
    grad = SpikeDetector(window=20, threshold=10.0, min_history=5)
    for step, value in enumerate([0.5, 0.55, 0.45, 0.5, 0.52]):
        assert not grad.update("grad_norm", step, value)
    assert not grad.update("grad_norm", 5, 2.9) and grad.update("grad_norm", 6, 3.1)


def test_spike_resume_is_exact():
    rng = random.Random(0)
    series = [rng.gauss(1.0, 0.1) + (5.0 if i % 17 == 16 else 0.0) for i in range(80)]
    full = SpikeDetector(window=12, threshold=4.0, min_history=6)
    first = SpikeDetector(window=12, threshold=4.0, min_history=6)
    expected = [full.update("loss", i, v) for i, v in enumerate(series)]
    got = [first.update("loss", i, v) for i, v in enumerate(series[:40])]
    resumed = SpikeDetector(window=12, threshold=4.0, min_history=6)
    resumed.load_state_dict(first.state_dict())
    got += [resumed.update("loss", i, v) for i, v in enumerate(series[40:], start=40)]
    assert got == expected and sum(expected) == 4


def _feed(det, durations, stage="gen", worker=0, start=0):
    return [det.update(stage, worker, start + i, d) for i, d in enumerate(durations)]


def test_single_outlier_does_not_trigger():
    det = SlowdownDetector()
    assert not any(_feed(det, [1.0] * 10 + [10.0] + [1.0] * 10))


def test_sustained_slowdown_of_one_worker_is_named(tmp_path):
    det = SlowdownDetector(window=8, ratio=1.5, min_steps=4, events=EventLog(tmp_path))
    found = []
    for step in range(40):
        for worker in (0, 1):
            slow = worker == 1 and step >= 12
            result = det.update("gen", worker, step, (2.0 if slow else 1.0) * (1 + 0.05 * (step % 3)))
            if result is not None:
                found.append(result)
    (hit,) = found  # reported once per onset
    assert (hit.stage, hit.worker) == ("gen", 1)
    assert hit.step - 12 + 1 <= det.min_steps + 1 and hit.detected_after_steps == hit.step - 12 + 1
    assert hit.factor == pytest.approx(2.0, rel=0.1) and hit.baseline_s == pytest.approx(1.05)
    (event,) = read_jsonl(tmp_path / "events.jsonl")
    assert event["kind"] == "slowdown" and event["worker"] == 1 and event["stage"] == "gen"


def test_rearms_after_recovery():
    det = SlowdownDetector(window=8, ratio=1.5, min_steps=4)
    hits = _feed(det, [1.0] * 10 + [3.0] * 10 + [1.0] * 10 + [3.0] * 10)
    onsets = [i for i, h in enumerate(hits) if h is not None]
    assert onsets == [11, 31]  # a 3x slowdown lifts the median of 4 past 1.5x after 2 samples
    assert hits[11].detected_after_steps == 2
    assert hits[31].baseline_s == 1.0  # slow samples never entered the baseline


def test_a_slowdown_must_cost_min_s_seconds_a_step():
    # Per-token update times of a 4000-token step: 1.6x slower, yet 0.2 ms * 4000 = 0.8 s more.
    quick = SlowdownDetector(window=8, ratio=1.5, min_steps=4, min_s=1.0)
    hits = [quick.update("update_actor", 0, i, s * 4000, work=4000) for i, s in enumerate([1e-4] * 10 + [1.6e-4] * 10)]
    assert not any(hits)  # 0.24 s more a step: below the 1 s floor
    costly = SlowdownDetector(window=8, ratio=1.5, min_steps=4, min_s=1.0)
    hits = [costly.update("gen", 0, i, s, work=8) for i, s in enumerate([1.0] * 10 + [3.0] * 10)]
    (onset,) = [h for h in hits if h is not None]
    assert onset.step == 11 and onset.baseline_s == 1.0 / 8  # seconds per prompt; 2 s more a step


def test_the_calls_of_one_step_add_up_to_one_sample():
    # A worker's share of a step comes in three calls (a batch and two small refills): 0.4 s for
    # 15 prompts, then three times slower from step 10: 0.8 s more a step, though no call alone
    # costs 0.5 s more.
    det = SlowdownDetector(window=8, ratio=1.5, min_steps=4, min_s=0.5)
    onsets = []
    for step in range(20):
        factor = 3.0 if step >= 10 else 1.0
        for seconds, prompts in ((0.2, 8), (0.1, 4), (0.1, 3)):
            found = det.update("gen", 1, step, factor * seconds, work=prompts)
            if found is not None:
                onsets.append(found)
    (onset,) = onsets
    assert onset.step == 12 and onset.baseline_s == pytest.approx(0.4 / 15)  # the median of 4 needs two slow steps


def test_noise_never_triggers():
    rng = random.Random(1234)
    det = SlowdownDetector()
    for step in range(300):
        for stage, base in (("gen", 2.0), ("update", 0.5)):
            for worker in range(3):
                assert det.update(stage, worker, step, base * rng.uniform(0.88, 1.12)) is None


def test_weights_shift_toward_fast_worker():
    det = SlowdownDetector()
    assert det.weights("gen", [0, 1]) == {0: 0.5, 1: 0.5}
    _feed(det, [1.0] * 6, worker=0)
    _feed(det, [3.0] * 6, worker=1)
    w = det.weights("gen", [0, 1, 2])  # worker 2 has no samples: the mean speed
    assert w[0] == pytest.approx(3 * w[1]) and w[2] == pytest.approx((w[0] + w[1]) / 2)
    assert sum(w.values()) == pytest.approx(1.0)


def test_detector_arguments_are_checked():
    with pytest.raises(ValueError, match="ratio=1.0"):
        SlowdownDetector(ratio=1.0)
    with pytest.raises(ValueError, match="min_history=9"):
        SpikeDetector(window=8, threshold=3.0, min_history=9)


def test_heartbeat_and_stop(tmp_path):
    dump, stage_file = tmp_path / "hang_dump.txt", tmp_path / "hang_dump.stage"
    started = time.time()
    watchdog = StageWatchdog(60.0, dump)
    try:
        assert dump.stat().st_size == 0 and dump.stat().st_mtime == 0  # armed dump never looks fresh
        watchdog.beat("gen")
        watchdog.beat("reward")
        assert stage_file.read_text() == "reward\n" and stage_file.stat().st_mtime >= started - 1
        assert read_hang_dump(dump) is None  # empty: no hang
    finally:
        watchdog.stop()
    assert not dump.exists() and not stage_file.exists()
    with pytest.raises(RuntimeError, match="stopped"):
        watchdog.beat("gen")


HANGING_CHILD = """
import sys, time
from reasonrl.resilience.guards import StageWatchdog
watchdog = StageWatchdog(1.0, sys.argv[1])
watchdog.beat("gen")
print("beat", flush=True)

def stuck_in_generation():
    time.sleep(30)

stuck_in_generation()
"""

HEALTHY_CHILD = """
import sys, time
from reasonrl.resilience.guards import StageWatchdog
with StageWatchdog(1.0, sys.argv[1]) as watchdog:
    for i in range(8):
        watchdog.beat(f"stage{i}")
        time.sleep(0.25)
print("done", flush=True)
"""


def test_watchdog_kills_a_hung_process_and_spares_a_healthy_one(tmp_path):
    hung_dump, healthy_dump = tmp_path / "hung" / "hang_dump.txt", tmp_path / "healthy" / "hang_dump.txt"

    def spawn(code, dump):
        return subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(code), str(dump)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )

    hung, healthy = spawn(HANGING_CHILD, hung_dump), spawn(HEALTHY_CHILD, healthy_dump)
    try:
        assert hung.stdout.readline() == "beat\n"
        beat_seen = time.time()
        hung.wait(timeout=10)  # the watchdog ends it (else the wait's timeout fails the test)
        assert hung.returncode != 0
        dump = read_hang_dump(hung_dump)
        assert dump["stage"] == "gen" and "stuck_in_generation" in dump["stacks"]
        assert hung_dump.stat().st_mtime >= beat_seen - 1  # a written dump is fresh for the supervisor
        out, err = healthy.communicate(timeout=20)
        assert healthy.returncode == 0, err
        assert out == "done\n" and read_hang_dump(healthy_dump) is None
    finally:
        for proc in (hung, healthy):
            if proc.poll() is None:
                proc.kill()
                proc.wait()


CLEAN_DEMO = Path(__file__).resolve().parent.parent / "data" / "clean_demo_150.jsonl"
"""Per step of a clean 150-step ``make demo`` run (2-core CPU): the update's loss and gradient
norm, the generation's seconds and prompts drawn, the update's seconds and trained tokens: the
series the controller feeds its spike and slowdown detectors."""


def _replay(steps, spikes, slow):
    found = []
    for s in steps:
        found += [f"spike {name} @{s['step']}" for name in ("grad_norm", "loss") if spikes.update(f"actor/{name}", s["step"], s[name])]
        for stage, seconds, work in (("gen", s["gen_s"], s["gen_prompts"]), ("update_actor", s["update_s"], s["update_tokens"])):
            if slow.update(stage, 0, s["step"], seconds, work=work) is not None:
                found.append(f"slowdown {stage} @{s['step']}")
    return found


def test_a_clean_demo_raises_no_false_alarm_and_real_faults_still_do():
    steps = read_jsonl(CLEAN_DEMO)
    assert len(steps) == 150
    assert _replay(steps, *run_detectors(ResilienceConfig())) == []
    # The same run with a 10x gradient blow-up at step 100 and generation 3x slower from step 80.
    faulty = [{**s, "grad_norm": s["grad_norm"] * (10 if s["step"] == 100 else 1),
               "gen_s": s["gen_s"] * (3 if s["step"] >= 80 else 1)} for s in steps]
    found = _replay(faulty, *run_detectors(ResilienceConfig()))
    assert found[0].startswith("slowdown gen @8") and "spike grad_norm @100" in found and len(found) == 2, found
