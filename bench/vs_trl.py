"""reasonrl vs TRL's GRPOTrainer: the same RL work, interleaved in one run, one JSON line out.

Both systems train reasonrl's embedded warm start (a ~1.6M-parameter Qwen2 with its
character-level tokenizer) on the embedded task's train split with the DAPO ``Answer:``
reward, with equal settings: prompts per step x samples per prompt, max new tokens,
temperature 1, learning rate (constant, no warmup), AdamW without weight decay, grad-norm
clip 1.0, the same precision (``--precision``), no gradient checkpointing, no KL (beta 0), clip range 0.2, group-normalised
advantages, token-mean loss (reasonrl ``algo.loss_agg=token-mean`` = TRL ``loss_type="dapo"``),
no masking of truncated samples, the same optimizer steps per batch and epochs per batch,
and the same torch thread count. TRL runs at its best on CPU (see
``shared/notes/peer-benchmarks.md``): ``use_cpu``, no gradient checkpointing, no
continuous batching, no torch_compile.

``--precision fp32`` (the default) runs both in fp32. ``--precision bf16`` runs both in bf16
mixed precision: TRL with ``bf16=True`` (accelerate wraps the model's forward in bf16
autocast, so its generation and training passes; fp32 parameters and AdamW state), reasonrl
with ``train.precision=bf16-mixed`` (the same autocast in its training passes and rollouts, the
old log-probs recomputed). The evaluator is the same fp32 one for both. ``--device cuda`` runs both on the GPU instead (TRL
without ``use_cpu``; reasonrl with ``run.device=cuda``, so its CUDA-graph rollouts), still
in the chosen precision; step times are then taken after a device synchronisation.

Each system runs in its own worker process; the driver alternates them in blocks of
``--block`` steps (ABBA order: the one that goes first changes every block), so both see the
same machine noise, and repeats over ``--seeds``. A paused worker waits on a pipe and uses no
CPU. Held-out accuracy is measured for both by the same code: reasonrl's evaluation over a
rollout worker on the warm start (``reasonrl.evaluation.Evaluator``: ``eval.n_prompts`` held-out prompts x ``eval.k``
samples at temperature 1), into which the policy being measured is copied with
``load_state_dict``; at step s both systems are evaluated with the same sampling seed.

Figures (medians over all measured steps of all seeds):

- ``*_completions_per_s``: prompts x samples / wall seconds of one training step (generate,
  reward, log-probs, update). reasonrl: ``Controller.step()``. TRL: ``on_step_begin`` to
  ``on_step_end`` of its training loop (its best case; ``trl_cycle_*`` adds the loop's
  logging and batch fetching between steps).
- ``*_time_to_target_s``: training wall seconds (step times summed; set-up and evaluation
  excluded) until held-out ``val/acc`` first reaches the warm start's ``val/acc`` +
  ``--target-gain``, evaluated every ``--eval-every`` steps; null when not reached.
- ``other_cpu_s``: CPU seconds that processes other than this benchmark used during the run
  (``/proc/stat`` busy time minus this process's and its workers' CPU time).

TRL is not a dependency of reasonrl: it is installed in its own venv (see bench/README.md);
run this script with that venv's python (it re-executes itself with ``--python`` when the
current one lacks trl).

    /tmp/venv-trl/bin/python bench/vs_trl.py --quick
    /tmp/venv-trl/bin/python bench/vs_trl.py --steps 40 --seeds 0,1 --eval-every 5
"""

from __future__ import annotations

import argparse
import json
import os
import select
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from machine_load import busy_jiffies

ROOT = Path(__file__).resolve().parent.parent
RECIPE = ROOT / "recipes" / "grpo.yaml"
DEFAULT_TRL_PYTHON = "/tmp/venv-trl/bin/python"


# --------------------------------------------------------------------------- helpers
def log(*parts) -> None:
    print(*parts, file=sys.stderr, flush=True)


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def rnd(x, digits=3):
    return None if x is None else round(x, digits)


def sync(spec: dict) -> None:
    """Wait for the GPU's queued work, so that a wall-clock time covers it."""
    if spec["device"] == "cuda":
        import torch

        torch.cuda.synchronize()


