"""The trainer: builds the roles from a Config and runs ``step()`` in data-flow order.

    prompts -> rollout -> reward -> filter -> logprobs -> advantages -> update

One ``step()`` reads top to bottom: collect a batch (dynamic sampling keeps drawing
generation batches until the batch is full of groups with mixed outcomes), compute the
old/reference log-probs and critic values, the advantages, then update critic and policy.
``run()`` adds validation, metrics, checkpoints (resume) and the final export.
"""

from __future__ import annotations

import copy
import os
import signal
import sys
import time
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import torch

from reasonrl import algo
from reasonrl.checkpoint import (
    CheckpointWriteError,
    capture_rng,
    find_latest,
    list_checkpoints,
    load_checkpoint,
    restore_rng,
    save_checkpoint,
)
from reasonrl.config import Config, config_hash, dump
from reasonrl.data import tasks
from reasonrl.data.datasets import load_prompts, render_prompt
from reasonrl.data.model import load_model, load_tokenizer
from reasonrl.data.sampler import PromptSampler
from reasonrl.data.sft import ensure_warm_start
from reasonrl.faults import parse_faults
from reasonrl.guards import NonFiniteGuard, SlowdownDetector, SpikeDetector, StageWatchdog, params_finite
from reasonrl.metrics import EventLog, MetricsSink, read_jsonl, timed
from reasonrl.reward.pool import RewardPool
from reasonrl.rollout.fast import FastGenerator
from reasonrl.rollout.hf import HFGenerator
from reasonrl.rollout.scheduler import RolloutScheduler
from reasonrl.train.critic import Critic
from reasonrl.train.logprobs import compute_logprobs
from reasonrl.train.update import update_critic, update_policy
from reasonrl.types import Prompt, RolloutBatch, SamplingParams, ScoredBatch, TrainBatch

GROUP_ESTIMATORS = {"grpo": algo.grpo, "dr_grpo": algo.dr_grpo, "lite_ppo": algo.lite_ppo, "rloo": algo.rloo}


class ResumeError(RuntimeError):
    pass


def setup_torch(threads: int, deterministic: bool) -> None:
    """Torch threads: ``threads``, else the cores this process may run on."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    torch.set_num_threads(threads or max(1, cores or 2))
    torch.use_deterministic_algorithms(deterministic)


def model_dir(cfg: Config, log=print) -> Path:
    """The policy's model directory: the cached warm start for 'embedded', else model.path."""
    if cfg.model.path == "embedded":
        return ensure_warm_start(cfg.sft, cfg.data.families, log)
    return Path(cfg.model.path)


def load_splits(cfg: Config) -> tuple[list[Prompt], list[Prompt]]:
    """(train prompts, held-out prompts) for data.source."""
    d = cfg.data
    if d.source == "embedded":
        train = tasks.to_prompts(tasks.generate(d.families, d.train_size, d.seed, "train"), "train")
        test = tasks.to_prompts(tasks.generate(d.families, d.test_size, d.seed, "test"), "test")
        return train, test
    train = load_prompts(d.source, d.prompt_key, d.answer_key)
    if d.test_source:
        return train, load_prompts(d.test_source, d.prompt_key, d.answer_key)
    held = cfg.eval.n_prompts
    if len(train) <= held:
        raise ValueError(f"data.source: {d.source} has {len(train)} rows, too few to hold out eval.n_prompts={held}; give data.test_source")
    return train[held:], train[:held]


