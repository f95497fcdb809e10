"""Build the tiny embedded decoder, and load any local Hugging Face causal LM.

The embedded model is a Llama decoder (no biases) built from a config (no download); after
the warm start it is saved with ``save_pretrained``, so policy, reference and critic are then
loaded through the same ``load_model`` path as a real checkpoint directory. Llama, not Qwen2:
``AutoTokenizer`` replaces the tokenizer of a ``qwen2`` directory by Qwen2's own byte-level
pipeline, while a ``llama`` directory keeps the generic tokenizer it was saved with, so the
exported model tokenises with plain ``AutoTokenizer`` exactly as it was trained.

torch and ``transformers`` are imported where a model or tokenizer is built or loaded: the checks
before a run (:mod:`reasonrl.preflight`, in the supervisor's process too) read a model directory's
files and its tokenizer only, and a generic tokenizer needs neither torch nor the model classes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from reasonrl.errors import InputError, InputNotFound, error_line

if TYPE_CHECKING:
    import torch
    from transformers import LlamaForCausalLM, PreTrainedTokenizerBase


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype a model is loaded in, by its name (``model.dtype``: float32, bfloat16 or float16)."""
    import torch

    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


EMBEDDED_MAX_POSITIONS = 256
"""The context length of the embedded model (its max_position_embeddings)."""


def build_tiny_model(
    vocab_size: int,
    hidden_size: int,
    layers: int,
    heads: int,
    kv_heads: int,
    intermediate_size: int,
    pad_id: int,
    eos_id: int,
    seed: int,
    max_positions: int = EMBEDDED_MAX_POSITIONS,
) -> LlamaForCausalLM:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        intermediate_size=intermediate_size,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        pad_token_id=pad_id,
        eos_token_id=eos_id,
        bos_token_id=eos_id,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return LlamaForCausalLM(config)


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
"""A model directory needs at least one of these beside its weights."""


def check_device(device: str) -> None:
    """InputError naming ``run.device`` when this torch build or machine cannot use ``device``."""
    kind, _, index = device.partition(":")
    if kind not in ("cuda", "mps"):
        return
    import torch

    if kind == "cuda":
        if torch.version.cuda is None or not torch.cuda.is_available():
            why = "this torch build has no CUDA support" if torch.version.cuda is None else "no CUDA device is visible"
            raise InputError(f"run.device = {device!r}: {why} (torch {torch.__version__}); use run.device=cpu")
        if index and int(index) >= torch.cuda.device_count():
            raise InputError(f"run.device = {device!r}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    elif kind == "mps" and not torch.backends.mps.is_available():
        raise InputError(f"run.device = {device!r}: MPS is not available here; use run.device=cpu")


def load_model(path: str | Path, dtype: str = "float32", device: str = "cpu") -> torch.nn.Module:
    """A causal LM from a local Hugging Face model directory (nothing is downloaded); a
    directory whose weights cannot be read (missing, truncated, mismatched) is an InputError."""
    from transformers import AutoModelForCausalLM

    _check_model_dir(path)
    check_device(device)
    try:
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch_dtype(dtype), local_files_only=True)
    except Exception as err:  # noqa: BLE001 - every way a local directory fails to load is its problem
        raise InputError(f"model.path: cannot load the model in {path}: {error_line(err)}") from err
    return model.to(device)


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerBase:
    """The tokenizer saved beside a model; it must define an EOS token (padding falls back to it)."""
    check_model_files(path)
    try:
        tok = _tokenizer_class(Path(path)).from_pretrained(str(path), local_files_only=True)
    except Exception as err:  # noqa: BLE001 - as for the weights
        raise InputError(f"model.path: cannot load the tokenizer in {path}: {error_line(err)}") from err
    if tok.eos_token_id is None:
        raise InputError(f"model.path: the tokenizer in {path} has no eos_token; set one in tokenizer_config.json")
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    return tok


