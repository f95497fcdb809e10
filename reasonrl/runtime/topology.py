"""Where every role of a run runs: one plan, decided here, and one way to start a role.

    topology = plan(cfg)                   # validated before anything starts
    print("\\n".join(topology.lines()))     # one line per role: where, how many, resources
    group = spawn(topology["rollout"], build_rollout_worker, [(cfg, model_dir, i) for i in range(2)],
                  concurrent=FLEET_CONCURRENT, wrap=faults)

A role runs ``inline`` (in the controller's process, called in the caller's thread: the
policy's rank 0, the reference and critic on one machine, reward grading with
``runtime.roles.reward.count=0`` by a rule that ends in bounded time (``math_verify`` and an
import-path function always get a worker process), and the shipped environments with no
workers of their own), on a ``thread`` of the controller's process (rollout workers
colocated with the policy: they sample from the policy's own module, so they exist only at
staleness 0), in a ``process`` of its own (rollout workers with their own weights, reward
and environment workers, trainer ranks 1..N-1) or as a ``ray`` actor (every role but the
policy's rank 0 with ``runtime.engine=ray``). Every count, thread count, resource and call
timeout of a role is ``runtime.roles.<role>.*``.

Threads: a role's ``threads`` key, else a share of the cores the run may use (``run.threads``,
else the process's affinity and cgroup quota): the rollout workers with weights of their own
divide the cores among them; where they generate beside training (``rollout.max_staleness > 0``
on this machine) the rollout side takes half the cores and the trainer the rest, so the two
never spin more threads than there are cores. Where one waits for the other (staleness 0) each
takes every core in its turn.

Reward and environment workers grade text and step environments: :data:`POOL_THREADS` torch
threads each unless their role's ``threads`` says otherwise, so their pools stay off the cores
the trainer and the rollout workers split. They belong to the pool that uses them (``count``
is per pool), started by :func:`pool_start`: the reward workers of the rollout producer and those of
validation are two pools, processes of the controller's process, or Ray actors placed by
``runtime.roles.reward`` with ``runtime.engine=ray`` (each pool in bundles of its own); the
environment workers are a pool of each rollout worker and one of validation's: processes of
that worker's process, or with ``runtime.engine=ray`` Ray actors placed by ``runtime.roles.env``,
each pool in bundles of its own (pool 0 validation's, pool ``i + 1`` rollout worker ``i``'s; a
rollout worker the fleet grows past the reservation gets its pool outside it, as the worker
itself is).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from reasonrl.config import Config
from reasonrl.config.rules import (env_workers, reward_workers, rollout_shares_policy, unbounded_rewards,
                                   validation_backend)
from reasonrl.errors import InputError
from reasonrl.runtime.group import LocalGroup, ThreadGroup
from reasonrl.runtime.pool import PoolStart
from reasonrl.runtime.process import ProcessGroup
from reasonrl.runtime.threads import available_cores

ROLES = ("policy", "reference", "critic", "rollout", "reward", "env")
"""Every role a run can have, in the order the plan lists them."""

WHERE = ("inline", "thread", "process", "ray")


POOL_THREADS = 1
"""Torch threads of each reward and environment worker process (their role's ``threads`` key
overrides it)."""


@dataclass(frozen=True)
class RolePlan:
    """One role: ``where`` it runs (:data:`WHERE`), ``count`` workers, torch ``threads`` each
    (0: the controller's), ``cpus``/``gpus`` per worker (Ray's reservation), ``colocate``
    (the role whose process or bundle it shares; empty: its own), the ``timeout_s`` of each
    call to it, ``detail``: what a reader should know about it, and ``pools``: how many
    pools of ``count`` workers the run starts (reward: the rollout producer's and validation's)."""

    role: str
    where: str
    count: int
    threads: int
    cpus: float
    gpus: float
    colocate: str
    timeout_s: float
    detail: str = ""
    pools: int = 1

    def line(self) -> str:
        """``rollout   process x2   threads 1, timeout 600 s   (fast backend, weights of their own)``:
        threads where the workers have processes of their own, resources where Ray reserves them."""
        parts = []
        if self.threads:
            parts.append(f"threads {self.threads}")
        if self.where == "ray":
            parts.append(f"{_fmt(self.cpus)} cpu, {_fmt(self.gpus)} gpu each")
        if self.colocate:
            parts.append(f"with {self.colocate}")
        if self.where != "inline":
            parts.append(f"timeout {_fmt(self.timeout_s)} s")
        detail = f"   ({self.detail})" if self.detail else ""
        count = f"{self.count}" if self.pools == 1 else f"{self.pools}x{self.count}"
        return f"{self.role:<10}{self.where} x{count:<4}{', '.join(parts)}{detail}".rstrip()


@dataclass(frozen=True)
class Topology:
    """The plan of a run: ``engine`` (local, ray) and a :class:`RolePlan` for each role it uses."""

    engine: str
    roles: dict[str, RolePlan]

    def __getitem__(self, role: str) -> RolePlan:
        return self.roles[role]

    def __contains__(self, role: str) -> bool:
        return role in self.roles

    def lines(self) -> list[str]:
        """One line per role, in :data:`ROLES` order, each starting with the role's name."""
        return [self.roles[r].line() for r in ROLES if r in self.roles]

    def starts_processes(self) -> bool:
        """Whether the controller's process starts processes of its own (a :class:`ProcessGroup`'s
        children): a role placed in processes, but environment workers only where the rollout
        workers are threads of the controller (else each rollout worker starts its own)."""
        env_here = "env" in self.roles and self.roles["env"].where == "process" and self.roles["rollout"].where == "thread"
        return env_here or any(p.where == "process" for r, p in self.roles.items() if r != "env")

    def ray_actors(self) -> dict[str, int]:
        """The roles that run as Ray actors and how many actors each, every pool counted (the reservation's)."""
        counts = {r: p.count * p.pools - (r == "policy") for r, p in self.roles.items() if p.where == "ray"}
        return {r: n for r, n in counts.items() if n}


