"""The zygote (reasonrl.runtime.zygote): workers forked from a process that imported torch,
checked in a script of their own (a pytest process runs threads, where no zygote starts); and
the template, a zygote in an interpreter of its own, whose children run a module as ``python -m``."""

from __future__ import annotations

import json
import os
import signal
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


def test_a_template_forks_children_that_run_a_module_as_python_m_would_and_ends_with_close(monkeypatch, capfd):
    from reasonrl.runtime.zygote import Template

    monkeypatch.setenv("TEMPLATE_START_VAR", "at start")  # the template's environment, which its children begin with
    template, why = Template.start(("torch",), shown=("-m", "tests.template_fixtures", "shown"))
    assert template is not None, why
    found, codes, stderr = {}, {}, {}
    try:
        with open(f"/proc/{template.pid}/cmdline", "rb") as f:
            assert f.read().split(b"\0")[-4:-1] == [b"-m", b"tests.template_fixtures", b"shown"]
        for mode in ("ok", "exit3", "message", "raise", "wait"):
            read, write = os.pipe()
            child = template.run_module("tests.template_fixtures", [str(write), mode], env={"TEMPLATE_CHILD_VAR": mode},
                                        pass_fds=(write,))
            os.close(write)
            with os.fdopen(read) as f:
                found[mode] = json.loads(f.readline())
            if mode == "wait":
                child.send_signal(signal.SIGTERM)
            codes[mode] = child.wait(timeout=60)
            stderr[mode] = child.stderr.read().decode()
            assert found[mode]["pid"] == child.pid and child.poll() == codes[mode] == child.returncode
    finally:
        template.close()
    assert not template.alive()
    assert codes == {"ok": 0, "exit3": 3, "message": 1, "raise": 1, "wait": -signal.SIGTERM}
    for mode, info in found.items():
        assert info["ppid"] == template.pid and info["session_leader"] and info["argv"][1] == mode, info
        assert info["env"] == mode and info["inherited_env"] == "at start" and info["torch"], info  # imported once
        assert info["sigint_default"] and info["stdin"] == "/dev/null" and info["name"] == "__main__", info
        assert info["argv0"].endswith(os.path.join("tests", "template_fixtures.py")), info
        assert mode == "wait" or stderr[mode].startswith(f"stderr of {mode}\n"), stderr  # "wait": killed before
    assert "a message" in stderr["message"] and "ValueError: raised at the top" in stderr["raise"]
    # as the interpreter ends: non-daemon threads joined first, then the exit handlers (not for the killed one)
    assert capfd.readouterr().out == "thread done\nexit handler\n" * 4


def test_a_template_whose_imports_fail_says_so_and_leaves_nothing_running():
    from reasonrl.runtime.zygote import Template

    template, why = Template.start(("torch", "no_such_module_for_a_template"))
    assert template is None and why == "it exited with code 1 while importing torch, no_such_module_for_a_template"
