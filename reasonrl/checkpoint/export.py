"""A run's trained policy as a Hugging Face model directory (``reasonrl export`` and ``final/``).

    export_model(run_dir, out, step=None)            a run's checkpoint (default: the newest) -> out
    export_model(run_dir, out, adapter=True)         a LoRA run's adapters as a peft adapter directory
    write_model_dir(module, tokenizer, out, source)  the one writer; PolicyWorker.export (final/) uses it too
    merged_model(lora_module, model_dir, cfg)        a LoRA policy as the plain model, W + (alpha / r) B A

A LoRA run (``model.lora.rank > 0``) checkpoints its adapters alone; its export is the merged
model by default (the base model of the run's model directory with every adapter merged into
its projection: a plain ``transformers`` directory, no ``peft`` needed to load it), and with
``adapter=True`` (``reasonrl export --adapter``) the adapter directory ``peft`` writes
(``adapter_config.json``, ``adapter_model.safetensors``; ``base_model_name_or_path`` is the
run's model directory), which ``peft.PeftModel.from_pretrained(base, out)`` loads, with the
tokenizer and ``reasonrl_export.json`` beside it.

Layout of ``out``::

    config.json             the model's config (architecture, dtype: the dtype the policy was trained in)
                            (adapter directory: adapter_config.json and adapter_model.safetensors instead)
    model.safetensors       the trained policy weights (sharded with an index for large models)
    generation_config.json  eos_token_id and pad_token_id: the ids the trainer stops on (the tokenizer's
                            EOS first, then those the source model's generation config lists) and pads with
    tokenizer.json, tokenizer_config.json
                            the tokenizer exactly as training used it (pad falls back to EOS, left padding)
    chat_template.jinja     the source tokenizer's chat template, when it has one (the embedded one has)
    reasonrl_export.json    what was exported: format, base model, checkpoint, policy version

``out`` is written atomically: everything goes to a hidden ``.<name>.tmp-<pid>-<hex>`` directory
beside it, which is renamed to ``out`` at the end (a previous export there is replaced only then);
a failure removes the temporary directory and leaves ``out`` as it was. A non-empty ``out``
without ``reasonrl_export.json`` is never overwritten.
"""

from __future__ import annotations

import copy
import json
import os
import secrets
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from transformers import AutoTokenizer, GenerationConfig, PreTrainedTokenizerBase

from reasonrl.checkpoint.store import CheckpointCorruptError, find_latest, fsync_dir, list_checkpoints, load_checkpoint
from reasonrl.config import Config, load
from reasonrl.models.loading import join_eos_ids, load_model, load_tokenizer
from reasonrl.models.lora import adapter_tensors, load_adapters, load_policy, lora_config_of, merged_tensors
from reasonrl.rollout.base import copy_weights
from reasonrl.warmstart import resolve_model_dir
from reasonrl.data.tokenizer import CHAT_TEMPLATE
from reasonrl.errors import InputError, InputNotFound, error_line

MARKER = "reasonrl_export.json"
FORMAT = "reasonrl-export"
FORMAT_VERSION = 1
POLICY = "policy"
"""The registry name of the policy's weights in a checkpoint (``Controller._registry``)."""
PROBES = (
    "47+38=?\n",
    "7+8=15\n4+3+1=8\nAnswer: 85",
    "  two  spaces,\ta tab, a trailing space ",
    "\n\nblank lines\n\n",
    "0123456789 3.14159 -42",
    "é, ß, 漢字 and 🙂 outside an ASCII vocabulary",
)
"""Texts the exported tokenizer, reloaded with plain AutoTokenizer, must tokenise as training did."""


