"""Evaluation of a policy on prompts: k samples and a greedy response each, graded, summed up
per data source. Validation during training and ``reasonrl eval`` are this one code path.

    evaluator = Evaluator(cfg, RolloutWorker(cfg, model_dir), RewardWorker(cfg, model_dir), prompts, ids)
    evaluator.run(step)       # {"val/acc": ..., "val/all/acc/mean@4": ..., ...}; .last_samples: its records
    evaluator.evaluate(step)  # an Evaluation: per-prompt results, sample records, summary(), metrics()
    evaluate_models(cfg, ["runs/dapo"], ["math.jsonl"], Path("samples.jsonl"))   # reasonrl eval

For a group of n prompts (one data source, or ``all``), prompt i with k samples of which c_i
are correct (eval.k at eval.temperature, eval.top_p, eval.top_k):

- ``mean@k``: mean over prompts of c_i / k (the avg@k of the literature);
- ``pass@j``: mean over prompts of the unbiased pass@j of (k, c_i), j in {2, 4, 8, ..., 64, k} up to k;
- ``maj@k``: mean over prompts of the majority vote over the extracted answers (``pred``;
  ``[INVALID]`` does not vote; ties to the answer given first: :func:`~reasonrl.algo.evaluation.majority_vote`);
- ``greedy``: mean over prompts of the greedy response's accuracy (with eval.greedy);

each with its standard error over the prompts (s / sqrt(n), :func:`~reasonrl.algo.evaluation.mean_stderr`;
undefined over one prompt: ``null`` in JSON, ``n/a`` in the table).
Validation logs them as ``val/<data_source>/acc/<metric>`` and ``val/all/acc/<metric>``, beside
``val/acc`` (= all mean@k), ``val/pass@j``, ``val/acc/<data_source>`` (with several sources) and
``val/acc_greedy``. Sampling never touches the training RNGs: prompt i (its index among the
evaluated prompts) samples with the group seed ``group_seed(combine(run.seed, VALIDATION), i)``
(:mod:`reasonrl.rollout.seeds`), the same at every step and whatever ``eval.batch_prompts``
chunks the prompts into, so two validations differ only by their weights.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
from tqdm import tqdm

from reasonrl.algo.evaluation import majority_vote, mean_stderr, pass_at_k
from reasonrl.checkpoint.export import export_model, select_checkpoint
from reasonrl.config import Config
from reasonrl.config.rules import env_workers, reward_workers
from reasonrl.models.loading import load_tokenizer, model_context
from reasonrl.warmstart import resolve_model_dir
from reasonrl.data.sources import TEST_SPLITS
from reasonrl.data.splits import read_prompts, tokenize_prompts
from reasonrl.env.splits import run_splits
from reasonrl.errors import InputError, InputNotFound
from reasonrl.reward.math import INVALID
from reasonrl.rollout.base import generate_for
from reasonrl.rollout.seeds import combine, group_seed
from reasonrl.runtime import setup_torch
from reasonrl.runtime.pool import PoolStart
from reasonrl.runtime.topology import reset_start
from reasonrl.samples import sample_records
from reasonrl.types import Prompt, SamplingParams
from reasonrl.workers import RewardWorker, RolloutWorker

VALIDATION = 0x7A11D
"""Mixed with ``run.seed`` into the seed of validation's groups (a stream apart from training's draws)."""

ALL = "all"
"""The group of every prompt, beside one group per data source."""


def pass_sizes(k: int) -> list[int]:
    """The j of the pass@j reported for k samples: 2, 4, 8, 16, 32, 64 and k, those up to k."""
    return sorted({2, 4, 8, 16, 32, 64, k} & set(range(2, k + 1)))


@dataclass(frozen=True)
class PromptResult:
    """One prompt's graded samples: each sample's correctness and extracted answer (None
    where it has none), and the greedy response's correctness (None without eval.greedy)."""

    data_source: str
    correct: tuple[bool, ...]
    answers: tuple[str | None, ...]
    greedy: bool | None = None


@dataclass(frozen=True)
class Stat:
    """A mean over prompts and its standard error (None over fewer than two prompts: undefined)."""

    mean: float
    stderr: float | None


def summarize(results: list[PromptResult], k: int) -> dict[str, Stat]:
    """``mean@k``, ``pass@j`` (:func:`pass_sizes`), ``maj@k`` and ``greedy`` (when every result
    has a greedy grade) of a group of prompts, each with its standard error over them."""
    per_prompt = {f"mean@{k}": [sum(r.correct) / k for r in results]}
    for j in pass_sizes(k):
        per_prompt[f"pass@{j}"] = [pass_at_k(k, sum(r.correct), j) for r in results]
    per_prompt[f"maj@{k}"] = [float(majority_vote(r.answers, r.correct)) for r in results]
    if results and all(r.greedy is not None for r in results):
        per_prompt["greedy"] = [float(r.greedy) for r in results]
    return {name: Stat(*mean_stderr(values)) for name, values in per_prompt.items()}


