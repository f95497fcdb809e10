"""Domain mixing (``data.mix=adaptive``, ``static``): per-source accuracy averages and the
sampling weights they move (:func:`static_mix`: fixed weights, which nothing moves).

    mix = SourceMix(["embedded/add", "embedded/mul"], by="gap", target=1.0, floor=0.05, rate=0.3, ema=0.8)
    mix.observe({"embedded/add": 0.25, "embedded/mul": 0.5})   # a rollout batch's, or a validation's, accuracy
    mix.update()                                                # once per rollout batch
    mix.probabilities()                                         # p: the next draws pick sources with it

For S sources, each with an accuracy average a_s and a smoothed weight w_s (DDK, arXiv
2407.16154: a discrepancy factor, smoothed with the previous weights, with a floor; ``signal``
follows Online Difficulty Filtering, arXiv 2504.03380, which trains on prompts of intermediate
pass rate)::

    a_s <- ema * a_s + (1 - ema) * x_s       for each observation x_s (the first one sets a_s)
    d_s  = max(target - a_s, 0)              by = gap: how far the source lags the target
    d_s  = a_s * (1 - a_s)                   by = signal: largest at a pass rate of one half
    d_s  = max of the observed sources' d    a source with no observation yet (explored first)
    r_s  = d_s / sum_t d_t                   1/S each when every d is 0 (nothing to move toward)
    w_s <- (1 - rate) * w_s + rate * r_s     once per rollout batch; w starts at 1/S
    p_s  = floor + (1 - S * floor) * w_s     the sampling weights: sum 1, each at least floor

All plain Python floats, so the same observations give the same weights on every machine.
"""

from __future__ import annotations

from typing import Iterable, Mapping

from reasonrl.errors import InputError

BY = ("gap", "signal")
"""What a source's need is measured by (``data.mix_by``)."""


def ema_update(average: float | None, x: float, ema: float) -> float:
    """``ema * average + (1 - ema) * x``; ``x`` itself when there is no average yet (None)."""
    return x if average is None else ema * average + (1.0 - ema) * x


def needs(accuracy: list[float | None], by: str, target: float) -> list[float]:
    """The need d_s of each source from its accuracy average (None: not observed yet):
    ``max(target - a, 0)`` for ``by="gap"``, ``a * (1 - a)`` for ``by="signal"``; a source not
    observed gets the largest need of the observed ones (0 when none is)."""
    if by not in BY:
        raise ValueError(f"data.mix_by = {by!r}: expected one of {', '.join(BY)}")
    known = [max(target - a, 0.0) if by == "gap" else a * (1.0 - a) for a in accuracy if a is not None]
    explore = max(known, default=0.0)
    it = iter(known)
    return [explore if a is None else next(it) for a in accuracy]


def normalised(need: list[float]) -> list[float]:
    """r_s = d_s / sum d; 1/S each when the needs sum to 0."""
    total = sum(need)
    if total <= 0.0:
        return [1.0 / len(need)] * len(need)
    return [d / total for d in need]


def smoothed(weights: list[float], target: list[float], rate: float) -> list[float]:
    """w_s <- (1 - rate) * w_s + rate * r_s: the weights a step of ``rate`` toward ``target``."""
    return [(1.0 - rate) * w + rate * r for w, r in zip(weights, target, strict=True)]


def floored(weights: list[float], floor: float) -> list[float]:
    """p_s = floor + (1 - S * floor) * w_s: weights summing to 1 with every one at least
    ``floor`` (``floor`` in [0, 1/S]; at 1/S all equal)."""
    S = len(weights)
    if not 0.0 <= floor <= 1.0 / S + 1e-12:
        raise InputError(f"data.mix_floor = {floor}: expected a value in [0, 1/{S}] for the {S} data sources")
    return [floor + (1.0 - S * floor) * w for w in weights]


