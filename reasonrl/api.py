"""The Python API: what ``reasonrl train`` and ``reasonrl eval`` do, from a script or a notebook.

    import reasonrl

    cfg = reasonrl.Config.load("dapo", ["train.total_steps=20", "run.dir=runs/nb"])
    cfg.train.lr                                   # 0.0002: every key a typed attribute
    summary = reasonrl.train(cfg, on_step=lambda step, m: print(step, m["critic/score/mean"]))
    results = reasonrl.evaluate(cfg, model="runs/nb")   # what `reasonrl eval --json` prints

``reasonrl.Config`` is :class:`reasonrl.config.Config` (``Config.load``: the recipe and override
checks of the command line, :func:`reasonrl.config.load_recipe`); ``reasonrl.train`` calls
:func:`train`, ``reasonrl.evaluate`` is :func:`evaluate`. A script needs no
``if __name__ == "__main__":`` guard: worker processes do not import the caller's main module
(:mod:`reasonrl.runtime.process`).
"""

from __future__ import annotations

import signal
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Sequence

from reasonrl.config import Config, dump
from reasonrl.errors import FatalError
from reasonrl.metrics import console_fields, final_summary, read_jsonl
from reasonrl.runtime.threads import openmp_waits

StepCallback = Callable[[int, dict[str, Any]], None]
"""``on_step(step, metrics)``: a row of ``metrics.jsonl`` as it is written."""


def train(cfg: Config, on_step: StepCallback | None = None, *, supervise: bool = False) -> dict[str, Any]:
    """Train ``cfg`` as ``reasonrl train`` does and return the run's summary: the held-out
    metrics of its last validation, or without one its last training metrics
    (:func:`~reasonrl.metrics.final_summary`: what ``reasonrl train`` prints at its end).

    The checks of :mod:`reasonrl.preflight` come first (a bad key, file or model raises its
    InputError before anything loads); a complete run is not trained again (its summary is
    returned), a stopped one resumes from its last checkpoint. Training runs in this process,
    with no restarts after a failure; ``on_step(step, metrics)`` is called with each row of
    ``metrics.jsonl`` as it is written. ``supervise=True`` trains in a child process under
    the supervisor, as ``reasonrl train`` does by default (restarts, rollback, ETTR); the
    child's metrics do not pass through this process, so it takes no ``on_step``.

    SIGINT (Ctrl-C, a notebook's interrupt) stops after the current step with a checkpoint
    and raises KeyboardInterrupt; SIGTERM likewise raises SystemExit(143)."""
    waits = openmp_waits()  # for the processes it starts, and this one if torch is not loaded yet
    if supervise and on_step is not None:
        raise ValueError("reasonrl.train: on_step is called in the training process, and supervise=True trains in a "
                         "child process; follow RUN_DIR/metrics.jsonl instead, or train with supervise=False")
    from reasonrl.preflight import preflight, same_run

    plan = preflight(cfg)
    fields = console_fields(cfg.rollout.mode)
    if plan.state.kind == "complete" and same_run(cfg):
        print(complete_line(cfg), flush=True)
        return rows_summary(Path(cfg.run.dir), fields)
    if supervise:  # the supervisor's first child checks the run again and prints its plan
        return _train_supervised(cfg, fields)
    print(plan.starting(waits), flush=True)
    summary, stopped_by = train_in_process(cfg, on_step)
    if stopped_by is not None:
        _stopped(cfg, stopped_by)
    return summary


def complete_line(cfg: Config) -> str:
    """What a complete run says when it is trained again."""
    return f"{cfg.run.dir}: the run is already complete ({cfg.train.total_steps} steps; raise train.total_steps to go on)"


def train_in_process(cfg: Config, on_step: StepCallback | None = None) -> tuple[dict[str, Any] | None, int | None]:
    """Train in this process (following the supervisor, when there is one): (the run's
    summary, the signal that stopped it early or None). Where roles run in processes of this
    one, what starts them is prepared first, before this process starts a thread
    (:func:`~reasonrl.runtime.process.start_worker_processes`).

    A standby trainer (the supervisor started it ahead, to replace a failed one) gets this far
    and waits for the supervisor's go: with its roles built and its rollout workers started where
    a second copy of them is cheap and separate (the cpu device, the local engine, one trainer
    rank), else with its imports done; one whose scale counts (``reasonrl scale``) changed
    meanwhile is built again. A standby the supervisor retires returns (None, None)."""
    from reasonrl.controller import Controller
    from reasonrl.resilience.rundir import await_go, follow_supervisor, is_standby
    from reasonrl.runtime.process import start_worker_processes
    from reasonrl.runtime.scaling import scaled
    from reasonrl.runtime.topology import plan

    def prepare(run_cfg: Config):
        topology = plan(run_cfg)
        if topology.starts_processes():
            start_worker_processes(("reasonrl.build",))  # where every role's factory is, or what imports it
        return topology

    run_cfg = scaled(cfg, cfg.run.dir)  # the counts reasonrl scale asked for: the plan is the controller's
    topology = prepare(run_cfg)
    follow_supervisor()
    standby = is_standby()
    ahead = run_cfg.run.device == "cpu" and topology.engine == "local" and run_cfg.runtime.trainer_ranks == 1
    controller = Controller.from_config(run_cfg, topology=topology) if ahead or not standby else None
    if standby:
        if controller is not None:
            controller.prepare()
        if not await_go():  # retired
            if controller is not None:
                controller.close()
            return None, None
        asked = scaled(cfg, cfg.run.dir)  # reasonrl scale may have asked for other counts meanwhile
        if controller is not None and asked != run_cfg:
            controller.close()
            controller = None
        if controller is None:
            controller = Controller.from_config(asked, topology=prepare(asked))
    last = controller.run(on_step)
    return final_summary(last, console_fields(cfg.rollout.mode)), controller.stopped_by