@dataclass
class Evaluation:
    """What one evaluation found: a result per prompt (in order), every sample record
    (:mod:`reasonrl.samples`; the k samples of each prompt, then the greedy ones, each with a
    ``greedy`` field), and ``k``."""

    k: int
    results: list[PromptResult]
    samples: list[dict[str, Any]]

    def sources(self) -> list[str]:
        """The data sources, in the order their first prompt comes."""
        return list(dict.fromkeys(r.data_source for r in self.results))

    def summary(self) -> dict[str, dict[str, Stat]]:
        """``{data_source: {metric: Stat}}`` for each data source, then ``all`` (:func:`summarize`)."""
        out = {s: summarize([r for r in self.results if r.data_source == s], self.k) for s in self.sources()}
        out[ALL] = summarize(self.results, self.k)
        return out

    def metrics(self) -> dict[str, float]:
        """The validation metrics of the module docstring (means only)."""
        summary = self.summary()
        whole = summary[ALL]
        out = {"val/acc": whole[f"mean@{self.k}"].mean}
        out.update({f"val/pass@{j}": whole[f"pass@{j}"].mean for j in pass_sizes(self.k)})
        if len(summary) > 2:  # several data sources
            out.update({f"val/acc/{s}": summary[s][f"mean@{self.k}"].mean for s in sorted(self.sources())})
        if "greedy" in whole:
            out["val/acc_greedy"] = whole["greedy"].mean
        for group, stats in summary.items():
            out.update({f"val/{group}/acc/{name}": stat.mean for name, stat in stats.items()})
        return out


class Evaluator:
    """Evaluates the first ``rows`` prompts (None: ``eval.n_prompts``) with ``rollout`` (a
    RolloutWorker: its current weights) and ``reward`` (a RewardWorker), in chunks of
    ``eval.batch_prompts`` prompts; see the module docstring for what it measures."""

    def __init__(self, cfg: Config, rollout, reward, prompts: list[Prompt], prompt_ids: list[list[int]],
                 rows: int | None = None) -> None:
        self.cfg = cfg
        self.rollout, self.reward = rollout, reward
        n = min(cfg.eval.n_prompts if rows is None else rows, len(prompts))
        self.prompts, self.prompt_ids = prompts[:n], prompt_ids[:n]
        self.last_samples: list[dict[str, Any]] = []
        """The sample records of the last :meth:`run`."""

    def run(self, step: int) -> dict[str, float]:
        """The validation metrics at ``step`` (:meth:`Evaluation.metrics`); the sample records
        (split ``val``) are kept in ``last_samples``."""
        evaluation = self.evaluate(step, "val")
        self.last_samples = evaluation.samples
        return evaluation.metrics()

    @torch.no_grad()
    def evaluate(self, step: int, split: str = "val", progress: Callable[[int], None] | None = None) -> Evaluation:
        """Sample, grade and (with eval.greedy) decode greedily every prompt, ``eval.batch_prompts``
        at a time, calling ``progress(prompts done in the chunk)`` after each chunk; the records
        are of ``split`` at ``step``."""
        e, k = self.cfg.eval, self.cfg.eval.k
        max_new = e.max_new_tokens or self.cfg.rollout.max_new_tokens
        sampled = SamplingParams(e.temperature, e.top_p, e.top_k, max_new)
        greedy = SamplingParams(0.0, max_new_tokens=max_new)
        base = combine(self.cfg.run.seed, VALIDATION)
        tokenizer = self.reward.tokenizer
        results, records, greedy_records = [], [], []
        for start in range(0, len(self.prompts), e.batch_prompts):
            prompts = self.prompts[start : start + e.batch_prompts]
            ids = self.prompt_ids[start : start + e.batch_prompts]
            seeds = [group_seed(base, start + i) for i in range(len(prompts))]
            scored = self.reward.score(generate_for(self.rollout, prompts, ids, k, sampled, seeds),
                                       [p for p in prompts for _ in range(k)])
            records += [{**r, "greedy": False} for r in sample_records(scored, tokenizer, split, step)]
            acc = scored.acc.view(len(prompts), k).tolist()
            answers = [None if a == INVALID else a for a in scored.preds]
            greedy_acc: list[bool | None] = [None] * len(prompts)
            if e.greedy:
                decoded = self.reward.score(generate_for(self.rollout, prompts, ids, 1, greedy, seeds), prompts)
                greedy_records += [{**r, "greedy": True} for r in sample_records(decoded, tokenizer, split, step)]
                greedy_acc = decoded.acc.tolist()
            results += [PromptResult(p.data_source, tuple(acc[i]), tuple(answers[i * k : (i + 1) * k]), greedy_acc[i])
                        for i, p in enumerate(prompts)]
            if progress is not None:
                progress(len(prompts))
        return Evaluation(k, results, records + greedy_records)


