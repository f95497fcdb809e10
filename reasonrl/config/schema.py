"""The config tree: one frozen dataclass per section of a run, every field documented where it
is declared (the docstring under it is its help), and ConfigError. Loading and dumping are in
``reasonrl.config.loader``, the checks that tie keys together in ``reasonrl.config.rules``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Literal, Optional

from reasonrl.errors import InputError


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
    log_every: int = 10
    """Print a line of the main metrics (reward, accuracy, loss, grad norm, KL, length,
    throughput) every N steps, beside the progress bar; 0: never."""
    loggers: tuple[Literal["tensorboard", "wandb"], ...] = ("tensorboard",)
    """Where metrics go besides metrics.jsonl: 'tensorboard' (RUN_DIR/tensorboard: scalars,
    the config as hparams, text samples) and 'wandb' (Weights & Biases: config, metrics and a
    sample table; needs the optional wandb package)."""
    log_samples: int = 4
    """Generated samples (prompt, response, reward) sent to the loggers every run.log_every
    steps, and of each validation (TensorBoard text 'val_samples'); 0: none."""
    keep_samples: int = 8
    """Training samples per step written to RUN_DIR/samples.jsonl (prompt, response, answer,
    reward breakdown; spread over the step's prompts), beside every validation sample
    (eval.n_prompts x eval.k a validation); 0: no samples file. `reasonrl samples` prints them."""
    wandb_project: str = "reasonrl"
    """W&B project of run.loggers wandb (the run is named after run.dir)."""
    wandb_mode: Literal["offline", "online"] = "offline"
    """W&B mode: 'offline' writes RUN_DIR/wandb with no account or network (upload later with
    ``wandb sync``); 'online' streams to the W&B server (needs ``wandb login``). The WANDB_MODE
    environment variable overrides it."""


LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""The attention and MLP projections of a Llama-family decoder: model.lora.target_modules' default."""


@dataclass(frozen=True)
class LoraConfig:
    rank: int = 0
    """LoRA rank r of the policy's adapters; 0: off (every parameter trains). Above 0, the
    base weights are frozen and only the adapters (A [r, in], B [out, r] per target
    projection, with the ``peft`` library: the ``lora`` extra) train and sit in the optimizer;
    checkpoints hold the adapters. The reference and critic models stay as they are."""
    alpha: float = 16.0
    """LoRA alpha: the adapter's output is scaled by alpha / rank (W + (alpha / r) B A)."""
    dropout: float = 0.0
    """Dropout on the adapters' input in training forwards, in [0, 1). Above 0 the trainer scores
    through the ``transformers`` modules (the lean decoder fuses W + (alpha / r) B A, which has
    no dropout): slower on a CPU."""
    target_modules: tuple[str, ...] = LORA_TARGETS
    """Names of the projections that get adapters (peft's target_modules: a module whose name ends
    in one of them). Default: the attention (q, k, v, o) and MLP (gate, up, down) projections."""


@dataclass(frozen=True)
class ModelConfig:
    path: str = "embedded"
    """'embedded' (the tiny model warm-started by ``reasonrl sft``) or a local Hugging
    Face model directory (config.json, weights, tokenizer)."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Parameter dtype of policy, reference and critic. bfloat16/float16 train the parameters
    themselves in that dtype (half the memory of float32), where AdamW steps below half the
    dtype's spacing (bf16: 2^-8 of a weight) are rounded away and lost; train.precision=bf16-mixed
    keeps float32 parameters and runs the products in bf16 instead."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """LoRA adapters on the policy (model.lora.rank > 0)."""


DIFFICULTY_LEVELS = ("easy", "full", "hard")
"""The levels of data.difficulty (reasonrl/data/tasks.py draws them)."""


@dataclass(frozen=True)
class DataConfig:
    source: str | tuple[str, ...] = "embedded"
    """'embedded' (generated arithmetic tasks), or the training data: a .jsonl, .json (an array
    of row objects, or JSON lines), .parquet or .arrow file, a directory written by Hugging Face
    datasets' save_to_disk (a DatasetDict's 'train' split; DIR:SPLIT names another), a glob
    pattern, or a list of these (their rows in order)."""
    test_source: str | tuple[str, ...] = ""
    """The held-out data, in any form data.source takes (a DatasetDict's 'test' or 'validation'
    split unless DIR:SPLIT names one), also beside data.source=embedded. Empty: the embedded
    test split; the 'test' or 'validation' split of a DatasetDict given as data.source; else
    data.holdout distinct prompts of data.source, all their copies taken out of training."""
    seed: int = 0
    """Seeds the embedded train/test problems and the pick of data.holdout (independent of run.seed,
    so runs compare on one test set)."""
    families: tuple[str, ...] = ("add", "mul", "sum")
    """Embedded task families to draw from."""
    difficulty: dict[str, Any] = field(default_factory=dict)
    """Embedded task: the difficulty of each family, ``{family: easy | full | hard}``
    (``data.difficulty.mul=hard``), training and held-out problems alike; a family not named is
    ``full``, its whole range. ``easy`` and ``hard`` are the two sides of the family's cut
    (reasonrl/data/tasks.py LEVELS: add, a carry in the units; mul, a multiplier of 6 or more;
    sum, a total of 10 or more; chain, 4 terms or more; code, a two-digit constant). The warm
    start does not depend on it: it is trained on the full range of data.families."""
    train_size: int = 20000
    """Number of embedded training problems."""
    test_size: int = 256
    """Number of embedded held-out problems (disjoint from the training split)."""
    prompt_key: str = "prompt"
    """Field (column) holding the problem: a string, a list of chat messages, or a string
    holding a JSON list of messages; a dotted path reaches into nested fields."""
    answer_key: str = "ground_truth"
    """Field holding the reference answer (a dotted path; falls back to reward_model.ground_truth,
    the verl layout); numbers become strings."""
    id_key: str = ""
    """Field holding the row's id; empty: 'id', else extra_info.index (verl), else the row number."""
    source_key: str = ""
    """Field naming the row's data source (reward.by_source and val/acc/SOURCE use it); empty:
    'data_source', else 'source', else 'tag', else the file's name."""
    dedupe: bool = False
    """Drop the rows of data files whose prompt (its text, whitespace collapsed) repeats an
    earlier row's, keeping the first (the released DAPO-Math-17k repeats each prompt)."""
    holdout: int = 0
    """Without data.test_source: the distinct prompts of data.source held out for validation
    (one row each; their copies are never trained on), picked by a hash of the prompt text
    seeded by data.seed; 0: eval.n_prompts. At most half of the distinct prompts."""
    max_prompt_len: int = 64
    """Prompts longer than this many tokens are an error naming the row."""
    truncation: Literal["error", "left", "drop"] = "error"
    """What becomes of a prompt longer than data.max_prompt_len tokens, or one whose length
    plus the response limit (rollout.max_new_tokens; for held-out prompts eval.max_new_tokens
    when set) exceeds the model's context (max_position_embeddings): 'error' names it and
    stops; 'left' keeps its last tokens (the end holds the question and the chat template's
    generation prompt), and its first token too when that is the tokenizer's BOS; 'drop'
    leaves the row out. The prompts cut or dropped are counted and printed at the start."""
    mix: Literal["uniform", "adaptive", "static"] = "uniform"
    """How training prompts are drawn across their data sources (each row's data_source: the
    embedded families, or a dataset's sources). 'uniform': every row once per epoch, so each
    source in proportion to its rows. 'adaptive': each draw first picks a source with the
    sampling weights p, then the next row of that source's own epoch order; the weights move
    after every rollout batch toward the sources that need it (data.mix_by), from equal
    weights at the start (formulas in reasonrl/data/mixing.py; docs/data.md). 'static': the
    same draws with the fixed weights of data.mix_weights. Logged every step as
    data/mix/SOURCE (the weights the step's prompts were drawn with) and data/mix_acc/SOURCE
    (the accuracy averages after the step's rollout batch, which adaptive weights come from);
    checkpointed."""
    mix_weights: dict[str, Any] = field(default_factory=dict)
    """data.mix=static: the sampling weight of every data source of the training data,
    ``{source: weight}`` (``data.mix_weights={embedded/add: 0.5, embedded/mul: 0.3,
    embedded/sum: 0.2}``), each >= 0, summing to 1. A sweep over these keys is what
    ``reasonrl sweep --fit-mix`` fits a mixture law to."""
    mix_by: Literal["gap", "signal"] = "gap"
    """data.mix=adaptive: what a source's need is, from its accuracy average a. 'gap' (DDK's
    discrepancy factor): d = max(data.mix_target - a, 0), the sources that lag the target most
    get the most. 'signal': d = a * (1 - a), the sources whose pass rate is nearest one half
    get the most (where groups of samples disagree and GRPO has a gradient; a source that is
    always or never solved gets only the floor)."""
    mix_target: float = 1.0
    """data.mix=adaptive with data.mix_by=gap: the accuracy each source should reach; a source
    at or above it has no gap and keeps only data.mix_floor. In (0, 1]."""
    mix_floor: float = 0.05
    """data.mix=adaptive: the least sampling weight of every source, so none starves:
    p = floor + (1 - S * floor) * w for S sources and smoothed weights w. In [0, 1/S]
    (1/S: always equal weights)."""
    mix_rate: float = 0.3
    """data.mix=adaptive: how far the weights move toward the new need after each rollout
    batch (DDK's smoothing): w <- (1 - rate) * w + rate * r, r the sources' needs normalised to
    sum 1. In (0, 1]; 1: no smoothing."""
    mix_ema: float = 0.8
    """data.mix=adaptive: the weight of the old value in each source's accuracy average:
    a <- ema * a + (1 - ema) * x, for x the source's accuracy over the samples of a rollout
    batch, and its held-out accuracy (val/acc/SOURCE) after each validation; the first x
    sets a. In [0, 1); 0: the latest value alone."""
    curriculum_window: int = 0
    """A prompt whose groups were all solved (every sample right), or all failed (none
    right), in each of its last K = curriculum_window observations leaves the pool of
    training prompts for data.curriculum_revisit rollout batches; 0: off (every prompt stays).
    Logged as data/curriculum/retired and data/curriculum/returned (prompts per step) and
    data/curriculum/out_of_pool; checkpointed."""
    curriculum_revisit: int = 20
    """data.curriculum_window > 0: the rollout batches (one a step) a retired prompt stays out
    of the pool before it comes back."""


