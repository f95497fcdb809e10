"""Grades of multi-turn episodes: the environment already scored them.

An episode's record (``RolloutBatch.episodes``, written by the agent loop) holds its return
and whether it succeeded or failed; grading one is reading them::

    score = return           (env.reward=final: sum_t r_t; turn: sum_t env.gamma**t * r_t)
    acc   = success          (the terminal info's "success", else return > 0)

A failed episode (its environment raised, hung or broke the protocol) scores 0, is never
correct and carries its error; its action mask is already zero, so it trains nothing.
"""

from __future__ import annotations

from typing import Any

import torch

from reasonrl.reward.base import Grades


def episode_grades(episodes: list[dict[str, Any]]) -> Grades:
    """The grades of ``episodes`` (one record per row); ``extras`` hold each episode's
    ``turns`` and ``env_tokens`` (averaged into ``reward/turns`` and ``reward/env_tokens``)."""
    failed = [bool(e["failed"]) for e in episodes]
    return Grades(
        torch.tensor([0.0 if f else float(e["return"]) for e, f in zip(episodes, failed)], dtype=torch.float32),
        torch.tensor([bool(e["success"]) and not f for e, f in zip(episodes, failed)], dtype=torch.bool),
        torch.tensor(failed, dtype=torch.bool),
        [f"sample {i}: {e['error']}" for i, e in enumerate(episodes) if e["failed"]],
        ["success" if e["success"] else "[INVALID]" for e in episodes],
        [{"turns": e["turns"], "env_tokens": e["env_tokens"]} for e in episodes],
    )
