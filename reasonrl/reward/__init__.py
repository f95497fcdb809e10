"""Reward functions: rule-based math rewards, custom functions by import path, batch scoring."""

from reasonrl.reward.base import FAILURE_SCORE, RewardFn, load_reward_fn, score_batch
from reasonrl.reward.math import boxed_score, dapo_score, normalize_final_answer

__all__ = [
    "FAILURE_SCORE",
    "RewardFn",
    "boxed_score",
    "dapo_score",
    "load_reward_fn",
    "normalize_final_answer",
    "score_batch",
]
