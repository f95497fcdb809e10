"""A soak of the DAPO demo recipe under six restart faults: ETTR, MTTR, steps lost, against the
fault-free run.

Two supervised ``reasonrl train dapo`` runs of the same config on fresh run directories: the
clean one, then the same with six faults that each end in a restart (a crash, SIGKILL in the
update and in generation, a hang, SIGKILL in the middle of a checkpoint write, a second
crash). The recipe keeps its own checkpoint interval (``checkpoint.every_steps=10``); validation
is off. One JSON line: the faulty run's ``ettr``, ``mttr_s``, ``steps_lost`` and
``time_lost_s`` (``summary.json``, :mod:`reasonrl.resilience.ettr`), each recovery, both runs'
wall seconds, and ``weights_equal``: whether the final checkpoint's policy weights equal the
clean run's bit for bit. Per recovery: ``detect_to_resume_s`` (the failure seen to the restarted
trainer's ``resume`` event: the back-off, the process start or the standby's go, the reload)
and ``resume_to_step_s`` (to its first new step: the rollout worker's start, the step).

Where a fresh trainer process's start goes (``cold_start``, a fresh process on the clean run's
config, one step: what a restart costs with ``resilience.trainer_template=false``, and what the
template spends once): ``python_s`` (the interpreter up), ``import_s`` (reasonrl's controller and build
modules: torch, transformers; then the workers' zygote forked), ``build_s`` (the Controller: warm start cache, tokenizer, data,
the model and optimizer), ``resume_s`` (to the ``resume`` event), ``rollout_start_s`` (to
``rollout_started``: the rollout worker process) and ``first_step_s`` (its ``timing_s/step``).
``snapshot_ms``: the median time of one in-memory snapshot of the clean run's final state
(``torch.save`` into memory, its CRC-32, the copy into ``/dev/shm``), beside the clean run's median
step.

    python bench/soak.py                              # 40 steps, the six faults below
    python bench/soak.py --base /tmp/old              # and first the same soak of an older checkout
    python bench/soak.py resilience.snapshot_every=0  # extra overrides for every run
    python bench/soak.py resilience.standby=false     # restarts forked from the trainer template
    python bench/soak.py resilience.standby=false resilience.trainer_template=false  # fresh processes
"""

from __future__ import annotations

