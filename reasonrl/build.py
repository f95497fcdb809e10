"""Build a run's roles from its Config, every role through the topology.

    cfg, run = open_run(cfg)                              # the run directory locked, events, faults
    roles = build(cfg, plan(cfg), run, log)               # every worker where the topology puts it
    controller = Controller(roles, cfg, log)              # the loop over them (Controller.from_config: all three)

The rollout side is one path in every mode: an :class:`~reasonrl.rollout.source.AsyncSource`
whose producer (sampler, scheduler, prompt records, reward grading) runs on a thread of this
process and dispatches each generation batch's groups to ``runtime.roles.rollout.count``
rollout workers (:class:`~reasonrl.rollout.fleet.RolloutFleet`), spawned where the topology
puts them: threads sharing the policy's module, processes or Ray actors with weights of their
own. ``rollout.mode=sync`` is lockstep at staleness 0. Faults act through wrappers that
:func:`~reasonrl.runtime.topology.spawn` applies where each worker runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

import torch

from reasonrl.config import Config
from reasonrl.config.rules import validation_backend
from reasonrl.data.mixing import check_sources
from reasonrl.data.splits import tokenize_prompts
from reasonrl.env.splits import run_splits
from reasonrl.evaluation import Evaluator
from reasonrl.loggers import check_loggers
from reasonrl.metrics import EventLog
from reasonrl.models.loading import load_tokenizer, model_context
from reasonrl.resilience.collectives import TRACE_DIR, RankMonitor, launch_ranks
from reasonrl.resilience.faults import FaultPlan, parse_faults
from reasonrl.resilience.guards import SlowdownDetector, SpikeDetector, run_detectors
from reasonrl.resilience.injection import WorkerFaults, unwrapped
from reasonrl.resilience.rundir import RunLock, check_run_dir
from reasonrl.restarts import RestartPolicy
from reasonrl.rollout.fleet import FLEET_CONCURRENT, RolloutFleet
from reasonrl.rollout.source import AsyncSource, RolloutProducer
from reasonrl.rollout.weight_sync import WeightSender, sync_dtype
from reasonrl.runtime import WorkerDied, WorkerTimeout, available_cores, setup_torch
from reasonrl.runtime.group import ThreadGroup
from reasonrl.runtime.scaling import ScaleSchedule, scaled
from reasonrl.runtime.topology import Topology, pool_start, rank_threads, reset_start, spawn, worker_args
from reasonrl.types import Prompt
from reasonrl.warmstart import resolve_model_dir
from reasonrl.workers import CriticWorker, PolicyWorker, ReferenceWorker, RewardWorker, RolloutWorker


@dataclass
class RunContext:
    """A run's house, opened before its roles are built (:func:`open_run`): its directory and
    that directory's lock, its events, fault plan and detectors (spikes, fail-slow), and the
    steps done so far (``done``, the controller's count: :meth:`clock` is the step being run,
    1-based; :meth:`emit` logs an event at ``done``)."""

    run_dir: Path
    lock: RunLock
    events: EventLog
    faults: FaultPlan
    spikes: SpikeDetector
    slow: SlowdownDetector
    done: int = 0

    def emit(self, kind: str, **fields: Any) -> None:
        self.events.emit(kind, self.done, **fields)

    def clock(self) -> int:
        return self.done + 1


def open_run(cfg: Config) -> tuple[Config, RunContext]:
    """Check the loggers and the run directory, lock it (one trainer per directory), and open
    the run: its events, fault plan and detectors. Returns the config with the counts
    ``reasonrl scale`` asked for (:func:`~reasonrl.runtime.scaling.scaled`) and the context;
    nothing is written to the directory until the controller's resume check has passed."""
    check_loggers(cfg.run.loggers)
    run_dir = Path(cfg.run.dir)
    check_run_dir(run_dir)
    lock = RunLock(run_dir, "trainer").acquire()
    try:
        cfg = scaled(cfg, run_dir)
        spikes, slow = run_detectors(cfg.resilience, events := EventLog(run_dir))
        return cfg, RunContext(run_dir, lock, events, parse_faults(list(cfg.faults)).bind(run_dir), spikes, slow)
    except BaseException:
        lock.release()
        raise


@dataclass
class Roles:
    """A run's workers and the data they were built for.

    run: the run they were built for; policy: the trainer ranks (rank 0 first); rank0: rank
    0's PolicyWorker in this process; reference, critic: their groups or None; source: the
    rollout side; evaluator: validation; rank_monitor: names slow or stuck ranks (several
    ranks); train: the training prompts."""

    run: RunContext
    topology: Topology
    model_dir: Path
    tokenizer: Any
    train: list[Prompt]
    policy: Any
    rank0: PolicyWorker
    reference: Any
    critic: Any
    source: AsyncSource
    evaluator: Evaluator
    rank_monitor: RankMonitor | None = None
    closers: list[Callable[[], None]] = field(default_factory=list)

    def close(self) -> None:
        """Stop the rollout side, the validation workers and every group (twice is harmless)."""
        self.source.close()
        self.evaluator.rollout.close()
        self.evaluator.reward.close()
        for group in (self.policy, self.reference, self.critic):
            if group is not None:
                group.close()
        while self.closers:
            self.closers.pop()()