def export_model(run_dir: str | Path, out: str | Path, step: int | None = None, force: bool = False,
                 adapter: bool = False) -> Path:
    """Write the policy of the run in ``run_dir`` to ``out`` as a Hugging Face model directory
    (``adapter``: a LoRA run's adapter directory, see the module docstring).

    ``step=None``: the newest committed, valid checkpoint; a run with no such checkpoint but a
    ``final/`` (the trainer's export at the end) is re-exported from ``final/`` (not with
    ``adapter``: ``final/`` is merged). ``step=N``: ``checkpoints/step_N``, which must be
    committed and valid. The module's class, config and tokenizer come from the model directory
    the run started from (``resolve_model_dir`` of the run's ``config.yaml``), the weights (LoRA:
    the adapters) from the checkpoint, in the dtype they were trained in (``model.dtype``).
    InputError names the run directory and what is missing; see :func:`write_model_dir` for
    what is written. ``out`` is refused (:func:`check_export_target`) inside a run directory,
    and when it is not empty unless ``force`` (which replaces only a previous export).
    """
    run_dir = Path(run_dir)
    check_export_target(Path(out), force)  # before any weights are read
    cfg = _run_config(run_dir)
    lora = cfg.model.lora.rank > 0
    if adapter and not lora:
        raise InputError(f"{run_dir}: --adapter exports LoRA adapters, and this run trained every parameter "
                         f"(model.lora.rank = 0 in {run_dir / 'config.yaml'}); export without --adapter")
    checkpoint = select_checkpoint(run_dir, step)
    if checkpoint is None:
        if adapter:
            raise InputError(f"{run_dir}: no valid checkpoint holds the adapters ({_available(run_dir / 'checkpoints')}) "
                             "and final/ is the merged model; export without --adapter")
        final = run_dir / "final"
        module = load_model(final, cfg.model.dtype)
        source = _previous_source(final)
        return write_model_dir(module, training_tokenizer(cfg, final), out, {**source, "exported_from": str(final)})
    weights, version = _policy_weights(run_dir, checkpoint)
    model_dir = resolve_model_dir(cfg)
    module = load_policy(model_dir, cfg)
    try:
        if lora:
            load_adapters(module, weights)
        else:
            module.load_state_dict(weights)
    except (RuntimeError, KeyError) as err:
        raise InputError(f"{checkpoint}: the policy weights do not fit the model in {model_dir} (model.path and "
                         f"model.lora of {run_dir / 'config.yaml'}): {error_line(err)}") from err
    source = {"base_model": str(model_dir), "checkpoint": str(checkpoint), "policy_version": version}
    tokenizer = training_tokenizer(cfg, model_dir)
    if adapter:
        return write_adapter_dir(module, model_dir, cfg, tokenizer, out, source)
    if lora:
        module = merged_model(module, model_dir, cfg)
    return write_model_dir(module, tokenizer, out, source)


def merged_model(module: torch.nn.Module, model_dir: Path, cfg: Config) -> torch.nn.Module:
    """The plain model of ``model_dir`` (``model.dtype``) holding the LoRA policy ``module``'s
    weights with every adapter merged, ``W + (alpha / r) B A``
    (:func:`~reasonrl.models.lora.merged_tensors`), on the CPU."""
    plain = load_model(model_dir, cfg.model.dtype)
    copy_weights(plain, {name: t.to("cpu") for name, t in merged_tensors(module).items()})
    return plain


def select_checkpoint(run_dir: Path, step: int | None) -> Path | None:
    """``run_dir/checkpoints/step_<step>``, or the newest valid checkpoint for ``step=None``; None
    when ``step`` is None, there is no valid checkpoint and ``run_dir/final`` exists. InputError
    naming the run directory and listing the valid steps otherwise."""
    root = run_dir / "checkpoints"
    if step is None:
        latest = find_latest(root)
        if latest is not None:
            return latest
        if (run_dir / "final" / "config.json").is_file():
            return None
        raise InputError(f"{run_dir}: nothing to export: {_available(root)} under {root}, and no final/")
    path = root / f"step_{step}"
    if not path.is_dir():
        raise InputError(f"{run_dir}: no checkpoint for step {step} under {root}; {_available(root)}")
    return path