def load_eos_ids(path: str | Path, tokenizer: PreTrainedTokenizerBase) -> tuple[int, ...]:
    """Every token id generation of the model in ``path`` ends on: ``tokenizer.eos_token_id``,
    then each ``eos_token_id`` of its generation_config.json (an int or a list; without that
    file, config.json's, which is what ``transformers`` generates with). Llama 3 Instruct lists
    ``<|end_of_text|>`` and ``<|eot_id|>`` there, while its tokenizer names one of them."""
    path = Path(path)
    generation = path / "generation_config.json"
    source = generation if generation.is_file() else path / "config.json"
    try:
        listed = json.loads(source.read_text(encoding="utf-8")).get("eos_token_id") if source.is_file() else None
    except (OSError, ValueError, AttributeError) as err:
        raise InputError(f"model.path: {source} is not a readable JSON object ({error_line(err)})") from None
    return join_eos_ids(tokenizer.eos_token_id, listed, source)


def join_eos_ids(first: int, listed: int | list[int] | None, source: str | Path = "generation_config") -> tuple[int, ...]:
    """``first`` followed by the ids of ``listed`` (an ``eos_token_id`` value: an int, a list of
    ints or None) not already there; a value of another kind is an InputError naming ``source``."""
    values = [] if listed is None else listed if isinstance(listed, list) else [listed]
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
        raise InputError(f"model.path: eos_token_id = {listed!r} in {source}: expected a token id or a list of token ids")
    return tuple(dict.fromkeys([first, *values]))


def model_context(path: str | Path) -> int:
    """The context length of the model in ``path``: ``max_position_embeddings`` of its
    config.json; InputError naming the file when it has none."""
    config = Path(path) / "config.json"
    try:
        return int(json.loads(config.read_text(encoding="utf-8"))["max_position_embeddings"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise InputError(f"model.path: {config} has no readable max_position_embeddings ({error_line(err)})") from None


def model_vocab_size(path: str | Path) -> int:
    """The vocabulary size of the model in ``path``: ``vocab_size`` of its config.json;
    InputError naming the file when it has none."""
    config = Path(path) / "config.json"
    try:
        return int(json.loads(config.read_text(encoding="utf-8"))["vocab_size"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise InputError(f"model.path: {config} has no readable vocab_size ({error_line(err)})") from None


def _tokenizer_class(path: Path) -> type:
    """PreTrainedTokenizerFast for a generic `tokenizers` file, else AutoTokenizer.

    AutoTokenizer picks the tokenizer class of the model type (Qwen2Tokenizer for a
    qwen2 config), which re-builds the pipeline and would change a generic tokenizer
    such as the embedded character-level one; a generic one is loaded exactly as saved.
    """
    config = path / "tokenizer_config.json"
    generic = ("TokenizersBackend", "PreTrainedTokenizerFast")
    if config.is_file() and json.loads(config.read_text()).get("tokenizer_class") in generic:
        from transformers import PreTrainedTokenizerFast

        return PreTrainedTokenizerFast
    from transformers import AutoTokenizer

    return AutoTokenizer


def check_model_files(path: str | Path) -> None:
    """InputNotFound / InputError naming model.path unless ``path`` is a model directory with a
    config.json and tokenizer files (the weights are checked when they load)."""
    _check_model_dir(path)
    p = Path(path)
    if not any((p / name).is_file() for name in TOKENIZER_FILES):
        raise InputError(f"model.path: {p} has no tokenizer files (none of {', '.join(TOKENIZER_FILES)}); "
                         "save the tokenizer beside the model with tokenizer.save_pretrained(dir)")


def _check_model_dir(path: str | Path) -> None:
    p = Path(path)
    if not (p / "config.json").is_file():
        raise InputNotFound(
            f"model.path: {p} is not a Hugging Face model directory (no config.json there); "
            "give 'embedded' or a local directory written by save_pretrained"
        )
