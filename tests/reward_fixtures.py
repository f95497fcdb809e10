"""Reward functions for tests, loaded by import path (reward.fn=tests.reward_fixtures:NAME)."""

import hashlib


def coin(response: str, ground_truth: str) -> dict:
    """Correct for about half of all responses, decided by a hash of the text (deterministic)."""
    ok = hashlib.sha256(response.encode()).digest()[0] % 2 == 0
    return {"score": 1.0 if ok else -1.0, "acc": ok}


def never(response: str, ground_truth: str) -> dict:
    return {"score": -1.0, "acc": False}


def broken(response: str, ground_truth: str) -> dict:
    raise RuntimeError("broken reward function")
