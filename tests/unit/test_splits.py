"""The training and held-out splits of a run: data.test_source for every source, the embedded
split, a DatasetDict's test split, the held-out split by prompt that cannot overlap the training
rows, de-duplication, and the line that says how the split was made."""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

import pytest

from reasonrl.config import dump, load
from reasonrl.data.splits import dedupe, load_splits, prompt_identity, read_splits
from reasonrl.errors import InputError, InputNotFound
from reasonrl.preflight import check_data_files
from reasonrl.types import Prompt
from tests.conftest import shared


def cfg(*overrides: str):
    return load(None, list(overrides))


def write_jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def identities(prompts: list[Prompt]) -> set[str]:
    return {prompt_identity(p) for p in prompts}


# --- the held-out split by prompt -------------------------------------------------------------


def test_dapo_aime_holdout_puts_no_problem_in_both_splits():
    """The DAPO AIME file repeats each of its 30 problems 32 times: every copy of a held-out
    problem stays out of training, for every seed."""
    path = shared("dapo-aime-2024.parquet")
    picked = set()
    for seed in range(4):
        s = read_splits(cfg(f"data.source={path}", "data.holdout=5", f"data.seed={seed}"))
        assert len(s.test) == 5 and len(identities(s.test)) == 5
        assert not identities(s.test) & identities(s.train)
        assert not {p.id for p in s.test} & {p.id for p in s.train}  # extra_info.index: the problem
        assert len(s.train) == 960 - 5 * 32 and len({p.id for p in s.train}) == 25
        picked.add(frozenset(p.id for p in s.test))
        if seed == 0:
            assert s.description == (
                f"{path}: 800 training prompts, 5 held out (5 of its 30 distinct prompts, picked by a hash of the "
                "prompt text with data.seed = 0; their 155 other rows are not trained on: no prompt is in both splits)")
    assert len(picked) == 4  # each seed holds out other problems
    s = read_splits(cfg(f"data.source={path}", "data.holdout=5", "data.dedupe=true"))
    assert (len(s.train), len(s.test)) == (25, 5) and s.description.endswith("; data.dedupe dropped 930 repeated rows")


def copies_file(path: Path, seed: int) -> tuple[str, list[dict]]:
    """40 distinct prompts, each 1 to 4 times in random places, some copies with other whitespace."""
    rng = random.Random(seed)
    rows = []
    for i in range(40):
        for copy in range(rng.randint(1, 4)):
            text = f"What is {i} + {i}?" if copy % 2 == 0 else f"  What is {i}\t+ {i}? "
            rows.append({"id": f"{i}.{copy}", "prompt": text, "ground_truth": str(2 * i)})
    rng.shuffle(rows)
    return write_jsonl(path, rows), rows


@pytest.mark.parametrize("seed", range(5))
def test_holdout_cannot_overlap_and_partitions_the_rows(tmp_path, seed):
    path, rows = copies_file(tmp_path / "copies.jsonl", seed)
    s = read_splits(cfg(f"data.source={path}", "data.holdout=8", f"data.seed={seed}", "eval.n_prompts=3"))
    held = identities(s.test)
    assert len(s.test) == 8 == len(held) and not held & identities(s.train)
    problem = lambda p: p.id.split(".")[0]
    assert not {problem(p) for p in s.test} & {problem(p) for p in s.train}
    # The training rows are exactly the rows of the other 32 prompts, in file order; the held-out
    # rows are the first copy of each held-out prompt, in file order.
    assert [p.id for p in s.train] == [r["id"] for r in rows if " ".join(r["prompt"].split()) not in held]
    firsts: dict[str, str] = {}
    for r in rows:
        firsts.setdefault(r["id"].split(".")[0], r["id"])
    held_problems = {problem(p) for p in s.test}
    assert [p.id for p in s.test] == [first for i, first in firsts.items() if i in held_problems]
    # The documented rule: the 8 identities first by sha256("SEED\nTEXT").
    distinct = {" ".join(r["prompt"].split()) for r in rows}
    assert held == set(sorted(distinct, key=lambda t: hashlib.sha256(f"{seed}\n{t}".encode()).digest())[:8])
    # The same prompts in another order: the same held-out prompts.
    random.Random(99).shuffle(rows)
    again = read_splits(cfg(f"data.source={write_jsonl(tmp_path / 'shuffled.jsonl', rows)}", "data.holdout=8", f"data.seed={seed}"))
    assert identities(again.test) == held


