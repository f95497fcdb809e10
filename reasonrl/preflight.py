"""The checks a run passes before anything heavy starts, and what it would run.

    plan = preflight(cfg)       # InputError / RunDirError naming the key, file or row at fault
    print(plan.describe())      # what ``reasonrl train --dry-run`` prints

``reasonrl train`` runs these checks first, so a bad data path, reward name or model directory
fails in a second, never after a model has loaded or a warm start has trained; ``--dry-run``
runs only them. In order:

1. the run directory: usable (nothing is created), and what it holds: nothing yet, a run to
   resume from its newest valid checkpoint, or a complete run;
2. the data paths exist and the extras the settings need are installed (ray for
   runtime.engine=ray, vllm for rollout.backend=vllm; checked before torch is imported), then
   parse into the training and held-out splits (the plan says how the held-out one was made;
   with env.name, the initial states, each reset in a worker process killed at
   runtime.roles.env.timeout_s and its observation at most MAX_OBSERVATION_CHARS long);
3. the reward functions resolve (``reward.fn``, ``reward.by_source``, ``reward.format``; an
   import path in a process of its own, killed at IMPORT_TIMEOUT_S) and grade sample rows
   (:func:`check_reward_rows`: the user's code in a worker process, each sample bounded by
   ``runtime.roles.reward.timeout_s``), and the packages of ``run.loggers`` import;
4. the model: ``model.path`` is a Hugging Face model directory with a tokenizer, or the
   embedded warm start (cached, or trained first);
5. ``run.device`` is usable with this torch build, ``peft`` is installed when ``model.lora.rank > 0``, and the tokenizer of a model directory reloads
   as ``final/`` will be reloaded (plain AutoTokenizer of the saved tokenizer tokenises as training
   does; :func:`~reasonrl.checkpoint.export.check_tokenizer_exports`);
6. the context: every prompt (in tokens, chat template applied once) fits data.max_prompt_len
   and, plus ``rollout.max_new_tokens``, the model's ``max_position_embeddings``, or is cut or
   dropped by ``data.truncation`` (:func:`~reasonrl.data.splits.tokenize_prompts`, which the
   trainer runs too; the plan counts what it cut or dropped); a resume's training prompts are
   those its checkpoint was trained on, unless ``resume.allow_data_change``; with ``data.mix=adaptive``, the
   training prompts have at least two data sources and ``data.mix_floor`` fits their number;
7. memory: the peak a step needs for this model and batch (:func:`~reasonrl.memory.estimate_memory`,
   from the model's config.json alone) against the memory available (LimitError when it does
   not fit and ``train.memory_check`` is on).

Nothing here loads weights or writes to the run directory.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from reasonrl.config import RESUME_MAY_CHANGE, Config, config_hash, flatten, load, to_dict
from reasonrl.errors import InputError, ResumeError, RunDirError

if TYPE_CHECKING:
    from reasonrl.runtime.topology import Topology

@dataclass(frozen=True)
class RunState:
    """What the run directory holds."""

    kind: str
    """'new' (nothing to resume), 'resume' (a checkpoint below train.total_steps) or 'complete'."""
    step: int = 0
    """The step of the newest valid checkpoint (0 when new)."""
    checkpoint: Path | None = None


@dataclass(frozen=True)
class Plan:
    """What ``reasonrl train`` would run, from the checks of :func:`preflight`."""

    cfg: Config
    state: RunState
    train_prompts: int
    test_prompts: int
    model: str
    """The model directory, or how the embedded warm start will be found."""
    longest_prompt: int
    """Tokens of the longest training or held-out prompt."""
    context: int
    """The model's max_position_embeddings."""
    reward: str = ""
    """The reward functions, by data source, and the format reward."""
    data: str = ""
    """The data sources, the split sizes and how the held-out split was made (``Splits.description``)."""
    prompts_cut: str = ""
    """What data.truncation cut or dropped, per split ('' when nothing)."""
    memory: str = ""
    """The memory estimate of a step (``MemoryEstimate.describe``)."""
    topology: Topology | None = None
    """Where each role runs (:func:`reasonrl.runtime.topology.plan`)."""

    def starting(self, openmp_waits: str) -> str:
        """What a run prints as it starts: the memory estimate, how torch's OpenMP threads wait
        (:func:`~reasonrl.runtime.threads.openmp_waits`) and where each role runs."""
        return "\n".join([f"memory: {self.memory}", f"openmp: threads wait {openmp_waits}", "roles:",
                          *(f"  {line}" for line in self.topology.lines())])

    def describe(self) -> str:
        """A few lines for the console."""
        c = self.cfg
        a, r, t = c.algo, c.rollout, c.train
        run = {"new": "a new run", "resume": f"resume from step {self.state.step} ({self.state.checkpoint})",
               "complete": f"already complete at step {self.state.step}: nothing to train"}[self.state.kind]
        lines = [
            f"run.dir      {c.run.dir}: {run}",
            f"algorithm    {a.adv_estimator}, loss {a.loss_agg}, clip [{a.eps_low}, {a.eps_high}]"
            + (", dynamic sampling" if a.dynamic_sampling else "")
            + (f", KL {a.kl_loss_coef} ({a.kl_kind})" if a.kl_loss_coef else ""),
            f"steps        {t.total_steps} x {t.prompts_per_step} prompts x {r.n} samples, lr {t.lr}, "
            f"rollout {r.mode} on {r.backend}",
            f"data         {self.data}",
            f"reward       {self.reward or c.reward.fn}",
            f"model        {self.model} on {c.run.device} ({c.model.dtype}, train.precision {t.precision}"
            + (", gradient checkpointing" if t.grad_checkpointing else "")
            + (f", LoRA rank {c.model.lora.rank} alpha {c.model.lora.alpha:g} on {', '.join(c.model.lora.target_modules)}"
               if c.model.lora.rank > 0 else "") + ")",
            f"context      longest prompt {self.longest_prompt} + rollout.max_new_tokens {r.max_new_tokens} "
            f"<= {self.context} tokens" + (f"; {self.prompts_cut}" if self.prompts_cut else ""),
            f"memory       {self.memory}",
        ]
        if self.topology is not None:
            lines += ["roles", *(f"  {line}" for line in self.topology.lines())]
        return "\n".join(lines)


