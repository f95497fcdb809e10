"""Grading: row fields as keyword arguments, extra fields, rewards by data source, the format
reward, GSM8K's rule, and the same grades in reward worker processes."""

from __future__ import annotations

import sys
import threading

import pytest

from reasonrl.config import RewardConfig
from reasonrl.errors import InputError
from reasonrl.reward import Grader, gsm8k_score, score_batch
from reasonrl.reward.base import parse_by_source, row_fields
from reasonrl.reward.format import answer_line_format, boxed_format, format_rule, think_format
from reasonrl.reward.pool import RewardPool
from reasonrl.runtime.pool import PoolStart
from reasonrl.types import Prompt

ROWS = [{"data_source": "gsm8k", "extra_info": {"index": 7}, "ability": "math"},
        {"data_source": "math", "extra_info": {"index": 2}}]


def test_a_reward_function_gets_the_row_fields_its_signature_names():
    grader = Grader.from_config(RewardConfig(fn="tests.reward_fixtures:by_row"))
    right = grader.grade("gsm8k:7", "x", ROWS[0])
    assert (right.score, right.acc, right.pred, right.extras) == (1.0, True, "gsm8k:7", {"chars": 7})
    assert not grader.grade("gsm8k:2", "x", ROWS[1]).acc  # ability is not passed: by_row does not take it
    assert grader.grade("math:2", "x", ROWS[1]).acc


def test_kwargs_gets_every_field_and_positional_names_are_never_overridden():
    grader = Grader.from_config(RewardConfig(fn="tests.reward_fixtures:every_field"))
    g = grader.grade("r", "t", {**ROWS[0], "response": "clash", "ground_truth": "clash"})
    assert (g.score, g.pred) == (3.0, "ability,data_source,extra_info")
    assert row_fields(Prompt("1", "q", "3", "gsm8k", {"extra_info": {"index": 1}})) == {
        "extra_info": {"index": 1}, "data_source": "gsm8k"}


def test_rewards_by_data_source_and_the_format_reward_on_top():
    cfg = RewardConfig(fn="dapo", by_source=("gsm8k=gsm8k",), format="answer_line", format_score=0.25)
    grades = score_batch(Grader.from_config(cfg), ["so #### 1,000", "Answer: 12", "Answer: 12\nmore"],
                         ["1000", "12", "12"], [ROWS[0], ROWS[1], ROWS[1]])
    assert grades.scores.tolist() == [1.0, 1.25, 1.0]  # gsm8k rule; dapo + format; dapo, no format (last line)
    assert grades.preds == ["1000", "12", "12"]
    assert [x["format"] for x in grades.extras] == [0.0, 1.0, 0.0]


def test_reward_range_maps_the_builtin_scores_and_failures_onto_its_ends_before_the_format_reward():
    cfg = RewardConfig(fn="dapo", range=(0.0, 1.0), format="answer_line", format_score=0.25)
    grades = score_batch(Grader.from_config(cfg), ["Answer: 12", "Answer: 11", "12"], ["12", "12", "12"])
    assert grades.scores.tolist() == [1.25, 0.25, 0.0] and grades.acc.tolist() == [True, False, False]
    wide = Grader.from_config(RewardConfig(fn="dapo", range=(-2.0, 4.0)))
    assert [wide.grade(t, "12").score for t in ("Answer: 12", "Answer: 11")] == [4.0, -2.0]
    assert wide.rescale(0.0) == 1.0  # code's half-passed fraction: the middle of the range

    def broken(response, ground_truth):
        raise RuntimeError("no")

    failed = Grader(broken, score_range=(0.0, 1.0)).grade("Answer: 12", "12")
    assert (failed.score, failed.failed, failed.acc) == (0.0, True, False)  # the low end, not -1
    assert Grader(broken).grade("x", "12").score == -1.0  # the default range: FAILURE_SCORE


def test_a_reward_function_that_calls_sys_exit_fails_its_sample_not_the_run():
    def leaves(response, ground_truth):
        sys.exit(3)

    grades = score_batch(leaves, ["Answer: 12"], ["12"])
    assert grades.failed.tolist() == [True] and grades.scores.tolist() == [-1.0]
    assert grades.errors == ["sample 0: the reward function called sys.exit(3)"]