def test_holdout_defaults_to_eval_n_prompts_and_keeps_half_for_training():
    path = shared("dapo-aime-2024.parquet")
    assert len(load_splits(cfg(f"data.source={path}", "eval.n_prompts=15"))[1]) == 15
    with pytest.raises(InputError, match=(
            rf"^data.source = '{path}' has 30 distinct prompts \(960 rows\): holding out eval.n_prompts = 128 "
            r"\(data.holdout = 0\) would leave 0 to train on, fewer than it holds out; lower data.holdout or give data.test_source$")):
        read_splits(cfg(f"data.source={path}"))
    with pytest.raises(InputError, match=r"holding out data.holdout = 16 would leave 14 to train on"):
        read_splits(cfg(f"data.source={path}", "data.holdout=16"))
    with pytest.raises(InputError, match=r"^data.holdout = -1: must be >= 0"):
        read_splits(cfg(f"data.source={path}", "data.holdout=-1"))


# --- explicit held-out data, the embedded source, lists --------------------------------------


def test_embedded_split_is_unchanged():
    s = read_splits(cfg("data.train_size=50", "data.test_size=10"))
    assert len(s.train) == 50 and len(s.test) == 10 and not identities(s.train) & identities(s.test)
    assert s.description == ("embedded: 50 training prompts, 10 held out "
                             "(the embedded test split, disjoint from training by a hash of each question)")


def test_test_source_is_honoured_beside_embedded(tmp_path):
    rows = [{"prompt": "2+2=?", "ground_truth": "4"}, {"prompt": "3+3=?", "ground_truth": "6"}, {"prompt": " 2+2=? ", "ground_truth": "4"}]
    path = write_jsonl(tmp_path / "held.jsonl", rows)
    s = read_splits(cfg("data.train_size=20", f"data.test_source={path}"))
    assert len(s.train) == 20 and all(p.data_source.startswith("embedded/") for p in s.train)
    assert [p.text for p in s.test] == ["2+2=?", "3+3=?", " 2+2=? "] and s.test_from == path
    assert s.description == (f"embedded: 20 training prompts, 3 held out (data.test_source {path}; its 3 rows hold 2 "
                             "distinct prompts (data.dedupe=true keeps one row of each))")
    s = read_splits(cfg("data.train_size=20", f"data.test_source={path}", "data.dedupe=true"))
    assert [p.text for p in s.test] == ["2+2=?", "3+3=?"]
    assert s.description == (f"embedded: 20 training prompts, 2 held out (data.test_source {path}); "
                             f"data.dedupe dropped 1 repeated rows of data.test_source")


def test_test_source_beside_files_reports_prompts_shared_with_training():
    deepmath, bench = shared("deepmath-5k.jsonl"), shared("math-benchmarks.jsonl")
    s = read_splits(cfg(f"data.source={deepmath}", f"data.test_source=[{bench}, {deepmath}]", "data.dedupe=true"))
    assert (len(s.train), len(s.test)) == (4990, 560 + 4990)
    assert s.description == (
        f"{deepmath}: 4990 training prompts, 5550 held out (data.test_source {bench}, {deepmath}; 4990 of its "
        "distinct prompts also occur in the training rows); data.dedupe dropped 4 repeated rows of data.source "
        "and 4 of data.test_source")


