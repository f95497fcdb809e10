"""``reasonrl drill``: rehearse every fault kind on the embedded demo and tabulate the outcome.

One clean supervised run, then one supervised run per fault of the standard plan, each
on its own run directory with the same config. For every fault the table says whether
it was detected (its incident event is in events.jsonl), how many seconds detection and
recovery took, how many steps were redone, whether the final weights are bit-identical
to the clean run's, and the run's ETTR (:mod:`reasonrl.resilience.ettr`: productive step time
over productive plus lost time).

Faults that end in a restart from a checkpoint (crash, SIGKILL, hang, kill during a
checkpoint write) must give bit-identical weights, and so must a checkpoint that meets a full
disk (training goes on untouched). Faults handled inside the process change the training on
purpose (a skipped NaN update, failed reward samples, work moved off a slow worker), so their
weights are expected to differ.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from reasonrl.config import Config, load
from reasonrl.metrics import read_jsonl
from reasonrl.resilience.supervisor import train_supervised


@dataclass(frozen=True)
class Drill:
    fault: str
    """The fault spec injected."""
    incident: str
    """The events.jsonl kind that shows it was detected."""
    restarts: bool
    """Recovered by a restart from the last checkpoint."""
    equal: bool
    """The final weights must match the clean run's bit for bit."""
    extra: tuple[str, ...] = ()
    """Overrides this drill needs."""


def standard_plan(steps: int) -> list[Drill]:
    """One fault of each kind, at about a third of the run, on a checkpoint step where it matters."""
    s = max(4, steps // 3) // 4 * 4
    return [
        Drill(f"crash@{s + 1}", "crash", True, True),
        Drill(f"sigkill@{s + 1}:stage=update_actor", "killed", True, True),
        Drill(f"hang@{s + 1}:stage=gen", "hang", True, True),
        Drill(f"ckpt_kill@{s}", "killed", True, True),
        Drill(f"disk_full@{s}", "checkpoint_failed", False, True),
        Drill(f"nan@{s + 1}", "nonfinite", False, False),
        Drill(f"slow@{s}:worker=1:factor=3:steps={steps}", "slowdown", False, False, ("runtime.roles.rollout.count=2",)),
        Drill(f"reward_timeout@{s + 1}:count=4", "reward_failed", False, False,
              ("runtime.roles.reward.count=1", "runtime.roles.reward.timeout_s=2")),
        Drill(f"reward_error@{s + 1}:count=4", "reward_failed", False, False),
        # Two trainer ranks sum their gradients in another order than the clean single rank.
        Drill(f"slow_rank@{s}:rank=1:factor=3:steps={steps}", "straggler", False, False, ("runtime.trainer_ranks=2",)),
        Drill(f"hang_rank@{s + 1}:rank=1", "hang", True, False, ("runtime.trainer_ranks=2", "runtime.collective_timeout_s=4")),
    ]


def drill_overrides(steps: int) -> list[str]:
    """The demo recipe made drill-sized: no validation, a checkpoint every 4 steps, a 10 s hang
    timeout (the demo's longest stage takes about 1 s on 2 cores)."""
    return [
        f"train.total_steps={steps}",
        "eval.every_steps=0",
        "checkpoint.every_steps=4",
        "checkpoint.every_minutes=0",
        "resilience.hang_timeout_s=10",
        "resilience.backoff_s=0.5",
        "run.progress=false",
    ]


def run_one(recipe: Path, overrides: list[str], run_dir: Path) -> dict:
    cfg = load(recipe, [*overrides, f"run.dir={run_dir}"])
    command = [sys.executable, "-m", "reasonrl.cli", "train", "--no-supervisor", str(recipe), *overrides, f"run.dir={run_dir}"]
    code = train_supervised(cfg, command)
    return {"returncode": code, "summary": json.loads((run_dir / "summary.json").read_text())}


def outcome(drill: Drill, run_dir: Path, clean_dir: Path, steps: int) -> dict:
    """One table row from a drill's events.jsonl and checkpoints."""
    events = read_jsonl(run_dir / "events.jsonl")
    injected = next((e for e in events if e["kind"] == "fault_injected"), None)
    after = [e for e in events if injected is not None and e["time"] >= injected["time"]]
    incident = next((e for e in after if e["kind"] == drill.incident), None)
    detected = injected is not None and incident is not None
    row = {"fault": drill.fault, "detected": detected, "detect_s": None, "recover_s": None, "steps_lost": 0}
    if detected:
        row["detect_s"] = incident.get("detect_s", max(0.0, incident["time"] - injected["time"]))
        if drill.restarts:
            recovered = next((e for e in events if e["kind"] == "recovered"), None)
            row["recover_s"] = recovered["recover_s"] if recovered else None
            row["steps_lost"] = recovered["steps_lost"] if recovered else None
        else:
            row["recover_s"] = 0.0  # handled in the step it happened: skipped, failed sample, work moved, next checkpoint
    row["weights_equal"] = _same_weights(run_dir, clean_dir, steps)
    row["expected_equal"] = drill.equal
    return row


def _same_weights(a: Path, b: Path, steps: int) -> bool:
    from safetensors.torch import load_file

    import torch

    pa, pb = a / f"checkpoints/step_{steps}/policy.safetensors", b / f"checkpoints/step_{steps}/policy.safetensors"
    if not (pa.is_file() and pb.is_file()):
        return False
    x, y = load_file(pa), load_file(pb)
    return x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)


def format_table(rows: list[dict], ettr: float) -> str:
    head = "| fault | detected | detect s | recover s | steps lost | weights = clean | expected | ETTR |"
    lines = [head, "|" + "---|" * 8]
    for r in rows:
        f = lambda v: "-" if v is None else f"{v:.2f}" if isinstance(v, float) else str(v)
        lines.append(
            f"| {r['fault']} | {'yes' if r['detected'] else 'NO'} | {f(r['detect_s'])} | {f(r['recover_s'])} | "
            f"{f(r['steps_lost'])} | {'yes' if r['weights_equal'] else 'no'} | {'yes' if r['expected_equal'] else 'no'} | {r['ettr']:.3f} |"
        )
    lines.append(f"\nETTR over the whole drill (all runs, productive / (productive + lost) step time): {ettr:.3f}")
    return "\n".join(lines)


def run_drill(cfg_overrides: list[str], root: Path, steps: int, recipe: Path) -> tuple[list[dict], float]:
    """Run the clean run and every drill of the standard plan under ``root``; return (rows, ETTR)."""
    from reasonrl.warmstart.sft import ensure_warm_start

    base = [*drill_overrides(steps), *cfg_overrides]
    cfg: Config = load(recipe, base)
    if cfg.model.path == "embedded":
        ensure_warm_start(cfg.sft, cfg.data.families)  # once, before any timed run
    clean = root / "clean"
    results = [run_one(recipe, base, clean)]
    rows = []
    for drill in standard_plan(steps):
        run_dir = root / drill.fault.split("@")[0]
        began = time.time()
        result = run_one(recipe, [*base, *drill.extra, f"faults=[{drill.fault}]"], run_dir)
        results.append(result)
        row = outcome(drill, run_dir, clean, steps)
        row["ettr"] = result["summary"]["ettr"]
        row["wall_s"] = round(time.time() - began, 1)
        rows.append(row)
    productive = sum(r["summary"]["productive_s"] for r in results)
    lost = sum(r["summary"]["time_lost_s"] for r in results)
    return rows, productive / (productive + lost)
