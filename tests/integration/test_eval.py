"""``reasonrl eval`` end to end with the embedded warm start: its numbers recounted by hand from
the samples it wrote, a run directory's checkpoint evaluated like the model it holds, and
MATH-500 rows of ../shared/data with a progress bar."""

from __future__ import annotations

import json
import math
from collections import Counter, defaultdict

import pytest

from reasonrl.checkpoint import CheckpointWriter
from reasonrl.cli import main
from reasonrl.config import dump, load
from reasonrl.models.loading import load_model
from reasonrl.warmstart.sft import ensure_warm_start
from reasonrl.samples import read_samples
from tests.conftest import shared


@pytest.fixture(scope="module")
def warm_start():
    """The embedded warm start (cached on disk; trained first where it is not)."""
    cfg = load(None)
    return ensure_warm_start(cfg.sft, cfg.data.families)


def _eval(capsys, *args):
    """``reasonrl eval ARGS --json``: (exit code, the JSON object on stdout, stderr)."""
    code = main(["eval", *args, "--json"])
    captured = capsys.readouterr()
    return code, json.loads(captured.out), captured.err


def _maj(preds: list[str], correct: list[bool]) -> bool:
    """Majority vote by hand: '[INVALID]' does not vote; a tie goes to the answer given first."""
    votes = Counter(p for p in preds if p != "[INVALID]")
    if not votes:
        return False
    top = max(votes.values())
    winner = next(p for p in preds if votes.get(p) == top)
    return correct[preds.index(winner)]


def _decisive_tie(preds: list[str], correct: list[bool]) -> bool:
    """Whether the top vote is a tie between a right and a wrong answer (the tie rule decides)."""
    votes = Counter(p for p in preds if p != "[INVALID]")
    tied = [p for p in votes if votes[p] == max(votes.values())]
    return len({correct[preds.index(p)] for p in tied}) > 1


def _stderr(values: list[float]) -> float:
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1) / len(values))


def test_eval_numbers_are_a_hand_count_of_the_samples_it_wrote(warm_start, tmp_path, capsys):
    out = tmp_path / "samples.jsonl"
    code, results, _ = _eval(capsys, "--limit", "12", "--out", str(out), "eval.k=5", "eval.batch_prompts=4",
                             "data.train_size=64", "run.progress=false")
    assert code == 0 and results["k"] == 5 and results["samples"] == str(out)
    records = read_samples(out)
    assert {r["split"] for r in records} == {"eval"} and {r["model"] for r in records} == {"embedded"}
    sampled = defaultdict(list)
    greedy = {}
    for r in records:
        if r["greedy"]:
            greedy[r["prompt_id"]] = r
        else:
            sampled[r["prompt_id"]].append(r)
    assert len(sampled) == len(greedy) == 12 and all(len(v) == 5 for v in sampled.values())
    assert all([r["sample"] for r in v] == [0, 1, 2, 3, 4] for v in sampled.values())
    by_source = defaultdict(list)
    for pid, rows in sampled.items():
        by_source[rows[0]["data_source"]].append(pid)
    by_source["all"] = list(sampled)
    rows = {r["data_source"]: r for r in results["results"]}
    assert list(rows) == ["embedded/add", "embedded/mul", "embedded/sum", "all"]
    for source, pids in by_source.items():
        correct = [[r["correct"] for r in sampled[p]] for p in pids]
        preds = [[r["pred"] for r in sampled[p]] for p in pids]
        mean = [sum(c) / 5 for c in correct]
        pass_j = {j: [1 - math.comb(5 - sum(c), j) / math.comb(5, j) for c in correct] for j in (2, 4)}
        pass5 = [float(any(c)) for c in correct]
        maj = [float(_maj(p, c)) for p, c in zip(preds, correct)]
        greedy_acc = [float(greedy[p]["correct"]) for p in pids]
        row = rows[source]
        assert row["prompts"] == len(pids)
        for name, values in (("mean@5", mean), ("pass@2", pass_j[2]), ("pass@4", pass_j[4]), ("pass@5", pass5),
                             ("maj@5", maj), ("greedy", greedy_acc)):
            assert row[name]["mean"] == pytest.approx(sum(values) / len(values)), (source, name)
            assert row[name]["stderr"] == pytest.approx(_stderr(values)), (source, name)
    whole = rows["all"]
    assert 0 < whole["mean@5"]["mean"] < 1 and 0 < whole["maj@5"]["mean"] < 1  # a count with both outcomes
    assert any(_decisive_tie([r["pred"] for r in v], [r["correct"] for r in v]) for v in sampled.values())


