"""The data that flows between stages, with shapes.

B = number of samples (prompts x samples per prompt), P = padded prompt length,
T = padded response length. Prompts are left-padded, responses right-padded, so the
first response token of every row sits at column P of ``prompt_ids ++ response_ids``.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Any, Literal

import torch


@dataclass(frozen=True)
class Prompt:
    """One problem: the text shown to the model and what a correct answer is.

    ``text`` is either a plain string or a list of chat messages
    (``[{"role": ..., "content": ...}]``) as in the verl/DAPO parquet layout.
    """

    id: str
    text: str | list[dict[str, str]]
    ground_truth: str
    data_source: str = "embedded"
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SamplingParams:
    """How to sample: ``temperature == 0`` means greedy decoding.

    Log-probs are always those of ``log_softmax(logits / temperature)`` (temperature 1
    for greedy), before top-p / top-k truncation, which is what the trainer recomputes.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 32


@dataclass
class RolloutBatch:
    """What a RolloutBackend returns. Row ``i * n + j`` is sample j of prompt i.

    prompt_ids:    [B, P] long, left-padded with the pad id
    prompt_mask:   [B, P] long, 1 on real prompt tokens
    response_ids:  [B, T] long, right-padded with the pad id
    response_mask: [B, T] float, 1 on generated tokens (the EOS token included)
    logprobs:      [B, T] float, sampling log-probs of the generated tokens (0 on padding)
    eos:           [B] bool, the sample ended with the EOS token
    truncated:     [B] bool, the sample hit max_new_tokens without EOS
    group_ids:     [B] long, index of the prompt the sample answers
    versions:      [B, T] long, the policy version whose weights sampled each token (a
                   rollout interrupted by a weight update holds two or more; 0 on padding)
    action_mask:   [B, T] float, 1 on the tokens the policy sampled: the loss, KL and entropy
                   run over these only. A multi-turn trajectory's response holds the
                   environment's tokens too (``response_mask`` 1, attended to, ``action_mask``
                   0, log-prob 0); single-turn: equal to ``response_mask`` (None given)
    token_rewards: [B, T] float, the environment's rewards, each on the last policy token of
                   the turn that earned it (multi-turn; None: single-turn, the reward is the
                   scored batch's sequence score)
    episodes:      per row, what the episode ended with (multi-turn; None: single-turn):
                   ``return``, ``success``, ``failed``, ``turns``, ``error``
    """

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    response_ids: torch.Tensor
    response_mask: torch.Tensor
    logprobs: torch.Tensor
    eos: torch.Tensor
    truncated: torch.Tensor
    group_ids: torch.Tensor
    versions: torch.Tensor
    action_mask: torch.Tensor | None = None
    token_rewards: torch.Tensor | None = None
    episodes: list[dict[str, Any]] | None = None

    def __post_init__(self) -> None:
        if self.action_mask is None:
            self.action_mask = self.response_mask

    @property
    def size(self) -> int:
        return self.response_ids.shape[0]

    def oldest_versions(self) -> torch.Tensor:
        """[B] long: the oldest version among each row's generated tokens."""
        return self.versions.masked_fill(self.response_mask == 0, torch.iinfo(torch.long).max).amin(-1)

    @property
    def lengths(self) -> torch.Tensor:
        """[B] long: number of generated tokens per sample (EOS included)."""
        return self.response_mask.sum(-1).long()

    def select(self, index: torch.Tensor) -> "RolloutBatch":
        """Rows ``index`` (a [K] long tensor) of every field."""
        rows = {k: getattr(self, k)[index] for k in _ROLLOUT_FIELDS}
        if self.token_rewards is not None:
            rows["token_rewards"] = self.token_rewards[index]
        if self.episodes is not None:
            rows["episodes"] = [self.episodes[i] for i in index.tolist()]
        return RolloutBatch(**rows)

    @staticmethod
    def concat(batches: list["RolloutBatch"], pad_id: int) -> "RolloutBatch":
        """Stack batches row-wise, re-padding prompts (left) and responses (right).

        Group ids are renumbered so that groups of different batches stay distinct.
        """
        if len(batches) == 1:
            return batches[0]
        P = max(r.prompt_ids.shape[1] for r in batches)
        T = max(r.response_ids.shape[1] for r in batches)
        pad = torch.nn.functional.pad
        parts: dict[str, list[torch.Tensor]] = {k: [] for k in _ROLLOUT_FIELDS}
        offset = 0
        for r in batches:
            lp, rp = P - r.prompt_ids.shape[1], T - r.response_ids.shape[1]
            parts["prompt_ids"].append(pad(r.prompt_ids, (lp, 0), value=pad_id))
            parts["prompt_mask"].append(pad(r.prompt_mask, (lp, 0)))
            parts["response_ids"].append(pad(r.response_ids, (0, rp), value=pad_id))
            parts["response_mask"].append(pad(r.response_mask, (0, rp)))
            parts["action_mask"].append(pad(r.action_mask, (0, rp)))
            parts["logprobs"].append(pad(r.logprobs, (0, rp)))
            parts["versions"].append(pad(r.versions, (0, rp)))
            parts["eos"].append(r.eos)
            parts["truncated"].append(r.truncated)
            parts["group_ids"].append(r.group_ids + offset)
            offset += int(r.group_ids.max().item()) + 1 if r.size else 0
        out = {k: torch.cat(v) for k, v in parts.items()}
        if any(r.token_rewards is not None for r in batches):
            out["token_rewards"] = torch.cat([
                pad(r.token_rewards, (0, T - r.response_ids.shape[1])) if r.token_rewards is not None
                else torch.zeros_like(pad(r.logprobs, (0, T - r.response_ids.shape[1]))) for r in batches])
        if any(r.episodes is not None for r in batches):
            out["episodes"] = [e for r in batches for e in (r.episodes or [{} for _ in range(r.size)])]
        return RolloutBatch(**out)


