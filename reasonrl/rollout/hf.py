"""The reference rollout backend: ``transformers`` ``model.generate``.

Also holds the helpers every backend shares: :func:`pad_prompts` (repeat and
left-pad the prompts), :func:`assemble` (turn generated tokens and their raw
logits into a :class:`~reasonrl.types.RolloutBatch`) and :func:`eos_tuple` / :func:`is_eos`
(a sample ends on any of the model's EOS ids, :func:`~reasonrl.data.model.load_eos_ids`).
"""

from __future__ import annotations

from typing import Sequence

import torch

from reasonrl.rollout.base import copy_weights
from reasonrl.types import RolloutBatch, SamplingParams


def pad_prompts(
    prompts: list[list[int]], n: int, pad_id: int, device: torch.device | str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Repeat each prompt ``n`` times (row ``i * n + j``) and left-pad with ``pad_id``.

    Returns ``(prompt_ids [B, P] long, prompt_mask [B, P] long)`` with ``B = len(prompts) * n``
    and ``P`` the longest prompt; the mask is 1 on real prompt tokens.
    """
    if n < 1:
        raise ValueError(f"n: expected a number of samples per prompt >= 1, got {n}")
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("prompts: expected a non-empty list of non-empty token id lists")
    P = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), P), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), P), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, P - len(p) :] = torch.tensor(p, dtype=torch.long)
        mask[i, P - len(p) :] = 1
    return (
        ids.repeat_interleave(n, dim=0).to(device),
        mask.repeat_interleave(n, dim=0).to(device),
    )


def eos_tuple(eos_ids: int | Sequence[int]) -> tuple[int, ...]:
    """The EOS ids a backend stops on, as a non-empty tuple (one id may be given as an int)."""
    ids = (int(eos_ids),) if isinstance(eos_ids, int) else tuple(int(i) for i in eos_ids)
    if not ids:
        raise ValueError("eos_ids: expected at least one EOS token id")
    return ids


def is_eos(tokens: torch.Tensor, eos_ids: torch.Tensor) -> torch.Tensor:
    """Bool tensor of ``tokens``' shape: the token is one of ``eos_ids`` (a 1-D long tensor on
    the tokens' device; no host sync, so a CUDA graph may hold it)."""
    return (tokens.unsqueeze(-1) == eos_ids).any(-1)


def response_mask(response_ids: torch.Tensor, eos_ids: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """``(mask [B, T] float, eos [B] bool)``: 1 up to and including the first token that is
    one of ``eos_ids``."""
    ended = is_eos(response_ids, torch.tensor(eos_ids, dtype=torch.long, device=response_ids.device))
    eos = ended.any(-1)
    # Number of EOS tokens strictly before each position: 0 means still live (or the EOS itself).
    before = torch.cumsum(ended.long(), -1) - ended.long()
    return (before == 0).float(), eos


def assemble(
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    response_ids: torch.Tensor,
    logprobs: torch.Tensor,
    n: int,
    pad_id: int,
    eos_ids: Sequence[int],
) -> RolloutBatch:
    """Build the RolloutBatch from raw generated tokens and their log-probs.

    ``response_ids`` [B, S] may hold anything after a row's first EOS (any of ``eos_ids``); those positions
    are set to ``pad_id`` (log-prob 0), and the responses are trimmed to the longest one.
    ``versions`` are 0: the rollout worker stamps the version of the weights it sampled with.
    """
    mask, eos = response_mask(response_ids, eos_ids)
    T = int(mask.sum(-1).max().item()) if mask.numel() else 0
    mask = mask[:, :T]
    B = prompt_ids.shape[0]
    return RolloutBatch(
        prompt_ids=prompt_ids,
        prompt_mask=prompt_mask,
        response_ids=torch.where(mask.bool(), response_ids[:, :T], pad_id),
        response_mask=mask,
        logprobs=logprobs[:, :T].float() * mask,
        eos=eos,
        truncated=~eos,
        group_ids=torch.arange(B, device=prompt_ids.device) // n,
        versions=torch.zeros_like(mask, dtype=torch.long),
    )


def draw_seed(generator: torch.Generator) -> int:
    """A 62-bit seed drawn from ``generator`` (advances it)."""
    return int(torch.randint(0, 2**62, (1,), generator=generator, device=generator.device).item())


class HFGenerator:
    """Rollouts with ``model.generate`` (any ``transformers`` causal LM, CPU or GPU).

    It samples with ``model``: the trainer's own module when colocated with the policy (it
    then sees every update at once), or a copy that :meth:`load_weights` refreshes. The
    returned tensors live on the model's device. A sample ends on any of ``eos_ids``.
    """

    trainer_numerics = True
    streams = False

    def __init__(self, model: torch.nn.Module, pad_id: int, eos_ids: int | Sequence[int]) -> None:
        self.model = model
        self.pad_id = pad_id
        self.eos_ids = eos_tuple(eos_ids)

    def load_weights(self, tensors: dict[str, torch.Tensor]) -> None:
        copy_weights(self.model, tensors)

    def generate(
        self,
        prompts: list[list[int]],
        n: int,
        params: SamplingParams,
        generator: torch.Generator,
    ) -> RolloutBatch:
        """Sample ``n`` responses per prompt; see :class:`~reasonrl.rollout.base.Generator`.

        ``generate`` samples with the global torch RNG, so the call forks it and seeds it
        from ``generator``: the result is reproducible and the global RNG is left as it was.
        Log-probs are ``log_softmax(raw logits / temperature)`` of the chosen tokens
        (temperature 1 for greedy), before top-k / top-p truncation.
        """
        device = next(self.model.parameters()).device
        prompt_ids, prompt_mask = pad_prompts(prompts, n, self.pad_id, device)
        sample = params.temperature > 0
        options = dict(
            do_sample=sample,
            max_new_tokens=params.max_new_tokens,
            # Neutralise processors a checkpoint's generation_config may switch on.
            min_new_tokens=0,
            repetition_penalty=1.0,
            no_repeat_ngram_size=0,
            eos_token_id=list(self.eos_ids),
            pad_token_id=self.pad_id,
            return_dict_in_generate=True,
            output_logits=True,
        )
        if sample:
            # top_k=0 disables the top-k warper (None would fall back to the default, 50).
            options.update(
                temperature=params.temperature, top_p=params.top_p, top_k=params.top_k, typical_p=1.0
            )
        seed = draw_seed(generator)
        rng_devices = [device] if device.type != "cpu" else []
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad(), torch.random.fork_rng(
                devices=rng_devices, device_type=device.type if rng_devices else "cuda"
            ):
                torch.manual_seed(seed)
                out = self.model.generate(input_ids=prompt_ids, attention_mask=prompt_mask, **options)
        finally:
            self.model.train(was_training)
        response_ids = out.sequences[:, prompt_ids.shape[1] :]
        temperature = params.temperature if sample else 1.0
        logits = torch.stack(out.logits, dim=1).float() / temperature
        logprobs = torch.log_softmax(logits, -1).gather(-1, response_ids.unsqueeze(-1)).squeeze(-1)
        return assemble(prompt_ids, prompt_mask, response_ids, logprobs, n, self.pad_id, self.eos_ids)