def plan(cfg: Config) -> Topology:
    """Where each role of ``cfg`` runs (see the module docstring); an impossible request is an
    InputError naming the ``runtime.roles`` key."""
    roles, engine = cfg.runtime.roles, cfg.runtime.engine
    remote = "ray" if engine == "ray" else "process"
    cores = cfg.run.threads or available_cores()
    out: dict[str, RolePlan] = {}

    def add(role: str, where: str, count: int, detail: str = "", threads: int = 0, timeout_s: float | None = None,
            colocate: str | None = None, pools: int = 1) -> None:
        spec = getattr(roles, role)
        if colocate is None:
            colocate = "" if spec.colocate in ("auto", "none") else spec.colocate
        out[role] = RolePlan(role, where, count, threads, spec.cpus, spec.gpus, colocate,
                             spec.timeout_s if timeout_s is None else timeout_s, detail, pools)

    ranks = cfg.runtime.trainer_ranks
    # generation beside training (staleness > 0) on this machine's processes: the two sides split the cores
    beside = cfg.rollout.max_staleness > 0 and engine == "local" and not rollout_shares_policy(cfg)
    rollout_cores = max(1, cores // 2) if beside else cores
    add("policy", "inline" if ranks == 1 else remote, ranks,
        "rank 0 in the controller's process" + (f", ranks 1..{ranks - 1} beside it" if ranks > 1 else ""),
        threads=rank_threads(cfg) if ranks > 1 else max(1, cores - rollout_cores) if beside and not cfg.run.threads else 0,
        timeout_s=rank_timeout_s(cfg))
    for role, used in (("reference", cfg.algo.kl_loss_coef > 0), ("critic", cfg.algo.adv_estimator == "gae")):
        if used:
            add(role, "inline" if engine == "local" else "ray", 1)
    rollout = roles.rollout
    validation = validation_backend(cfg)
    validation = "" if validation == cfg.rollout.backend else f"; validation: {validation} backend over the policy's module"
    if rollout_shares_policy(cfg):
        if cfg.rollout.max_staleness > 0:
            raise InputError(f"runtime.roles.rollout.colocate = policy: rollout workers sharing the policy's module "
                             f"sample from the weights being trained; with rollout.max_staleness = "
                             f"{cfg.rollout.max_staleness} they need their own (runtime.roles.rollout.colocate=none)")
        if cfg.train.strategy == "fsdp":
            raise InputError("runtime.roles.rollout.colocate = policy: FSDP shards the policy's module, which a "
                             "rollout worker sharing it cannot sample from; set runtime.roles.rollout.colocate=none")
        add("rollout", "thread", rollout.count, f"{cfg.rollout.backend} backend over the policy's own module{validation}",
            colocate="policy")
    else:
        add("rollout", remote, rollout.count, f"{cfg.rollout.backend} backend, weights of their own{validation}",
            threads=rollout.threads or max(1, rollout_cores // rollout.count))
    if roles.reward.count:
        add("reward", remote, roles.reward.count, "a pool for the rollout producer and one for validation", pools=2,
            threads=roles.reward.threads or POOL_THREADS)
    elif reward_workers(cfg):
        add("reward", "process", 1, f"{', '.join(unbounded_rewards(cfg))}: no time limit of its own, so one worker "
            "process per pool (the rollout producer's and validation's), killed at its timeout", pools=2,
            threads=roles.reward.threads or POOL_THREADS)
    else:
        add("reward", "inline", 1, f"{cfg.reward.fn}: graded on the rollout producer's thread, a rule that ends in "
            "bounded time")
    if cfg.env.name:
        if env_workers(cfg):
            add("env", remote, env_workers(cfg),
                ("a pool of actors for each rollout actor and one for validation" if engine == "ray"
                 else "environment processes of each rollout worker")
                + ("" if roles.env.count else f" ({cfg.env.name}: the user's code, so one, killed at its timeout)"),
                threads=roles.env.threads or POOL_THREADS, pools=rollout.count + 1 if engine == "ray" else 1)
        else:
            add("env", "inline", 1, "stepped in each rollout worker: a shipped environment, bounded by construction")
    return Topology(engine, out)


def reset_start(cfg: Config) -> PoolStart | None:
    """How the initial states of ``env.name`` are read (:func:`reasonrl.env.splits.run_splits`):
    each reset in one worker process killed at ``runtime.roles.env.timeout_s`` (the
    environment is user code, and a reset may hang); None without ``env.name``."""
    return PoolStart("env", 1, cfg.runtime.roles.env.timeout_s) if cfg.env.name else None


def rank_threads(cfg: Config) -> int:
    """torch threads of each trainer rank: ``runtime.roles.policy.threads``, else an equal part
    of the controller's cores."""
    return cfg.runtime.roles.policy.threads or max(1, (cfg.run.threads or available_cores()) // cfg.runtime.trainer_ranks)


def rank_timeout_s(cfg: Config) -> float:
    """How long a call to the trainer ranks may take: a collective's own timeout
    (``runtime.collective_timeout_s``) on top of the step's budget (``runtime.roles.policy.timeout_s``)."""
    return cfg.runtime.collective_timeout_s + cfg.runtime.roles.policy.timeout_s


class _Factory:
    """A picklable factory for the workers of one role: ``factory(*args)``, then
    ``wrap(worker, role, index)`` (the fault plan's wrappers for that worker), built where
    the worker runs."""

    def __init__(self, factory: Callable[..., Any], wrap: Callable[[Any, str, int], Any] | None, role: str) -> None:
        self.factory, self.wrap, self.role = factory, wrap, role
        self.__module__ = factory.__module__  # the forkserver preloads the factory's module

    def __call__(self, index: int, *args: Any) -> Any:
        worker = self.factory(*args)
        return worker if self.wrap is None else self.wrap(worker, self.role, index)


def worker_args(index: int, args: tuple) -> tuple:
    """What a group of :func:`spawn`'s builds worker ``index`` from (its ``grow`` takes it too)."""
    return (index, *args)


def spawn(role: RolePlan, factory: Callable[..., Any], args_per_worker: list[tuple], *, concurrent: tuple[str, ...] = (),
          wrap: Callable[[Any, str, int], Any] | None = None, reservation=None):
    """A WorkerGroup of ``role.count`` workers, each ``factory(*args)`` (one ``args_per_worker``
    entry each) where ``role`` says, wrapped by ``wrap(worker, role name, index)`` there (the
    fault plan's wrappers), every call bounded by ``role.timeout_s``; ``concurrent`` methods
    run beside a running call; ``reservation`` (Ray) places the actors."""
    if len(args_per_worker) != role.count:
        raise ValueError(f"spawn({role.role}): {len(args_per_worker)} argument tuples for {role.count} workers")
    build = _Factory(factory, wrap, role.role)
    indexed = [worker_args(i, a) for i, a in enumerate(args_per_worker)]
    if role.where == "inline":
        return LocalGroup([build(*a) for a in indexed])
    if role.where == "thread":
        return ThreadGroup(build, indexed, name=role.role, timeout_s=role.timeout_s, concurrent=concurrent)
    if role.where == "process":
        return ProcessGroup(build, indexed, name=role.role, timeout_s=role.timeout_s, start_timeout_s=role.timeout_s,
                            concurrent=concurrent)
    from reasonrl.runtime.ray import RayGroup

    options = reservation.options(role.role) if reservation is not None else {}
    return RayGroup(build, indexed, role.role, timeout_s=role.timeout_s, start_timeout_s=role.timeout_s,
                    concurrent=concurrent, **options)


def pool_start(role: RolePlan, *, part: int = 0, reservation=None, emit: Callable[..., None] | None = None
               ) -> PoolStart | None:
    """How the workers of pool ``part`` (of ``role.pools``) of a pooled role (reward, env)
    start: ``role.count`` workers where ``role`` says, each call bounded by ``role.timeout_s``,
    restarts reported to ``emit``; on Ray in that pool's bundles of ``reservation`` (an env
    pool past ``role.pools``, of a rollout worker the fleet grew, with the same resources
    outside it; processes: every rollout worker's pool is alike). None where the role is
    inline (its pool works in the caller's process)."""
    if role.where == "inline":
        return None
    if part < 0 or (part >= role.pools and role.role != "env"):
        raise ValueError(f"pool_start({role.role}): pool {part} of {role.pools}")
    options = None
    if role.where == "ray" and reservation is not None:
        reserved = reservation.options(role.role)
        if part < role.pools:
            mine = slice(part * role.count, (part + 1) * role.count)
            options = {name: per_actor[mine] for name, per_actor in reserved.items()}
        else:  # the env pool of a rollout worker grown past the reservation: outside it, as that worker is
            options = {"resources": reserved["resources"][:role.count]}
    return PoolStart(role.role, role.count, role.timeout_s, role.where, ray_options=options, emit=emit,
                     threads=role.threads)


def _fmt(x: float) -> str:
    return f"{x:g}"
