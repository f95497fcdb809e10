"""Memory: an estimate of a step's peak before training starts, and the measured peak of each step.

The estimate (:func:`estimate_memory`) adds up, for the configured model and batch, what one
training process and its rollout side hold at their peak:

    weights     N x b_p per model copy: the policy (whose module rollout workers colocated with it
                share), the reference (algo.kl_loss_coef > 0), the critic (algo.adv_estimator=gae),
                and each rollout worker's own copy when they have their own (runtime.roles.rollout)
    training    gradients N x b_p and AdamW's two moments 2 N x b_p, per trained model; a LoRA
                policy (model.lora.rank > 0) trains only its adapters: 3 A x b_p
    adapters    a LoRA policy's adapters, A x b_p (and each rollout worker's copy where the
                backend loads adapters), and the merged projections W + (alpha / r) B A the lean
                decoder builds for a forward, P x b_p (P: the adapted projections' parameters)
    compute     bf16 copies of the weights, N x 2, while a forward runs (train.precision=bf16-mixed)
    weight sync the bf16 version last shipped to rollout workers with weights of their own, N x 2,
                kept to encode the next one against (where versions ship in bf16: bf16-mixed or
                model.dtype=bfloat16; reasonrl/rollout/weight_sync.py)
    generation  the key/value cache, rows x (prompt + response) x layers x 2 Hkv D x b_c (the
                response: rollout.max_new_tokens, or a whole trajectory's env.max_tokens),
                and the step's logits, rows x V x 4 x 3
    activations one micro-batch's tokens t (train.micro_batch_tokens, or micro_batch_size rows of
                the longest prompt + max_new_tokens; at most a mini-batch's): t x layers x a
                (a below; t x layers x d x 4 with train.grad_checkpointing, plus one layer's a
                recomputed), and the LM head's
                r x V' x (b_c + 18) over the micro-batch's response tokens r (its rows x
                max_new_tokens): the logits, their fp32 copy, the log-softmax and the entropy's
                probabilities kept for backward, and a gradient of that size, where V' is the
                vocabulary V, or train.lm_head_chunk where that is narrower and the lean decoder
                scores the model (the chunked head, reasonrl/models/lm_head.py: one chunk's
                logits and their gradient at a time); and for a fully trained policy the
                gradients of the head's and the embedding's V x d weights, 2 V d b_p, each made
                whole by its backward before it is added to the parameter's gradient
    runtime     the interpreter and torch's libraries, 0.6 GB on a CPU
    kernels     bf16 products on a CPU run through oneDNN, which keeps a compiled kernel per matrix
                shape it met (up to 1024 of them; about 0.7 MB each here): 0.85 GB per process,
                measured as the difference of the embedded DAPO recipe's peak in bf16-mixed and fp32

with N the parameters (from the model's config.json: no weights are read), A the adapters'
parameters, rank x (in + out) per adapted projection and layer (:meth:`ModelShape.lora_parameters`),
b_p the parameters' bytes per element (model.dtype), b_c the bytes of the products (2 under bf16-mixed), and per
token and layer of the lean decoder's forward the saved tensors

    a = 2 d b_p                          the two norms' inputs (the residual stream)
      + (2 d + H D + I) b_c              the inputs of the four matrix products
      + ((H + 2 Hkv) D + H D) b_c        query, key, value and output kept by attention
      + 2 (H + Hkv) D b_p                the rotary embedding's operands
      + 3 I b_c                          gate, up and silu(gate) of the MLP

Training and generation do not overlap in one process (at staleness 0 they alternate), so the
peak is the larger of the two there; rollout workers with weights of their own each add their
own (weights, runtime, and the cache of their share of the generation batch).

:class:`PeakMemory` measures a step: the process's resident-set high-water mark on a CPU
(``VmHWM``, reset through ``/proc/self/clear_refs`` at each step start), CUDA's peak allocated
bytes on a GPU. It covers the training process (rollout workers in processes of their own are
not in it).
"""

from __future__ import annotations

import json
import math
import resource
from dataclasses import dataclass, field
from pathlib import Path

