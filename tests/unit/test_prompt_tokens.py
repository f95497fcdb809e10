"""Prompts and tokens that match the model: a chat template applied once (one BOS), generation
ending on every EOS id the model's generation config lists, and data.truncation.

The model directory is built here in the layout of an instruct model (Llama 3 style): a
tokenizer whose post-processor prepends ``<|begin_of_text|>`` to any text, a chat template
that writes that BOS itself, ``<|eot_id|>`` as the tokenizer's EOS, and a
generation_config.json listing ``[<|end_of_text|>, <|eot_id|>]``. Its tiny Llama is rigged so
that the greedy next token depends only on the current one (attention and MLP outputs are
zero, the head maps each one-hot embedding to a chosen successor): a chat prompt, which ends
with ``<|assistant|>``, continues ``a b <|end_of_text|> c ...``, a plain one ending with ``x``
continues ``c <|eot_id|> d ...``.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from reasonrl.checkpoint.export import generation_config
from reasonrl.config import load
from reasonrl.data.datasets import render_prompt
from reasonrl.models.loading import load_eos_ids, load_model, load_tokenizer, model_context
from reasonrl.data.splits import encode_prompts, tokenize_prompts
from reasonrl.data.tokenizer import build_char_tokenizer
from reasonrl.errors import InputError
from reasonrl.rollout.fast import FastGenerator
from reasonrl.rollout.hf import HFGenerator
from reasonrl.rollout.partial import PartialRollouts
from reasonrl.types import Prompt, SamplingParams
from reasonrl.workers.rollout import RolloutWorker
from tests.unit.test_rollout_hf import seeds

SPECIALS = ["<pad>", "<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>", "<|user|>", "<|assistant|>", "<unk>"]
WORDS = ["what", "is", "one", "two", "plus", "a", "b", "c", "d", "x"]
VOCAB = {tok: i for i, tok in enumerate(SPECIALS + WORDS)}
PAD, BOS, END_OF_TEXT, EOT, USER, ASSISTANT = 0, 1, 2, 3, 4, 5
W = {w: VOCAB[w] for w in WORDS}
TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} <|eot_id|> {% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")
SUCCESSOR = {ASSISTANT: W["a"], W["a"]: W["b"], W["b"]: END_OF_TEXT, END_OF_TEXT: W["c"],
             W["x"]: W["c"], W["c"]: EOT, EOT: W["d"]}
"""The greedy next token of each token (every other one is followed by 'd')."""

CHAT = Prompt("chat-0", [{"role": "user", "content": "what is one plus two"}], "3")
PLAIN = Prompt("plain-0", "what is x", "1")
CHAT_IDS = [BOS, USER, W["what"], W["is"], W["one"], W["plus"], W["two"], EOT, ASSISTANT]
PLAIN_IDS = [BOS, W["what"], W["is"], W["x"]]


def instruct_tokenizer() -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.WordLevel(vocab=VOCAB, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(SPECIALS)
    tok.post_processor = processors.TemplateProcessing(single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", BOS)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|begin_of_text|>", eos_token="<|eot_id|>",
                                   pad_token="<pad>", unk_token="<unk>", chat_template=TEMPLATE)


def rigged_llama() -> LlamaForCausalLM:
    V, H = len(VOCAB), 32
    config = LlamaConfig(vocab_size=V, hidden_size=H, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                         intermediate_size=8, max_position_embeddings=64, tie_word_embeddings=False,
                         pad_token_id=PAD, bos_token_id=BOS, eos_token_id=EOT)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        model.model.embed_tokens.weight.copy_(torch.eye(V, H))
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        head = torch.zeros(V, H)
        for token in range(V):
            head[SUCCESSOR.get(token, W["d"]), token] = 4.0
        model.lm_head.weight.copy_(head)
    return model


@pytest.fixture(scope="module")
def instruct_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("instruct")
    rigged_llama().save_pretrained(out)
    instruct_tokenizer().save_pretrained(out)
    GenerationConfig(bos_token_id=BOS, eos_token_id=[END_OF_TEXT, EOT], pad_token_id=PAD).save_pretrained(out)
    return out


def cfg_for(model_dir, *overrides: str):
    return load(None, [f"model.path={model_dir}", "data.max_prompt_len=16", "rollout.max_new_tokens=6", *overrides])


def first_real_tokens(batch) -> list[list[int]]:
    """Each row's prompt without its left padding."""
    return [ids[mask.bool()].tolist() for ids, mask in zip(batch.prompt_ids, batch.prompt_mask)]


