"""The supervisor around fake trainers: restarts, failure classification, recovery, ETTR."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from reasonrl.config import load
from reasonrl.metrics import read_jsonl
from reasonrl.resilience.supervisor import RestartPolicy, summarize_run, supervise, train_supervised, write_summary

# A stand-in for `reasonrl train`: resumes from its checkpoint (every 2 steps), logs one
# metrics row per step and touches its heartbeat; on its first attempt (every attempt in
# "always" mode) it fails at step FAIL_AT the way MODE says ("twice": and its second attempt at
# FAIL_AT + 2). On SIGTERM it exits 0. Started as a standby, it records its pid in
# standby_pids and waits for the go first.
CHILD = r"""
import faulthandler, json, os, signal, sys, time
from pathlib import Path

run_dir, mode, fail_at, steps = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
if "REASONRL_STANDBY_FD" in os.environ:
    with open(run_dir / "standby_pids", "a") as f:
        f.write(f"{os.getpid()}\n")
    if os.read(int(os.environ["REASONRL_STANDBY_FD"]), 1) != b"g":
        sys.exit(0)


def fill_disk():
    # whole pages, then the slack of the event log's last page: blank lines, which readers skip
    for name, chunk in (("filler", bytes(4096)), ("events.jsonl", b"\n")):
        fd = os.open(run_dir / name, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        try:
            while True:
                os.write(fd, chunk)
        except OSError:
            os.close(fd)


if mode == "full":  # the disk fills at step FAIL_AT (then a crash) and after the last step: a restart finds it freed
    (run_dir / "filler").unlink(missing_ok=True)
counter = run_dir / "attempts"
attempt = int(counter.read_text()) + 1 if counter.exists() else 1
counter.write_text(str(attempt))


def append(name, row):
    with open(run_dir / name, "a") as f:
        f.write(json.dumps(row) + "\n")


def event(kind, step, **fields):
    append("events.jsonl", {"time": time.time(), "kind": kind, "step": step, **fields})


def stuck_in_generate():
    time.sleep(60)


def stop(signum, frame):
    (run_dir / "stopped_cleanly").write_text("1")
    sys.exit(0)


signal.signal(signal.SIGTERM, stop)
event("start", None, pid=os.getpid(), ppid=os.getppid())
ckpt, metrics = run_dir / "ckpt", run_dir / "metrics.jsonl"
resumed = int(ckpt.read_text()) if ckpt.exists() else 0
if metrics.exists():
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    metrics.write_text("".join(json.dumps(r) + "\n" for r in rows if r["step"] <= resumed))
event("resume", resumed, from_step=resumed)
if mode == "relapse" and attempt == 2:  # writes a validation row at its resume step, then dies
    append("metrics.jsonl", {"step": resumed, "val/acc": 0.5})
    raise RuntimeError("boom while validating")
for step in range(resumed + 1, steps + 1):
    (run_dir / "hang_dump.stage").write_text("gen")
    began = time.perf_counter()
    time.sleep(0.01)
    append("metrics.jsonl", {"step": step, "timing_s/step": time.perf_counter() - began, "attempt": attempt})
    if step % 2 == 0:
        ckpt.write_text(str(step))
    if mode == "twice" and attempt == 2 and step == fail_at + 2:
        raise RuntimeError(f"boom again at step {step}")
    if step != fail_at or (attempt > 1 and mode != "always"):
        continue
    if mode == "full":
        fill_disk()
    if mode in ("crash", "always", "relapse", "full", "twice"):
        raise RuntimeError(f"boom at step {step}")
    if mode == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if mode == "hang":
        dump = open(run_dir / "hang_dump.txt", "w")
        faulthandler.dump_traceback_later(0.5, exit=True, file=dump)
    if mode == "stale":
        (run_dir / "hang_dump.stage").write_text("update")
    if mode == "stop":
        (run_dir / "ready").write_text("1")
    stuck_in_generate()
if mode == "full":
    fill_disk()
"""

FAST = RestartPolicy(max_restarts=3, backoff_s=0.01, backoff_max_s=0.01)


def run_child(tmp_path: Path, mode: str, policy: RestartPolicy = FAST, fail_at: int = 3, steps: int = 4,
              standby: bool = False):
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    result = supervise([sys.executable, str(script), str(run_dir), mode, str(fail_at), str(steps)], run_dir, policy,
                       standby=standby)
    return result, run_dir, read_jsonl(run_dir / "events.jsonl")


def test_children_fork_from_the_template_and_one_that_ends_starts_fresh_processes(tmp_path, monkeypatch, capfd):
    """With ``preload`` the first child is forked from the template; the template killed while
    that child runs (which cannot report its exit code then: counted as killed), the restart is
    a process of the supervisor's own, and the supervisor says why."""
    (tmp_path / "fake_trainer.py").write_text(CHILD)
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    run_dir = tmp_path / "run"
    run_dir.mkdir()

    def kill_the_template():
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (run_dir / "metrics.jsonl").exists():
            time.sleep(0.005)
        [start] = [e for e in read_jsonl(run_dir / "events.jsonl") if e["kind"] == "start"]
        os.kill(start["ppid"], signal.SIGKILL)

    killer = threading.Thread(target=kill_the_template, daemon=True)
    killer.start()
    result = supervise([sys.executable, "-m", "fake_trainer", str(run_dir), "crash", "40", "44"], run_dir, FAST,
                       preload=("json",))
    killer.join(timeout=60)
    events = read_jsonl(run_dir / "events.jsonl")
    first, second = [e for e in events if e["kind"] == "start"]
    assert result.returncode == 0 and first["ppid"] != os.getpid() and second["ppid"] == os.getpid(), events
    assert kinds(events)[2] == "killed" and "the trainer template ended; each trainer starts as a process of its own" \
        in capfd.readouterr().err


def test_with_resilience_trainer_template_false_each_child_is_the_supervisors_own(tmp_path, monkeypatch):
    (tmp_path / "fake_trainer.py").write_text(CHILD)
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    run_dir = tmp_path / "run"
    cfg = load(None, [f"run.dir={run_dir}", "resilience.max_restarts=3", "resilience.backoff_s=0.01",
                      "resilience.trainer_template=false"])
    code = train_supervised(cfg, [sys.executable, "-m", "fake_trainer", str(run_dir), "crash", "3", "4"])
    starts = [e for e in read_jsonl(run_dir / "events.jsonl") if e["kind"] == "start"]
    assert code == 0 and [e["ppid"] for e in starts] == [os.getpid(), os.getpid()], starts


def kinds(events: list[dict]) -> list[str]:
    return [e["kind"] for e in events]


def test_crash_then_success_restarts_once_and_logs_recovery(tmp_path):
    result, run_dir, events = run_child(tmp_path, "crash")
    assert (result.returncode, result.restarts) == (0, 1)
    assert kinds(events) == ["start", "resume", "crash", "start", "resume", "recovered", "done"]
    crash, recovered = events[2], events[5]
    assert crash["step"] == 3 and crash["returncode"] == 1 and crash["attempt"] == 1
    assert "RuntimeError: boom at step 3" in crash["stderr_tail"]
    assert crash["detect_s"] >= 0 and crash["backoff_s"] == 0.0  # the first restart after progress does not wait
    assert recovered["step"] == 3 and recovered["from_step"] == 2 and recovered["steps_lost"] == 1
    assert recovered["recover_s"] > 0
    rows = read_jsonl(run_dir / "metrics.jsonl")
    assert [(r["step"], r["attempt"]) for r in rows] == [(1, 1), (2, 1), (3, 2), (4, 2)]
    assert result.incidents == [{k: v for k, v in crash.items() if k != "time"}]


def test_sigkill_is_classified_as_killed(tmp_path):
    result, _, events = run_child(tmp_path, "kill")
    assert (result.returncode, result.restarts) == (0, 1)
    killed = events[2]
    assert killed["kind"] == "killed" and killed["signal"] == "SIGKILL" and killed["returncode"] == -signal.SIGKILL
    assert "recovered" in kinds(events)


def test_watchdog_hang_puts_the_stack_in_the_event(tmp_path):
    result, run_dir, events = run_child(tmp_path, "hang")
    assert (result.returncode, result.restarts) == (0, 1)
    hang = events[2]
    assert hang["kind"] == "hang" and hang["source"] == "watchdog" and hang["stage"] == "gen"
    assert "stuck_in_generate" in hang["stack"] and hang["dump"] == "hang_dump.1.txt"
    assert hang["detect_s"] > 0.4  # the watchdog waited for its timeout
    assert (run_dir / "hang_dump.1.txt").exists() and not (run_dir / "hang_dump.txt").exists()


def test_stale_heartbeat_gets_the_child_killed_as_hung(tmp_path):
    policy = RestartPolicy(max_restarts=1, backoff_s=0.01, heartbeat_timeout_s=1.0)
    result, _, events = run_child(tmp_path, "stale", policy)
    assert (result.returncode, result.restarts) == (0, 1)
    hang = events[2]
    assert hang["kind"] == "hang" and hang["source"] == "heartbeat" and hang["stage"] == "update"
    assert hang["returncode"] == -signal.SIGKILL and hang["detect_s"] > 1.0  # the heartbeat's timeout passed


def test_gives_up_after_max_restarts(tmp_path, capfd):
    policy = RestartPolicy(max_restarts=2, backoff_s=0.01)
    result, _, events = run_child(tmp_path, "always", policy, fail_at=1)
    assert result.returncode == 1 and result.restarts == 2
    assert [i["kind"] for i in result.incidents] == ["crash"] * 3
    assert [i["backoff_s"] for i in result.incidents] == [0.0, 0.01, None]
    assert kinds(events)[-1] == "gave_up"
    message = events[-1]["message"]
    assert "gave up after 2 restarts" in message and "boom at step 1" in message
    assert message in capfd.readouterr().err


def test_only_a_newly_trained_step_is_a_recovery(tmp_path):
    result, run_dir, events = run_child(tmp_path, "relapse")
    assert (result.returncode, result.restarts) == (0, 2)
    assert kinds(events) == ["start", "resume", "crash", "start", "resume", "crash", "start", "resume", "recovered", "done"]
    recovered = events[8]  # not after the second attempt's new validation row: it trained nothing
    assert recovered["failures"] == 2 and recovered["step"] == 3 and recovered["from_step"] == 2


def test_sigterm_is_forwarded_and_is_not_a_failure(tmp_path):
    run_dir = tmp_path / "run"

    def terminate_when_ready():
        deadline = time.monotonic() + 20
        while not (run_dir / "ready").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=terminate_when_ready, daemon=True).start()
    result, run_dir, events = run_child(tmp_path, "stop", fail_at=2)
    assert (result.returncode, result.restarts, result.incidents) == (128 + signal.SIGTERM, 0, [])
    assert (run_dir / "stopped_cleanly").exists()
    assert kinds(events)[-1] == "stopped" and events[-1]["signal"] == "SIGTERM"