@dataclass(frozen=True)
class SFTConfig:
    """Supervised warm start of the embedded model (cached on disk by these settings)."""

    hidden_size: int = 192
    """Width of the embedded Llama decoder."""
    layers: int = 4
    """Decoder layers of the embedded model."""
    heads: int = 6
    """Attention heads (must divide sft.hidden_size)."""
    kv_heads: int = 2
    """Key/value heads (grouped-query attention; must divide sft.heads)."""
    intermediate_size: int = 512
    """Hidden width of each layer's SwiGLU MLP."""
    lr: float = 2e-3
    """AdamW learning rate of the warm start (linear warmup over its first 20 steps). At 3e-3 the
    embedded Llama needs 450 steps to the target, at 2e-3 250."""
    batch_size: int = 64
    """Worked solutions per warm-start step."""
    max_steps: int = 2000
    """The warm start stops here even if sft.target_acc is not reached."""
    eval_every: int = 25
    """Measure greedy held-out accuracy every N warm-start steps."""
    eval_size: int = 256
    """Held-out problems of that measurement."""
    target_acc: float = 0.5
    """Stop once greedy held-out accuracy reaches this (well below perfect on purpose)."""
    seed: int = 1234
    """Seeds the embedded model's initialisation, its training problems and their order."""


@dataclass(frozen=True)
class RolloutConfig:
    n: int = 8
    """Samples per prompt (the group size)."""
    temperature: float = 1.0
    """Sampling temperature of the rollouts (the log-probs are those of this distribution)."""
    top_p: float = 1.0
    """Nucleus sampling: keep the smallest set of tokens whose probability reaches top_p; 1: off."""
    top_k: int = 0
    """0 disables top-k."""
    max_new_tokens: int = 32
    """Responses longer than this are truncated."""
    backend: Literal["hf", "fast", "vllm", "sim"] = "fast"
    """'fast' (KV-cache decode loop of reasonrl), 'hf' (transformers generate, the reference),
    'vllm' (a vLLM engine in the trainer's process, weights synced before sampling; needs the
    optional vllm package) or 'sim' (for benchmarks and tests only: a latency model with no
    model, random tokens, response lengths drawn from a distribution recorded from a real run,
    rollout.sim_seconds_per_token of modelled time per token; bench/fleet.py --simulate)."""
    sim_seconds_per_token: float = 0.001
    """backend=sim: the modelled seconds a rollout worker spends per generated token; a call
    whose rows have L_1..L_B tokens takes sim_seconds_per_token * (L_1 + ... + L_B) modelled
    seconds."""
    sim_time_scale: float = 1.0
    """backend=sim: real seconds per modelled second (0.01: a modelled minute passes in 0.6 s)."""
    cuda_graph: bool = True
    """On a CUDA device, the fast backend replays each decode step as one captured CUDA graph
    (every row kept to the end of the batch); false: eager steps, finished rows dropped. No
    effect on CPU."""
    vllm_gpu_memory_utilization: float = 0.4
    """backend=vllm: the share of GPU memory vLLM may take (its weights and key/value cache),
    leaving the rest to training. Ignored on a CPU."""
    vllm_max_model_len: Optional[int] = None
    """backend=vllm: the longest prompt + response its cache must hold; null: the model's
    max_position_embeddings."""
    mode: Literal["sync", "async", "lockstep"] = "sync"
    """'sync': each batch is generated when the trainer asks for it, with its current weights
    (lockstep at staleness 0). 'async': the rollout workers generate ahead with their own copy
    of the weights, within max_staleness, taking up each new version before their next
    generation call. 'lockstep': like async, but batch n is generated with exactly version
    max(0, n - max_staleness): deterministic (tests, exact resume). At max_staleness 0 all
    three give the same run."""
    max_staleness: int = 0
    """async/lockstep: the most versions a trained group may lag the trainer (train version -
    the oldest version among its tokens); older groups are dropped and counted. > 0 needs
    algo.off_policy bypass, tis or decoupled."""
    interrupt: bool = False
    """async with the fast backend: a new version interrupts the generation in flight, whose
    unfinished samples go on with the new weights (partial rollouts; every token keeps the
    version that sampled it). false: new weights wait for the next generation call."""
    group_retries: int = 3
    """Failed dispatches a prompt group may have (its rollout worker died, hung, was quarantined
    or raised) before it fails as a whole: a group is always generated again whole, never
    trained from parts; a failed group is left out of the batch, recorded with the fate
    ``failed`` in prompts.jsonl and counted (batch/failed_groups)."""