def test_a_chat_template_is_applied_once_and_plain_text_keeps_the_tokenizers_bos(instruct_dir):
    tok = load_tokenizer(instruct_dir)
    assert tok(render_prompt(CHAT, tok))["input_ids"][:2] == [BOS, BOS]  # the double BOS of tokenising the template's text again
    assert encode_prompts([CHAT, PLAIN], tok) == [CHAT_IDS, PLAIN_IDS]
    assert tok.apply_chat_template(CHAT.text, tokenize=True, add_generation_prompt=True, return_dict=False) == CHAT_IDS
    cfg = cfg_for(instruct_dir)
    tokens = tokenize_prompts([PLAIN, CHAT], tok, cfg, model_context(instruct_dir), "rows.jsonl")
    assert (tokens.ids, tokens.prompts, tokens.truncated, tokens.dropped, tokens.note("rows.jsonl")) == (
        [PLAIN_IDS, CHAT_IDS], [PLAIN, CHAT], 0, 0, "")


def test_the_eos_ids_are_the_tokenizers_then_the_generation_configs(instruct_dir, tmp_path):
    assert load_eos_ids(instruct_dir, load_tokenizer(instruct_dir)) == (EOT, END_OF_TEXT)
    (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": 7}))
    assert load_eos_ids(tmp_path, SimpleNamespace(eos_token_id=3)) == (3, 7)  # no generation_config.json: config.json's
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [3, 9, 3]}))
    assert load_eos_ids(tmp_path, SimpleNamespace(eos_token_id=3)) == (3, 9)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": "</s>"}))
    with pytest.raises(InputError, match=r"eos_token_id = '</s>' in .*generation_config.json: expected a token id"):
        load_eos_ids(tmp_path, SimpleNamespace(eos_token_id=3))


@pytest.mark.parametrize("backend", ["fast", "hf"])
def test_the_trained_ids_begin_with_one_bos_and_generation_stops_on_every_listed_eos(instruct_dir, backend):
    cfg = cfg_for(instruct_dir, f"rollout.backend={backend}")
    tok = load_tokenizer(instruct_dir)
    worker = RolloutWorker(cfg, instruct_dir)
    ids = tokenize_prompts([CHAT, PLAIN], tok, cfg, model_context(instruct_dir), "rows.jsonl").ids
    batch = worker.generate(ids, 2, SamplingParams(temperature=0.0, max_new_tokens=6), seeds(ids))
    assert first_real_tokens(batch) == [CHAT_IDS, CHAT_IDS, PLAIN_IDS, PLAIN_IDS]
    assert batch.response_ids.tolist() == [[W["a"], W["b"], END_OF_TEXT]] * 2 + [[W["c"], EOT, PAD]] * 2
    assert batch.response_mask.tolist() == [[1, 1, 1]] * 2 + [[1, 1, 0]] * 2  # the EOS itself is trained on
    assert batch.eos.tolist() == [True] * 4 and batch.truncated.tolist() == [False] * 4


def test_the_fixed_shape_loop_and_an_interrupted_rollout_stop_on_the_second_eos_too(instruct_dir):
    model, greedy = load_model(instruct_dir), SamplingParams(temperature=0.0, max_new_tokens=6)
    prompts = [CHAT_IDS, PLAIN_IDS]
    static = FastGenerator(model, PAD, (EOT, END_OF_TEXT), static_shapes=True).generate(prompts, 1, greedy, seeds(prompts))
    reloads = []  # new weights wait after the first decode step, once (the same weights: only the phases change)
    partial = PartialRollouts(FastGenerator(model, PAD, (EOT, END_OF_TEXT)), lambda: not reloads,
                              lambda: reloads.append(1), lambda: len(reloads))
    interrupted = partial.generate(prompts, 1, greedy, seeds(prompts))
    for batch in (static, interrupted):
        assert batch.response_ids.tolist() == [[W["a"], W["b"], END_OF_TEXT], [W["c"], EOT, PAD]]
        assert batch.eos.tolist() == [True, True]
    assert interrupted.versions.tolist() == [[0, 1, 1], [0, 1, 0]]  # the second phase began after the first token
    only_tokenizer_eos = FastGenerator(model, PAD, EOT).generate(prompts[:1], 1, greedy, seeds(prompts[:1]))
    assert only_tokenizer_eos.response_ids.tolist() == [[W["a"], W["b"], END_OF_TEXT, W["c"], EOT]]


def test_the_export_lists_every_eos_id_in_its_generation_config(instruct_dir):
    config = generation_config(load_model(instruct_dir), load_tokenizer(instruct_dir))
    assert (config.eos_token_id, config.pad_token_id) == ([EOT, END_OF_TEXT], PAD)


