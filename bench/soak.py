"""A soak of the DAPO demo recipe under six restart faults: ETTR, MTTR, steps lost, against the
fault-free run.

Two supervised ``reasonrl train dapo`` runs of the same config on fresh run directories: the
clean one, then the same with six faults that each end in a restart (a crash, SIGKILL in the
update and in generation, a hang, SIGKILL in the middle of a checkpoint write, a second
crash). The recipe keeps its own checkpoint interval (``checkpoint.every_steps=10``); validation
is off. One JSON line: the faulty run's ``ettr``, ``mttr_s``, ``steps_lost`` and
``time_lost_s`` (``summary.json``, :mod:`reasonrl.resilience.ettr`), each recovery, both runs'
wall seconds, and ``weights_equal``: whether the final checkpoint's policy weights equal the
clean run's bit for bit.

    python bench/soak.py                      # 40 steps, the six faults below
    python bench/soak.py --steps 40 resilience.snapshot_every=0   # extra overrides for both runs
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from reasonrl.metrics import read_jsonl
from reasonrl.resilience.drill import _same_weights

FAULTS = (
    "crash@5",
    "sigkill@13:stage=update_actor",
    "sigkill@18:stage=gen",
    "hang@24:stage=gen",
    "ckpt_kill@30",
    "crash@36",
)
"""Six restart faults over 40 steps, none on a step the recipe checkpoints (every 10) except
``ckpt_kill``, which must be."""


def overrides(steps: int) -> list[str]:
    """The demo recipe as shipped, for ``steps`` steps with no validation; restarts enough for
    every fault; a 5 s hang timeout (the recipe's longest stage takes about 1 s on 2 cores) and
    the drill's 0.5 s back-off."""
    return [
        f"train.total_steps={steps}",
        "eval.every_steps=0",
        "run.progress=false",
        "resilience.max_restarts=10",
        "resilience.hang_timeout_s=5",
        "resilience.backoff_s=0.5",
    ]


def train(run_dir: Path, args: list[str]) -> float:
    """A supervised ``reasonrl train dapo`` (its stdout to our stderr); its wall seconds."""
    began = time.perf_counter()
    subprocess.run([sys.executable, "-m", "reasonrl.cli", "train", "dapo", f"run.dir={run_dir}", *args],
                   check=True, stdout=sys.stderr)
    return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--root", default=None, help="where the two run directories go (default: a temporary one)")
    parser.add_argument("extra", nargs="*", help="key=value overrides for both runs")
    args = parser.parse_args()
    base = [*overrides(args.steps), *args.extra]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.root or tmp)
        clean, faulty = root / "clean", root / "faulty"
        clean_s = train(clean, base)
        faulty_s = train(faulty, [*base, f"faults=[{','.join(FAULTS)}]"])
        summary = json.loads((faulty / "summary.json").read_text())
        events = read_jsonl(faulty / "events.jsonl")
        recoveries = [{k: e.get(k) for k in ("step", "from_step", "steps_lost", "recover_s")}
                      for e in events if e["kind"] == "recovered"]
        failures = [{"kind": e["kind"], "step": e["step"], "detect_s": e.get("detect_s")}
                    for e in events if e["kind"] in ("crash", "killed", "hang")]
        print(json.dumps({
            "bench": "soak",
            "steps": args.steps,
            "faults": list(FAULTS),
            "overrides": base,
            "ettr": round(summary["ettr"], 4),
            "mttr_s": round(summary["mttr_s"], 2),
            "steps_lost": summary["steps_lost"],
            "time_lost_s": round(summary["time_lost_s"], 2),
            "productive_s": round(summary["productive_s"], 2),
            "weights_equal": _same_weights(faulty, clean, args.steps),
            "failures": failures,
            "recoveries": recoveries,
            "clean_wall_s": round(clean_s, 1),
            "faulty_wall_s": round(faulty_s, 1),
        }))


if __name__ == "__main__":
    main()