@dataclass(frozen=True)
class RewardConfig:
    fn: str = "dapo"
    """'dapo' (last 'Answer:' line, +1/-1), 'boxed' (last \\boxed{}; both compare strings),
    'math_verify' (the final answer checked for mathematical equivalence by the optional
    math-verify package: 1/2 = 0.5 = \\dfrac{1}{2}), 'module:function' or 'path/to/file.py:function'."""
    by_source: tuple[str, ...] = ()
    """Reward functions per data source, 'SOURCE=FN' entries (FN as in reward.fn), for example
    [openai/gsm8k=gsm8k, math_dapo=math_verify]; a row whose data_source is not listed gets
    reward.fn."""
    range: tuple[float, ...] = (-1.0, 1.0)
    """[wrong, right]: the scores of the built-in functions (dapo, boxed, gsm8k, math_verify,
    code), which score from -1 (wrong) to +1 (right), mapped linearly onto this range: [0, 1]
    gives {0, 1} rewards (code's fractions become passed / total). A sample whose grading failed
    scores the low end. reward.format_score and the overlong punishment are added after. An
    import-path function keeps its own scores (its range cannot be changed here), and so does
    an environment's return."""
    format: str = ""
    """A format reward added to any function's score: '' (none), 'boxed' (one \\boxed{} answer
    at the end), 'answer_line' (a last line 'Answer: ...'), 'think' (<think>...</think> then the
    answer), or 're:REGEX' (the response must match REGEX, searched with re.DOTALL)."""
    format_score: float = 0.1
    """Added to the score of a response in reward.format; logged as reward/format (the fraction
    that is)."""
    code_mode: Literal["fraction", "all"] = "fraction"
    """reward.fn=code: 'fraction' scores 2 * passed / total - 1 (from -1, none of the row's tests
    passed, to +1, all did), 'all' scores +1 only when every test passes, else -1."""
    code_timeout_s: float = 5.0
    """reward.fn=code: wall-clock seconds all of a row's program runs may take together; keep it
    below runtime.roles.reward.timeout_s."""
    code_memory_mb: int = 512
    """reward.fn=code: address-space limit of each program run, in MiB."""
    sandbox: Literal["auto", "bwrap", "rlimits"] = "auto"
    """reward.fn=code: how programs are contained (docs/sandbox.md): 'bwrap' (bubblewrap: no
    network, only the interpreter's files visible, resource limits, the system-call filter),
    'rlimits' (resource limits, the system-call filter and a throw-away directory only); 'auto'
    is bwrap where it works on this machine."""


