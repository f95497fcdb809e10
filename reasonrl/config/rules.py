"""``validate``: the single-key ranges and the rules that tie several keys of a Config together.
What a ``rollout.backend`` can do is read from one table, :data:`reasonrl.config.capabilities.BACKENDS`."""

from __future__ import annotations

import functools
import math
import re
from dataclasses import fields, is_dataclass
from typing import Any, Callable, Iterator

from reasonrl.config.capabilities import can, cannot
from reasonrl.config.faults import RANK_FAULTS, STAGES, parse_specs
from reasonrl.config.schema import DIFFICULTY_LEVELS, Config, ConfigError
from reasonrl.errors import InputError
from reasonrl.plugins import is_plugin_spec


def validate(cfg: Config) -> None:
    """Raise ConfigError on the first value no run can use: the ranges in ``_RANGES``, then
    the rules that tie several keys together."""
    r, a, t, s = cfg.rollout, cfg.algo, cfg.train, cfg.sft
    for key, value in _leaves(cfg, ""):
        if isinstance(value, float):
            _require(math.isfinite(value), key, value, "must be a finite number")
    for key, (ok, allowed) in _RANGES.items():
        value = functools.reduce(getattr, key.split("."), cfg)
        _require(ok(value), key, value, f"must be {allowed}")
    batch = t.prompts_per_step * r.n
    _require(batch % t.mini_batch_size == 0, "train.mini_batch_size", t.mini_batch_size,
             f"must divide the train batch train.prompts_per_step * rollout.n = {t.prompts_per_step} * {r.n} = {batch}")
    _require(t.micro_batch_tokens > 0 or t.mini_batch_size % t.micro_batch_size == 0, "train.micro_batch_size", t.micro_batch_size,
             f"must divide train.mini_batch_size = {t.mini_batch_size}")
    _require(t.gen_prompts_per_step == 0 or t.gen_prompts_per_step >= t.prompts_per_step,
             "train.gen_prompts_per_step", t.gen_prompts_per_step,
             f"must be 0 or >= train.prompts_per_step = {t.prompts_per_step}")
    _require(a.eps_high >= a.eps_low, "algo.eps_high", a.eps_high,
             f"clip-higher needs eps_high >= eps_low (algo.eps_low = {a.eps_low})")
    _require(a.overlong_buffer < r.max_new_tokens, "algo.overlong_buffer", a.overlong_buffer,
             f"the overlong buffer must be shorter than the max response (rollout.max_new_tokens = {r.max_new_tokens})")
    _require(r.n >= 2 or a.adv_estimator not in _GROUP_RELATIVE, "rollout.n", r.n,
             f"group-relative estimators need at least 2 samples per prompt (algo.adv_estimator = {a.adv_estimator!r})")
    _require(r.mode != "sync" or r.max_staleness == 0, "rollout.max_staleness", r.max_staleness,
             "synchronous rollouts are never stale; set rollout.mode=async or lockstep to generate ahead")
    _require(r.max_staleness == 0 or a.off_policy != "none", "rollout.max_staleness", r.max_staleness,
             "training on samples from older weights without a correction collapses (AReaL: AIME24 42.0 -> 23.3 "
             "at staleness 4); set algo.off_policy to bypass, tis or decoupled")
    _require(not r.interrupt or r.mode == "async", "rollout.interrupt", r.interrupt,
             f"partial rollouts need rollout.mode=async (rollout.mode = {r.mode!r})")
    _require(not r.interrupt or can(r.backend, "interrupts"), "rollout.backend", r.backend,
             cannot("interrupts", f"rollout.interrupt = {r.interrupt!r}"))
    _require(a.off_policy != "bypass" or t.old_logprobs != "recompute", "train.old_logprobs", t.old_logprobs,
             "algo.off_policy=bypass takes the sampling log-probs as the anchor; recompute contradicts it")
    _require(a.off_policy not in ("tis", "decoupled") or t.old_logprobs != "rollout", "train.old_logprobs",
             t.old_logprobs, f"algo.off_policy={a.off_policy} recomputes the anchor at the start of the update")
    _require(t.precision != "bf16-mixed" or cfg.model.dtype == "float32", "model.dtype", cfg.model.dtype,
             "train.precision=bf16-mixed keeps the parameters in float32 (bf16 products); set model.dtype=float32, "
             "or train.precision=fp32 for pure low-precision parameters")
    if tuple(cfg.reward.range) != (-1.0, 1.0):
        custom = [spec for spec in _reward_specs(cfg) if spec not in BOUNDED_REWARDS + UNBOUNDED_REWARDS]
        _require(not custom, "reward.range", list(cfg.reward.range),
                 f"rescales the built-in functions' -1..+1 scores; the function {custom[0] if custom else ''!r} "
                 "returns its own scores, so give it the range you want and leave reward.range at [-1, 1]")
        _require(not cfg.env.name, "reward.range", list(cfg.reward.range),
                 f"an environment's episodes are scored by their return (env.name = {cfg.env.name!r}), not by "
                 "reward.fn; leave reward.range at [-1, 1]")
    e = cfg.env
    if e.name:
        _require(can(r.backend, "continues"), "rollout.backend", r.backend, cannot("continues", f"env.name = {e.name!r}"))
        _require(not r.interrupt, "rollout.interrupt", r.interrupt,
                 f"an episode (env.name = {e.name!r}) is not interrupted by new weights; set rollout.interrupt=false")
    _require(_compiles(e.tool_call_pattern) and re.compile(e.tool_call_pattern).groups >= 1,
             "env.tool_call_pattern", e.tool_call_pattern, "must be a regular expression with a group that holds the call's JSON")
    _require("{output}" in e.tool_response_format, "env.tool_response_format", e.tool_response_format,
             "must contain {output}, where the tool's output goes")
    _require(t.strategy != "fsdp" or cfg.run.device.startswith("cuda"), "train.strategy", t.strategy,
             f"FSDP shards over GPUs (nccl); on run.device = {cfg.run.device!r} use train.strategy=ddp")
    _require(cfg.model.lora.rank == 0 or t.strategy != "fsdp", "model.lora.rank", cfg.model.lora.rank,
             "LoRA adapters train with train.strategy=ddp (or one rank); FSDP sharding of adapters is not supported")
    _check_roles(cfg)
    _check_data(cfg)
    _check_faults(cfg)
    _require(s.hidden_size % s.heads == 0, "sft.heads", s.heads, f"must divide sft.hidden_size = {s.hidden_size}")
    _require(s.heads % s.kv_heads == 0, "sft.kv_heads", s.kv_heads, f"must divide sft.heads = {s.heads}")