def eval_overrides(spec: dict) -> list[str]:
    """The evaluator's config: identical for both systems (only model weights differ)."""
    return [
        f"model.path={spec['warm_dir']}",
        f"run.dir={spec['tmp']}/eval-{spec['system']}-{spec['seed']}",
        f"run.seed={spec['seed']}",
        f"run.threads={spec['threads']}",
        f"run.device={spec['device']}",
        "run.deterministic=false",
        "run.progress=false",
        f"rollout.max_new_tokens={spec['max_new_tokens']}",
        "algo.kl_loss_coef=0",
        f"eval.n_prompts={spec['eval_prompts']}",
        f"eval.k={spec['eval_k']}",
        "eval.temperature=1.0",
        "eval.greedy=false",
    ]


def reasonrl_overrides(spec: dict) -> list[str]:
    batch = spec["prompts"] * spec["n"]
    mini = batch // spec["updates_per_batch"]
    return [
        f"model.path={spec['warm_dir']}",
        f"run.dir={spec['tmp']}/reasonrl-{spec['seed']}",
        f"run.seed={spec['seed']}",
        "checkpoint.every_steps=0",  # TRL saves nothing mid-run here either: only the final checkpoint
        "checkpoint.every_minutes=0",
        f"run.threads={spec['threads']}",
        f"run.device={spec['device']}",
        "run.progress=false",
        f"run.deterministic={'true' if spec['deterministic'] else 'false'}",
        f"rollout.n={spec['n']}",
        "rollout.temperature=1.0",
        "rollout.top_p=1.0",
        "rollout.top_k=0",
        f"rollout.max_new_tokens={spec['max_new_tokens']}",
        "algo.adv_estimator=grpo",
        "algo.eps_low=0.2",
        "algo.eps_high=0.2",
        "algo.loss_agg=token-mean",
        "algo.kl_loss_coef=0",
        "algo.entropy_coef=0",
        "algo.overlong_filter=false",
        "algo.overlong_buffer=0",
        "algo.dynamic_sampling=false",
        f"train.total_steps={spec['steps']}",
        f"train.prompts_per_step={spec['prompts']}",
        f"train.ppo_epochs={spec['epochs']}",
        f"train.mini_batch_size={mini}",
        f"train.micro_batch_size={mini}",
        f"train.micro_batch_tokens={spec['micro_batch_tokens']}",
        f"train.skip_zero_advantage={'true' if spec['skip_zero_advantage'] else 'false'}",
        f"train.lr={spec['lr']}",
        "train.warmup_steps=0",
        "train.weight_decay=0.0",
        "train.grad_clip=1.0",
        f"train.precision={'bf16-mixed' if spec['precision'] == 'bf16' else 'fp32'}",
    ]


# --------------------------------------------------------------------------- workers
class Channel:
    """Commands in on stdin, JSON replies out on the process's original stdout; everything
    else the libraries print goes to stderr."""

    def __init__(self) -> None:
        self.out = os.fdopen(os.dup(1), "w", buffering=1)
        os.dup2(2, 1)
        sys.stdout = sys.stderr

    def send(self, obj: dict) -> None:
        self.out.write(json.dumps(obj) + "\n")
        self.out.flush()

    def receive(self) -> tuple[str, int]:
        line = sys.stdin.readline()
        if not line:
            return "quit", 0
        cmd, _, arg = line.strip().partition(" ")
        return cmd, int(arg or 0)


class Evaluator:
    """reasonrl's evaluation (``reasonrl.evaluation.Evaluator``, as ``reasonrl train`` validates)
    of the measured policy's weights, loaded into a rollout worker of its own."""

    def __init__(self, spec: dict) -> None:
        from reasonrl.config import load
        from reasonrl.models.loading import load_tokenizer, model_context
        from reasonrl.warmstart import resolve_model_dir
        from reasonrl.data.splits import load_splits, tokenize_prompts
        from reasonrl.evaluation import Evaluator as HeldOut
        from reasonrl.workers import RewardWorker, RolloutWorker

        cfg = load(str(RECIPE), eval_overrides(spec))
        model_dir = resolve_model_dir(cfg, log)
        _, test = load_splits(cfg)
        tokens = tokenize_prompts(test, load_tokenizer(model_dir), cfg, model_context(model_dir), cfg.data.source, held_out=True)
        test, ids = tokens.prompts, tokens.ids
        self.rollout = RolloutWorker(cfg, model_dir)
        self.held_out = HeldOut(cfg, self.rollout, RewardWorker(cfg, model_dir), test, ids)

    def __call__(self, model, step: int) -> dict:
        from reasonrl.types import WeightsUpdate

        start = time.perf_counter()
        self.rollout.load_weights(WeightsUpdate(step, {k: v.detach() for k, v in model.named_parameters()}))
        out = self.held_out.run(step)  # seeded with run.seed and the step
        return {"step": step, "val_acc": out["val/acc"], "eval_s": time.perf_counter() - start}


