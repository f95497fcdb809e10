"""Reward functions: rule-based math rewards, custom functions by import path, grading."""

from reasonrl.reward.base import FAILURE_SCORE, Grade, Grader, Grades, RewardFn, load_reward_fn, score_batch
from reasonrl.reward.math import boxed_score, dapo_score, gsm8k_score, normalize_final_answer

__all__ = [
    "FAILURE_SCORE",
    "Grade",
    "Grader",
    "Grades",
    "RewardFn",
    "boxed_score",
    "dapo_score",
    "gsm8k_score",
    "load_reward_fn",
    "normalize_final_answer",
    "score_batch",
]