_ROLE_NAMES = ("policy", "reference", "critic", "rollout", "reward", "env")


def ships_bf16_versions(cfg: Config) -> bool:
    """Whether rollout weights ship as exact bf16 versions, as deltas against the last one
    (reasonrl/rollout/weight_sync.py): the rollout side samples with bf16 weights
    (``model.dtype=bfloat16``, or ``train.precision=bf16-mixed``)."""
    return cfg.model.dtype == "bfloat16" or cfg.train.precision == "bf16-mixed"


def validation_backend(cfg: Config) -> str:
    """The backend of the trainer's validation, a rollout worker over the policy's own module
    (the current weights): ``fast`` with rollout.backend=fast, else ``hf`` (transformers), so a
    vllm run starts no second engine and a sim run validates the real model."""
    return "fast" if cfg.rollout.backend == "fast" else "hf"


def rollout_shares_policy(cfg: Config) -> bool:
    """Whether the rollout workers sample from the policy's own module (threads of the
    controller's process): ``runtime.roles.rollout.colocate=policy``, or ``auto`` with
    rollout.mode=sync, runtime.engine=local, a whole (not FSDP-sharded) module and an
    accelerator (run.device cuda or mps), where a second copy of the weights costs device
    memory. On a CPU ``auto`` gives the workers processes of their own: a decode loop on a
    thread of the trainer's process measured 10-30% slower end to end (docs/benchmarks.md,
    the rollout fleet), and a copy of a small model costs little."""
    colocate = cfg.runtime.roles.rollout.colocate
    accelerator = cfg.run.device.startswith(("cuda", "mps"))
    return colocate == "policy" or (colocate == "auto" and cfg.rollout.mode == "sync" and cfg.runtime.engine == "local"
                                    and cfg.train.strategy != "fsdp" and accelerator)


BOUNDED_REWARDS = ("dapo", "boxed", "gsm8k", "code")
"""The reward functions whose every call ends in bounded time by construction: the string
rules (linear in an answer they cap at MAX_ANSWER_CHARS) and ``code`` (each program runs in
the sandbox under reward.code_timeout_s)."""