def worker_reasonrl(spec: dict) -> None:
    ch = Channel()
    setup = time.perf_counter()
    evaluate = Evaluator(spec)
    from reasonrl.config import load
    from reasonrl.controller import Controller

    trainer = Controller.from_config(load(str(RECIPE), reasonrl_overrides(spec)), log=log)
    [policy] = trainer.policy.workers
    eval0 = evaluate(policy.module, 0)
    import torch

    checks = {"torch_threads": torch.get_num_threads(), "deterministic": torch.are_deterministic_algorithms_enabled(),
              "model_dtype": str(next(policy.module.parameters()).dtype), "rollout_backend": trainer.cfg.rollout.backend,
              "mini_batch_size": trainer.cfg.train.mini_batch_size, "micro_batch_size": trainer.cfg.train.micro_batch_size,
              "micro_batch_tokens": trainer.cfg.train.micro_batch_tokens,
              "skip_zero_advantage": trainer.cfg.train.skip_zero_advantage, "precision": trainer.cfg.train.precision}
    ch.send({"ready": True, "setup_s": time.perf_counter() - setup, "eval0": eval0, "checks": checks})
    step = 0
    while True:
        cmd, k = ch.receive()
        if cmd == "eval":  # the driver stopped early (wall budget): evaluate where training stands
            ch.send({"steps": [], "evals": [evaluate(policy.module, step)]})
            continue
        if cmd != "run":
            return
        steps, evals = [], []
        for _ in range(k):
            sync(spec)
            start = time.perf_counter()
            m = trainer.step()
            sync(spec)
            wall = time.perf_counter() - start
            step += 1
            steps.append(
                {
                    "step": step,
                    "time_s": wall,
                    "gen_s": m.get("timing_s/gen", 0.0),
                    "reward_s": m.get("timing_s/reward", 0.0),
                    "old_log_prob_s": m.get("timing_s/old_log_prob", 0.0),
                    "adv_s": m.get("timing_s/adv", 0.0),
                    "update_actor_s": m.get("timing_s/update_actor", 0.0),
                    "loss": m.get("actor/pg_loss"),
                    "grad_norm": m.get("actor/grad_norm"),
                    "train_acc": m.get("train/acc"),
                    "response_len": m.get("response_length/mean"),
                }
            )
            if step % spec["eval_every"] == 0 or step == spec["steps"]:
                evals.append(evaluate(policy.module, step))
        ch.send({"steps": steps, "evals": evals})