def test_eval_samples_do_not_depend_on_the_chunking(warm_start, tmp_path, capsys):
    # Prompt i samples with a seed of its own (run.seed and i): chunks of 4 or of 5 prompts give
    # the same samples, and a model's two evaluations the same numbers.
    runs = []
    for chunk in (4, 5):
        out = tmp_path / f"samples-{chunk}.jsonl"
        code, results, _ = _eval(capsys, "--limit", "10", "--out", str(out), "eval.k=3", f"eval.batch_prompts={chunk}",
                                 "data.train_size=64", "run.progress=false")
        assert code == 0
        records = [(r["prompt_id"], r["sample"], r["greedy"], r["response"]) for r in read_samples(out)]
        runs.append((records, [row for row in results["results"]]))
    (four, numbers4), (five, numbers5) = runs
    assert len(four) == 10 * 4 and four == five
    assert numbers4 == numbers5
    assert len({response for _, _, greedy, response in four if not greedy}) > 10  # sampled, not all alike


def test_a_run_directory_is_evaluated_from_its_checkpoint(warm_start, tmp_path, capsys):
    # A run whose only checkpoint (step 3, no final/) holds the warm start's own weights:
    # exported and evaluated, it answers greedily exactly as the warm start does.
    run = tmp_path / "run"
    dump(load(None, [f"run.dir={run}"]), run / "config.yaml")
    weights = {k: v.clone() for k, v in load_model(warm_start, "float32").state_dict().items()}
    CheckpointWriter(run / "checkpoints", keep=2).save(3, {"policy": weights}, {"policy": {"version": 3}})
    out = tmp_path / "samples.jsonl"
    code, results, _ = _eval(capsys, "--model", str(run), "--model", str(warm_start), "--limit", "6", "--out", str(out),
                             "eval.k=2", "data.train_size=64", "run.progress=false")
    assert code == 0
    checkpoint = str(run / "checkpoints" / "step_3")
    assert [(r["model"], r["data_source"]) for r in results["results"] if r["data_source"] == "all"] == [
        (checkpoint, "all"), (str(warm_start), "all")]
    records = read_samples(out)
    greedy = {m: [(r["prompt_id"], r["response"]) for r in records if r["greedy"] and r["model"] == m]
              for m in (checkpoint, str(warm_start))}
    assert len(greedy[checkpoint]) == 6 and greedy[checkpoint] == greedy[str(warm_start)]
    assert {r["step"] for r in records if r["model"] == checkpoint} == {3}  # its sampling is seeded by step 3


def test_eval_on_math500_rows_shows_a_progress_bar_and_keeps_stdout_for_the_table(warm_start, tmp_path, capsys):
    data = shared("math-benchmarks.jsonl")
    out = tmp_path / "math.jsonl"
    # The first MATH-500 rows fit the embedded model's 256-token context (the fifth does not).
    code = main(["eval", "--data", data, "--source", "MATH-500", "--limit", "4", "--out", str(out), "eval.k=2",
                 "eval.max_new_tokens=8", "data.max_prompt_len=240", "reward.fn=boxed"])
    captured = capsys.readouterr()
    assert code == 0
    assert "eval embedded" in captured.err and "4/4" in captured.err  # the bar: prompts done / total
    lines = captured.out.splitlines()
    assert lines[0].split()[:3] == ["model", "data_source", "prompts"]
    assert [line.split()[:3] for line in lines[1:3]] == [["embedded", "MATH-500", "4"], ["embedded", "all", "4"]]
    assert lines[-1] == f"samples: {out}" and "%|" not in captured.out
    records = read_samples(out)
    assert len(records) == 4 * 2 + 4 and {r["data_source"] for r in records} == {"MATH-500"}
    assert records[0]["prompt"].startswith("Convert the point $(0,3)$") and records[0]["length"] <= 8


def test_eval_refuses_what_it_cannot_evaluate(warm_start, tmp_path, capsys):
    assert main(["eval", "--model", str(tmp_path / "nowhere")]) == 2
    assert "--model " + str(tmp_path / "nowhere") + ": no such file or directory" in capsys.readouterr().err
    assert main(["eval", "--model", str(warm_start), "--step", "2"]) == 2
    assert "is a model directory, not a run directory" in capsys.readouterr().err
    assert main(["eval", "--step", "2"]) == 2
    assert "--step 2: give the run directory with --model RUN_DIR" in capsys.readouterr().err
    assert main(["eval", "--source", "nope", "data.train_size=64", "--out", str(tmp_path / "s.jsonl")]) == 2
    err = capsys.readouterr().err
    assert "--source nope: no row has that data_source (the data sources are: embedded/add, embedded/mul" in err
    assert main(["eval", "--limit", "2", "eval.max_new_tokens=250", "data.train_size=64", "--out", str(tmp_path / "s.jsonl")]) == 2
    assert "eval.max_new_tokens = 250: prompt test-0 of embedded has 8 tokens, and 8 + 250 exceeds" in capsys.readouterr().err
    assert not (tmp_path / "s.jsonl").exists()  # nothing is written before a model has been evaluated
