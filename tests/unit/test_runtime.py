"""Worker groups: in-process calls, worker processes with futures, timeouts, deaths and cleanup."""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import time

import pytest
import torch

from reasonrl.runtime import LocalGroup, ProcessGroup, WorkerDied, WorkerTimeout, gather
from reasonrl.runtime.threads import available_cores, cgroup_cpu_quota, parse_cpu_max
from reasonrl.types import WeightsUpdate
from tests.worker_fixtures import Counter, Echo, broken


def test_local_group_calls_every_worker_and_delivers_errors_through_futures():
    group = LocalGroup([Counter(1), Counter(10)])
    assert group.call("add", 2) == [3, 12]
    [future, _] = group.submit("fail", "boom")
    assert future.done()
    with pytest.raises(ValueError, match="boom"):
        future.result()
    with pytest.raises(ValueError, match="LocalGroup: expected at least one worker"):
        LocalGroup([])


def test_process_group_runs_calls_in_order_in_another_process():
    group = ProcessGroup(Counter, [(5,), (5,)], name="counter", timeout_s=60)
    try:
        assert len(set(group.pids)) == 2 and os.getpid() not in group.pids
        futures = [group.submit("add", 1) for _ in range(3)]
        assert [f.result(timeout=60) for pair in futures for f in pair] == [6, 6, 7, 7, 8, 8]
        assert group.call("pid") == group.pids
        with pytest.raises(ValueError, match="nope") as err:
            group.call("fail", "nope")
        assert "in the worker process" in "".join(getattr(err.value, "__notes__", []))
        assert group.call("add", 0) == [8, 8]  # the worker survives an exception
    finally:
        group.close()


def test_concurrent_methods_run_beside_a_running_call():
    group = ProcessGroup(Counter, [()], name="counter", timeout_s=60, concurrent=("set_flag",))
    try:
        [waiting] = group.submit("wait_for_flag", 30.0)
        time.sleep(0.2)
        assert not waiting.done()
        assert group.call("set_flag") == [True]
        assert waiting.result(timeout=10) is True
    finally:
        group.close()


def test_a_hung_call_times_out_and_a_dead_worker_fails_its_calls():
    group = ProcessGroup(Counter, [()], name="counter", timeout_s=0.5)
    try:
        with pytest.raises(WorkerTimeout, match=r"counter.sleep: no answer within 0.5 s"):
            group.call("sleep", 30)
        group.kill()
        with pytest.raises(WorkerDied, match="counter: the worker process .* ended"):
            gather(group.submit("add", 1), 10, "add")
    finally:
        group.close()
    group = ProcessGroup(Counter, [()], name="counter", timeout_s=30)
    [pending] = group.submit("sleep", 30)
    [dies] = group.submit("die")
    os.kill(group.pids[0], signal.SIGKILL)
    with pytest.raises(WorkerDied, match="exit code -9"):
        pending.result(timeout=10)
    with pytest.raises(WorkerDied):
        dies.result(timeout=10)
    group.close()


def test_a_worker_that_cannot_be_built_raises_its_error():
    with pytest.raises(RuntimeError, match="cannot build this worker"):
        ProcessGroup(broken, [()], name="broken")


def test_weights_cross_a_process_as_one_object_with_each_parameter_as_an_out_of_band_buffer():
    tensors = {"a": torch.arange(6.0).view(2, 3), "b": torch.ones(4, dtype=torch.bfloat16), "c": torch.tensor([7.0])}
    update = WeightsUpdate(3, tensors)
    buffers = []
    data = pickle.dumps(update, protocol=5, buffer_callback=buffers.append)
    assert [b.raw().nbytes for b in buffers] == [24, 8, 4] and len(data) < 1000  # the bytes travel beside the pickle
    for back in (pickle.loads(data, buffers=buffers), pickle.loads(pickle.dumps(update))):
        assert back.version == 3 and all(torch.equal(back.tensors[k], tensors[k]) for k in tensors)
        assert back.tensors["b"].dtype == torch.bfloat16 and back.tensors["a"].shape == (2, 3)


def test_a_process_group_returns_what_it_was_sent_with_its_buffers():
    group = ProcessGroup(Echo, [()], name="echo", timeout_s=30)
    try:
        update = WeightsUpdate(5, {"w": torch.randn(300, 7), "h": torch.randn(9).bfloat16()})
        [back] = group.call("echo", update)
        assert back.version == 5 and all(torch.equal(back.tensors[k], update.tensors[k]) for k in update.tensors)
    finally:
        group.close()


CHILD_OF_KILLED_PARENT = """
import sys, time
sys.path.insert(0, sys.argv[1])
from reasonrl.runtime import ProcessGroup
from tests.worker_fixtures import Counter
group = ProcessGroup(Counter, [()], name="counter")
print(group.pids[0], flush=True)
time.sleep(60)
"""


def test_worker_processes_exit_when_their_parent_is_killed():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    parent = subprocess.Popen([sys.executable, "-c", CHILD_OF_KILLED_PARENT, root], stdout=subprocess.PIPE, text=True)
    try:
        child = int(parent.stdout.readline())
        parent.kill()
        parent.wait(timeout=10)
        deadline = time.time() + 10
        while time.time() < deadline and _alive(child):
            time.sleep(0.05)
        assert not _alive(child), "the worker process outlived its parent"
    finally:
        parent.kill()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