@dataclass(frozen=True)
class AlgoConfig:
    adv_estimator: Literal["grpo", "dr_grpo", "lite_ppo", "batch", "rloo", "reinforce_pp", "gae"] = "grpo"
    """Advantage estimator (reasonrl/algo/advantages.py): 'grpo' (group mean and std), 'dr_grpo'
    (group mean only), 'lite_ppo' (group mean, batch std), 'batch' (batch mean and std, no
    groups), 'rloo' (leave-one-out mean),
    'reinforce_pp' (REINFORCE++: batch-whitened returns), 'gae' (PPO with a critic)."""
    eps_low: float = 0.2
    """Lower clip range: ratio >= 1 - eps_low for negative-advantage tokens."""
    eps_high: float = 0.2
    """Upper clip range (clip-higher when > eps_low)."""
    dual_clip: Optional[float] = None
    """Dual-clip constant c > 1 bounding the loss of negative-advantage tokens; None: off."""
    loss_agg: Literal[
        "token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"
    ] = "token-mean"
    """How token losses become the batch loss (reasonrl/algo/aggregate.py): 'token-mean' (DAPO:
    every token weighs the same), 'seq-mean-token-mean' (GRPO: per-sequence mean, then mean),
    'seq-mean-token-sum', 'seq-mean-token-sum-norm' (Dr.GRPO: sums over a constant horizon)."""
    kl_loss_coef: float = 0.0
    """Weight of the KL-to-reference loss; 0 disables the reference model."""
    kl_kind: Literal["k1", "k2", "k3", "abs"] = "k3"
    """Estimator of KL(pi || pi_ref) per sampled token, with d = log pi - log pi_ref: k1 = d,
    abs = |d|, k2 = d^2 / 2, k3 = exp(-d) + d - 1 (unbiased and >= 0; reasonrl/algo/losses.py)."""
    entropy_coef: float = 0.0
    """Weight of the entropy bonus (subtracted from the loss); 0: off."""
    gamma: float = 1.0
    """Discount of reinforce_pp and gae returns."""
    lam: float = 1.0
    """GAE lambda."""
    dynamic_sampling: bool = False
    """Drop groups whose scores are all equal and keep generating until the batch is full."""
    max_gen_batches: int = 10
    """Dynamic sampling gives up with an error once a step has drawn the prompts of this many
    full generation batches (a full batch: ceil(train.prompts_per_step * oversample) prompts, or
    train.gen_prompts_per_step); refills sized to the groups still missing draw fewer."""
    oversample: float = 1.5
    """Dynamic sampling draws ceil(missing groups * oversample) prompts per generation batch
    (unless train.gen_prompts_per_step fixes it); about 1 / (fraction of mixed groups) is best."""
    early_stop: bool = True
    """Dynamic sampling stops decoding once the batch is full and aborts unfinished groups
    (keeps groups that finish first: a slight lean toward short responses)."""
    overlong_filter: bool = False
    """Mask truncated samples out of the loss."""
    overlong_buffer: int = 0
    """Soft overlong punishment: length of the buffer before max_new_tokens; 0 disables."""
    overlong_penalty: float = 1.0
    """Penalty at the hard limit (linear ramp over the buffer)."""
    off_policy: Literal["none", "bypass", "tis", "decoupled"] = "none"
    """Correction for samples drawn by other weights than the trained ones (stale or other
    numerics): 'none' (train.old_logprobs decides the PPO anchor); 'bypass' (the anchor is the
    behaviour policy itself: the sampling log-probs, never recomputed); 'tis' (anchor recomputed
    at the start of the update, token loss times min(pi_old / mu, tis_cap)); 'decoupled'
    (decoupled PPO: clip around the recomputed proximal policy, weight pi_prox / mu, tokens
    above tis_cap masked). Formulas in reasonrl/algo/off_policy.py."""
    tis_cap: float = 2.0
    """The importance-weight cap C of algo.off_policy tis (truncation) and decoupled (masking)."""


