"""One frozen dataclass tree for a run, loaded from a YAML recipe plus dotted overrides.

    cfg = load("recipes/dapo.yaml", ["train.total_steps=50", "algo.eps_high=0.28"])

Every field is documented where it is declared. ``load`` rejects unknown keys (with the
nearest valid key), wrong types and impossible values, naming the dotted key.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Optional


@dataclass(frozen=True)
class RunConfig:
    dir: str = "runs/demo"
    """Run directory: config.yaml, metrics.jsonl, events.jsonl, checkpoints/, final/."""
    seed: int = 0
    """Seeds data order, sampling and initialisation."""
    deterministic: bool = True
    """Use deterministic torch kernels (bit-reproducible runs on CPU)."""
    threads: int = 0
    """torch intra-op threads; 0 picks the number of physical cores."""
    device: str = "cpu"
    """Device for policy, reference and critic: cpu, cuda, cuda:N."""
    progress: bool = True
    """Show a progress bar with live reward and accuracy."""


@dataclass(frozen=True)
class ModelConfig:
    path: str = "embedded"
    """'embedded' (the tiny model warm-started by ``reasonrl sft``) or a local Hugging
    Face model directory (config.json, weights, tokenizer)."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Parameter dtype of policy, reference and critic."""


@dataclass(frozen=True)
class DataConfig:
    source: str = "embedded"
    """'embedded' (generated arithmetic tasks) or a .jsonl / .parquet file path."""
    test_source: str = ""
    """Held-out file for validation; empty: the embedded test split, or the first
    ``eval.n_prompts`` rows of ``source`` are held out when a file is given."""
    families: tuple[str, ...] = ("add", "sub", "mul")
    """Embedded task families to draw from."""
    train_size: int = 20000
    """Number of embedded training problems."""
    test_size: int = 256
    """Number of embedded held-out problems (disjoint from the training split)."""
    prompt_key: str = "prompt"
    """JSONL field holding the problem text (a string or chat messages)."""
    answer_key: str = "ground_truth"
    """JSONL field holding the reference answer."""
    max_prompt_len: int = 64
    """Prompts longer than this many tokens are an error naming the row."""


@dataclass(frozen=True)
class SFTConfig:
    """Supervised warm start of the embedded model (cached on disk by these settings)."""

    hidden_size: int = 128
    layers: int = 4
    heads: int = 4
    kv_heads: int = 2
    intermediate_size: int = 384
    lr: float = 3e-3
    batch_size: int = 64
    max_steps: int = 3000
    eval_every: int = 50
    eval_size: int = 128
    target_acc: float = 0.3
    """Stop once greedy held-out accuracy reaches this (well below perfect on purpose)."""
    seed: int = 1234


@dataclass(frozen=True)
class RolloutConfig:
    n: int = 8
    """Samples per prompt (the group size)."""
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    """0 disables top-k."""
    max_new_tokens: int = 32
    """Responses longer than this are truncated."""


@dataclass(frozen=True)
class RewardConfig:
    fn: str = "dapo"
    """'dapo' (last 'Answer:' line, +1/-1), 'boxed' (last \\boxed{}), or 'module:function'."""


@dataclass(frozen=True)
class AlgoConfig:
    adv_estimator: Literal["grpo", "dr_grpo", "lite_ppo", "rloo", "reinforce_pp", "gae"] = "grpo"
    eps_low: float = 0.2
    """Lower clip range: ratio >= 1 - eps_low for negative-advantage tokens."""
    eps_high: float = 0.2
    """Upper clip range (clip-higher when > eps_low)."""
    dual_clip: Optional[float] = None
    """Dual-clip constant c > 1 bounding the loss of negative-advantage tokens; None: off."""
    loss_agg: Literal[
        "token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"
    ] = "token-mean"
    kl_loss_coef: float = 0.0
    """Weight of the KL-to-reference loss; 0 disables the reference model."""
    kl_kind: Literal["k1", "k2", "k3", "abs"] = "k3"
    entropy_coef: float = 0.0
    gamma: float = 1.0
    lam: float = 1.0
    """GAE lambda."""
    dynamic_sampling: bool = False
    """Drop groups whose scores are all equal and keep generating until the batch is full."""
    max_gen_batches: int = 10
    """Dynamic sampling gives up with an error after this many generation batches per step."""
    overlong_filter: bool = False
    """Mask truncated samples out of the loss."""
    overlong_buffer: int = 0
    """Soft overlong punishment: length of the buffer before max_new_tokens; 0 disables."""
    overlong_penalty: float = 1.0
    """Penalty at the hard limit (linear ramp over the buffer)."""


@dataclass(frozen=True)
class TrainConfig:
    total_steps: int = 100
    prompts_per_step: int = 16
    """Train batch size in prompts (x rollout.n samples)."""
    gen_prompts_per_step: int = 0
    """Prompts per generation batch with dynamic sampling; 0: same as prompts_per_step."""
    ppo_epochs: int = 1
    mini_batch_size: int = 64
    """Samples per optimizer step; must divide the train batch."""
    micro_batch_size: int = 16
    """Samples per forward/backward; must divide mini_batch_size."""
    lr: float = 1e-4
    warmup_steps: int = 0
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    critic_lr: float = 1e-3
    value_clip: float = 0.5
    value_coef: float = 1.0


@dataclass(frozen=True)
class EvalConfig:
    every_steps: int = 10
    """Validate every N steps (and before the first and after the last); 0: never."""
    n_prompts: int = 128
    k: int = 4
    """Samples per held-out prompt for mean accuracy and pass@k."""
    temperature: float = 1.0
    greedy: bool = True
    """Also report greedy accuracy."""


@dataclass(frozen=True)
class CheckpointConfig:
    every_steps: int = 0
    """Save a checkpoint every N steps; 0: only at the end."""
    keep: int = 2
    """Number of committed checkpoints to keep."""


@dataclass(frozen=True)
class Config:
    run: RunConfig = field(default_factory=RunConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
