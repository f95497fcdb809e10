"""The rollout scheduler: owns each sample from the prompt sampler to the train batch.

Lifecycle of a sample (one of the ``n`` responses to a prompt)::

    queued ──► generating ──► scored ──► kept
                   │                └──► dropped (all correct | all wrong | surplus)
                   ├──► aborted
                   └──► failed

``queued``: its prompt was drawn for a generation batch. ``generating``: the batch is
being decoded. ``scored``: all ``n`` samples of its group ended and the group was graded
(``score``). ``kept``: :func:`reasonrl.algo.keep_groups` accepts the group (its ``acc``
values are not all equal, or it is a group of one: DAPO dynamic sampling as verl does it)
and the train batch still had room. ``dropped``: all correct or all wrong (no learning
signal), or ``surplus``: accepted but the batch was already full. ``aborted``: its group had not ended when the batch became full;
decoding stopped there and the group was thrown away unscored. ``failed``: its group ran out of
retries on the rollout fleet (``rollout.group_retries``: its workers died, hung or raised) and
was never generated whole; a batch without dynamic sampling draws as many new prompts as
groups failed, so it still holds ``want_groups`` groups.

With dynamic sampling and a streaming generator (one whose ``streams`` is True, such as
:class:`~reasonrl.rollout.fast.FastGenerator`: it has ``generate_stream``), groups are graded the moment they complete
and decoding stops as soon as ``want_groups`` mixed groups are kept, so nothing is
generated past that point. Generation batches are sized to what is still missing
(``ceil(missing * oversample)`` prompts, or a fixed ``gen_batch_prompts``), and prompts
are drawn from ``next_prompts`` only when a batch starts, each with its group's sampling
seed (:func:`~reasonrl.rollout.seeds.group_seed` of the run seed and its draw index): a
group samples the same tokens whichever generation batch, and wherever in it, it lands.
Everything runs in the caller's thread, in a fixed order (decode step, then prompt index):
the same seeds and inputs give the same batch, whatever the timing.

Caveat: with early stop the groups that complete first are kept, so a batch that stops
early leans toward groups whose longest sample is short (``bench/dynamic_sampling.py``
measures it). ``early_stop=False`` keeps the sized refills without that lean.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from enum import Enum
from typing import Callable

import torch

from reasonrl import algo
from reasonrl.errors import LimitError
from reasonrl.rollout.base import generate_for
from reasonrl.types import Prompt, RolloutBatch, SamplingParams, ScoredBatch

ScoreFn = Callable[[RolloutBatch, list[Prompt]], ScoredBatch]
"""``score(rollout, prompts) -> ScoredBatch``, ``prompts`` with one entry per row."""

NextPrompts = Callable[[int], list[tuple[Prompt, list[int], int]]]
"""``next_prompts(k)``: the next ``k`` prompts as ``(prompt, token ids, seed)`` triples, ``seed``
the group's sampling seed (advances the sampler)."""


class DynamicSamplingError(LimitError, RuntimeError):
    """Dynamic sampling gave up: too few mixed-outcome groups within max_gen_batches (the
    same seed would give up at the same step again)."""

    def __init__(self, message: str, stats: dict[str, float]) -> None:
        super().__init__(message)
        self.stats = stats


class SampleState(str, Enum):
    QUEUED = "queued"
    GENERATING = "generating"
    SCORED = "scored"
    KEPT = "kept"
    DROPPED = "dropped"
    ABORTED = "aborted"
    FAILED = "failed"


@dataclass
class Sample:
    """One sample's record. ``gen_batch``: 0-based generation batch of the ``collect`` call;
    ``group``: its prompt's index in that batch; ``index``: which of the ``n`` samples;
    ``reason``: why it was dropped (``all_correct``, ``all_wrong``, ``surplus``);
    ``tokens``: tokens generated for it (EOS included), also when aborted; ``correct``: its
    grade once scored (None before, and when it never was)."""

    prompt_id: str
    gen_batch: int
    group: int
    index: int
    state: SampleState = SampleState.QUEUED
    reason: str = ""
    tokens: int = 0
    correct: bool | None = None


