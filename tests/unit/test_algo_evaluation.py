"""Evaluation statistics by hand: maj@k and its tie rule, standard errors, pass@k, and the
per-source summary and validation metric names built on them."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from reasonrl.algo.evaluation import majority_vote, mean_stderr, pass_at_k
from reasonrl.config import load
from reasonrl.evaluation import ALL, Evaluation, ModelEvaluation, PromptResult, Stat, format_table, pass_sizes, results_json, summarize


def test_majority_vote_counts_answers_and_ignores_samples_without_one():
    assert majority_vote(["7", "5", "7", None], [False, True, False, False]) is False  # "7" wins 2 to 1
    assert majority_vote([None, "5", None, None, "7", "5"], [False, True, False, False, False, True]) is True
    assert majority_vote([None, None], [True, True]) is False  # nobody voted
    assert majority_vote([], []) is False


def test_majority_vote_tie_goes_to_the_answer_given_first():
    assert majority_vote(["3", "4", "4", "3"], [True, False, False, True]) is True  # 2-2: "3" came first
    assert majority_vote([None, "4", "3", "3", "4"], [False, False, True, True, False]) is False  # "4" first
    assert majority_vote(["9"], [True]) is True


def test_majority_vote_is_graded_by_the_winners_first_sample():
    assert majority_vote(["8", "8", "2"], [True, False, False]) is True
    assert majority_vote(["2", "8", "8"], [True, False, True]) is False


def test_majority_vote_needs_one_grade_per_answer():
    with pytest.raises(ValueError, match="2 answers but 1 grades"):
        majority_vote(["1", "2"], [True])


def test_mean_stderr_by_hand():
    # mean 0.5; s^2 = (4 * 0.25) / 3 = 1/3; stderr = sqrt(1/3) / sqrt(4)
    mean, stderr = mean_stderr([1.0, 0.0, 0.0, 1.0])
    assert mean == 0.5 and stderr == pytest.approx(math.sqrt(1 / 3) / 2)
    assert mean_stderr([0.25, 0.25, 0.25]) == (0.25, 0.0)
    assert mean_stderr([0.75]) == (0.75, None)  # one value: no spread to speak of
    with pytest.raises(ValueError, match="no values"):
        mean_stderr([])


def test_pass_sizes_are_powers_of_two_and_k_up_to_k():
    assert pass_sizes(1) == []
    assert pass_sizes(4) == [2, 4]
    assert pass_sizes(6) == [2, 4, 6]
    assert pass_sizes(64) == [2, 4, 8, 16, 32, 64]


def _results():
    """Three prompts of two sources, k = 4."""
    return [
        PromptResult("a", (True, False, False, True), ("5", "6", "6", "5"), True),   # maj: "5" (tie, first) right
        PromptResult("a", (False, False, False, False), (None, "1", None, "2"), False),
        PromptResult("b", (True, True, True, False), ("3", "3", "3", None), False),
    ]


def test_summarize_by_hand():
    s = summarize(_results(), 4)
    assert list(s) == ["mean@4", "pass@2", "pass@4", "maj@4", "greedy"]
    means = [0.5, 0.0, 0.75]
    assert s["mean@4"].mean == pytest.approx(1.25 / 3)
    sd = math.sqrt(sum((x - 1.25 / 3) ** 2 for x in means) / 2)
    assert s["mean@4"].stderr == pytest.approx(sd / math.sqrt(3))
    # pass@2 = 1 - C(4-c, 2) / C(4, 2): c=2 -> 1 - 1/6, c=0 -> 0, c=3 -> 1
    assert s["pass@2"].mean == pytest.approx((5 / 6 + 0 + 1) / 3)
    assert s["pass@2"].mean == pytest.approx(sum(pass_at_k(4, c, 2) for c in (2, 0, 3)) / 3)
    assert s["pass@4"].mean == pytest.approx(2 / 3)
    assert s["maj@4"].mean == pytest.approx(2 / 3)  # right, wrong ("1" first of a 1-1 tie), right
    assert s["greedy"] == Stat(pytest.approx(1 / 3), pytest.approx(math.sqrt(1 / 3) / math.sqrt(3)))


def test_summarize_leaves_out_greedy_without_greedy_grades():
    results = [PromptResult("a", (True,), ("1",))]
    assert list(summarize(results, 1)) == ["mean@1", "maj@1"]


def test_a_standard_error_over_one_prompt_is_undefined_in_json_and_in_the_table():
    # source "b" has one prompt (undefined), "a" two: c/k = 0.5 and 0.0, s = sqrt(0.125), stderr = s / sqrt(2) = 0.25
    cfg = load("recipes/grpo.yaml", [])
    results = results_json(cfg, [ModelEvaluation("m", Evaluation(4, _results(), []))], Path("samples.jsonl"))
    rows = {r["data_source"]: r for r in json.loads(json.dumps(results))["results"]}
    assert rows["b"]["prompts"] == 1 and rows["b"]["mean@4"] == {"mean": 0.75, "stderr": None}
    assert rows["a"]["mean@4"]["stderr"] == pytest.approx(0.25)
    table = {line.split()[1]: line for line in format_table(results).splitlines()[1:]}
    assert "0.750 ± n/a" in table["b"] and "0.250 ± 0.250" in table["a"]


def test_validation_metrics_keep_the_old_names_beside_the_per_source_ones():
    m = Evaluation(4, _results(), []).metrics()
    assert m["val/acc"] == pytest.approx(1.25 / 3) == m[f"val/{ALL}/acc/mean@4"]
    assert m["val/pass@2"] == m["val/all/acc/pass@2"] and m["val/pass@4"] == pytest.approx(2 / 3)
    assert m["val/acc/a"] == m["val/a/acc/mean@4"] == pytest.approx(0.25)
    assert m["val/acc/b"] == m["val/b/acc/mean@4"] == pytest.approx(0.75)
    assert m["val/a/acc/maj@4"] == 0.5 and m["val/b/acc/maj@4"] == 1.0 and m["val/all/acc/maj@4"] == pytest.approx(2 / 3)
    assert m["val/acc_greedy"] == m["val/all/acc/greedy"] == pytest.approx(1 / 3)
    assert m["val/a/acc/greedy"] == 0.5 and m["val/b/acc/pass@4"] == 1.0
    one_source = Evaluation(4, _results()[:2], []).metrics()
    assert not any(k.startswith("val/acc/") for k in one_source)  # val/acc/<source> only with several
    assert one_source["val/a/acc/mean@4"] == one_source["val/all/acc/mean@4"] == 0.25