@dataclass(frozen=True)
class TrainConfig:
    total_steps: int = 100
    """RL steps (one train batch and its update each); a resumed run may raise it."""
    prompts_per_step: int = 16
    """Train batch size in prompts (x rollout.n samples)."""
    gen_prompts_per_step: int = 0
    """Prompts per generation batch with dynamic sampling; 0: sized by algo.oversample."""
    ppo_epochs: int = 1
    """Passes over each train batch (each pass one optimizer step per mini-batch)."""
    mini_batch_size: int = 64
    """Samples per optimizer step; must divide the train batch."""
    micro_batch_size: int = 16
    """Samples per forward/backward; must divide mini_batch_size (unused when
    micro_batch_tokens is set)."""
    micro_batch_tokens: int = 0
    """Token budget per forward/backward: each mini-batch's rows sorted by length (prompt +
    response) and cut so that rows x longest row stays within it (a longer row goes alone),
    which drops most of the padding when lengths vary (verl's use_dynamic_bsz). The gradient
    is the same as with fixed micro-batches; 0: fixed micro-batches of micro_batch_size."""
    lm_head_chunk: int = 8192
    """Vocabulary columns per chunk of the LM head when log-probs and entropy are computed from
    the lean decoder's hidden states: a vocabulary wider than this never has its full
    [tokens, vocab] logits in memory (an online log-sum-exp over chunks, each chunk's logits
    computed again in backward: one more pass of the head's product). A vocabulary within it
    takes the full logits; 0: always the full logits."""
    skip_zero_advantage: bool = True
    """Skip the forward/backward of rows whose advantages are all zero (e.g. GRPO groups with
    equal rewards): their gradient is exactly zero, so the update is unchanged. Applies only
    with algo.kl_loss_coef = 0 and algo.entropy_coef = 0 (otherwise every row contributes)."""
    old_logprobs: Literal["auto", "rollout", "recompute"] = "auto"
    """Where the old-policy log-probs come from: 'rollout' reuses the sampling log-probs (one
    forward pass fewer per step; valid when the sampler holds the trainer's weights and
    numerics), 'recompute' runs the policy again; 'auto' reuses them when the generator
    shares the policy module in fp32, and recomputes otherwise."""
    precision: Literal["fp32", "bf16-mixed"] = "fp32"
    """Compute precision of policy, reference, critic and rollout: 'fp32' runs everything in
    model.dtype; 'bf16-mixed' keeps fp32 parameters, gradients and AdamW state (model.dtype must
    be float32) and runs matrix products and attention in bf16 (torch.autocast), norms,
    log-softmax and losses in fp32. Sampling then differs slightly from the trainer's numerics:
    train.old_logprobs=auto recomputes the old log-probs and the step logs the gap
    (rollout/logprob_diff_mean, rollout/logprob_diff_max, rollout/logprob_kl)."""
    grad_checkpointing: bool = False
    """Recompute each decoder layer's activations in backward instead of keeping them (policy
    and critic): the forward keeps each layer's input only, and backward holds one layer's
    activations at a time, for about one more forward pass of compute."""
    strategy: Literal["ddp", "fsdp"] = "ddp"
    """runtime.trainer_ranks > 1: 'ddp' all-reduces gradients (gloo on CPU, nccl on CUDA);
    'fsdp' shards parameters, gradients and optimizer state (FSDP2, CUDA only), with bf16
    parameters and fp32 reductions when model.dtype=bfloat16."""
    memory_check: bool = True
    """Estimate the memory a step needs before training starts (printed with the plan) and
    stop with an error naming the largest parts when it exceeds the memory available."""
    lr: float = 1e-4
    """AdamW learning rate of the policy."""
    warmup_steps: int = 0
    """Linear learning-rate warmup over this many steps, then constant; 0: none."""
    weight_decay: float = 0.0
    """AdamW weight decay of policy and critic."""
    grad_clip: float = 1.0
    """Gradients are scaled down to this global L2 norm before each optimizer step."""
    critic_lr: float = 1e-3
    """AdamW learning rate of the critic (algo.adv_estimator=gae)."""
    value_clip: float = 0.5
    """PPO value clipping: new values may move at most this far from the old ones in the clipped term."""
    value_coef: float = 1.0
    """Weight of the critic's value loss."""


