"""Scaling a run's workers while it runs: ``reasonrl scale RUN_DIR rollout=3``.

    request_scale(run_dir, {"rollout": 3})   # checked against the run's config, kept in RUN_DIR/scale.json
    request_scale(run_dir, {"rollout": 3}, at_step=12)   # from the 12th batch's collect on
    cfg = scaled(cfg, run_dir)               # a (re)starting run takes the counts asked for
    watch = ScaleWatch(run_dir); watch.poll()   # a running run: the counts asked for since, or {}
    ScaleSchedule(run_dir).count(12)         # the rollout count scheduled for the 12th collect, or None
    rule = IdleRule(cfg); rule.observe(idle_s, step_s)  # runtime.roles.rollout.scale_up_idle: a count, or None

The counts asked for are kept in ``RUN_DIR/scale.json`` (written atomically), so a run started
again, by the supervisor or by hand, starts with them. A running run applies a rollout count
between two steps (:meth:`~reasonrl.rollout.fleet.RolloutFleet.resize`), a reward count too when
the run grades in worker processes and the count stays >= 1 (the graders of training samples;
validation keeps its own); the environment counts, and a reward count to or from 0, take effect
when the run next starts. Every count stays within
``runtime.roles.<role>.min`` and ``.max`` of the run's config.

A rollout count asked for ``at_step`` K joins the run's schedule (``scale.json``'s
``schedule``: ``[step, count]`` pairs): the producer resizes the fleet before the collect of
its K-th batch (the batch trained at step K in sync and lockstep runs) and waits until every
worker of the new size serves. The count of collect c is that of the last pair with step <= c,
so a run started again from a checkpoint has, collect for collect, the sizes the run before
it had, and a lockstep run stays deterministic. A rollout count asked for without a step
replaces the schedule.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from reasonrl.config import Config, load
from reasonrl.errors import InputError
from reasonrl.metrics import write_atomic

SCALE_FILE = "scale.json"
SCHEDULE = "schedule"

LIVE = ("rollout", "reward")
"""Roles whose count a running run changes between two steps (reward: the producer's graders,
from one count >= 1 to another)."""

AT_START = ("env",)
"""Roles whose count takes effect when the run next starts."""


def _path(run_dir: Path) -> Path:
    return Path(run_dir) / SCALE_FILE


def _mtime(path: Path) -> int | None:
    """When ``path`` last changed (None: it is not there): one ``stat``."""
    try:
        return path.stat().st_mtime_ns
    except FileNotFoundError:
        return None


def _read(run_dir: Path) -> tuple[dict[str, int], list[list[int]]]:
    """scale.json's role counts, and its ``schedule``'s [step, rollout count] pairs ([] when none was asked for)."""
    path = _path(run_dir)
    if not path.is_file():
        return {}, []
    try:
        kept = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as err:
        raise InputError(f"{path}: not a JSON object of role counts ({err}); remove it or run reasonrl scale again") from None
    counts = {k: v for k, v in kept.items() if k != SCHEDULE} if isinstance(kept, dict) else kept
    if not isinstance(counts, dict) or not all(isinstance(v, int) and k in (*LIVE, *AT_START) for k, v in counts.items()):
        raise InputError(f"{path}: expected {{role: count}} with roles among {', '.join((*LIVE, *AT_START))}, got {kept!r}")
    pairs = kept.get(SCHEDULE, [])
    if not isinstance(pairs, list) or not all(isinstance(p, list) and len(p) == 2 and all(type(v) is int for v in p)
                                              for p in pairs):
        raise InputError(f"{path}: {SCHEDULE!r} must be a list of [step, rollout count] pairs, got {pairs!r}")
    return counts, pairs


def requested(run_dir: str | Path) -> dict[str, int]:
    """The counts asked for so far, without a step ({} when none was)."""
    return _read(Path(run_dir))[0]


def schedule(run_dir: str | Path) -> list[tuple[int, int]]:
    """The rollout counts asked for at a step, as (step, count) in step order ([] when none was)."""
    return [(step, count) for step, count in _read(Path(run_dir))[1]]


def check_counts(cfg: Config, counts: dict[str, int], source: str) -> None:
    """Each count of ``counts`` is a scalable role's, within ``runtime.roles.<role>.min`` and
    ``.max`` (max 0: no bound); an InputError naming ``source`` and the key otherwise."""
    for role, count in counts.items():
        if role not in (*LIVE, *AT_START):
            raise InputError(f"{source}: {role!r} cannot be scaled; the roles that can: {', '.join((*LIVE, *AT_START))}")
        spec = getattr(cfg.runtime.roles, role)
        least = max(spec.min, 1 if role == "rollout" else 0)
        if type(count) is not int or count < least or (spec.max and count > spec.max):
            bound = f"[{least}, {spec.max}]" if spec.max else f">= {least}"
            raise InputError(f"{source}: {role}={count!r} is outside runtime.roles.{role}.min/.max: expected an integer "
                             f"{bound}")


def request_scale(run_dir: str | Path, counts: dict[str, int], at_step: int | None = None) -> dict:
    """Check ``counts`` against the run's ``config.yaml`` and keep them (with the counts asked
    for before) in ``scale.json``; ``at_step`` K: a rollout count for the collects from the
    K-th on, added to the schedule (a pair at the same step replaced); a rollout count without
    a step replaces the schedule. Returns what scale.json now holds."""
    run_dir = Path(run_dir)
    config = run_dir / "config.yaml"
    if not config.is_file():
        raise InputError(f"{config}: no such file; is {run_dir} a run directory (run.dir) that has started?")
    check_counts(load(config), counts, "reasonrl scale")
    merged, kept_pairs = _read(run_dir)
    pairs = dict(kept_pairs)
    if at_step is not None:
        if type(at_step) is not int or at_step < 1 or set(counts) != {"rollout"}:
            raise InputError(f"reasonrl scale --at-step {at_step!r}: expected a step >= 1 and rollout=N alone (a "
                             f"schedule is the rollout fleet's; other roles change when the run next starts)")
        pairs[at_step] = counts["rollout"]
    else:
        merged = {**merged, **counts}
        if "rollout" in counts:
            pairs = {}
    if pairs:
        merged[SCHEDULE] = [[step, pairs[step]] for step in sorted(pairs)]
    write_atomic(_path(run_dir), json.dumps(merged, sort_keys=True))
    return merged


def scaled(cfg: Config, run_dir: str | Path) -> Config:
    """``cfg`` with the counts asked for in ``run_dir`` (a run that starts again keeps them)."""
    counts = requested(run_dir)
    if not counts:
        return cfg
    check_counts(cfg, counts, str(_path(Path(run_dir))))
    roles = cfg.runtime.roles
    roles = replace(roles, **{role: replace(getattr(roles, role), count=n) for role, n in counts.items()})
    return replace(cfg, runtime=replace(cfg.runtime, roles=roles))


class ScaleWatch:
    """A running run's view of ``scale.json``: :meth:`poll` returns the live counts (rollout)
    asked for since the last poll, {} when none changed; one ``stat`` a call otherwise."""

    def __init__(self, run_dir: str | Path, cfg: Config) -> None:
        self.path, self.cfg = _path(Path(run_dir)), cfg
        self._stamp = _mtime(self.path)
        self._counts = {role: getattr(cfg.runtime.roles, role).count for role in LIVE}

    def poll(self) -> dict[str, int]:
        stamp = _mtime(self.path)
        if stamp == self._stamp:
            return {}
        self._stamp = stamp
        counts = requested(self.path.parent)
        check_counts(self.cfg, counts, str(self.path))
        changed = {role: n for role, n in counts.items() if role in LIVE and n != self._counts[role]}
        self._counts.update(changed)
        return changed


class ScaleSchedule:
    """A running run's view of ``scale.json``'s schedule: :meth:`count` of collect ``c`` is the
    count of the last (step, count) pair with step <= c, None before the first pair (the file
    is read again only when it changed)."""

    def __init__(self, run_dir: str | Path) -> None:
        self.run_dir = Path(run_dir)
        self._stamp: int | None = None
        self._pairs: list[tuple[int, int]] = []

    def count(self, collect: int) -> int | None:
        stamp = _mtime(_path(self.run_dir))
        if stamp != self._stamp:
            self._stamp, self._pairs = stamp, schedule(self.run_dir)
        due = [count for step, count in self._pairs if step <= collect]
        return due[-1] if due else None


class IdleRule:
    """``runtime.roles.rollout.scale_up_idle``: one more rollout worker when the trainer waits.

    After each step, ``observe(idle_s, step_s)`` records the trainer's idle share ``idle_s /
    step_s``; when the mean of the last K (``scale_up_steps``) shares is above ``scale_up_idle``
    and the fleet is below ``max``, it returns the count one higher (to ask for through
    :func:`request_scale`, so a restart keeps it) and then waits K steps before deciding again.
    None otherwise, and always when the rule is off.
    """

    def __init__(self, cfg: Config) -> None:
        spec = cfg.runtime.roles.rollout
        self.threshold, self.steps, self.most = spec.scale_up_idle, spec.scale_up_steps, spec.max
        self.count = spec.count
        self._shares: list[float] = []

    def observe(self, idle_s: float, step_s: float) -> int | None:
        if not self.threshold or step_s <= 0:
            return None
        self._shares = [*self._shares, idle_s / step_s][-self.steps:]
        if len(self._shares) < self.steps or sum(self._shares) / self.steps <= self.threshold or self.count >= self.most:
            return None
        self.count += 1
        self._shares = []
        return self.count

    def scaled_to(self, count: int) -> None:
        """A count asked for by hand (reasonrl scale): the rule counts from it, on fresh history."""
        self.count, self._shares = count, []
