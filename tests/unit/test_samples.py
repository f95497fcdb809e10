"""``reasonrl samples``: the kept samples of a run, filtered by step, split and correctness."""

from __future__ import annotations

import json

from reasonrl.cli import main
from reasonrl.samples import read_samples


def _record(step, split, prompt_id, correct):
    return {"step": step, "split": split, "prompt_id": prompt_id, "data_source": "embedded/add", "sample": 0,
            "prompt": "1+2=?\n", "response": f"work\nAnswer: {3 if correct else 4}", "ground_truth": "3",
            "pred": "3" if correct else "4", "score": 1.0 if correct else -1.0, "correct": correct, "length": 12,
            "truncated": not correct}


def _run(tmp_path):
    records = [_record(1, "train", "a", True), _record(1, "train", "b", False), _record(2, "train", "c", True),
               _record(2, "val", "d", False), _record(2, "val", "e", True)]
    (tmp_path / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return tmp_path


def test_samples_filters_and_prints_the_newest_step_by_default(tmp_path, capsys):
    run = _run(tmp_path)
    assert main(["samples", str(run)]) == 0
    out = capsys.readouterr().out
    assert [line.split()[:3] for line in out.splitlines() if line.startswith("step ")] == [
        ["step", "2", "train"], ["step", "2", "val"], ["step", "2", "val"]]
    assert "answer '4', truth '3', truncated" in out and "  response: work" in out and "            Answer: 4" in out

    assert main(["samples", str(run), "--step", "1", "--wrong", "--json"]) == 0
    [line] = capsys.readouterr().out.splitlines()
    assert json.loads(line)["prompt_id"] == "b"
    assert main(["samples", str(run), "--split", "val", "--right", "--json"]) == 0
    assert [json.loads(x)["prompt_id"] for x in capsys.readouterr().out.splitlines()] == ["e"]
    assert [r["prompt_id"] for r in read_samples(run / "samples.jsonl", correct=True)] == ["a", "c", "e"]


def test_samples_of_a_run_without_a_samples_file_is_a_usage_error(tmp_path, capsys):
    assert main(["samples", str(tmp_path)]) == 2
    assert "samples.jsonl: no such file; the run kept no samples" in capsys.readouterr().err