@dataclass(frozen=True)
class EvalConfig:
    every_steps: int = 10
    """Validate every N steps (and before the first and after the last); 0: never."""
    n_prompts: int = 128
    """Held-out prompts evaluated at each validation during training (the first ones);
    `reasonrl eval` takes every row (--limit N: the first N of each dataset)."""
    k: int = 4
    """Samples per prompt, for mean@k (mean accuracy), pass@k and maj@k (majority vote)."""
    temperature: float = 1.0
    """Sampling temperature of the k samples."""
    top_p: float = 1.0
    """Nucleus sampling of the k samples: keep the smallest set of tokens whose probability
    reaches top_p; 1: off."""
    top_k: int = 0
    """Top-k sampling of the k samples; 0: off."""
    greedy: bool = True
    """Also report greedy accuracy (one greedy response per prompt)."""
    max_new_tokens: int = 0
    """Response length limit of evaluation samples; 0: rollout.max_new_tokens."""
    batch_prompts: int = 256
    """Prompts generated together (each with its k samples): the unit of the progress bar
    and of generation memory (lower it for large models or k). The samples drawn depend on it
    (one seeded random stream); a validation of at most this many prompts is one batch."""
    target: Optional[float] = None
    """A held-out accuracy (val/acc) to forecast the step of: after each validation (once
    there are enough to fit), the run fits ScaleRL's curve of val/acc against samples
    generated and logs the plateau, the val/acc at train.total_steps and, with a target, the
    step at which the curve reaches it (forecast/target_step), each with a 95% interval
    (docs/evaluation.md); null: no target step."""


@dataclass(frozen=True)
class CheckpointConfig:
    every_steps: int = 20
    """Save a checkpoint every N steps (and at the end); 0: by steps never."""
    every_minutes: float = 10.0
    """Also save one when this many minutes of training have passed since the last one
    (a crash loses at most about this much time); 0: by time never."""
    keep: int = 2
    """Number of committed checkpoints to keep."""
    final_retries: int = 3
    """Attempts at the final checkpoint (one second apart, doubling) before the run stops
    with an error; a periodic checkpoint that fails is an event and training goes on."""


@dataclass(frozen=True)
class ResumeConfig:
    """What a run restarted on an existing run directory may differ in."""

    allow_data_change: bool = False
    """Resume even though the training data differs from the data the checkpoint was trained
    on (its fingerprint is kept in the checkpoint); false: such a resume is refused."""


@dataclass(frozen=True)
class ResilienceConfig:
    """How the run survives faults (see docs/resilience.md)."""

    supervise: bool = True
    """Run the trainer in a child process that is restarted from the last checkpoint after a
    crash, kill or hang (``reasonrl train --no-supervisor`` runs it in-process)."""
    max_restarts: int = 5
    """Restarts before the supervisor gives up."""
    backoff_s: float = 1.0
    """Delay before the second of consecutive restarts without progress, doubled for each further
    one (capped at 30 s); the first restart, and the first after the run got further, starts at once."""
    hang_timeout_s: float = 300.0
    """A stage that runs longer than this is a hang: stacks dumped, process restarted; 0: off."""
    snapshot_every: int = 1
    """Under the supervisor, every this many steps the trainer keeps an in-memory snapshot of the
    whole resumable state (what a checkpoint holds) in ``/dev/shm``, and a restarted trainer
    resumes from it when it is newer than the last checkpoint: a crash costs the step in
    progress, not the checkpoint interval. It is no checkpoint: it dies with the machine and is
    gone when supervision ends (checkpoint.* keep their guarantees); 0: off."""
    trainer_template: bool = True
    """The supervisor starts a template process that imports torch, ``transformers`` and the
    trainer's modules once and forks every trainer from it (the first, each restart, a
    standby): a trainer then starts without those imports (about 4.5 s of CPU each on this
    project's 2-core machines), and a restart reaches its first step that much sooner. The
    template stays until supervision ends: about 350 MB resident, nearly all of it shared with
    the trainer forked from it (about 15 MB its own, with the embedded model). false,
    or where forking is not safe (not Linux; a template whose probe of torch's threads fails):
    each trainer is a fresh ``python -m reasonrl.cli`` process, as the supervisor then says."""
    standby: bool = False
    """The supervisor keeps a standby trainer ready for the next restart: started once the
    trainer has trained a step, it starts and (on the cpu device, with the local engine and one
    trainer rank) builds its roles, then waits; a restart gives it the go instead of starting a
    trainer that builds them then (``docs/benchmarks.md``, "Soak": the time each takes). Its costs: a
    second copy of the model in memory while it waits, and CPU beside the running trainer: its
    build would stall torch's spinning OpenMP threads, so the trainer's threads and the
    standby's sleep at once (``OMP_WAIT_POLICY=PASSIVE``: a DAPO step of the embedded recipe
    about 1.4x slower on an idle machine). Worth it where faults are frequent."""
    nonfinite_max_consecutive: int = 3
    """Non-finite updates skipped in a row before rolling back to the last checkpoint."""
    spike_window: int = 20
    """Rolling window (steps) of the loss / grad-norm spike detector."""
    spike_threshold: float = 10.0
    """A value above median + threshold * robust scale (1.4826 MAD) is a spike."""
    spike_min_delta: float = 0.5
    """A spike must exceed the median by at least this much (absolute), however tight the
    history: losses and gradient norms that sit near 0 are never spikes for small moves."""
    spike_min_spread: float = 0.5
    """The spread of the spike test is at least this fraction of |median|, so heavy-tailed
    but healthy series (a gradient norm 3x its median) are not spikes."""
    spike_rollback: bool = False
    """Roll back to the last checkpoint on a spike (else only an event)."""
    slow_ratio: float = 1.5
    """A stage whose recent median time exceeds ratio x its baseline median is fail-slow."""
    slow_window: int = 8
    """Baseline window (steps) of the fail-slow detector."""
    slow_min_s: float = 0.5
    """A slowdown is reported only when it costs at least this many seconds a step (recent
    minus baseline time of the stage): short stages are never fail-slow for noise."""
    reward_max_failures: int = 64
    """Consecutive failed reward calls before the run stops with an error."""
    rollout_restarts: int = 3
    """Restarts of one rollout worker in a row (dead, silent past runtime.roles.rollout.timeout_s,
    or quarantined; a call it answers starts the count again) before the fleet gives it up and
    the others serve on; the run stops with an error when none is left."""


