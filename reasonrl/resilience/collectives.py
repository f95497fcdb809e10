"""The trainer ranks of a run, and what their collective traces say: a slow rank, a stuck one.

    ranks = launch_ranks(cfg, model_dir, run_dir)                 # RankGroup, rank 0 in this process
    monitor = RankMonitor(run_dir / "trace", world, events, cfg.resilience, cfg.runtime)
    found = monitor.after_step(step)         # straggler events; found.shares: new speed weights
    rank = monitor.on_timeout(step)          # after an update call timed out: the stuck rank
    print(format_table(analyse(run_dir / "trace")))               # reasonrl trace RUN_DIR

The traces are the files :class:`~reasonrl.trainer.distributed.TraceWriter` appends,
``trace/rank<R>.jsonl``: per collective an ``enter`` line before it and an ``exit`` line after
it, per call a ``begin`` line. Collectives are matched across ranks by ``(incarnation, seq)``; the
newest incarnation (the group of the newest run attempt) is analysed.

Rules (``t`` the wall-clock enter time of a rank in a collective):

- *lateness* of a collective whose every rank entered: ``t_last - median(t of the others)``,
  charged to the last rank to enter. Per step, the rank charged most is the one the step
  waited for. *compute* of a rank before a collective: the time since its previous collective
  returned (or its call began), from its monotonic clock.
- *slow rank* r: over the last ``window`` training steps (step 0, the group's start with its
  weight broadcast, is none), r is the one waited for in at least 2 of them
  and in more than half, and its median lateness in those steps is at least ``min_s`` and at
  least ``(ratio - 1)`` times the others' median compute per step (the same test as
  ``resilience.slow_ratio`` and ``resilience.slow_min_s`` for a fail-slow stage).
- *stuck rank*: in the newest collective (highest ``seq``), the ranks that never entered it,
  when some rank entered it at least ``stuck_after_s`` ago (0 once the call is known to have
  timed out).
"""

from __future__ import annotations

import json
import math
import statistics
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reasonrl.config import Config, ResilienceConfig, RuntimeConfig
from reasonrl.config.faults import RANK_FAULTS
from reasonrl.errors import InputError
from reasonrl.metrics import EventLog
from reasonrl.resilience.faults import parse_faults
from reasonrl.resilience.guards import SlowdownDetector
from reasonrl.resilience.injection import FaultyRank
from reasonrl.runtime import LocalGroup, ProcessGroup, setup_torch
from reasonrl.runtime.ranks import RankGroup
from reasonrl.runtime.topology import rank_threads, rank_timeout_s
from reasonrl.workers.trainer_rank import TrainerRank

TRACE_DIR = "trace"
"""The run directory's folder of collective traces."""


# ---------------------------------------------------------------------- the ranks of a run
def build_rank(cfg: Config, model_dir: str | Path, rank: int, world: int, run_dir: str | Path,
               threads: int | None) -> TrainerRank | FaultyRank:
    """Trainer rank ``rank`` of the run in ``run_dir``, built in the process it runs in (torch
    set to ``threads`` threads there; None: left as the process has it), wrapped in
    :class:`~reasonrl.resilience.injection.FaultyRank` when the run's fault plan has faults
    for it (its rank faults; nan for rank 0), so that they act inside its process."""
    if threads is not None:
        setup_torch(threads, cfg.run.deterministic)
    worker = TrainerRank(cfg, model_dir, rank, world, Path(run_dir) / TRACE_DIR)
    plan = parse_faults(list(cfg.faults))
    mine = [f for f in plan.faults if (f.kind in RANK_FAULTS and f.get("rank") == rank) or (f.kind == "nan" and rank == 0)]
    return FaultyRank(worker, plan.bind(run_dir)) if mine else worker


