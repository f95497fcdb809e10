"""The controller: runs ``step()`` over a run's roles in data-flow order.

    prompts -> rollout -> reward -> filter -> queue -> logprobs -> advantages -> update -> publish
    source     RolloutWorker RewardWorker keep_groups  PolicyWorker  algo.*      Critic/Policy  weights()

The workers (policy, reference, critic, rollout, reward) own their modules and state and are
built where the topology puts them (:mod:`reasonrl.build`); the controller holds none of them
directly, only their groups (:mod:`reasonrl.runtime`), the rollout source
(:mod:`reasonrl.rollout.source`), the guards and the registry of what a checkpoint holds. ``run()`` adds validation, metrics, the
forecast of held-out accuracy after each validation (:mod:`reasonrl.experiments.forecast`),
checkpoints (resume, rollback) and the final export.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections import defaultdict
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import torch

from reasonrl import algo
from reasonrl.build import Roles, build, open_run
from reasonrl.checkpoint import ProcessRNG, StateRegistry, find_latest
from reasonrl.checkpoint.checkpointer import Checkpointer, data_fingerprint
from reasonrl.checkpoint.snapshot import SnapshotStore
from reasonrl.config import Config, dump
from reasonrl.data.mixing import held_out_accuracy
from reasonrl.errors import LimitError, WriteError
from reasonrl.experiments.forecast import RunForecast
from reasonrl.loggers import open_loggers
from reasonrl.memory import PeakMemory
from reasonrl.metrics import MetricsSink, Sample, StepLog, console_fields, logging_step, read_jsonl, timed
from reasonrl.resilience.ettr import effective_time, step_seconds
from reasonrl.resilience.guards import NonFiniteGuard, StageWatchdog
from reasonrl.resilience.injection import FaultyHeartbeat, checkpoint_writer
from reasonrl.resilience.rundir import snapshot_dir
from reasonrl.rollout.agent_loop import AgentLoop
from reasonrl.runtime import WorkerTimeout
from reasonrl.runtime.scaling import IdleRule, ScaleWatch, request_scale
from reasonrl.runtime.topology import Topology, plan
from reasonrl.samples import sample_records
from reasonrl.trainer.update import sampler_gap
from reasonrl.types import ScoredBatch, TrainBatch
from reasonrl.workers import trainer_numerics


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


class Controller:
    """Trains a run's roles to ``train.total_steps`` (``run()``): the loop, its guards and the
    registry of what a checkpoint holds, over the workers :func:`reasonrl.build.build` placed.

        controller = Controller.from_config(cfg)     # open the run, build its roles, then this
        controller.run()

    The run directory is locked for the controller's life (one trainer per directory, taken
    by :func:`~reasonrl.build.open_run`) and nothing is written to it until the resume check
    has passed: a refused resume leaves the directory as it was. ``close()`` releases
    everything.
    """

    def __init__(self, roles: Roles, cfg: Config, log=print) -> None:
        self.cfg, self.log, self.roles = cfg, log, roles
        run = self.run_context = roles.run
        self.run_dir, self.lock, self.events, self.faults = run.run_dir, run.lock, run.events, run.faults
        self.spikes, self.slow = run.spikes, run.slow
        self.version = 0
        """The policy version the next batch is trained from (the last one published)."""
        self.stopped_by: int | None = None
        """The signal (SIGINT, SIGTERM) that stopped ``run()`` early, if one did."""
        self.stop_flag = _StopFlag()
        """Set by SIGINT or SIGTERM while :meth:`run` runs, or by :meth:`request_stop`."""
        r = cfg.resilience
        self.nonfinite = NonFiniteGuard(r.nonfinite_max_consecutive, self.events)
        self.peak_memory = PeakMemory(cfg.run.device)
        self.watchdog = self.heartbeat = None
        self.last_record: dict[str, list] = {}
        """The prompt record of the last step (``prompts.jsonl``): draws made, trained, stale."""
        self.last_samples: list[dict] = []
        """Sample records of the last step's batch (:mod:`reasonrl.samples`)."""
        self.val_samples: list[dict] = []
        """Sample records of the last validation, every one."""
        self.topology = roles.topology
        self.model_dir, self.tokenizer = roles.model_dir, roles.tokenizer
        self.pad_id = self.tokenizer.pad_token_id
        self.fingerprint = data_fingerprint(roles.train)
        self.policy, self.reference, self.critic = roles.policy, roles.reference, roles.critic
        self.source, self.evaluator = roles.source, roles.evaluator
        self.rank_monitor = roles.rank_monitor
        """Names a slow or stuck trainer rank from the collectives' trace (several ranks)."""
        self.trainer_numerics = trainer_numerics(cfg)
        registry = StateRegistry()
        where = snapshot_dir() if r.snapshot_every > 0 else None
        self.checkpoints = Checkpointer(cfg, self.run_dir, registry, checkpoint_writer(
            self.run_dir / "checkpoints", cfg.checkpoint.keep, self.faults), self.events, self.fingerprint, log,
            beat=self._beat, initial=str(self.model_dir), snapshots=None if where is None else SnapshotStore(where))
        """Save, resume, roll back, snapshot (under a supervisor); its state (the config check) is
        the first the registry restores."""
        self._register(registry)

    @classmethod
    def from_config(cls, cfg: Config, log=print, topology: Topology | None = None) -> Controller:
        """Open the run (:func:`~reasonrl.build.open_run`: the directory checked and locked),
        build its roles where ``topology`` (default: :func:`~reasonrl.runtime.topology.plan`
        of the config) puts them, and return the controller over them; whatever was started
        is closed again if a step of that fails."""
        cfg, run = open_run(cfg)
        try:
            roles = build(cfg, topology or plan(cfg), run, log)
            try:
                return cls(roles, cfg, log)
            except BaseException:
                roles.close()
                raise
        except BaseException:
            run.lock.release()
            raise

    @property
    def step_count(self) -> int:
        """Steps done (the run's count, which its workers' clock reads)."""
        return self.run_context.done

    @step_count.setter
    def step_count(self, done: int) -> None:
        self.run_context.done = done

    def prepare(self) -> None:
        """Start what may start before the resume: the rollout workers (a standby trainer does
        this before its go, so that a restart does not wait for them)."""
        self.source.prepare()

    def _beat(self, stage: str) -> None:
        if self.watchdog is not None:
            self.watchdog.beat(stage)

    def _register(self, registry: StateRegistry) -> None:
        """What a checkpoint holds besides the run's own state, in restore order."""
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
            scored, metrics = got.scored, dict(got.metrics)
            self.last_record = got.record
            if got.errors:  # an episode's errors are its environment's, which was replaced
                kind = "env_failed" if cfg.env.name else "reward_failed"
                self.events.emit(kind, step, samples=len(got.errors), errors=got.errors[:3])
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
        metrics.update(self.source.weight_sync)
        metrics["perf/throughput"] = metrics["perf/total_num_tokens"] / t["timing_s/step"]
        metrics["perf/max_memory_gb"] = self.peak_memory.peak_gb()
        self.last_samples = self.samples(step, scored)
        metrics.update(reward_extras(scored))
        if scored.rollout.episodes is not None:
            metrics.update(AgentLoop.stats(scored.rollout))
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
            self.checkpoints.updates_applied += 1
        spiked = [name for name in ("grad_norm", "loss") if self.spikes.update(f"actor/{name}", step, actor[name])]
        if verdict == "rollback" or (spiked and self.cfg.resilience.spike_rollback):
            self.checkpoints.rollback(step, "non-finite updates" if verdict == "rollback" else f"spike in {', '.join(spiked)}")

    def advantages(self, scored, mask: torch.Tensor, values: torch.Tensor | None):
        """(advantages [B, T], returns [B, T] or None) of algo.adv_estimator
        (:data:`reasonrl.algo.ESTIMATORS`), zero outside ``mask``."""
        a, rollout = self.cfg.algo, scored.rollout
        inputs = algo.AdvantageInputs(scored.scores, rollout.group_ids, rollout.action_mask, mask,
                                      rollout.token_rewards, values, a.gamma, a.lam)
        return algo.ESTIMATORS[a.adv_estimator](inputs)

    def learning_rate(self, step: int) -> float:
        """Linear warmup over train.warmup_steps, then constant."""
        t = self.cfg.train
        return t.lr * min(1.0, step / t.warmup_steps) if t.warmup_steps else t.lr

    def validate(self) -> dict[str, float]:
        """Held-out accuracy of the current weights (:class:`~reasonrl.evaluation.Evaluator`);
        its sample records are kept in ``val_samples``, and with data.mix=adaptive its
        per-source accuracies (``val/acc/<source>``) go to the prompt pool's mix."""
        metrics = self.evaluator.run(self.step_count)
        self.val_samples = self.evaluator.last_samples
        if self.cfg.data.mix == "adaptive":
            self.source.observe_held_out(held_out_accuracy(metrics))
        return metrics

    def request_stop(self, signum: int = signal.SIGTERM) -> None:
        """End :meth:`run` after the current step with a checkpoint, as ``signum`` would
        (``stopped_by`` then says it): from another thread, where no signal handler can be
        installed (a run trained inside a Ray actor's call)."""
        self.stop_flag.request(signum)

    # ---------------------------------------------------------------- run
    def run(self, on_step: Callable[[int, dict[str, Any]], None] | None = None) -> dict[str, float]:
        """Train to train.total_steps, resuming from the newest committed checkpoint; return
        the last step's metrics with those of the last validation.

        ``on_step(step, metrics)`` is called with each row written to ``metrics.jsonl`` (a copy;
        the step-0 validation's too), once the step's checkpoint, if one is due, is written: an
        exception it raises ends the run there. SIGINT or SIGTERM ends it after the current step
        with a checkpoint (``stopped_by`` says which; a second SIGINT interrupts at once). A file
        of the run that cannot be written (a full disk) ends it with a WriteError
        (:meth:`stop_writing`). A run that never applied an update (every step skipped or rolled
        back) is a LimitError and exports nothing."""
        cfg = self.cfg
        self.lock.claim()  # a standby trainer built ahead holds the lock unnamed until now
        try:
            self.step_count = self.checkpoints.resume()
            resumed = self.checkpoints.resumed_from is not None
            dump(cfg, self.run_dir / "config.yaml")  # only now: a refused resume writes nothing
            self.checkpoints.emit_resume(self.step_count)
            self.publish()  # the rollout side starts from the trainer's weights
            sink = MetricsSink(self.run_dir, cfg.train.total_steps, progress=cfg.run.progress,
                               log_every=cfg.run.log_every, loggers=open_loggers(cfg, self.run_dir),
                               fields=console_fields(cfg.rollout.mode))
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
        kept = read_jsonl(self.run_dir / "metrics.jsonl")
        step_s = step_seconds(kept)
        forecasts = RunForecast(kept, cfg.train.total_steps, cfg.eval.target)
        stop = self.stop_flag
        stop.install()
        scale, idle_rule = ScaleWatch(self.run_dir, cfg), IdleRule(cfg)
        start = time.time()
        last_checkpoint = self.checkpoints.catch_up(self.step_count, start)
        snapshot_every = cfg.resilience.snapshot_every
        last: dict[str, float] = {}
        saved = self.step_count  # the step of the last checkpoint written or tried
        stepping = False  # inside step(): its state is not one to checkpoint
        self.watchdog, self.heartbeat = self._heartbeat()
        try:
            if self.step_count == 0 and cfg.eval.every_steps:
                with self.stage(t := {}, "testing"):
                    last = self.validate()
                    last.update(forecasts.observe(0, last))
                row = {**last, **t, "time": time.time() - start}
                sink.log(0, row)
                self.keep_samples(0, sink, samples, [], self.val_samples)
                if on_step is not None:
                    on_step(0, row)
            # A stop signal is read once per step, where the step's checkpoint is decided: one that comes
            # later (during the checkpoint or on_step) ends the run after the next step, with its checkpoint.
            stopping = bool(stop.signum)
            while self.step_count < cfg.train.total_steps and not stopping:
                self.rescale(scale.poll(), idle_rule)
                stepping = True
                metrics = self.step()
                stepping = False
                every = cfg.eval.every_steps
                if every and (self.step_count % every == 0 or self.step_count == cfg.train.total_steps):
                    with self.stage(metrics, "testing"):  # the validation and its forecast
                        metrics.update(self.validate())
                        metrics.update(forecasts.observe(self.step_count, metrics))
                else:
                    forecasts.observe(self.step_count, metrics)  # counts the step's samples
                step_s[self.step_count] = metrics["timing_s/step"]
                wanted = idle_rule.observe(metrics.get("timing_s/trainer_idle", 0.0), metrics["timing_s/step"])
                if wanted is not None:  # through scale.json, as reasonrl scale: a restart keeps it
                    request_scale(self.run_dir, {"rollout": wanted})
                metrics["time"] = time.time() - start
                metrics.update(self.effective_time(step_s))
                sink.log(self.step_count, metrics)
                self.keep_samples(self.step_count, sink, samples, self.last_samples,
                                  self.val_samples if "val/acc" in metrics else [])
                prompts.log(self.step_count, self.last_record)
                last.update(metrics)
                stopping = bool(stop.signum)
                due = self.checkpoints.due(self.step_count, last_checkpoint) or stopping
                if snapshot_every and self.step_count % snapshot_every == 0:  # before the checkpoint it may outlive
                    self.checkpoints.snapshot(self.step_count, last_checkpoint, due)
                if due:
                    saved = self.step_count
                    self.checkpoints.save(self.step_count, final=self.step_count == cfg.train.total_steps)
                    last_checkpoint = time.time()
                if on_step is not None:
                    on_step(self.step_count, dict(metrics))
            if self.step_count >= cfg.train.total_steps:
                self.events.emit("rollout_leftover", self.step_count, **self.source.leftover())
        except WriteError as err:
            # Not at the last step: a rerun that finds the run complete would never export final/.
            done = not stepping and saved < self.step_count < cfg.train.total_steps
            raise self.stop_writing(err, checkpoint=done) from err
        finally:
            if self.heartbeat is not None:
                self.heartbeat.stop()
            self.watchdog = self.heartbeat = None
            self.stopped_by = stop.signum
            stop.restore()
            try:
                sink.close()
            finally:
                prompts.close()
                if samples is not None:
                    samples.close()
                self.close()
        if self.step_count >= cfg.train.total_steps:
            if self.checkpoints.updates_applied == 0:
                raise LimitError(
                    f"{self.run_dir}: no update was applied in {self.step_count} steps (every one was skipped as "
                    f"non-finite or rolled back; see {self.events.path}); final/ is not exported. Check train.lr, "
                    "train.grad_clip and the reward function")
            self.roles.rank0.export(self.run_dir / "final")  # in this process: the groups are closed by now
        return last

    def stop_writing(self, err: WriteError, checkpoint: bool) -> WriteError:
        """A file of the run could not be written (a full disk): save a checkpoint of the step
        done when ``checkpoint`` (not in the middle of a step, none tried at it yet, not the
        last), log a ``write_failed`` event (``path``, ``disk``, ``cause``), both where the disk
        lets them, and return the error to end the run with, saying what a rerun resumes from.
        What that step could not write (its metrics row, samples) stays missing from the files."""
        step = self.step_count
        if checkpoint:
            try:
                self.checkpoints.save(step, final=False)
            except WriteError:
                pass  # its checkpoint_failed event met the same disk; find_latest says what stands
        try:
            self.events.emit("write_failed", step, path=err.filename, disk=err.disk, cause=err.cause)
        except WriteError:
            pass  # the event log is on that disk too: the error says it all
        latest = find_latest(self.checkpoints.root) if self.checkpoints.root.exists() else None
        resumes = f"a rerun resumes from {latest}" if latest else "no checkpoint was written, so a rerun starts over"
        return err.noted(f"the run stopped at step {step} and {resumes}; free space on {err.disk} and run "
                         "the same command again")

    def rescale(self, counts: dict[str, int], rule: IdleRule) -> None:
        """Apply the rollout count ``reasonrl scale`` (or ``rule``) asked for, before the next
        step (a ``rollout_scaled`` event at that step; the fleet grows or shrinks beside the steps)."""
        if "rollout" in counts:
            self.source.resize(counts["rollout"])
            rule.scaled_to(counts["rollout"])
            self.events.emit("rollout_scaled", self.step_count + 1, workers=counts["rollout"])
        if "reward" in counts:
            live = counts["reward"] >= 1 and self.cfg.runtime.roles.reward.count >= 1
            if live:
                self.source.resize_reward(counts["reward"])
            self.events.emit("reward_scaled" if live else "scale_deferred", self.step_count + 1, role="reward",
                             workers=counts["reward"])

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

    def _heartbeat(self):
        """(watchdog, stage heartbeat): the hang watchdog (``resilience.hang_timeout_s``), and
        the heartbeat of a step's stages, the watchdog wrapped when the fault plan has stage
        faults. A checkpoint beats the watchdog only: it is no stage of the step in progress."""
        r = self.cfg.resilience
        watchdog = StageWatchdog(r.hang_timeout_s, self.run_dir / "hang_dump.txt") if r.hang_timeout_s > 0 else None
        if any(f.kind in ("crash", "sigkill", "hang") for f in self.faults.faults):
            return watchdog, FaultyHeartbeat(watchdog, self.faults, self.run_context.clock)
        return watchdog, watchdog

    def close(self) -> None:
        """Stop every role (:meth:`Roles.close`), release the run directory (closing twice is
        harmless)."""
        self.roles.close()
        self.lock.release()

    def effective_time(self, step_s: dict[int, float]) -> dict[str, float]:
        """``ettr``, ``time_lost_s`` and ``mttr_s`` so far (:mod:`reasonrl.resilience.ettr`)."""
        figures = effective_time(read_jsonl(self.events.path) if self.events.path.exists() else [], step_s)
        return {"ettr": figures["ettr"], "time_lost_s": figures["lost_s"], "mttr_s": figures["mttr_s"]}

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
    """Set by SIGINT or SIGTERM while installed (:meth:`install`, in the main thread), or by
    :meth:`request` from any thread: the run checkpoints after the current step and ends.
    ``signum`` is the first such signal; a second SIGINT interrupts at once (KeyboardInterrupt)."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous = {}

    def install(self) -> None:
        """Handle SIGINT and SIGTERM until :meth:`restore` (in the main thread only: elsewhere
        only :meth:`request` sets the flag)."""
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._handle) for s in self.SIGNALS}

    def _handle(self, signum, frame) -> None:
        if self.signum is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.request(signum)

    def request(self, signum: int) -> None:
        """Stop after this step, as ``signum`` would (the first request counts)."""
        if self.signum is None:
            self.signum = signum
            print(f"\nreasonrl: {signal.Signals(signum).name}: stopping after this step, with a checkpoint "
                  "(press Ctrl-C again to stop at once)", file=sys.stderr, flush=True)

    def restore(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