class Trainer:
    def __init__(self, cfg: Config, log=print) -> None:
        self.cfg = cfg
        self.log = log
        self.run_dir = Path(cfg.run.dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        setup_torch(cfg.run.threads, cfg.run.deterministic)
        torch.manual_seed(cfg.run.seed)
        self.events = EventLog(self.run_dir)
        self.model_dir = model_dir(cfg, log)
        device = cfg.run.device
        self.tokenizer = load_tokenizer(self.model_dir)
        self.pad_id, self.eos_id = self.tokenizer.pad_token_id, self.tokenizer.eos_token_id
        self.policy = load_model(self.model_dir, cfg.model.dtype, device)
        self.reference = self._frozen_copy(self.policy) if cfg.algo.kl_loss_coef > 0 else None
        self.critic = Critic(self.model_dir, cfg.model.dtype).to(device) if cfg.algo.adv_estimator == "gae" else None
        self.generator = self._generator()
        # Sampling with the trainer's own module in fp32: same weights, same numerics.
        shared = self.generator.samples_with_model and cfg.model.dtype == "float32"
        self.reuse_rollout_logprobs = cfg.train.old_logprobs == "rollout" or (cfg.train.old_logprobs == "auto" and shared)
        r = cfg.resilience
        self.rewards = RewardPool(cfg.reward.fn, r.reward_workers, r.reward_timeout_s, r.reward_max_failures)
        self.train_prompts, self.test_prompts = load_splits(cfg)
        self.train_ids = self._tokenize(self.train_prompts, cfg.data.source)
        self.test_ids = self._tokenize(self.test_prompts, cfg.data.test_source or cfg.data.source)
        self.sampler = PromptSampler(len(self.train_prompts), cfg.train.prompts_per_step, cfg.run.seed)
        t = cfg.train
        self.optimizer = torch.optim.AdamW(self.policy.parameters(), lr=t.lr, weight_decay=t.weight_decay)
        self.critic_optimizer = (
            torch.optim.AdamW(self.critic.parameters(), lr=t.critic_lr, weight_decay=t.weight_decay) if self.critic else None
        )
        self.rng = torch.Generator().manual_seed(cfg.run.seed)
        self.step_count = 0
        self.faults = parse_faults(list(cfg.faults)).bind(self.run_dir)
        self.nonfinite = NonFiniteGuard(r.nonfinite_max_consecutive, self.events)
        self.spikes = SpikeDetector(r.spike_window, r.spike_threshold, min_history=5, events=self.events)
        self.slow = SlowdownDetector(r.slow_window, r.slow_ratio, events=self.events)
        self.watchdog: StageWatchdog | None = None
        self.work_shares: dict[str, float] = {}

    # ---------------------------------------------------------------- one step
    def step(self) -> dict[str, float]:
        """One RL step; returns its metrics (verl names)."""
        cfg, t = self.cfg, defaultdict(float)
        step = self.step_count + 1
        with timed(t, "step"):
            scored, metrics = self.collect(t)
            rollout = scored.rollout
            loss_mask = rollout.response_mask
            if cfg.algo.overlong_filter:
                loss_mask = loss_mask * algo.overlong_filter_mask(rollout.truncated)[:, None]
            if self.reuse_rollout_logprobs:
                old = rollout.logprobs * rollout.response_mask
            else:
                with self.stage(t, "old_log_prob"):
                    old = compute_logprobs(
                        self.policy, rollout, cfg.rollout.temperature, cfg.train.micro_batch_size, cfg.train.micro_batch_tokens
                    )
            ref = values = None
            if self.reference is not None:
                with self.stage(t, "ref"):
                    ref = compute_logprobs(
                        self.reference, rollout, cfg.rollout.temperature, cfg.train.micro_batch_size, cfg.train.micro_batch_tokens
                    )
            if self.critic is not None:
                with self.stage(t, "values"):
                    values = self.critic.values(rollout, cfg.train.micro_batch_size, cfg.train.micro_batch_tokens)
            with self.stage(t, "adv"):
                advantages, returns = self.advantages(scored, loss_mask, values)
            batch = TrainBatch(scored, loss_mask, old, advantages, ref, values, returns)
            lr = self.learning_rate(step)
            for group in self.optimizer.param_groups:
                group["lr"] = lr
            if self.critic is not None:
                with self.stage(t, "update_critic"):
                    critic_metrics = update_critic(self.critic, self.critic_optimizer, batch, cfg.algo, cfg.train, cfg.rollout.max_new_tokens)
                metrics.update({f"critic/{k}": v for k, v in critic_metrics.items() if k not in ("loss",)})
            with self.stage(t, "update_actor"):
                poison = self.faults.poison_loss(step)
                actor_metrics = update_policy(
                    self.policy, self.optimizer, batch, cfg.algo, cfg.train, cfg.rollout.temperature, cfg.rollout.max_new_tokens, poison
                )
            metrics.update({f"actor/{k}": v for k, v in actor_metrics.items() if k != "loss"})
            self.guard(step, actor_metrics)
            metrics["actor/lr"] = lr
            metrics.update(batch_metrics(batch))
        metrics.update(t)
        metrics.update(self.work_shares)
        # Time per trained token: skipped rows (train.skip_zero_advantage) cost nothing.
        self.slow.update("update_actor", 0, step, t["timing_s/update_actor"] / (actor_metrics["trained_tokens"] or 1.0))
        self.step_count = step
        return metrics

    @contextmanager
    def stage(self, t: dict[str, float], name: str) -> Iterator[None]:
        """A named stage: heartbeat to the hang watchdog, due crash/sigkill/hang faults, timing."""
        if self.watchdog is not None:
            self.watchdog.beat(name)
        for kind in ("crash", "sigkill", "hang"):
            self.faults.fire(kind, self.step_count + 1, stage=name)
        with timed(t, name):
            yield

    def guard(self, step: int, actor: dict[str, float]) -> None:
        """Non-finite and spike guards after an update; roll back to the last checkpoint when due."""
        verdict = self.nonfinite.check(step, actor["loss"], actor["grad_norm"], params_finite(self.policy))
        spiked = [name for name in ("grad_norm", "loss") if self.spikes.update(f"actor/{name}", step, actor[name])]
        if verdict == "rollback" or (spiked and self.cfg.resilience.spike_rollback):
            self.rollback(step, reason="non-finite updates" if verdict == "rollback" else f"spike in {', '.join(spiked)}")

    # ---------------------------------------------------------------- stages
    def collect(self, t: dict[str, float]) -> tuple[ScoredBatch, dict[str, float]]:
        """Generate and score until the train batch is full (the RolloutScheduler).

        Without dynamic sampling one generation batch is the train batch. With it, groups
        whose samples are all correct or all wrong (no learning signal) are dropped; groups
        are graded as soon as they complete, and decoding stops once ``prompts_per_step``
        mixed groups are kept (``algo.early_stop``), with refills sized to what is missing.
        """
        cfg = self.cfg
        params = SamplingParams(cfg.rollout.temperature, cfg.rollout.top_p, cfg.rollout.top_k, cfg.rollout.max_new_tokens)
        workers = cfg.resilience.rollout_workers
        scheduler = RolloutScheduler(
            self.generator if workers == 1 else _RolloutWorkers(self),
            self.score,
            cfg.rollout.n,
            params,
            cfg.train.prompts_per_step,
            dynamic=cfg.algo.dynamic_sampling,
            max_gen_batches=cfg.algo.max_gen_batches,
            oversample=cfg.algo.oversample,
            gen_batch_prompts=cfg.train.gen_prompts_per_step,
            early_stop=cfg.algo.early_stop,
            pad_id=self.pad_id,
        )
        drawn = 0

        def next_prompts(k: int) -> list[tuple[Prompt, list[int]]]:
            nonlocal drawn
            drawn += k
            return [(self.train_prompts[i], self.train_ids[i]) for i in self.sampler.next(k)]

        with self.stage(t, "gen"):
            batch, stats = scheduler.collect(next_prompts, self.rng)
            if workers == 1:
                self.watch_worker(0, scheduler.timing["gen"], drawn)
        t["timing_s/gen"] -= scheduler.timing["reward"]
        t["timing_s/reward"] = t.get("timing_s/reward", 0.0) + scheduler.timing["reward"]
        return batch, stats

    def watch_worker(self, worker: int, seconds: float, prompts: int) -> None:
        """Feed a rollout worker's time per prompt to the fail-slow detector; a due ``slow``
        fault stretches that time (by sleeping)."""
        factor = self.faults.slow_factor("gen", worker, self.step_count + 1)
        if factor > 1:
            time.sleep((factor - 1) * seconds)
        self.slow.update("gen", worker, self.step_count + 1, factor * seconds / max(prompts, 1))

    def rollback(self, step: int, reason: str) -> None:
        """Restore policy, critic and optimizers from the newest valid checkpoint (or the initial
        weights), keeping the step counter, sampler and RNG: the offending batches are skipped."""
        began = time.time()
        path = find_latest(self.run_dir / "checkpoints")
        if path is None:
            self.policy.load_state_dict(load_model(self.model_dir, self.cfg.model.dtype).state_dict())
            self.optimizer.state.clear()
        else:
            _, tensors, state = load_checkpoint(path)
            self.policy.load_state_dict(tensors["policy"])
            self.optimizer.load_state_dict(state["optimizer"])
            if self.critic is not None:
                self.critic.load_state_dict(tensors["critic"])
                self.critic_optimizer.load_state_dict(state["critic_optimizer"])
        self.events.emit("rollback", step, reason=reason, to=str(path or self.model_dir), recover_s=time.time() - began)

    def score(self, rollout: RolloutBatch, prompts: list[Prompt]) -> ScoredBatch:
        """Decode, grade with the reward function, add the soft overlong punishment."""
        texts = self.tokenizer.batch_decode(rollout.response_ids, skip_special_tokens=True)
        fault = self.faults.reward_fault(self.step_count + 1)
        inject = {i: fault[0].removeprefix("reward_") for i in range(min(fault[1], len(texts)))} if fault else None
        scores, acc, failed, errors = self.rewards.score(texts, [p.ground_truth for p in prompts], inject)
        device = rollout.response_mask.device  # grading runs on the host; the rollout may be on a GPU
        scores, acc, failed = scores.to(device), acc.to(device), failed.to(device)
        if errors:
            self.events.emit("reward_failed", self.step_count + 1, samples=len(errors), errors=errors[:3])
        a = self.cfg.algo
        if a.overlong_buffer > 0:
            scores = scores + algo.overlong_penalty(rollout.lengths, self.cfg.rollout.max_new_tokens, a.overlong_buffer, a.overlong_penalty)
        return ScoredBatch(rollout, prompts, texts, scores, acc, failed)

    def advantages(self, scored: ScoredBatch, mask: torch.Tensor, values: torch.Tensor | None):
        """(advantages [B, T], returns [B, T] or None) for algo.adv_estimator."""
        a = self.cfg.algo
        rollout = scored.rollout
        if a.adv_estimator in GROUP_ESTIMATORS:
            adv = GROUP_ESTIMATORS[a.adv_estimator](scored.scores, rollout.group_ids)
            return adv[:, None] * mask, None
        token_rewards = algo.outcome_to_token_rewards(scored.scores, rollout.response_mask)
        if a.adv_estimator == "reinforce_pp":
            adv, _ = algo.reinforce_pp(token_rewards, rollout.response_mask, a.gamma)
            return adv * mask, None
        adv, returns = algo.gae(token_rewards, values, rollout.response_mask, a.gamma, a.lam)
        return adv * mask, returns

    def learning_rate(self, step: int) -> float:
        """Linear warmup over train.warmup_steps, then constant."""
        t = self.cfg.train
        return t.lr * min(1.0, step / t.warmup_steps) if t.warmup_steps else t.lr

    # ---------------------------------------------------------------- validation
    @torch.no_grad()
    def validate(self) -> dict[str, float]:
        """Held-out accuracy: mean over k samples, pass@k (unbiased), greedy accuracy."""
        cfg = self.cfg
        n = min(cfg.eval.n_prompts, len(self.test_prompts))
        prompts, ids, k = self.test_prompts[:n], self.test_ids[:n], cfg.eval.k
        g = torch.Generator().manual_seed(cfg.run.seed * 1_000_003 + self.step_count)
        sampled = self.generator.generate(ids, k, SamplingParams(cfg.eval.temperature, max_new_tokens=cfg.rollout.max_new_tokens), g)
        acc = self.score(sampled, [p for p in prompts for _ in range(k)]).acc.view(n, k)
        out = {"val/acc": acc.float().mean().item()}
        correct = acc.sum(-1).tolist()
        for j in sorted({2, 4, 8, 16, 32, 64, k} & set(range(2, k + 1))):
            out[f"val/pass@{j}"] = sum(algo.pass_at_k(k, c, j) for c in correct) / n
        by_source = defaultdict(list)
        for p, a in zip(prompts, acc.float().mean(-1).tolist()):
            by_source[p.data_source].append(a)
        if len(by_source) > 1:
            out.update({f"val/acc/{s}": sum(v) / len(v) for s, v in sorted(by_source.items())})
        if cfg.eval.greedy:
            greedy = self.generator.generate(ids, 1, SamplingParams(0.0, max_new_tokens=cfg.rollout.max_new_tokens), g)
            out["val/acc_greedy"] = self.score(greedy, prompts).acc.float().mean().item()
        return out

    # ---------------------------------------------------------------- run
    def run(self) -> dict[str, float]:
        """Train to train.total_steps, resuming from the newest committed checkpoint."""
        cfg = self.cfg
        dump(cfg, self.run_dir / "config.yaml")
        resumed = self.resume()
        if not resumed:
            self.events.emit("resume", 0, from_step=0, path=None)
        sink = MetricsSink(self.run_dir, cfg.train.total_steps, progress=cfg.run.progress)
        # Rows past the checkpoint will be written again (all of them, the step-0 validation
        # included, when there is no checkpoint).
        sink.truncate_after(self.step_count if resumed else -1)
        self.events.emit("start", self.step_count, resumed=resumed, pid=os.getpid())
        first_start = next(e["time"] for e in read_jsonl(self.run_dir / "events.jsonl") if e["kind"] == "start")
        productive = sum(r.get("timing_s/step", 0.0) for r in read_jsonl(self.run_dir / "metrics.jsonl"))
        stop = _StopFlag()
        start = time.time()
        last: dict[str, float] = {}
        if cfg.resilience.hang_timeout_s > 0:
            self.watchdog = StageWatchdog(cfg.resilience.hang_timeout_s, self.run_dir / "hang_dump.txt")
        try:
            if self.step_count == 0 and cfg.eval.every_steps:
                with self.stage(t := {}, "testing"):
                    last = self.validate()
                sink.log(0, {**last, **t, "time": time.time() - start})
            while self.step_count < cfg.train.total_steps and not stop.set:
                metrics = self.step()
                every = cfg.eval.every_steps
                if every and (self.step_count % every == 0 or self.step_count == cfg.train.total_steps):
                    with self.stage(metrics, "testing"):
                        metrics.update(self.validate())
                productive += metrics["timing_s/step"]
                metrics["time"] = time.time() - start
                metrics.update(self.effective_time(first_start, productive))
                sink.log(self.step_count, metrics)
                last.update(metrics)
                c = cfg.checkpoint.every_steps
                final = self.step_count == cfg.train.total_steps
                if (c and self.step_count % c == 0) or final or stop.set:
                    self.checkpoint(must_succeed=final)
        finally:
            if self.watchdog is not None:
                self.watchdog.stop()
                self.watchdog = None
            stop.restore()
            sink.close()
            self.rewards.close()
        if self.step_count >= cfg.train.total_steps:
            self.export(self.run_dir / "final")
        return last

    def effective_time(self, first_start: float, productive: float) -> dict[str, float]:
        """ETTR = productive step time / wall time since the run first started; time lost =
        wall - productive; MTTR = mean recovery time of the supervisor's ``recovered`` events."""
        wall = max(time.time() - first_start, 1e-9)
        recoveries = [e["recover_s"] for e in read_jsonl(self.run_dir / "events.jsonl") if e["kind"] == "recovered"]
        return {
            "ettr": productive / wall,
            "time_lost_s": wall - productive,
            "mttr_s": sum(recoveries) / len(recoveries) if recoveries else 0.0,
        }

    def export(self, out: Path) -> None:
        """The policy as a Hugging Face model directory (loads with from_pretrained)."""
        self.policy.save_pretrained(out)
        self.tokenizer.save_pretrained(out)

    # ---------------------------------------------------------------- checkpoints
    def checkpoint(self, must_succeed: bool) -> None:
        """Save a checkpoint; a failed write (disk full, permission) leaves the previous ones
        intact and is an event and a message, and an error only for the final checkpoint."""
        if self.watchdog is not None:
            self.watchdog.beat("checkpoint")
        try:
            self.save()
        except CheckpointWriteError as err:
            self.events.emit("checkpoint_failed", self.step_count, error=str(err))
            print(f"reasonrl: {err}; the previous checkpoint is intact", file=sys.stderr)
            if must_succeed:
                raise

    def save(self) -> Path:
        tensors = {"policy": self.policy.state_dict()}
        state = {
            "step": self.step_count,
            "config_hash": config_hash(self.cfg),
            "optimizer": self.optimizer.state_dict(),
            "sampler": self.sampler.state_dict(),
            "rng": capture_rng({"rollout": self.rng}),
            "guards": {"nonfinite": self.nonfinite.state_dict(), "spikes": self.spikes.state_dict(), "slow": self.slow.state_dict()},
        }
        if self.critic is not None:
            tensors["critic"] = self.critic.state_dict()
            state["critic_optimizer"] = self.critic_optimizer.state_dict()
        path = save_checkpoint(
            self.run_dir / "checkpoints", self.step_count, tensors, state, self.cfg.checkpoint.keep, self.faults.checkpoint_hook(self.step_count)
        )
        self.events.emit("checkpoint", self.step_count, path=str(path))
        return path

    def resume(self) -> bool:
        """Load the newest valid committed checkpoint, if any; refuse an incompatible config."""
        root = self.run_dir / "checkpoints"
        for info in list_checkpoints(root) if root.exists() else []:
            if not info.valid:
                self.events.emit("checkpoint_skipped", info.step, path=str(info.path), reason=info.reason)
        path = find_latest(root) if root.exists() else None
        if path is None:
            return False
        step, tensors, state = load_checkpoint(path)
        if state["config_hash"] != config_hash(self.cfg):
            raise ResumeError(
                f"{self.run_dir}: the checkpoint {path} was written with a different configuration "
                f"(hash {state['config_hash'][:12]} vs {config_hash(self.cfg)[:12]}); only run.dir, run.progress, run.threads, "
                "train.total_steps, eval.every_steps and checkpoint.* may change on resume. Use a new run.dir."
            )
        self.policy.load_state_dict(tensors["policy"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.critic is not None:
            self.critic.load_state_dict(tensors["critic"])
            self.critic_optimizer.load_state_dict(state["critic_optimizer"])
        self.sampler.load_state_dict(state["sampler"])
        restore_rng(state["rng"], {"rollout": self.rng})
        self.nonfinite.load_state_dict(state["guards"]["nonfinite"])
        self.spikes.load_state_dict(state["guards"]["spikes"])
        self.slow.load_state_dict(state["guards"]["slow"])
        self.step_count = step
        self.events.emit("resume", step, from_step=step, path=str(path))
        self.log(f"resumed from {path} (step {step})")
        return True

    # ---------------------------------------------------------------- helpers
    def _generator(self):
        """The rollout backend of ``rollout.backend``; vLLM is imported only when chosen."""
        r = self.cfg.rollout
        if r.backend == "fast":
            static = None if r.cuda_graph else False  # None: graphs on CUDA only
            return FastGenerator(self.policy, self.pad_id, self.eos_id, static_shapes=static)
        if r.backend == "hf":
            return HFGenerator(self.policy, self.pad_id, self.eos_id)
        from reasonrl.rollout.vllm import VLLMGenerator

        return VLLMGenerator(
            self.policy, self.model_dir, self.pad_id, self.eos_id, self.cfg.model.dtype,
            r.vllm_gpu_memory_utilization, r.vllm_max_model_len, self.cfg.run.seed,
        )

    def _tokenize(self, prompts: list[Prompt], source: str) -> list[list[int]]:
        limit = self.cfg.data.max_prompt_len
        ids = self.tokenizer([render_prompt(p, self.tokenizer) for p in prompts])["input_ids"]
        for p, row in zip(prompts, ids):
            if len(row) > limit:
                raise ValueError(f"data.max_prompt_len: prompt {p.id} of {source} has {len(row)} tokens, more than {limit}")
        return ids

    @staticmethod
    def _frozen_copy(model: torch.nn.Module) -> torch.nn.Module:
        ref = copy.deepcopy(model).eval()
        for p in ref.parameters():
            p.requires_grad_(False)
        return ref


def batch_metrics(batch: TrainBatch) -> dict[str, float]:
    """Rewards, advantages, lengths and accuracy of the train batch (verl names)."""
    s, r = batch.scored, batch.scored.rollout
    valid = r.response_mask.bool()
    lengths = r.lengths.float()
    out = {
        "critic/score/mean": s.scores.mean().item(),
        "critic/score/max": s.scores.max().item(),
        "critic/score/min": s.scores.min().item(),
        "critic/advantages/mean": batch.advantages[valid].mean().item(),
        "critic/advantages/max": batch.advantages[valid].max().item(),
        "critic/advantages/min": batch.advantages[valid].min().item(),
        "response_length/mean": lengths.mean().item(),
        "response_length/max": lengths.max().item(),
        "response_length/clip_ratio": r.truncated.float().mean().item(),
        "train/acc": s.acc.float().mean().item(),
        "train/reward_failed": s.failed.float().sum().item(),
    }
    if batch.returns is not None:
        out["critic/returns/mean"] = batch.returns[valid].mean().item()
        out["critic/values/mean"] = batch.values[valid].mean().item()
    return out


class _RolloutWorkers:
    """Rollout workers sharing each generation batch, in this process (Ray actors later).

    The prompts are split equally; once a worker is detected fail-slow its share shrinks in
    proportion to its speed (SlowdownDetector.weights) until it recovers. Whole batches
    only: no early stop across workers.
    """

    def __init__(self, trainer: "Trainer") -> None:
        self.trainer = trainer

    def generate(self, prompts: list[list[int]], n: int, params: SamplingParams, generator: torch.Generator) -> RolloutBatch:
        tr = self.trainer
        workers = list(range(tr.cfg.resilience.rollout_workers))
        shares = [1 / len(workers)] * len(workers)
        if any(tr.slow.is_slow("gen", w) for w in workers):
            weights = tr.slow.weights("gen", workers)
            shares = [weights[w] for w in workers]
        counts = _apportion(len(prompts), shares)
        tr.work_shares = {f"rollout/share/worker{w}": c / len(prompts) for w, c in zip(workers, counts)}
        parts, start = [], 0
        for w, count in zip(workers, counts):
            if count == 0:
                continue
            began = time.perf_counter()
            parts.append(tr.generator.generate(prompts[start : start + count], n, params, generator))
            tr.watch_worker(w, time.perf_counter() - began, count)
            start += count
        return RolloutBatch.concat(parts, tr.pad_id)


def _apportion(total: int, shares: list[float]) -> list[int]:
    """Split ``total`` items by ``shares`` (largest remainders), e.g. 10 by [0.5, 0.5] -> [5, 5]."""
    exact = [total * w / sum(shares) for w in shares]
    counts = [int(x) for x in exact]
    for i in sorted(range(len(shares)), key=lambda i: counts[i] - exact[i])[: total - sum(counts)]:
        counts[i] += 1
    return counts


class _StopFlag:
    """Set on SIGTERM: the run checkpoints after the current step and exits cleanly."""

    def __init__(self) -> None:
        self.set = False
        self._previous = signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum, frame) -> None:
        self.set = True

    def restore(self) -> None:
        signal.signal(signal.SIGTERM, self._previous)