def preflight(cfg: Config) -> Plan:
    """Check ``cfg`` in the order of the module docstring; the Plan of what would run."""
    state = run_state(cfg)
    if state.kind != "new":
        check_resumable(cfg)
    check_data_files(cfg)
    check_extras(cfg)
    from reasonrl.runtime.topology import plan as plan_roles

    topology = plan_roles(cfg)
    from reasonrl.env.splits import run_splits
    from reasonrl.runtime.topology import reset_start

    splits = run_splits(cfg, reset_start(cfg))
    train, test = splits.train, splits.test
    reward = reward_line(cfg, train + test)
    from reasonrl.loggers import check_loggers

    check_loggers(cfg.run.loggers)
    model_dir, model = _model_dir(cfg)
    from reasonrl.models.loading import check_device

    check_device(cfg.run.device)
    _check_lora(cfg)
    tokenizer, context = _tokenizer_and_context(model_dir)
    if model_dir is not None and cfg.model.path != "embedded":
        from reasonrl.checkpoint.export import check_tokenizer_exports

        check_tokenizer_exports(model_dir, tokenizer)
    from reasonrl.data.splits import tokenize_prompts

    train_tokens = tokenize_prompts(train, tokenizer, cfg, context, splits.train_from)
    test_tokens = tokenize_prompts(test, tokenizer, cfg, context, splits.test_from, held_out=True)
    if state.kind == "resume":
        check_resumed_data(cfg, state.checkpoint, train_tokens.prompts)
    if cfg.data.mix == "adaptive":
        from reasonrl.data.mixing import check_sources

        check_sources([p.data_source for p in train_tokens.prompts], cfg.data.mix_floor)
    longest = max(train_tokens.longest, test_tokens.longest)
    cut = "; ".join(filter(None, (train_tokens.note(splits.train_from), test_tokens.note(splits.test_from))))
    from reasonrl.memory import check_fits, estimate_memory

    estimate = estimate_memory(cfg, _model_shape(cfg, model_dir, len(tokenizer)), longest)
    check_fits(cfg, estimate)
    return Plan(cfg, state, len(train_tokens.prompts), len(test_tokens.prompts), model, longest, context, reward,
                splits.description, cut, estimate.describe(), topology)


