"""Torch's process-wide settings for a worker process (or the trainer's own), the cores a
process may use (read without torch: the run's plan asks for them before anything trains),
and how torch's OpenMP threads wait."""

from __future__ import annotations

import math
import os


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


def sleeping_openmp_waits() -> None:
    """Make torch's OpenMP threads sleep, not spin, while they wait at a barrier
    (``OMP_WAIT_POLICY=PASSIVE``), in this process and every process it starts, unless the
    environment already sets ``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT``. Call it before torch
    loads: libgomp reads the variables once, when it is loaded.

    By default libgomp's threads spin for about 300,000 iterations at every barrier before they
    sleep. On a machine whose cores other work also uses, a spinning thread holds a core that
    the thread everyone waits for needs, and each parallel region waits for a descheduled
    thread: a DAPO step of the embedded recipe took 46-101 s beside other jobs with spinning
    waits and 2.1-5.6 s with sleeping ones (``bench/contention.py``, docs/benchmarks.md)."""
    if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
