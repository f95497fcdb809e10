"""Supervisor overhead on a clean run.

Two measurements, one JSON line:
- paired (inside one run, so machine noise cancels): a supervised `reasonrl train` is run
  from this process; the trainer child is wrapped so that it reports its own lifetime;
  overhead = (supervisor wall time - child lifetime) / supervisor wall time, i.e. the time
  the supervisor adds around the trainer (start-up, polling, restart logic, summary). The
  wrapper is no `python -m` command, so this child is a process of its own, not forked from
  the trainer template.
- end to end: the same training as a fresh command, supervised (its trainer forked from the
  template, the default) vs `--no-supervisor`, interleaved over seeds (subject to the
  machine's +-12% run-to-run noise).

Each run starts once the machine is idle again (what the run before left running has ended):
a command that starts beside busy cores lets its OpenMP threads sleep instead of spin
(reasonrl.runtime.threads.openmp_waits), which alone made a 30-step run 1.4x slower (45 s
against 31 s) when one started while the run before was still ending.

    python bench/supervisor_overhead.py --seeds 3 --steps 20
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WRAPPER = (
    "import subprocess, sys, time; t = time.perf_counter(); rc = subprocess.call(sys.argv[2:], stdout=subprocess.DEVNULL); "
    "open(sys.argv[1], 'a').write(f'{time.perf_counter() - t}\\n'); sys.exit(rc)"
)


def settle(timeout_s: float = 30.0) -> None:
    """Wait until other work keeps less than a quarter of a core busy (at most ``timeout_s``)."""
    from reasonrl.runtime.threads import others_busy_cores

    deadline = time.monotonic() + timeout_s
    while others_busy_cores(0.5) >= 0.25 and time.monotonic() < deadline:
        pass


def train_args(run_dir: str, seed: int, steps: int) -> list[str]:
    return ["dapo", f"run.dir={run_dir}", f"run.seed={seed}", f"train.total_steps={steps}", "eval.every_steps=0", "run.progress=false"]


def paired(seed: int, steps: int, root: str) -> float:
    """Supervisor wall time minus the trainer child's lifetime, as a fraction of the former."""
    from reasonrl.resilience.supervisor import RestartPolicy, supervise

    run_dir = os.path.join(root, f"paired-{seed}")
    lifetimes = os.path.join(root, f"lifetimes-{seed}")
    child = [sys.executable, "-m", "reasonrl.cli", "train", "--no-supervisor", *train_args(run_dir, seed, steps)]
    settle()
    began = time.perf_counter()
    result = supervise([sys.executable, "-c", WRAPPER, lifetimes, *child], Path(run_dir), RestartPolicy())
    wall = time.perf_counter() - began
    assert result.returncode == 0, result
    child_s = sum(float(x) for x in Path(lifetimes).read_text().split())
    return (wall - child_s) / wall


def end_to_end(supervised: bool, seed: int, steps: int, root: str) -> float:
    run_dir = os.path.join(root, f"{'sup' if supervised else 'plain'}-{seed}")
    cmd = [sys.executable, "-m", "reasonrl.cli", "train", *([] if supervised else ["--no-supervisor"]), *train_args(run_dir, seed, steps)]
    settle()
    began = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    plain, sup, ratio, inside = [], [], [], []
    with tempfile.TemporaryDirectory() as root:
        for seed in range(args.seeds):
            order = (False, True) if seed % 2 == 0 else (True, False)
            times = {s: end_to_end(s, seed, args.steps, root) for s in order}
            plain.append(times[False])
            sup.append(times[True])
            ratio.append(times[True] / times[False] - 1)
            inside.append(paired(seed, args.steps, root))
    print(json.dumps({
        "bench": "supervisor_overhead",
        "steps": args.steps,
        "seeds": args.seeds,
        "paired_overhead_median": round(statistics.median(inside), 4),
        "paired_overhead_per_seed": [round(o, 4) for o in inside],
        "in_process_wall_s_median": round(statistics.median(plain), 2),
        "supervised_wall_s_median": round(statistics.median(sup), 2),
        "end_to_end_overhead_median": round(statistics.median(ratio), 4),
        "end_to_end_overhead_per_seed": [round(o, 4) for o in ratio],
    }))


if __name__ == "__main__":
    main()
