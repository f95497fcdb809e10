"""reward.fn=math_verify: answers compared by mathematical equivalence (the optional math-verify)."""

from __future__ import annotations

import sys
import threading

import pytest

from reasonrl.config import load
from reasonrl.config.rules import reward_workers
from reasonrl.errors import InputError
from reasonrl.reward import FAILURE_SCORE, boxed_score, dapo_score, load_reward_fn
from reasonrl.reward.pool import RewardPool
from reasonrl.runtime.pool import PoolStart
from reasonrl.runtime.topology import plan as plan_topology

TOWER = "\\boxed{" + "9^{" * 12 + "9" + "}" * 12 + "}"
"""A power tower SymPy evaluates for ever (minutes here), holding the interpreter's lock."""

pytest.importorskip("math_verify")


@pytest.mark.parametrize(
    "response, truth, acc",
    [
        # The MATH-500 forms the string rules get wrong:
        ("so the answer is $\\boxed{\\dfrac{1}{2}}$", "\\frac{1}{2}", True),
        ("Answer: 0.5", "1/2", True),
        ("$\\boxed{\\left(3, \\frac{\\pi}{2}\\right)}$", "(3,\\frac{\\pi}{2})", True),
        ("The answer is \\boxed{C}", "\\text{(C)}", True),
        ("Natalia sold 48 + 24 = 72 clips.\n#### 72", "72", True),  # GSM8K
        ("... so $x = \\boxed{2\\sqrt{2}}$", "\\sqrt{8}", True),
        # intervals, sets, units and trailing text, negatives, percentages, decimals:
        ("\\boxed{(-\\infty, 3]}", "(-\\infty,3]", True),
        ("\\boxed{(-\\infty, 3)}", "(-\\infty,3]", False),
        ("\\boxed{\\{1, 2\\}}", "\\{2,1\\}", True),
        ("\\boxed{\\{1, 3\\}}", "\\{2,1\\}", False),
        ("\\boxed{5\\text{ cm}}", "5", True),
        ("The answer is \\boxed{12} dollars.", "12", True),
        ("\\boxed{-3}", "-3", True),
        ("\\boxed{3}", "-3", False),
        ("\\boxed{-\\frac{1}{2}}", "\\frac{1}{2}", False),
        ("\\boxed{50\\%}", "50", True),
        ("\\boxed{10\\%}", "10\\%", True),
        ("\\boxed{0.25}", "\\frac14", True),
        ("\\boxed{\\frac{3}{4}}", "3/4", True),
        ("\\boxed{1,000}", "1000", True),
        ("Answer: 6", "5", False),
        ("\\boxed{\\frac{1}{3}}", "0.33", False),
        ("I do not know.", "7", False),
    ],
)
def test_math_verify_recognises_equal_answers_the_string_rules_miss(response, truth, acc):
    fn = load_reward_fn("math_verify")
    result = fn(response, truth)
    assert result["acc"] is acc and result["score"] == (1.0 if acc else -1.0) and isinstance(result["pred"], str)


def test_the_string_rules_really_miss_them():
    """The reason math_verify exists (reward.fn docs): boxed and dapo compare strings."""
    assert not boxed_score("$\\boxed{\\left(3, \\frac{\\pi}{2}\\right)}$", "(3,\\frac{\\pi}{2})")["acc"]
    assert not dapo_score("Answer: 0.5", "1/2")["acc"]


def test_math_verify_outside_the_main_thread_still_scores():
    fn, out = load_reward_fn("math_verify"), {}
    worker = threading.Thread(target=lambda: out.update(fn("Answer: \\frac{2}{4}", "0.5")))
    worker.start()
    worker.join(timeout=60)
    assert out["acc"] is True


def test_math_verify_in_reward_worker_processes():
    with RewardPool("math_verify", PoolStart("reward", 1, 30)) as pool:
        g = pool.score(["\\boxed{\\dfrac{1}{2}}", "Answer: 3"], ["0.5", "4"])
    assert g.acc.tolist() == [True, False] and g.scores.tolist() == [1.0, -1.0] and not g.failed.any()


def test_a_400_term_chain_is_right_in_the_main_thread_too():
    """x=x=...=x (400 terms) takes about 3 s to compare here: math-verify's own 3 s alarm, armed
    on a main thread only, made it right or wrong by the machine's load. With no alarm it is
    right on the main thread as on any other."""
    result = load_reward_fn("math_verify")("\\boxed{" + "=".join(["x"] * 400) + "}", "x")
    assert result["acc"] is True and result["score"] == 1.0


def test_a_hostile_answer_is_cut_at_the_time_limit_when_graded_off_the_main_thread():
    """The tower, graded by a pool driven from a thread (as the rollout producer does): its
    worker is killed at the 2 s limit, the sample is a failure counted as a timeout (twice
    alike), and the replaced worker grades the next sample."""
    out = {}

    def grade() -> None:
        with RewardPool("math_verify", PoolStart("reward", 1, 2)) as pool:
            out["first"] = pool.score([TOWER, "\\boxed{2}"], ["1", "2"])
            out["again"] = pool.score([TOWER], ["1"])

    worker = threading.Thread(target=grade)
    worker.start()
    worker.join(timeout=120)
    assert not worker.is_alive()
    first, again = out["first"], out["again"]
    assert first.scores.tolist() == [FAILURE_SCORE, 1.0] and first.acc.tolist() == [False, True]
    assert first.failed.tolist() == [True, False] and first.timed_out.tolist() == [True, False]
    assert first.errors == ["sample 0: reward[0]: timeout after 2s"]
    assert again.scores.tolist() == [FAILURE_SCORE] and again.timed_out.tolist() == [True]


def test_math_verify_and_import_path_functions_get_a_worker_per_pool_even_at_count_0_and_the_rules_none():
    math = load(None, ["reward.fn=math_verify"])
    assert reward_workers(math) == 1
    assert (plan_topology(math)["reward"].where, plan_topology(math)["reward"].pools) == ("process", 2)
    by_source = load(None, ["reward.by_source=[a=gsm8k,b=math_verify]"])
    assert reward_workers(by_source) == 1 and plan_topology(by_source)["reward"].detail.startswith("math_verify: ")
    for rule in ("dapo", "boxed", "gsm8k", "code"):
        cfg = load(None, [f"reward.fn={rule}"])
        assert reward_workers(cfg) == 0 and "a rule that ends in bounded time" in plan_topology(cfg)["reward"].detail
    custom = load(None, ["reward.fn=tests.reward_fixtures:coin"])
    assert reward_workers(custom) == 1  # the user's code: only a process killed at its deadline bounds it
    planned = plan_topology(custom)["reward"]
    assert (planned.where, planned.pools) == ("process", 2) and planned.detail.startswith("tests.reward_fixtures:coin: ")
    assert reward_workers(load(None, ["reward.fn=math_verify", "runtime.roles.reward.count=3"])) == 3


def test_a_missing_math_verify_is_an_input_error_naming_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "math_verify", None)  # import math_verify raises ImportError
    with pytest.raises(InputError, match=r"reward.fn = 'math_verify' needs the math-verify package.*reasonrl\[math\]"):
        load_reward_fn("math_verify")