def launch_ranks(cfg: Config, model_dir: str | Path, run_dir: str | Path, *, rank0_here: bool = True,
                 timeout_s: float | None = None, reservation=None) -> RankGroup:
    """The ``runtime.trainer_ranks`` policy ranks of a run: rank 0 in this process when
    ``rank0_here`` (its worker is ``group.local``, whose module the synchronous rollout may
    share under ddp), the others each in a child process with an equal part of the cores, or
    with a Ray ``reservation`` (:class:`~reasonrl.runtime.ray.Reservation`) each a Ray actor in
    its ``policy`` bundle (ranks 1..N-1 take bundles 0..N-2).

    ``timeout_s`` bounds every call; default :func:`~reasonrl.runtime.topology.rank_timeout_s`
    (``runtime.collective_timeout_s`` plus ``runtime.roles.policy.timeout_s``); each rank has
    :func:`~reasonrl.runtime.topology.rank_threads` threads (a rank fault of a rank the run
    does not have is refused by the config rules).
    """
    world = cfg.runtime.trainer_ranks
    if timeout_s is None:
        timeout_s = rank_timeout_s(cfg)
    threads = rank_threads(cfg)

    def launch(rank: int):
        if rank == 0 and rank0_here:
            return LocalGroup([build_rank(cfg, model_dir, 0, world, run_dir, None)])
        if reservation is not None:
            from reasonrl.runtime.ray import RayGroup

            options = reservation.options("policy")
            bundle = rank - 1 if rank0_here else rank
            return RayGroup(build_rank, [(cfg, model_dir, rank, world, run_dir, threads)], f"policy-rank{rank}",
                            timeout_s=timeout_s, start_timeout_s=timeout_s, resources=[options["resources"][bundle]],
                            placement=[options["placement"][bundle]])
        return ProcessGroup(build_rank, [(cfg, model_dir, rank, world, run_dir, threads)], name=f"policy-rank{rank}",
                            timeout_s=timeout_s, start_timeout_s=timeout_s)

    return RankGroup(launch, world, timeout_s=timeout_s)


# ---------------------------------------------------------------------- reading traces
@dataclass
class Collective:
    """One collective of a incarnation as the ranks recorded it: per rank its enter and exit wall
    times, the compute before it (seconds) and an error, if it raised."""

    seq: int
    op: str
    what: str
    step: int
    bytes: int
    enter: dict[int, float] = field(default_factory=dict)
    exit: dict[int, float] = field(default_factory=dict)
    compute: dict[int, float] = field(default_factory=dict)
    errors: dict[int, str] = field(default_factory=dict)


@dataclass
class Incarnation:
    """One process group's records: ``world`` ranks, collectives by sequence number."""

    id: str
    world: int = 0
    first_t: float = math.inf
    collectives: dict[int, Collective] = field(default_factory=dict)