def _check_lora(cfg: Config) -> None:
    """InputError naming model.lora.rank when LoRA is on and the peft package is missing."""
    import importlib.util

    if cfg.model.lora.rank > 0 and importlib.util.find_spec("peft") is None:
        raise InputError(f"model.lora.rank = {cfg.model.lora.rank}: LoRA needs the peft package, which is not "
                         "installed; pip install 'reasonrl[lora]', or model.lora.rank=0 to train every parameter")


def reward_line(cfg: Config, prompts: list) -> str:
    """What grades the run (every function resolved, InputError otherwise): ``reward.fn``, then
    each ``reward.by_source`` entry with its row count ("no rows" when the data has no such
    source), then the format reward, then what :func:`check_reward_rows` noted; with
    ``env.name``, the episodes' return."""
    if cfg.env.name:
        return f"the return of each env {cfg.env.name} episode (env.reward={cfg.env.reward})"
    from collections import Counter

    from reasonrl.reward.base import parse_by_source

    check_rewards(cfg)
    note = check_reward_rows(cfg, prompts)
    counts = Counter(p.data_source for p in prompts)
    r = cfg.reward
    parts = [r.fn if not r.by_source else f"{r.fn} (other sources)"]
    parts += [f"{source}: {spec} ({counts[source] or 'no'} rows)" for source, spec in parse_by_source(r.by_source).items()]
    if r.format:
        parts.append(f"+{r.format_score} for format {r.format!r}")
    return "; ".join(parts) + (f" ({note})" if note else "")


IMPORT_TIMEOUT_S = 60.0
"""How long importing a user's reward function may take in the pre-start check."""


def check_rewards(cfg: Config) -> None:
    """InputError unless every function of ``reward.fn`` and ``reward.by_source`` and the
    ``reward.format`` rule resolve: the built-in ones here, an import path in a process of its
    own killed at :data:`IMPORT_TIMEOUT_S` (:func:`~reasonrl.runtime.imports.check_importable`:
    its module runs its top level only there and in the reward workers, each bounded)."""
    from reasonrl.plugins import is_plugin_spec
    from reasonrl.reward.base import load_reward_fn, parse_by_source
    from reasonrl.reward.format import format_rule
    from reasonrl.runtime.imports import check_importable

    for spec in dict.fromkeys([cfg.reward.fn, *parse_by_source(cfg.reward.by_source).values()]):
        if is_plugin_spec(spec):
            check_importable(spec, "reward function", IMPORT_TIMEOUT_S, need_callable=True)
        else:
            load_reward_fn(spec, cfg.reward)
    if cfg.reward.format:
        format_rule(cfg.reward.format)


REWARD_CHECK_ROWS = 16
"""At most this many rows are graded before the start (:func:`check_reward_rows`): the first
row of each data source and the first 4 rows."""

CHECK_WORKERS_AFTER_A_TIMEOUT = 8
"""Where the check's first sample runs past ``runtime.roles.reward.timeout_s``, the others are
graded by up to this many workers at once: a function that hangs on every row is reported after
a few timeouts, not one per sample (10 s each by default)."""


