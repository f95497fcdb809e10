"""Loading prompt data (JSONL, JSON, verl/DAPO parquet, Arrow, saved Hugging Face datasets),
the column mapping, the errors that name file, row and field, and rendering prompts."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from reasonrl.data.datasets import load_prompts, render_prompt
from reasonrl.data.sources import TEST_SPLITS, entries, locate, source_name
from reasonrl.errors import InputError, InputNotFound
from reasonrl.types import Prompt
from tests.conftest import shared


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
    with pytest.raises(ValueError, match=r"data.csv: unsupported file type '.csv'; expected a .jsonl, .json, .parquet or .arrow file"):
        load_prompts(str(tmp_path / "data.csv"))
    with pytest.raises(InputNotFound, match=r"nowhere: no such file or directory"):
        load_prompts(str(tmp_path / "nowhere"))
    with pytest.raises(InputError, match=r"a directory without the dataset_dict.json or state.json .* '.*/\*.parquet'"):
        load_prompts(str(tmp_path))
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
        (
            [{"prompt": "1+1=", "ground_truth": "2"}, {"prompt": "x" * 1_000_001, "ground_truth": "1"}],
            {},
            r"line 2: field 'prompt' holds a prompt of 1,000,001 characters, more than the 1,000,000 a prompt may have",
        ),
        (
            [{"messages": [{"role": "system", "content": "s" * 600_000}, {"role": "user", "content": "u" * 400_001}],
              "ground_truth": "1"}],
            {"prompt_key": "messages"},
            r"line 1: field 'messages' holds a prompt of 1,000,001 characters",
        ),
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


# --- JSON, Arrow and saved Hugging Face datasets --------------------------------------------

ROWS = [
    {"id": "a", "prompt": "1+1?", "ground_truth": "2", "data_source": "toy", "level": 1},
    {"id": "b", "prompt": [{"role": "user", "content": "2+2?"}], "ground_truth": 4, "data_source": "toy", "level": 2},
]
EXPECTED = [
    Prompt(id="a", text="1+1?", ground_truth="2", data_source="toy", extra={"level": 1}),
    Prompt(id="b", text=[{"role": "user", "content": "2+2?"}], ground_truth="4", data_source="toy", extra={"level": 2}),
]


def test_json_array_and_json_lines(tmp_path):
    array = tmp_path / "array.json"
    array.write_text(json.dumps(ROWS, indent=2))
    assert load_prompts(str(array)) == EXPECTED
    lines = tmp_path / "lines.json"
    lines.write_text("\n".join(json.dumps(r) for r in ROWS) + "\n")
    assert load_prompts(str(lines)) == EXPECTED


@pytest.mark.parametrize(
    "text, message",
    [
        ('[\n  {"prompt": "a", "ground_truth": "1"},\n  {"prompt": "b",\n}]', r"bad.json line 4: invalid JSON .*expected a JSON array of row objects"),
        ('[{"prompt": "a", "ground_truth": "1"}, {"prompt": "b"}]', r"bad.json row 2: field 'ground_truth' is missing"),
        ('[{"prompt": "a", "ground_truth": "1"}, "b"]', r"bad.json row 2: expected a JSON object, got str"),
        ('{\n  "prompt": "a"\n}', r"bad.json line 1: invalid JSON .*expected a JSON array of row objects, or one JSON object per line"),
    ],
)
def test_json_errors_name_file_line_or_row(tmp_path, text, message):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(InputError, match=message):
        load_prompts(str(path))


@pytest.mark.parametrize("writer", [pa.ipc.new_stream, pa.ipc.new_file])
def test_arrow_stream_and_file(tmp_path, writer):
    table = pa.Table.from_pylist([{"prompt": "x", "answer": {"value": 7}}, {"prompt": "y", "answer": {"value": 8}}])
    path = tmp_path / "rows.arrow"
    with pa.OSFile(str(path), "wb") as sink, writer(sink, table.schema) as out:
        out.write_table(table)
    got = load_prompts(str(path), answer_key="answer.value")
    assert [(p.id, p.text, p.ground_truth, p.data_source) for p in got] == [("0", "x", "7", "rows"), ("1", "y", "8", "rows")]
    path.write_bytes(b"not arrow")
    with pytest.raises(InputError, match=r"rows.arrow: cannot read as Arrow IPC"):
        load_prompts(str(path))


@pytest.fixture(scope="module")
def hf(tmp_path_factory):
    """The DAPO parquet's first 40 rows written by Hugging Face datasets: a Dataset in 3
    shards, a DatasetDict (train: rows 0-29, test: rows 30-39), and to_json / to_parquet files."""
    import datasets  # the test extra's; the loader itself reads the files with pyarrow

    rows = pq.read_table(shared("dapo-aime-2024.parquet")).slice(0, 40).to_pylist()
    out = tmp_path_factory.mktemp("hf")
    data = datasets.Dataset.from_list(rows)
    data.save_to_disk(str(out / "dataset"), num_shards=3)
    datasets.DatasetDict({"train": data.select(range(30)), "test": data.select(range(30, 40))}).save_to_disk(str(out / "dict"))
    data.to_json(str(out / "rows.json"))
    data.to_parquet(str(out / "rows.parquet"))
    return out


def test_saved_datasets_read_as_the_parquet_they_came_from(hf):
    first = load_prompts(shared("dapo-aime-2024.parquet"))[:40]
    assert sorted(p.name for p in (hf / "dataset").glob("data-*.arrow")) == [f"data-0000{i}-of-00003.arrow" for i in range(3)]
    assert load_prompts(str(hf / "dataset")) == first
    assert load_prompts(str(hf / "rows.json")) == first
    assert load_prompts(str(hf / "rows.parquet")) == first
    assert load_prompts(str(hf / "dict")) == first[:30]  # the 'train' split
    assert load_prompts(str(hf / "dict"), prefer=TEST_SPLITS) == first[30:]
    assert load_prompts(f"{hf / 'dict'}:test") == first[30:]
    assert load_prompts(f"{hf / 'dict' / 'test'}") == first[30:]  # a split's directory is a saved Dataset


def test_saved_dataset_errors(hf, tmp_path):
    import datasets

    with pytest.raises(InputError, match=r"dict:dev: .*dict has no split 'dev'; its splits are \['train', 'test'\]"):
        load_prompts(f"{hf / 'dict'}:dev")
    with pytest.raises(InputError, match=r"dataset:train: .*dataset is a saved Dataset, which has no splits"):
        load_prompts(f"{hf / 'dataset'}:train")
    two = datasets.Dataset.from_list([{"prompt": "a", "ground_truth": "1"}])
    datasets.DatasetDict({"x": two, "y": two}).save_to_disk(str(tmp_path / "xy"))
    with pytest.raises(InputError, match=r"xy: a DatasetDict with splits \['x', 'y'\] and no 'train' split; name one as .*xy:SPLIT"):
        load_prompts(str(tmp_path / "xy"))
    assert load_prompts(f"{tmp_path / 'xy'}:y")[0].text == "a"
    bad = datasets.Dataset.from_list([{"prompt": "a", "ground_truth": "1"}, {"prompt": "b", "ground_truth": "2"},
                                      {"prompt": None, "ground_truth": "3"}])
    bad.save_to_disk(str(tmp_path / "bad"))
    with pytest.raises(InputError, match=r"bad/data-00000-of-00001.arrow row 3: field 'prompt' is null"):
        load_prompts(str(tmp_path / "bad"))
    (tmp_path / "bad" / "data-00000-of-00001.arrow").unlink()
    with pytest.raises(InputNotFound, match=r"bad/state.json: lists data-00000-of-00001.arrow, which is not there"):
        load_prompts(str(tmp_path / "bad"))


# --- column mapping -----------------------------------------------------------------------


def test_column_mapping_id_and_source_keys(tmp_path):
    rows = [{"uid": 11, "q": {"text": "1+1?"}, "a": "2", "bench": "gsm8k", "id": "x"},
            {"uid": 12, "q": {"text": "2+3?"}, "a": "5", "bench": "math", "id": "y"}]
    path = write_jsonl(tmp_path / "mapped.jsonl", rows)
    got = load_prompts(path, prompt_key="q.text", answer_key="a", id_key="uid", source_key="bench")
    assert got == [
        Prompt(id="11", text="1+1?", ground_truth="2", data_source="gsm8k", extra={"q": {"text": "1+1?"}, "id": "x"}),
        Prompt(id="12", text="2+3?", ground_truth="5", data_source="math", extra={"q": {"text": "2+3?"}, "id": "y"}),
    ]
    with pytest.raises(InputError, match=r"mapped.jsonl line 1: field 'key' is missing; the row has fields"):
        load_prompts(path, prompt_key="q.text", answer_key="a", id_key="key")
    with pytest.raises(InputError, match=r"mapped.jsonl line 1: field 'uid' is a int \(11\); expected a string naming the data source"):
        load_prompts(path, prompt_key="q.text", answer_key="a", source_key="uid")


def test_parquet_column_errors_name_the_row(tmp_path):
    path = tmp_path / "verl.parquet"
    pq.write_table(pa.table({"prompt": ["a", "b", "c"], "reward_model": [{"ground_truth": "1"}, {"ground_truth": "2"}, None]}), path)
    with pytest.raises(InputError, match=r"verl.parquet row 3: field 'ground_truth' is missing \(also tried 'reward_model.ground_truth'\)"):
        load_prompts(str(path))


# --- data paths (reasonrl.data.sources) ------------------------------------------------------


def test_entries_expand_lists_and_globs(tmp_path):
    for name in ("b.jsonl", "a.jsonl", "c.parquet"):
        (tmp_path / name).write_text("")
    assert entries("", "data.test_source") == []
    assert entries("embedded", "data.source") == ["embedded"]
    assert entries((str(tmp_path / "*.jsonl"), "x.parquet"), "data.source") == [
        str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl"), "x.parquet"]
    with pytest.raises(InputNotFound, match=r"data.source = '.*/\*.json': no file matches this pattern"):
        entries(str(tmp_path / "*.json"), "data.source")
    assert source_name(("a", "b", "c")) == "a, b, c" and source_name(("a", "b", "c", "d")) == "a, b and 2 more"


def test_locate_names_the_key(tmp_path):
    assert locate(shared("deepmath-5k.jsonl")).kind == "jsonl"
    with pytest.raises(InputNotFound, match=r"^data.test_source = '/nowhere/x.parquet': no such file \(expected a .jsonl"):
        locate("/nowhere/x.parquet", "data.test_source")
    with pytest.raises(InputError, match=r"^data.source = '.*/a.txt': unsupported file type '.txt'"):
        (tmp_path / "a.txt").write_text("")
        locate(str(tmp_path / "a.txt"), "data.source")


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
