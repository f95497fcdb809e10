"""Preflight refuses, before the first step, a model whose tokenizer would not reload the way
``final/`` will be, and LoRA without the peft package."""

from __future__ import annotations

import pytest
from transformers import Qwen2Config, Qwen2ForCausalLM

from reasonrl.config import load
from reasonrl.data.tokenizer import build_char_tokenizer
from reasonrl.errors import InputError
from reasonrl.preflight import preflight


def char_tokenizer():
    """The embedded character-level tokenizer."""
    return build_char_tokenizer()


def bpe_tokenizer():
    """A byte-level BPE trained here on the task's text (a model's own BPE, as a user brings one)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    texts = [f"{a}+{b}=?\n{a % 10}+{b % 10}\nAnswer: {a + b}" for a in range(10, 60) for b in range(10, 30)]
    bpe.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=400, special_tokens=["<pad>", "<eos>", "<unk>"],
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return PreTrainedTokenizerFast(tokenizer_object=bpe, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")


def qwen2_with_own_tokenizer(out, tok):
    """A qwen2 model directory with a tokenizer of its own (not Qwen2's): AutoTokenizer of a qwen2
    directory builds a Qwen2Tokenizer, which tokenises differently from the tokenizer training uses."""
    config = Qwen2Config(vocab_size=len(tok), hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=64, pad_token_id=tok.pad_token_id,
                         eos_token_id=tok.eos_token_id, max_position_embeddings=256)
    Qwen2ForCausalLM(config).save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.mark.parametrize("tokenizer", [char_tokenizer, bpe_tokenizer])
def test_a_model_whose_export_would_fail_is_refused_before_training(tmp_path, model_dir, tokenizer):
    qwen2 = qwen2_with_own_tokenizer(tmp_path / "qwen2", tokenizer())
    cfg = load(None, [f"model.path={qwen2}", f"run.dir={tmp_path / 'run'}"])
    with pytest.raises(InputError, match=r"^model\.path=.*qwen2: the run would train and then fail writing final/, "
                                         r"because AutoTokenizer\.from_pretrained loads a Qwen2Tokenizer"):
        preflight(cfg)
    assert not (tmp_path / "run").exists()
    plan = preflight(load(None, [f"model.path={model_dir}", f"run.dir={tmp_path / 'ok'}"]))  # a llama-typed one passes
    assert plan.model == str(model_dir)


def test_lora_without_the_peft_package_is_refused_before_anything_loads(tmp_path, model_dir, monkeypatch):
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "peft" else find_spec(name, *a))
    cfg = load(None, [f"model.path={model_dir}", f"run.dir={tmp_path / 'run'}", "model.lora.rank=8"])
    with pytest.raises(InputError, match=r"^model\.lora\.rank = 8: LoRA needs the peft package, which is not installed; "
                                         r"pip install 'reasonrl\[lora\]', or model\.lora\.rank=0"):
        preflight(cfg)
    assert not (tmp_path / "run").exists()
