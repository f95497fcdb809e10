"""The reward worker: decode responses, grade them, shape the scores."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from reasonrl import algo
from reasonrl.config import Config
from reasonrl.models.loading import load_tokenizer
from reasonrl.reward.base import Grades, row_fields
from reasonrl.reward.episode import episode_grades
from reasonrl.reward.pool import RewardPool
from reasonrl.types import Prompt, RolloutBatch, ScoredBatch


class RewardWorker:
    """Grades rollouts with ``reward.fn`` (per data source ``reward.by_source``, plus the
    ``reward.format`` reward) in the workers ``workers`` starts (a
    :class:`~reasonrl.runtime.pool.PoolStart` of ``runtime.roles.reward``: processes or Ray
    actors, with a timeout per sample; None: in this process), then adds DAPO's soft overlong
    punishment.

    score = grade(decode(response), ground truth, row) + overlong_penalty(length)   (the
    penalty only with ``algo.overlong_buffer > 0``)

    Multi-turn episodes (``env.name``) are graded by their environment's return instead
    (:func:`~reasonrl.reward.episode.episode_grades`); their length is the whole trajectory's,
    so the overlong punishment measures it against ``env.max_tokens``.
    """

    def __init__(self, cfg: Config, model_dir: str | Path, workers: Callable[..., Any] | None = None) -> None:
        self.cfg = cfg
        self.tokenizer = load_tokenizer(model_dir)
        self.pool = RewardPool(cfg.reward, workers, cfg.resilience.reward_max_failures)

    def decode(self, rollout: RolloutBatch) -> list[str]:
        """The response texts, special tokens stripped."""
        return self.tokenizer.batch_decode(rollout.response_ids, skip_special_tokens=True)

    def grade(self, texts: list[str], prompts: list[Prompt]) -> Grades:
        """The reward function's grades of ``texts`` answering ``prompts`` (:class:`RewardPool`)."""
        return self.pool.score(texts, [p.ground_truth for p in prompts], [row_fields(p) for p in prompts])

    def score(self, rollout: RolloutBatch, prompts: list[Prompt]) -> ScoredBatch:
        """The scored batch: ``prompts`` has one entry per row."""
        texts = self.decode(rollout)
        grades = episode_grades(rollout.episodes) if rollout.episodes is not None else self.grade(texts, prompts)
        return self.assemble(rollout, prompts, texts, grades)

    def assemble(self, rollout: RolloutBatch, prompts: list[Prompt], texts: list[str], grades: Grades) -> ScoredBatch:
        """The ScoredBatch of graded rows, the overlong punishment added to the scores (and to
        each row's extras), on the rollout's device (grading runs on the host)."""
        device = rollout.response_mask.device
        scores, extras = grades.scores, grades.extras
        a = self.cfg.algo
        if a.overlong_buffer > 0:
            longest = self.cfg.env.max_tokens if rollout.episodes is not None else self.cfg.rollout.max_new_tokens
            penalty = algo.overlong_penalty(rollout.lengths.cpu(), longest, a.overlong_buffer, a.overlong_penalty)
            scores = scores + penalty
            extras = [{**x, "overlong_penalty": p} for x, p in zip(extras, penalty.tolist())]
        return ScoredBatch(rollout, prompts, texts, scores.to(device), grades.acc.to(device), grades.failed.to(device),
                           grades.errors, grades.preds, extras, grades.timed_out.to(device))

    def resize(self, count: int) -> None:
        """Grade with ``count`` reward workers from the next batch on (:meth:`RewardPool.resize`)."""
        self.pool.resize(count)

    def state_dict(self) -> dict:
        """``consecutive_failures``: failed samples in a row so far (the limit spans steps)."""
        return {"consecutive_failures": self.pool.consecutive_failures}

    def load_state_dict(self, state: dict) -> None:
        self.pool.consecutive_failures = int(state["consecutive_failures"])

    def close(self) -> None:
        """Stop the grading workers."""
        self.pool.close()
