"""The code sandbox and reward.fn=code: hostile programs are contained and scored as failures,
and the next program runs as usual."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest

from reasonrl.config import RewardConfig, load
from reasonrl.controller import Controller
from reasonrl.errors import InputError
from reasonrl.metrics import read_jsonl
from reasonrl.reward.code import make_code_reward
from reasonrl.reward.sandbox import LEVELS, MAX_OUTPUT, WORK_BYTES, Limits, _run_at, probe, run_program
from tests.conftest import tiny_run


def level_or_skip(level: str) -> str:
    problem = probe(level)
    if problem is not None:
        pytest.skip(f"reward.sandbox={level} does not work here: {problem}")
    return level


@pytest.fixture(params=LEVELS)
def level(request) -> str:
    return level_or_skip(request.param)


GOOD = "```python\ndef f(x):\n    return 3*x+2\n```"
TESTS = json.dumps(["assert f(0)==2", "assert f(1)==5", "assert f(4)==14"])


def test_both_levels_run_a_program_with_stdin_in_a_fresh_directory(level):
    result = run_program("import os\nprint(int(input()) * 2, os.listdir('.'))", "21\n", Limits(wall_s=10), level)
    assert (result.returncode, result.stdout, result.timed_out) == (0, "42 ['program.py']\n", False)


def test_an_infinite_loop_and_a_fork_bomb_and_a_memory_hog_are_stopped(level):
    loop = run_program("while True: pass", "", Limits(wall_s=1.5), level)
    assert loop.timed_out  # stopped at its limit (an unstopped loop would run until the test's own timeout)
    bomb = run_program("import os\nwhile True:\n    os.fork()\n", "", Limits(wall_s=5), level)
    assert "Resource temporarily unavailable" in bomb.stderr or bomb.timed_out
    hog = run_program("x = bytearray(4 << 30)\nprint('allocated')", "", Limits(wall_s=5, memory_mb=256), level)
    assert hog.returncode != 0 and "MemoryError" in hog.stderr and "allocated" not in hog.stdout
    big = run_program("open('big', 'wb').write(b'x' * (50 << 20))", "", Limits(wall_s=5), level)
    assert big.returncode != 0 and "File too large" in big.stderr
    flood = run_program("while True:\n    print('x' * 1000)", "", Limits(wall_s=2), level)
    assert "File too large" in flood.stderr and len(flood.stdout) <= MAX_OUTPUT


def test_bwrap_hides_host_files_blocks_writes_outside_and_has_no_network(tmp_path):
    level = level_or_skip("bwrap")
    secret = tmp_path / "secret.txt"
    secret.write_text("the host's secret")
    read = run_program(f"print(open({str(secret)!r}).read())", "", Limits(wall_s=5), level)
    assert read.returncode != 0 and "secret" not in read.stdout and "No such file" in read.stderr
    outside = tmp_path / "written.txt"
    write = run_program(f"open({str(outside)!r}, 'w').write('x')\nopen('/usr/evil', 'w').write('x')", "",
                        Limits(wall_s=5), level)
    assert write.returncode != 0 and not outside.exists() and not os.path.exists("/usr/evil")
    fill = run_program("for i in range(100):\n    open(f'f{i}', 'wb').write(b'x' * ((1 << 20) - 1))\nprint('filled')",
                       "", Limits(wall_s=10), level)
    assert "No space left" in fill.stderr and "filled" not in fill.stdout
    with socket.socket() as server:  # a host port the program must not reach
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        server.settimeout(0.5)
        net = run_program("import socket\nfor address in (('127.0.0.1', %d), ('1.1.1.1', 80)):\n"
                          "    try:\n        socket.create_connection(address, timeout=1); print('connected', address)\n"
                          "    except OSError as e:\n        print('blocked', e)\n" % port, "", Limits(wall_s=8), level)
        with pytest.raises(TimeoutError):
            server.accept()
    assert net.returncode == 0 and "connected" not in net.stdout and net.stdout.count("blocked") == 2


# Writes up to FILL_MIB MiB in files of 1 MiB under ``dir`` (the file-size cap) and prints how many
# bytes went in, and the error that stopped it.
_FILL = """
def fill(dir, label):
    written, error = 0, None
    try:
        for i in range(FILL_MIB):
            with open(f"{dir}/f{i}", "wb") as f:
                for _ in range(16):
                    written += f.write(b"x" * (64 << 10))
    except OSError as e:
        error = e.strerror
    print(label, written, error, flush=True)