def rows_summary(run_dir: Path, fields: Sequence[tuple[str, str]]) -> dict[str, Any]:
    """:func:`~reasonrl.metrics.final_summary` of a run directory's ``metrics.jsonl``: of its
    last validation row, else of its last row ({} without one)."""
    path = run_dir / "metrics.jsonl"
    rows = read_jsonl(path) if path.is_file() else []
    row = next((r for r in reversed(rows) if "val/acc" in r), rows[-1] if rows else {})
    return final_summary({k: v for k, v in row.items() if k != "step"}, fields)


def _train_supervised(cfg: Config, fields: Sequence[tuple[str, str]]) -> dict[str, Any]:
    """``cfg`` trained by ``reasonrl train --no-supervisor`` in a child the supervisor runs
    (:func:`~reasonrl.resilience.supervisor.train_supervised`), read from a copy of ``cfg`` as
    a recipe file; the summary from its ``metrics.jsonl``. A run that ends in a fatal error
    raises FatalError with the child's message, one the supervisor gave up on RuntimeError."""
    from reasonrl.resilience.supervisor import train_supervised

    run_dir = Path(cfg.run.dir)
    with tempfile.TemporaryDirectory(prefix="reasonrl-api-") as scratch:
        recipe = Path(scratch) / "config.yaml"
        dump(cfg, recipe)  # load() reads it back to an equal Config
        code = train_supervised(cfg, [sys.executable, "-m", "reasonrl.cli", "train", "--no-supervisor", str(recipe)])
    if code > 128:
        _stopped(cfg, code - 128)
    if code != 0:
        events = read_jsonl(run_dir / "events.jsonl") if (run_dir / "events.jsonl").is_file() else []
        ended = next((e for e in reversed(events) if e["kind"] in ("fatal", "gave_up")), {})
        message = ended.get("message") or f"the trainer exited with code {code}"
        raise (FatalError if ended.get("kind") == "fatal" else RuntimeError)(f"{run_dir}: {message}")
    return rows_summary(run_dir, fields)


def _stopped(cfg: Config, signum: int) -> None:
    """Raise what a run stopped by ``signum`` (with a checkpoint) ends in: KeyboardInterrupt
    after SIGINT, else SystemExit(128 + signum), as the command line's exit code."""
    message = (f"{cfg.run.dir}: stopped by {signal.Signals(signum).name} with a checkpoint; train the same config "
               "again to resume")
    if signum == signal.SIGINT:
        raise KeyboardInterrupt(message)
    print(message, file=sys.stderr, flush=True)
    raise SystemExit(128 + signum)


def evaluate(cfg: Config, model: str | Path | Sequence[str | Path] | None = None,
             data: str | Path | Sequence[str | Path] | None = None, *, step: int | None = None,
             sources: Sequence[str] = (), limit: int | None = None,
             samples: str | Path | None = None) -> dict[str, Any]:
    """``reasonrl eval --json``: each model (a Hugging Face model directory, or a run directory:
    its ``final/``, or with ``step`` its checkpoint; None: ``model.path``) on each dataset
    (None: the held-out split of ``data.*``), only rows of ``sources`` when given, the first
    ``limit`` rows of each; k samples and a greedy response per prompt
    (:mod:`reasonrl.evaluation`). Every sample record goes to ``samples`` (default
    ``eval_results/eval-<UTC time>.jsonl``). Returns the sampling settings, the samples path and
    per model and data source the prompt count and each metric's ``{"mean", "stderr"}``."""
    openmp_waits()
    from reasonrl.evaluation import default_samples_path, evaluate_models, results_json

    out = Path(samples) if samples else default_samples_path()
    evaluations = evaluate_models(cfg, _paths(model), _paths(data), out, step, list(sources), limit)
    return results_json(cfg, evaluations, out)


def _paths(value: str | Path | Sequence[str | Path] | None) -> list[str]:
    """One path or several as a list of strings ([] for None)."""
    if value is None:
        return []
    return [str(value)] if isinstance(value, (str, Path)) else [str(v) for v in value]