def worker_trl(spec: dict) -> None:
    ch = Channel()
    setup = time.perf_counter()
    import torch

    torch.set_num_threads(spec["threads"])
    import datasets
    import transformers
    import trl
    from transformers import TrainerCallback

    from reasonrl.config import load
    from reasonrl.data.splits import load_splits
    from reasonrl.models.loading import load_model, load_tokenizer
    from reasonrl.reward.math import dapo_score

    transformers.logging.set_verbosity_warning()
    datasets.disable_progress_bars()
    evaluate = Evaluator(spec)
    torch.set_num_threads(spec["threads"])

    warm = spec["warm_dir"]
    tokenizer = load_tokenizer(warm)  # passed explicitly: AutoTokenizer would swap in Qwen2Tokenizer
    model = load_model(warm, "float32", "cpu")
    train, _ = load_splits(load(str(RECIPE), eval_overrides(spec)))
    dataset = datasets.Dataset.from_dict({"prompt": [p.text for p in train], "ground_truth": [p.ground_truth for p in train]})

    timers = {"gen": 0.0, "reward": 0.0}

    def dapo_reward(prompts, completions, ground_truth, **kwargs):
        start = time.perf_counter()
        out = [dapo_score(c, gt)["score"] for c, gt in zip(completions, ground_truth)]
        timers["reward"] += time.perf_counter() - start
        return out

    generate = model.generate

    def timed_generate(*args, **kwargs):
        start = time.perf_counter()
        try:
            return generate(*args, **kwargs)
        finally:
            timers["gen"] += time.perf_counter() - start

    model.generate = timed_generate

    batch = spec["prompts"] * spec["n"]
    U, E = spec["updates_per_batch"], spec["epochs"]
    per_rl_step = U * E  # TRL optimizer steps per generation batch
    args = trl.GRPOConfig(
        output_dir=f"{spec['tmp']}/trl-{spec['seed']}",
        seed=spec["seed"],
        data_seed=spec["seed"],
        use_cpu=spec["device"] == "cpu",
        bf16=spec["precision"] == "bf16",
        fp16=False,
        gradient_checkpointing=False,
        torch_compile=False,
        use_transformers_continuous_batching=False,
        learning_rate=spec["lr"],
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        max_grad_norm=1.0,
        per_device_train_batch_size=batch // U,
        gradient_accumulation_steps=1,
        steps_per_generation=U,
        num_iterations=E,
        num_generations=spec["n"],
        max_completion_length=spec["max_new_tokens"],
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        beta=0.0,
        epsilon=0.2,
        loss_type="dapo",
        scale_rewards="group",
        mask_truncated_completions=False,
        max_steps=spec["steps"] * per_rl_step,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        log_completions=False,
        dataloader_num_workers=0,
        shuffle_dataset=True,
    )

    class Pacer(TrainerCallback):
        """Times each RL step, evaluates, and hands the machine back to the driver between blocks."""

        def __init__(self) -> None:
            self.rl_step = 0
            self.opt_in_step = 0
            self.budget = 0
            self.steps, self.evals = [], []
            self.pending = None
            self.last_end = 0.0  # end of the previous step, for the cycle time
            self.excluded = 0.0  # paused or evaluating since then
            self.losses = {}

        def wait(self, control) -> None:
            start = time.perf_counter()
            cmd, k = ch.receive()
            while cmd == "eval":  # the driver stopped early (wall budget): evaluate where training stands
                ch.send({"steps": [], "evals": [evaluate(trainer.model, self.rl_step)]})
                cmd, k = ch.receive()
            if cmd != "run":
                control.should_training_stop = True
            self.budget = k
            self.excluded += time.perf_counter() - start

        def on_train_begin(self, a, state, control, **kw):
            checks = {
                "torch_threads": torch.get_num_threads(),
                "gradient_checkpointing": bool(a.gradient_checkpointing),
                "bf16": bool(a.bf16),
                "use_cpu": bool(a.use_cpu),
                "torch_compile": bool(a.torch_compile),
                "continuous_batching": bool(a.use_transformers_continuous_batching),
                "optim": str(getattr(a.optim, "value", a.optim)),
                "lr_scheduler": str(getattr(a.lr_scheduler_type, "value", a.lr_scheduler_type)),
                "loss_type": a.loss_type,
                "beta": a.beta,
                "per_device_train_batch_size": a.per_device_train_batch_size,
                "generation_batch_size": a.generation_batch_size,
                "steps_per_generation": a.steps_per_generation,
                "num_iterations": a.num_iterations,
                "model_dtype": str(next(trainer.model.parameters()).dtype),
            }
            ch.send({"ready": True, "setup_s": time.perf_counter() - setup, "eval0": eval0, "checks": checks})
            self.last_end = time.perf_counter()
            self.wait(control)

        def on_step_begin(self, a, state, control, **kw):
            if self.opt_in_step == 0:
                timers["gen"] = timers["reward"] = 0.0
                sync(spec)
                self.begin = time.perf_counter()

        def on_step_end(self, a, state, control, **kw):
            self.opt_in_step += 1
            if self.opt_in_step < per_rl_step:
                return
            sync(spec)
            end = time.perf_counter()
            self.opt_in_step = 0
            self.rl_step += 1
            self.pending = {
                "step": self.rl_step,
                "time_s": end - self.begin,
                "cycle_s": end - self.last_end - self.excluded,
                "gen_s": timers["gen"],
                "reward_s": timers["reward"],
                "opt_steps": [state.global_step - i for i in range(per_rl_step)][::-1],
            }
            self.last_end, self.excluded = end, 0.0

        def on_log(self, a, state, control, logs=None, **kw):
            logs = logs or {}
            if "loss" in logs:
                self.losses[state.global_step] = (logs.get("loss"), logs.get("grad_norm"), logs.get("reward"), logs.get("completions/mean_length"))
            if self.pending is None or state.global_step != self.pending["opt_steps"][-1]:
                return
            start = time.perf_counter()
            rec = self.pending
            logged = [self.losses.get(s, (None,) * 4) for s in rec.pop("opt_steps")]
            rec["loss"] = median([x[0] for x in logged])
            rec["grad_norm"] = median([x[1] for x in logged])
            rec["losses"] = [x[0] for x in logged]
            rec["train_reward"] = logged[0][2]
            rec["response_len"] = logged[0][3]
            self.steps.append(rec)
            self.pending = None
            if self.rl_step % spec["eval_every"] == 0 or self.rl_step == spec["steps"]:
                self.evals.append(evaluate(trainer.model, self.rl_step))
            self.budget -= 1
            self.excluded += time.perf_counter() - start
            if self.budget <= 0:
                ch.send({"steps": self.steps, "evals": self.evals})
                self.steps, self.evals = [], []
                self.wait(control)

    trainer = trl.GRPOTrainer(
        model=model,
        reward_funcs=dapo_reward,
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[Pacer()],
    )
    torch.set_num_threads(spec["threads"])
    eval0 = evaluate(trainer.model, 0)
    trainer.train()
    # the driver sends "quit" after the last block; drain anything else
    while ch.receive()[0] == "run":
        ch.send({"steps": [], "evals": []})