import argparse
import json
import os
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
    every fault; a 5 s hang timeout (the recipe's longest stage takes about 1 s on 2 cores), the
    drill's 0.5 s back-off, and the standby trainer on (``resilience.standby=false`` as an
    extra override measures restarts without it: the module docstring)."""
    return [
        f"train.total_steps={steps}",
        "eval.every_steps=0",
        "run.progress=false",
        "resilience.max_restarts=10",
        "resilience.hang_timeout_s=5",
        "resilience.backoff_s=0.5",
        "resilience.standby=true",
    ]


def train(run_dir: Path, args: list[str], code: str | None) -> float:
    """A supervised ``reasonrl train dapo`` of the checkout at ``code`` (None: this one), its
    stdout to our stderr; its wall seconds."""
    env = None if code is None else {**os.environ, "PYTHONPATH": code}
    began = time.perf_counter()
    subprocess.run([sys.executable, "-m", "reasonrl.cli", "train", "dapo", f"run.dir={run_dir}", *args],
                   check=True, stdout=sys.stderr, env=env, cwd=code)
    return time.perf_counter() - began


def soak(root: Path, args: list[str], steps: int, code: str | None) -> dict:
    """The clean run and the faulty one under ``root``; the faulty run's figures."""
    clean, faulty = root / "clean", root / "faulty"
    clean_s = train(clean, args, code)
    faulty_s = train(faulty, [*args, f"faults=[{','.join(FAULTS)}]"], code)
    summary = json.loads((faulty / "summary.json").read_text())
    step_s = sorted(r["timing_s/step"] for r in read_jsonl(clean / "metrics.jsonl") if "timing_s/step" in r)
    return {
        "ettr": round(summary["ettr"], 4),
        "mttr_s": round(summary["mttr_s"], 2),
        "steps_lost": summary["steps_lost"],
        "time_lost_s": round(summary["time_lost_s"], 2),
        "productive_s": round(summary["productive_s"], 2),
        "weights_equal": _same_weights(faulty, clean, steps),
        "recoveries": recoveries(read_jsonl(faulty / "events.jsonl")),
        "clean_wall_s": round(clean_s, 1),
        "faulty_wall_s": round(faulty_s, 1),
        "clean_step_s_median": round(step_s[len(step_s) // 2], 3),
    }


COLD = r"""
import json, sys, time
began = float(sys.argv[1])
up = time.time()
import reasonrl.build, reasonrl.controller
from reasonrl.config import load
from reasonrl.runtime.process import start_worker_processes
start_worker_processes(("reasonrl.build",))  # as a trainer does: the workers' zygote
imported = time.time()
controller = reasonrl.controller.Controller.from_config(load(sys.argv[2], sys.argv[3:]))
built = time.time()
controller.run()
print(json.dumps({"began": began, "up": up, "imported": imported, "built": built}))
"""


def cold_start(run_dir: Path, args: list[str]) -> dict:
    """Where a cold start's time goes (the module docstring), from one fresh process."""
    from reasonrl.cli import RECIPES

    out = subprocess.run([sys.executable, "-c", COLD, repr(time.time()), str(RECIPES / "dapo.yaml"),
                          f"run.dir={run_dir}", *args, "train.total_steps=1"],
                         check=True, stdout=subprocess.PIPE, text=True).stdout
    t = json.loads(out.strip().splitlines()[-1])
    events = {e["kind"]: e["time"] for e in read_jsonl(run_dir / "events.jsonl")}
    step = read_jsonl(run_dir / "metrics.jsonl")[-1]["timing_s/step"]
    return {"python_s": round(t["up"] - t["began"], 2), "import_s": round(t["imported"] - t["up"], 2),
            "build_s": round(t["built"] - t["imported"], 2), "resume_s": round(events["resume"] - t["built"], 2),
            "rollout_start_s": round(events["rollout_started"] - events["resume"], 2), "first_step_s": round(step, 2)}


def snapshot_ms(clean: Path, steps: int, repeats: int = 10) -> float:
    """Median milliseconds of one snapshot of the clean run's final checkpoint (its registry)."""
    import statistics

    from reasonrl.checkpoint import load_checkpoint
    from reasonrl.checkpoint.snapshot import SnapshotStore
    from reasonrl.resilience.rundir import snapshot_root

    _, tensors, state = load_checkpoint(clean / f"checkpoints/step_{steps}")
    with tempfile.TemporaryDirectory(dir=snapshot_root()) as where:
        store, times = SnapshotStore(Path(where)), []
        for _ in range(repeats):
            began = time.perf_counter()
            store.save(steps, tensors, state, {"time": 0.0})
            times.append(time.perf_counter() - began)
    return 1000 * statistics.median(times)


def recoveries(events: list[dict]) -> list[dict]:
    """Each recovery: its failure, steps, the split of its time (the module docstring), warm or cold."""
    out, failure = [], None
    for i, e in enumerate(events):
        if e["kind"] in ("crash", "killed", "hang") and failure is None:
            failure = e
        if e["kind"] == "recovered" and failure is not None:
            resume = next(r for r in reversed(events[:i]) if r["kind"] == "resume")
            seen = failure["time"]
            out.append({"failure": failure["kind"], "at_step": failure["step"], "from_step": e["from_step"],
                        "steps_lost": e["steps_lost"], "detect_s": round(failure.get("detect_s", 0.0), 2),
                        "recover_s": round(e["recover_s"], 2), "detect_to_resume_s": round(resume["time"] - seen, 2),
                        "resume_to_step_s": round(e["time"] - resume["time"], 2), "warm": e.get("warm", False)})
            failure = None
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--root", default=None, help="where the run directories go (default: a temporary one)")
    parser.add_argument("--base", default=None, metavar="PATH",
                        help="also soak the checkout at PATH (an older commit: its code trains), first; "
                             "'base' holds its figures and 'clean_equal' whether both clean runs end alike")
    parser.add_argument("extra", nargs="*", help="key=value overrides for every run")
    args = parser.parse_args()
    base = [*overrides(args.steps), *args.extra]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.root or tmp).resolve()
        older = soak(root / "base", base, args.steps, str(Path(args.base).resolve())) if args.base else None
        figures = soak(root / "ours", base, args.steps, None)
        out = {"bench": "soak", "steps": args.steps, "faults": list(FAULTS), "overrides": base, **figures,
               "snapshot_ms": round(snapshot_ms(root / "ours" / "clean", args.steps), 1),
               "cold_start": cold_start(root / "cold", base)}
        if older is not None:
            out["base"] = older
            out["clean_equal"] = _same_weights(root / "base" / "clean", root / "ours" / "clean", args.steps)
        print(json.dumps(out))


if __name__ == "__main__":
    main()