def test_a_keyboard_interrupt_from_a_reward_function_fails_its_sample_off_the_main_thread_only():
    grader = Grader.from_config(RewardConfig(fn="tests.reward_fixtures:interrupts"))
    with pytest.raises(KeyboardInterrupt):  # on the main thread it may be Ctrl-C: the run's to handle
        grader.grade("x", "1")
    seen = []
    thread = threading.Thread(target=lambda: seen.append(grader.grade("x", "1")))  # as the rollout producer grades
    thread.start()
    thread.join(10)
    assert [(g.failed, g.error) for g in seen] == [(True, "the reward function raised KeyboardInterrupt")]


@pytest.mark.parametrize("entries, message", [
    (("gsm8k",), "is not 'SOURCE=FN'"), (("=dapo",), "is not 'SOURCE=FN'"),
    (("a=dapo", "a=boxed"), "'a' is given twice"), (("a=nope",), "'nope': unknown name"),
])
def test_bad_by_source_entries_name_the_key(entries, message):
    with pytest.raises(InputError, match=message):
        Grader.from_config(RewardConfig(by_source=entries))


def test_by_source_parses_sources_containing_slashes_and_equals():
    assert parse_by_source(("openai/gsm8k=gsm8k", "a=b=boxed")) == {"openai/gsm8k": "gsm8k", "a=b": "boxed"}


@pytest.mark.parametrize("response, truth, acc, pred", [
    ("3 + 4 = 7\n#### 7", "7", True, "7"),
    ("#### $1,234.", "1234", True, "1234"),
    ("#### -3", "-3", True, "-3"),
    ("#### 72.0", "Natalia sold 48/2 = 24 clips...\n#### 72", True, "72.0"),
    ("#### 5 then #### 6", "5", False, "6"),
    ("the answer is 7", "7", False, "[INVALID]"),
    ("#### 7", "seven", False, "7"),
])
def test_gsm8k_rule(response, truth, acc, pred):
    out = gsm8k_score(response, truth)
    assert (out["acc"], out["pred"], out["score"]) == (acc, pred, 1.0 if acc else -1.0)


def test_format_rules():
    assert boxed_format("so \\boxed{3}") and not boxed_format("\\boxed{1} \\boxed{3}") and not boxed_format("3")
    assert answer_line_format("work\nAnswer: 4\n\n") and not answer_line_format("Answer: 4\nthen more")
    assert not answer_line_format("Answer:  ")
    assert think_format("<think>hmm</think> 4") and not think_format("<think>hmm</think>")
    assert not think_format("4 <think>hmm</think> 4")
    assert format_rule("re:^\\d+$")("42") and not format_rule("re:^\\d+$")("4x")
    with pytest.raises(InputError, match="reward.format: unknown rule 'json'"):
        format_rule("json")
    with pytest.raises(InputError, match="not a valid regular expression"):
        format_rule("re:(")


def test_worker_processes_grade_rows_like_this_process():
    cfg = RewardConfig(fn="tests.reward_fixtures:by_row", by_source=("math=dapo",), format="re:^gsm")
    texts, truths = ["gsm8k:7", "Answer: 2"], ["x", "2"]
    expected = score_batch(Grader.from_config(cfg), texts, truths, ROWS)
    with RewardPool(cfg, PoolStart("reward", 1, 30)) as pool:
        got = pool.score(texts, truths, ROWS)
    assert got.scores.tolist() == expected.scores.tolist() == pytest.approx([1.1, 1.0])
    assert got.preds == expected.preds == ["gsm8k:7", "2"]
    assert got.extras == expected.extras == [{"chars": 7, "format": 1.0}, {"format": 0.0}]


def test_a_reward_worker_process_runs_the_torch_threads_of_its_pool():
    cfg = RewardConfig(fn="tests.reward_fixtures:torch_threads")
    for threads in (1, 2):
        with RewardPool(cfg, PoolStart("reward", 1, 30, threads=threads)) as pool:
            assert pool.score(["a"], ["a"]).extras == [{"threads": threads}]
