"""reward.fn=math_verify: answers compared by mathematical equivalence (the optional math-verify)."""

from __future__ import annotations

import sys
import threading
import time

import pytest

from reasonrl.errors import InputError
from reasonrl.reward import boxed_score, dapo_score, load_reward_fn
from reasonrl.reward.pool import RewardPool
from reasonrl.runtime.pool import PoolStart
from reasonrl.reward.verify import TIMEOUT_S

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
    """math-verify's alarms need the main thread; elsewhere the call runs without them."""
    fn, out = load_reward_fn("math_verify"), {}
    worker = threading.Thread(target=lambda: out.update(fn("Answer: \\frac{2}{4}", "0.5")))
    worker.start()
    worker.join(timeout=60)
    assert out["acc"] is True


def test_math_verify_in_reward_worker_processes():
    with RewardPool("math_verify", PoolStart("reward", 1, 30)) as pool:
        g = pool.score(["\\boxed{\\dfrac{1}{2}}", "Answer: 3"], ["0.5", "4"])
    assert g.acc.tolist() == [True, False] and g.scores.tolist() == [1.0, -1.0] and not g.failed.any()


def test_a_pathological_answer_returns_in_bounded_time_inside_a_worker_process():
    """A power tower that SymPy would evaluate for ever: math-verify's alarm (TIMEOUT_S, the
    worker's main thread) ends the comparison, the sample is wrong, not failed, and the worker
    scores the next one."""
    tower = "\\boxed{" + "9^{" * 12 + "9" + "}" * 12 + "}"
    with RewardPool("math_verify", PoolStart("reward", 1, 30)) as pool:
        start = time.monotonic()
        g = pool.score([tower, "\\boxed{2}"], ["1", "2"])
        elapsed = time.monotonic() - start
    assert g.acc.tolist() == [False, True] and not g.failed.any()
    assert elapsed < 3 * TIMEOUT_S + 5


def test_a_missing_math_verify_is_an_input_error_naming_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "math_verify", None)  # import math_verify raises ImportError
    with pytest.raises(InputError, match=r"reward.fn = 'math_verify' needs the math-verify package.*reasonrl\[math\]"):
        load_reward_fn("math_verify")