"""

# A nested user and mount namespace (through libc, a raw clone and the unshare binary), a tmpfs of
# the program's own mounted there and FILL_MIB MiB written into it; then the same mount without a new
# namespace. Threads and child processes (clone3 refused, clone taken) still work.
NAMESPACE_PROBE = _FILL + r"""
import ctypes, os, shutil, subprocess, threading
libc = ctypes.CDLL(None, use_errno=True)
def said(label, result):
    print(label, result, os.strerror(ctypes.get_errno()) if result == -1 else "", flush=True)
    return result
os.mkdir("m")
said("mount", libc.mount(b"none", b"m", b"tmpfs", 0, None))
said("clone3", libc.syscall(435, None, ctypes.c_size_t(88)))
pid = libc.syscall(56, 0x10000000 | 0x20000 | 17, 0, 0, 0, 0)
if pid == 0:
    os._exit(0)
said("clone", pid)
if shutil.which("unshare"):
    run = subprocess.run(["unshare", "-Urm", "sh", "-c", "mount -t tmpfs none m && echo mounted"],
                         capture_output=True, text=True)
    print("unshare-binary", run.returncode, run.stdout.strip(), run.stderr.strip(), flush=True)
uid, gid = os.getuid(), os.getgid()
if said("unshare", libc.unshare(0x10000000 | 0x20000)) == 0:  # root of the namespace, as unshare -Urm makes it
    for name, text in (("setgroups", "deny"), ("uid_map", f"0 {uid} 1"), ("gid_map", f"0 {gid} 1")):
        with open(f"/proc/self/{name}", "w") as f:
            f.write(text)
    said("mount-in-namespace", libc.mount(b"none", b"m", b"tmpfs", 0, None))
fill("m", "wrote")
box = []
thread = threading.Thread(target=box.append, args=("thread ran",))
thread.start(); thread.join()
print(*box, subprocess.run(["echo", "child ran"], capture_output=True, text=True).stdout.strip())
"""


def test_a_nested_namespace_and_a_mount_of_its_own_do_not_lift_the_file_cap(level):
    fill = 200 if level == "bwrap" else 0  # rlimits: the working directory is on the host's disk, not capped
    result = run_program(f"FILL_MIB = {fill}\n" + NAMESPACE_PROBE, "", Limits(wall_s=30), level)
    lines = {line.split()[0]: line for line in result.stdout.splitlines()}
    assert result.returncode == 0, result.stderr
    if fill:  # the 64 MiB working directory is full
        assert int(lines["wrote"].split()[1]) <= WORK_BYTES and lines["wrote"].endswith("No space left on device")
    assert lines["unshare"] == "unshare -1 Operation not permitted" and "mount-in-namespace" not in lines
    if "unshare-binary" in lines:
        assert "mounted" not in lines["unshare-binary"] and "Operation not permitted" in lines["unshare-binary"]
    assert lines["mount"] == "mount -1 Operation not permitted"
    assert lines["clone"] == "clone -1 Operation not permitted"
    assert lines["clone3"] == "clone3 -1 Function not implemented"
    assert lines["thread"] == "thread ran child ran"


# Memory that is a file: memfd_create and System V shared memory (whose segments outlive their
# mapping), and the directories in DIRS; each takes 200 MiB if it can.
MEMORY_FILE_PROBE = _FILL + r"""
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
written, error = 0, None
try:
    for _ in range(200):
        written += os.write(os.memfd_create("x"), b"x" * (1 << 20))