# --------------------------------------------------------------------------- driver
class Worker:
    def __init__(self, system: str, spec: dict, python: str) -> None:
        self.system = system
        spec = {**spec, "system": system}
        cmd = [python, str(Path(__file__).resolve()), "--worker-spec", json.dumps(spec)]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1, cwd=str(ROOT))
        self.steps, self.evals = [], []

    def read(self, timeout: float = 900.0) -> dict:
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if ready else ""
        if not line:
            self.proc.kill()
            raise RuntimeError(f"{self.system} worker died or hung (exit code {self.proc.poll()}); see stderr")
        return json.loads(line)

    def run(self, k: int) -> dict:
        self.proc.stdin.write(f"run {k}\n")
        self.proc.stdin.flush()
        reply = self.read()
        self.steps += reply["steps"]
        self.evals += reply["evals"]
        return reply

    def evaluate_now(self) -> None:
        self.proc.stdin.write("eval\n")
        self.proc.stdin.flush()
        self.evals += self.read()["evals"]

    def close(self) -> None:
        try:
            self.proc.stdin.write("quit\n")
            self.proc.stdin.flush()
            self.proc.stdin.close()
        except (BrokenPipeError, OSError):
            pass
        try:
            self.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def time_to_target(steps: list[dict], evals: list[dict], target: float) -> float | None:
    """Summed step seconds up to the first evaluation at or above target."""
    by_step = {s["step"]: s["time_s"] for s in steps}
    for e in sorted(evals, key=lambda e: e["step"]):
        if e["val_acc"] >= target:
            return sum(t for s, t in by_step.items() if s <= e["step"])
    return None