LIGHT_THEN_MODELS = """
import json, sys
sys.path.insert(0, sys.argv[1])
import torch  # imported, as in a trainer whose pre-start check grades rows
from reasonrl.config import RewardConfig
from reasonrl.reward.base import GraderWorker
from reasonrl.runtime import ProcessGroup

def served(preload_models):
    group = ProcessGroup(GraderWorker, [(RewardConfig(fn="tests.reward_fixtures:reports_its_modules"),)],
                         name="reward", timeout_s=60, preload_models=preload_models)
    [grade] = group.call("grade", "x", "y", {})
    with open(f"/proc/{group.pids[0]}/stat") as f:
        server = int(f.read().rsplit(")", 1)[1].split()[1])
    group.close()
    return {"server": server, **grade.extras}

print(json.dumps([served(False), served(True)]))
"""


def test_workers_without_models_start_from_a_forkserver_of_their_own_that_ends_with_their_group():
    """The pre-start check's graders (``preload_models=False``) begin without torch and
    ``transformers`` in a process that has imported torch, and their forkserver ends with them,
    so the next group's workers begin with the model modules preloaded."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.run([sys.executable, "-c", LIGHT_THEN_MODELS, root], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    light, models = json.loads(proc.stdout.splitlines()[-1])
    assert (light["torch"], light["transformers"]) == (False, False)
    assert (models["torch"], models["transformers"]) == (True, True)
    assert light["server"] != models["server"] and not _alive(light["server"])


def test_one_worker_of_a_process_group_is_called_alone_and_restarted_from_its_own_arguments():
    group = ProcessGroup(Counter, [(1,), (100,)], name="pair", timeout_s=30)
    try:
        assert group.submit_to(1, "add", 5).result(timeout=30) == 105
        assert group.call("add", 0) == [1, 105]  # worker 0 was not called
        [pending] = [group.submit_to(1, "sleep", 30)]
        old = group.pids[1]
        group.restart(1)
        with pytest.raises(WorkerDied):
            pending.result(timeout=10)
        assert group.pids[1] != old and group.pids[0] != old
        assert group.call("add", 0) == [1, 100]  # the new worker 1 was built from (100,) again
    finally:
        group.close()


def test_a_thread_group_serves_each_worker_on_its_own_thread_and_concurrent_methods_at_once():
    from reasonrl.runtime.group import ThreadGroup

    group = ThreadGroup(Counter, [(0,), (10,)], name="threads", timeout_s=30, concurrent=("set_flag",))
    try:
        waiting = group.submit_to(0, "wait_for_flag", 30.0)
        assert group.submit_to(1, "add", 1).result(timeout=10) == 11  # worker 1 is not blocked by worker 0
        time.sleep(0.1)
        assert not waiting.done()
        assert group.submit_to(0, "set_flag").result(timeout=1) is True  # beside worker 0's running call
        assert waiting.result(timeout=10) is True
        assert group.pids == [os.getpid()] * 2
        with pytest.raises(WorkerDied, match="cannot be restarted"):
            group.restart(0)
    finally:
        group.close()


class _Seconds(float):
    """A float a weak reference can follow."""


def test_a_thread_group_keeps_nothing_of_a_finished_call_and_has_ended_its_threads_once_closed():
    # A daemon thread still alive when the interpreter finalizes is ended inside whatever C++
    # code it runs, freeing a tensor included, which aborts the process: a closed group's
    # threads have ended, and none holds a call's objects for its owner to outlive.
    import gc
    import threading
    import weakref

    from reasonrl.runtime.group import ThreadGroup

    group = ThreadGroup(Counter, [(0,), (10,)], name="ending", timeout_s=30)
    try:
        seconds = _Seconds(0.0)
        held = weakref.ref(seconds)
        answer = group.submit_to(0, "sleep", seconds)
        assert answer.result(timeout=10) == 0.0
        del seconds, answer
        time.sleep(0.1)
        gc.collect()
        assert held() is None, "the worker's thread still holds the arguments of a call it finished"
    finally:
        group.close()
    assert [t.name for t in threading.enumerate() if t.name.startswith("reasonrl-ending")] == []


def test_a_cgroup_quota_reads_in_cores():
    assert parse_cpu_max("150000 100000\n") == 1.5
    assert parse_cpu_max("200000 100000") == 2.0
    assert parse_cpu_max("max 100000") is None
    assert parse_cpu_max("-1 100000") is None  # cgroup v1's "no quota"
    quota = cgroup_cpu_quota()
    assert quota is None or quota > 0
    assert 1 <= available_cores() <= len(os.sched_getaffinity(0))


@pytest.mark.parametrize("env, expected, said", [
    ({"OMP_WAIT_POLICY": "ACTIVE"}, "ACTIVE", "as the environment sets them (OMP_WAIT_POLICY=ACTIVE)"),
    ({"GOMP_SPINCOUNT": "1000"}, "None", "as the environment sets them (GOMP_SPINCOUNT=1000)"),
    ({"BUSY": "2"}, "PASSIVE", "sleeping (OMP_WAIT_POLICY=PASSIVE): other work keeps ")])
def test_openmp_threads_sleep_at_barriers_beside_other_work_unless_the_environment_says_otherwise(env, expected, said):
    # BUSY: that many processes that never sleep run while the choice is made (two cores' worth)
    code = ("import os, subprocess, sys, time\n"
            "busy = [subprocess.Popen([sys.executable, '-c', 'while True: pass']) for _ in range(int(os.environ.get('BUSY', 0)))]\n"
            "time.sleep(0.5)\n"
            "from reasonrl.runtime.threads import openmp_waits\nprint(openmp_waits(), file=sys.stderr)\n"
            "[p.kill() for p in busy]\nprint(os.environ.get('OMP_WAIT_POLICY'), file=sys.stderr)")
    clean = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    done = subprocess.run([sys.executable, "-c", code], env={**clean, **env}, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stderr.strip().splitlines()[-1] == expected, done.stderr
    assert done.stderr.strip().splitlines()[-2].startswith(said), done.stderr