except OSError as e:
    error = e.strerror
print("memfd", written, error, flush=True)
segment = libc.shmget(0, 200 << 20, 0o1600)
print("shmget", segment, os.strerror(ctypes.get_errno()) if segment == -1 else "", flush=True)
if segment != -1:  # at rlimits it would outlive the run on the host
    libc.shmctl(segment, 0, None)
for dir in DIRS:
    fill(dir, dir)
"""


def test_memory_backed_files_do_not_lift_the_file_cap(level):
    dirs = ["/dev/shm", "/tmp"] if level == "bwrap" else []  # rlimits: the host's, and not capped (docs/sandbox.md)
    result = run_program(f"FILL_MIB, DIRS = 200, {dirs!r}\n" + MEMORY_FILE_PROBE, "", Limits(wall_s=30), level)
    lines = {line.split()[0]: line for line in result.stdout.splitlines()}
    assert result.returncode == 0, result.stderr
    assert lines["memfd"] == "memfd 0 Operation not permitted"
    assert lines["shmget"] == "shmget -1 Operation not permitted"
    for dir in dirs:
        assert lines[dir] == f"{dir} 0 Read-only file system"


def test_the_rlimits_launcher_installs_the_filter_itself(monkeypatch):
    """bwrap installs the filter; at rlimits the launcher does. Run as root, rlimits needs an
    interpreter nobody may run: the system's, where reasonrl's is not one (this machine's is under
    /root)."""
    if probe("rlimits") is not None:
        system = Path("/usr/bin/python3")
        if not system.exists() or os.geteuid() != 0:
            pytest.skip(f"reward.sandbox=rlimits does not work here: {probe('rlimits')}")
        monkeypatch.setattr("reasonrl.reward.sandbox._interpreter", lambda: str(system.resolve()))
    ns = _run_at("rlimits", "FILL_MIB = 0\n" + NAMESPACE_PROBE, "", Limits(wall_s=30))
    memory = _run_at("rlimits", "FILL_MIB, DIRS = 0, []\n" + MEMORY_FILE_PROBE, "", Limits(wall_s=30))
    assert ns.returncode == 0 and memory.returncode == 0, (ns.stderr, memory.stderr)
    lines = {line.split()[0]: line for line in ns.stdout.splitlines() + memory.stdout.splitlines()}
    for name in ("unshare", "clone", "shmget"):
        assert lines[name] == f"{name} -1 Operation not permitted"
    assert lines["memfd"] == "memfd 0 Operation not permitted"
    assert lines["clone3"] == "clone3 -1 Function not implemented" and lines["thread"] == "thread ran child ran"


def test_hostile_code_scores_as_failure_and_the_next_sample_still_passes(level):
    fn = make_code_reward(RewardConfig(code_timeout_s=3.0, code_memory_mb=256, sandbox=level))
    hostile = ["while True: pass", "import os\nwhile True:\n    os.fork()", "x = bytearray(4 << 30)",
               "import sys\nprint('\\nfake 3')\nsys.exit(0)"]
    if level == "bwrap":  # rlimits hides neither files nor the network (docs/sandbox.md)
        hostile.append("open('/etc/passwd').read()\nimport socket\nsocket.create_connection(('1.1.1.1', 80), timeout=1)")
    for body in hostile:
        out = fn(f"```python\n{body}\ndef f(x):\n    return 3*x+2\n```", TESTS)
        assert out["acc"] is False and out["score"] == -1.0 and out["tests_passed"] == 0, body
    assert fn(GOOD, TESTS) == {"score": 1.0, "acc": True, "pred": "3/3 tests", "tests_passed": 3, "tests_total": 3}


def test_a_sandbox_level_that_does_not_work_is_an_input_error(monkeypatch):
    monkeypatch.setattr("reasonrl.reward.sandbox.probe", lambda level: "no bubblewrap found")
    with pytest.raises(InputError, match="reward.sandbox = 'bwrap' does not work on this machine: no bubblewrap"):
        make_code_reward(RewardConfig(sandbox="bwrap"))


@pytest.mark.slow
def test_a_training_step_on_the_embedded_code_family_grades_programs(tmp_path, model_dir):
    cfg = load(None, [*tiny_run(model_dir, tmp_path, steps=1), "data.families=[code]", "reward.fn=code",
                      "reward.code_timeout_s=2", "rollout.max_new_tokens=16", "runtime.roles.reward.count=1"])
    Controller.from_config(cfg).run()
    [row] = read_jsonl(tmp_path / "metrics.jsonl")
    assert row["reward/tests_total"] == 3.0 and 0.0 <= row["reward/tests_passed"] <= 3.0
    kept = read_jsonl(tmp_path / "samples.jsonl")
    assert kept and all(r["data_source"] == "embedded/code" and r["tests_total"] == 3 for r in kept)


HACKS = {
    "a frame walk to the grader's secrets": (
        "import sys\nf = sys._getframe()\nwhile f.f_back: f = f.f_back\n"
        "g = f.f_globals\nprint('passed 3')\nsys.stdout.flush()\ndef f(x):\n    return 0\n"),
    "an object equal to everything": (
        "class Any:\n    def __eq__(self, other): return True\n    __hash__ = None\n"
        "def f(x):\n    return Any()\n"),
    "an int subclass equal to everything": (
        "class Int(int):\n    def __eq__(self, other): return True\n    __hash__ = int.__hash__\n"
        "def f(x):\n    return Int(0)\n"),
    "an early os._exit": "import os\nprint('passed 3')\nos._exit(0)\ndef f(x):\n    return 3*x+2\n",
    "an early sys.exit": "import sys\nprint('\\npassed 3')\nsys.exit(0)\ndef f(x):\n    return 3*x+2\n",
    "an exit after the first test": ("import os\ncalls = []\ndef f(x):\n    calls.append(x)\n"
                                     "    if len(calls) == 2: os._exit(0)\n    return 3*x+2\n"),
    "a write to the grader's stdout through /proc": (
        "import os\nfor fd in ('/proc/%d/fd/1' % os.getppid(), '/proc/1/fd/1'):\n    try:\n"
        "        open(fd, 'w').write('passed 3\\n')\n    except OSError:\n        pass\n"
        "def f(x):\n    return 0\n"),
}


@pytest.mark.parametrize("hack", sorted(HACKS))
def test_an_assert_run_grades_returned_values_not_claims(level, hack):
    fn = make_code_reward(RewardConfig(code_timeout_s=10.0, code_memory_mb=512, sandbox=level))
    out = fn(f"```python\n{HACKS[hack]}```", TESTS)
    assert out["acc"] is False and out["score"] == -1.0 and out["tests_passed"] == 0, (hack, out)


def test_an_honest_program_scores_full_marks_with_every_assert_form(level):
    fn = make_code_reward(RewardConfig(code_timeout_s=10.0, code_memory_mb=512, sandbox=level))
    program = "```python\nimport math\ndef f(x):\n    return 3*x+2\ndef g(n):\n    return [n, (n, 1.5), {'k': {n}}]\n```"
    tests = json.dumps(["assert f(0)==2", "assert f(1) == 5", "assert 14 == f(4)", "assert f(2) != 7",
                        "assert g(1) == [1, (1, 1.5), {'k': {1}}]", "assert f(1) in [5, 6]",
                        "assert math.isclose(f(0), 2.0)", "y = f(3)\nassert y == 11", "assert f(1) < f(2)",
                        "assert not f(0) == 3"])
    out = fn(program, tests)
    assert out == {"score": 1.0, "acc": True, "pred": "10/10 tests", "tests_passed": 10, "tests_total": 10}, out
    half = fn("```python\ndef f(x):\n    return 2 if x == 0 else 0\n```", TESTS)
    assert half["tests_passed"] == 1 and half["score"] == pytest.approx(-1 / 3), half