def run_seed(seed: int, base: dict, python: str, order_flip: bool, deadline: float | None) -> dict:
    spec = {**base, "seed": seed}
    workers = {}
    for system in ("reasonrl", "trl"):  # set up one at a time: no contention while loading
        w = Worker(system, spec, python)
        w.ready = w.read()
        log(f"[seed {seed}] {system} ready in {w.ready['setup_s']:.1f}s, step-0 val/acc {w.ready['eval0']['val_acc']:.4f}")
        workers[system] = w
    target = workers["reasonrl"].ready["eval0"]["val_acc"] + base["target_gain"]
    done, block, pairs = 0, 0, []
    try:
        last_pair = 0.0
        while done < base["steps"]:
            # stop (after equal steps) when the next block pair would end past the deadline
            if deadline is not None and done and time.time() + last_pair > deadline:
                log(f"[seed {seed}] wall budget spent: stopping both systems after {done} steps")
                for w in workers.values():
                    if not w.evals or w.evals[-1]["step"] != done:
                        w.evaluate_now()
                break
            pair_start = time.time()
            k = min(base["block"], base["steps"] - done)
            order = ["reasonrl", "trl"] if (block + order_flip) % 2 == 0 else ["trl", "reasonrl"]
            med = {}
            for system in order:
                reply = workers[system].run(k)
                med[system] = median([s["time_s"] for s in reply["steps"]])
                ev = {e["step"]: round(e["val_acc"], 3) for e in reply["evals"]}
                log(f"[seed {seed}] {system:8s} steps {done + 1}-{done + k}: median step {med[system]:.3f}s  evals {ev}")
            pairs.append(med["trl"] / med["reasonrl"])
            last_pair = time.time() - pair_start
            done += k
            block += 1
    finally:
        for w in workers.values():
            w.close()
    out = {"seed": seed, "target": target, "block_speedups": pairs, "steps_done": done}
    for system, w in workers.items():
        out[system] = {
            "setup_s": w.ready["setup_s"],
            "checks": w.ready.get("checks", {}),
            "eval0": w.ready["eval0"]["val_acc"],
            "steps": w.steps,
            "evals": w.evals,
            "time_to_target_s": time_to_target(w.steps, w.evals, target),
            "train_s": sum(s["time_s"] for s in w.steps),
        }
    return out


def versions(python: str) -> dict:
    code = (
        "import json,sys,torch,transformers,trl,accelerate,datasets;"
        "print(json.dumps({'python':sys.version.split()[0],'torch':torch.__version__,'transformers':transformers.__version__,"
        "'trl':trl.__version__,'accelerate':accelerate.__version__,'datasets':datasets.__version__}))"
    )
    out = json.loads(subprocess.run([python, "-c", code], capture_output=True, text=True, check=True).stdout)
    try:
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True).stdout.strip()
        out["reasonrl"] = head + ("-dirty" if dirty else "")
    except OSError:
        out["reasonrl"] = "unknown"
    return out


