"""Build a run's roles from its Config, every role through the topology.

    topology = plan(cfg)                                  # where each role runs
    roles = build(cfg, topology, run, log)                # the workers, the rollout source, validation
    controller = Controller(cfg, log, topology)           # locks the run, builds its roles, holds the loop

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

from reasonrl.config import Config
from reasonrl.config.rules import validation_backend
from reasonrl.data.mixing import check_sources
from reasonrl.data.splits import tokenize_prompts
from reasonrl.env.splits import run_splits
from reasonrl.evaluation import Evaluator
from reasonrl.models.loading import load_tokenizer, model_context
from reasonrl.resilience.collectives import TRACE_DIR, RankMonitor, launch_ranks
from reasonrl.resilience.faults import FaultPlan
from reasonrl.resilience.guards import SlowdownDetector
from reasonrl.resilience.injection import FaultyPolicy, FaultyRewards, WorkerFaults
from reasonrl.restarts import RestartPolicy
from reasonrl.rollout.fleet import FLEET_CONCURRENT, RolloutFleet
from reasonrl.rollout.source import AsyncSource, RolloutProducer
from reasonrl.rollout.weight_sync import WeightSender, sync_dtype
from reasonrl.runtime import LocalGroup, WorkerDied, WorkerTimeout, available_cores, setup_torch
from reasonrl.runtime.group import ThreadGroup
from reasonrl.runtime.topology import Topology, pool_start, rank_threads, reset_start, spawn, worker_args
from reasonrl.runtime.scaling import ScaleSchedule
from reasonrl.types import Prompt
from reasonrl.warmstart import resolve_model_dir
from reasonrl.workers import CriticWorker, PolicyWorker, ReferenceWorker, RewardWorker, RolloutWorker


@dataclass
class RunContext:
    """What building needs from the run: its directory, events, fault plan, the fail-slow
    detector and the controller's step clock (the step being run, 1-based)."""

    run_dir: Path
    emit: Callable[..., None]
    faults: FaultPlan
    slow: SlowdownDetector
    clock: Callable[[], int]
    events: Any = None


@dataclass
class Roles:
    """A run's workers and the data they were built for.

    policy: the trainer ranks (rank 0 first); rank0: rank 0's PolicyWorker in this process;
    reference, critic: their groups or None; source: the rollout side; evaluator: validation;
    rank_monitor: names slow or stuck ranks (several ranks); train: the training prompts."""

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
    """Every role of ``cfg`` where ``topology`` puts it (see the module docstring)."""
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
        kinds = {f.kind for f in run.faults.faults}
        world = cfg.runtime.trainer_ranks
        monitor = None
        if world > 1:  # rank 0 here, the others beside it
            policy_group = launch_ranks(cfg, model_dir, run.run_dir, reservation=reservation)
            rank0 = policy_group.local
            setup_torch(rank_threads(cfg), cfg.run.deterministic)
            monitor = RankMonitor(run.run_dir / TRACE_DIR, world, run.events, cfg.resilience, cfg.runtime)
        else:
            rank0 = PolicyWorker(cfg, model_dir)
            policy_group = LocalGroup([FaultyPolicy(rank0, run.faults, run.clock) if "nan" in kinds else rank0])
        reference = critic = None
        if "reference" in topology:
            reference = spawn(topology["reference"], ReferenceWorker, [(cfg, model_dir)], reservation=reservation)
        if "critic" in topology:
            critic = spawn(topology["critic"], CriticWorker, [(cfg, model_dir)], reservation=reservation)
        source = _rollout_source(cfg, topology, run, model_dir, rank0, train.prompts, train.ids, tokenizer.pad_token_id,
                                 reservation, kinds)
        evaluation = RolloutWorker(_colocated(cfg), model_dir, module=rank0.module,
                                   env_workers=_env_workers(topology, 0, run.emit, reservation))
        validation_rewards = pool_start(topology["reward"], part=1, reservation=reservation, emit=run.emit)
        evaluator = Evaluator(cfg, evaluation, RewardWorker(cfg, model_dir, validation_rewards), test.prompts, test.ids)
    except BaseException:
        for close in reversed(closers):
            close()
        raise
    return Roles(topology, model_dir, tokenizer, train.prompts, policy_group, rank0, reference, critic, source, evaluator,
                 monitor, closers)


def _rollout_source(cfg: Config, topology: Topology, run: RunContext, model_dir: Path, rank0: PolicyWorker,
                    prompts: list[Prompt], ids: list[list[int]], pad_id: int, reservation, kinds: set[str]) -> AsyncSource:
    """The rollout side: on :meth:`AsyncSource.publish`'s first call, the rollout workers are
    spawned, the fleet and the producer built, the producer hosted on a thread of its own."""
    role, rollout_role = topology["rollout"], cfg.runtime.roles.rollout
    wrap = WorkerFaults(run.faults) if "slow" in kinds else None

    def args(index: int) -> tuple:
        """Rollout worker ``index``'s: its environment workers are pool ``index + 1``."""
        if role.where == "thread":
            return cfg, model_dir, rank0.module, 0, _env_workers(topology, index + 1, run.emit, reservation)
        # the events of environment workers in another process have no way back
        return cfg, model_dir, None, role.threads, _env_workers(topology, index + 1, None, reservation)

    def launch() -> ThreadGroup:
        workers = spawn(role, build_rollout_worker, [args(i) for i in range(role.count)], concurrent=FLEET_CONCURRENT,
                        wrap=wrap, reservation=reservation)
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
            reward = RewardWorker(cfg, model_dir, pool_start(topology["reward"], reservation=reservation, emit=run.emit))
            if kinds & {"reward_timeout", "reward_error"}:
                reward = FaultyRewards(reward, run.faults, run.clock)
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