UNBOUNDED_REWARDS = ("math_verify",)
"""The built-in reward functions a hostile answer can keep busy for ever: ``math_verify``
(SymPy evaluates a power tower for minutes, holding the interpreter's lock). Only a process
killed at its deadline bounds a call in every thread and runtime, so these, and every
import-path function (the user's own code), get one even at ``runtime.roles.reward.count=0``."""


def unbounded_rewards(cfg: Config) -> list[str]:
    """The functions of reward.fn and reward.by_source (``'SOURCE=FN'`` entries) that are not
    :data:`BOUNDED_REWARDS`: :data:`UNBOUNDED_REWARDS` and import paths; none for an env run
    (its episodes are graded by their return)."""
    if cfg.env.name:
        return []
    return list(dict.fromkeys(s for s in _reward_specs(cfg) if s not in BOUNDED_REWARDS))


def _reward_specs(cfg: Config) -> list[str]:
    """reward.fn and the functions of reward.by_source (``'SOURCE=FN'`` entries)."""
    return [cfg.reward.fn, *(entry.rpartition("=")[2].strip() for entry in cfg.reward.by_source)]


def reward_workers(cfg: Config) -> int:
    """Reward worker processes per pool: ``runtime.roles.reward.count``; where that is 0, one
    when some function is unbounded (:func:`unbounded_rewards`: every call of it then has
    ``runtime.roles.reward.timeout_s``), else 0 (graded in the caller's thread: the rules
    of :data:`BOUNDED_REWARDS` end in bounded time by construction)."""
    count = cfg.runtime.roles.reward.count
    return count or (1 if unbounded_rewards(cfg) else 0)


def env_workers(cfg: Config) -> int:
    """Environment worker processes per rollout worker: ``runtime.roles.env.count``; where that
    is 0, one for an import-path environment (the user's code: every reset and step then has
    ``runtime.roles.env.timeout_s``), else 0 (a shipped environment, bounded by construction,
    stepped in the rollout worker)."""
    count = cfg.runtime.roles.env.count
    return count or (1 if cfg.env.name and is_plugin_spec(cfg.env.name) else 0)


def _check_roles(cfg: Config) -> None:
    """``runtime.roles.<role>``: counts, threads, resources, timeouts and colocation."""
    roles = cfg.runtime.roles
    for name in _ROLE_NAMES:
        spec, key = getattr(roles, name), f"runtime.roles.{name}"
        least = {"rollout": 1, "reward": 0, "env": 0}.get(name)
        if least is None:
            hint = "the policy's ranks are runtime.trainer_ranks" if name == "policy" else f"a run has one {name}"
            _require(spec.count == 1, f"{key}.count", spec.count, f"must be 1 ({hint})")
        else:
            _require(spec.count >= least, f"{key}.count", spec.count, f"must be >= {least}")
        _require(spec.threads >= 0, f"{key}.threads", spec.threads, "must be >= 0 (0: the controller's count)")
        _require(spec.cpus > 0, f"{key}.cpus", spec.cpus, "must be > 0")
        _require(spec.gpus >= 0, f"{key}.gpus", spec.gpus, "must be >= 0")
        _require(spec.timeout_s > 0, f"{key}.timeout_s", spec.timeout_s, "must be > 0")
        _require(spec.min >= 0, f"{key}.min", spec.min, "must be >= 0")
        _require(spec.max == 0 or spec.max >= max(spec.min, 1), f"{key}.max", spec.max,
                 f"must be 0 (no bound) or >= {key}.min and >= 1")
        if name == "rollout" and spec.scale_up_idle:
            _require(spec.max > 0, f"{key}.max", spec.max, f"must be set (> 0) when {key}.scale_up_idle adds workers")
        if least is not None:
            _require(spec.count >= spec.min and (spec.max == 0 or spec.count <= spec.max), f"{key}.count", spec.count,
                     f"must be within {key}.min={spec.min} and {key}.max={spec.max or 'unbounded'}")
        allowed = ("auto", "policy", "none") if name == "rollout" else ("none", *(r for r in _ROLE_NAMES if r != name))
        _require(spec.colocate in allowed, f"{key}.colocate", spec.colocate,
                 "must be one of " + ", ".join(repr(a) for a in allowed))


