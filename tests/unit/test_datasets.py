"""Loading prompt files (JSONL, verl/DAPO parquet) and rendering prompts."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from reasonrl.data.datasets import load_prompts, render_prompt
from reasonrl.types import Prompt

DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"


def shared(name: str) -> str:
    file = DATA / name
    if not file.is_file():
        pytest.skip(f"{file} is absent")
    return str(file)


def write_jsonl(path: Path, lines: list) -> str:
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return str(path)


# --- the real shared files -------------------------------------------------------------


def test_dapo_parquet():
    prompts = load_prompts(shared("dapo-aime-2024.parquet"))
    assert len(prompts) == 960
    first = prompts[0]
    assert first.id == "2" and first.ground_truth == "540" and first.data_source == "math_dapo"
    assert isinstance(first.text, list) and first.text[0]["role"] == "user"
    assert first.text[0]["content"].startswith("Solve the following math problem step by step.")
    assert first.extra["ability"] == "MATH"
    assert first.extra["extra_info"]["index"] == 2
    assert first.extra["reward_model"]["style"] == "rule-lighteval/MATH_v2"
    assert not any(k.startswith("__index_level_") for k in first.extra)
    assert len({p.id for p in prompts}) == 30
    assert all(p.ground_truth.isdigit() for p in prompts)


def test_math_benchmarks_jsonl():
    path = shared("math-benchmarks.jsonl")
    prompts = load_prompts(path)
    assert len(prompts) == 560
    first = prompts[0]
    assert first.id == "1" and first.ground_truth == "204" and first.data_source == "aime2024"
    assert first.text.startswith("Every morning, Aya does a $9$ kilometer walk")
    assert first.extra["domain"] == "math_rule"
    sources = [p.data_source for p in prompts]
    assert sources.count("MATH-500") == 500 and sources.count("aime2025") == 30

    chats = load_prompts(path, prompt_key="messages")
    assert [m["role"] for m in chats[0].text] == ["system", "user"]
    assert "\\boxed{}" in chats[0].text[0]["content"]
    assert chats[0].text[1]["content"] == first.text


def test_deepmath_jsonl():
    prompts = load_prompts(shared("deepmath-5k.jsonl"))
    assert len(prompts) == 4994
    assert prompts[0].ground_truth == "1" and prompts[0].data_source == "deepmath_103k"
    assert prompts[0].extra["difficulty"] == "4.5"


# --- layouts ----------------------------------------------------------------------------


def test_jsonl_verl_layout_and_number_answers(tmp_path):
    messages = [{"role": "user", "content": "1+1?"}]
    path = write_jsonl(
        tmp_path / "verl.jsonl",
        [
            {"data_source": "toy", "prompt": messages, "reward_model": {"ground_truth": 2}, "extra_info": {"index": 7}},
            "",
            {"prompt": "3/2?", "reward_model": {"ground_truth": 1.5}},
        ],
    )
    a, b = load_prompts(path)
    extra = {"reward_model": {"ground_truth": 2}, "extra_info": {"index": 7}}
    assert a == Prompt(id="7", text=messages, ground_truth="2", data_source="toy", extra=extra)
    assert b.id == "1" and b.text == "3/2?" and b.ground_truth == "1.5" and b.data_source == "verl"
    nested = write_jsonl(tmp_path / "nested.jsonl", [{"prompt": "6/2?", "answer": {"value": 3.0}}])
    (c,) = load_prompts(nested, answer_key="answer.value")
    assert c.ground_truth == "3" and c.id == "0"


def test_prompt_string_that_is_not_json_stays_text(tmp_path):
    path = write_jsonl(tmp_path / "t.jsonl", [{"prompt": "[Geometry] find x", "ground_truth": "1"}])
    assert load_prompts(path)[0].text == "[Geometry] find x"


def test_parquet_row_number_ids(tmp_path):
    path = tmp_path / "p.parquet"
    pq.write_table(pa.table({"prompt": ["a", "b"], "ground_truth": ["1", "2"]}), path)
    assert [(p.id, p.text, p.ground_truth, p.data_source) for p in load_prompts(str(path))] == [
        ("0", "a", "1", "p"),
        ("1", "b", "2", "p"),
    ]


# --- errors -----------------------------------------------------------------------------


def test_file_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.jsonl"):
        load_prompts(str(tmp_path / "missing.jsonl"))
    with pytest.raises(ValueError, match=r"data.csv: unsupported file type '.csv'; expected one of .jsonl, .parquet"):
        load_prompts(str(tmp_path / "data.csv"))
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    with pytest.raises(ValueError, match="empty.jsonl: the file has no rows"):
        load_prompts(str(empty))
    bad = tmp_path / "bad.parquet"
    bad.write_text("not parquet")
    with pytest.raises(ValueError, match="bad.parquet: cannot read as parquet"):
        load_prompts(str(bad))


@pytest.mark.parametrize(
    "lines, kwargs, message",
    [
        (['{"prompt": "a", "ground_truth": "1"}', "{not json"], {}, r"bad.jsonl line 2: invalid JSON"),
        (['{"prompt": "a", "ground_truth": "1"}', "[1, 2]"], {}, r"bad.jsonl line 2: expected a JSON object, got list"),
        (
            [{"question": "a", "ground_truth": "1"}],
            {},
            r"bad.jsonl line 1: field 'prompt' is missing; the row has fields \['ground_truth', 'question'\]",
        ),
        (
            [{"prompt": "a", "answer": "1"}],
            {},
            r"bad.jsonl line 1: field 'ground_truth' is missing \(also tried 'reward_model.ground_truth'\); "
            r"the row has fields \['answer', 'prompt'\]",
        ),
        ([{"prompt": "a", "ground_truth": None}], {}, r"line 1: field 'ground_truth' is null"),
        ([{"prompt": "a", "ground_truth": [1]}], {}, r"line 1: field 'ground_truth' is a list \(\[1\]\); expected a string"),
        ([{"prompt": 5, "ground_truth": "1"}], {}, r"line 1: field 'prompt' is a int; expected a string or a list"),
        (
            [{"prompt": [{"role": "user"}], "ground_truth": "1"}],
            {},
            r"line 1: field 'prompt' message 0 is \{'role': 'user'\}; expected a list of \{\"role\": str",
        ),
        (
            [{"messages": '[{"role": "user", "content": 3}]', "ground_truth": "1"}],
            {"prompt_key": "messages"},
            r"line 1: field 'messages' message 0 is",
        ),
        ([{"prompt": "[]", "ground_truth": "1"}], {}, r"line 1: field 'prompt' is an empty message list"),
    ],
)
def test_jsonl_row_errors(tmp_path, lines, kwargs, message):
    path = write_jsonl(tmp_path / "bad.jsonl", lines)
    with pytest.raises(ValueError, match=message):
        load_prompts(path, **kwargs)


def test_parquet_row_error_names_row(tmp_path):
    path = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"prompt": ["a", None], "ground_truth": ["1", "2"]}), path)
    with pytest.raises(ValueError, match=r"bad.parquet row 2: field 'prompt' is null"):
        load_prompts(str(path))


# --- rendering --------------------------------------------------------------------------


def tiny_tokenizer(chat_template: str | None):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({"[UNK]": 0, "hi": 1}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    wrapped = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]")
    wrapped.chat_template = chat_template
    return wrapped


CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]


def test_render_plain_text_prompt():
    assert render_prompt(Prompt(id="0", text="hi there", ground_truth="1"), tiny_tokenizer(None)) == "hi there"


def test_render_messages_without_template():
    text = render_prompt(Prompt(id="0", text=CHAT, ground_truth="1"), tiny_tokenizer(None))
    assert text == "system: Be brief.\nuser: hi\nassistant: "


def test_render_messages_with_chat_template():
    template = (
        "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}"
    )
    text = render_prompt(Prompt(id="0", text=CHAT, ground_truth="1"), tiny_tokenizer(template))
    assert text == "<system>Be brief.\n<user>hi\n<assistant>"