def test_a_full_disk_takes_the_supervisors_events_and_summary_to_stderr(small_disk, tmp_path, capfd):
    """The disk fills at step 3 (the child crashes) and after the last step: the crash and done
    events and summary.json cannot be written; each goes to stderr, the restart happens and
    supervision ends with the child's exit code 0."""
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    run_dir = small_disk / "run"
    cfg = load(None, [f"run.dir={run_dir}", "resilience.max_restarts=3", "resilience.backoff_s=0.01", "resilience.standby=false"])
    code = train_supervised(cfg, [sys.executable, str(script), str(run_dir), "full", "3", "4"])
    out, err = capfd.readouterr()
    assert code == 0, err
    assert err.count("Traceback") == 1 and "RuntimeError: boom at step 3" in err  # the child's own crash, no other
    cannot = f"{run_dir / 'events.jsonl'}: cannot write (no space left on device; the file system at {small_disk})"
    lines = [line for line in err.splitlines() if line.startswith(f"reasonrl supervisor: {cannot}; the event: ")]
    shown = [json.loads(line.split("; the event: ", 1)[1]) for line in lines]
    assert [e["kind"] for e in shown][0] == "crash" and shown[-1]["kind"] == "done" and shown[-1]["restarts"] == 1
    assert shown[0]["step"] == 3 and "stderr_tail" not in shown[0]
    assert "reasonrl supervisor: crash at step 3 (exit code 1); restart 1/3" in err
    summary_line = next(line for line in err.splitlines() if "summary.json: cannot write" in line)
    assert json.loads(summary_line.split("; the summary: ", 1)[1])["steps"] == 4
    assert not (run_dir / "summary.json").exists() and json.loads(out.strip().splitlines()[-1])["restarts"] == 1
    assert [r["step"] for r in read_jsonl(run_dir / "metrics.jsonl")] == [1, 2, 3, 4]