def _check_data(cfg: Config) -> None:
    """``data.difficulty`` (embedded families and their levels) and the adaptive mix over the
    embedded families (at least two, a floor they can all have); a dataset's sources are
    known only once it is read (reasonrl/data/pool.py checks them then)."""
    d = cfg.data
    embedded = d.source == "embedded" and not cfg.env.name
    for family, level in d.difficulty.items():
        key, entry = "data.difficulty", f"data.difficulty.{family}"
        _require(embedded, key, level, "difficulty levels are the embedded task's (data.source=embedded)", entry)
        _require(family in d.families, key, level, f"{family!r} is not one of data.families {list(d.families)}", entry)
        _require(level in DIFFICULTY_LEVELS, key, level, "must be one of " + ", ".join(DIFFICULTY_LEVELS), entry)
    if d.mix in ("adaptive", "static") and embedded:
        sources = len(set(d.families))
        _require(sources >= 2, "data.mix", d.mix, f"mixes data sources, and data.families {list(d.families)} is one")
        if d.mix == "adaptive":
            _require(d.mix_floor <= 1 / sources, "data.mix_floor", d.mix_floor,
                     f"must be in [0, 1/{sources}] for the {sources} families of data.families (each gets at least "
                     "the floor)")
    _require(d.mix == "static" or not d.mix_weights, "data.mix_weights", d.mix_weights,
             f"fixed weights are read with data.mix=static (data.mix = {d.mix!r})")
    if d.mix == "static":
        weights = d.mix_weights
        _require(bool(weights), "data.mix", d.mix, "draws with the fixed weights of data.mix_weights, which names "
                 "none: give every data source one ({source: weight}, summing to 1)")
        _require(all(type(w) in (int, float) and w >= 0 for w in weights.values()), "data.mix_weights", weights,
                 "every weight must be a number >= 0")
        _require(abs(sum(weights.values()) - 1.0) <= 1e-6, "data.mix_weights", weights,
                 f"the weights must sum to 1 (they sum to {sum(weights.values()):g})")
        if embedded:
            named = sorted(f"embedded/{f}" for f in set(d.families))
            _require(sorted(weights) == named, "data.mix_weights", weights,
                     f"must name exactly the data sources of data.families: {', '.join(named)}")


def _check_faults(cfg: Config) -> None:
    """``faults``: every spec parses (:mod:`reasonrl.config.faults`), and every fault can fire
    in this run: at a step the run reaches (train.total_steps), at a stage a step has (a slow
    fault: generation), on a trainer rank it has (runtime.trainer_ranks), and a hang with a
    watchdog to end it (resilience.hang_timeout_s)."""
    try:
        faults = parse_specs(list(cfg.faults))
    except InputError as err:
        raise ConfigError(str(err), "faults") from None
    last, ranks = cfg.train.total_steps, cfg.runtime.trainer_ranks
    for fault in faults:
        _require(fault.step <= last, "faults", fault.spec,
                 f"scheduled at step {fault.step}, past the last step (train.total_steps = {last}): it would never fire")
        if fault.kind in ("crash", "sigkill", "hang") and fault.get("stage") is not None:
            _require(fault.get("stage") in STAGES, "faults", fault.spec,
                     f"{fault.get('stage')!r} is not a stage of a step; the stages: {', '.join(STAGES)}")
        if fault.kind == "slow":
            _require(fault.get("stage") == "gen", "faults", fault.spec,
                     "a slow fault slows a rollout worker's generation: stage=gen (the default)")
        if fault.kind in RANK_FAULTS:
            _require(fault.get("rank") < ranks, "faults", fault.spec,
                     f"names trainer rank {fault.get('rank')}; runtime.trainer_ranks = {ranks} has ranks 0..{ranks - 1}")
        if fault.kind == "hang":
            _require(cfg.resilience.hang_timeout_s > 0, "faults", fault.spec,
                     "an injected hang sleeps until the hang watchdog ends it, and resilience.hang_timeout_s = 0 "
                     "turns the watchdog off; set resilience.hang_timeout_s > 0")


def _compiles(pattern: str) -> bool:
    try:
        re.compile(pattern)
    except re.error:
        return False
    return True


def _leaves(node: Any, prefix: str) -> Iterator[tuple[str, Any]]:
    """(dotted key, value) of every leaf field under a config node, in declaration order."""
    for f in fields(node):
        value = getattr(node, f.name)
        if is_dataclass(value):
            yield from _leaves(value, f"{prefix}{f.name}.")
        else:
            yield prefix + f.name, value


