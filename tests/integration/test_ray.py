"""The Ray runtime on a small local cluster: RayGroup calls, concurrency, timeouts, a killed
actor and its restart, placement, weight broadcast, and a cluster listening on loopback only."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

if importlib.util.find_spec("ray") is None:  # not importorskip: connect() must be the first to import ray
    pytest.skip("ray is not installed (pip install 'reasonrl[ray]')", allow_module_level=True)

from reasonrl.config import RuntimeConfig, load
from reasonrl.errors import InputError, LimitError
from reasonrl.runtime import WorkerDied, WorkerTimeout, gather
from reasonrl.runtime import ray as rayrt
from reasonrl.reward import FAILURE_SCORE
from reasonrl.reward.pool import RewardPool
from reasonrl.runtime.pool import PoolStart
from reasonrl.runtime.placement import check_fits, parse_placement
from reasonrl.runtime.topology import plan as plan_topology, pool_start
from reasonrl.types import WeightsUpdate
from tests.ray_fixtures import Receiver, Refused, is_loopback, listening_sockets, process_tree
from tests.worker_fixtures import Counter, broken

pytestmark = [pytest.mark.timeout(120), pytest.mark.xdist_group("ray")]  # one local cluster at a time


@pytest.fixture(scope="module")
def cluster():
    c = rayrt.connect(RuntimeConfig(), cpus=2, timeout_s=90)
    yield c
    c.close()


@pytest.fixture(scope="module")
def counters(cluster):
    """Two Counter actors (starting at 0 and 100), ``set_flag`` concurrent; shared to save actor starts."""
    group = rayrt.RayGroup(Counter, [(0,), (100,)], "counter", timeout_s=30, concurrent=("set_flag",))
    yield group
    group.close()


def test_importing_the_runtime_never_imports_ray():
    code = ("import sys, reasonrl, reasonrl.runtime, reasonrl.runtime.ray, reasonrl.runtime.placement; "
            "assert 'ray' not in sys.modules, 'ray was imported'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


_JOIN = """
import sys
from reasonrl.config import RuntimeConfig, load
from reasonrl.errors import InputError
from reasonrl.runtime import ray as rayrt
from tests.worker_fixtures import Counter
for bad in ("not an address", "ray://head:10001"):
    try:
        rayrt.connect(RuntimeConfig(ray_address=bad), timeout_s=30)
        raise SystemExit(f"{bad!r} was accepted")
    except InputError as err:
        assert str(err).startswith(f"runtime.ray_address = {bad!r}: "), err