def build(cfg: Config, topology: Topology, run: RunContext, log=print) -> Roles:
    """Every role of ``cfg`` where ``topology`` puts it (see the module docstring), torch's
    generator seeded from ``run.seed`` first."""
    torch.manual_seed(cfg.run.seed)
    setup_torch(topology["policy"].threads or cfg.run.threads, cfg.run.deterministic)
    model_dir = resolve_model_dir(cfg, log)
    tokenizer = load_tokenizer(model_dir)
    splits = run_splits(cfg, reset_start(cfg))
    log(f"data: {splits.description}")
    context = model_context(model_dir)
    train = tokenize_prompts(splits.train, tokenizer, cfg, context, splits.train_from)
    test = tokenize_prompts(splits.test, tokenizer, cfg, context, splits.test_from, held_out=True)
    for note in (train.note(splits.train_from), test.note(splits.test_from)):
        if note:
            log(f"data: {note}")
    if cfg.data.mix == "adaptive":  # before anything starts: the producer builds its prompt pool later
        check_sources([p.data_source for p in train.prompts], cfg.data.mix_floor)
    closers: list[Callable[[], None]] = []
    reservation = None
    if topology.engine == "ray":
        cluster, reservation = ray_reservation(cfg, topology, model_dir)
        closers += [cluster.close, reservation.close]
    try:
        faults = WorkerFaults(run.faults, run.clock)
        world = cfg.runtime.trainer_ranks
        monitor = None
        if world > 1:  # rank 0 here, the others beside it
            policy_group = launch_ranks(cfg, model_dir, run.run_dir, reservation=reservation)
            rank0 = policy_group.local
            setup_torch(rank_threads(cfg), cfg.run.deterministic)
            monitor = RankMonitor(run.run_dir / TRACE_DIR, world, run.events, cfg.resilience, cfg.runtime)
        else:  # rank 0 inline: the wrapped worker takes the calls, the module is rank 0's own
            policy_group = spawn(topology["policy"], PolicyWorker, [(cfg, model_dir)], wrap=faults)
            rank0 = unwrapped(policy_group.workers[0])
        reference = critic = None
        if "reference" in topology:
            reference = spawn(topology["reference"], ReferenceWorker, [(cfg, model_dir)], wrap=faults,
                              reservation=reservation)
        if "critic" in topology:
            critic = spawn(topology["critic"], CriticWorker, [(cfg, model_dir)], wrap=faults, reservation=reservation)
        source = _rollout_source(cfg, topology, run, model_dir, rank0, train.prompts, train.ids, tokenizer.pad_token_id,
                                 reservation, faults)
        evaluation = RolloutWorker(_colocated(cfg), model_dir, module=rank0.module,
                                   env_workers=_env_workers(topology, 0, run.emit, reservation))
        validation_rewards = pool_start(topology["reward"], part=1, reservation=reservation, emit=run.emit)
        evaluator = Evaluator(cfg, evaluation, RewardWorker(cfg, model_dir, validation_rewards), test.prompts, test.ids)
    except BaseException:
        for close in reversed(closers):
            close()
        raise
    return Roles(run, topology, model_dir, tokenizer, train.prompts, policy_group, rank0, reference, critic, source,
                 evaluator, monitor, closers)


