"""The latency-model rollout backend (``rollout.backend=sim``), for benchmarks and tests only.

No model runs. A call returns random tokens whose lengths follow a distribution recorded from
a real run (:class:`Workload`, ``sim_workload.json`` beside this module, which says how it
was recorded), and takes the time a worker of a given speed would take to decode them::

    modelled seconds of a call = seconds_per_token * (L_1 + ... + L_B)      (its rows' lengths)
    real seconds               = modelled seconds * time_scale

so that the real producer, router, queue, prompt records and failover code can be driven by
many workers on a small machine (``bench/fleet.py --simulate``). Everything it returns is
labelled simulated where it is reported.

Randomness follows the RolloutBackend protocol: sample ``j`` of group ``i`` has the row seed
``r = combine(seeds[i], j)`` (:mod:`reasonrl.rollout.seeds`); its length inverts the
workload's length CDF at ``uniform(r, 0)`` and its ``t``-th token (0-based) is drawn from the
ordinary ids (neither padding nor an EOS id) at ``uniform(r, t + 1)``; a row that ends by EOS
has an EOS id as its last token. The same seeds give the same rows, whatever the worker.
Log-probs are those of a uniform draw over the ordinary ids, ``-log V``.

:class:`SimRewards` is the reward model that goes with it: prompt ``p`` is answered correctly
with a probability ``q(p)`` drawn once per prompt from the recorded per-prompt accuracy, and a
sample is correct when a uniform from its tokens is below ``q(p)`` (score +1, else -1), so
dynamic sampling filters all-correct and all-wrong groups about as often as in the recorded run.
"""

from __future__ import annotations

import json
import math
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch

from reasonrl.rollout.base import declares
from reasonrl.rollout.hf import assemble, eos_tuple, pad_prompts
from reasonrl.rollout.seeds import check_seeds, combine, mix64_tensor, row_seeds, uniforms
from reasonrl.types import Prompt, RolloutBatch, SamplingParams, ScoredBatch

WORKLOAD = Path(__file__).with_name("sim_workload.json")
"""The recorded workload the sim backend draws from (its ``recorded`` entry says how)."""