_ROLLOUT_FIELDS = (
    "prompt_ids",
    "prompt_mask",
    "response_ids",
    "response_mask",
    "logprobs",
    "eos",
    "truncated",
    "group_ids",
    "versions",
    "action_mask",
)


@dataclass
class ScoredBatch:
    """A rollout with its prompts, decoded responses and rewards.

    prompts:      the B prompts, one per row (repeated n times)
    texts:        the B decoded responses (special tokens stripped)
    scores:       [B] float, sequence-level reward (after any length shaping)
    acc:          [B] bool, the answer was correct
    failed:       [B] bool, the reward function raised or timed out
    timed_out:    [B] bool, the reward function ran past its time limit (a subset of failed;
                  all False when not given)
    errors:       one line per failed sample (``"sample i: ..."``, i its row when scored)
    preds:        the B extracted answers (``"[INVALID]"`` where none)
    extras:       the B reward breakdowns: the reward function's other fields, ``format``
                  (0/1, with reward.format) and ``overlong_penalty`` (with algo.overlong_buffer)
    """

    rollout: RolloutBatch
    prompts: list[Prompt]
    texts: list[str]
    scores: torch.Tensor
    acc: torch.Tensor
    failed: torch.Tensor
    errors: list[str] = field(default_factory=list)
    preds: list[str] = field(default_factory=list)
    extras: list[dict[str, Any]] = field(default_factory=list)
    timed_out: torch.Tensor | None = None

    def __post_init__(self) -> None:
        self.preds = self.preds or ["[INVALID]"] * len(self.texts)
        self.extras = self.extras or [{} for _ in self.texts]
        if self.timed_out is None:
            self.timed_out = torch.zeros_like(self.failed, dtype=torch.bool)

    @property
    def size(self) -> int:
        return self.rollout.size

    def select(self, index: torch.Tensor) -> "ScoredBatch":
        """Rows ``index`` (a [K] long tensor); ``errors`` stay with the batch that was scored."""
        rows = index.tolist()
        return ScoredBatch(
            rollout=self.rollout.select(index),
            prompts=[self.prompts[i] for i in rows],
            texts=[self.texts[i] for i in rows],
            scores=self.scores[index],
            acc=self.acc[index],
            failed=self.failed[index],
            preds=[self.preds[i] for i in rows],
            extras=[self.extras[i] for i in rows],
            timed_out=self.timed_out[index],
        )

    @staticmethod
    def concat(batches: list["ScoredBatch"], pad_id: int) -> "ScoredBatch":
        """Stack batches row-wise (see RolloutBatch.concat)."""
        if len(batches) == 1:
            return batches[0]
        return ScoredBatch(
            rollout=RolloutBatch.concat([b.rollout for b in batches], pad_id),
            prompts=[p for b in batches for p in b.prompts],
            texts=[t for b in batches for t in b.texts],
            scores=torch.cat([b.scores for b in batches]),
            acc=torch.cat([b.acc for b in batches]),
            failed=torch.cat([b.failed for b in batches]),
            errors=[e for b in batches for e in b.errors],
            preds=[p for b in batches for p in b.preds],
            extras=[x for b in batches for x in b.extras],
            timed_out=torch.cat([b.timed_out for b in batches]),
        )


