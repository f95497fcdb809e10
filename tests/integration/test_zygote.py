"""The zygote (reasonrl.runtime.zygote): workers forked from a process that imported torch,
checked in a script of their own (a pytest process runs threads, where no zygote starts)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

WORKER = '''
import os, torch

class Worker:
    def __init__(self, tag):
        self.tag = tag

    def info(self):
        files = []
        for fd in os.listdir("/proc/self/fd"):
            try:
                files.append(os.readlink(f"/proc/self/fd/{fd}"))
            except OSError:
                pass  # the listing's own descriptor
        return {"pid": os.getpid(), "ppid": os.getppid(), "tag": self.tag, "files": files,
                "sum": float(torch.ones(1 << 18).mul(2).sum())}

    def fail(self):
        raise ValueError("raised in the worker")

    def exit(self, code):
        os._exit(code)
'''

SCRIPT = '''
import json, os, sys, time
import torch
from reasonrl.runtime import zygote
from reasonrl.runtime.group import WorkerDied
from reasonrl.runtime.process import ProcessGroup
from worker import Worker

held = open(os.path.join(sys.argv[1], "held.lock"), "w")  # stands for run.lock: no worker may hold it
began = time.perf_counter()
assert zygote.start_zygote(), zygote.unsafe_reason()
out = {"zygote_s": time.perf_counter() - began, "zygote_pid": zygote._zygote.pid}
began = time.perf_counter()
group = ProcessGroup(Worker, [("a",), ("b",)], name="w", timeout_s=60)
out["start_s"] = time.perf_counter() - began
out["info"] = group.call("info")
try:
    group.call("fail")
except ValueError as err:
    out["raised"] = str(err).splitlines()[0]
try:
    group.submit_to(1, "exit", 3).result(timeout=30)
except WorkerDied as err:
    out["died"] = str(err)
group.restart(1)
out["restarted"] = group.call("info")[1]
if len(sys.argv) == 2:  # the zygote killed: a restart's worker comes from the forkserver instead
    os.kill(zygote._zygote.pid, 9)
    time.sleep(0.5)
    group.restart(0)
    out["after_zygote"] = group.call("info")[0]
    out["zygote_running"] = zygote.running()
print(json.dumps(out), flush=True)
if len(sys.argv) > 2:
    os.kill(os.getpid(), 9)  # the trainer dies: the zygote and its workers must follow
group.close()
'''


def _run(tmp_path, *args: str) -> subprocess.CompletedProcess:
    (tmp_path / "worker.py").write_text(WORKER)
    (tmp_path / "script.py").write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    return subprocess.run([sys.executable, str(tmp_path / "script.py"), str(tmp_path), *args], capture_output=True,
                          text=True, timeout=180, env=env)


def test_workers_are_forked_by_the_zygote_without_the_trainers_files_and_report_errors_and_exit_codes(tmp_path):
    # ... and once the zygote is killed, a restarted worker starts through the forkserver.
    proc = _run(tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.splitlines()[-1])
    zygote_pid = out["zygote_pid"]
    assert [i["ppid"] for i in out["info"]] == [zygote_pid, zygote_pid]
    assert [i["tag"] for i in out["info"]] == ["a", "b"] and all(i["sum"] == 2.0 * (1 << 18) for i in out["info"])
    assert out["raised"] == "raised in the worker"
    assert "exit code 3" in out["died"]
    assert out["restarted"]["ppid"] == zygote_pid and out["restarted"]["pid"] != out["info"][1]["pid"]
    # No worker holds a file the trainer held open (its run.lock, say).
    assert out["zygote_running"] is False and out["after_zygote"]["ppid"] != zygote_pid
    assert out["after_zygote"]["sum"] == 2.0 * (1 << 18)
    held = str((tmp_path / "held.lock").resolve())
    assert all(held not in info["files"] for info in out["info"] + [out["restarted"]])


def test_a_killed_trainer_takes_its_zygote_and_workers_with_it_and_no_worker_holds_its_files(tmp_path):
    proc = _run(tmp_path, "kill")
    assert proc.returncode == -9, proc.stderr[-3000:]
    out = json.loads(proc.stdout.splitlines()[-1])
    pids = [out["zygote_pid"], *(i["pid"] for i in out["info"][:1]), out["restarted"]["pid"]]
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and any(_alive(pid) for pid in pids):
        time.sleep(0.1)
    assert not any(_alive(pid) for pid in pids), [pid for pid in pids if _alive(pid)]


def test_a_process_that_ran_a_parallel_region_starts_no_zygote_and_its_workers_start_anyway(tmp_path):
    # GNU OpenMP's pool does not survive a fork: the probe finds it and the forkserver starts the workers.
    (tmp_path / "worker.py").write_text(WORKER)
    script = textwrap.dedent('''
        import json, time, torch
        torch.set_num_threads(2)
        torch.ones(1 << 20).mul(2).sum()
        from reasonrl.runtime import zygote
        from reasonrl.runtime.process import ProcessGroup, start_worker_processes
        from worker import Worker
        began = time.perf_counter()
        start_worker_processes(("worker",))
        fallback_s = time.perf_counter() - began
        group = ProcessGroup(Worker, [("a",)], name="w", timeout_s=120)
        [info] = group.call("info")
        group.close()
        print(json.dumps({"zygote": zygote.running(), "fallback_s": fallback_s, "sum": info["sum"]}))
    ''')
    (tmp_path / "fallback.py").write_text(script)
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.run([sys.executable, str(tmp_path / "fallback.py")], capture_output=True, text=True, timeout=180,
                          env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.splitlines()[-1])
    assert out["zygote"] is False and out["sum"] == 2.0 * (1 << 18)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False