def check_sources(sources: Iterable[str], floor: float) -> list[str]:
    """The distinct ``sources``, sorted; InputError when there are fewer than 2 (nothing to mix)
    or ``floor`` (data.mix_floor) is not in [0, 1/S] for their number S."""
    distinct = sorted(set(sources))
    if len(distinct) < 2:
        raise InputError(f"data.mix = 'adaptive': mixes data sources, and the training data has one: {distinct}")
    floored([1.0 / len(distinct)] * len(distinct), floor)
    return distinct


def held_out_accuracy(metrics: Mapping[str, float]) -> dict[str, float]:
    """{source: accuracy} of a validation's ``val/acc/<source>`` metrics (mean@k; the
    evaluator logs them when the held-out prompts have several data sources)."""
    prefix = "val/acc/"
    return {key[len(prefix):]: float(value) for key, value in metrics.items() if key.startswith(prefix)}


def static_mix(sources: Iterable[str], weights: Mapping[str, float], ema: float) -> "SourceMix":
    """data.mix=static: the mix of ``sources`` with the fixed ``weights`` (data.mix_weights),
    p_s = w_s at every draw (no floor, no step: rate 0); the accuracy averages are still kept
    (logged). InputError naming data.mix_weights when it does not name exactly ``sources``."""
    mix = SourceMix(sources, by="gap", target=1.0, floor=0.0, rate=0.0, ema=ema)
    if sorted(weights) != mix.sources:
        raise InputError(f"data.mix_weights = {dict(weights)!r}: must name exactly the training data's sources "
                         f"{', '.join(mix.sources)}")
    mix.weights = [float(weights[s]) for s in mix.sources]
    return mix


class SourceMix:
    """The accuracy averages and weights of ``sources`` (formulas in the module docstring).

    ``observe`` folds accuracies into the averages (sources it does not know are ignored:
    held-out data may have others); ``update`` moves the weights once; ``probabilities`` are
    the sampling weights p; ``accuracy`` the averages (None: not observed yet), both in the
    order of ``sources`` (sorted). ``state_dict()`` / ``load_state_dict()`` save and restore both
    exactly, keyed by source.
    """

    def __init__(self, sources: Iterable[str], *, by: str, target: float, floor: float, rate: float, ema: float) -> None:
        self.sources = check_sources(sources, floor)
        if by not in BY:
            raise InputError(f"data.mix_by = {by!r}: expected one of {', '.join(BY)}")
        self.by, self.target, self.floor, self.rate, self.ema = by, target, floor, rate, ema
        self._index = {s: i for i, s in enumerate(self.sources)}
        self.accuracy: list[float | None] = [None] * len(self.sources)
        self.weights = [1.0 / len(self.sources)] * len(self.sources)

    def observe(self, accuracy: Mapping[str, float]) -> None:
        """Fold one observation per source (a rollout batch's accuracy over its samples of the
        source, or a validation's held-out accuracy) into the averages."""
        for source, x in sorted(accuracy.items()):
            i = self._index.get(source)
            if i is not None:
                self.accuracy[i] = ema_update(self.accuracy[i], float(x), self.ema)

    def update(self) -> None:
        """One smoothing step of the weights toward the normalised needs."""
        self.weights = smoothed(self.weights, normalised(needs(self.accuracy, self.by, self.target)), self.rate)

    def probabilities(self) -> list[float]:
        """The sampling weights p, in the order of ``sources``."""
        return floored(self.weights, self.floor)

    def state_dict(self) -> dict:
        """``{"accuracy": {source: a or None}, "weights": {source: w}}``."""
        return {"accuracy": dict(zip(self.sources, self.accuracy)), "weights": dict(zip(self.sources, self.weights))}

    def load_state_dict(self, state: dict) -> None:
        """Restore a ``state_dict()``; ValueError when its sources are not this mix's."""
        if sorted(state["weights"]) != self.sources or sorted(state["accuracy"]) != self.sources:
            raise ValueError(f"data.mix state: the checkpoint mixes the sources {sorted(state['weights'])}, "
                             f"this run's data has {self.sources}")
        self.accuracy = [state["accuracy"][s] for s in self.sources]
        self.weights = [float(state["weights"][s]) for s in self.sources]