@dataclass(frozen=True)
class EnvConfig:
    """Multi-turn environments (docs/agentic.md): with ``name`` set, every rollout is an episode."""

    name: str = ""
    """The environment: a registry name (``grid``, ``tool_arith``; ``reasonrl env-check --list``)
    or ``module:Class`` / ``path/to/file.py:Class`` (a reasonrl Env, a text ``gymnasium.Env`` or a GEM environment); with
    it set the recipe's rollouts are episodes (the first observation is the prompt, the
    episode's return the reward): the training prompts are the first observations of reset
    seeds 0 .. data.train_size-1, the held-out ones those of data.test_size seeds from 10**9
    on (never trained); empty: single-turn prompts from data.*."""
    args: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of the environment's constructor (``env.args.size=4``)."""
    max_turns: int = 4
    """Policy turns per episode; an episode still running after them is truncated."""
    max_tokens: int = 256
    """Token budget of a whole trajectory after the first observation (the policy's and the
    environment's tokens); an episode that would exceed it is truncated. Each turn samples at
    most rollout.max_new_tokens."""
    reward: Literal["final", "turn"] = "final"
    """'final': the episode's return (the sum of its rewards) is the sample's score, on its last
    token; 'turn': each turn's reward sits on that turn's last policy token (PPO and REINFORCE++
    discount them by algo.gamma) and the score is the return discounted by env.gamma per turn."""
    gamma: float = 1.0
    """env.reward=turn: per-turn discount of the score (sum over turns of gamma**turn * reward)."""
    tools: tuple[str, ...] = ()
    """Tools offered to the policy on top of the environment's own (calculator, python),
    described by OpenAI function schemas."""
    tool_call_pattern: str = "<tool_call>(.*?)</tool_call>"
    """Regular expression whose first group is a tool call's JSON
    (``{"name": ..., "arguments": {...}}``) in the policy's text."""
    tool_response_format: str = "<tool_response>{output}</tool_response>"
    """How a tool's output is shown to the policy (``{output}`` is replaced)."""


@dataclass(frozen=True)
class RoleConfig:
    """One role's workers (policy, reference, critic: one each; the policy's ranks are
    runtime.trainer_ranks)."""

    count: int = 1
    """Workers of this role."""
    threads: int = 0
    """torch threads of each worker in a process or actor of its own (rollout workers, trainer
    ranks 1..N-1, reward and environment workers); 0: the controller's count (run.threads, or
    this machine's cores) divided among the role's workers, and 1 for a reward or environment
    worker. On a small machine, split the cores."""
    cpus: float = 1.0
    """runtime.engine=ray: CPUs each worker's actor reserves."""
    gpus: float = 0.0
    """runtime.engine=ray: GPUs each worker's actor reserves (fractions share a device)."""
    colocate: str = "none"
    """The role whose bundle these workers' actors share (runtime.engine=ray); 'none': their own."""
    timeout_s: float = 600.0
    """Seconds a call to one of these workers may take before the worker counts as hung (the
    trainer ranks: a step's budget, plus runtime.collective_timeout_s)."""
    min: int = 0
    """``reasonrl scale``: the fewest workers of this role a run may be scaled to (rollout: at
    least 1 whatever this says)."""
    max: int = 0
    """``reasonrl scale``: the most workers of this role a run may be scaled to; 0: no bound."""


@dataclass(frozen=True)
class RolloutRoleConfig(RoleConfig):
    """Rollout workers: the groups of each generation batch are dispatched among them."""

    colocate: str = "auto"
    """'policy': workers on threads of the controller's process sampling from the policy's own
    module (staleness 0 only); 'none': processes (Ray actors) with weights of their own;
    'auto': policy for rollout.mode=sync with runtime.engine=local on a GPU (run.device cuda
    or mps), else none (on a CPU a process of its own decodes faster than a thread beside
    the trainer)."""
    timeout_s: float = 600.0
    """A rollout worker that does not answer a call for this long is hung: its groups go to the
    other workers within the step and it is replaced in the background (so is one that dies)."""
    quarantine_ratio: float = 5.0
    """A rollout worker whose seconds per generated token exceed this many times the median of
    the other workers', at a cost of at least resilience.slow_min_s seconds, for
    quarantine_steps steps in a row is quarantined: taken out of service and replaced (a
    rollout_worker_quarantined event); 0: never. Milder stragglers only get a smaller share of
    the groups (resilience.slow_ratio)."""
    quarantine_steps: int = 3
    """Steps in a row a rollout worker must be past quarantine_ratio before it is quarantined."""
    scale_up_idle: float = 0.0
    """Add a rollout worker (as reasonrl scale would, up to runtime.roles.rollout.max, which must
    then be set) when the trainer's idle share of the step time (timing_s/trainer_idle over
    timing_s/step), averaged over the last scale_up_steps steps, is above this; then wait
    scale_up_steps steps before the next decision. 0: off."""
    scale_up_steps: int = 5
    """The steps scale_up_idle averages over, and waits after each added worker."""