class TraceReader:
    """Reads ``trace_dir/rank*.jsonl`` incrementally: each :meth:`read` parses only the lines
    appended since the last one (a partial last line waits for the next read). With
    ``keep_steps``, only the newest incarnation and its collectives of the last ``keep_steps``
    steps are kept (a monitor's bounded memory)."""

    def __init__(self, trace_dir: str | Path, keep_steps: int | None = None) -> None:
        self.trace_dir = Path(trace_dir)
        self.keep_steps = keep_steps
        self.incarnations: dict[str, Incarnation] = {}
        self._offsets: dict[Path, int] = {}
        self._marks: dict[tuple[str, int], float] = {}  # (incarnation, rank) -> monotonic time of its last begin/exit

    def read(self) -> Incarnation | None:
        """The newest incarnation after reading what was appended; None when there is none."""
        for path in sorted(self.trace_dir.glob("rank*.jsonl")):
            with open(path, "rb") as f:
                f.seek(self._offsets.get(path, 0))
                data = f.read()
            end = data.rfind(b"\n") + 1
            self._offsets[path] = self._offsets.get(path, 0) + end
            for line in data[:end].decode("utf-8", errors="replace").splitlines():
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:  # a line cut by a kill mid-write
                    continue
                self._add(record)
        newest = max(self.incarnations.values(), key=lambda s: s.first_t, default=None)
        if newest is not None and self.keep_steps is not None:
            self.incarnations = {newest.id: newest}
            steps = {c.step for c in newest.collectives.values()}
            if steps:
                oldest = max(steps) - self.keep_steps + 1
                newest.collectives = {k: c for k, c in newest.collectives.items() if c.step >= oldest}
        return newest

    def _add(self, r: dict[str, Any]) -> None:
        incarnation = self.incarnations.setdefault(r["incarnation"], Incarnation(r["incarnation"]))
        incarnation.first_t = min(incarnation.first_t, r["t"])
        rank, key = r["rank"], (r["incarnation"], r["rank"])
        if r["ev"] == "begin":
            incarnation.world = max(incarnation.world, r["world"])
            self._marks[key] = r["mono"]
        elif r["ev"] == "enter":
            c = incarnation.collectives.setdefault(r["seq"], Collective(r["seq"], r["op"], r["what"], r["step"], r["bytes"]))
            c.enter[rank] = r["t"]
            c.compute[rank] = max(0.0, r["mono"] - self._marks.get(key, r["mono"]))
        elif r["ev"] == "exit":
            c = incarnation.collectives.get(r["seq"])
            if c is not None:
                c.exit[rank] = r["t"]
                if "error" in r:
                    c.errors[rank] = r["error"]
            self._marks[key] = r["mono"]


# ---------------------------------------------------------------------- analysis
@dataclass
class RankStats:
    """One rank over a incarnation: collectives entered, seconds inside them (waiting for the
    others, then transferring), mean arrival order (0: first) and times last over the
    collectives every rank entered, compute seconds, bytes, and the all-reduce bandwidth
    (bytes over the time from the last rank's arrival to this rank's exit), MB/s."""

    rank: int
    collectives: int = 0
    wait_s: float = 0.0
    mean_order: float = 0.0
    times_last: int = 0
    compute_s: float = 0.0
    bytes: int = 0
    allreduce_mb_s: float | None = None


@dataclass(frozen=True)
class Straggler:
    """The rank the others kept waiting for: ``lateness_s`` its median lateness per step in
    the ``late_steps`` of the last ``window`` steps where it was the one waited for."""

    rank: int
    lateness_s: float
    late_steps: int
    window: int
    others_compute_s: float


@dataclass(frozen=True)
class Stuck:
    """Ranks that never entered collective ``seq`` (``op`` of ``what``, at ``step``), which
    ranks ``waiting`` entered ``waited_s`` seconds ago."""

    ranks: tuple[int, ...]
    op: str
    what: str
    seq: int
    step: int
    waiting: tuple[int, ...]
    waited_s: float

    @property
    def rank(self) -> int:
        """The stuck rank (the lowest, when several never entered)."""
        return self.ranks[0]


@dataclass
class TraceReport:
    """What :func:`analyse` found in one incarnation of a trace directory."""

    incarnation: str
    incarnations: int
    world: int
    steps: list[int]
    collectives: int
    ranks: list[RankStats]
    step_compute: dict[int, dict[int, float]]
    slow: Straggler | None = None
    stuck: Stuck | None = None


def _lateness(c: Collective) -> tuple[int, float]:
    """(the last rank to enter ``c``, its enter time minus the median of the others')."""
    last = max(c.enter, key=lambda r: (c.enter[r], r))
    others = [t for r, t in c.enter.items() if r != last]
    return last, c.enter[last] - statistics.median(others)