def _rollout_source(cfg: Config, topology: Topology, run: RunContext, model_dir: Path, rank0: PolicyWorker,
                    prompts: list[Prompt], ids: list[list[int]], pad_id: int, reservation, faults: WorkerFaults
                    ) -> AsyncSource:
    """The rollout side: on :meth:`AsyncSource.publish`'s first call, the rollout workers are
    spawned, the fleet and the producer built, the producer hosted on a thread of its own."""
    role, rollout_role = topology["rollout"], cfg.runtime.roles.rollout

    def args(index: int) -> tuple:
        """Rollout worker ``index``'s: its environment workers are pool ``index + 1``."""
        if role.where == "thread":
            return cfg, model_dir, rank0.module, 0, _env_workers(topology, index + 1, run.emit, reservation)
        # the events of environment workers in another process have no way back
        return cfg, model_dir, None, role.threads, _env_workers(topology, index + 1, None, reservation)

    def launch() -> ThreadGroup:
        workers = spawn(role, build_rollout_worker, [args(i) for i in range(role.count)], concurrent=FLEET_CONCURRENT,
                        wrap=faults, reservation=reservation)
        try:
            probe = workers.submit_to(0, "capabilities").result(timeout=role.timeout_s)
            sender = None if role.where == "thread" else WeightSender(sync_dtype(cfg))  # threads share the module
            fleet = RolloutFleet(workers, pad_id=pad_id, streams=probe["streams"], episodic=probe["episodic"],
                                 timeout_s=role.timeout_s, restarts=RestartPolicy(budget=cfg.resilience.rollout_restarts),
                                 group_retries=cfg.rollout.group_retries, failures=(WorkerDied, WorkerTimeout),
                                 quarantine_ratio=rollout_role.quarantine_ratio,
                                 quarantine_steps=rollout_role.quarantine_steps,
                                 quarantine_min_s=cfg.resilience.slow_min_s,
                                 detector=run.slow, clock=run.clock, emit=run.emit,
                                 new_worker=lambda i: worker_args(i, args(i)), sender=sender)
            reward = faults(RewardWorker(cfg, model_dir, pool_start(topology["reward"], reservation=reservation,
                                                                    emit=run.emit)), "reward", 0)
            producer = RolloutProducer(cfg, fleet, reward, prompts, ids, pad_id, sizes=ScaleSchedule(cfg.run.dir).count)
        except BaseException:
            workers.close()
            raise
        return ThreadGroup(_hosted, [(producer,)], name="rollout producer", timeout_s=role.timeout_s,
                           concurrent=("offer_weights", "stage_weights", "pids", "resize"))

    return AsyncSource(
        launch, rank0.weights(), n=cfg.rollout.n, pad_id=pad_id, want=cfg.train.prompts_per_step,
        max_staleness=cfg.rollout.max_staleness, lockstep=cfg.rollout.mode in ("lockstep", "sync"),
        timeout_s=role.timeout_s, emit=run.emit,
    )


def _hosted(worker: Any) -> Any:
    """A worker built elsewhere, hosted as it is (a ThreadGroup's factory)."""
    return worker


def build_rollout_worker(cfg: Config, model_dir: Path, module, threads: int, env_workers) -> RolloutWorker:
    """Rollout worker built where it runs: over the policy's own ``module`` (a thread of the
    controller's process), or with weights of its own and torch set to ``threads`` threads
    (a process or a Ray actor); ``env_workers`` starts its environment workers there."""
    if module is None:
        setup_torch(threads, cfg.run.deterministic)
    return RolloutWorker(cfg, model_dir, module=module, env_workers=env_workers)


def _env_workers(topology: Topology, part: int, emit: Callable[..., None] | None, reservation):
    """How a rollout worker starts its environment workers, pool ``part`` of the env role
    (0: validation's, ``i + 1``: rollout worker ``i``'s; on Ray each in its bundles of
    ``reservation``); None: no env, or envs in the rollout worker's own process. Their
    restarts go to ``emit``."""
    return pool_start(topology["env"], part=part, emit=emit, reservation=reservation) if "env" in topology else None


def ray_reservation(cfg: Config, topology: Topology, model_dir: Path):
    """(cluster, reservation) for runtime.engine=ray: :func:`~reasonrl.runtime.ray.connect`
    (join runtime.ray_address, or start a loopback-only local cluster whose object store
    holds two versions of the weights), then one bundle per actor of the topology's Ray roles
    (``runtime.roles.<role>.cpus``, ``.gpus``, ``.colocate``), reserved or a LimitError within
    seconds. The policy's rank 0 is this process."""
    from reasonrl.runtime.placement import parse_placement
    from reasonrl.runtime.ray import Reservation, connect

    actors = topology.ray_actors()
    mapping = {}
    for name in actors:
        role = topology[name]
        mapping[name] = {"cpus": role.cpus, "gpus": role.gpus, **({"colocate": role.colocate} if role.colocate else {})}
    plan = parse_placement(mapping).plan(actors)
    cpus, object_store = local_cluster_size(cfg, topology, model_dir)
    cluster = connect(cfg.runtime, max(cpus, available_cores()), object_store_bytes=object_store)
    try:
        return cluster, Reservation(plan, timeout_s=30.0)
    except BaseException:
        cluster.close()
        raise


def local_cluster_size(cfg: Config, topology: Topology, model_dir: Path) -> tuple[int, int]:
    """(CPUs, object store bytes) a local Ray cluster offers one run of ``cfg``: a CPU per actor
    of its Ray roles (Ray's CPUs are logical: more actors than cores share the cores, as
    processes would), and room for two versions of the weights. A joined cluster has its own."""
    from reasonrl.memory import DTYPE_BYTES, ModelShape
    from reasonrl.runtime.ray import OBJECT_STORE_BYTES

    weights = ModelShape.from_model_dir(model_dir).parameters() * DTYPE_BYTES[cfg.model.dtype]
    return sum(topology.ray_actors().values()), max(OBJECT_STORE_BYTES, 2 * weights + (64 << 20))


def _colocated(cfg: Config) -> Config:
    """The config of the validation rollout worker beside the policy: :func:`validation_backend`
    (the fast backend, or transformers for a model it does not support, never a second vLLM
    engine); nothing interrupts it (it shares the policy's module)."""
    return replace(cfg, rollout=replace(cfg.rollout, backend=validation_backend(cfg), interrupt=False))
