"""A DAPO step alone and beside CPU-bound competitors, under each OpenMP wait policy: one JSON line out.

Each cell trains the DAPO demo recipe (``recipes/dapo.yaml``, the embedded warm start) for a few
steps as ``reasonrl train --no-supervisor``, with ``--competitors`` busy processes running beside
it (each a Python loop that never sleeps: a build, a test or another user's job on a shared
machine), under each of ``--policies``: ``auto``, reasonrl's choice (sleep when other work keeps half a
core busy as the run starts, else libgomp's default), ``passive`` (``OMP_WAIT_POLICY=PASSIVE``:
torch's OpenMP threads sleep at once at a barrier), ``spin``, libgomp's own default
(``GOMP_SPINCOUNT=300000``: they spin that many iterations first), and ``brief``
(``GOMP_SPINCOUNT=10000``). The cells of a repeat run in a rotated order, so each sees the same machine drift.
Reported: the median step time (``timing_s/step`` of steps 2..N: step 1 pays the first
weights sync) per policy and number of competitors, and its ratio to the same policy alone.
On C cores beside k single-threaded competitors a run's fair share of the machine is
C / (C + k) of it, so beside one competitor on 2 cores its step would take 1.5x, or 2x if
the scheduler splits the cores by process; the goal is at most 2.5x.

    python bench/contention.py                               # 0, 1, 2 competitors, 3 repeats
    python bench/contention.py --competitors 0,1 --repeats 1 --steps 4   # a quick look
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RECIPE = ROOT / "recipes" / "dapo.yaml"
BUSY = "while True:\n    pass\n"
POLICIES = {"auto": {}, "passive": {"OMP_WAIT_POLICY": "PASSIVE"}, "spin": {"GOMP_SPINCOUNT": "300000"},
            "brief": {"GOMP_SPINCOUNT": "10000"}}
"""The environment of each wait policy; ``auto`` sets neither variable, so the CLI chooses
(reasonrl/runtime/threads.py: openmp_waits)."""


def log(*parts) -> None:
    print(*parts, file=sys.stderr, flush=True)


def step_time(run_dir: Path, policy: str, competitors: int, steps: int, seed: int) -> float:
    """Median seconds per step of a short DAPO run beside ``competitors`` busy processes."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env.update(POLICIES[policy])
    busy = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(competitors)]
    try:
        cmd = [sys.executable, "-m", "reasonrl.cli", "train", str(RECIPE), "--no-supervisor", f"run.dir={run_dir}",
               f"run.seed={seed}", f"train.total_steps={steps}", "eval.every_steps=0", "run.progress=false",
               "checkpoint.every_steps=0"]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, cwd=ROOT, env=env)
    finally:
        for proc in busy:
            proc.kill()
            proc.wait(timeout=60)
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{out.stderr[-3000:]}")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return statistics.median(r["timing_s/step"] for r in rows if "timing_s/step" in r and r["step"] > 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--competitors", default="0,1,2")
    ap.add_argument("--policies", default="auto,spin,passive")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=8)
    args = ap.parse_args()
    competitors = [int(c) for c in args.competitors.split(",")]
    policies = args.policies.split(",")
    cells = [(p, c) for c in competitors for p in policies]
    times: dict[tuple[str, int], list[float]] = {cell: [] for cell in cells}
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            for i in range(len(cells)):
                policy, count = cells[(i + repeat) % len(cells)]
                run_dir = Path(tmp) / f"{policy}-{count}-{repeat}"
                times[(policy, count)].append(step_time(run_dir, policy, count, args.steps, seed=repeat))
                log(json.dumps({"policy": policy, "competitors": count, "repeat": repeat,
                                "step_s": round(times[(policy, count)][-1], 4)}))
    median = {cell: statistics.median(values) for cell, values in times.items()}
    print(json.dumps({
        "bench": "contention", "recipe": "recipes/dapo.yaml", "steps": args.steps, "repeats": args.repeats,
        "cores": len(os.sched_getaffinity(0)), "machine": platform.processor() or platform.machine(),
        "step_s": {p: {str(c): round(median[(p, c)], 4) for c in competitors} for p in policies},
        "vs_alone": {p: {str(c): round(median[(p, c)] / median[(p, competitors[0])], 2) for c in competitors}
                     for p in policies} if competitors[0] == 0 else None,
        "runs": {f"{p}/{c}": [round(t, 4) for t in times[(p, c)]] for p, c in cells},
    }))


if __name__ == "__main__":
    main()