def test_a_recovery_starts_the_backoff_over(tmp_path):
    policy = RestartPolicy(max_restarts=3, backoff_s=0.01, backoff_max_s=1.0)
    result, _, events = run_child(tmp_path, "twice", policy, fail_at=3, steps=6)
    assert (result.returncode, result.restarts) == (0, 2)
    assert kinds(events) == ["start", "resume", "crash", "start", "resume", "recovered", "crash", "start", "resume",
                             "recovered", "done"]
    assert [i["backoff_s"] for i in result.incidents] == [0.0, 0.0]  # not 0.01: the run recovered in between


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # our children: reaped by the supervisor once they exit
    except ProcessLookupError:
        return False
    return True


def test_a_restart_gives_the_standby_the_go_and_no_standby_outlives_the_supervisor(tmp_path):
    """The standby, started once the first child trains, replaces it after its crash (the
    recovery says warm); a second standby, started once that one recovered, is retired at the end."""
    # 40 steps of 10 ms before the crash: the supervisor (polling every 0.1 s) sees the child train
    result, run_dir, events = run_child(tmp_path, "crash", fail_at=40, steps=44, standby=True)
    assert (result.returncode, result.restarts) == (0, 1)
    recovered = next(e for e in events if e["kind"] == "recovered")
    assert recovered["warm"] is True and recovered["from_step"] == 40
    pids = [int(p) for p in (run_dir / "standby_pids").read_text().split()]
    starts = [e for e in events if e["kind"] == "start"]
    assert len(starts) == 2 and len(pids) >= 1
    assert not any(_alive(pid) for pid in pids)


