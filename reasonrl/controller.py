"""The controller: wires the workers from a Config and runs ``step()`` in data-flow order.

    prompts -> rollout -> reward -> filter -> queue -> logprobs -> advantages -> update -> publish
    source     RolloutWorker RewardWorker keep_groups  PolicyWorker  algo.*      Critic/Policy  weights()

The workers (policy, reference, critic, rollout, reward) own their modules and state; the
controller holds none of them directly, only their groups (:mod:`reasonrl.runtime`), the
rollout source (:mod:`reasonrl.rollout.source`), the guards and the registry of what a
checkpoint holds. ``run()`` adds validation, metrics, checkpoints (resume, rollback) and
the final export.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sys
import threading
import time
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any, Iterator

import torch

from reasonrl import algo
from reasonrl.checkpoint import CheckpointWriteError, ProcessRNG, StateRegistry, find_latest, list_checkpoints, load_checkpoint
from reasonrl.config import Config, config_hash, dump
from reasonrl.models.loading import load_tokenizer, model_context
from reasonrl.warmstart import resolve_model_dir
from reasonrl.data.sources import source_name
from reasonrl.data.splits import tokenize_prompts
from reasonrl.env.splits import run_splits
from reasonrl.errors import InputError, LimitError, ResumeError, error_line
from reasonrl.evaluation import Evaluator
from reasonrl.loggers import check_loggers, open_loggers
from reasonrl.memory import PeakMemory
from reasonrl.metrics import EventLog, MetricsSink, Sample, StepLog, logging_step, read_jsonl, timed
from reasonrl.resilience.collectives import TRACE_DIR, RankMonitor, launch_ranks
from reasonrl.resilience.ettr import effective_time, step_seconds
from reasonrl.resilience.faults import parse_faults
from reasonrl.resilience.guards import NonFiniteGuard, StageWatchdog, run_detectors
from reasonrl.resilience.injection import FaultyHeartbeat, FaultyPolicy, FaultyRewards, FaultyRollout, checkpoint_writer
from reasonrl.resilience.rundir import RunLock, check_run_dir
from reasonrl.resilience.shards import ShardedRollouts
from reasonrl.rollout.agent_loop import AgentLoop
from reasonrl.rollout.source import AsyncSource, RolloutProducer, SyncSource
from reasonrl.samples import sample_records
from reasonrl.train.update import sampler_gap
from reasonrl.runtime import LocalGroup, ProcessGroup, WorkerDied, WorkerTimeout, available_cores, setup_torch
from reasonrl.types import Prompt, ScoredBatch, TrainBatch
from reasonrl.workers import CriticWorker, PolicyWorker, ReferenceWorker, RewardWorker, RolloutWorker, trainer_numerics

GROUP_ESTIMATORS = {"grpo": algo.grpo, "dr_grpo": algo.dr_grpo, "lite_ppo": algo.lite_ppo, "rloo": algo.rloo}


def build_producer(cfg: Config, model_dir: Path, prompts: list[Prompt], prompt_ids: list[list[int]], threads: int) -> RolloutProducer:
    """The rollout side of ``rollout.mode=async|lockstep``, built inside its own process: a
    rollout worker with its own copy of the weights, a reward worker, the scheduler."""
    setup_torch(threads, cfg.run.deterministic)
    rollout = RolloutWorker(cfg, model_dir)
    return RolloutProducer(cfg, rollout, RewardWorker(cfg, model_dir), prompts, prompt_ids, rollout.pad_id)


class _Role:
    """A registry entry for a group: its state through the group's calls (the first worker's,
    rank 0 of trainer ranks; every worker restores it)."""

    def __init__(self, group) -> None:
        self.group = group

    def state_dict(self) -> dict:
        return self.group.call("state_dict")[0]  # rank 0's: every rank holds the same

    def load_state_dict(self, state: dict) -> None:
        self.group.call("load_state_dict", state)

    def reset(self) -> None:
        self.group.call("reset")


def data_fingerprint(prompts: list[Prompt]) -> str:
    """sha256 (hex) of the training prompts (id, text, ground truth, in order): what a
    checkpoint was trained on, so a resume on other data is noticed."""
    digest = hashlib.sha256()
    for p in prompts:
        digest.update(json.dumps([p.id, p.text, p.ground_truth], sort_keys=True, default=str).encode())
        digest.update(b"\n")
    return digest.hexdigest()


class Controller:
    """Builds the workers of a run from its Config and trains them (``run()``).

    The run directory is locked for the controller's life (one trainer per directory) and
    nothing is written to it until the resume check has passed: a refused resume leaves the
    directory as it was. ``close()`` releases everything.
    """

    def __init__(self, cfg: Config, log=print) -> None:
        self.cfg = cfg
        self.log = log
        check_loggers(cfg.run.loggers)
        self.run_dir = Path(cfg.run.dir)
        check_run_dir(self.run_dir)
        self.lock = RunLock(self.run_dir, "trainer").acquire()
        try:
            self._build(cfg, log)
        except BaseException:
            self.lock.release()
            raise

    def _build(self, cfg: Config, log) -> None:
        setup_torch(cfg.run.threads, cfg.run.deterministic)
        torch.manual_seed(cfg.run.seed)
        self.events = EventLog(self.run_dir)
        self.model_dir = resolve_model_dir(cfg, log)
        self.tokenizer = load_tokenizer(self.model_dir)
        self.pad_id = self.tokenizer.pad_token_id
        splits = run_splits(cfg)
        log(f"data: {splits.description}")
        context = model_context(self.model_dir)
        train_tokens = tokenize_prompts(splits.train, self.tokenizer, cfg, context, splits.train_from)
        test_tokens = tokenize_prompts(splits.test, self.tokenizer, cfg, context, splits.test_from, held_out=True)
        for note in (train_tokens.note(splits.train_from), test_tokens.note(splits.test_from)):
            if note:
                log(f"data: {note}")
        train, train_ids = train_tokens.prompts, train_tokens.ids
        test, test_ids = test_tokens.prompts, test_tokens.ids
        self.fingerprint = data_fingerprint(train)
        self.step_count = 0
        self.version = 0
        """The policy version the next batch is trained from (the last one published)."""
        self.updates_applied = 0
        """Steps whose update was applied and not undone by a rollback (checkpointed)."""
        self.stopped_by: int | None = None
        """The signal (SIGINT, SIGTERM) that stopped ``run()`` early, if one did."""
        self.data_changed: str | None = None
        """The fingerprint of the checkpoint's data when it differs and resume.allow_data_change allowed it."""
        self.resumed_from: Path | None = None
        """The checkpoint ``resume()`` loaded, if any."""
        self.skipped_checkpoints: list = []
        """Newer checkpoints ``resume()`` found invalid (logged once the resume check passed)."""
        self.faults = parse_faults(list(cfg.faults)).bind(self.run_dir)
        kinds = {f.kind for f in self.faults.faults}
        rollout_side = kinds & {"slow", "reward_timeout", "reward_error"}
        if rollout_side and (cfg.rollout.mode != "sync" or cfg.runtime.engine == "ray"):
            where = f"rollout.mode={cfg.rollout.mode}" if cfg.rollout.mode != "sync" else "runtime.engine=ray"
            raise InputError(f"faults: {', '.join(sorted(rollout_side))} act on the rollout side, which {where} runs in "
                             "a rollout process of its own; rehearse them with rollout.mode=sync and runtime.engine=local")
        clock = lambda: self.step_count + 1  # noqa: E731 - the step the faults see
        r = cfg.resilience
        self.nonfinite = NonFiniteGuard(r.nonfinite_max_consecutive, self.events)
        self.spikes, self.slow = run_detectors(r, self.events)
        self.peak_memory = PeakMemory(cfg.run.device)
        self.watchdog = self.heartbeat = None
        self.last_record: dict[str, list] = {}
        """The prompt record of the last step (``prompts.jsonl``): draws made, trained, stale."""
        self.last_samples: list[dict] = []
        """Sample records of the last step's batch (:mod:`reasonrl.samples`)."""
        self.val_samples: list[dict] = []
        """Sample records of the last validation, every one."""

        self.cluster = self.reservation = None
        if cfg.runtime.engine == "ray":
            self.cluster, self.reservation = ray_reservation(cfg, self.model_dir)
        world = cfg.runtime.trainer_ranks
        self.rank_monitor: RankMonitor | None = None
        """Names a slow or stuck trainer rank from the collectives' trace (several ranks)."""
        if world > 1:  # rank 0 here (its module shared by the synchronous rollout), the others beside it
            self.policy = launch_ranks(cfg, self.model_dir, self.run_dir, reservation=self.reservation)
            policy = self.policy.local
            torch.set_num_threads(max(1, (cfg.run.threads or available_cores()) // world))
            self.rank_monitor = RankMonitor(self.run_dir / TRACE_DIR, world, self.events, r, cfg.runtime)
        else:
            policy = PolicyWorker(cfg, self.model_dir)
            self.policy = LocalGroup([FaultyPolicy(policy, self.faults, clock) if "nan" in kinds else policy])
        self.rank0 = policy
        """The policy's rank 0, in this process (the final export)."""
        self.reference = self._group("reference", ReferenceWorker) if cfg.algo.kl_loss_coef > 0 else None
        self.critic = self._group("critic", CriticWorker) if cfg.algo.adv_estimator == "gae" else None
        self.trainer_numerics = trainer_numerics(cfg)

        reward = RewardWorker(cfg, self.model_dir)
        if kinds & {"reward_timeout", "reward_error"}:
            reward = FaultyRewards(reward, self.faults, clock)
        self._reward = reward  # validation grades with it (in sync mode it is also the producer's)
        self.shards: ShardedRollouts | None = None
        if cfg.rollout.mode == "sync" and self.reservation is None:
            self.source, evaluation = self._sync_source(policy, reward, train, train_ids, "slow" in kinds, clock)
        else:
            self.source = self._async_source(policy, train, train_ids)
            evaluation = RolloutWorker(_colocated(cfg), self.model_dir, module=policy.module)
        self._evaluation = evaluation
        self.evaluator = Evaluator(cfg, evaluation, reward, test, test_ids)
        self.registry = self._registry()
        self.writer = checkpoint_writer(self.run_dir / "checkpoints", cfg.checkpoint.keep, self.faults)

    def _sync_source(self, policy: PolicyWorker, reward, train: list[Prompt], train_ids: list[list[int]], slow: bool, clock):
        """The rollout side in this process: ``resilience.rollout_workers`` rollout workers over
        the policy's own module (sharing a batch, work moved off a slow one, when several);
        returns the source and the rollout worker that validation uses."""
        cfg = self.cfg
        rollouts = [RolloutWorker(cfg, self.model_dir, module=policy.module) for _ in range(cfg.resilience.rollout_workers)]
        if slow:
            rollouts = [FaultyRollout(w, self.faults, i, clock) for i, w in enumerate(rollouts)]
        if len(rollouts) > 1:
            self.shards = ShardedRollouts(rollouts, self.slow, clock, self.pad_id)
        producer = RolloutProducer(cfg, self.shards or rollouts[0], reward, train, train_ids, self.pad_id)
        return SyncSource(producer, cfg.rollout.n, self.pad_id, cfg.train.prompts_per_step), rollouts[0]

    def _registry(self) -> StateRegistry:
        """What a checkpoint holds, in restore order (the config check first)."""
        registry = StateRegistry()
        registry.add("controller", self)
        registry.add("policy", _Role(self.policy), rollback=True)
        if self.critic is not None:
            registry.add("critic", _Role(self.critic), rollback=True)
        if self.reference is not None:
            registry.add("reference", _Role(self.reference))
        registry.add("source", self.source)
        registry.add("nonfinite", self.nonfinite)
        registry.add("spikes", self.spikes)
        registry.add("slow", self.slow)
        registry.add("rng", ProcessRNG())
        return registry

    def _group(self, role: str, factory):
        """A group of one ``factory(cfg, model_dir)`` worker: in this process, or with
        runtime.engine=ray a Ray actor in ``role``'s bundle (calls bounded by
        resilience.hang_timeout_s, else resilience.rollout_timeout_s)."""
        if self.reservation is None:
            return LocalGroup([factory(self.cfg, self.model_dir)])
        from reasonrl.runtime.ray import RayGroup

        r = self.cfg.resilience
        return RayGroup(factory, [(self.cfg, self.model_dir)], role, timeout_s=r.hang_timeout_s or r.rollout_timeout_s,
                        start_timeout_s=r.rollout_timeout_s, **self.reservation.options(role))

    def _async_source(self, policy: PolicyWorker, train: list[Prompt], train_ids: list[list[int]]) -> AsyncSource:
        """The rollout side in a process of its own, or a Ray actor (runtime.engine=ray, where
        rollout.mode=sync runs as lockstep at staleness 0: the same batches, bit for bit)."""
        cfg, r = self.cfg, self.cfg.resilience
        threads = cfg.rollout.threads or torch.get_num_threads()
        args = (cfg, self.model_dir, train, train_ids, threads)
        concurrent = ("offer_weights", "stage_weights")

        def launch():
            if self.reservation is not None:
                from reasonrl.runtime.ray import RayGroup

                return RayGroup(build_producer, [args], "rollout", timeout_s=r.rollout_timeout_s,
                                start_timeout_s=r.rollout_timeout_s, concurrent=concurrent,
                                **self.reservation.options("rollout"))
            return ProcessGroup(build_producer, args, name="rollout", timeout_s=r.rollout_timeout_s,
                                start_timeout_s=r.rollout_timeout_s, concurrent=concurrent)

        return AsyncSource(
            launch, policy.weights(), n=cfg.rollout.n, pad_id=self.pad_id, want=cfg.train.prompts_per_step,
            max_staleness=cfg.rollout.max_staleness, lockstep=cfg.rollout.mode in ("lockstep", "sync"),
            timeout_s=r.rollout_timeout_s, max_restarts=r.rollout_restarts, failures=(WorkerDied, WorkerTimeout),
            emit=lambda kind, **fields: self.events.emit(kind, self.step_count, **fields),
        )

    # ---------------------------------------------------------------- one step
    def step(self) -> dict[str, float]:
        """One RL step; returns its metrics (verl names)."""
        cfg, t = self.cfg, defaultdict(float)
        step = self.step_count + 1
        version = self.version
        self.peak_memory.reset()
        with timed(t, "step"):
            with self.stage(t, "gen"):
                got = self.source.next_batch(version)
            t["timing_s/gen"] -= got.reward_here_s
            scored, metrics = got.scored, dict(got.metrics)
            self.last_record = got.record
            if got.errors:  # an episode's errors are its environment's, which was replaced
                kind = "env_failed" if cfg.env.name else "reward_failed"
                self.events.emit(kind, step, samples=len(got.errors), errors=got.errors[:3])
            if self.shards is None:
                self.slow.update("gen", 0, step, metrics["timing_s/rollout_gen"], work=max(len(got.record["drawn"]), 1))
            rollout = scored.rollout
            loss_mask = rollout.action_mask
            if cfg.algo.overlong_filter:
                loss_mask = loss_mask * algo.overlong_filter_mask(rollout.truncated)[:, None]
            behaviour = rollout.logprobs * rollout.action_mask
            if cfg.algo.off_policy in algo.IS_WEIGHTS:
                old = None  # the proximal policy: the update computes it from its first forward
            elif self.anchor_is_behaviour(rollout, version):
                old = behaviour
            else:
                with self.stage(t, "old_log_prob"):
                    old = self.policy_call("logprobs", step, rollout)
                gap = algo.behaviour_metrics(old, behaviour, rollout.action_mask, cfg.algo.tis_cap)
                metrics.update({f"off_policy/{k}": v.item() for k, v in gap.items()})
                metrics.update(sampler_gap(old, behaviour, rollout, version))
            ref = values = None
            if self.reference is not None:
                with self.stage(t, "ref"):
                    [ref] = self.reference.call("logprobs", rollout)
            if self.critic is not None:
                with self.stage(t, "values"):
                    [values] = self.critic.call("values", rollout)
            with self.stage(t, "adv"):
                advantages, returns = self.advantages(scored, loss_mask, values)
            batch = TrainBatch(scored, loss_mask, old, advantages, ref, values, returns)
            lr = self.learning_rate(step)
            if self.critic is not None:
                with self.stage(t, "update_critic"):
                    [critic_metrics] = self.critic.call("update", batch)
                metrics.update({f"critic/{k}": v for k, v in critic_metrics.items() if k not in ("loss",)})
            with self.stage(t, "update_actor"):
                actor_metrics = self.policy_call("update", step, batch, lr)
            self.balance_ranks(step)
            metrics.update({k if "/" in k else f"actor/{k}": v for k, v in actor_metrics.items() if k != "loss"})
            self.guard(step, actor_metrics)
            metrics["actor/lr"] = lr
            metrics.update(batch_metrics(batch))
            with self.stage(t, "publish"):
                self.publish()
        metrics.update(t)
        metrics["timing_s/weight_sync"] = self.source.weight_sync_s
        metrics["perf/throughput"] = metrics["perf/total_num_tokens"] / t["timing_s/step"]
        metrics["perf/max_memory_gb"] = self.peak_memory.peak_gb()
        self.last_samples = self.samples(step, scored)
        metrics.update(reward_extras(scored))
        if scored.rollout.episodes is not None:
            metrics.update(AgentLoop.stats(scored.rollout))
        if self.shards is not None:
            metrics.update(self.shards.shares)
        # Time per trained token: skipped rows (train.skip_zero_advantage) cost nothing.
        self.slow.update("update_actor", 0, step, t["timing_s/update_actor"], work=actor_metrics["trained_tokens"] or 1.0)
        self.step_count = step
        return metrics

    def policy_call(self, method: str, step: int, *args):
        """Rank 0's answer of the policy's ``method`` (a collective of every trainer rank, the
        trace tagged with ``step``, when there are several). A rank that does not answer in
        time is named (a ``hang`` event) before the error goes up to the supervisor, which
        restarts the run from its last checkpoint."""
        if self.rank_monitor is None:
            return self.policy.call(method, *args)[0]
        try:
            return self.policy.call(method, *args, step=step)[0]
        except WorkerTimeout:
            self.rank_monitor.on_timeout(step)
            raise

    def balance_ranks(self, step: int) -> None:
        """After an update with several trainer ranks: name a rank the others keep waiting for
        (a ``straggler`` event) and shrink its share of the batch to its speed
        (:class:`~reasonrl.resilience.collectives.RankMonitor`)."""
        if self.rank_monitor is not None:
            found = self.rank_monitor.after_step(step)
            if found.shares is not None:
                self.policy.call("set_shares", found.shares)

    def samples(self, step: int, scored: ScoredBatch) -> list[dict]:
        """Records of up to max(run.keep_samples, run.log_samples on a logging step) rows of
        the batch, distinct prompts first (:func:`spread_rows`)."""
        r = self.cfg.run
        limit = max(r.keep_samples, r.log_samples if logging_step(step, r.log_every) else 0)
        return sample_records(scored, self.tokenizer, "train", step, spread_rows(scored.rollout.group_ids.tolist(), limit))

    def publish(self) -> None:
        """Hand the policy's current weights to the rollout side; they are the version the next
        batch is trained from."""
        weights = self.policy.call("weights")[0]
        self.source.publish(weights)
        self.version = weights.version

    def anchor_is_behaviour(self, rollout, version: int) -> bool:
        """Whether the PPO anchor is the sampling log-probs (no recomputation): always with
        ``algo.off_policy=bypass``, never with tis or decoupled (the update computes the
        proximal policy); with none, as ``train.old_logprobs`` says (``auto``: when the
        sampler ran the trainer's numerics on this very version)."""
        a, how = self.cfg.algo.off_policy, self.cfg.train.old_logprobs
        if a != "none":
            return a == "bypass"
        if how != "auto":
            return how == "rollout"
        return self.trainer_numerics and bool((rollout.oldest_versions() == version).all())

    @contextmanager
    def stage(self, t: dict[str, float], name: str) -> Iterator[None]:
        """A named stage: a heartbeat to the hang watchdog, and ``timing_s/<name>``."""
        if self.heartbeat is not None:
            self.heartbeat.beat(name)
        with timed(t, name):
            yield

    def guard(self, step: int, actor: dict[str, float]) -> None:
        """Non-finite and spike guards after an update; roll back to the last checkpoint when due."""
        finite = self.policy.call("params_finite")[0]
        verdict = self.nonfinite.check(step, actor["loss"], actor["grad_norm"], finite)
        if verdict == "ok":
            self.updates_applied += 1
        spiked = [name for name in ("grad_norm", "loss") if self.spikes.update(f"actor/{name}", step, actor[name])]
        if verdict == "rollback" or (spiked and self.cfg.resilience.spike_rollback):
            self.rollback(step, reason="non-finite updates" if verdict == "rollback" else f"spike in {', '.join(spiked)}")

    def rollback(self, step: int, reason: str) -> None:
        """Restore the weights and optimizers from the newest valid checkpoint (or the initial
        weights), keeping the step counter, sampler and RNG: the offending batches are skipped."""
        began = time.time()
        path = find_latest(self.run_dir / "checkpoints")
        if path is None:
            for role in self.registry.rollback_entries:
                role.reset()
            from_step, self.updates_applied = 0, 0
        else:
            from_step, tensors, state = load_checkpoint(path)
            self.registry.restore(tensors, state, rollback=True)
            self.updates_applied = state["controller"]["updates_applied"]
        self.events.emit("rollback", step, reason=reason, to=str(path or self.model_dir), from_step=from_step,
                         recover_s=time.time() - began)

    def advantages(self, scored, mask: torch.Tensor, values: torch.Tensor | None):
        """(advantages [B, T], returns [B, T] or None) for algo.adv_estimator."""
        a = self.cfg.algo
        rollout = scored.rollout
        if a.adv_estimator in GROUP_ESTIMATORS:
            adv = GROUP_ESTIMATORS[a.adv_estimator](scored.scores, rollout.group_ids)
            return adv[:, None] * mask, None
        token_rewards = rollout.token_rewards
        if token_rewards is None:
            token_rewards = algo.outcome_to_token_rewards(scored.scores, rollout.action_mask)
        if a.adv_estimator == "reinforce_pp":
            adv, _ = algo.reinforce_pp(token_rewards, rollout.action_mask, a.gamma)
            return adv * mask, None
        adv, returns = algo.gae(token_rewards, values, rollout.action_mask, a.gamma, a.lam)
        return adv * mask, returns

    def learning_rate(self, step: int) -> float:
        """Linear warmup over train.warmup_steps, then constant."""
        t = self.cfg.train
        return t.lr * min(1.0, step / t.warmup_steps) if t.warmup_steps else t.lr

    def validate(self) -> dict[str, float]:
        """Held-out accuracy of the current weights (:class:`~reasonrl.evaluation.Evaluator`);
        its sample records are kept in ``val_samples``."""
        metrics = self.evaluator.run(self.step_count)
        self.val_samples = self.evaluator.last_samples
        return metrics

    # ---------------------------------------------------------------- run
    def run(self) -> dict[str, float]:
        """Train to train.total_steps, resuming from the newest committed checkpoint.

        SIGINT or SIGTERM ends it after the current step with a checkpoint (``stopped_by``
        says which; a second SIGINT interrupts at once). A run that never applied an update
        (every step skipped or rolled back) is a LimitError and exports nothing."""
        cfg = self.cfg
        try:
            resumed = self.resume()
            dump(cfg, self.run_dir / "config.yaml")  # only now: a refused resume writes nothing
            self._emit_resume(resumed)
            self.publish()  # the rollout side starts from the trainer's weights
            sink = MetricsSink(self.run_dir, cfg.train.total_steps, progress=cfg.run.progress,
                               log_every=cfg.run.log_every, loggers=open_loggers(cfg, self.run_dir))
        except BaseException:
            self.close()
            raise
        prompts = StepLog(self.run_dir / "prompts.jsonl")
        samples = StepLog(self.run_dir / "samples.jsonl") if cfg.run.keep_samples else None
        # Rows past the checkpoint will be written again (all of them, the step-0 validation
        # included, when there is no checkpoint).
        sink.truncate_after(self.step_count if resumed else -1)
        prompts.truncate_after(self.step_count)
        if samples is not None:
            samples.truncate_after(self.step_count if resumed else -1)
        self.events.emit("start", self.step_count, resumed=resumed, pid=os.getpid())
        step_s = step_seconds(read_jsonl(self.run_dir / "metrics.jsonl"))
        stop = _StopFlag()
        start = last_checkpoint = time.time()
        last: dict[str, float] = {}
        self.watchdog, self.heartbeat = self._heartbeat()
        try:
            if self.step_count == 0 and cfg.eval.every_steps:
                with self.stage(t := {}, "testing"):
                    last = self.validate()
                sink.log(0, {**last, **t, "time": time.time() - start})
                self.keep_samples(0, sink, samples, [], self.val_samples)
            while self.step_count < cfg.train.total_steps and not stop.signum:
                metrics = self.step()
                every = cfg.eval.every_steps
                if every and (self.step_count % every == 0 or self.step_count == cfg.train.total_steps):
                    with self.stage(metrics, "testing"):
                        metrics.update(self.validate())
                step_s[self.step_count] = metrics["timing_s/step"]
                metrics["time"] = time.time() - start
                metrics.update(self.effective_time(step_s))
                sink.log(self.step_count, metrics)
                self.keep_samples(self.step_count, sink, samples, self.last_samples,
                                  self.val_samples if "val/acc" in metrics else [])
                prompts.log(self.step_count, self.last_record)
                last.update(metrics)
                if self.checkpoint_due(last_checkpoint) or stop.signum:
                    self.checkpoint(final=self.step_count == cfg.train.total_steps)
                    last_checkpoint = time.time()
            if self.step_count >= cfg.train.total_steps:
                self.events.emit("rollout_leftover", self.step_count, **self.source.leftover())
        finally:
            if self.heartbeat is not None:
                self.heartbeat.stop()
            self.watchdog = self.heartbeat = None
            self.stopped_by = stop.signum
            stop.restore()
            sink.close()
            prompts.close()
            if samples is not None:
                samples.close()
            self.close()
        if self.step_count >= cfg.train.total_steps:
            if self.updates_applied == 0:
                raise LimitError(
                    f"{self.run_dir}: no update was applied in {self.step_count} steps (every one was skipped as "
                    f"non-finite or rolled back; see {self.events.path}); final/ is not exported. Check train.lr, "
                    "train.grad_clip and the reward function")
            self.rank0.export(self.run_dir / "final")  # in this process: the groups are closed by now
        return last

    def keep_samples(self, step: int, sink: MetricsSink, samples: StepLog | None, train: list[dict], val: list[dict]) -> None:
        """Write the step's sample records to samples.jsonl (run.keep_samples training ones,
        every validation one) and send run.log_samples of each kind to the loggers (training
        ones on logging steps)."""
        r = self.cfg.run
        if samples is not None:
            samples.log_rows(train[: r.keep_samples] + val)
        if r.log_samples and train and logging_step(step, r.log_every):
            sink.log_samples(step, logger_samples(train, r.log_samples))
        if r.log_samples and val:
            sink.log_samples(step, logger_samples(val, r.log_samples, first_of_each=True), "val_samples")

    def _emit_resume(self, resumed: bool) -> None:
        """The events of a resume that passed its check (nothing is written before it)."""
        for info in self.skipped_checkpoints:
            self.events.emit("checkpoint_skipped", info.step, path=str(info.path), reason=info.reason)
        if self.data_changed is not None:
            self.events.emit("data_changed", self.step_count, fingerprint=self.fingerprint, checkpoint=self.data_changed)
        if resumed:
            self.events.emit("resume", self.step_count, from_step=self.step_count, path=str(self.resumed_from))
            self.log(f"resumed from {self.resumed_from} (step {self.step_count})")
            if self.step_count >= self.cfg.train.total_steps:
                self.log(f"{self.run_dir}: the run is already complete ({self.step_count} of {self.cfg.train.total_steps} "
                         "steps); nothing to train (raise train.total_steps to go on)")
        else:
            self.events.emit("resume", 0, from_step=0, path=None)

    def checkpoint_due(self, last_checkpoint: float) -> bool:
        """After a step: every checkpoint.every_steps steps, every checkpoint.every_minutes
        minutes of training, and at the last step."""
        c = self.cfg.checkpoint
        return (
            self.step_count == self.cfg.train.total_steps
            or (c.every_steps > 0 and self.step_count % c.every_steps == 0)
            or (c.every_minutes > 0 and time.time() - last_checkpoint >= 60 * c.every_minutes)
        )

    def _heartbeat(self):
        """(watchdog, stage heartbeat): the hang watchdog (``resilience.hang_timeout_s``), and
        the heartbeat of a step's stages, the watchdog wrapped when the fault plan has stage
        faults. A checkpoint beats the watchdog only: it is no stage of the step in progress."""
        r = self.cfg.resilience
        watchdog = StageWatchdog(r.hang_timeout_s, self.run_dir / "hang_dump.txt") if r.hang_timeout_s > 0 else None
        if any(f.kind in ("crash", "sigkill", "hang") for f in self.faults.faults):
            return watchdog, FaultyHeartbeat(watchdog, self.faults, lambda: self.step_count + 1)
        return watchdog, watchdog

    def close(self) -> None:
        """Stop the rollout side, the reward and environment processes, release the run
        directory (closing twice is harmless)."""
        self.source.close()
        self._reward.close()
        self._evaluation.close()
        for group in (self.policy, self.reference, self.critic):
            if group is not None:
                group.close()
        if self.reservation is not None:
            self.reservation.close()
            self.cluster.close()
            self.reservation = self.cluster = None
        self.lock.release()

    def effective_time(self, step_s: dict[int, float]) -> dict[str, float]:
        """``ettr``, ``time_lost_s`` and ``mttr_s`` so far (:mod:`reasonrl.resilience.ettr`)."""
        figures = effective_time(read_jsonl(self.events.path) if self.events.path.exists() else [], step_s)
        return {"ettr": figures["ettr"], "time_lost_s": figures["lost_s"], "mttr_s": figures["mttr_s"]}

    # ---------------------------------------------------------------- checkpoints
    def checkpoint(self, final: bool) -> None:
        """Save the registry. A failed write (disk full, permissions, the serialiser) leaves the
        previous checkpoints intact and is a ``checkpoint_failed`` event with its cause in words;
        training goes on. The final one is tried checkpoint.final_retries times (waiting 1 s,
        2 s, ...) and then a LimitError."""
        attempts = self.cfg.checkpoint.final_retries if final else 1
        for attempt in range(1, attempts + 1):
            if self.watchdog is not None:
                self.watchdog.beat("checkpoint")
            try:
                path = self.writer.save(self.step_count, *self.registry.capture())
            except CheckpointWriteError as err:
                self.events.emit("checkpoint_failed", self.step_count, error=str(err), cause=err.cause, attempt=attempt,
                                 final=final)
                print(f"reasonrl: {err}; the previous checkpoint is intact", file=sys.stderr)
                if attempt == attempts:
                    if final:
                        raise LimitError(f"the final checkpoint could not be written in {attempts} attempts ({err.cause}): "
                                         f"{err}; the previous checkpoint is intact and a rerun resumes from it") from err
                    return
                time.sleep(2 ** (attempt - 1))
                continue
            self.events.emit("checkpoint", self.step_count, path=str(path))
            return

    def resume(self) -> bool:
        """Load the newest valid committed checkpoint, if any; refuse an incompatible config or
        changed data (ResumeError) before anything is restored or written."""
        root = self.run_dir / "checkpoints"
        self.skipped_checkpoints = [i for i in list_checkpoints(root) if not i.valid] if root.exists() else []
        path = find_latest(root) if root.exists() else None
        self.resumed_from = path
        if path is None:
            return False
        step, tensors, state = load_checkpoint(path)
        if "controller" not in state:
            raise ResumeError(f"{path}: written by an older reasonrl (no 'controller' state); use a new run.dir")
        try:
            self.registry.restore(tensors, state)
        except (RuntimeError, KeyError, ValueError) as err:  # in memory: a restart would meet it again
            raise ResumeError(f"{path}: does not fit this run ({error_line(err)}); it was written for another model "
                              "(another model.path, or a warm start of another reasonrl version); use a new run.dir") from err
        self.step_count = step
        return True

    def state_dict(self) -> dict[str, Any]:
        """``config_hash`` and ``data_fingerprint``: a resume must match them;
        ``updates_applied``: the count of updates that stand."""
        return {"config_hash": config_hash(self.cfg), "data_fingerprint": self.fingerprint,
                "updates_applied": self.updates_applied}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["config_hash"] != config_hash(self.cfg):
            raise ResumeError(
                f"{self.run_dir}: the checkpoint was written with a different configuration "
                f"(hash {state['config_hash'][:12]} vs {config_hash(self.cfg)[:12]}); only run.dir, run.progress, run.threads, "
                "run.log_*, run.loggers, run.wandb_*, train.total_steps, eval.every_steps, checkpoint.*, resume.* and resilience.* "
                "may change on resume. Use a new run.dir."
            )
        if "data_fingerprint" not in state or "updates_applied" not in state:
            raise ResumeError(f"{self.run_dir}: the checkpoint was written by an older reasonrl (no data fingerprint); "
                              "use a new run.dir")
        if state["data_fingerprint"] != self.fingerprint:
            if not self.cfg.resume.allow_data_change:
                raise ResumeError(
                    f"{self.run_dir}: the training data differs from the data the checkpoint was trained on "
                    f"({source_name(self.cfg.data.source)}: fingerprint {self.fingerprint[:12]}, checkpoint {state['data_fingerprint'][:12]}); "
                    "to continue on the new data anyway, add resume.allow_data_change=true; otherwise use a new run.dir")
            self.data_changed = state["data_fingerprint"]
        self.updates_applied = int(state["updates_applied"])


def ray_reservation(cfg: Config, model_dir: Path):
    """(cluster, reservation) for runtime.engine=ray: :func:`~reasonrl.runtime.ray.connect`
    (join runtime.ray_address, or start a loopback-only local cluster whose object store
    holds two versions of the weights), then the bundles of runtime.placement for the roles
    this run starts as actors (the rollout side, which holds its reward and environment
    processes; reference and critic when used; trainer ranks 1..N-1), reserved or a LimitError
    within seconds. The policy's rank 0 is this process."""
    from reasonrl.memory import DTYPE_BYTES, ModelShape
    from reasonrl.runtime.placement import parse_placement
    from reasonrl.runtime.ray import OBJECT_STORE_BYTES, Reservation, connect

    roles = {"rollout": 1}
    if cfg.runtime.trainer_ranks > 1:
        roles["policy"] = cfg.runtime.trainer_ranks - 1
    if cfg.algo.kl_loss_coef > 0:
        roles["reference"] = 1
    if cfg.algo.adv_estimator == "gae":
        roles["critic"] = 1
    plan = parse_placement(cfg.runtime.placement).plan(roles)
    weights = ModelShape.from_model_dir(model_dir).parameters() * DTYPE_BYTES[cfg.model.dtype]
    cluster = connect(cfg.runtime, object_store_bytes=max(OBJECT_STORE_BYTES, 2 * weights + (64 << 20)))
    try:
        return cluster, Reservation(plan, timeout_s=30.0)
    except BaseException:
        cluster.close()
        raise


def _colocated(cfg: Config) -> Config:
    """The config of a rollout worker beside the policy in async mode (validation): the fast
    backend, or transformers for a model it does not support, never a second vLLM engine;
    nothing interrupts it (it shares the policy's module)."""
    backend = "fast" if cfg.rollout.backend == "fast" else "hf"
    return replace(cfg, rollout=replace(cfg.rollout, backend=backend, interrupt=False))


def batch_metrics(batch: TrainBatch) -> dict[str, float]:
    """Rewards, advantages, lengths and accuracy of the train batch (verl names)."""
    s, r = batch.scored, batch.scored.rollout
    valid = r.action_mask.bool()
    lengths = r.lengths.float()
    out = {
        "critic/score/mean": s.scores.mean().item(),
        "critic/score/max": s.scores.max().item(),
        "critic/score/min": s.scores.min().item(),
        **_spread("critic/advantages", batch.advantages[valid]),
        "response_length/mean": lengths.mean().item(),
        "response_length/median": lengths.median().item(),
        "response_length/max": lengths.max().item(),
        "response_length/clip_ratio": r.truncated.float().mean().item(),
        "train/acc": s.acc.float().mean().item(),
        "train/reward_failed": s.failed.float().sum().item(),
        "perf/total_num_tokens": int(r.prompt_mask.sum().item() + r.response_mask.sum().item()),
    }
    if batch.returns is not None:
        out["critic/returns/mean"] = _spread("", batch.returns[valid])["/mean"]
        out["critic/values/mean"] = _spread("", batch.values[valid])["/mean"]
    return out


def _spread(name: str, values: torch.Tensor) -> dict[str, float]:
    """``name/mean``, ``/max`` and ``/min`` of ``values``; 0 for none (a batch whose every
    episode failed has no policy token)."""
    if values.numel() == 0:
        return {f"{name}/{k}": 0.0 for k in ("mean", "max", "min")}
    return {f"{name}/mean": values.mean().item(), f"{name}/max": values.max().item(), f"{name}/min": values.min().item()}


def spread_rows(group_ids: list[int], limit: int) -> list[int]:
    """Up to ``limit`` row indices, the first sample of every group before any group's second
    (distinct prompts first), in batch order within each round."""
    seen: dict[int, int] = defaultdict(int)
    ranked = []
    for row, group in enumerate(group_ids):
        ranked.append((seen[group], row))
        seen[group] += 1
    return [row for _, row in sorted(ranked)[:limit]]


def logger_samples(records: list[dict], limit: int, first_of_each: bool = False) -> list[Sample]:
    """Up to ``limit`` records as the loggers' Samples; ``first_of_each``: only each prompt's
    first sampled (not greedy) one (validation records come k to a prompt, then the greedy ones)."""
    chosen = [r for r in records if r["sample"] == 0 and not r.get("greedy")] if first_of_each else records
    return [Sample(r["prompt"], r["response"], r["score"], r["correct"]) for r in chosen[:limit]]


def reward_extras(scored: ScoredBatch) -> dict[str, float]:
    """``reward/<field>``: the batch mean of each numeric field the reward breakdowns hold
    (a reward function's extra fields, ``format``, ``overlong_penalty``), over the rows that
    have it."""
    sums: dict[str, list[float]] = defaultdict(list)
    for extras in scored.extras:
        for key, value in extras.items():
            if isinstance(value, (int, float)):
                sums[key].append(float(value))
    return {f"reward/{key}": sum(v) / len(v) for key, v in sorted(sums.items())}


class _StopFlag:
    """Set by SIGINT or SIGTERM: the run checkpoints after the current step and ends.
    ``signum`` is the first such signal; a second SIGINT interrupts at once (KeyboardInterrupt)."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous = {}
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._handle) for s in self.SIGNALS}

    def _handle(self, signum, frame) -> None:
        if self.signum is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        if self.signum is None:
            self.signum = signum
            print(f"\nreasonrl: {signal.Signals(signum).name}: stopping after this step, with a checkpoint "
                  "(press Ctrl-C again to stop at once)", file=sys.stderr, flush=True)

    def restore(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
