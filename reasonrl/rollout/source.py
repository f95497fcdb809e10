"""Rollout sources: where the trainer's batches come from, between generation and training.

    batch = source.next_batch(version)   # the next train batch, its metrics and its prompt records
    source.publish(update)               # the trainer's weights after an update
    source.state_dict(); source.load_state_dict(state)

The rollout side of a run is a :class:`RolloutProducer`: the prompt sampler, the rollout
scheduler (dynamic sampling, early stop, every sample's lifecycle), the rollout fleet (N
rollout workers, :mod:`reasonrl.rollout.fleet`) and a reward worker. Each :meth:`RolloutProducer.collect` yields one train batch's worth of
complete, scored groups, tagged with the version of the weights that sampled every token.
Collected groups wait in a :class:`GroupQueue` until the trainer takes them; a group whose
staleness (trainer version - its oldest token's version) exceeds ``rollout.max_staleness``,
or is negative (sampled by weights a rollback discarded), is dropped there and counted.

:class:`AsyncSource` runs the producer on a thread of the trainer's process, beside the
trainer; the rollout workers sample with their own copy of the weights (or, at staleness 0
and colocated with the policy, with the policy's own module). Admission is paced: with
``ahead`` the batches collected or in flight and not yet taken, a new collect is submitted
only while ``ahead + (1 while a taken batch is being trained) <= max_staleness``, so a batch
sampled at version v is trained at version v + max_staleness at the latest. In ``async``
mode the newest weights are offered to every rollout worker at once and taken up before its
next generation call; in ``lockstep`` mode each collect is preceded by the weights it must
use, so batch n is generated with exactly version max(0, n - max_staleness): deterministic,
as a resumed run needs. ``rollout.mode=sync`` is lockstep at staleness 0: one definition, in
every runtime.

At ``max_staleness=0`` all three modes produce the same batches from the same seed.
"""

from __future__ import annotations

import math
import time
from collections import deque
from concurrent.futures import Future, TimeoutError as FutureTimeout
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import torch

from reasonrl.config import Config
from reasonrl.data.pool import PromptPool
from reasonrl.rollout.scheduler import RolloutScheduler, SampleState, merge_stats, trim_padding
from reasonrl.rollout.seeds import group_seed
from reasonrl.types import Prompt, RolloutBatch, SamplingParams, ScoredBatch, WeightsUpdate


@dataclass
class Collected:
    """One :meth:`RolloutProducer.collect`: ``want`` groups and what it took to get them.

    batch:     the kept groups, ``n`` rows each, group ids 0.. in keep order
    kept:      the draw index of each group of ``batch``, in order
    draws:     ``[draw, dataset row, fate]`` of every prompt drawn for it, in draw order; fate
               is ``kept``, ``all_correct``, ``all_wrong``, ``surplus``, ``aborted`` or ``failed``
    stats:     the scheduler's ``batch/*`` counts
    errors:    reward errors of its samples
    started, finished: wall-clock seconds (``time.time()``) around it
    gen_s, reward_s:   seconds decoding and grading; ``idle_s``: the producer's idle time before it
    state:     the producer's state after it (resuming from it draws the next prompts)
    workers:   ``rollout/worker<i>/*`` counts of the fleet's workers during it
    data:      the prompt pool's ``data/*`` metrics of it (:meth:`PromptPool.end_batch`)
    """

    batch: ScoredBatch
    kept: list[int]
    draws: list[list]
    stats: dict[str, float]
    errors: list[str]
    started: float
    finished: float
    gen_s: float
    reward_s: float
    idle_s: float
    state: dict
    workers: dict[str, float] = field(default_factory=dict)
    data: dict[str, float] = field(default_factory=dict)


