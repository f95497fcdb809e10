"""The rollout worker: a rollout backend, the weights it samples with, and their version."""

from __future__ import annotations

import math
import threading
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from reasonrl.config import Config
from reasonrl.config.capabilities import can
from reasonrl.models.loading import load_eos_ids, load_model, load_tokenizer, model_vocab_size
from reasonrl.models.lora import load_policy, ships_adapters
from reasonrl.env.pool import EnvPool
from reasonrl.precision import compute_context
from reasonrl.rollout.agent_loop import AgentLoop
from reasonrl.rollout.fast import FastGenerator, GroupsDone, StreamResult
from reasonrl.rollout.fleet import StreamOutbox
from reasonrl.rollout.hf import HFGenerator
from reasonrl.rollout.partial import PartialRollouts
from reasonrl.rollout.sim import SimGenerator, Workload
from reasonrl.rollout.weight_sync import apply_delta, verify
from reasonrl.types import Prompt, RolloutBatch, SamplingParams, WeightsDelta, WeightsUpdate


def build_backend(cfg: Config, model_dir: Path, module: torch.nn.Module | None, pad_id: int, eos_ids: Sequence[int]):
    """The backend of ``rollout.backend`` over ``module``, stopping on any of ``eos_ids`` (vLLM
    builds its own engine from ``model_dir``; it is imported only when chosen; the sim backend
    reads only the vocabulary size there)."""
    r = cfg.rollout
    if r.backend == "sim":
        return SimGenerator(pad_id, eos_ids, model_vocab_size(model_dir), Workload.load(), r.sim_seconds_per_token,
                            r.sim_time_scale)
    if r.backend == "fast":
        static = None if r.cuda_graph else False  # None: graphs on CUDA only
        return FastGenerator(module, pad_id, eos_ids, static_shapes=static)
    if r.backend == "hf":
        return HFGenerator(module, pad_id, eos_ids)
    from reasonrl.rollout.vllm import VLLMGenerator

    return VLLMGenerator(
        model_dir, cfg.run.device, pad_id, eos_ids, "bfloat16" if cfg.train.precision == "bf16-mixed" else cfg.model.dtype,
        r.vllm_gpu_memory_utilization, r.vllm_max_model_len, cfg.run.seed,
    )


def episode_slots(cfg: Config) -> int:
    """Episodes a rollout worker runs at once (environment slots): the rows of the largest
    generation call, a training batch (``gen_prompts_per_step``, or ``prompts_per_step``
    times algo.oversample with dynamic sampling, x rollout.n) or a validation chunk
    (eval.batch_prompts x eval.k)."""
    t, a = cfg.train, cfg.algo
    prompts = t.gen_prompts_per_step or math.ceil(t.prompts_per_step * (a.oversample if a.dynamic_sampling else 1.0))
    return max(prompts * cfg.rollout.n, cfg.eval.batch_prompts * cfg.eval.k)


def trainer_numerics(cfg: Config) -> bool:
    """Whether sampling runs the trainer's own numerics: a backend with the ``trainer_numerics``
    capability (:data:`~reasonrl.config.capabilities.BACKENDS`: fast, hf) in fp32, whose
    sampling log-probs equal the trainer's for the same weights. Not in bf16 (pure or
    ``train.precision=bf16-mixed``): a decode step and a scoring pass round their bf16 products
    differently."""
    return can(cfg.rollout.backend, "trainer_numerics") and cfg.model.dtype == "float32" and cfg.train.precision == "fp32"