def _straggler(complete: list[Collective], step_compute: dict[int, dict[int, float]], world: int, window: int,
               ratio: float, min_s: float) -> Straggler | None:
    """The slow rank by the module's rule, or None."""
    if world < 2:
        return None
    caused: dict[int, dict[int, float]] = defaultdict(lambda: defaultdict(float))
    for c in complete:
        last, late = _lateness(c)
        caused[c.step][last] += max(late, 0.0)
    steps = sorted(caused)[-window:]
    waited_for = {s: max(caused[s], key=lambda r: (caused[s][r], -r)) for s in steps if max(caused[s].values()) > 0}
    if not waited_for:
        return None
    rank, count = Counter(waited_for.values()).most_common(1)[0]
    if count < 2 or count <= len(steps) / 2:
        return None
    late_steps = [s for s, r in waited_for.items() if r == rank]
    lateness = statistics.median(caused[s][rank] for s in late_steps)
    others = statistics.median(
        statistics.median(v for r, v in step_compute[s].items() if r != rank) if len(step_compute[s]) > 1 else 0.0
        for s in late_steps)
    if lateness < min_s or lateness < (ratio - 1) * others:
        return None
    return Straggler(rank, lateness, count, len(steps), others)


def _stuck(incarnation: Incarnation, world: int, now: float, stuck_after_s: float) -> Stuck | None:
    """The ranks missing from the newest collective, when it was entered long enough ago."""
    if not incarnation.collectives:
        return None
    c = incarnation.collectives[max(incarnation.collectives)]
    missing = tuple(r for r in range(world) if r not in c.enter)
    waited = now - min(c.enter.values())
    if not missing or waited < stuck_after_s:
        return None
    return Stuck(missing, c.op, c.what, c.seq, c.step, tuple(sorted(c.enter)), waited)


def report_of(incarnation: Incarnation, incarnations: int = 1, world: int | None = None, *, now: float | None = None,
              stuck_after_s: float = 120.0, ratio: float = 1.5, min_s: float = 0.5, window: int = 4) -> TraceReport:
    """:func:`analyse` of one parsed incarnation."""
    world = world or incarnation.world or (1 + max((r for c in incarnation.collectives.values() for r in c.enter), default=0))
    stats = {r: RankStats(r) for r in range(world)}
    orders: dict[int, list[int]] = defaultdict(list)
    moved: dict[int, list[float]] = defaultdict(lambda: [0.0, 0.0])  # rank -> [bytes, seconds] of all-reduces
    step_compute: dict[int, dict[int, float]] = defaultdict(lambda: defaultdict(float))
    complete = []
    for seq in sorted(incarnation.collectives):
        c = incarnation.collectives[seq]
        for r, t in c.enter.items():
            s = stats.setdefault(r, RankStats(r))
            s.collectives += 1
            s.bytes += c.bytes
            s.compute_s += c.compute[r]
            step_compute[c.step][r] += c.compute[r]
            if r in c.exit:
                s.wait_s += c.exit[r] - t
        if len(c.enter) < world:
            continue
        complete.append(c)
        arrived = max(c.enter.values())
        for order, r in enumerate(sorted(c.enter, key=lambda r: (c.enter[r], r))):
            orders[r].append(order)
        stats[_lateness(c)[0]].times_last += 1
        if c.op == "all_reduce":
            for r, t in c.exit.items():
                moved[r][0] += c.bytes
                moved[r][1] += max(t - arrived, 0.0)
    for r, s in stats.items():
        s.mean_order = statistics.fmean(orders[r]) if orders[r] else 0.0
        if moved[r][1] > 0:
            s.allreduce_mb_s = moved[r][0] / moved[r][1] / 1e6
    return TraceReport(
        incarnation=incarnation.id,
        incarnations=incarnations,
        world=world,
        steps=sorted({c.step for c in incarnation.collectives.values()}),
        collectives=len(incarnation.collectives),
        ranks=[stats[r] for r in sorted(stats)],
        step_compute={k: dict(v) for k, v in step_compute.items()},
        slow=_straggler([c for c in complete if c.step > 0], step_compute, world, window, ratio, min_s),
        stuck=_stuck(incarnation, world, time.time() if now is None else now, stuck_after_s),
    )