def test_a_list_of_sources_is_read_in_order(tmp_path):
    a = write_jsonl(tmp_path / "a.jsonl", [{"prompt": f"a{i}", "ground_truth": "1"} for i in range(6)])
    b = write_jsonl(tmp_path / "b.jsonl", [{"prompt": f"b{i}", "ground_truth": "2"} for i in range(4)])
    held = write_jsonl(tmp_path / "held.jsonl", [{"prompt": "h", "ground_truth": "3"}])
    s = read_splits(cfg(f"data.source=[{a}, {b}]", f"data.test_source={held}"))
    assert [p.text for p in s.train] == [f"a{i}" for i in range(6)] + [f"b{i}" for i in range(4)]
    assert [p.data_source for p in s.train] == ["a"] * 6 + ["b"] * 4
    assert s.train_from == f"{a}, {b}"
    s = read_splits(cfg(f"data.source={tmp_path}/[ab].jsonl", "data.holdout=2"))  # a glob
    assert len(s.train) == 8 and len(s.test) == 2
    with pytest.raises(InputError, match=r"embedded cannot be listed with data files"):
        read_splits(cfg(f"data.source=[embedded, {a}]"))


def test_dedupe_keeps_the_first_copy():
    rows = [Prompt("0", "x  y", "1"), Prompt("1", "z", "2"), Prompt("2", " x y\n", "1"),
            Prompt("3", [{"role": "user", "content": "z"}], "2"), Prompt("4", [{"role": "user", "content": " z"}], "2")]
    assert [p.id for p in dedupe(rows)] == ["0", "1", "3"]
    assert prompt_identity(rows[3]) == "user: z"


def test_a_saved_datasetdict_holds_out_its_test_split(tmp_path):
    import datasets

    rows = [{"prompt": f"q{i}", "ground_truth": str(i)} for i in range(10)]
    whole = datasets.Dataset.from_list(rows)
    folder = str(tmp_path / "dict")
    datasets.DatasetDict({"train": whole.select(range(7)), "validation": whole.select(range(7, 10))}).save_to_disk(folder)
    s = read_splits(cfg(f"data.source={folder}"))
    assert [p.text for p in s.train] == [f"q{i}" for i in range(7)] and [p.text for p in s.test] == ["q7", "q8", "q9"]
    assert s.description == f"{folder}:train: 7 training prompts, 3 held out (its 'validation' split)"
    assert s.train_from == f"{folder}:train" and s.test_from == f"{folder}:validation"
    s = read_splits(cfg(f"data.source={folder}:train", "data.holdout=2"))  # a split named: held out by prompt
    assert len(s.train) == 5 and "2 of its 7 distinct prompts" in s.description
    s = read_splits(cfg(f"data.source={folder}", f"data.test_source={folder}"))  # test_source: its validation split
    assert [p.text for p in s.test] == ["q7", "q8", "q9"]


# --- configuration and the checks before a run -----------------------------------------------


def test_sources_take_a_string_or_a_list(tmp_path):
    c = cfg("data.source=[a.jsonl, b.parquet]", "data.test_source=c.json")
    assert c.data.source == ("a.jsonl", "b.parquet") and c.data.test_source == "c.json"
    assert cfg("data.source=a.jsonl").data.source == "a.jsonl"
    dump(c, tmp_path / "config.yaml")
    assert load(tmp_path / "config.yaml") == c


def test_check_data_files_names_the_key_and_path(tmp_path):
    good = write_jsonl(tmp_path / "good.jsonl", [{"prompt": "a", "ground_truth": "1"}])
    check_data_files(cfg(f"data.test_source={good}"))
    with pytest.raises(InputNotFound, match=r"^data.source = '/nowhere/b.parquet': no such file"):
        check_data_files(cfg(f"data.source=[{good}, /nowhere/b.parquet]"))
    with pytest.raises(InputNotFound, match=r"^data.test_source = '.*/\*.parquet': no file matches this pattern"):
        check_data_files(cfg(f"data.test_source={tmp_path}/*.parquet"))
    with pytest.raises(InputError, match=r"^data.test_source = '.*': a directory without the dataset_dict.json"):
        check_data_files(cfg(f"data.test_source={tmp_path}"))
