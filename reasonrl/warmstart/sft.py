"""Supervised warm start of the embedded model, cached on disk by its settings.

The tiny model is trained on worked solutions of the embedded task until its greedy
accuracy on held-out problems reaches ``sft.target_acc`` (on purpose well below
perfect, so that reinforcement learning has room to improve it), then saved with its
tokenizer as a Hugging Face model directory under
``$REASONRL_CACHE/warmstart/<hash of the settings>/`` (:mod:`reasonrl.warmstart.cache`).
A second call with the same settings only returns the directory. The shipped environments
(``env.name`` grid, tool_arith) have warm starts of their own: :mod:`reasonrl.warmstart.env`,
which :func:`reasonrl.warmstart.resolve_model_dir` picks for them.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

import torch

from reasonrl.config import SFTConfig
from reasonrl.data import tasks
from reasonrl.models.loading import build_tiny_model
from reasonrl.data.tokenizer import build_char_tokenizer
from reasonrl.reward.math import dapo_score
from reasonrl.rollout.fast import FastGenerator
from reasonrl.types import SamplingParams
from reasonrl.warmstart.cache import build_once, warm_start_dir


def ensure_warm_start(cfg: SFTConfig, families: tuple[str, ...], log: Callable[[str], None] = print) -> Path:
    """The cached warm-start model directory, training it first if it is not there yet."""
    out = warm_start_dir(cfg, families)
    if not (out / "sft_summary.json").is_file():
        log(f"warm start: training the embedded model (cached in {out})")
    return build_once(out, lambda tmp: train_sft(cfg, families, tmp, log))


def greedy_accuracy(model, tokenizer, problems: list[tasks.Problem], max_new_tokens: int) -> float:
    """Fraction of problems whose greedy response earns the DAPO reward."""
    gen = FastGenerator(model, tokenizer.pad_token_id, tokenizer.eos_token_id)
    prompts = [tokenizer(p.question)["input_ids"] for p in problems]
    greedy = SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens)
    batch = gen.generate(prompts, 1, greedy, [0] * len(prompts))  # greedy: the seeds are not read
    texts = tokenizer.batch_decode(batch.response_ids, skip_special_tokens=True)
    return sum(dapo_score(t, str(p.answer))["acc"] for t, p in zip(texts, problems)) / len(problems)


def sft_model(cfg: SFTConfig, tokenizer):
    """The embedded Llama of ``sft.*``'s sizes and seed, freshly initialised, for ``tokenizer``."""
    return build_tiny_model(
        vocab_size=len(tokenizer),
        hidden_size=cfg.hidden_size,
        layers=cfg.layers,
        heads=cfg.heads,
        kv_heads=cfg.kv_heads,
        intermediate_size=cfg.intermediate_size,
        pad_id=tokenizer.pad_token_id,
        eos_id=tokenizer.eos_token_id,
        seed=cfg.seed,
    )


def sft_step(model, optimizer: torch.optim.Optimizer, input_ids: torch.Tensor, labels: torch.Tensor,
             attention_mask: torch.Tensor) -> torch.Tensor:
    """One supervised step: the mean cross-entropy of ``labels`` (-100: not trained), its
    gradient clipped to norm 1, an optimizer step; returns the loss."""
    model.train()
    loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    return loss


def train_sft(cfg: SFTConfig, families: tuple[str, ...], out_dir: Path, log: Callable[[str], None] = print) -> dict:
    """Train until greedy held-out accuracy >= cfg.target_acc (or cfg.max_steps); save to out_dir."""
    tokenizer = build_char_tokenizer()
    model = sft_model(cfg, tokenizer)
    train = tasks.generate(families, cfg.batch_size * cfg.max_steps // 4 + cfg.batch_size, cfg.seed, "train")
    held_out = tasks.generate(families, cfg.eval_size, cfg.seed + 1, "test")
    max_new = max(len(tokenizer(p.solution)["input_ids"]) for p in held_out) + 8
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
    gen = torch.Generator().manual_seed(cfg.seed)
    start, acc, step = time.time(), 0.0, 0
    for step in range(1, cfg.max_steps + 1):
        idx = torch.randint(len(train), (cfg.batch_size,), generator=gen).tolist()
        input_ids, labels, attn = _sft_batch([train[i] for i in idx], tokenizer)
        for group in opt.param_groups:
            group["lr"] = cfg.lr * min(1.0, step / 20)
        loss = sft_step(model, opt, input_ids, labels, attn)
        if step % cfg.eval_every == 0:
            acc = greedy_accuracy(model, tokenizer, held_out, max_new)
            log(f"warm start step {step}: loss {loss.item():.3f}, held-out greedy accuracy {acc:.3f}")
            if acc >= cfg.target_acc:
                break
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return {"steps": step, "greedy_acc": acc, "seconds": round(time.time() - start, 1), "params": sum(p.numel() for p in model.parameters())}


def _sft_batch(problems: list[tasks.Problem], tokenizer) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded prompt+solution+EOS ids, labels (-100 on prompt and padding), attention mask."""
    rows, label_rows = [], []
    for p in problems:
        q = tokenizer(p.question)["input_ids"]
        s = tokenizer(p.solution)["input_ids"] + [tokenizer.eos_token_id]
        rows.append(q + s)
        label_rows.append([-100] * len(q) + s)
    L = max(len(r) for r in rows)
    pad = tokenizer.pad_token_id
    input_ids = torch.tensor([r + [pad] * (L - len(r)) for r in rows])
    labels = torch.tensor([r + [-100] * (L - len(r)) for r in label_rows])
    attn = torch.tensor([[1] * len(r) + [0] * (L - len(r)) for r in rows])
    return input_ids, labels, attn