# ------------------------------------------------------------------------------ reasonrl eval
@dataclass(frozen=True)
class Dataset:
    """Prompts to evaluate on and where they come from (for messages)."""

    name: str
    prompts: list[Prompt]


@dataclass
class ModelEvaluation:
    """One model's evaluation: ``model`` names what was loaded (a model directory, a run's
    ``final/`` or one of its checkpoints)."""

    model: str
    evaluation: Evaluation


def read_datasets(cfg: Config, paths: list[str], sources: list[str], limit: int | None) -> list[Dataset]:
    """The prompts of each path (:func:`~reasonrl.data.splits.read_prompts`: the data.* column
    keys, a DatasetDict's test split, data.dedupe), or without paths the run's held-out split
    (:func:`~reasonrl.data.splits.read_splits`); only rows of ``sources`` when given, then the
    first ``limit`` rows of each (None: every row). InputError when no row is left."""
    d = cfg.data
    if paths:
        datasets = []
        for path in paths:
            datasets.append(Dataset(path, read_prompts([path], d, TEST_SPLITS)[0]))
    else:
        splits = run_splits(cfg, reset_start(cfg))
        datasets = [Dataset(splits.test_from, splits.test)]
    if sources:
        found = sorted({p.data_source for ds in datasets for p in ds.prompts})
        datasets = [Dataset(ds.name, [p for p in ds.prompts if p.data_source in sources]) for ds in datasets]
        if not any(ds.prompts for ds in datasets):
            raise InputError(f"--source {', '.join(sources)}: no row has that data_source "
                             f"(the data sources are: {', '.join(found)})")
    if limit is not None:
        if limit < 1:
            raise InputError(f"--limit {limit}: must be >= 1 (leave it out to evaluate every row)")
        datasets = [Dataset(ds.name, ds.prompts[:limit]) for ds in datasets]
    return [ds for ds in datasets if ds.prompts]


@dataclass(frozen=True)
class ModelSource:
    """A model to evaluate: its name in the results, the model directory to load, and the step
    its sample records carry (the checkpoint's; 0 for a model directory or a run's final/)."""

    name: str
    path: Path
    step: int


def resolve_model(spec: str, step: int | None, scratch: Path) -> ModelSource:
    """The model of ``--model spec``: a Hugging Face model directory, or a reasonrl run
    directory: its ``final/``, or with ``step`` its ``checkpoints/step_<step>`` (without a
    final/, its newest valid checkpoint), exported into a directory under ``scratch``.
    InputError / InputNotFound naming the path otherwise."""
    path = Path(spec)
    if not path.exists():
        raise InputNotFound(f"--model {spec}: no such file or directory")
    if (path / "config.yaml").is_file():  # a run directory
        final = path / "final"
        if step is None and (final / "config.json").is_file():
            return ModelSource(str(final), final, 0)
        checkpoint = select_checkpoint(path, step)
        number = int(checkpoint.name.removeprefix("step_"))
        out = scratch / f"model-{len(list(scratch.iterdir()))}"
        return ModelSource(str(checkpoint), export_model(path, out, number), number)
    if (path / "config.json").is_file():
        if step is not None:
            raise InputError(f"--step {step}: {spec} is a model directory, not a run directory with checkpoints")
        return ModelSource(str(path), path, 0)
    raise InputError(f"--model {spec}: neither a Hugging Face model directory (no config.json) nor a reasonrl "
                     "run directory (no config.yaml)")


def default_samples_path(root: Path = Path("eval_results")) -> Path:
    """``eval_results/eval-<UTC date>-<time>.jsonl``, with ``-2``, ``-3``... when taken."""
    stem = "eval-" + time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    path, n = root / f"{stem}.jsonl", 1
    while path.exists():
        n += 1
        path = root / f"{stem}-{n}.jsonl"
    return path


