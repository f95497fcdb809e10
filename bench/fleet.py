"""The rollout fleet: 1 and 2 rollout workers in sync and async, its cost against older code, and 1 to 64 workers
by simulation; one JSON line.

Two measurements on the DAPO recipe (the embedded task and warm start, 16 prompts x 8
samples a step), each run ``reasonrl train`` in a fresh process for ``--steps`` steps, the
first ``--warmup`` left out, configurations interleaved over ``--seeds`` (for seed: for
configuration: run) so that all see the same machine; medians over seeds, and ratios:

1. **Fleet size** (``runtime.roles.rollout.count`` 1 and 2) in ``sync`` (on a CPU the workers
   are processes with weights of their own, ``runtime.roles.rollout.colocate=auto``, the
   controller's cores divided among them) and
   in ``async1`` (``rollout.mode=async rollout.max_staleness=1 algo.off_policy=tis``, the
   trainer and each rollout worker process at half the cores). Per run: trained samples/s
   (rows of a step over its median step time, as ``bench/scale.py``), the trainer's idle
   share (``timing_s/trainer_idle`` over ``timing_s/step``), the rollout side's idle share
   (``timing_s/rollout_idle`` over it plus ``timing_s/rollout_gen`` and ``timing_s/reward``,
   as ``bench/async.py``) and the workers' busy share (``rollout/worker<i>/busy_s`` over
   workers x step time). ``ratio_2_over_1`` is the median over seeds of the per-seed ratio
   of samples/s.
2. **Overhead against older code** (only with ``--base PATH``, a checkout of it): the
   1-worker ``sync`` and ``async1`` configurations with this checkout and with the one at
   PATH (for seed: for code in (base, fleet): for configuration), each run with its own
   code on ``PYTHONPATH`` and its own keys (the older code names the rollout threads
   ``rollout.threads``). ``fleet_over_base`` is the median over seeds of the paired
   ratio of samples/s (under 1: the fleet is slower).

3. **Delta weight sync** (only with ``--delta``, which runs this section alone):
   ``weight_sync/delta_frac`` of bf16-mixed training on the Qwen2.5-0.5B shape (hidden 896,
   14 query and 2 key/value heads, MLP 4864, vocabulary 151,936, tied embeddings, random
   weights of seed ``--delta-seed``; ``--delta-layers`` of its 24 layers, each of the full
   layer's shape). Per learning rate of ``--delta-lrs`` (``recipe``: the DAPO recipe's
   ``train.lr``), a fresh model with fp32 parameters and the recipe's AdamW trains
   ``--delta-steps`` real DAPO updates (:func:`~reasonrl.trainer.update.update_policy` under
   bf16 autocast, the recipe's loss and its two optimizer steps per update: mini-batches of
   half the rows) on one synthetic batch per step (4 prompts x 4 samples, 16 prompt and 32
   response tokens, random tokens, random 0/1 scores, GRPO advantages); after each, the
   :class:`~reasonrl.rollout.weight_sync.WeightSender` makes the version's bf16 copy and
   the delta a worker holding the version before it is sent, which a receiver applies (its
   checksum checked). Per step: ``delta_frac`` (the delta's bytes over the bf16 version's),
   ``changed_frac`` (bf16 elements that changed), the seconds of the update, of the copy
   and encoding, and of applying.

The machine is named in the output: its CPU model, torch's CPU capability (the ISA its
kernels use) and the vector flags; ``other_cpu_cores_avg`` is the CPU the rest of the
machine used meanwhile, in cores (a figure taken with it well above 0 on a small machine is
a contention figure). Both code versions share the warm start's cache entry when their
settings hash the same; it is built once, before any timed run.

    python bench/fleet.py [--seeds 0,1,2] [--steps 8] [--warmup 2] [--base /path/to/older/checkout]
    python bench/fleet.py --delta [--delta-layers 24] [--delta-steps 3] [--delta-lrs recipe,1e-6]

4. **The fleet at scale, simulated** (``--simulate``, :mod:`bench.fleet_sim`): ``--workers``
   1 to 64 at ``--staleness`` 0 to 4 over the latency-model backend (``rollout.backend=sim``)
   and a trainer whose update takes ``--update-s`` modelled seconds, per seed a fault-free
   run and one with the scripted faults (``--deaths-per-min``, ``--hangs-per-min``,
   ``--slow K:F``, ``--leaves-per-min``); the JSON line (``"simulated": true``) has ``ettr``,
   ``ledger_ok``, the trainer's idle share and seconds a step against the fault-free run's
   (``idle_vs_fault_free``), the throughput against the ideal for that count, the staleness
   distribution, groups moved, seconds lost and join times, in modelled seconds.

    python bench/fleet.py --simulate [--workers 64] [--staleness 1] [--seeds 0,1,2] [--steps 20] [--deaths-per-min 1]

``--record-workload RUN_DIR`` writes the sim backend's recorded workload
(``reasonrl/rollout/sim_workload.json``) from a finished run with kept samples.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.fleet_sim import add_sim_arguments, record_workload, simulate  # noqa: E402
from bench.machine_load import busy_jiffies  # noqa: E402
from reasonrl.metrics import read_jsonl  # noqa: E402
from reasonrl.rollout.sim import WORKLOAD  # noqa: E402
from reasonrl.runtime import available_cores  # noqa: E402

ROWS_PER_STEP = 16 * 8
"""The recipe's 16 prompts x 8 samples: the rows each step trains."""