class RolloutProducer:
    """The rollout side: prompt sampler -> rollout scheduler -> rollout worker -> reward worker.

    ``rollout`` is what the scheduler samples with (a
    :class:`~reasonrl.rollout.fleet.RolloutFleet`); ``reward`` scores the groups; ``prompts``
    and their token ids the training split. The prompt pool (:class:`~reasonrl.data.pool.PromptPool`:
    sampler, data mix, curriculum) is seeded with ``run.seed`` and learns from every scored
    group of each collect; the group of the ``d``-th prompt drawn in the run samples with
    ``group_seed(run.seed, d)`` (:func:`~reasonrl.rollout.seeds.group_seed`), whichever batch or
    worker generates it.
    ``sizes(c)`` is the rollout count scheduled for the ``c``-th collect of the run, or None
    (:class:`~reasonrl.runtime.scaling.ScaleSchedule`): before that collect the fleet is
    resized to it, and every worker of the new size serves before the first group goes out.
    """

    def __init__(self, cfg: Config, rollout, reward, prompts: list[Prompt], prompt_ids: list[list[int]], pad_id: int,
                 sizes: Callable[[int], int | None] = lambda collect: None) -> None:
        self.rollout, self.reward, self.sizes = rollout, reward, sizes
        self.timeout_s = cfg.runtime.roles.rollout.timeout_s
        self.collects = 0
        self.prompts, self.prompt_ids = prompts, prompt_ids
        t, r, a = cfg.train, cfg.rollout, cfg.algo
        self.pool = PromptPool(cfg.data, [p.data_source for p in prompts], cfg.run.seed)
        self.seed = cfg.run.seed
        self.draws = 0
        self.scheduler = RolloutScheduler(
            rollout, reward.score, r.n, SamplingParams(r.temperature, r.top_p, r.top_k, r.max_new_tokens), t.prompts_per_step,
            dynamic=a.dynamic_sampling, max_gen_batches=a.max_gen_batches, oversample=a.oversample,
            gen_batch_prompts=t.gen_prompts_per_step, early_stop=a.early_stop, pad_id=pad_id,
        )
        self._drawn: list[tuple[int, int]] = []
        self._idle_since = time.time()

    def _next_prompts(self, k: int) -> list[tuple[Prompt, list[int], int]]:
        """The next ``k`` draws as ``(prompt, token ids, group seed)`` (the scheduler's ``next_prompts``)."""
        rows = self.pool.next(k)
        draws = range(self.draws, self.draws + k)
        self._drawn += list(zip(draws, rows))
        self.draws += k
        return [(self.prompts[i], self.prompt_ids[i], group_seed(self.seed, d)) for d, i in zip(draws, rows)]

    def collect(self, held_out: list[dict] = ()) -> Collected:
        """Generate and score one train batch's worth of groups (see :class:`RolloutScheduler`),
        then let the prompt pool learn from them. ``held_out``: validations' per-source
        accuracies, ``{"after": a, "accuracy": {source: acc}}``, each taken in by collect number
        a + 1 (the first collect submitted after it was measured) and passed over by later ones."""
        count = self.sizes(self.collects + 1)
        if count is not None and count != self.rollout.target:
            self.rollout.resize(count)
            self.rollout.wait_resized(self.timeout_s)
            self.rollout.emit("rollout_scaled", workers=count, collect=self.collects + 1)
        started = time.time()
        self._drawn = []
        batch, stats = self.scheduler.collect(self._next_prompts)
        self.collects += 1
        n = self.scheduler.n
        samples = self.scheduler.samples
        fates = [_fate(s.state, s.reason) for s in samples[::n]]
        draws = [[draw, row, fate] for (draw, row), fate in zip(self._drawn, fates, strict=True)]
        kept = [self._drawn[i][0] for i in self.scheduler.kept_draws]
        groups = [(row, sum(s.correct for s in group), n) for (_, row), group
                  in zip(self._drawn, (samples[i : i + n] for i in range(0, len(samples), n)), strict=True)
                  if group[0].correct is not None]
        data = self.pool.end_batch(groups, [h["accuracy"] for h in held_out if h["after"] == self.collects - 1])
        finished = time.time()
        idle, self._idle_since = started - self._idle_since, finished
        timing = self.scheduler.timing
        return Collected(batch, kept, draws, stats, list(self.scheduler.errors), started, finished,
                         timing["gen"], timing["reward"], idle, self.state_dict(), self.rollout.take_stats(), data)

    def pids(self) -> list[int]:
        """The rollout workers' process ids."""
        return self.rollout.group.pids

    def load_weights(self, update: WeightsUpdate) -> dict[str, float]:
        """Every rollout worker samples with ``update``; the ``weight_sync/*`` figures
        (:meth:`~reasonrl.rollout.fleet.RolloutFleet.load_weights`)."""
        return self.rollout.load_weights(update)

    def offer_weights(self, update: WeightsUpdate) -> dict[str, float]:
        """Thread-safe: every rollout worker takes ``update`` up before its next generation
        call; the ``weight_sync/*`` figures."""
        return self.rollout.offer_weights(update)

    def stage_weights(self, update: WeightsUpdate) -> dict[str, float]:
        """Thread-safe: every rollout worker keeps ``update``, for :meth:`load_staged` to load
        when its turn comes (lockstep: the transfer happens at publish, the load between the
        collects it sits between); the ``weight_sync/*`` figures."""
        return self.rollout.stage_weights(update)

    def load_staged(self, version: int) -> None:
        """Every rollout worker loads its staged weights, which must be ``version``."""
        self.rollout.load_staged(version)

    def resize(self, count: int) -> None:
        """Thread-safe: the rollout fleet grows or shrinks to ``count`` workers (beside a running
        collect; :meth:`~reasonrl.rollout.fleet.RolloutFleet.resize`)."""
        self.rollout.resize(count)

    def resize_reward(self, count: int) -> None:
        """Grade with ``count`` reward workers from the next collect on (run between collects,
        on the producer's thread)."""
        self.reward.resize(count)

    def state_dict(self) -> dict:
        """``sampler`` (the prompt pool's state), ``draws`` (prompts drawn so far: the next draw's
        index, hence its seed), ``collects`` (the collects so far: the next one's scheduled size)
        and the reward worker's state. The rollout workers hold none: their weights are published
        again after a restore."""
        return {"sampler": self.pool.state_dict(), "draws": self.draws, "collects": self.collects,
                "reward": self.reward.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.pool.load_state_dict(state["sampler"])
        self.draws = int(state["draws"])
        self.collects = int(state["collects"])
        self.reward.load_state_dict(state["reward"])

    def close(self) -> None:
        """Stop the reward processes and the rollout workers."""
        self.reward.close()
        self.rollout.close()


def _fate(state: SampleState, reason: str) -> str:
    return reason if state is SampleState.DROPPED else state.value


@dataclass
class SourceBatch:
    """What :meth:`next_batch` returns: the train batch, the step's rollout metrics, the
    prompt record of the step (``drawn``, ``trained``, ``stale`` draw indices) and the reward
    errors."""

    scored: ScoredBatch
    metrics: dict[str, float]
    record: dict[str, list]
    errors: list[str]


@dataclass
class _Group:
    scored: ScoredBatch
    draw: int
    oldest: int
    started: float
    finished: float


@dataclass
class _Pending:
    """What the collects put since the last take contribute to the next take's metrics."""

    stats: list[dict[str, float]] = field(default_factory=list)
    drawn: list[list] = field(default_factory=list)
    stale: list[int] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    wasted_tokens: float = 0.0
    gen_s: float = 0.0
    reward_s: float = 0.0
    idle_s: float = 0.0
    workers: dict[str, float] = field(default_factory=dict)
    data: dict[str, float] = field(default_factory=dict)


COUNTED_DATA = ("data/curriculum/retired", "data/curriculum/returned")
"""The prompt pool's metrics that count events of a collect (summed over a step's collects);
its other ``data/*`` metrics are levels (the newest one is the step's)."""


class GroupQueue:
    """Complete, scored groups waiting to be trained, oldest first, with the staleness bound.

    :meth:`put` splits a :class:`Collected` into its groups; :meth:`take` hands out the
    oldest ``want`` groups that are fresh for the trainer's version (0 <= staleness <=
    ``max_staleness``), dropping the others, and returns None while fewer are waiting. Every
    take reports the prompt pool's ``data/*`` metrics: those of the collects since the last
    take, or, when none came, the levels of the last one (and 0 for the counts).
    """

    def __init__(self, n: int, pad_id: int, max_staleness: int) -> None:
        self.n, self.pad_id, self.max_staleness = n, pad_id, max_staleness
        self.groups: deque[_Group] = deque()
        self.pending = _Pending()
        self.last_data: dict[str, float] = {}

    def __len__(self) -> int:
        return len(self.groups)

    def put(self, c: Collected) -> None:
        n, b = self.n, c.batch
        oldest = b.rollout.oldest_versions().tolist()
        for g, draw in enumerate(c.kept):
            rows = b.select(torch.arange(g * n, (g + 1) * n, device=b.rollout.response_mask.device))
            rows.rollout.group_ids = torch.zeros_like(rows.rollout.group_ids)
            self.groups.append(_Group(rows, draw, min(oldest[g * n : (g + 1) * n]), c.started, c.finished))
        p = self.pending
        p.stats.append(c.stats)
        p.drawn += c.draws
        p.errors += c.errors
        p.wasted_tokens += c.stats["batch/generated_tokens"] + c.stats["batch/aborted_tokens"] - float(b.rollout.lengths.sum())
        p.gen_s += c.gen_s
        p.reward_s += c.reward_s
        p.idle_s += c.idle_s
        for key, value in c.workers.items():
            p.workers[key] = p.workers.get(key, 0.0) + value
        for key, value in c.data.items():
            p.data[key] = p.data.get(key, 0.0) + value if key in COUNTED_DATA else value

    def take(self, want: int, version: int) -> SourceBatch | None:
        """``want`` fresh groups as one batch with this step's rollout metrics, or None."""
        fresh: list[tuple[_Group, int]] = []
        while len(fresh) < want and self.groups:
            group = self.groups.popleft()
            staleness = version - group.oldest
            if 0 <= staleness <= self.max_staleness:
                fresh.append((group, staleness))
            else:
                self.pending.stale.append(group.draw)
                self.pending.wasted_tokens += float(group.scored.rollout.lengths.sum())
        if len(fresh) < want:
            self.groups.extendleft(g for g, _ in reversed(fresh))
            return None
        now, p = time.time(), self.pending
        self.pending = _Pending()
        scored = trim_padding(ScoredBatch.concat([g.scored for g, _ in fresh], self.pad_id))
        ages = sorted(float(s) for _, s in fresh)
        r = scored.rollout
        newest = r.versions.masked_fill(r.response_mask == 0, -1).amax(-1)
        metrics = {
            **(merge_stats(p.stats) if p.stats else _no_stats()),
            "staleness/mean": sum(ages) / len(ages),
            "staleness/p99": ages[min(len(ages) - 1, math.ceil(0.99 * len(ages)) - 1)],
            "staleness/max": ages[-1],
            "staleness/dropped_groups": float(len(p.stale)),
            "rollout/queue_length": float(len(self.groups)),
            "rollout/partial_samples": float((newest != r.oldest_versions()).sum()),
            "rollout/wasted_tokens": p.wasted_tokens,
            "timing_s/group_queued": sum(now - g.finished for g, _ in fresh) / len(fresh),
            "timing_s/group_in_flight": sum(g.finished - g.started for g, _ in fresh) / len(fresh),
            "timing_s/reward": p.reward_s,
            "timing_s/rollout_gen": p.gen_s,
            "timing_s/rollout_idle": p.idle_s,
            **p.workers,
        }
        self.last_data = {**{k: 0.0 if k in COUNTED_DATA else v for k, v in self.last_data.items()}, **p.data}
        metrics.update(self.last_data)
        record = {"drawn": p.drawn, "trained": [g.draw for g, _ in fresh], "stale": p.stale}
        return SourceBatch(scored, metrics, record, p.errors)

    def leftover(self) -> dict[str, list]:
        """What was sampled and never reported as trained: the draws of collects not yet
        reported (``drawn``), the groups still waiting (``queued``) and stale drops not yet
        reported (``stale``), all as draw indices."""
        return {"drawn": self.pending.drawn, "queued": [g.draw for g in self.groups], "stale": self.pending.stale}

    def state_dict(self) -> dict:
        """The waiting groups, the pending metrics and the last take's ``data/*`` metrics, in plain
        types (``torch.load(weights_only=True)``)."""
        return {"groups": [{"scored": _scored_state(g.scored), "draw": g.draw, "oldest": g.oldest,
                            "started": g.started, "finished": g.finished} for g in self.groups],
                "pending": asdict(self.pending), "last_data": dict(self.last_data)}

    def load_state_dict(self, state: dict) -> None:
        self.groups = deque(_Group(_scored_from_state(g["scored"]), g["draw"], g["oldest"], g["started"], g["finished"])
                            for g in state["groups"])
        self.pending = _Pending(**state["pending"])
        self.last_data = dict(state["last_data"])


def _no_stats() -> dict[str, float]:
    """``batch/*`` of a step to which no collect contributed (every group came earlier)."""
    zero = {k: 0.0 for k in ("batch/num_gen_batches", "batch/kept_groups", "batch/dropped_all_correct",
                             "batch/dropped_all_wrong", "batch/surplus_groups", "batch/generated_samples",
                             "batch/aborted_samples", "batch/aborted_tokens", "batch/wasted_samples",
                             "batch/generated_tokens", "reward/timeouts")}
    return {**zero, "batch/samples_per_kept_group": math.inf, "batch/tokens_per_kept_group": math.inf}


_ROLLOUT_TENSORS = ("prompt_ids", "prompt_mask", "response_ids", "response_mask", "logprobs", "eos", "truncated",
                    "group_ids", "versions", "action_mask")


def _rollout_state(r: RolloutBatch) -> dict:
    state = {k: getattr(r, k).cpu() for k in _ROLLOUT_TENSORS}
    if r.token_rewards is not None:
        state["token_rewards"] = r.token_rewards.cpu()
    if r.episodes is not None:
        state["episodes"] = list(r.episodes)
    return state


def _scored_state(s: ScoredBatch) -> dict:
    return {"rollout": _rollout_state(s.rollout), "prompts": [asdict(p) for p in s.prompts],
            "texts": list(s.texts), "scores": s.scores.cpu(), "acc": s.acc.cpu(), "failed": s.failed.cpu(),
            "preds": list(s.preds), "extras": list(s.extras), "timed_out": s.timed_out.cpu()}


def _scored_from_state(state: dict) -> ScoredBatch:
    return ScoredBatch(RolloutBatch(**state["rollout"]), [Prompt(**p) for p in state["prompts"]], state["texts"],
                       state["scores"], state["acc"], state["failed"], preds=state.get("preds", []),
                       extras=state.get("extras", []), timed_out=state.get("timed_out"))


class AsyncSource:
    """The rollout side of every mode: a producer that collects ahead within ``max_staleness``
    (see the module docstring).

    ``launch()`` starts the producer's host: a worker group of one :class:`RolloutProducer`
    (``offer_weights`` and ``stage_weights`` callable beside a running collect) whose calls
    run on a thread of their own, the producer dispatching generation to the rollout fleet.
    Each version crosses once, at :meth:`publish`, which waits until every rollout worker
    holds it (``weight_sync_s``; ``weight_sync`` the fleet's ``weight_sync/bytes`` and
    ``weight_sync/delta_frac`` of it): ``async`` offers it for the next generation call,
    ``lockstep`` stages it and loads it by version number before the collect it belongs to.
    ``timeout_s`` bounds every wait for a collect. A rollout worker that dies or hangs is
    the fleet's to replace (:class:`~reasonrl.rollout.fleet.RolloutFleet`); an error that
    reaches this source ends the run (the supervisor restarts it from its last checkpoint).
    ``emit(kind, **fields)`` writes the events.

    Held-out accuracies (:meth:`observe_held_out`, data.mix=adaptive) reach the producer's
    prompt pool with the collects: one measured when a collects had been submitted is taken
    in by collect a + 1, whatever the timing, so lockstep runs stay deterministic; it is kept
    (and checkpointed) until that collect is delivered, so a resumed run hands it to the same
    collect again.
    """

    def __init__(
        self,
        launch: Callable[[], Any],
        initial: WeightsUpdate,
        *,
        n: int,
        pad_id: int,
        want: int,
        max_staleness: int,
        lockstep: bool,
        timeout_s: float,
        emit: Callable[..., None],
    ) -> None:
        self.launch, self.want, self.max_staleness, self.lockstep = launch, want, max_staleness, lockstep
        self.timeout_s, self.emit = timeout_s, emit
        self.queue = GroupQueue(n, pad_id, max_staleness)
        self.latest = initial
        self.cursor: dict | None = None
        self.training = False
        self.outstanding: deque[tuple[Future, int, list[Future]]] = deque()  # (collect, version, loads before it)
        self.group = None
        self._launched = None
        """The producer's host launched ahead by :meth:`prepare`, not started yet."""
        self._sent_version: int | None = None
        self.delivered = 0
        """Collects delivered (pulled) so far; those submitted are these and ``outstanding``."""
        self.held_out: list[dict] = []
        """``{"after", "accuracy"}`` of the held-out accuracies that no delivered collect took in yet."""
        self.weight_sync_s = 0.0
        """Seconds the last :meth:`publish` took until every rollout worker held the weights."""
        self.weight_sync: dict[str, float] = {"weight_sync/bytes": 0.0, "weight_sync/delta_frac": 0.0}
        """``weight_sync/bytes`` and ``weight_sync/delta_frac`` of the last :meth:`publish` that
        reached the workers (:meth:`~reasonrl.rollout.fleet.RolloutFleet._deliver`)."""

    # ------------------------------------------------------------ the producer
    def prepare(self) -> None:
        """Launch the producer's host and the rollout workers now rather than at the first
        :meth:`publish` (a standby trainer does, before its go); the producer still starts from
        the state a resume restores."""
        if self.group is None and self._launched is None:
            self._launched = self.launch()

    def _start(self) -> None:
        self.group, self._launched = self._launched or self.launch(), None
        if self.cursor is not None:
            self.group.call("load_state_dict", self.cursor)
        self.group.call("load_weights", self.latest)
        self._sent_version = self.latest.version
        self.emit("rollout_started", pids=self.group.call("pids")[0])

    def _ahead(self) -> int:
        """Batches collected or in flight that no take has consumed yet."""
        return len(self.outstanding) + math.ceil(len(self.queue) / self.want)

    def _fill(self) -> None:
        """Submit collects while the staleness bound allows (the module docstring's rule)."""
        if self.group is None:
            self._start()
        while self._ahead() + self.training <= self.max_staleness:
            self._submit()

    def _submit(self) -> None:
        loads = []
        if self.lockstep and self._sent_version != self.latest.version:
            loads = self.group.submit("load_staged", self.latest.version)
            self._sent_version = self.latest.version
        number = self.delivered + len(self.outstanding) + 1
        due = [h for h in self.held_out if h["after"] < number]
        [collect] = self.group.submit("collect", due) if due else self.group.submit("collect")
        self.outstanding.append((collect, self.latest.version, loads))

    def _pull(self) -> None:
        """Wait for the oldest collect in flight and put its groups in the queue."""
        collect, _, loads = self.outstanding[0]
        try:
            for future in [*loads, collect]:
                future.result(timeout=self.timeout_s)
        except FutureTimeout:
            raise TimeoutError(f"rollout: no batch within {self.timeout_s} s (runtime.roles.rollout.timeout_s)") from None
        self.outstanding.popleft()
        collected: Collected = collect.result()
        self.cursor = collected.state
        self.delivered += 1
        self.held_out = [h for h in self.held_out if h["after"] >= self.delivered]
        self.queue.put(collected)

    # ------------------------------------------------------------ the source protocol
    def next_batch(self, version: int) -> SourceBatch:
        began = time.perf_counter()
        self._fill()
        while (batch := self.queue.take(self.want, version)) is None:
            if not self.outstanding:  # too few fresh groups left and nothing in flight
                self._submit()
            self._pull()
        self.training = True
        batch.metrics["rollout/queue_length"] += self.want * sum(f.done() for f, _, _ in self.outstanding)
        batch.metrics["timing_s/trainer_idle"] = time.perf_counter() - began
        return batch

    def observe_held_out(self, accuracy: dict[str, float]) -> None:
        """Per-source held-out accuracies of a validation, for the producer's prompt pool (the
        class docstring says which collect takes them in)."""
        if accuracy:
            self.held_out.append({"after": self.delivered + len(self.outstanding), "accuracy": dict(accuracy)})

    def publish(self, update: WeightsUpdate) -> None:
        self.latest = update
        self.training = False
        if self.group is not None:
            began = time.perf_counter()
            [held] = self.group.submit("stage_weights" if self.lockstep else "offer_weights", update)
            self.weight_sync = held.result(timeout=self.timeout_s)
            self.weight_sync_s = time.perf_counter() - began
        self._fill()

    def resize(self, count: int) -> None:
        """The rollout fleet grows or shrinks to ``count`` workers (it starts with the next
        collect when the producer has not started yet)."""
        if self.group is None:
            self._start()
        [done] = self.group.submit("resize", count)
        done.result(timeout=self.timeout_s)

    def resize_reward(self, count: int) -> None:
        """The producer grades with ``count`` reward workers from its next collect on (the
        change waits for the collects in flight: the pool is resized between two of them)."""
        if self.group is None:
            self._start()
        [done] = self.group.submit("resize_reward", count)
        done.result(timeout=self.timeout_s * (1 + len(self.outstanding)))

    def leftover(self) -> dict[str, list]:
        """Sampled and never trained (:meth:`GroupQueue.leftover`); collects still in flight
        are dropped unrecorded: the sampler position they drew from was never delivered."""
        return self.queue.leftover()

    def state_dict(self) -> dict:
        """The queue (collects in flight with older weights are waited for first in lockstep
        mode, since only their own version can regenerate them) and the rollout state after
        the last collect delivered."""
        while self.lockstep and self.outstanding and self.outstanding[0][1] < self.latest.version:
            self._pull()
        return {"producer": self.cursor, "queue": self.queue.state_dict(), "delivered": self.delivered,
                "held_out": [dict(h) for h in self.held_out]}

    def load_state_dict(self, state: dict) -> None:
        """Before the first batch only (a resume): the producer starts from ``state``."""
        if self.group is not None:
            raise RuntimeError("AsyncSource.load_state_dict: the producer has started; restore before the first batch")
        self.cursor = state["producer"]
        self.queue.load_state_dict(state["queue"])
        self.delivered = int(state["delivered"])
        self.held_out = [dict(h) for h in state["held_out"]]

    def close(self) -> None:
        for group in (self.group, self._launched):
            if group is not None:
                group.close()
        self.group = self._launched = None