def check_reward_rows(cfg: Config, prompts: list) -> str:
    """Grade rows of the data with the run's grader before anything loads: two responses per
    row, the empty one and the row's ground truth, as training grades them (the function of the
    row's data source, ``reward.format``, the row's fields), an unbounded function
    (:func:`~reasonrl.config.rules.reward_workers`) in a worker process with
    ``runtime.roles.reward.timeout_s`` per sample (after a first sample that timed out, the rest
    by :data:`CHECK_WORKERS_AFTER_A_TIMEOUT` workers at once). InputError naming the first row, response and
    error when every grading failed (the function raises, returns something malformed or hangs
    on this data: training would fail every sample); when only some failed, a note saying so
    for the plan, else ""."""
    from reasonrl.config.rules import reward_workers
    from reasonrl.reward.base import row_fields
    from reasonrl.reward.pool import RewardPool
    from reasonrl.runtime.pool import PoolStart

    first: dict[str, object] = {}
    for p in prompts:
        first.setdefault(p.data_source, p)
    rows = list({id(p): p for p in [*first.values(), *prompts[:4]]}.values())[:REWARD_CHECK_ROWS]
    if not rows:
        return ""
    count, timeout = reward_workers(cfg), cfg.runtime.roles.reward.timeout_s
    start = PoolStart("reward", count, timeout, preload_models=False) if count else None  # graders: no model modules
    texts = [text for p in rows for text in ("", p.ground_truth)]
    truths, fields = [p.ground_truth for p in rows for _ in range(2)], [row_fields(p) for p in rows for _ in range(2)]
    with RewardPool(cfg.reward, start, max_consecutive_failures=len(texts)) as pool:
        head = pool.score(texts[:1], truths[:1], fields[:1])
        if start is not None and bool(head.timed_out[0]):  # likely to hang on every row: the rest at once
            pool.resize(max(count, min(len(texts) - 1, CHECK_WORKERS_AFTER_A_TIMEOUT)))
        rest = pool.score(texts[1:], truths[1:], fields[1:])
    failed = [i for i, bad in enumerate([*head.failed.tolist(), *rest.failed.tolist()]) if bad]
    if not failed:
        return ""
    i, error = failed[0], [*head.errors, *rest.errors][0].partition(": ")[2]
    p = rows[i // 2]
    response = "an empty response" if i % 2 == 0 else f"the response {_short(p.ground_truth)} (its ground truth)"
    where = f"row {p.id} ({p.data_source}) with {response}: {error}"
    if len(failed) == len(texts):
        raise InputError(f"reward check: every sample failed, e.g. {where}; a reward function must grade any "
                         "response to the rows of the data (return a score, or a dict with one)")
    return f"reward check: {len(failed)} of {len(texts)} samples failed, e.g. {where}"


def _short(text: str, limit: int = 40) -> str:
    """``text`` quoted, cut to ``limit`` characters."""
    return json.dumps(text if len(text) <= limit else text[:limit] + "...")


def run_state(cfg: Config) -> RunState:
    """What ``run.dir`` holds (RunDirError when it cannot hold this run); creates nothing."""
    run_dir = Path(cfg.run.dir)
    if not run_dir.exists():
        _check_creatable(run_dir)
        return RunState("new")
    from reasonrl.resilience.rundir import check_run_dir

    check_run_dir(run_dir)
    root = run_dir / "checkpoints"
    if not root.is_dir():
        return RunState("new")
    from reasonrl.checkpoint.store import find_latest

    path = find_latest(root)
    if path is None:
        return RunState("new")
    step = int(path.name.removeprefix("step_"))
    return RunState("complete" if step >= cfg.train.total_steps else "resume", step, path)


def config_changes(cfg: Config) -> list[str]:
    """The keys a resume may not change (:func:`~reasonrl.config.config_hash`'s) whose value in
    ``cfg`` differs from the run in ``run.dir`` (its ``config.yaml``), each as ``key: old -> new``;
    none when the run may be resumed (or there is none)."""
    path = Path(cfg.run.dir) / "config.yaml"
    if not path.is_file():
        return []
    old = load(path)
    if config_hash(old) == config_hash(cfg):
        return []
    before, now = flatten(to_dict(old)), flatten(to_dict(cfg))
    keys = [k for k in now if before.get(k) != now[k]
            and not any(k == i or k.startswith(f"{i}.") for i in RESUME_MAY_CHANGE)]
    return [f"{k}: {json.dumps(before.get(k))} -> {json.dumps(now[k])}" for k in keys]


def check_resumable(cfg: Config) -> None:
    """ResumeError, as the run's own checkpoint load would raise it, when ``run.dir`` holds a
    run of a configuration ``cfg`` may not resume (:func:`config_changes`)."""
    changes = config_changes(cfg)
    if changes:
        shown = ", ".join(changes[:6]) + (f" and {len(changes) - 6} more" if len(changes) > 6 else "")
        raise ResumeError(f"{cfg.run.dir}: the run there was written with a different configuration ({shown}); a "
                          f"resume may change only {', '.join(RESUME_MAY_CHANGE)}. Use a new run.dir.")


def check_resumed_data(cfg: Config, checkpoint: Path, train: list) -> None:
    """ResumeError, as the checkpoint load would raise it, when the training prompts ``train``
    differ from those ``checkpoint`` was trained on and ``resume.allow_data_change`` is off."""
    from reasonrl.checkpoint.checkpointer import check_data, data_fingerprint, recorded_fingerprint
    from reasonrl.checkpoint.store import CheckpointCorruptError

    try:
        recorded = recorded_fingerprint(checkpoint)
    except CheckpointCorruptError:
        return  # one that verifies but does not load: the resume falls back to the one before, and checks that
    if recorded is not None:
        check_data(cfg, Path(cfg.run.dir), data_fingerprint(train), recorded)


def same_run(cfg: Config) -> bool:
    """Whether ``run.dir/config.yaml`` is a config that ``cfg`` may resume (equal hashes)."""
    path = Path(cfg.run.dir) / "config.yaml"
    return path.is_file() and config_hash(load(path)) == config_hash(cfg)


def check_data_files(cfg: Config) -> None:
    """InputNotFound / InputError naming the key when a path of data.source or data.test_source
    does not exist or is nothing prompts are read from (``reasonrl.data.sources``: before any
    heavy import, so a mistyped path fails at once)."""
    from reasonrl.data.sources import entries, locate

    for key, value in (("data.source", cfg.data.source), ("data.test_source", cfg.data.test_source)):
        for text in entries(value, key):
            if not (key == "data.source" and text == "embedded"):
                locate(text, key)


def check_extras(cfg: Config) -> None:
    """InputError naming the extra to install when a package that ``cfg`` needs is not installed:
    ray for runtime.engine=ray, vllm for rollout.backend=vllm. Looked up, not imported (Ray's
    first import must be :func:`reasonrl.runtime.ray.connect`'s); one that is there but fails to
    import fails where it is imported, with the same advice."""
    if cfg.runtime.engine == "ray" and not _installed("ray"):
        from reasonrl.runtime.ray import INSTALL

        raise InputError(f"runtime.engine = 'ray' needs the ray package, which is not installed; install it with {INSTALL}")
    if cfg.rollout.backend == "vllm" and not _installed("vllm"):
        from reasonrl.rollout.vllm import INSTALL_HINT

        raise InputError(INSTALL_HINT)


def _installed(module: str) -> bool:
    """Whether ``module`` can be found (False where ``sys.modules`` holds None for it)."""
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except (ValueError, ImportError):
        return False


def _check_creatable(run_dir: Path) -> None:
    """RunDirError unless the nearest existing ancestor of ``run_dir`` is a writable directory."""
    parent = run_dir.absolute().parent
    while not parent.exists():
        parent = parent.parent
    where = f"run.dir = {str(run_dir)!r}"
    if not parent.is_dir():
        raise RunDirError(f"{where}: {parent} is a file, so the directory cannot be created")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise RunDirError(f"{where}: cannot create the directory ({parent} is not writable by this user)")


def _model_dir(cfg: Config) -> tuple[Path | None, str]:
    """(the model directory, None for an embedded warm start not trained yet; its description)."""
    if cfg.model.path != "embedded":
        from reasonrl.models.loading import check_model_files

        check_model_files(cfg.model.path)
        return Path(cfg.model.path), cfg.model.path
    from reasonrl.warmstart.cache import warm_start_dir

    out = warm_start_dir(cfg.sft, cfg.data.families)
    if (out / "sft_summary.json").is_file():
        return out, f"embedded warm start {out}"
    return None, f"embedded (its warm start is not cached yet: it is trained first, a few minutes, into {out})"


def _model_shape(cfg: Config, model_dir: Path | None, vocab: int):
    """The model's shape for the memory estimate: its config.json, or the embedded model's sft.* sizes."""
    from reasonrl.memory import ModelShape

    if model_dir is not None:
        return ModelShape.from_model_dir(model_dir)
    s = cfg.sft
    return ModelShape(vocab, s.hidden_size, s.layers, s.heads, s.kv_heads, s.hidden_size // s.heads, s.intermediate_size, tied=True)


def _tokenizer_and_context(model_dir: Path | None):
    """(tokenizer, max_position_embeddings) of the model directory, or of the embedded model."""
    from reasonrl.models.loading import EMBEDDED_MAX_POSITIONS, load_tokenizer, model_context

    if model_dir is None:
        from reasonrl.data.tokenizer import build_char_tokenizer

        return build_char_tokenizer(), EMBEDDED_MAX_POSITIONS
    return load_tokenizer(model_dir), model_context(model_dir)