cluster = rayrt.connect(RuntimeConfig(ray_address=sys.argv[1]), timeout_s=60)
assert not cluster.started
group = rayrt.RayGroup(Counter, [(5,)], "joined", timeout_s=30)
assert group.call("add", 1) == [6]
group.close()
cluster.close()
"""


def test_another_process_joins_the_cluster_by_address_and_leaves_it_running(cluster):
    subprocess.run([sys.executable, "-c", _JOIN, cluster.address], check=True, timeout=120,
                   cwd=Path(__file__).resolve().parents[2])
    assert cluster.resources()["CPU"] == 2


def test_calls_run_in_order_take_kwargs_and_raise_the_workers_own_exceptions(counters):
    group = counters
    start = group.call("add", 0)
    futures = [group.submit("add", i) for i in range(20)]
    assert [f.result(timeout=30) for f in futures[-1]] == [s + sum(range(20)) for s in start]
    assert [gather(fs, 30, "add") for fs in futures[:3]] == [[s + t for s in start] for t in (0, 1, 3)]
    assert group.call("sleep", seconds=0.01) == [0.01, 0.01]
    assert group.submit_to(1, "add", x=1).result(timeout=30) == start[1] + sum(range(20)) + 1
    with pytest.raises(ValueError, match="boom") as err:
        group.call("fail", "boom")
    notes = "".join(err.value.__notes__)
    assert "in counter[0]" in notes and "worker_fixtures.py" in notes
    assert len(set(group.pids)) == 2 and os.getpid() not in group.pids


def test_a_factory_that_fails_raises_its_own_exception(cluster):
    with pytest.raises(RuntimeError, match="cannot build this worker"):
        rayrt.RayGroup(broken, [()], "broken", timeout_s=30)


def test_a_concurrent_method_runs_beside_a_running_call(counters):
    waiting = counters.submit_to(0, "wait_for_flag", 20.0)
    time.sleep(0.3)
    assert counters.submit_to(0, "set_flag").result(timeout=10) is True
    assert waiting.result(timeout=5) is True  # it saw the flag: both ran at once


def test_a_call_past_its_timeout_raises_worker_timeout_naming_the_call(cluster):
    group = rayrt.RayGroup(Counter, [()], "sleeper", timeout_s=1.0, start_timeout_s=60)
    try:
        with pytest.raises(WorkerTimeout, match=r"sleeper\.sleep: no answer within 1.0 s"):  # not the 30 s sleep's end
            group.call("sleep", 30)
    finally:
        group.kill()


def test_a_killed_actor_fails_its_calls_with_worker_died_and_restart_brings_it_back(cluster):
    group = rayrt.RayGroup(Counter, [(0,), (0,)], "victim", timeout_s=30)
    try:
        group.call("add", 5)
        old = group.pids[0]
        pending = group.submit_to(0, "sleep", 30)
        time.sleep(0.3)
        os.kill(old, signal.SIGKILL)
        with pytest.raises(WorkerDied, match=rf"victim\[0\]: the actor \(pid {old}\) died"):
            pending.result(timeout=15)
        with pytest.raises(WorkerDied, match=r"victim\[0\]"):
            group.submit_to(0, "add", 1).result(timeout=15)
        assert not group.alive(0) and group.alive(1)
        group.restart(0)
        assert group.alive(0) and group.pids[0] != old
        assert group.call("add", 1) == [1, 6]  # a new worker from the same arguments; the other kept its state
    finally:
        group.close()


def test_a_hostile_math_verify_answer_is_cut_at_the_time_limit_in_a_reward_actor(cluster):
    """Ray runs an actor's calls off its main thread, where math-verify's alarms never fire: the
    actor is killed at the pool's 4 s limit instead, the power tower is a failure counted as a
    timeout, and the next actor grades."""
    pytest.importorskip("math_verify")
    tower = "\\boxed{" + "9^{" * 12 + "9" + "}" * 12 + "}"
    start = PoolStart("reward", 1, 4, where="ray", ray_options={"resources": [{"CPU": 0.5}]})
    with RewardPool("math_verify", start) as pool:
        grades = pool.score([tower, "\\boxed{\\frac{1}{2}}"], ["1", "0.5"])
    assert grades.scores.tolist() == [FAILURE_SCORE, 1.0] and grades.timed_out.tolist() == [True, False]
    assert grades.errors == ["sample 0: reward[0]: timeout after 4s"]


def test_reward_workers_are_actors_placed_by_runtime_roles_reward_and_a_timeout_fails_one_sample(cluster):
    cfg = load(None, ["runtime.engine=ray", "runtime.roles.reward.count=1", "runtime.roles.reward.cpus=0.5",
                      "runtime.roles.reward.timeout_s=2", "reward.fn=tests.reward_fixtures:sleepy"])
    topology = plan_topology(cfg)
    actors = topology.ray_actors()
    assert actors["reward"] == 2  # the rollout producer's pool and validation's
    reward = topology["reward"]
    placement = parse_placement({"reward": {"cpus": reward.cpus, "gpus": reward.gpus}}).plan({"reward": actors["reward"]})
    assert placement.bundles == [{"CPU": 0.5}, {"CPU": 0.5}]
    reservation = rayrt.Reservation(placement, timeout_s=30)
    events = []
    try:
        pool = RewardPool(cfg.reward, pool_start(reward, part=1, reservation=reservation,
                                                 emit=lambda kind, **fields: events.append((kind, fields))))
        try:
            [old] = pool.pids
            import ray

            free = ray.available_resources()
            group = reservation.group.id.hex()
            assert free.get(f"CPU_group_0_{group}") == 0.5 and f"CPU_group_1_{group}" not in free  # in validation's bundle
            grades = pool.score(["1", "sleep", "3"], ["1", "2", "4"])  # the "sleep" sample's 30 s cut at 2
            assert grades.failed.tolist() == [False, True, False] and grades.acc.tolist() == [True, False, False]
            assert grades.errors == ["sample 1: reward[0]: timeout after 2s"]
            [new] = pool.pids
            assert new != old
            assert events == [("worker_restarted", {"role": "reward", "index": 0, "pid": old, "new_pid": new,
                                                    "reason": "timeout: no answer within 2 s"})]
            assert pool.score(["5"], ["5"]).acc.tolist() == [True]  # the new actor grades
        finally:
            pool.close()
    finally:
        reservation.close()


def test_placement_errors_name_the_key_and_an_impossible_placement_fails_at_once(cluster):
    with pytest.raises(InputError, match=r"runtime\.roles\.rollout\.cpus = -1: expected a number > 0"):
        parse_placement({"rollout": {"cpus": -1}})
    with pytest.raises(InputError, match=r"runtime\.roles\.rolout = .*did you mean rollout\?"):
        parse_placement({"rolout": {"cpus": 1}})
    with pytest.raises(InputError, match=r"runtime\.roles\.reward\.gpu = 1: unknown key \(did you mean gpus\?\)"):
        parse_placement({"reward": {"gpu": 1}})
    with pytest.raises(InputError, match=r"runtime\.roles\.reference\.colocate = 'critic': critic is itself colocated"):
        parse_placement({"critic": {"colocate": "policy"}, "reference": {"colocate": "critic"}})
    shared = parse_placement({"reference": {"colocate": "policy", "cpus": 0.5}, "rollout": {"count": 2}})
    plan = shared.plan({"policy": 2, "reference": 1, "rollout": 1})
    assert plan.bundles == [{"CPU": 1.5}, {"CPU": 1.0}, {"CPU": 1.0}, {"CPU": 1.0}]  # reference shares policy's first
    assert plan.index == {"policy": [0, 1], "rollout": [2, 3], "reference": [0]}
    with pytest.raises(InputError, match=r"reference\.colocate = 'policy': 2 reference actors cannot share the 1 bundles"):
        parse_placement({"reference": {"colocate": "policy", "count": 2}}).plan({"policy": 1, "reference": 1})
    plan = parse_placement({"rollout": {"cpus": 64}}).plan({"policy": 1, "rollout": 1})
    with pytest.raises(LimitError, match=r"runtime\.roles.*rollout: 1 actor x 64 CPU \(runtime\.roles\.rollout\.cpus\)"
                                         r".*the cluster has 2 CPU"):  # at once: not the placement timeout's message
        rayrt.Reservation(plan, timeout_s=30)
    check_fits(parse_placement({}).plan({"policy": 1, "rollout": 1}), cluster.resources())


def test_a_placement_the_busy_cluster_cannot_place_fails_within_its_timeout(cluster):
    hog = rayrt.RayGroup(Counter, [()], "hog", timeout_s=30, resources=[{"CPU": 2}])
    try:
        with pytest.raises(LimitError, match=r"did not place the bundles \[\{'CPU': 1.0\}\].*within 2 s"):
            rayrt.Reservation(parse_placement({}).plan({"rollout": 1}), timeout_s=2)
    finally:
        hog.close()
    reservation = rayrt.Reservation(parse_placement({"rollout": {"cpus": 1}}).plan({"rollout": 1}), timeout_s=30)
    try:
        group = rayrt.RayGroup(Counter, [(1,)], "placed", timeout_s=30, **reservation.options("rollout"))
        assert group.call("add", 1) == [2]
        group.close()
    finally:
        reservation.close()


def test_a_call_to_every_actor_puts_an_update_once_and_every_worker_gets_it(cluster, monkeypatch):
    puts = []
    real_put = rayrt.put
    monkeypatch.setattr(rayrt, "put", lambda obj: puts.append(obj) or real_put(obj))
    group = rayrt.RayGroup(Receiver, [(), ()], "rollout", timeout_s=30)
    try:
        with pytest.raises(Refused, match="not today"):  # an exception type of the test's own
            group.call("refuse", "not today")
        update = WeightsUpdate(7, {"w": torch.randn(512, 512), "b": torch.arange(10), "h": torch.ones(3, dtype=torch.bfloat16)})
        results = gather(group.submit("load_weights", update), 30, "rollout.load_weights")
        assert [type(p) for p in puts].count(WeightsUpdate) == 1  # one put for both actors
        for version, tensors in results:
            assert version == 7 and tensors.keys() == update.tensors.keys()
            for name, t in update.tensors.items():
                assert tensors[name].dtype == t.dtype and torch.equal(tensors[name], t)
    finally:
        group.close()


@pytest.mark.skipif(not os.path.exists("/proc/net/tcp"), reason="needs Linux /proc")
def test_a_started_cluster_listens_on_loopback_only(cluster, counters):
    if not cluster.started:
        pytest.skip("joined an existing cluster (RAY_ADDRESS): its sockets are its own")
    tree = process_tree(os.getpid())  # the driver, GCS, raylet, agents and every worker descend from it
    assert set(counters.pids) <= set(tree)
    sockets = listening_sockets(tree)
    assert len(sockets) >= 5, sockets  # GCS, raylet (2), runtime-env agent, driver, actors
    assert {pid for pid, *_ in sockets} >= set(counters.pids)
    exposed = [s for s in sockets if not is_loopback(s[2])]
    assert not exposed, f"listening beyond loopback: {exposed}"