def evaluate_models(cfg: Config, models: list[str], data: list[str], out: Path, step: int | None = None,
                    sources: list[str] | None = None, limit: int | None = None,
                    log: Callable[[str], None] | None = None) -> list[ModelEvaluation]:
    """``reasonrl eval``: each model (:func:`resolve_model`; none given: model.path, the embedded
    warm start by default) on every row of the datasets (:func:`read_datasets`), with a progress
    bar on stderr (run.progress); every sample record (split ``eval``, with a ``model`` field)
    is written to ``out`` (JSON lines), each model's as soon as it is done."""
    log = log or _stderr
    if step is not None and not models:
        raise InputError(f"--step {step}: give the run directory with --model RUN_DIR")
    setup_torch(cfg.run.threads, cfg.run.deterministic)
    datasets = read_datasets(cfg, data, sources or [], limit)
    evaluations = []
    with tempfile.TemporaryDirectory(prefix="reasonrl-eval-") as scratch:
        for spec in models or [None]:
            source = (ModelSource(cfg.model.path, resolve_model_dir(cfg, log), 0) if spec is None
                      else resolve_model(spec, step, Path(scratch)))
            evaluation = _evaluate_model(cfg, source, datasets)
            out.parent.mkdir(parents=True, exist_ok=True)
            with out.open("a" if evaluations else "w", encoding="utf-8") as f:
                f.writelines(json.dumps({**record, "model": source.name}) + "\n" for record in evaluation.samples)
            evaluations.append(ModelEvaluation(source.name, evaluation))
    return evaluations


def _evaluate_model(cfg: Config, source: ModelSource, datasets: list[Dataset]) -> Evaluation:
    """Every prompt of ``datasets`` with the model of ``source``."""
    tokenizer = load_tokenizer(source.path)
    context = model_context(source.path)
    tokens = [tokenize_prompts(ds.prompts, tokenizer, cfg, context, ds.name, held_out=True) for ds in datasets]
    for note in (kept.note(ds.name) for ds, kept in zip(datasets, tokens)):
        if note:
            _stderr(note)
    prompts = [p for kept in tokens for p in kept.prompts]
    ids = [row for kept in tokens for row in kept.ids]
    roles = cfg.runtime.roles
    reward = RewardWorker(cfg, source.path, _processes("reward", reward_workers(cfg), roles.reward.timeout_s))
    try:
        rollout = RolloutWorker(cfg, source.path, env_workers=_processes("env", env_workers(cfg), roles.env.timeout_s))
        try:
            evaluator = Evaluator(cfg, rollout, reward, prompts, ids, rows=len(prompts))
            with tqdm(total=len(prompts), desc=f"eval {source.name}", unit="prompt", file=sys.stderr,
                      disable=not cfg.run.progress, dynamic_ncols=True) as bar:
                return evaluator.evaluate(source.step, "eval", bar.update)
        finally:
            rollout.close()
    finally:
        reward.close()


def _processes(role: str, count: int, timeout_s: float) -> PoolStart | None:
    """``count`` worker processes of ``role`` (``reasonrl eval`` runs on this machine), None for none."""
    return PoolStart(role, count, timeout_s) if count else None


def results_json(cfg: Config, evaluations: list[ModelEvaluation], samples: Path) -> dict[str, Any]:
    """The numbers of the table as one JSON object: the sampling settings, the samples file,
    and per model and data source (then ``all``) the prompt count and each metric's
    ``{"mean", "stderr"}`` (``stderr`` None over one prompt)."""
    e = cfg.eval
    rows = []
    for m in evaluations:
        counts = {s: sum(r.data_source == s for r in m.evaluation.results) for s in m.evaluation.sources()}
        counts[ALL] = len(m.evaluation.results)
        for group, stats in m.evaluation.summary().items():
            rows.append({"model": m.model, "data_source": group, "prompts": counts[group],
                         **{name: {"mean": s.mean, "stderr": s.stderr} for name, s in stats.items()}})
    return {"k": e.k, "temperature": e.temperature, "top_p": e.top_p, "top_k": e.top_k,
            "max_new_tokens": e.max_new_tokens or cfg.rollout.max_new_tokens, "greedy": e.greedy,
            "samples": str(samples), "results": rows}


def format_table(results: dict[str, Any]) -> str:
    """The rows of :func:`results_json` as a table: model, data source, prompts, then each
    metric as ``mean ± stderr`` (``n/a`` where the standard error is undefined)."""
    rows = results["results"]
    metrics = list(dict.fromkeys(name for r in rows for name in r if name not in ("model", "data_source", "prompts")))
    head = ["model", "data_source", "prompts", *metrics]
    body = [[r["model"], r["data_source"], str(r["prompts"]),
             *(f"{r[m]['mean']:.3f} ± {_error_text(r[m]['stderr'])}" if m in r else "-" for m in metrics)] for r in rows]
    widths = [max(len(line[i]) for line in [head, *body]) for i in range(len(head))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip() for line in [head, *body])


def _error_text(stderr: float | None) -> str:
    return "n/a" if stderr is None else f"{stderr:.3f}"


def _stderr(message: str) -> None:
    print(message, file=sys.stderr)