from reasonrl.config import Config
from reasonrl.config.capabilities import can
from reasonrl.config.rules import rollout_shares_policy, ships_bf16_versions
from reasonrl.errors import LimitError
from reasonrl.models import LEAN_MODEL_TYPES

GB = 1024**3
RUNTIME_BYTES = int(0.6 * GB)
"""The interpreter, torch and transformers in one process (their resident size on a CPU)."""
KERNEL_CACHE_BYTES = int(0.85 * GB)
"""oneDNN's cache of compiled bf16 kernels in one process on a CPU (the module docstring)."""

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class ModelShape:
    """What the estimate needs of a decoder's config."""

    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    tied: bool
    qkv_bias: bool = False
    """Biases on the q/k/v projections (Qwen2; Llama's attention_bias)."""
    o_bias: bool = False
    """A bias on the output projection (Llama's attention_bias)."""
    qk_norm: bool = False
    """Per-head q and k RMSNorm weights (Qwen3)."""
    lean: bool = True
    """The lean decoder scores it (its family is one of :data:`~reasonrl.models.LEAN_MODEL_TYPES`), so
    its LM head runs in chunks (train.lm_head_chunk); otherwise ``transformers`` makes the full logits."""

    @classmethod
    def from_config(cls, config: dict) -> "ModelShape":
        """From a ``config.json`` dict (Llama, Qwen2, Qwen3 keys)."""
        heads = int(config["num_attention_heads"])
        hidden = int(config["hidden_size"])
        return cls(
            vocab=int(config["vocab_size"]),
            hidden=hidden,
            layers=int(config["num_hidden_layers"]),
            heads=heads,
            kv_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=int(config.get("head_dim") or hidden // heads),
            intermediate=int(config["intermediate_size"]),
            tied=bool(config.get("tie_word_embeddings", False)),
            qkv_bias=config.get("model_type") == "qwen2" or bool(config.get("attention_bias", False)),
            o_bias=config.get("model_type") != "qwen2" and bool(config.get("attention_bias", False)),
            qk_norm=config.get("model_type") == "qwen3",
            lean=config.get("model_type") in LEAN_MODEL_TYPES,
        )

    @classmethod
    def from_model_dir(cls, path: str | Path) -> "ModelShape":
        return cls.from_config(json.loads((Path(path) / "config.json").read_text(encoding="utf-8")))

    def projections(self) -> dict[str, tuple[int, int]]:
        """``(in, out)`` features of each projection of a layer, by its module name."""
        d, D, H, Hkv, I = self.hidden, self.head_dim, self.heads, self.kv_heads, self.intermediate
        return {"q_proj": (d, H * D), "k_proj": (d, Hkv * D), "v_proj": (d, Hkv * D), "o_proj": (H * D, d),
                "gate_proj": (d, I), "up_proj": (d, I), "down_proj": (I, d)}

    def lora_parameters(self, rank: int, targets: tuple[str, ...]) -> tuple[int, int]:
        """``(A, P)``: the LoRA adapters' parameters, ``rank x (in + out)`` per adapted projection
        of each layer, and the adapted projections' own (``in x out`` each); projections are
        matched by name as peft does (``targets`` naming others count nothing here)."""
        adapted = [(i, o) for name, (i, o) in self.projections().items() if any(name.endswith(t) for t in targets)]
        return self.layers * sum(rank * (i + o) for i, o in adapted), self.layers * sum(i * o for i, o in adapted)

    def parameters(self) -> int:
        """Parameter count: embeddings (and an untied head), per layer the q/k/v/o and MLP
        projections, their biases, two norms (and the q/k norms), and the final norm."""
        d, D, H, Hkv, I = self.hidden, self.head_dim, self.heads, self.kv_heads, self.intermediate
        attention = d * (H + 2 * Hkv) * D + H * D * d
        attention += (H + 2 * Hkv) * D * self.qkv_bias + d * self.o_bias + 2 * D * self.qk_norm
        per_layer = attention + 3 * d * I + 2 * d
        return self.vocab * d * (1 if self.tied else 2) + self.layers * per_layer + d


@dataclass
class MemoryEstimate:
    """Bytes per part (:func:`estimate_memory`), the peak and what it assumed."""

    parts: dict[str, int] = field(default_factory=dict)
    peak: int = 0
    tokens_per_micro_batch: int = 0
    parameters: int = 0

    def describe(self) -> str:
        """One line: the peak, then the parts from the largest."""
        parts = ", ".join(f"{name} {size / GB:.2f}" for name, size in sorted(self.parts.items(), key=lambda kv: -kv[1]) if size)
        return (f"~{self.peak / GB:.2f} GB at peak ({self.parameters / 1e6:.1f}M parameters, "
                f"{self.tokens_per_micro_batch} tokens per micro-batch; GB: {parts})")


def activation_bytes_per_token_layer(shape: ModelShape, param_bytes: int, compute_bytes: int) -> int:
    """``a`` of the module docstring: what one layer's forward keeps for backward per token."""
    d, D, H, Hkv, I = shape.hidden, shape.head_dim, shape.heads, shape.kv_heads, shape.intermediate
    return (2 * d * param_bytes + (2 * d + H * D + I) * compute_bytes + ((H + 2 * Hkv) * D + H * D) * compute_bytes
            + 2 * (H + Hkv) * D * param_bytes + 3 * I * compute_bytes)


def estimate_memory(cfg: Config, shape: ModelShape, prompt_len: int | None = None) -> MemoryEstimate:
    """The peak memory of a step of ``cfg`` with a model of ``shape`` (the module docstring),
    whose prompts are at most ``prompt_len`` tokens (default ``data.max_prompt_len``)."""
    t, r, a = cfg.train, cfg.rollout, cfg.algo
    N = shape.parameters()
    b_p = DTYPE_BYTES[cfg.model.dtype]
    mixed = t.precision == "bf16-mixed"
    b_c = 2 if mixed else b_p
    response = cfg.env.max_tokens if cfg.env.name else r.max_new_tokens  # a trajectory holds every turn
    context = (prompt_len or cfg.data.max_prompt_len) + response
    critic = a.adv_estimator == "gae"
    workers = 0 if rollout_shares_policy(cfg) else cfg.runtime.roles.rollout.count  # with weights of their own

    lora = cfg.model.lora
    A, P = shape.lora_parameters(lora.rank, lora.target_modules) if lora.rank > 0 else (0, 0)
    trained = A if lora.rank > 0 else N  # the policy's trained parameters
    weights = N * b_p * (1 + (a.kl_loss_coef > 0) + critic)
    training = 3 * trained * b_p + 3 * N * b_p * critic
    adapters = (A + P) * b_p
    worker_adapters = A * b_p if can(cfg.rollout.backend, "adapters") else 0  # a rollout worker's own LoRA layers
    compute = 2 * N if mixed else 0
    sync = 2 * N if workers and ships_bf16_versions(cfg) else 0  # the sender's copy of the last version
    gen_prompts = t.gen_prompts_per_step or math.ceil(t.prompts_per_step * (a.oversample if a.dynamic_sampling else 1))
    rows = gen_prompts * r.n
    kv = rows * context * shape.layers * 2 * shape.kv_heads * shape.head_dim * b_c
    generation = kv + rows * shape.vocab * 4 * 3
    mini = t.mini_batch_size * context  # a micro-batch never holds more than its mini-batch
    tokens = min(max(t.micro_batch_tokens, context), mini) if t.micro_batch_tokens > 0 else min(t.micro_batch_size * context, mini)
    per_layer = activation_bytes_per_token_layer(shape, b_p, b_c)
    if t.grad_checkpointing:
        activations = tokens * shape.layers * shape.hidden * 4 + tokens * per_layer
    else:
        activations = tokens * shape.layers * per_layer
    head_width = min(shape.vocab, t.lm_head_chunk) if t.lm_head_chunk > 0 and shape.lean else shape.vocab
    head_grads = 2 * shape.vocab * shape.hidden * b_p if lora.rank == 0 else 0  # the head's and the embedding's
    head = max(tokens // context, 1) * response * head_width * (b_c + 18) + head_grads
    kernels = KERNEL_CACHE_BYTES if b_c == 2 and not cfg.run.device.startswith("cuda") else 0
    trainer_peak = weights + training + adapters + compute + sync + RUNTIME_BYTES + kernels
    if workers:  # processes of their own: weights, their compute copy, a share of the cache, the runtime
        generation = math.ceil(generation / workers)  # the dispatch splits each generation batch
        rollout = workers * (N * b_p + worker_adapters + compute + generation + RUNTIME_BYTES + kernels)
        peak = trainer_peak + activations + head + rollout
    else:
        rollout = 0
        peak = trainer_peak + max(activations + head, generation)
    parts = {
        "weights": weights, "gradients+AdamW": training, "LoRA adapters+merged": adapters, "bf16 copies": compute,
        "weight sync": sync,
        "generation": generation,
        "activations": activations, "LM head": head, "rollout workers": rollout - workers * generation if rollout else 0,
        "runtime": RUNTIME_BYTES, "kernel cache": kernels,
    }
    return MemoryEstimate(parts, peak, tokens, N)


def available_memory(device: str) -> tuple[int, str] | None:
    """``(bytes, where)`` a run may use on ``device``: CUDA's free memory, or on a CPU the
    smaller of ``MemAvailable`` and the cgroup's remaining limit; None when unknown."""
    if device.startswith("cuda"):
        import torch

        free, _ = torch.cuda.mem_get_info(torch.device(device))
        return free, f"free on {device}"
    try:
        meminfo = Path("/proc/meminfo").read_text()
    except OSError:
        return None
    fields = dict(line.split(":", 1) for line in meminfo.splitlines() if ":" in line)
    if "MemAvailable" not in fields:
        return None
    available, where = int(fields["MemAvailable"].split()[0]) * 1024, "MemAvailable in /proc/meminfo"
    limit, used = Path("/sys/fs/cgroup/memory.max"), Path("/sys/fs/cgroup/memory.current")
    try:
        cap = limit.read_text().strip()
        if cap != "max":
            room = int(cap) - int(used.read_text())
            if room < available:
                available, where = room, "left under the cgroup's memory.max"
    except (OSError, ValueError):
        pass
    return available, where


def check_fits(cfg: Config, estimate: MemoryEstimate) -> None:
    """LimitError when the estimate exceeds the memory available (``train.memory_check``),
    naming the largest parts and the keys that shrink them."""
    if not cfg.train.memory_check:
        return
    found = available_memory(cfg.run.device)
    if found is None or estimate.peak <= found[0]:
        return
    room, where = found
    raise LimitError(
        f"a step needs {estimate.describe()}, more than the {room / GB:.2f} GB {where}: lower "
        "train.micro_batch_tokens (or train.micro_batch_size), train.prompts_per_step or rollout.n, set "
        "train.grad_checkpointing=true or train.precision=bf16-mixed; train.memory_check=false runs anyway"
    )


class PeakMemory:
    """The peak memory of this process since :meth:`reset`, in GB (see the module docstring)."""

    CLEAR_REFS = Path("/proc/self/clear_refs")

    def __init__(self, device: str) -> None:
        self.cuda = device.startswith("cuda")
        self.device = device
        self.resets = True  # whether VmHWM can be reset here; else the lifetime peak is reported

    def reset(self) -> None:
        if self.cuda:
            import torch

            torch.cuda.reset_peak_memory_stats(self.device)
            return
        if self.resets:
            try:
                self.CLEAR_REFS.write_text("5")  # resets the resident-set high-water mark (Linux 4.0+)
            except OSError:
                self.resets = False

    def peak_gb(self) -> float:
        if self.cuda:
            import torch

            return torch.cuda.max_memory_allocated(self.device) / GB
        try:
            for line in Path("/proc/self/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024 / GB
        except OSError:
            pass
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GB