VECTOR_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile", "amx_bf16")


def log(*parts) -> None:
    print(*parts, file=sys.stderr, flush=True)


def machine() -> dict:
    """The CPU model, torch's CPU capability and the vector flags of /proc/cpuinfo."""
    import torch

    model, flags = platform.processor() or platform.machine(), set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name":
                    model = value.strip()
                elif key.strip() == "flags":
                    flags = set(value.split())
                    break
    except OSError:
        pass
    return {"cpu": model, "isa": torch.backends.cpu.get_cpu_capability(),
            "vector_flags": [f for f in VECTOR_FLAGS if f in flags], "cores": available_cores(),
            "torch": torch.__version__}


def configs(workers: int, cores: int, threads_key: str) -> dict[str, list[str]]:
    """``sync`` and ``async1`` with ``workers`` rollout workers; ``threads_key`` names the
    rollout workers' thread count in the code being run."""
    half = max(1, cores // 2)
    count = [] if workers == 1 else [f"runtime.roles.rollout.count={workers}"]
    return {
        f"sync,w{workers}": ["rollout.mode=sync", f"run.threads={cores}", *count],
        f"async1,w{workers}": ["rollout.mode=async", "rollout.max_staleness=1", "algo.off_policy=tis",
                               f"run.threads={half}", f"{threads_key}={max(1, cores - half)}", *count],
    }


def run_one(code: Path, code_name: str, name: str, extra: list[str], seed: int, args, tmp: Path) -> dict:
    """One training run with the code at ``code``: its step figures after the warm-up."""
    run_dir = tmp / f"{code_name}-{name.replace(',', '-')}-s{seed}"
    shutil.rmtree(run_dir, ignore_errors=True)
    overrides = [f"run.dir={run_dir}", f"run.seed={seed}", f"train.total_steps={args.steps}", "eval.every_steps=0",
                 "checkpoint.every_steps=0", "checkpoint.every_minutes=0", "run.progress=false", "run.loggers=[]", *extra]
    began = time.time()
    out = subprocess.run([sys.executable, "-m", "reasonrl.cli", "train", "dapo", "--no-supervisor", *overrides],
                         cwd=code, capture_output=True, text=True, timeout=args.timeout,
                         env={**os.environ, "PYTHONPATH": str(code)})
    result = {"code": code_name, "config": name, "seed": seed, "run_wall_s": round(time.time() - began, 1)}
    if out.returncode != 0:
        return {**result, "error": out.stderr.strip().splitlines()[-3:]}
    rows = [r for r in read_jsonl(run_dir / "metrics.jsonl") if "timing_s/step" in r and r.get("step", 0) > args.warmup]
    total = lambda key: sum(r.get(key, 0.0) for r in rows)  # noqa: E731
    step_s = statistics.median(r["timing_s/step"] for r in rows)
    busy_keys = sorted({k for r in rows for k in r if k.startswith("rollout/worker") and k.endswith("/busy_s")})
    rollout_total = total("timing_s/rollout_idle") + total("timing_s/rollout_gen") + total("timing_s/reward")
    result.update({
        "steps_measured": len(rows),
        "step_s": round(step_s, 4),
        "samples_per_s": round(ROWS_PER_STEP / step_s, 2),
        "trainer_idle_frac": round(total("timing_s/trainer_idle") / total("timing_s/step"), 4),
        "rollout_idle_frac": round(total("timing_s/rollout_idle") / rollout_total, 4) if rollout_total else None,
        "gen_s": round(statistics.median(r.get("timing_s/rollout_gen", r.get("timing_s/gen", 0.0)) for r in rows), 4),
        "update_s": round(statistics.median(r.get("timing_s/update_actor", 0.0) for r in rows), 4),
        "weight_sync_s": round(statistics.median(r.get("timing_s/weight_sync", 0.0) for r in rows), 4),
    })
    if busy_keys:
        result["workers_busy_frac"] = round(sum(total(k) for k in busy_keys) / (len(busy_keys) * total("timing_s/step")), 4)
    return result


def timed(plan: list[tuple[Path, str, str, list[str], int]], args, tmp: Path) -> tuple[list[dict], float]:
    """Every (code, code name, configuration, overrides, seed) of ``plan`` in order; the runs
    and the cores the rest of the machine used meanwhile, on average."""
    ours = lambda: sum(os.times()[2:4])  # noqa: E731  (the finished children's CPU seconds)
    began, jiffies, own = time.time(), busy_jiffies(), ours()
    runs = []
    for code, code_name, name, extra, seed in plan:
        runs.append(run_one(code, code_name, name, extra, seed, args, tmp))
        log(json.dumps(runs[-1]))
    wall = time.time() - began
    other = (busy_jiffies() - jiffies) / os.sysconf("SC_CLK_TCK") - (ours() - own)
    return runs, round(max(0.0, other) / wall, 2)


def commit(code: Path) -> str:
    """The checkout's short commit, ``+dirty`` when tracked files differ from it."""
    git = lambda *a: subprocess.run(["git", *a], cwd=code, capture_output=True, text=True).stdout.strip()  # noqa: E731
    return git("rev-parse", "--short", "HEAD") + ("+dirty" if git("status", "--porcelain", "--untracked-files=no") else "")


def by_config(runs: list[dict], code: str) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for r in runs:
        if r["code"] == code and "error" not in r:
            out.setdefault(r["config"], []).append(r)
    return out


def medians(rs: list[dict]) -> dict:
    keys = ("samples_per_s", "step_s", "trainer_idle_frac", "rollout_idle_frac", "workers_busy_frac", "gen_s",
            "update_s", "weight_sync_s")
    return {k: round(statistics.median(r[k] for r in rs), 4) for k in keys if all(r.get(k) is not None for r in rs)}


def paired(a: list[dict], b: list[dict]) -> float | None:
    """Median over seeds of ``a``'s samples/s over ``b``'s, same seed."""
    of_b = {r["seed"]: r["samples_per_s"] for r in b}
    ratios = [r["samples_per_s"] / of_b[r["seed"]] for r in a if r["seed"] in of_b]
    return round(statistics.median(ratios), 3) if ratios else None


def delta_sync(args) -> dict:
    """Section 3 (``--delta``): ``weight_sync/delta_frac`` per update of bf16-mixed training on
    the Qwen2.5-0.5B shape (see the module docstring)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from bench.memory import QWEN25_05B
    from reasonrl import algo
    from reasonrl.config import load
    from reasonrl.precision import compute_context
    from reasonrl.rollout.weight_sync import WeightSender, apply_delta, weights_bytes
    from reasonrl.trainer.update import update_policy
    from reasonrl.types import Prompt, RolloutBatch, ScoredBatch, TrainBatch, WeightsDelta, WeightsUpdate

    torch.set_num_threads(args.cores)
    prompts, n, prompt_len, response_len = 4, 4, 16, 32
    rows = prompts * n
    cfg = load(ROOT / "recipes" / "dapo.yaml", ["train.precision=bf16-mixed", f"train.mini_batch_size={rows // 2}",
                                                f"train.micro_batch_size={rows // 2}", "train.micro_batch_tokens=0"])
    shape = {**QWEN25_05B, "num_hidden_layers": args.delta_layers, "max_position_embeddings": 4096}
    lrs = [cfg.train.lr if x == "recipe" else float(x) for x in args.delta_lrs.split(",")]

    def batch(step: int) -> TrainBatch:
        g = torch.Generator().manual_seed(1000 * args.delta_seed + step)
        vocab = shape["vocab_size"]
        mask = torch.ones(rows, response_len)
        rollout = RolloutBatch(torch.randint(2, vocab, (rows, prompt_len), generator=g), torch.ones(rows, prompt_len, dtype=torch.long),
                               torch.randint(2, vocab, (rows, response_len), generator=g), mask, torch.zeros(rows, response_len),
                               torch.zeros(rows, dtype=torch.bool), torch.ones(rows, dtype=torch.bool),
                               torch.arange(prompts).repeat_interleave(n), torch.full((rows, response_len), step - 1))
        scores = torch.randint(0, 2, (rows,), generator=g).float()
        scored = ScoredBatch(rollout, [Prompt(str(i), "", "") for i in range(rows)], [""] * rows, scores, scores.bool(),
                             torch.zeros(rows, dtype=torch.bool))
        return TrainBatch(scored, mask, None, algo.grpo(scores, rollout.group_ids)[:, None] * mask)

    results = []
    for lr in lrs:
        torch.manual_seed(args.delta_seed)
        model = Qwen2ForCausalLM(Qwen2Config(**shape, pad_token_id=0, eos_token_id=1, bos_token_id=1))
        params = sum(p.numel() for p in model.parameters())
        optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=cfg.train.weight_decay)
        sender = WeightSender(torch.bfloat16)
        held = sender.version(WeightsUpdate(0, {k: p.detach() for k, p in model.named_parameters()}))
        sender.held("worker", held)
        steps = []
        for step in range(1, args.delta_steps + 1):
            began = time.perf_counter()
            with compute_context("bf16-mixed", "cpu"):
                update_policy(model, optimizer, batch(step), cfg.algo, cfg.train, 1.0, response_len, step - 1)
            updated = time.perf_counter()
            version = sender.version(WeightsUpdate(step, {k: p.detach() for k, p in model.named_parameters()}))
            delta = sender.message("worker", version)
            encoded = time.perf_counter()
            assert isinstance(delta, WeightsDelta), "the worker holds the version before: it is sent a delta"
            made = apply_delta(held, delta)  # raises unless the result's checksum is the version's
            applied = time.perf_counter()
            changed = sum(int((held.tensors[k].view(torch.int16) != t.view(torch.int16)).sum()) for k, t in version.tensors.items())
            steps.append({"step": step, "delta_frac": round(weights_bytes(delta) / weights_bytes(version), 5),
                          "changed_frac": round(changed / params, 5), "delta_mb": round(weights_bytes(delta) / 2**20, 2),
                          "update_s": round(updated - began, 2), "copy_encode_s": round(encoded - updated, 3),
                          "apply_s": round(applied - encoded, 3)})
            log(json.dumps({"lr": lr, **steps[-1]}))
            held = made
            sender.held("worker", held)
        results.append({"lr": lr, "lr_is_recipe": lr == cfg.train.lr, "steps": steps,
                        "delta_frac_last": steps[-1]["delta_frac"],
                        "delta_frac_median": round(statistics.median(s["delta_frac"] for s in steps), 5)})
        del model, optimizer, sender, held
    return {"shape": "Qwen2.5-0.5B" + ("" if args.delta_layers == 24 else f" with {args.delta_layers} of its 24 layers"),
            "layers": args.delta_layers, "parameters": params, "version_mb_bf16": round(2 * params / 2**20, 1),
            "precision": "bf16-mixed", "recipe": "dapo", "recipe_lr": cfg.train.lr,
            "batch": {"prompts": prompts, "samples": n, "prompt_tokens": prompt_len, "response_tokens": response_len,
                      "optimizer_steps_per_update": 2},
            "seed": args.delta_seed, "threads": args.cores, "by_lr": results}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--simulate", action="store_true",
                        help="the fleet at --workers workers by simulation (bench/fleet_sim.py; the options under 'simulation')")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--steps", type=int, default=None, help="training steps a run (default 8; simulated: 20)")
    parser.add_argument("--warmup", type=int, default=2, help="first steps left out of the figures")
    parser.add_argument("--base", default=None, help="a checkout of older code to compare the 1-worker configurations with")
    parser.add_argument("--base-threads-key", default="rollout.threads",
                        help="the older code's key for the rollout workers' torch threads")
    parser.add_argument("--cores", type=int, default=available_cores())
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--delta", action="store_true", help="measure delta weight sync only (section 3)")
    parser.add_argument("--delta-layers", type=int, default=24, help="decoder layers of the 0.5B shape (of 24)")
    parser.add_argument("--delta-steps", type=int, default=3, help="updates per learning rate")
    parser.add_argument("--delta-lrs", default="recipe,1e-6", help="learning rates; 'recipe': the DAPO recipe's")
    parser.add_argument("--delta-seed", type=int, default=0)
    add_sim_arguments(parser.add_argument_group("simulation (--simulate; times in modelled seconds)"))
    parser.add_argument("--record-workload", metavar="RUN_DIR", default=None,
                        help="write the sim backend's workload (reasonrl/rollout/sim_workload.json) from a finished run")
    parser.add_argument("--record-command", default="", help="with --record-workload: the command that made the run")
    args = parser.parse_args()
    if args.delta:
        out = {"bench": "fleet", "section": "delta_sync", "machine": machine(), "commit": commit(ROOT)}  # the code that runs
        print(json.dumps({**out, "delta_sync": delta_sync(args)}))
        return
    seeds = [int(s) for s in args.seeds.split(",")]
    if args.record_workload:
        workload = record_workload(Path(args.record_workload), args.record_command, commit(ROOT))
        WORKLOAD.write_text(json.dumps(workload, indent=1) + "\n")
        print(json.dumps(workload))
        return
    if args.simulate:
        print(json.dumps(simulate(args, seeds, machine(), commit(ROOT))))
        return
    args.steps = args.steps or 8
    out: dict = {"bench": "fleet", "machine": machine(), "steps": args.steps, "warmup": args.warmup, "seeds": seeds}
    out["commit"] = commit(ROOT)
    for code in [ROOT] + ([Path(args.base).resolve()] if args.base else []):  # each code's warm start, before any timed run
        subprocess.run([sys.executable, "-m", "reasonrl.cli", "sft"], cwd=code, check=True, capture_output=True,
                       timeout=args.timeout, env={**os.environ, "PYTHONPATH": str(code)})
    with tempfile.TemporaryDirectory() as tmp:
        fleet = {**configs(1, args.cores, "runtime.roles.rollout.threads"),
                 **configs(2, args.cores, "runtime.roles.rollout.threads")}
        runs, other = timed([(ROOT, "fleet", name, extra, seed) for seed in seeds for name, extra in fleet.items()],
                            args, Path(tmp))
        got = by_config(runs, "fleet")
        summary = {name: medians(rs) for name, rs in got.items()}
        for mode in ("sync", "async1"):
            if f"{mode},w1" in got and f"{mode},w2" in got:
                summary[f"{mode},w2"]["ratio_2_over_1"] = paired(got[f"{mode},w2"], got[f"{mode},w1"])
        if "sync,w1" in got and "async1,w1" in got:
            summary["async1,w1"]["ratio_over_sync"] = paired(got["async1,w1"], got["sync,w1"])
        out["fleet"] = {"summary": summary, "other_cpu_cores_avg": other, "runs": runs}
        if args.base:
            base = Path(args.base).resolve()
            out["base"] = {"path": str(base), "commit": commit(base)}
            codes = {"base": (base, configs(1, args.cores, args.base_threads_key)),
                     "fleet": (ROOT, configs(1, args.cores, "runtime.roles.rollout.threads"))}
            plan = [(path, code, name, extra, seed) for seed in seeds for code, (path, cfgs) in codes.items()
                    for name, extra in cfgs.items()]
            runs, other = timed(plan, args, Path(tmp))
            b, f = by_config(runs, "base"), by_config(runs, "fleet")
            out["overhead"] = {
                name: {"base": medians(b[name]), "fleet": medians(f[name]), "fleet_over_base": paired(f[name], b[name])}
                for name in codes["fleet"][1] if name in b and name in f}
            out["overhead"]["other_cpu_cores_avg"] = other
            out["overhead"]["runs"] = runs
    print(json.dumps(out))


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