class RolloutWorker:
    """Generates groups of responses and tags each token with the version of its weights.

    ``module``: the policy's own module, when the worker is colocated with the policy in
    synchronous mode: sampling then sees each update at once, and :meth:`load_weights`
    only records the version. Without it the worker holds weights of its own, loaded from
    ``model_dir`` and replaced by every :meth:`load_weights` (the asynchronous rollout
    process never touches the trainer's module). In a LoRA run (``model.lora.rank > 0``) with
    a backend that loads adapters, that module holds the policy's LoRA layers and each version
    (``kind="adapters"``) replaces the adapters alone; otherwise versions are whole
    (``full``, or ``merged`` LoRA weights).

    Weights reach the worker in two ways: :meth:`load_weights` now, or
    :meth:`offer_weights` from any thread, which leaves them for the next generation call
    to load first (a weight update lands between generations), or, with ``rollout.interrupt``,
    interrupts the generation in flight, whose unfinished samples go on with them
    (:class:`~reasonrl.rollout.partial.PartialRollouts`).

    Each of the three takes a :class:`~reasonrl.types.WeightsDelta` too (bf16 rollout
    weights, :mod:`reasonrl.rollout.weight_sync`): it is applied on arrival to the newest
    checksummed version received (loaded, offered or staged), the result's checksum
    verified, and refused with a :class:`~reasonrl.rollout.weight_sync.WeightSyncError`
    when the worker holds another version than the delta's base.
    """

    def __init__(self, cfg: Config, model_dir: str | Path, module: torch.nn.Module | None = None,
                 env_workers: Callable[..., Any] | None = None) -> None:
        model_dir = Path(model_dir)
        tokenizer = load_tokenizer(model_dir)
        self.shares_weights = module is not None
        if module is None and cfg.rollout.backend not in ("vllm", "sim"):  # these load no module here
            # a LoRA run's versions are its adapters (the module holds the same LoRA layers) or merged weights
            if ships_adapters(cfg):
                module = load_policy(model_dir, cfg, cfg.run.device)
            else:
                module = load_model(model_dir, cfg.model.dtype, cfg.run.device)
        self.module = module
        """The module the backend samples with (the policy's own, or this worker's copy); None for vLLM and sim."""
        self.eos_ids = load_eos_ids(model_dir, tokenizer)
        """Every id a sample ends on: the tokenizer's EOS and those of the model's generation config."""
        self.backend = build_backend(cfg, model_dir, module, tokenizer.pad_token_id, self.eos_ids)
        self.partial = cfg.rollout.interrupt
        if self.partial:  # it tags each token with its version itself
            self.backend = PartialRollouts(self.backend, self._has_offer, self._load_offered, lambda: self.version)
        self.pad_id = tokenizer.pad_token_id
        self.episodic = bool(cfg.env.name)
        """Whether each rollout is a multi-turn episode (``env.name``): :meth:`generate` then
        takes the prompts themselves (``states``), whose ``extra["seed"]`` resets the environments."""
        self.agent = AgentLoop(self.backend, EnvPool.from_config(cfg.env, episode_slots(cfg), env_workers), tokenizer,
                               cfg.env, self.eos_ids, self.pad_id) if self.episodic else None
        self.precision = cfg.train.precision
        self.device = cfg.run.device
        self.version = 0
        self._offered: WeightsUpdate | None = None
        self._lock = threading.Lock()
        self._staged: WeightsUpdate | None = None
        self._held: WeightsUpdate | None = None
        """The newest checksummed version received: the base the next delta applies to."""
        self._receiving = threading.Lock()
        self._outbox = StreamOutbox()

    @property
    def streams(self) -> bool:
        """Whether the backend can report groups as they complete (:meth:`generate_stream`);
        never for episodes."""
        return self.backend.streams and not self.episodic

    def capabilities(self) -> dict[str, bool]:
        """``streams`` and ``episodic``: what a fleet of these workers can do."""
        return {"streams": self.streams, "episodic": self.episodic}

    def load_weights(self, update: WeightsUpdate | WeightsDelta) -> None:
        """Sample with ``update`` from now on."""
        self._load(self._receive(update))

    def offer_weights(self, update: WeightsUpdate | WeightsDelta) -> None:
        """Leave ``update`` for the next generation call (thread-safe; a newer offer replaces an older one)."""
        update = self._receive(update)
        with self._lock:
            self._offered = update

    def stage_weights(self, update: WeightsUpdate | WeightsDelta) -> None:
        """Thread-safe: keep ``update`` for :meth:`load_staged` (lockstep: the transfer happens
        at publish, the load between the generations it sits between)."""
        update = self._receive(update)
        with self._lock:
            self._staged = update

    def weights(self) -> WeightsUpdate:
        """The parameters this worker samples with (its module's, detached: never modify them)
        and their version; not readable from a vLLM engine."""
        if self.module is None:
            raise TypeError("RolloutWorker.weights: a vLLM engine's weights are not readable")
        return WeightsUpdate(self.version, {name: p.detach() for name, p in self.module.named_parameters()})

    def _receive(self, update: WeightsUpdate | WeightsDelta) -> WeightsUpdate:
        """``update`` as a whole version: a delta applied to the version held, a checksummed
        version verified; either becomes the version held (thread-safe)."""
        with self._receiving:
            if isinstance(update, WeightsDelta):
                update = apply_delta(self._held, update)
            elif update.checksum is not None:
                update = verify(update)
            if update.checksum is not None:
                self._held = update
        return update

    def _load(self, update: WeightsUpdate) -> None:
        if not self.shares_weights:
            if update.kind == "adapters":
                self.backend.load_adapters(update.tensors)
            else:
                self.backend.load_weights(update.tensors)
        self.version = update.version

    def load_staged(self, version: int) -> None:
        """Sample with the staged weights, which must be ``version``."""
        with self._lock:
            staged = self._staged
        if staged is None or staged.version != version:
            raise RuntimeError(f"load_staged({version}): the staged weights are version "
                               f"{None if staged is None else staged.version}")
        self._load(staged)

    def _has_offer(self) -> bool:
        with self._lock:
            return self._offered is not None and self._offered.version != self.version

    def _load_offered(self) -> None:
        with self._lock:
            update, self._offered = self._offered, None
        if update is not None and update.version != self.version:
            self._load(update)

    def _stamp(self, batch: RolloutBatch) -> RolloutBatch:
        if not self.partial:
            batch.versions = batch.response_mask.long() * self.version
        return batch

    def generate(self, prompts: list[list[int]], n: int, params: SamplingParams, seeds: Sequence[int],
                 states: list[Prompt] | None = None) -> RolloutBatch:
        """``n`` samples per prompt, sampled with ``seeds`` (one per prompt group; see
        :class:`~reasonrl.rollout.base.RolloutBackend`), versions tagged; episodes
        (:class:`~reasonrl.rollout.agent_loop.AgentLoop`) from the initial states ``states``
        when :attr:`episodic`."""
        self._load_offered()
        with compute_context(self.precision, self.device):
            if self.agent is None:
                return self._stamp(self.backend.generate(prompts, n, params, seeds))
            if states is None:
                raise ValueError("RolloutWorker.generate: multi-turn episodes (env.name) need the prompts' states")
            return self._stamp(self.agent.generate(prompts, n, params, seeds, [int(s.extra["seed"]) for s in states]))

    def generate_stream(
        self, prompts: list[list[int]], n: int, params: SamplingParams, seeds: Sequence[int], on_groups_done: GroupsDone,
        cancel: Callable[[], bool] | None = None,
    ) -> StreamResult:
        """:meth:`generate` reporting each group as it completes
        (:meth:`~reasonrl.rollout.fast.FastGenerator.generate_stream`), versions tagged;
        ``cancel()``, asked after every decode step, ends it."""
        self._load_offered()
        with compute_context(self.precision, self.device):
            result = self.backend.generate_stream(prompts, n, params, seeds,
                                                  lambda groups, rows: on_groups_done(groups, self._stamp(rows)), cancel)
        self._stamp(result.batch)
        return result

    def stream(self, prompts: list[list[int]], n: int, params: SamplingParams, seeds) -> dict:
        """:meth:`generate_stream` for a :class:`~reasonrl.rollout.fleet.RolloutFleet` in
        another thread or process: each completed group waits in the outbox for
        :meth:`poll_stream`; :meth:`stop_stream` ends the decoding after the current step.
        Returns ``entries`` (completions not polled yet), ``aborted`` (this call's prompt
        indices) and ``aborted_lengths`` (per row of those)."""
        self._outbox.open()
        try:
            result = self.generate_stream(prompts, n, params, seeds, self._outbox.put, lambda: self._outbox.stopping)
        finally:
            entries = self._outbox.close()
        return {"entries": entries, "aborted": result.aborted, "aborted_lengths": result.aborted_lengths}

    def poll_stream(self, wait_s: float) -> list:
        """Thread-safe: the groups completed since the last poll, as ``(decode step, prompt
        indices, rows)``, waiting up to ``wait_s`` for one."""
        return self._outbox.poll(wait_s)

    def stop_stream(self) -> None:
        """Thread-safe: the running :meth:`stream` stops after its current decode step."""
        self._outbox.stop()

    def close(self) -> None:
        """Stop the environment processes (multi-turn episodes); closing twice is harmless."""
        if self.agent is not None:
            self.agent.pool.close()