def analyse(trace_dir: str | Path, world: int | None = None, *, now: float | None = None, stuck_after_s: float = 120.0,
            ratio: float = 1.5, min_s: float = 0.5, window: int = 4) -> TraceReport:
    """The newest incarnation of ``trace_dir``: per-rank statistics, the slow rank and the stuck
    rank by the module's rules (``world`` default: from the trace; ``now`` default: the
    clock). InputError when the directory holds no trace."""
    reader = TraceReader(trace_dir)
    incarnation = reader.read()
    if incarnation is None:
        raise InputError(f"{trace_dir}: no collective trace (rank*.jsonl) here; runs with runtime.trainer_ranks > 1 "
                         "and runtime.trace_collectives=true write one")
    return report_of(incarnation, len(reader.incarnations), world, now=now, stuck_after_s=stuck_after_s, ratio=ratio,
                     min_s=min_s, window=window)


def format_table(report: TraceReport) -> str:
    """The report as text for ``reasonrl trace RUN_DIR``: one row per rank and a line naming
    the outliers (or "no outlier")."""
    earlier = f"; {report.incarnations - 1} earlier incarnation(s)" if report.incarnations > 1 else ""
    steps = f"steps {report.steps[0]}-{report.steps[-1]}" if report.steps else "no steps"
    lines = [f"collective trace, incarnation {report.incarnation}: {report.world} ranks, {steps}, "
             f"{report.collectives} collectives{earlier}",
             f"{'rank':>4} {'collectives':>11} {'wait_s':>9} {'mean_order':>10} {'times_last':>10} "
             f"{'compute_s':>10} {'MB':>10} {'allreduce_MB/s':>14}"]
    for s in report.ranks:
        bandwidth = "-" if s.allreduce_mb_s is None else f"{s.allreduce_mb_s:.1f}"
        lines.append(f"{s.rank:>4} {s.collectives:>11} {s.wait_s:>9.3f} {s.mean_order:>10.2f} {s.times_last:>10} "
                     f"{s.compute_s:>10.3f} {s.bytes / 1e6:>10.3f} {bandwidth:>14}")
    found = []
    if report.slow is not None:
        w = report.slow
        found.append(f"slow rank: {w.rank} (the others waited {w.lateness_s:.3f} s a step for it in {w.late_steps} of "
                     f"the last {w.window} steps; their compute {w.others_compute_s:.3f} s a step)")
    if report.stuck is not None:
        k = report.stuck
        found.append(f"stuck rank: {', '.join(map(str, k.ranks))} (never entered {k.op}({k.what}) #{k.seq} at step "
                     f"{k.step}; ranks {', '.join(map(str, k.waiting))} entered it {k.waited_s:.1f} s ago)")
    lines += found or ["no outlier"]
    return "\n".join(lines)


# ---------------------------------------------------------------------- detection in a run
@dataclass
class Found:
    """What :meth:`RankMonitor.after_step` did: the events it emitted (kind and fields), and
    the new speed weights per rank when they changed (None: keep the current ones)."""

    events: list[dict[str, Any]]
    shares: list[float] | None = None