@dataclass
class TrainBatch:
    """A scored batch with everything the update needs. All [B, T] tensors are 0 on padding.

    loss_mask:     [B, T] float, response mask with overlong-filtered samples zeroed
    old_logprobs:  [B, T] float, log-probs under the PPO anchor: the behaviour policy that
                   sampled the batch or a recomputation (``algo.off_policy`` none, bypass);
                   None: the policy at the start of the update, which the update computes
                   (tis, decoupled: the proximal policy)
    advantages:    [B, T] float
    ref_logprobs:  [B, T] float, under the frozen reference (None without a KL loss)
    values:        [B, T] float, critic values at generation time (None without a critic)
    returns:       [B, T] float, critic targets (None without a critic)
    """

    scored: ScoredBatch
    loss_mask: torch.Tensor
    old_logprobs: torch.Tensor | None
    advantages: torch.Tensor
    ref_logprobs: torch.Tensor | None = None
    values: torch.Tensor | None = None
    returns: torch.Tensor | None = None


@dataclass
class WeightsUpdate:
    """The policy's weights at one version, as the trainer publishes them to rollout workers.

    version:  how many updates the weights have had (``PolicyWorker.version``)
    tensors:  parameter name -> tensor (in the trainer's process: the live parameters,
              detached; never modify them)
    checksum: the tensors' checksum (:func:`reasonrl.rollout.weight_sync.checksum`) when the
              version is an exact copy in the rollout dtype that deltas are made from
              (:class:`WeightsDelta`); None for the trainer's own tensors
    kind:     what ``tensors`` are: ``full`` (every parameter: no LoRA), ``adapters`` (a LoRA
              run's adapter parameters alone, for a rollout module that holds the same LoRA
              layers) or ``merged`` (a LoRA run's plain-model parameters, W + (alpha / r) B A)

    Pickled (to another process) as one object: the names, dtypes and shapes, and each
    parameter's bytes as a NumPy array (16-bit floats as their bit patterns), which pickle
    protocol 5 hands over as out-of-band buffers: a version crosses a process boundary as a
    single transfer, never one call per parameter, and its bytes are copied once, into the
    pipe (:mod:`reasonrl.runtime.process`) or into Ray's object store, whose readers map
    them without a copy. The receiver's tensors may be read-only views of those bytes (never
    modify them either).
    """

    version: int
    tensors: dict[str, torch.Tensor]
    checksum: int | None = None
    kind: Literal["full", "adapters", "merged"] = "full"

    def __getstate__(self) -> dict[str, Any]:
        layout, arrays = [], []
        for name, t in self.tensors.items():
            flat = t.detach().to("cpu").contiguous().reshape(-1)
            arrays.append((flat.view(torch.int16) if flat.is_floating_point() and flat.element_size() == 2 else flat).numpy())
            layout.append((name, str(t.dtype).removeprefix("torch."), tuple(t.shape)))
        return {"version": self.version, "layout": layout, "arrays": arrays, "checksum": self.checksum, "kind": self.kind}

    def __setstate__(self, state: dict[str, Any]) -> None:
        tensors = {}
        for (name, dtype, shape), array in zip(state["layout"], state["arrays"], strict=True):
            with warnings.catch_warnings():  # read-only bytes (the pipe's, the object store's): never written to
                warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
                flat = torch.from_numpy(array)
            tensors[name] = flat.view(getattr(torch, dtype)).view(shape)
        self.version, self.tensors, self.checksum, self.kind = state["version"], tensors, state["checksum"], state["kind"]


@dataclass
class WeightsDelta:
    """One version of 16-bit rollout weights as the elements that changed since a base version
    (:mod:`reasonrl.rollout.weight_sync` encodes, applies and checks it). A parameter's elements
    are compared as bit patterns and split into blocks of ``BLOCK`` (65,536) elements.

    version, checksum:      the version it makes and that version's checksum
    base, base_checksum:    the version it applies to: a worker holding another refuses it
    layout:   per parameter, in the versions' order, ``(name, kind, count)``: kind ``same``
              (unchanged, count 0), ``delta`` (count changed elements) or ``whole`` (the
              whole tensor, count its size: where that is smaller than its changes)
    counts:   [blocks of the ``delta`` parameters] int32, the changed elements of each block
    offsets:  [changed elements] int16, each one's position in its block (the bit pattern of
              an unsigned 16-bit number), ascending within a block
    values:   [changed elements + elements of ``whole`` parameters] int16, their new bit
              patterns, parameter after parameter in layout order

    Pickled as one object whose three arrays travel as out-of-band buffers, as a
    :class:`WeightsUpdate`'s do: one transfer per worker and version.
    """

    version: int
    checksum: int
    base: int
    base_checksum: int
    layout: list[tuple[str, str, int]]
    counts: torch.Tensor
    offsets: torch.Tensor
    values: torch.Tensor

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        for key in ("counts", "offsets", "values"):
            state[key] = state[key].contiguous().numpy()
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        with warnings.catch_warnings():  # read-only bytes (the pipe's, the object store's): never written to
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            for key in ("counts", "offsets", "values"):
                state[key] = torch.from_numpy(state[key])
        self.__dict__.update(state)
