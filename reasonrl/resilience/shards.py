"""Several rollout workers sharing each generation batch, with work shifted off a slow one."""

from __future__ import annotations

import time
from typing import Callable, Sequence

from reasonrl.resilience.guards import SlowdownDetector
from reasonrl.types import RolloutBatch, SamplingParams, WeightsUpdate


class ShardedRollouts:
    """Rollout workers splitting each generation batch (``resilience.rollout_workers``).

    The prompts are split equally; once a worker is detected fail-slow (``detector``, fed
    each worker's seconds and prompts) its share shrinks in proportion to its speed
    (:meth:`SlowdownDetector.weights`) until it recovers. Whole batches only: no early stop
    across workers. ``shares`` holds the last split as ``rollout/share/worker<w>`` metrics.
    """

    streams = False

    def __init__(self, workers: list, detector: SlowdownDetector, clock: Callable[[], int], pad_id: int) -> None:
        self.workers, self.detector, self.clock, self.pad_id = workers, detector, clock, pad_id
        self.shares: dict[str, float] = {}

    def generate(self, prompts: list[list[int]], n: int, params: SamplingParams, seeds: Sequence[int]) -> RolloutBatch:
        """``n`` samples per prompt, the prompts split across the workers (each group keeps its
        seed, so the split does not change what it samples)."""
        ids = list(range(len(self.workers)))
        shares = [1 / len(ids)] * len(ids)
        if any(self.detector.is_slow("gen", w) for w in ids):
            weights = self.detector.weights("gen", ids)
            shares = [weights[w] for w in ids]
        counts = apportion(len(prompts), shares)
        self.shares = {f"rollout/share/worker{w}": c / len(prompts) for w, c in zip(ids, counts)}
        parts, start = [], 0
        for w, count in zip(ids, counts):
            if count == 0:
                continue
            began = time.perf_counter()
            parts.append(self.workers[w].generate(prompts[start : start + count], n, params, seeds[start : start + count]))
            self.detector.update("gen", w, self.clock(), time.perf_counter() - began, work=count)
            start += count
        return RolloutBatch.concat(parts, self.pad_id)

    def load_weights(self, update: WeightsUpdate) -> None:
        for worker in self.workers:
            worker.load_weights(update)

    def offer_weights(self, update: WeightsUpdate) -> None:
        for worker in self.workers:
            worker.offer_weights(update)

    def state_dict(self) -> dict:
        return {"workers": [w.state_dict() for w in self.workers]}

    def load_state_dict(self, state: dict) -> None:
        for worker, s in zip(self.workers, state["workers"], strict=True):
            worker.load_state_dict(s)


def apportion(total: int, shares: list[float]) -> list[int]:
    """Split ``total`` items by ``shares`` (largest remainders), e.g. 10 by [0.5, 0.5] -> [5, 5]."""
    exact = [total * w / sum(shares) for w in shares]
    counts = [int(x) for x in exact]
    for i in sorted(range(len(shares)), key=lambda i: counts[i] - exact[i])[: total - sum(counts)]:
        counts[i] += 1
    return counts
