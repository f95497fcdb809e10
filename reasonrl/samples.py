"""Generated samples kept as JSON lines: what the model wrote and how it was graded.

One record per sample::

    {"step": 12, "split": "train", "prompt_id": "train-7", "data_source": "embedded/add",
     "sample": 0, "prompt": "47+38=?\\n", "response": "7+8=15\\n...Answer: 85",
     "ground_truth": "85", "pred": "85", "score": 1.0, "correct": true,
     "length": 21, "truncated": false, "format": 1.0, "overlong_penalty": 0.0, ...}

``split`` is ``train`` (the update's batch), ``val`` (a validation during training) or
``eval`` (``reasonrl eval``); ``sample`` is the sample's index among its prompt's samples;
``score`` is the reward the update used (shaping included); the reward function's extra
fields follow. Validation and ``eval`` records also say ``greedy`` (true for each prompt's
greedy decode, which comes after its k samples). A run keeps them in ``RUN_DIR/samples.jsonl`` (``run.keep_samples`` per
training step, every validation sample); ``reasonrl samples RUN_DIR`` prints them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

from reasonrl.metrics import read_jsonl
from reasonrl.types import ScoredBatch

SPLITS = ("train", "val", "eval")


def sample_records(scored: ScoredBatch, tokenizer, split: str, step: int, rows: Iterable[int] | None = None) -> list[dict[str, Any]]:
    """The records of ``rows`` of the batch (all rows when None): the prompt decoded as the
    model saw it (chat template applied, special tokens dropped), the response as graded."""
    if split not in SPLITS:
        raise ValueError(f"sample_records: split {split!r} is not one of {SPLITS}")
    r = scored.rollout
    rows = range(scored.size) if rows is None else list(rows)
    group_ids, lengths, truncated = r.group_ids.tolist(), r.lengths.tolist(), r.truncated.tolist()
    seen: dict[int, int] = {}
    index_in_group = []
    for g in group_ids:
        index_in_group.append(seen.get(g, 0))
        seen[g] = seen.get(g, 0) + 1
    prompt_text: dict[int, str] = {}
    out = []
    for row in rows:
        g, p = group_ids[row], scored.prompts[row]
        if g not in prompt_text:
            ids = r.prompt_ids[row][r.prompt_mask[row].bool()].tolist()
            prompt_text[g] = tokenizer.decode(ids, skip_special_tokens=True)
        out.append({
            "step": step, "split": split, "prompt_id": p.id, "data_source": p.data_source,
            "sample": index_in_group[row], "prompt": prompt_text[g], "response": scored.texts[row],
            "ground_truth": p.ground_truth, "pred": scored.preds[row], "score": float(scored.scores[row]),
            "correct": bool(scored.acc[row]), "length": int(lengths[row]), "truncated": bool(truncated[row]),
            **({"failed": True} if bool(scored.failed[row]) else {}),
            **scored.extras[row],
        })
    return out


def read_samples(path: str | Path, step: int | None = None, split: str | None = None,
                 correct: bool | None = None) -> list[dict[str, Any]]:
    """The records of a samples file, filtered by step, split and correctness (None: any)."""
    return [r for r in read_jsonl(Path(path))
            if (step is None or r["step"] == step) and (split is None or r["split"] == split)
            and (correct is None or r["correct"] == correct)]


def format_samples(records: list[dict[str, Any]], width: int = 100) -> str:
    """Records for the terminal: a header line per sample, then its prompt and response."""
    blocks = []
    for r in records:
        head = (f"step {r['step']} {r['split']} {r['prompt_id']} ({r['data_source']}) sample {r['sample']}: "
                f"{'right' if r['correct'] else 'wrong'}, score {r['score']:+.3f}, answer {r['pred']!r}, "
                f"truth {r['ground_truth']!r}" + (", truncated" if r["truncated"] else ""))
        blocks.append("\n".join([head, _indent("prompt", r["prompt"], width), _indent("response", r["response"], width)]))
    return "\n\n".join(blocks)


def _indent(label: str, text: str, width: int) -> str:
    lines = text.splitlines() or [""]
    shown = [line if len(line) <= width else line[: width - 3] + "..." for line in lines]
    return "\n".join(f"  {label + ':' if i == 0 else '':<10}{line}" for i, line in enumerate(shown))
