"""The reward worker: decode responses, grade them, shape the scores."""

from __future__ import annotations

from pathlib import Path

import torch

from reasonrl import algo
from reasonrl.config import Config
from reasonrl.data.model import load_tokenizer
from reasonrl.reward.pool import RewardPool
from reasonrl.types import Prompt, RolloutBatch, ScoredBatch


class RewardWorker:
    """Scores rollouts with ``reward.fn`` in ``resilience.reward_workers`` processes (with a
    timeout per sample), then adds DAPO's soft overlong punishment.

    score = grade(decode(response), ground truth) + overlong_penalty(length)   (the penalty
    only with ``algo.overlong_buffer > 0``)
    """

    def __init__(self, cfg: Config, model_dir: str | Path) -> None:
        self.cfg = cfg
        self.tokenizer = load_tokenizer(model_dir)
        r = cfg.resilience
        self.pool = RewardPool(cfg.reward.fn, r.reward_workers, r.reward_timeout_s, r.reward_max_failures)

    def decode(self, rollout: RolloutBatch) -> list[str]:
        """The response texts, special tokens stripped."""
        return self.tokenizer.batch_decode(rollout.response_ids, skip_special_tokens=True)

    def grade(self, texts: list[str], ground_truths: list[str]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[str]]:
        """``(scores [B], acc [B], failed [B], errors)`` from the reward function (:class:`RewardPool`)."""
        return self.pool.score(texts, ground_truths)

    def shape(self, rollout: RolloutBatch, scores: torch.Tensor) -> torch.Tensor:
        """Scores plus the soft overlong punishment of the responses' lengths."""
        a = self.cfg.algo
        if a.overlong_buffer > 0:
            scores = scores + algo.overlong_penalty(rollout.lengths, self.cfg.rollout.max_new_tokens, a.overlong_buffer, a.overlong_penalty)
        return scores

    def score(self, rollout: RolloutBatch, prompts: list[Prompt]) -> ScoredBatch:
        """The scored batch: ``prompts`` has one entry per row."""
        texts = self.decode(rollout)
        scores, acc, failed, errors = self.grade(texts, [p.ground_truth for p in prompts])
        return self.assemble(rollout, prompts, texts, scores, acc, failed, errors)

    def assemble(self, rollout, prompts, texts, scores, acc, failed, errors) -> ScoredBatch:
        """The ScoredBatch of graded rows: scores shaped, moved to the rollout's device (grading runs on the host)."""
        device = rollout.response_mask.device
        scores, acc, failed = scores.to(device), acc.to(device), failed.to(device)
        return ScoredBatch(rollout, prompts, texts, self.shape(rollout, scores), acc, failed, errors)

    def state_dict(self) -> dict:
        """``consecutive_failures``: failed samples in a row so far (the limit spans steps)."""
        return {"consecutive_failures": self.pool.consecutive_failures}

    def load_state_dict(self, state: dict) -> None:
        self.pool.consecutive_failures = int(state["consecutive_failures"])

    def close(self) -> None:
        """Stop the grading processes."""
        self.pool.close()