def test_backoff_is_none_then_doubles_up_to_the_cap():
    policy = RestartPolicy(backoff_s=1.0, backoff_max_s=5.0)
    assert [policy.backoff(k) for k in range(6)] == [0.0, 1.0, 2.0, 4.0, 5.0, 5.0]
    with pytest.raises(ValueError, match="max_restarts"):
        RestartPolicy(max_restarts=-1)


def write_rows(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def test_summarize_run_is_the_ettr_of_the_event_log(tmp_path):
    write_rows(tmp_path / "metrics.jsonl", [{"step": s, "timing_s/step": t} for s, t in enumerate([2, 2, 3, 3, 4], 1)])
    write_rows(tmp_path / "events.jsonl", [
        {"time": 100.0, "kind": "start", "step": 0},
        {"time": 105.0, "kind": "checkpoint", "step": 2},
        {"time": 110.0, "kind": "crash", "step": 3},
        {"time": 113.0, "kind": "resume", "step": 2, "from_step": 2},
        {"time": 113.5, "kind": "start", "step": 2},
        {"time": 115.0, "kind": "recovered", "step": 3, "recover_s": 5.0, "steps_lost": 1},
        {"time": 140.0, "kind": "done", "step": 5},
    ])
    summary = summarize_run(tmp_path, wall_s=40.0)
    # lost: from the checkpoint of step 2 (105) to the restart's resume (113) = 8 s; productive 14 s
    assert summary["ettr"] == pytest.approx(14 / 22) and summary["time_lost_s"] == pytest.approx(8.0)
    assert summary["mttr_s"] == 5.0 and summary["steps_lost"] == 1 and summary["incidents"] == {"crash": 1}
    assert summary["wall_s"] == 40.0  # informational: ETTR does not use it
    write_summary(tmp_path, summary)
    assert json.loads((tmp_path / "summary.json").read_text()) == summary
