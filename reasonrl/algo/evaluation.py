"""Evaluation statistics over prompts with k graded samples each: pass@k, maj@k, standard errors.

Pure Python on numbers and strings (no config, no tensors needed).
"""

from __future__ import annotations

import math
from typing import Sequence


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are correct (Chen et al. 2021).

    pass@k = 1 - C(n - c, k) / C(n, k) = 1 - prod_{i = n-c+1}^{n} (1 - k / i),
    and 1 when n - c < k (every k-subset holds a correct sample).
    Needs 1 <= k <= n and 0 <= c <= n (ValueError otherwise).
    """
    if not 1 <= k <= n:
        raise ValueError(f"pass_at_k: need 1 <= k <= n, got k={k}, n={n}")
    if not 0 <= c <= n:
        raise ValueError(f"pass_at_k: need 0 <= c <= n, got c={c}, n={n}")
    if n - c < k:
        return 1.0
    prob_all_wrong = 1.0
    for i in range(n - c + 1, n + 1):
        prob_all_wrong *= 1.0 - k / i
    return 1.0 - prob_all_wrong


def majority_vote(answers: Sequence[str | None], correct: Sequence[bool]) -> bool:
    """maj@k of one prompt: whether the answer most of its k samples gave is correct.

    ``answers[i]`` is sample i's extracted answer, None where it has none (such a sample
    does not vote); ``correct[i]`` is its grade. Votes are counted by exact string equality:
    ``votes(a) = #{i : answers[i] == a}``. The winner is the answer with the most votes; a tie
    goes to the tied answer whose first sample comes first (the lowest i). The vote is correct
    when the winner's first sample is graded correct (samples with the same answer are graded
    alike by a reward function of the answer). No sample with an answer: not correct.
    """
    if len(answers) != len(correct):
        raise ValueError(f"majority_vote: {len(answers)} answers but {len(correct)} grades")
    votes: dict[str, int] = {}
    first: dict[str, int] = {}
    for i, answer in enumerate(answers):
        if answer is not None:
            votes[answer] = votes.get(answer, 0) + 1
            first.setdefault(answer, i)
    if not votes:
        return False
    winner = min(votes, key=lambda a: (-votes[a], first[a]))
    return bool(correct[first[winner]])


def mean_stderr(values: Sequence[float]) -> tuple[float, float | None]:
    """(mean, standard error of the mean) of per-prompt values x_1..x_n:

        mean = sum(x) / n,   stderr = s / sqrt(n),   s = sqrt(sum((x - mean)^2) / (n - 1))

    (s the sample standard deviation); stderr is None for n = 1 (s is undefined: one value
    says nothing of the spread). ValueError for n = 0.
    """
    n = len(values)
    if n == 0:
        raise ValueError("mean_stderr: no values")
    mean = sum(values) / n
    if n == 1:
        return mean, None
    var = sum((x - mean) ** 2 for x in values) / (n - 1)
    return mean, math.sqrt(var / n)