# --- validation rules ---------------------------------------------------------------

_POSITIVE = (lambda v: v > 0, "> 0")
_NON_NEGATIVE = (lambda v: v >= 0, ">= 0")
_AT_LEAST_1 = (lambda v: v >= 1, ">= 1")
_UNIT = (lambda v: 0 <= v <= 1, "in [0, 1]")
_DEVICE = re.compile(r"cpu|cuda(:[0-9]+)?|mps")
_GROUP_RELATIVE = ("grpo", "rloo", "dr_grpo", "lite_ppo")

_RANGES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "run.threads": _NON_NEGATIVE,
    "model.lora.rank": _NON_NEGATIVE,
    "model.lora.alpha": _POSITIVE,
    "model.lora.dropout": (lambda v: 0 <= v < 1, "in [0, 1)"),
    "model.lora.target_modules": (lambda v: len(v) > 0 and all(isinstance(n, str) and n.strip() for n in v),
                                  "a non-empty list of module names (e.g. [q_proj, v_proj])"),
    "run.log_every": _NON_NEGATIVE,
    "run.log_samples": _NON_NEGATIVE,
    "run.device": (lambda v: _DEVICE.fullmatch(v) is not None, "cpu, cuda, cuda:N or mps"),
    "data.families": (lambda v: len(v) > 0, "a non-empty list"),
    "data.train_size": _AT_LEAST_1,
    "data.test_size": _AT_LEAST_1,
    "data.max_prompt_len": _AT_LEAST_1,
    "data.mix_target": (lambda v: 0 < v <= 1, "in (0, 1]"),
    "data.mix_floor": (lambda v: 0 <= v < 1, "in [0, 1/S] for S data sources"),
    "data.mix_rate": (lambda v: 0 < v <= 1, "in (0, 1]"),
    "data.mix_ema": (lambda v: 0 <= v < 1, "in [0, 1)"),
    "data.curriculum_window": _NON_NEGATIVE,
    "data.curriculum_revisit": _AT_LEAST_1,
    "sft.hidden_size": _AT_LEAST_1,
    "sft.layers": _AT_LEAST_1,
    "sft.heads": _AT_LEAST_1,
    "sft.kv_heads": _AT_LEAST_1,
    "sft.intermediate_size": _AT_LEAST_1,
    "sft.lr": _POSITIVE,
    "sft.batch_size": _AT_LEAST_1,
    "sft.max_steps": _AT_LEAST_1,
    "sft.eval_every": _AT_LEAST_1,
    "sft.eval_size": _AT_LEAST_1,
    "sft.target_acc": (lambda v: 0 < v <= 1, "in (0, 1]"),
    "rollout.n": _AT_LEAST_1,
    "rollout.temperature": _POSITIVE,
    "rollout.top_p": (lambda v: 0 < v <= 1, "in (0, 1]"),
    "rollout.top_k": _NON_NEGATIVE,
    "rollout.max_new_tokens": _AT_LEAST_1,
    "rollout.vllm_gpu_memory_utilization": (lambda v: 0 < v <= 1, "in (0, 1]"),
    "rollout.vllm_max_model_len": (lambda v: v is None or v >= 2, "null or >= 2"),
    "rollout.max_staleness": _NON_NEGATIVE,
    "rollout.sim_seconds_per_token": _NON_NEGATIVE,
    "rollout.sim_time_scale": _POSITIVE,
    "algo.eps_low": (lambda v: 0 <= v < 1, "in [0, 1)"),
    "algo.eps_high": _NON_NEGATIVE,
    "algo.dual_clip": (lambda v: v is None or v > 1, "null or > 1"),
    "algo.kl_loss_coef": _NON_NEGATIVE,
    "algo.entropy_coef": _NON_NEGATIVE,
    "algo.gamma": _UNIT,
    "algo.lam": _UNIT,
    "algo.max_gen_batches": _AT_LEAST_1,
    "algo.oversample": (lambda v: v >= 1, ">= 1"),
    "algo.overlong_buffer": _NON_NEGATIVE,
    "algo.overlong_penalty": _NON_NEGATIVE,
    "algo.tis_cap": (lambda v: v >= 1, ">= 1"),
    "train.total_steps": _AT_LEAST_1,
    "train.prompts_per_step": _AT_LEAST_1,
    "train.ppo_epochs": _AT_LEAST_1,
    "train.mini_batch_size": _AT_LEAST_1,
    "train.micro_batch_size": _AT_LEAST_1,
    "train.micro_batch_tokens": _NON_NEGATIVE,
    "train.lm_head_chunk": _NON_NEGATIVE,
    "train.lr": _POSITIVE,
    "train.warmup_steps": _NON_NEGATIVE,
    "train.weight_decay": _NON_NEGATIVE,
    "train.grad_clip": _POSITIVE,
    "train.critic_lr": _POSITIVE,
    "train.value_clip": _POSITIVE,
    "train.value_coef": _NON_NEGATIVE,
    "eval.every_steps": _NON_NEGATIVE,
    "eval.n_prompts": _AT_LEAST_1,
    "eval.k": (lambda v: 1 <= v <= 64, "in [1, 64]"),
    "eval.temperature": _POSITIVE,
    "eval.top_p": (lambda v: 0 < v <= 1, "in (0, 1]"),
    "eval.top_k": _NON_NEGATIVE,
    "eval.max_new_tokens": _NON_NEGATIVE,
    "eval.batch_prompts": _AT_LEAST_1,
    "eval.target": (lambda v: v is None or 0 < v <= 1, "null or in (0, 1]"),
    "checkpoint.every_steps": _NON_NEGATIVE,
    "checkpoint.every_minutes": _NON_NEGATIVE,
    "checkpoint.keep": _AT_LEAST_1,
    "checkpoint.final_retries": _AT_LEAST_1,
    "resilience.max_restarts": _NON_NEGATIVE,
    "resilience.backoff_s": _NON_NEGATIVE,
    "resilience.hang_timeout_s": _NON_NEGATIVE,
    "resilience.snapshot_every": _NON_NEGATIVE,
    "resilience.nonfinite_max_consecutive": _AT_LEAST_1,
    "resilience.spike_window": (lambda v: v >= 5, ">= 5 (the detector needs 5 values of history)"),
    "resilience.spike_threshold": _POSITIVE,
    "resilience.spike_min_delta": _NON_NEGATIVE,
    "resilience.spike_min_spread": _NON_NEGATIVE,
    "resilience.slow_ratio": (lambda v: v > 1, "> 1"),
    "resilience.slow_window": (lambda v: v >= 4, ">= 4 (the detector compares medians of 4 recent steps)"),
    "resilience.slow_min_s": _NON_NEGATIVE,
    "resilience.reward_max_failures": _AT_LEAST_1,
    "resilience.rollout_restarts": _NON_NEGATIVE,
    "rollout.group_retries": _NON_NEGATIVE,
    "runtime.roles.rollout.quarantine_ratio": (lambda v: v == 0 or v > 1, "0 (off) or > 1"),
    "runtime.roles.rollout.quarantine_steps": _AT_LEAST_1,
    "runtime.roles.rollout.scale_up_idle": (lambda v: 0 <= v < 1, "in [0, 1) (a share of the step time; 0: off)"),
    "runtime.roles.rollout.scale_up_steps": _AT_LEAST_1,
    "env.max_turns": _AT_LEAST_1,
    "env.max_tokens": _AT_LEAST_1,
    "env.gamma": _UNIT,
    "runtime.trainer_ranks": _AT_LEAST_1,
    "runtime.collective_timeout_s": _POSITIVE,
    "runtime.ray_join_timeout_s": _POSITIVE,
    "reward.range": (lambda v: len(v) == 2 and all(math.isfinite(x) for x in v) and v[0] < v[1],
                     "[wrong, right], two finite numbers with wrong < right ([-1, 1], the default; [0, 1] for "
                     "{0, 1} rewards)"),
}
"""Single-key rules: dotted key -> (predicate, what is allowed). Checked in this order,
before the cross-key rules in ``validate`` (which may then divide by the sizes)."""


def _require(ok: bool, key: str, value: Any, why: str, entry: str = "") -> None:
    """ConfigError ``key = value: why`` unless ``ok``; ``entry`` names the entry of a mapping
    field ``key`` instead (``data.difficulty.mul``), the error still ``key``'s."""
    if not ok:
        raise ConfigError(f"{entry or key} = {value!r}: {why}", key)
