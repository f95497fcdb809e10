"""Supervisor overhead on a clean run: `reasonrl train` supervised vs `--no-supervisor`.

Both variants run the same short training as a fresh command (so both pay the same start-up),
interleaved, over several seeds; prints one JSON line with the median wall times and the
median of the per-seed overhead (supervised / in-process - 1).

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


def run(supervised: bool, seed: int, steps: int, root: str) -> float:
    run_dir = os.path.join(root, f"{'sup' if supervised else 'plain'}-{seed}")
    cmd = [sys.executable, "-m", "reasonrl.cli", "train"]
    if not supervised:
        cmd.append("--no-supervisor")
    cmd += ["dapo", f"run.dir={run_dir}", f"run.seed={seed}", f"train.total_steps={steps}", "eval.every_steps=0", "run.progress=false"]
    began = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    plain, sup, overhead = [], [], []
    with tempfile.TemporaryDirectory() as root:
        for seed in range(args.seeds):
            order = (False, True) if seed % 2 == 0 else (True, False)
            times = {s: run(s, seed, args.steps, root) for s in order}
            plain.append(times[False])
            sup.append(times[True])
            overhead.append(times[True] / times[False] - 1)
    print(json.dumps({
        "bench": "supervisor_overhead",
        "steps": args.steps,
        "seeds": args.seeds,
        "in_process_wall_s_median": round(statistics.median(plain), 2),
        "supervised_wall_s_median": round(statistics.median(sup), 2),
        "overhead_median": round(statistics.median(overhead), 4),
        "overhead_per_seed": [round(o, 4) for o in overhead],
    }))


if __name__ == "__main__":
    main()