def _available(root: Path) -> str:
    """The valid checkpoints under ``root``, in words, for an error message."""
    valid = [str(info.step) for info in list_checkpoints(root) if info.valid]
    return f"valid checkpoints: step {', '.join(valid)}" if valid else "no valid checkpoint"


def training_tokenizer(cfg: Config, model_dir: Path) -> PreTrainedTokenizerBase:
    """The tokenizer training used (:func:`~reasonrl.models.loading.load_tokenizer` of ``model_dir``),
    with the embedded chat template added for ``model.path=embedded`` when the saved one has
    none (warm starts cached before the template existed): it renders the embedded prompt."""
    tokenizer = load_tokenizer(model_dir)
    if cfg.model.path == "embedded" and not getattr(tokenizer, "chat_template", None):
        tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def write_model_dir(module: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, out: str | Path,
                    source: dict[str, Any]) -> Path:
    """Write ``module`` (its weights in their own dtype) and ``tokenizer`` to ``out`` atomically.

    Adds generation_config.json with the EOS ids rollouts stop on and the pad id,
    and ``reasonrl_export.json`` holding ``source`` (what was exported). Checks that plain
    ``AutoTokenizer.from_pretrained`` of the result tokenises :data:`PROBES` as ``tokenizer``
    does (InputError naming the class it loads otherwise: the model type picks another tokenizer).
    InputError when ``out`` is a file or a non-empty directory that is not a previous export.
    Returns ``out``.
    """

    def fill(tmp: Path) -> None:
        module.save_pretrained(tmp)
        _drop_missing_auto_map(tmp / "config.json")
        tokenizer.save_pretrained(tmp)
        generation_config(module, tokenizer).save_pretrained(tmp)
        _write_marker(tmp, source)
        check_tokenizer_reloads(tmp, tokenizer, out)

    return _write_atomically(Path(out), fill)


def write_adapter_dir(module: torch.nn.Module, model_dir: Path, cfg: Config, tokenizer: PreTrainedTokenizerBase,
                      out: str | Path, source: dict[str, Any]) -> Path:
    """Write the LoRA adapters of ``module`` to ``out`` atomically as ``peft`` saves them
    (``adapter_config.json`` with ``base_model_name_or_path = model_dir``,
    ``adapter_model.safetensors``), with ``tokenizer`` and ``reasonrl_export.json`` beside
    them: ``PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(model_dir), out)``
    is the policy. The same target rules as :func:`write_model_dir`; returns ``out``."""
    from peft import get_peft_model

    config = copy.deepcopy(lora_config_of(module))
    config.base_model_name_or_path = str(model_dir)
    with torch.random.fork_rng(devices=[]):  # peft initialises adapters that are overwritten at once
        peft_model = get_peft_model(load_model(model_dir, cfg.model.dtype), config)
    load_adapters(peft_model.base_model.model, {name: t.to("cpu") for name, t in adapter_tensors(module).items()})

    def fill(tmp: Path) -> None:
        peft_model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        _write_marker(tmp, {**source, "adapter": True})

    return _write_atomically(Path(out), fill)


def _write_marker(tmp: Path, source: dict[str, Any]) -> None:
    marker = {"format": FORMAT, "format_version": FORMAT_VERSION, **source}
    (tmp / MARKER).write_text(json.dumps(marker, indent=2) + "\n", encoding="utf-8")


