"""Torch's process-wide settings for a worker process (or the trainer's own), the cores a
process may use (read without torch: the run's plan asks for them before anything trains),
and how torch's OpenMP threads wait."""

from __future__ import annotations

import math
import os
import time


def setup_torch(threads: int, deterministic: bool) -> None:
    """Torch threads: ``threads``, else the cores this process may run on; deterministic kernels."""
    import torch

    torch.set_num_threads(threads or available_cores())
    torch.use_deterministic_algorithms(deterministic)


def available_cores() -> int:
    """The cores this process may use: its CPU affinity where the OS has one, at most its
    cgroup's CPU quota rounded up (a container given 1.5 CPUs of a 16-core machine: 2)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    quota = cgroup_cpu_quota()
    if quota is not None:
        cores = min(cores or 2, math.ceil(quota))
    return max(1, cores or 2)


def cgroup_cpu_quota() -> float | None:
    """The CPU quota of this process's cgroup, in cores: cgroup v2's ``cpu.max`` (``quota
    period``), else v1's ``cpu.cfs_quota_us / cpu.cfs_period_us``; None where there is no
    quota (``max``, -1) or no cgroup file to read."""
    root = "/sys/fs/cgroup"
    for controllers, path in _own_cgroups():
        if controllers == "":  # v2
            candidates = [f"{root}{path}/cpu.max", f"{root}/cpu.max"]
        elif "cpu" in controllers.split(","):
            candidates = [f"{root}/{controllers}{path}/cpu.cfs_quota_us", f"{root}/cpu{path}/cpu.cfs_quota_us",
                          f"{root}/cpu/cpu.cfs_quota_us"]
        else:
            continue
        for file in candidates:
            try:
                with open(file) as f:
                    text = f.read()
                if file.endswith("cpu.max"):
                    return parse_cpu_max(text)
                with open(file.replace("cfs_quota_us", "cfs_period_us")) as f:
                    return parse_cpu_max(f"{text.strip()} {f.read().strip()}")
            except OSError:
                continue
    return None


def parse_cpu_max(text: str) -> float | None:
    """Cores in a ``quota period`` pair (``"150000 100000"``: 1.5); None for no quota (``max`` or a negative quota)."""
    quota, _, period = text.strip().partition(" ")
    if quota == "max" or not period or int(quota) < 0:
        return None
    return int(quota) / int(period)


def _own_cgroups() -> list[tuple[str, str]]:
    """(controllers, path) of each line of /proc/self/cgroup (v2's line has no controllers)."""
    try:
        with open("/proc/self/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    return [(parts[1], parts[2]) for parts in (line.split(":", 2) for line in lines) if len(parts) == 3]


CHOICE_ENV = "REASONRL_OPENMP_WAITS"
"""The supervisor's choice in words, handed to the trainers it starts: they load torch from its
template (:mod:`reasonrl.resilience.supervisor`), which the choice preceded, so they keep it."""


def openmp_waits(beside: str = "") -> str:
    """Choose how torch's OpenMP threads wait at a barrier, for this process and every process it
    starts, before torch loads (libgomp reads the variables once, when it is loaded); returns
    the choice in words. A trainer the supervisor started returns the supervisor's choice
    (:data:`CHOICE_ENV`). An ``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT`` of the environment stands.
    Otherwise, when work of the run's own will run ``beside`` (what, in words: a standby
    trainer's build), or other work keeps at least half a core busy (:func:`others_busy_cores`),
    the threads sleep at once (``OMP_WAIT_POLICY=PASSIVE``); on an idle machine libgomp's
    default stands: they spin about 300,000 iterations first.

    Measured with ``bench/contention.py`` (docs/benchmarks.md): spinning is 1.4x faster on an
    idle machine (a DAPO step of the embedded recipe: 0.69-0.71 s against 0.94-1.01 s), but
    beside one busy process on 2 cores a spinning thread holds the core the awaited thread
    needs: 2.42-2.46 s a step against 1.26-1.32 s sleeping, and beside several agents' jobs
    46-101 s against 2.1-5.6 s."""
    chosen = os.environ.pop(CHOICE_ENV, "")
    if chosen:
        return chosen
    given = [f"{key}={os.environ[key]}" for key in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT") if key in os.environ]
    if given:
        return f"as the environment sets them ({', '.join(given)})"
    if beside:
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
        return f"sleeping (OMP_WAIT_POLICY=PASSIVE): {beside}"
    busy = others_busy_cores()
    if busy >= 0.5:
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
        return f"sleeping (OMP_WAIT_POLICY=PASSIVE): other work keeps {busy:.1f} cores busy"
    return "spinning first (libgomp's default): the machine is idle"


def others_busy_cores(seconds: float = 0.2) -> float:
    """Cores the machine's processes kept busy over ``seconds`` while this one slept (from
    ``/proc/stat``; 0.0 where it cannot be read)."""
    try:
        busy0, total0 = cpu_jiffies()
        time.sleep(seconds)
        busy1, total1 = cpu_jiffies()
    except (OSError, ValueError, IndexError):
        return 0.0
    cores = os.cpu_count() or 1
    return cores * (busy1 - busy0) / (total1 - total0) if total1 > total0 else 0.0


def cpu_jiffies() -> tuple[int, int]:
    """(busy, total) CPU time of the whole machine since boot, in clock ticks, from
    ``/proc/stat`` (busy: all but idle and iowait); OSError where it is absent."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    return sum(fields) - fields[3] - fields[4], sum(fields)