class RankMonitor:
    """Watches a run's collective trace after each update.

    Rule: once :func:`analyse`'s rule names a slow rank (``resilience.slow_ratio``,
    ``resilience.slow_min_s``, the last ``window`` steps), it emits ``straggler`` and returns
    speed weights, so the slow rank gets a smaller share. The speeds are the run's one fail-slow
    record, a :class:`~reasonrl.resilience.guards.SlowdownDetector`, which gives rollout workers
    their shares of the fleet's dispatch the same way (:meth:`~SlowdownDetector.weights`): each
    rank's compute in a step per unit of its share is a sample of its stage ``update``, and
    ``w_r ∝ 1 / median(r's samples since the onset, the last window)``. While a rank is
    flagged the weights are returned when one moves by more than 10 %; once the slowest
    rank's median compute per share is within ``(1 + ratio) / 2`` of the fastest's
    (``max(w) <= (1 + ratio) / 2 * min(w)``), it emits ``straggler_recovered``, the record is
    forgotten and equal weights are returned. What flags a rank is the trace's evidence (the
    rank the others waited for at their collectives); a rollout worker, its stage times
    against its own baseline.
    ``on_timeout`` names the rank that never entered the newest collective (a ``hang`` event).
    Without a trace (``runtime.trace_collectives=false``) it finds nothing.
    """

    def __init__(self, trace_dir: str | Path, world: int, events: EventLog | None, resilience: ResilienceConfig,
                 runtime: RuntimeConfig, window: int = 4) -> None:
        self.world, self.events, self.window = world, events, window
        self.ratio, self.min_s = resilience.slow_ratio, resilience.slow_min_s
        self.timeout_s = runtime.collective_timeout_s
        self.reader = TraceReader(trace_dir, keep_steps=window)
        self.shares = [1.0 / world] * world
        self.flagged: int | None = None
        self.speeds = SlowdownDetector(window, self.ratio, min_steps=window)
        """Compute per share of each rank over the steps since the onset (the last ``window``)."""

    def _emit(self, kind: str, step: int, **fields: Any) -> dict[str, Any]:
        if self.events is not None:
            self.events.emit(kind, step, **fields)
        return {"kind": kind, **fields}

    def _report(self, stuck_after_s: float) -> TraceReport | None:
        incarnation = self.reader.read()
        if incarnation is None:
            return None
        return report_of(incarnation, 1, self.world, stuck_after_s=stuck_after_s, ratio=self.ratio, min_s=self.min_s,
                         window=self.window)

    def after_step(self, step: int) -> Found:
        """Check the trace after ``step``'s update (see the class rule)."""
        report = self._report(self.timeout_s)
        if report is None or step not in report.step_compute:
            return Found([])
        compute = report.step_compute[step]
        if len(compute) < self.world or min(compute.values()) <= 0:
            return Found([])
        if self.flagged is None and report.slow is None:
            return Found([])
        ranks = list(range(self.world))
        for r in ranks:
            self.speeds.update("update", r, step, compute[r], work=self.shares[r])
        weights = self.speeds.weights("update", ranks)
        balanced = [weights[r] for r in ranks]
        if self.flagged is None:
            self.flagged, self.shares = report.slow.rank, balanced
            event = self._emit("straggler", step, rank=report.slow.rank, lateness_s=report.slow.lateness_s,
                               share=balanced[report.slow.rank], shares=balanced)
            return Found([event], list(balanced))
        if max(balanced) <= (1 + self.ratio) / 2 * min(balanced):
            rank, self.flagged = self.flagged, None
            self.shares = [1.0 / self.world] * self.world
            for r in ranks:
                self.speeds.forget("update", r)
            return Found([self._emit("straggler_recovered", step, rank=rank)], list(self.shares))
        if any(abs(b - s) > 0.1 * s for b, s in zip(balanced, self.shares)):
            self.shares = balanced
            return Found([], list(balanced))
        return Found([])

    def on_timeout(self, step: int) -> int | None:
        """After ``step``'s update call timed out: the rank that never entered the newest
        collective (a ``hang`` event naming it, its op and sequence number), or None (the event
        then says no rank was missing: every rank is inside the collective)."""
        report = self._report(0.0)
        stuck = None if report is None else report.stuck
        if stuck is None:
            self._emit("hang", step, rank=None, op=None, seq=None, note="no rank missing from the newest collective")
            return None
        self._emit("hang", step, rank=stuck.rank, ranks=list(stuck.ranks), op=stuck.op, what=stuck.what, seq=stuck.seq,
                   waiting=list(stuck.waiting), waited_s=stuck.waited_s)
        return stuck.rank