@dataclass(frozen=True)
class RewardRoleConfig(RoleConfig):
    """Reward workers: processes grading the rollout producer's samples."""

    count: int = 0
    """Reward worker processes (Ray actors with runtime.engine=ray) per pool, each sample
    bounded by timeout_s; 0: the rules dapo, boxed, gsm8k and code (bounded by construction)
    graded on the rollout producer's thread, and math_verify (which a hostile answer can keep
    busy for ever) or an import-path function (the user's code) in one worker process per pool."""
    timeout_s: float = 10.0
    """A sample whose reward takes longer is scored as failed (FAILURE_SCORE, counted in
    reward/timeouts); its worker is killed and replaced."""


@dataclass(frozen=True)
class EnvRoleConfig(RoleConfig):
    """Environment workers: processes of each rollout worker stepping its episodes (env.name)."""

    count: int = 2
    """Environment worker processes per rollout worker, each reset and step bounded by
    timeout_s; 0: a shipped environment (bounded by construction) stepped in the rollout
    worker, an import-path environment (the user's code) in one worker process."""
    timeout_s: float = 10.0
    """A reset or step that takes longer ends its episode as failed; the worker is replaced."""


@dataclass(frozen=True)
class RolesConfig:
    """``runtime.roles.<role>``: every role's count, threads, resources and call timeout."""

    policy: RoleConfig = field(default_factory=RoleConfig)
    """The policy (trainer rank 0 and its ranks)."""
    reference: RoleConfig = field(default_factory=RoleConfig)
    """The reference model (algo.kl_loss_coef > 0)."""
    critic: RoleConfig = field(default_factory=RoleConfig)
    """The critic (algo.adv_estimator=gae)."""
    rollout: RolloutRoleConfig = field(default_factory=RolloutRoleConfig)
    """The rollout workers."""
    reward: RewardRoleConfig = field(default_factory=RewardRoleConfig)
    """The reward workers."""
    env: EnvRoleConfig = field(default_factory=EnvRoleConfig)
    """The environment workers."""


@dataclass(frozen=True)
class RuntimeConfig:
    """Where the workers run: this machine's processes, or Ray actors (docs/ray.md)."""

    engine: Literal["local", "ray"] = "local"
    """'local': workers in this process or in processes of their own; 'ray': the same worker
    classes as Ray actors (needs the ray extra)."""
    ray_address: str = ""
    """engine=ray: the cluster to join (also the RAY_ADDRESS variable); empty: start a local one
    with this machine's CPUs, listening on loopback only, dashboard off."""
    ray_join_timeout_s: float = 30.0
    """engine=ray with a ray_address: seconds the cluster has to answer (a running head answers
    in a few); one that does not is an input error, exit 2 at once, never restarted."""
    roles: RolesConfig = field(default_factory=RolesConfig)
    """Where each role runs, how many workers, threads, resources and call timeouts
    (``runtime.roles.<role>.*``; ``reasonrl train --dry-run`` prints the plan)."""
    trainer_ranks: int = 1
    """Data-parallel trainer ranks (torch.distributed, gloo on CPU, nccl on GPU): each trains
    on its share of the batch, normalised by global token counts; N ranks compute the
    single-rank update."""
    collective_timeout_s: float = 120.0
    """A collective that a rank has not entered this long after the first rank did is a hang:
    the stuck rank is named (a ``hang`` event) and the job restarts from the last checkpoint."""
    trace_collectives: bool = True
    """Record every collective and weight broadcast per rank (op, sequence, bytes, enter and
    exit times) in RUN_DIR/trace/ (``reasonrl trace RUN_DIR``)."""


@dataclass(frozen=True)
class Config:
    """A run's whole config: one typed, documented attribute per section (``cfg.train.lr``).

    ``Config.load("dapo", ["train.lr=3e-4"])`` reads a recipe file or packaged recipe name plus
    dotted overrides, with the checks and messages of ``reasonrl train``
    (:func:`reasonrl.config.loader.load_recipe`, which sets ``load`` on this class: the schema
    does not import the loader)."""

    load: ClassVar[Callable[..., Config]]
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
    resume: ResumeConfig = field(default_factory=ResumeConfig)
    resilience: ResilienceConfig = field(default_factory=ResilienceConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    faults: tuple[str, ...] = ()
    """Injected faults ``kind@step[:key=value...]`` for drills (reasonrl/resilience/faults.py)."""


class ConfigError(InputError):
    """A recipe, override or value that no run can use. The message names the source (the
    file and line, or "command line"), the dotted key, the bad value and what is allowed."""

    def __init__(self, message: str, key: str | None = None):
        super().__init__(message)
        self.key = key
        """The dotted key at fault, when there is one."""