@dataclass(frozen=True)
class Workload:
    """A recorded rollout workload.

    lengths:         ``lengths[L - 1]``: samples that ended with EOS after ``L`` tokens (EOS
                     included), ``L`` = 1..max_new_tokens
    truncated:       samples that reached ``max_new_tokens`` without EOS
    prompt_accuracy: ``prompt_accuracy[c]``: prompts with ``c`` of ``k`` samples correct
    recorded:        how it was recorded (command, commit, what was counted)
    """

    max_new_tokens: int
    lengths: tuple[int, ...]
    truncated: int
    prompt_accuracy: tuple[int, ...]
    recorded: dict

    @classmethod
    def load(cls, path: str | Path = WORKLOAD) -> "Workload":
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        w = cls(int(data["max_new_tokens"]), tuple(data["lengths"]), int(data["truncated"]),
                tuple(data["prompt_accuracy"]), dict(data["recorded"]))
        if len(w.lengths) != w.max_new_tokens or sum(w.lengths) + w.truncated == 0 or sum(w.prompt_accuracy) == 0:
            raise ValueError(f"{path}: expected {w.max_new_tokens} length counts, some samples and some prompts")
        return w

    @property
    def k(self) -> int:
        """Samples per prompt of the accuracy counts."""
        return len(self.prompt_accuracy) - 1

    def mean_length(self, max_new_tokens: int | None = None) -> float:
        """The expected length of a sample, scaled to ``max_new_tokens`` as :meth:`draw_lengths` does."""
        m = max_new_tokens or self.max_new_tokens
        outcomes = [(self._scaled(L, m), c) for L, c in enumerate(self.lengths, 1)] + [(m, self.truncated)]
        return sum(L * c for L, c in outcomes) / sum(c for _, c in outcomes)

    def _scaled(self, length: int, max_new_tokens: int) -> int:
        return min(max_new_tokens, max(1, math.ceil(length * max_new_tokens / self.max_new_tokens)))

    def draw_lengths(self, u: torch.Tensor, max_new_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(lengths [B] long, truncated [B] bool)`` at uniforms ``u`` [B] by inverting the recorded
        CDF (EOS lengths 1..M, then truncated at M); with ``max_new_tokens`` m != M a length L
        becomes ``min(m, ceil(L * m / M))`` (the recorded shape stretched or squeezed to m)."""
        counts = torch.tensor([*self.lengths, self.truncated], dtype=torch.float64)
        cdf = counts.cumsum(0) / counts.sum()
        outcome = torch.searchsorted(cdf, u.double().reshape(-1), right=True).clamp_(max=len(counts) - 1)
        truncated = outcome == self.max_new_tokens
        raw = torch.where(truncated, self.max_new_tokens, outcome + 1)
        lengths = (raw * max_new_tokens + self.max_new_tokens - 1) // self.max_new_tokens  # ceil(L * m / M)
        return lengths.clamp_(1, max_new_tokens), truncated

    def draw_accuracy(self, u: torch.Tensor) -> torch.Tensor:
        """Per-prompt probability of a correct sample, ``c / k`` with ``c`` drawn from the recorded
        per-prompt accuracy at uniforms ``u``."""
        counts = torch.tensor(self.prompt_accuracy, dtype=torch.float64)
        cdf = counts.cumsum(0) / counts.sum()
        c = torch.searchsorted(cdf, u.double().reshape(-1), right=True).clamp_(max=self.k)
        return c.float() / self.k


def modelled_seconds(lengths: torch.Tensor, seconds_per_token: float) -> float:
    """``seconds_per_token * sum(lengths)``: the modelled time of one call."""
    return seconds_per_token * float(lengths.sum())


@declares("sim")
class SimGenerator:
    """``rollout.backend=sim`` (see the module docstring): random rows of recorded lengths, each
    call taking ``seconds_per_token * (sum of its rows' lengths) * time_scale`` real seconds.
    ``vocab_size`` is the vocabulary of the model it stands in for; ``eos_ids`` end a row."""

    def __init__(self, pad_id: int, eos_ids: int | Sequence[int], vocab_size: int, workload: Workload,
                 seconds_per_token: float, time_scale: float) -> None:
        self.pad_id, self.eos_ids = pad_id, eos_tuple(eos_ids)
        self.workload, self.seconds_per_token, self.time_scale = workload, seconds_per_token, time_scale
        special = {pad_id, *self.eos_ids}
        self.ordinary = torch.tensor([i for i in range(vocab_size) if i not in special], dtype=torch.long)
        if not len(self.ordinary):
            raise ValueError(f"SimGenerator: a vocabulary of {vocab_size} has no id besides padding and EOS")
        self.logprob = -math.log(len(self.ordinary))

    def generate(self, prompts: list[list[int]], n: int, params: SamplingParams, seeds: Sequence[int]) -> RolloutBatch:
        """``n`` rows per prompt (row ``i * n + j``: sample ``j`` of prompt ``i``), after the modelled time."""
        check_seeds(seeds, prompts)
        prompt_ids, prompt_mask = pad_prompts(prompts, n, self.pad_id)
        rows = row_seeds(seeds, n)
        lengths, truncated = self.workload.draw_lengths(uniforms(rows, 0), params.max_new_tokens)
        T = int(lengths.max())
        steps = torch.arange(T)
        picks = uniforms(rows.repeat_interleave(T), (steps + 1).repeat(len(rows))).view(-1, T)  # [B, T]
        tokens = self.ordinary[(picks * len(self.ordinary)).long().clamp_(max=len(self.ordinary) - 1)]
        last = steps[None, :] == (lengths - 1)[:, None]
        tokens = torch.where(last & ~truncated[:, None], self.eos_ids[0], tokens)
        tokens = torch.where(steps[None, :] < lengths[:, None], tokens, self.pad_id)
        batch = assemble(prompt_ids, prompt_mask, tokens, torch.full(tokens.shape, self.logprob), n, self.pad_id,
                         self.eos_ids)
        seconds = modelled_seconds(batch.lengths, self.seconds_per_token) * self.time_scale
        if seconds > 0:  # sleep(0) still gives up the core, for milliseconds on a busy machine
            time.sleep(seconds)
        return batch

    def load_weights(self, tensors: dict[str, torch.Tensor]) -> None:
        """Nothing to load: the model is not there (the rollout worker keeps the version)."""


def _stable_hash(text: str) -> int:
    """A hash of ``text`` that is the same in every process (``hash`` of a str is salted)."""
    return zlib.crc32(text.encode("utf-8"))


class SimRewards:
    """The modelled reward of a simulated run (see the module docstring): correct with the
    prompt's recorded-like accuracy, score +1 correct, -1 otherwise; no grading, no time.
    ``seed`` is the run seed. The reward worker's interface: ``score``, the state calls, ``close``."""

    def __init__(self, workload: Workload, seed: int) -> None:
        self.workload, self.seed = workload, seed

    def score(self, rollout: RolloutBatch, prompts: list[Prompt]) -> ScoredBatch:
        """Row ``b`` is correct when ``uniform(hash of its tokens, 0) < q(prompts[b])``."""
        keys = torch.tensor([combine(self.seed, _stable_hash(p.id)) for p in prompts], dtype=torch.long)
        q = self.workload.draw_accuracy(uniforms(keys, 0).squeeze(-1))
        h = keys.clone()
        ids = rollout.response_ids.masked_fill(rollout.response_mask == 0, -1)
        for t in range(ids.shape[1]):
            h = mix64_tensor(h ^ ids[:, t])
        acc = uniforms(h, 0).squeeze(-1) < q
        B = rollout.size
        return ScoredBatch(rollout, list(prompts), [""] * B, torch.where(acc, 1.0, -1.0), acc,
                           torch.zeros(B, dtype=torch.bool))

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Nothing to restore: its draws depend on the seed, the prompts and the tokens alone."""

    def close(self) -> None:
        """Nothing to stop."""