def test_truncation_error_names_the_prompt_its_length_the_limit_and_the_key(instruct_dir):
    tok = load_tokenizer(instruct_dir)
    with pytest.raises(InputError, match=r"^data\.max_prompt_len = 8: prompt chat-0 of rows\.jsonl has 9 tokens, more than "
                                         r"that; raise data\.max_prompt_len, or set data\.truncation=left .* or drop"):
        tokenize_prompts([PLAIN, CHAT], tok, cfg_for(instruct_dir, "data.max_prompt_len=8"), 64, "rows.jsonl")
    with pytest.raises(InputError, match=r"^rollout\.max_new_tokens = 6: prompt chat-0 of rows\.jsonl has 9 tokens, and "
                                         r"9 \+ 6 exceeds the model's context of 14 tokens \(max_position_embeddings\); "
                                         r"lower rollout\.max_new_tokens, or set data\.truncation"):
        tokenize_prompts([PLAIN, CHAT], tok, cfg_for(instruct_dir), 14, "rows.jsonl")
    held_out = cfg_for(instruct_dir, "eval.max_new_tokens=10")
    assert tokenize_prompts([CHAT], tok, held_out, 15, "test.jsonl").ids == [CHAT_IDS]  # 9 + 6 fits
    with pytest.raises(InputError, match=r"^eval\.max_new_tokens = 10: prompt chat-0 of test\.jsonl has 9 tokens, and 9 \+ 10"):
        tokenize_prompts([CHAT], tok, held_out, 15, "test.jsonl", held_out=True)
    with pytest.raises(InputError, match=r"^rollout\.max_new_tokens = 6: leaves no room for a prompt in the model's context "
                                         r"of 6 tokens"):
        tokenize_prompts([PLAIN], tok, cfg_for(instruct_dir, "data.truncation=left"), 6, "rows.jsonl")


def test_left_truncation_keeps_the_end_and_the_bos_and_is_counted(instruct_dir):
    tok = load_tokenizer(instruct_dir)
    tokens = tokenize_prompts([PLAIN, CHAT], tok, cfg_for(instruct_dir, "data.truncation=left"), 11, "rows.jsonl")  # 11 - 6: 5
    assert tokens.ids == [PLAIN_IDS, [BOS, W["plus"], W["two"], EOT, ASSISTANT]]
    assert (tokens.prompts, tokens.limit, tokens.truncated, tokens.dropped, tokens.longest) == ([PLAIN, CHAT], 5, 1, 0, 5)
    assert tokens.note("rows.jsonl") == ("data.truncation=left: 1 of 2 prompts of rows.jsonl were longer than 5 tokens "
                                         "and are cut to 5, keeping their end")
    char = build_char_tokenizer()  # no BOS: the last tokens only
    cut = tokenize_prompts([Prompt("0", "12345", "")], char, cfg_for(instruct_dir, "data.truncation=left", "data.max_prompt_len=3"),
                           64, "rows.jsonl")
    assert cut.ids == [char("345")["input_ids"]] and len(cut.ids[0]) == 3


def test_drop_leaves_the_long_prompts_out_and_counts_them(instruct_dir):
    tok = load_tokenizer(instruct_dir)
    cfg = cfg_for(instruct_dir, "data.truncation=drop", "data.max_prompt_len=8")
    other = Prompt("plain-1", "one plus two", "3")
    tokens = tokenize_prompts([PLAIN, CHAT, other], tok, cfg, 64, "rows.jsonl")
    assert (tokens.prompts, tokens.ids) == ([PLAIN, other], [PLAIN_IDS, [BOS, W["one"], W["plus"], W["two"]]])
    assert (tokens.truncated, tokens.dropped) == (0, 1)
    assert tokens.note("rows.jsonl") == ("data.truncation=drop: 1 of 3 prompts of rows.jsonl were longer than 8 tokens "
                                         "and are left out")
    with pytest.raises(InputError, match=r"^data\.truncation=drop: all 1 prompts of rows\.jsonl are longer than 8 tokens"):
        tokenize_prompts([CHAT], tok, cfg, 64, "rows.jsonl")


def test_the_dry_run_plan_counts_what_truncation_dropped(instruct_dir, tmp_path):
    from reasonrl.preflight import preflight

    rows = [{"prompt": CHAT.text, "ground_truth": "3"}, {"prompt": "what is x", "ground_truth": "1"},
            {"prompt": "one plus two", "ground_truth": "3"}]
    for name in ("train", "test"):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = cfg_for(instruct_dir, f"run.dir={tmp_path / 'run'}", f"data.source={tmp_path / 'train.jsonl'}",
                  f"data.test_source={tmp_path / 'test.jsonl'}", "data.max_prompt_len=8", "data.truncation=drop")
    plan = preflight(cfg)
    assert (plan.train_prompts, plan.test_prompts, plan.longest_prompt, plan.context) == (2, 2, 4, 64)
    assert (f"context      longest prompt 4 + rollout.max_new_tokens 6 <= 64 tokens; data.truncation=drop: 1 of 3 "
            f"prompts of {tmp_path / 'train.jsonl'} were longer than 8 tokens and are left out; data.truncation=drop: "
            f"1 of 3 prompts of {tmp_path / 'test.jsonl'} were longer") in plan.describe()
    with pytest.raises(InputError, match=r"^data\.max_prompt_len = 8: prompt 0 of .*train\.jsonl has 9 tokens"):
        preflight(cfg_for(instruct_dir, f"run.dir={tmp_path / 'run'}", f"data.source={tmp_path / 'train.jsonl'}",
                          f"data.test_source={tmp_path / 'test.jsonl'}", "data.max_prompt_len=8"))
