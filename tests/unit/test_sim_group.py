"""bench/fleet_sim.py's SimGroup: simulated worker processes on threads that die like killed
processes, stop answering like stopped ones, and are replaced with new pids."""

from __future__ import annotations

import threading
from concurrent.futures import TimeoutError as FutureTimeout

import pytest

from bench.fleet_sim import SimClock, SimGroup, fault_script, parse_at
from reasonrl.runtime import WorkerDied


class Gate:
    """``wait`` blocks until ``open`` runs beside it (a concurrent method)."""

    def __init__(self) -> None:
        self.event = threading.Event()

    def wait(self) -> str:
        self.event.wait(10)
        return "done"

    def open(self) -> bool:
        self.event.set()
        return True

    def echo(self, x):
        return x


def group(count: int = 2) -> SimGroup:
    return SimGroup(Gate, count, name="test", timeout_s=10, clock=SimClock(0.001), start_s=0.0, concurrent=("open",))


def test_a_dead_worker_fails_its_pending_and_later_calls_and_a_restart_gets_a_new_pid():
    g = group()
    pids = g.pids
    running, queued = g.submit_to(0, "wait"), g.submit_to(0, "echo", 1)
    assert g.die(0) == pids[0]
    for future in (running, queued, g.submit_to(0, "echo", 2)):
        with pytest.raises(WorkerDied):
            future.result(timeout=10)
    assert g.submit_to(1, "echo", 3).result(timeout=10) == 3  # the other worker is untouched
    g.restart(0)
    assert g.pids[0] not in pids and g.pids[1] == pids[1]
    assert g.call("echo", 4) == [4, 4]
    g.close()


def test_a_frozen_worker_answers_nothing_until_it_is_replaced():
    g = group()
    g.freeze(1)
    silent = [g.submit_to(1, "echo", 5), g.submit_to(1, "open")]  # a concurrent call is silent too
    for future in silent:
        with pytest.raises(FutureTimeout):
            future.result(timeout=0.05)
    assert g.running() == [0]
    g.restart(1)
    for future in silent:
        with pytest.raises(WorkerDied):
            future.result(timeout=10)
    assert g.submit_to(1, "echo", 6).result(timeout=10) == 6 and g.running() == [0, 1]
    g.close()


def test_a_leaving_worker_takes_no_new_calls_and_finishes_the_ones_it_holds():
    g = group(3)
    held = g.submit_to(2, "wait")
    assert g.leave() == 2 and g.size == 2 and len(g.submit("echo", 7)) == 2
    g.submit_to(2, "open")
    assert held.result(timeout=10) == "done"
    g.close()


def test_the_fault_script_spaces_the_kinds_and_draws_its_workers_from_a_seed():
    class Args:
        deaths_per_min, hangs_per_min, leaves_per_min, slow, fault_seed, horizon_s = 1.0, 0.5, 0.0, "2:3", 5, 300.0
        at = "hang@10:worker=3,leave@20,slow@5:factor=2"

    script = fault_script(Args, 8)
    assert [(at, kind) for at, kind, _ in script] == [
        (0.0, "slow"), (0.0, "slow"), (5.0, "slow"), (10.0, "hang"), (20.0, "leave"), (60.0, "death"),
        (120.0, "death"), (180.0, "death"), (180.0, "hang"), (240.0, "death"), (300.0, "death"), (300.0, "hang")]
    assert script == fault_script(Args, 8)
    assert len({f["worker"] for _, kind, f in script[:2]}) == 2 and script[3][2] == {"worker": 3}
    assert script[2][2]["factor"] == 2.0 and 0 <= script[2][2]["pick"] < 1 and script[4][2] == {}
    with pytest.raises(SystemExit, match="kind@seconds"):
        parse_at("explode@3")
