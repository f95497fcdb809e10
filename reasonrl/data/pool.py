"""The pool of training prompts the rollout producer draws from: the sampler, the mix of data
sources (``data.mix``) and the curriculum (``data.curriculum_window``).

    pool = PromptPool(cfg.data, [p.data_source for p in prompts], seed=cfg.run.seed)
    rows = pool.next(k)                         # the next k rows to generate for
    metrics = pool.end_batch(groups, held_out)  # after the rollout batch: (row, correct, n) of its scored groups
    pool.state_dict(); pool.load_state_dict(state)

``data.mix=uniform`` draws every row once per epoch in the order of one
:class:`~reasonrl.data.sampler.PromptSampler` (seeded with ``seed``). ``data.mix=adaptive`` (and
``static``) keeps one PromptSampler per source (each seeded with a hash of ``seed`` and the
source) and makes draw number d pick a source first: the one whose interval of the cumulative sampling
weights p (:class:`~reasonrl.data.mixing.SourceMix`) holds u_d, a number in [0, 1) hashed from
``(seed, d)``; then it takes that source's next row. With the curriculum on, the samplers pass
over the resting prompts (:class:`~reasonrl.data.curriculum.Curriculum`), a source all of whose
prompts rest is not picked, and when every prompt rests they all come back at once. The draws
depend only on the seed, the position and the weights, never on timing, so a restored state
draws the same rows.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from typing import Mapping

from reasonrl.config import DataConfig
from reasonrl.data.curriculum import Curriculum
from reasonrl.data.mixing import SourceMix, static_mix
from reasonrl.data.sampler import PromptSampler


def hashed_uniform(seed: int, draw: int) -> float:
    """u in [0, 1) from the first 53 bits of sha256("{seed}:mix:{draw}")."""
    digest = hashlib.sha256(f"{seed}:mix:{draw}".encode()).digest()
    return (int.from_bytes(digest[:8], "little") >> 11) / float(1 << 53)


def pick(weights: list[float], u: float) -> int:
    """The index i whose interval [sum_{j<i} q_j, sum_{j<=i} q_j) holds u * sum q (weights q
    >= 0, not all 0); a weight of 0 is never picked."""
    x, total = u * sum(weights), 0.0
    last = max(i for i, q in enumerate(weights) if q > 0)
    for i, q in enumerate(weights):
        total += q
        if q > 0 and x < total:
            return i
    return last


def _source_seed(seed: int, source: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}:{source}".encode()).digest()[:8], "little") >> 1


class PromptPool:
    """Draws training rows (indices into the training prompts, whose data sources are
    ``sources``) as the module docstring says, and learns from each rollout batch's results."""

    def __init__(self, data: DataConfig, sources: list[str], seed: int) -> None:
        if not sources:
            raise ValueError("PromptPool: no training prompts")
        self.row_source = list(sources)
        self.seed = seed
        self.curriculum = Curriculum(data.curriculum_window, data.curriculum_revisit) if data.curriculum_window else None
        self.mix: SourceMix | None = None
        if data.mix == "static":
            self.mix = static_mix(sources, data.mix_weights, data.mix_ema)
        elif data.mix == "adaptive":
            self.mix = SourceMix(sources, by=data.mix_by, target=data.mix_target, floor=data.mix_floor,
                                 rate=data.mix_rate, ema=data.mix_ema)
        if self.mix is not None:
            self.rows = {s: [i for i, src in enumerate(sources) if src == s] for s in self.mix.sources}
            self.samplers = {s: PromptSampler(len(rows), _source_seed(seed, s)) for s, rows in self.rows.items()}
            self.drawn = 0
        else:
            self.sampler = PromptSampler(len(sources), seed)

    # ------------------------------------------------------------ drawing
    def next(self, k: int) -> list[int]:
        """The next ``k`` rows."""
        if self.mix is None and self.curriculum is None:
            return self.sampler.next(k)
        return [self._one() for _ in range(k)]

    def _one(self) -> int:
        resting = self.curriculum.resting if self.curriculum is not None else {}
        if len(resting) >= len(self.row_source):
            self.curriculum.release(list(resting))
        if self.mix is None:
            return self._next_free(self.sampler, range(len(self.row_source)), resting)
        p = self.mix.probabilities()
        if resting:
            busy = Counter(self.row_source[row] for row in resting)
            p = [q if busy[s] < len(self.rows[s]) else 0.0 for s, q in zip(self.mix.sources, p)]
            if not any(p):  # every prompt of every source with weight rests
                self.curriculum.release(list(resting))
                p = self.mix.probabilities()
        source = self.mix.sources[pick(p, hashed_uniform(self.seed, self.drawn))]
        self.drawn += 1
        return self._next_free(self.samplers[source], self.rows[source], resting)

    @staticmethod
    def _next_free(sampler: PromptSampler, rows, resting: Mapping[int, int]) -> int:
        """The sampler's next row (``rows[index]``) that is not resting (one exists)."""
        while True:
            row = rows[sampler.next(1)[0]]
            if row not in resting:
                return row

    # ------------------------------------------------------------ learning
    def end_batch(self, groups: list[tuple[int, int, int]], held_out: list[Mapping[str, float]] = ()) -> dict[str, float]:
        """After a rollout batch: ``groups`` holds ``(row, correct, n)`` for each of its scored
        groups in draw order, ``held_out`` the per-source held-out accuracies of the validations
        that came before it. The mix folds in the held-out accuracies, then each source's
        accuracy over the batch's samples, and moves its weights once; the curriculum observes
        every group. Returns the batch's ``data/*`` metrics: ``data/mix/<source>`` (the weights
        this batch was drawn with), ``data/mix_acc/<source>`` (the averages after it),
        ``data/curriculum/retired``, ``data/curriculum/returned`` and
        ``data/curriculum/out_of_pool`` (prompts resting after it)."""
        metrics: dict[str, float] = {}
        if self.mix is not None:
            mix = self.mix
            metrics.update({f"data/mix/{s}": p for s, p in zip(mix.sources, mix.probabilities())})
            for accuracy in held_out:
                mix.observe(accuracy)
            right, total = Counter(), Counter()
            for row, correct, n in groups:
                right[self.row_source[row]] += correct
                total[self.row_source[row]] += n
            mix.observe({s: right[s] / total[s] for s in total if total[s]})
            mix.update()
            metrics.update({f"data/mix_acc/{s}": a for s, a in zip(mix.sources, mix.accuracy) if a is not None})
        if self.curriculum is not None:
            for row, correct, n in groups:
                self.curriculum.observe(row, correct, n)
            retired, returned = self.curriculum.end_batch()
            metrics.update({"data/curriculum/retired": float(retired), "data/curriculum/returned": float(returned),
                            "data/curriculum/out_of_pool": float(len(self.curriculum.resting))})
        return metrics

    # ------------------------------------------------------------ state
    def state_dict(self) -> dict:
        """The parts this pool has: ``epoch`` and ``position`` (one sampler: data.mix=uniform),
        or ``sources`` (each source's sampler), ``drawn`` (the draws so far) and ``mix``
        (data.mix=adaptive); ``curriculum`` with the curriculum on."""
        if self.mix is None:
            state: dict = self.sampler.state_dict()
        else:
            state = {"sources": {s: sampler.state_dict() for s, sampler in self.samplers.items()},
                     "drawn": self.drawn, "mix": self.mix.state_dict()}
        if self.curriculum is not None:
            state["curriculum"] = self.curriculum.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        """Continue from a ``state_dict()``; ValueError when it does not fit this pool (another
        data.mix, other sources, the curriculum on in one and off in the other)."""
        if (self.mix is None) != ("sources" not in state) or (self.curriculum is None) != ("curriculum" not in state):
            raise ValueError(f"prompt pool state: its parts {sorted(state)} are not those of this run's data.mix and "
                             "data.curriculum_window")
        if self.mix is None:
            self.sampler.load_state_dict(state)
        else:
            if sorted(state["sources"]) != self.mix.sources:
                raise ValueError(f"prompt pool state: it draws from the sources {sorted(state['sources'])}, this run's "
                                 f"data has {self.mix.sources}")
            for s, sampler in self.samplers.items():
                sampler.load_state_dict(state["sources"][s])
            self.drawn = int(state["drawn"])
            self.mix.load_state_dict(state["mix"])
        if self.curriculum is not None:
            self.curriculum.load_state_dict(state["curriculum"])