class RolloutScheduler:
    """Collects a train batch of ``want_groups`` groups of ``n`` scored samples.

    generator:         a RolloutBackend; used in streaming mode when its ``streams`` is True
    score:             ``score(rollout, prompts) -> ScoredBatch`` (e.g. ``RewardWorker.score``)
    n, params:         samples per prompt and how to sample
    want_groups:       groups in the returned batch (``train.prompts_per_step``)
    dynamic:           keep only groups with mixed outcomes (``algo.dynamic_sampling``)
    max_gen_batches:   give up once the prompts drawn reach this many full generation batches
                       (``algo.max_gen_batches``; a full batch: ``batch_prompts(want_groups)``),
                       DAPO's limit of whole batches; a smaller refill counts what it draws
    oversample:        prompts per generation batch = ``ceil(missing groups * oversample)``
    gen_batch_prompts: if > 0, a fixed number of prompts per generation batch instead
    early_stop:        stop decoding (and abort what is unfinished) once the batch is full;
                       False (or a generator without ``generate_stream``) decodes whole
                       generation batches and keeps mixed groups in prompt order
    pad_id:            padding token id, to re-pad concatenated batches

    After :meth:`collect`, ``samples`` holds every sample's record (in the order the
    prompts were drawn), ``kept_draws`` the draw ordinal (0-based, in that order) of each
    group of the batch, ``errors`` the reward errors of every ``score`` call, and ``timing``
    the seconds spent (``gen``: decoding, ``reward``: inside ``score``).
    """

    def __init__(
        self,
        generator,
        score: ScoreFn,
        n: int,
        params: SamplingParams,
        want_groups: int,
        *,
        dynamic: bool = True,
        max_gen_batches: int = 10,
        oversample: float = 2.0,
        gen_batch_prompts: int = 0,
        early_stop: bool = True,
        pad_id: int = 0,
    ) -> None:
        if want_groups < 1:
            raise ValueError(f"want_groups (train.prompts_per_step): expected >= 1, got {want_groups}")
        if n < 1:
            raise ValueError(f"n (rollout.n): expected >= 1, got {n}")
        if max_gen_batches < 1:
            raise ValueError(f"max_gen_batches (algo.max_gen_batches): expected >= 1, got {max_gen_batches}")
        if not oversample >= 1.0:
            raise ValueError(f"oversample: expected a factor >= 1.0, got {oversample}")
        if gen_batch_prompts < 0:
            raise ValueError(f"gen_batch_prompts (train.gen_prompts_per_step): expected >= 0, got {gen_batch_prompts}")
        self.generator = generator
        self.score = score
        self.n = n
        self.params = params
        self.want_groups = want_groups
        self.dynamic = dynamic
        self.max_gen_batches = max_gen_batches
        self.oversample = oversample
        self.gen_batch_prompts = gen_batch_prompts
        self.early_stop = early_stop
        self.pad_id = pad_id
        self.samples: list[Sample] = []
        self.kept_draws: list[int] = []
        self.errors: list[str] = []
        self.timeouts = 0
        self._base: dict[int, int] = {}
        self.timing: dict[str, float] = {}

    @property
    def streaming(self) -> bool:
        """Whether ``collect`` decodes with early stop (dynamic, early_stop, a streaming generator)."""
        return self.dynamic and self.early_stop and self.generator.streams

    def batch_prompts(self, missing: int) -> int:
        """Prompts in the next generation batch when ``missing`` groups are still wanted."""
        if not self.dynamic:
            return self.want_groups
        if self.gen_batch_prompts:
            return self.gen_batch_prompts
        return max(missing, math.ceil(missing * self.oversample - 1e-9))

    # ------------------------------------------------------------------ collect
    def collect(self, next_prompts: NextPrompts) -> tuple[ScoredBatch, dict[str, float]]:
        """Generate and score until ``want_groups`` groups are kept; return ``(batch, stats)``.

        The batch holds exactly ``want_groups`` groups of ``n`` rows, group ids ``0..want-1``
        in the order the groups were kept (generation batch, then decode step at which the
        group completed, then prompt index). Without dynamic sampling it is the single
        generation batch of ``want_groups`` prompts, as scored. Each group samples with the
        seed ``next_prompts`` gave it. Raises :class:`DynamicSamplingError` when
        the prompts of ``max_gen_batches`` full batches did not yield enough mixed groups.
        """
        self.samples = []
        self.kept_draws = []
        self.errors = []
        self.timeouts = 0
        self._base = {}
        self.timing = {"gen": 0.0, "reward": 0.0}
        start = time.perf_counter()
        try:
            if not self.dynamic:
                return self._collect_plain(next_prompts)
            return self._collect_dynamic(next_prompts)
        finally:
            self.timing["gen"] = time.perf_counter() - start - self.timing["reward"]

    def _draw(self, next_prompts: NextPrompts, k: int, gen_batch: int) -> list[tuple[Prompt, list[int], int]]:
        """The next ``k`` ``(prompt, ids, seed)`` triples, their samples recorded as generation batch ``gen_batch``."""
        self._base[gen_batch] = len(self.samples)
        drawn = list(next_prompts(k))
        if len(drawn) != k:
            raise ValueError(f"next_prompts({k}) returned {len(drawn)} prompts, expected {k}")
        for g, (prompt, _, _) in enumerate(drawn):
            for j in range(self.n):
                self.samples.append(Sample(prompt.id, gen_batch, g, j))
        return drawn

    def _records(self, gen_batch: int, groups) -> list[Sample]:
        """Records of groups ``groups`` of generation batch ``gen_batch``, row order."""
        base = self._base[gen_batch]
        return [self.samples[base + g * self.n + j] for g in groups for j in range(self.n)]

    def _score(self, rollout: RolloutBatch, drawn, gen_batch: int) -> ScoredBatch:
        prompts = [drawn[g][0] for g in rollout.group_ids.tolist()]
        start = time.perf_counter()
        scored = self.score(rollout, prompts)
        self.timing["reward"] += time.perf_counter() - start
        self.errors += scored.errors
        self.timeouts += int(scored.timed_out.sum())
        if scored.acc.shape[0] != rollout.size:
            raise ValueError(f"score: returned {scored.acc.shape[0]} acc values for {rollout.size} rows")
        groups = rollout.group_ids[:: self.n].tolist()
        for record, length, correct in zip(self._records(gen_batch, groups), rollout.lengths.tolist(),
                                           scored.acc.bool().tolist(), strict=True):
            record.state, record.tokens, record.correct = SampleState.SCORED, length, correct
        return scored

    def _collect_plain(self, next_prompts: NextPrompts):
        parts: list[ScoredBatch] = []
        gen_batch = have = 0
        while have < self.want_groups:
            drawn = self._draw(next_prompts, self.want_groups - have, gen_batch)
            self._set_state(SampleState.GENERATING, gen_batch)
            rollout = self._generate(drawn)
            self._fail_missing(rollout, gen_batch, len(drawn))
            scored = self._score(rollout, drawn, gen_batch)
            groups = rollout.group_ids[:: self.n].tolist()
            for record in self._records(gen_batch, groups):
                record.state = SampleState.KEPT
            self.kept_draws += [(self._base[gen_batch] + g * self.n) // self.n for g in groups]
            parts.append(scored)
            have += len(groups)
            gen_batch += 1
        if gen_batch == 1 and have == len(drawn):
            return scored, self.stats(1)
        for part in parts:  # group ids 0.. in keep order, as a dynamic batch's
            ids = torch.unique(part.rollout.group_ids, return_inverse=True)[1]
            part.rollout = replace(part.rollout, group_ids=ids)
        return trim_padding(ScoredBatch.concat(parts, self.pad_id)), self.stats(gen_batch)

    def _fail_missing(self, rollout: RolloutBatch, gen_batch: int, size: int) -> None:
        """Mark the groups of generation batch ``gen_batch`` (``size`` groups) that the generator
        left out of ``rollout`` as failed (out of retries on the rollout fleet)."""
        present = set(rollout.group_ids[:: self.n].tolist())
        for record in self._records(gen_batch, [g for g in range(size) if g not in present]):
            record.state = SampleState.FAILED

    def _generate(self, drawn) -> RolloutBatch:
        """The whole rollout of the drawn ``(prompt, ids, seed)`` triples."""
        prompts, ids, seeds = (list(column) for column in zip(*drawn))
        return generate_for(self.generator, prompts, ids, self.n, self.params, seeds)

    def _set_state(self, state: SampleState, gen_batch: int | None = None) -> None:
        for s in self.samples:
            if gen_batch is None or s.gen_batch == gen_batch:
                s.state = state

    def _collect_dynamic(self, next_prompts: NextPrompts):
        kept: list[ScoredBatch] = []
        gen_batch = drawn = 0
        budget = self.max_gen_batches * self.batch_prompts(self.want_groups)
        while len(kept) < self.want_groups:
            if drawn >= budget:
                stats = self.stats(gen_batch)
                raise DynamicSamplingError(self._give_up_message(stats, drawn), stats)
            size = self.batch_prompts(self.want_groups - len(kept))
            triples = self._draw(next_prompts, size, gen_batch)
            drawn += size
            self._set_state(SampleState.GENERATING, gen_batch)

            def on_groups_done(groups: list[int], rows: RolloutBatch, triples=triples, gen_batch=gen_batch) -> bool:
                self._keep_mixed(self._score(rows, triples, gen_batch), gen_batch, kept)
                return len(kept) >= self.want_groups

            if self.streaming:
                ids, seeds = [t[1] for t in triples], [t[2] for t in triples]
                result = self.generator.generate_stream(ids, self.n, self.params, seeds, on_groups_done)
                records = self._records(gen_batch, result.aborted)
                for record, length in zip(records, result.aborted_lengths, strict=True):
                    record.state, record.tokens = SampleState.ABORTED, length
                for record in self._records(gen_batch, getattr(result, "failed", ())):
                    record.state = SampleState.FAILED
            else:
                rollout = self._generate(triples)
                self._fail_missing(rollout, gen_batch, len(triples))
                on_groups_done(list(range(len(triples))), rollout)
            gen_batch += 1
        batch = trim_padding(ScoredBatch.concat(kept, self.pad_id))
        return batch, self.stats(gen_batch)

    def _keep_mixed(self, scored: ScoredBatch, gen_batch: int, kept: list[ScoredBatch]) -> None:
        """Sort the groups of ``scored`` (prompt order) into kept / dropped by ``algo.keep_groups``."""
        n = self.n
        accepted = algo.keep_groups(scored.acc, scored.rollout.group_ids)[::n].tolist()
        correct = scored.acc.bool().view(-1, n).any(1).tolist()
        groups = scored.rollout.group_ids[::n].tolist()
        for i, g in enumerate(groups):
            if not accepted[i]:
                state, reason = SampleState.DROPPED, "all_correct" if correct[i] else "all_wrong"
            elif len(kept) >= self.want_groups:
                state, reason = SampleState.DROPPED, "surplus"
            else:
                state, reason = SampleState.KEPT, ""
                self.kept_draws.append((self._base[gen_batch] + g * n) // n)
                rows = scored.select(torch.arange(i * n, (i + 1) * n))
                rows.rollout = replace(rows.rollout, group_ids=torch.zeros_like(rows.rollout.group_ids))
                kept.append(rows)
            for record in self._records(gen_batch, [g]):
                record.state, record.reason = state, reason

    # ------------------------------------------------------------------ stats
    def stats(self, num_gen_batches: int) -> dict[str, float]:
        """Counts over ``samples`` (see the module docstring for the states):

        ``batch/num_gen_batches``; ``batch/kept_groups``; ``batch/dropped_all_correct``,
        ``batch/dropped_all_wrong``, ``batch/surplus_groups``, ``batch/failed_groups`` (groups);
        ``batch/generated_samples``
        (samples that completed: kept + dropped); ``batch/aborted_samples`` and
        ``batch/aborted_tokens``; ``batch/wasted_samples`` (completed, not kept);
        ``batch/samples_per_kept_group`` (all samples started, completed or aborted, per
        kept group; inf when none was kept); ``batch/generated_tokens`` (completed samples)
        and ``batch/tokens_per_kept_group`` (tokens of all samples started, per kept group);
        ``reward/timeouts``: samples of every ``score`` call whose reward function ran past its
        time limit (scored as failed), kept or not.
        """
        n = self.n
        count = {state: 0 for state in SampleState}
        reasons = {"all_correct": 0, "all_wrong": 0, "surplus": 0}
        tokens = {"completed": 0, "aborted": 0}
        for s in self.samples:
            count[s.state] += 1
            if s.state is SampleState.DROPPED:
                reasons[s.reason] += 1
            if s.state is SampleState.ABORTED:
                tokens["aborted"] += s.tokens
            elif s.state in (SampleState.KEPT, SampleState.DROPPED, SampleState.SCORED):
                tokens["completed"] += s.tokens
        kept_groups = count[SampleState.KEPT] // n
        completed = count[SampleState.KEPT] + count[SampleState.DROPPED] + count[SampleState.SCORED]
        started = len(self.samples)
        per_group = (lambda x: x / kept_groups) if kept_groups else (lambda x: math.inf)
        return {
            "batch/num_gen_batches": float(num_gen_batches),
            "batch/kept_groups": float(kept_groups),
            "batch/dropped_all_correct": float(reasons["all_correct"] // n),
            "batch/dropped_all_wrong": float(reasons["all_wrong"] // n),
            "batch/surplus_groups": float(reasons["surplus"] // n),
            "batch/failed_groups": float(count[SampleState.FAILED] // n),
            "batch/generated_samples": float(completed),
            "batch/aborted_samples": float(count[SampleState.ABORTED]),
            "batch/aborted_tokens": float(tokens["aborted"]),
            "batch/wasted_samples": float(completed - count[SampleState.KEPT]),
            "batch/samples_per_kept_group": float(per_group(started)),
            "batch/generated_tokens": float(tokens["completed"]),
            "batch/tokens_per_kept_group": float(per_group(tokens["completed"] + tokens["aborted"])),
            "reward/timeouts": float(self.timeouts),
        }

    def _give_up_message(self, stats: dict[str, float], drawn: int) -> str:
        return (
            f"dynamic sampling: only {int(stats['batch/kept_groups'])} of {self.want_groups} groups with mixed "
            f"outcomes from {drawn} prompts in {int(stats['batch/num_gen_batches'])} generation batches, the budget of "
            f"algo.max_gen_batches={self.max_gen_batches} batches of {self.batch_prompts(self.want_groups)} prompts "
            f"({int(stats['batch/dropped_all_correct'])} groups dropped all correct, "
            f"{int(stats['batch/dropped_all_wrong'])} dropped all wrong, "
            f"{int(stats['batch/generated_samples'])} samples generated); "
            "raise algo.max_gen_batches or train.gen_prompts_per_step, lower train.prompts_per_step, "
            "or set algo.dynamic_sampling=false"
        )


def merge_stats(stats: list[dict[str, float]]) -> dict[str, float]:
    """The ``batch/*`` counts of several collects as one: counts summed, the two per-kept-group
    ratios recomputed from the sums (started samples = generated + aborted; tokens likewise).
    One collect's stats come back unchanged."""
    if len(stats) == 1:
        return dict(stats[0])
    out = {k: sum(s[k] for s in stats) for k in stats[0]}
    kept = out["batch/kept_groups"]
    started = out["batch/generated_samples"] + out["batch/aborted_samples"]
    tokens = out["batch/generated_tokens"] + out["batch/aborted_tokens"]
    out["batch/samples_per_kept_group"] = started / kept if kept else math.inf
    out["batch/tokens_per_kept_group"] = tokens / kept if kept else math.inf
    return out


def trim_padding(batch: ScoredBatch) -> ScoredBatch:
    """Drop prompt columns that are padding in every row and response columns past the longest."""
    r = batch.rollout
    real = r.prompt_mask.bool().any(0)
    first = int(real.nonzero()[0]) if real.any() else r.prompt_mask.shape[1]
    T = int(r.lengths.max()) if r.size else 0
    rollout = replace(
        r,
        prompt_ids=r.prompt_ids[:, first:],
        prompt_mask=r.prompt_mask[:, first:],
        response_ids=r.response_ids[:, :T],
        response_mask=r.response_mask[:, :T],
        logprobs=r.logprobs[:, :T],
        versions=r.versions[:, :T],
        action_mask=r.action_mask[:, :T],
        token_rewards=None if r.token_rewards is None else r.token_rewards[:, :T],
    )
    return replace(batch, rollout=rollout)
