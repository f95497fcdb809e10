"""Held-out evaluation over a rollout worker and a reward worker (no trainer needed).

    evaluator = Evaluator(cfg, RolloutWorker(cfg, model_dir), RewardWorker(cfg, model_dir), prompts, ids)
    evaluator.run(step)   # {"val/acc": ..., "val/pass@4": ..., "val/acc_greedy": ..., ...}

``reasonrl eval`` and the benchmarks build exactly this; training validates with the same
class over a rollout worker that holds the trainer's current weights.
"""

from __future__ import annotations

from collections import defaultdict

import torch

from reasonrl import algo
from reasonrl.config import Config
from reasonrl.data.model import load_tokenizer
from reasonrl.data.sft import resolve_model_dir
from reasonrl.data.splits import load_splits, tokenize_prompts
from reasonrl.runtime import setup_torch
from reasonrl.types import Prompt, SamplingParams
from reasonrl.workers import RewardWorker, RolloutWorker


class Evaluator:
    """Accuracy on the first ``eval.n_prompts`` held-out prompts.

    ``val/acc``: mean over ``eval.k`` samples at ``eval.temperature``; ``val/pass@j``: the
    unbiased pass@j for j in {2, 4, 8, 16, 32, 64, k} up to k; ``val/acc/<data_source>`` when
    there are several sources; ``val/acc_greedy`` with ``eval.greedy``. Sampling is seeded
    from ``run.seed`` and the step, so an evaluation never moves the training RNGs.
    """

    def __init__(self, cfg: Config, rollout, reward, prompts: list[Prompt], prompt_ids: list[list[int]]) -> None:
        self.cfg = cfg
        self.rollout, self.reward = rollout, reward
        n = min(cfg.eval.n_prompts, len(prompts))
        self.prompts, self.prompt_ids = prompts[:n], prompt_ids[:n]

    @torch.no_grad()
    def run(self, step: int) -> dict[str, float]:
        e, n = self.cfg.eval, len(self.prompts)
        k, max_new = e.k, self.cfg.rollout.max_new_tokens
        g = torch.Generator().manual_seed(self.cfg.run.seed * 1_000_003 + step)
        sampled = self.rollout.generate(self.prompt_ids, k, SamplingParams(e.temperature, max_new_tokens=max_new), g)
        acc = self.reward.score(sampled, [p for p in self.prompts for _ in range(k)]).acc.view(n, k)
        out = {"val/acc": acc.float().mean().item()}
        correct = acc.sum(-1).tolist()
        for j in sorted({2, 4, 8, 16, 32, 64, k} & set(range(2, k + 1))):
            out[f"val/pass@{j}"] = sum(algo.pass_at_k(k, c, j) for c in correct) / n
        by_source = defaultdict(list)
        for p, a in zip(self.prompts, acc.float().mean(-1).tolist()):
            by_source[p.data_source].append(a)
        if len(by_source) > 1:
            out.update({f"val/acc/{s}": sum(v) / len(v) for s, v in sorted(by_source.items())})
        if e.greedy:
            greedy = self.rollout.generate(self.prompt_ids, 1, SamplingParams(0.0, max_new_tokens=max_new), g)
            out["val/acc_greedy"] = self.reward.score(greedy, self.prompts).acc.float().mean().item()
        return out


def evaluate(cfg: Config, log=print) -> dict[str, float]:
    """Held-out accuracy of ``model.path`` on the run's held-out split, with no trainer: a
    rollout worker holding the model, a reward worker, an :class:`Evaluator`."""
    setup_torch(cfg.run.threads, cfg.run.deterministic)
    model_dir = resolve_model_dir(cfg, log)
    _, test = load_splits(cfg)
    ids = tokenize_prompts(test, load_tokenizer(model_dir), cfg.data.max_prompt_len, cfg.data.test_source or cfg.data.source)
    reward = RewardWorker(cfg, model_dir)
    try:
        return Evaluator(cfg, RolloutWorker(cfg, model_dir), reward, test, ids).run(0)
    finally:
        reward.close()