def _write_atomically(out: Path, fill) -> Path:
    """``fill(tmp)`` a hidden temporary directory beside ``out``, make it durable and rename it
    to ``out`` (see the module docstring); the temporary directory never outlives the call."""
    check_target(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        tmp.mkdir()
        fill(tmp)
        _fsync_tree(tmp)
        _replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def check_export_target(out: Path, force: bool) -> None:
    """InputError when ``out`` lies in a run directory (its ``final/``, checkpoints or any other
    place a trainer writes: a run's files are never replaced by an export), or is not empty and
    ``force`` is not given; then :func:`check_target`."""
    resolved = Path(os.path.abspath(out))
    for place in (resolved, *resolved.parents):
        if (place / "config.yaml").is_file() and ((place / "checkpoints").is_dir() or (place / "events.jsonl").is_file()):
            raise InputError(f"{out}: lies inside the run directory {place}; an export there could replace the "
                             "run's own files (final/, checkpoints): choose a directory outside any run directory")
    check_target(out)
    if not force and out.is_dir() and any(out.iterdir()):
        raise InputError(f"{out}: holds a previous export; choose a new or empty directory, or pass --force to "
                         "replace it")


def check_target(out: Path) -> None:
    """InputError unless ``out`` is absent, an empty directory or a previous export."""
    if not os.path.lexists(out):
        return
    if out.is_symlink() or not out.is_dir():
        raise InputError(f"{out}: exists and is not a directory; choose a new directory for the export")
    entries = sorted(p.name for p in out.iterdir())
    if entries and not _is_export(out):
        shown = ", ".join(entries[:3]) + (f" and {len(entries) - 3} more" if len(entries) > 3 else "")
        raise InputError(f"{out}: holds files that are not a reasonrl export ({shown}; no {MARKER}); refusing to "
                         "overwrite them: choose an empty or new directory")


def generation_config(module: torch.nn.Module, tokenizer: PreTrainedTokenizerBase) -> GenerationConfig:
    """The module's generation config (a copy) with the EOS ids the trainer's rollouts stop on
    (:func:`~reasonrl.models.loading.join_eos_ids` of the tokenizer's and the config's: one id, or a
    list) and the tokenizer's pad id: generation stops where the trainer's rollouts stopped."""
    base = getattr(module, "generation_config", None)
    config = copy.deepcopy(base) if base is not None else GenerationConfig.from_model_config(module.config)
    eos_ids = join_eos_ids(tokenizer.eos_token_id, config.eos_token_id)
    config.eos_token_id = eos_ids[0] if len(eos_ids) == 1 else list(eos_ids)
    config.pad_token_id = tokenizer.pad_token_id
    return config


def check_tokenizer_reloads(path: Path, tokenizer: PreTrainedTokenizerBase, out: Path) -> None:
    """InputError unless ``AutoTokenizer.from_pretrained(path)`` gives ``tokenizer``'s ids on
    every text of :data:`PROBES` (``out`` is the name the error gives the directory)."""
    reloaded = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    for text in PROBES:
        want, got = tokenizer(text)["input_ids"], reloaded(text)["input_ids"]
        if got != want:
            model_type = json.loads((path / "config.json").read_text()).get("model_type")
            raise InputError(
                f"{out}: AutoTokenizer.from_pretrained loads a {type(reloaded).__name__} for model_type "
                f"{model_type!r}, which tokenises {text!r} as {got} where training gave {want}; the exported "
                "directory would not tokenise as the policy was trained (save the tokenizer with the class of "
                "its model type, or use a model type whose AutoTokenizer keeps a generic tokenizer)")


def check_tokenizer_exports(model_dir: Path, tokenizer: PreTrainedTokenizerBase) -> None:
    """InputError before training when the run's ``final/`` would fail :func:`check_tokenizer_reloads`:
    ``tokenizer`` saved beside ``model_dir``'s config.json, reloaded with plain AutoTokenizer, must
    tokenise :data:`PROBES` as ``tokenizer`` does. Writes only to a temporary directory."""
    with tempfile.TemporaryDirectory(prefix="reasonrl-tokenizer-check-") as tmp:
        shutil.copyfile(model_dir / "config.json", Path(tmp) / "config.json")
        tokenizer.save_pretrained(tmp)
        try:
            check_tokenizer_reloads(Path(tmp), tokenizer, model_dir)
        except InputError as err:
            raise InputError(
                f"model.path={model_dir}: the run would train and then fail writing final/, because "
                f"{str(err).split(': ', 1)[1]}. Before training, give the model a tokenizer that AutoTokenizer "
                "reloads unchanged for its model_type (that type's own tokenizer files), or a model type whose "
                "AutoTokenizer keeps a generic tokenizer.json (llama's does)") from err


def _drop_missing_auto_map(path: Path) -> None:
    """Remove the ``auto_map`` entries of the config at ``path`` whose code file (``module.py``
    of ``module.Class``, or of ``repo--module.Class``) is not beside it: a loader would fail on
    them (or fetch code from elsewhere); ``auto_map`` goes when no entry is left."""
    config = json.loads(path.read_text(encoding="utf-8"))
    auto_map = config.get("auto_map")
    if not isinstance(auto_map, dict):
        return

    def present(ref: Any) -> bool:
        refs = ref if isinstance(ref, list) else [ref]
        return all(isinstance(r, str) and (path.parent / f"{r.split('--')[-1].rsplit('.', 1)[0]}.py").is_file()
                   for r in refs if r is not None)

    kept = {k: v for k, v in auto_map.items() if present(v)}
    if kept == auto_map:
        return
    if kept:
        config["auto_map"] = kept
    else:
        del config["auto_map"]
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _run_config(run_dir: Path) -> Config:
    """The resolved config of the run in ``run_dir``; InputNotFound when it is not a run directory."""
    path = run_dir / "config.yaml"
    if not path.is_file():
        raise InputNotFound(f"{run_dir}: not a reasonrl run directory (no config.yaml there); give the run.dir of a run")
    return load(path)


def _policy_weights(run_dir: Path, checkpoint: Path) -> tuple[dict[str, torch.Tensor], int | None]:
    """The policy's weights and version in a committed, valid checkpoint; InputError otherwise."""
    try:
        _, tensors, state = load_checkpoint(checkpoint)
    except (CheckpointCorruptError, OSError) as err:
        raise InputError(f"{checkpoint}: cannot be exported ({err}); {_available(run_dir / 'checkpoints')}") from err
    if POLICY not in tensors:
        raise InputError(f"{checkpoint}: holds no {POLICY!r} weights (parts: {', '.join(sorted(tensors)) or 'none'})")
    version = state.get(POLICY, {}).get("version")
    return tensors[POLICY], None if version is None else int(version)


def _is_export(path: Path) -> bool:
    """Whether ``path`` holds a ``reasonrl_export.json`` of this format."""
    try:
        return json.loads((path / MARKER).read_text(encoding="utf-8")).get("format") == FORMAT
    except (OSError, ValueError, AttributeError):
        return False


def _previous_source(path: Path) -> dict[str, Any]:
    """The ``source`` fields of an earlier export at ``path`` (empty for a directory without one)."""
    try:
        marker = json.loads((path / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in marker.items() if k not in ("format", "format_version")} if isinstance(marker, dict) else {}


def _replace(tmp: Path, out: Path) -> None:
    """Rename ``tmp`` to ``out``; an existing ``out`` (empty, or a previous export) is moved aside
    first and deleted after, or put back when the rename fails."""
    aside = None
    if os.path.lexists(out):
        aside = out.parent / f".{out.name}.old-{os.getpid()}-{secrets.token_hex(4)}"
        os.rename(out, aside)
    try:
        os.rename(tmp, out)
    except BaseException:
        if aside is not None:
            os.rename(aside, out)
        raise
    fsync_dir(out.parent)
    if aside is not None:
        shutil.rmtree(aside, ignore_errors=True)


def _fsync_tree(root: Path) -> None:
    """Make every file under ``root``, and the directories holding them, durable."""
    for directory, _, files in os.walk(root):
        for name in files:
            fd = os.open(os.path.join(directory, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(Path(directory))