def summarise(results: list[dict], base: dict, other_cpu_s: float, wall_s: float, vers: dict) -> dict:
    batch = base["prompts"] * base["n"]

    def pooled(system, key):
        return [s[key] for r in results for s in r[system]["steps"] if s.get(key) is not None]

    rr_step = median(pooled("reasonrl", "time_s"))
    trl_step = median(pooled("trl", "time_s"))
    trl_cycle = median(pooled("trl", "cycle_s"))
    rr_cps, trl_cps = batch / rr_step, batch / trl_step
    tt = {s: [r[s]["time_to_target_s"] for r in results] for s in ("reasonrl", "trl")}
    per_seed_ratio = [t / r for r, t in zip(tt["reasonrl"], tt["trl"]) if r and t]
    # where TRL never reached the target, its whole training time is a lower bound
    lower = [r2["trl"]["train_s"] / r for r2, r in zip(results, tt["reasonrl"]) if r and r2["trl"]["time_to_target_s"] is None]
    upper = [r2["trl"]["time_to_target_s"] / r2["reasonrl"]["train_s"] for r2 in results
             if r2["trl"]["time_to_target_s"] and r2["reasonrl"]["time_to_target_s"] is None]
    trl_losses = [l for r in results for s in r["trl"]["steps"] for l in s["losses"] if l is not None]
    trl_gn = pooled("trl", "grad_norm")
    out = {
        "bench": "vs_trl",
        "reasonrl_completions_per_s": rnd(rr_cps, 1),
        "trl_completions_per_s": rnd(trl_cps, 1),
        "speedup_completions_per_s": rnd(rr_cps / trl_cps, 2),
        "speedup_paired_blocks_median": rnd(median([p for r in results for p in r["block_speedups"]]), 2),
        "reasonrl_step_s": rnd(rr_step),
        "trl_step_s": rnd(trl_step),
        "trl_cycle_s": rnd(trl_cycle),
        "target_val_acc": rnd(median([r["target"] for r in results]), 4),
        "eval0_val_acc": {s: [rnd(r[s]["eval0"], 4) for r in results] for s in ("reasonrl", "trl")},
        "reasonrl_time_to_target_s": [rnd(t, 2) for t in tt["reasonrl"]],
        "trl_time_to_target_s": [rnd(t, 2) for t in tt["trl"]],
        "reasonrl_time_to_target_median_s": rnd(median(tt["reasonrl"]), 2),
        "trl_time_to_target_median_s": rnd(median(tt["trl"]), 2),
        "time_to_target_ratio_trl_over_reasonrl": rnd(median(per_seed_ratio), 2),
        "time_to_target_ratio_lower_bounds": [rnd(x, 2) for x in lower],
        "time_to_target_ratio_upper_bounds": [rnd(x, 2) for x in upper],
        "steps_done": [r["steps_done"] for r in results],
        "final_val_acc": {
            s: [rnd(max(r[s]["evals"], key=lambda e: e["step"])["val_acc"], 4) if r[s]["evals"] else None for r in results]
            for s in ("reasonrl", "trl")
        },
        "val_acc_curves": {
            s: [[[e["step"], rnd(e["val_acc"], 4)] for e in r[s]["evals"]] for r in results] for s in ("reasonrl", "trl")
        },
        "reasonrl_breakdown_s": {
            k: rnd(median(pooled("reasonrl", k + "_s")), 4) for k in ("gen", "reward", "old_log_prob", "adv", "update_actor")
        },
        "trl_breakdown_s": {
            "gen": rnd(median(pooled("trl", "gen_s")), 4),
            "reward": rnd(median(pooled("trl", "reward_s")), 4),
            "rest": rnd(median([s["time_s"] - s["gen_s"] - s["reward_s"] for r in results for s in r["trl"]["steps"]]), 4),
        },
        "response_len_median": {s: rnd(median(pooled(s, "response_len")), 2) for s in ("reasonrl", "trl")},
        "trl_loss_nonzero_frac": rnd(sum(1 for l in trl_losses if l != 0) / max(len(trl_losses), 1), 3),
        "trl_grad_norm_median": rnd(median(trl_gn), 4),
        "reasonrl_grad_norm_median": rnd(median(pooled("reasonrl", "grad_norm")), 4),
        "setup_s": {s: [rnd(r[s]["setup_s"], 1) for r in results] for s in ("reasonrl", "trl")},
        "checks": {s: results[0][s]["checks"] for s in ("reasonrl", "trl")},
        "other_cpu_s": rnd(max(other_cpu_s, 0.0), 1),
        "wall_s": rnd(wall_s, 1),
        "other_cpu_cores_avg": rnd(max(other_cpu_s, 0.0) / wall_s, 2),
        "settings": {
            k: base[k]
            for k in ("precision", "steps", "max_wall_s", "seeds", "threads", "device", "block", "prompts", "n", "max_new_tokens", "lr", "updates_per_batch", "epochs",
                      "eval_every", "eval_prompts", "eval_k", "target_gain", "deterministic", "micro_batch_tokens", "skip_zero_advantage")
        }
        | {
            "temperature": 1.0,
            "loss": "token-mean (reasonrl) / dapo (TRL)",
            "clip_eps": 0.2,
            "kl": 0.0,
            "adv": "grpo group-normalised",
            "dtype": "float32 parameters" + (", bf16 mixed-precision products" if base["precision"] == "bf16" else ""),
            "grad_clip": 1.0,
            "lr_schedule": "constant",
            "micro_batch": batch // base["updates_per_batch"],
            "mask_truncated": False,
            "trl_generation": "transformers generate (no continuous batching, no torch_compile, no vLLM)",
            "warm_start": base["warm_dir"],
        },
        "versions": vers,
    }
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=40, help="RL steps per system per seed")
    p.add_argument("--seeds", default="0,1", help="comma-separated seeds")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where both systems run")
    p.add_argument("--precision", choices=("fp32", "bf16"), default="fp32",
                   help="both in fp32, or both in bf16 mixed precision (TRL bf16=True, reasonrl train.precision=bf16-mixed)")
    p.add_argument("--block", type=int, default=5, help="steps per interleaved block")
    p.add_argument("--prompts", type=int, default=16, help="prompts per step")
    p.add_argument("--n", type=int, default=8, help="samples per prompt")
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--lr", type=float, default=2e-4)
    p.add_argument("--updates-per-batch", type=int, default=1, help="optimizer steps per generation batch (both systems)")
    p.add_argument("--epochs", type=int, default=1, help="passes over each batch (reasonrl ppo_epochs = TRL num_iterations)")
    p.add_argument("--micro-batch-tokens", type=int, default=2048,
                   help="reasonrl's token budget per forward/backward (length-sorted micro-batches; same gradient); 0: one micro-batch per mini-batch, as TRL")
    p.add_argument("--skip-zero-advantage", type=int, choices=(0, 1), default=1,
                   help="reasonrl skips rows whose advantages are all zero (their gradient is exactly zero); 0: run them, as TRL")
    p.add_argument("--eval-every", type=int, default=5)
    p.add_argument("--eval-prompts", type=int, default=128)
    p.add_argument("--eval-k", type=int, default=4)
    p.add_argument("--target-gain", type=float, default=0.10, help="target = step-0 val/acc + this")
    p.add_argument("--reasonrl-deterministic", type=int, choices=(0, 1), default=1,
                   help="reasonrl run.deterministic (its default 1; TRL does not enable deterministic algorithms)")
    p.add_argument("--max-wall-s", type=float, default=None,
                   help="wall budget: both systems stop (after equal steps) at the first block boundary past it")
    p.add_argument("--quick", action="store_true",
                   help="one seed, up to 30 steps, evaluation on 64 prompts, a 150 s wall budget (about 3 minutes in all)")
    p.add_argument("--python", default=DEFAULT_TRL_PYTHON, help="python of the venv with trl (used when this one lacks it)")
    p.add_argument("--worker-spec", help=argparse.SUPPRESS)
    a = p.parse_args()

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    if a.worker_spec:
        spec = json.loads(a.worker_spec)
        {"reasonrl": worker_reasonrl, "trl": worker_trl}[spec["system"]](spec)
        return

    try:
        import trl  # noqa: F401

        python = sys.executable
    except ImportError:
        if not Path(a.python).exists():
            sys.exit(f"trl is not importable here and {a.python} does not exist: set up the TRL venv (bench/README.md)")
        log(f"trl not importable in {sys.executable}; using {a.python}")
        python = a.python

    if a.quick:
        a.steps, a.seeds, a.eval_prompts, a.block, a.eval_every = 30, "0", 64, 5, 5
        a.max_wall_s = a.max_wall_s or 150.0
    seeds = [int(s) for s in a.seeds.split(",") if s.strip()]
    os.environ["OMP_NUM_THREADS"] = str(a.threads)

    jiffies, own0 = busy_jiffies(), os.times()
    start = time.time()
    from reasonrl.config import load
    from reasonrl.warmstart.sft import ensure_warm_start

    cfg = load(str(RECIPE))
    warm_dir = str(ensure_warm_start(cfg.sft, cfg.data.families, log))  # once, before the workers start
    tmp = tempfile.mkdtemp(prefix="vs_trl-")
    base = {
        "precision": a.precision, "steps": a.steps, "seeds": seeds, "threads": a.threads, "device": a.device, "block": a.block, "prompts": a.prompts, "n": a.n,
        "max_new_tokens": a.max_new_tokens, "lr": a.lr, "updates_per_batch": a.updates_per_batch, "epochs": a.epochs,
        "eval_every": a.eval_every, "eval_prompts": a.eval_prompts, "eval_k": a.eval_k, "target_gain": a.target_gain,
        "warm_dir": warm_dir, "tmp": tmp, "max_wall_s": a.max_wall_s,
        "deterministic": bool(a.reasonrl_deterministic),
        "micro_batch_tokens": a.micro_batch_tokens, "skip_zero_advantage": bool(a.skip_zero_advantage),
    }
    if (a.prompts * a.n) % a.updates_per_batch:
        sys.exit("--updates-per-batch must divide prompts x n")
    try:
        results = []
        for i, seed in enumerate(seeds):
            # an even share of what is left of the wall budget for each remaining seed
            deadline = None if a.max_wall_s is None else time.time() + (start + a.max_wall_s - time.time()) / (len(seeds) - i)
            results.append(run_seed(seed, base, python, order_flip=bool(i % 2), deadline=deadline))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    own1 = os.times()
    own_cpu = sum(own1[:4]) - sum(own0[:4])  # this process and its waited-for workers
    other = (busy_jiffies() - jiffies) / os.sysconf("SC_CLK_TCK") - own_cpu
    print(json.dumps(summarise(results, base, other, time.time() - start, versions(python))), flush=True)


if __name__ == "__main__":
    main()
