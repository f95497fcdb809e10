"""Running a sweep: every cell x seed to its end, resumable, then the summary.

    code = run_sweep(read_sweep("sweeps/clip.yaml"), Path("runs/clip"))   # 0: every run finished
    print(status_text(Path("runs/clip")))                                 # where a sweep stands

``run_sweep`` takes the sweep directory's lock (``DIR/sweep.lock``: one sweep per directory),
writes the resolved sweep to ``DIR/sweep.json``, loads every run's config (a bad one fails
before anything trains), checks each cell with :func:`~reasonrl.preflight.preflight` and builds
the embedded warm start once. Then it trains the runs that are not finished, in seed-major
order (:meth:`~reasonrl.experiments.sweep.Sweep.runs`), with a progress bar over the runs:

- ``sweep.parallel`` 1: one after another in this process (as ``reasonrl train --no-supervisor``);
- ``sweep.parallel`` N > 1: in N workers (:class:`SweepWorker` in a
  :class:`~reasonrl.runtime.pool.WorkerPool`), one run each at a time, each with
  run.threads = cores / N: worker processes on this machine, or with ``runtime.engine=ray``
  Ray actors on the cluster (:func:`~reasonrl.runtime.ray.connect`: the runs' ray_address, or a
  local cluster), each run's controller in its actor placing the run's roles on the cluster; a
  worker that dies or passes ``sweep.run_timeout_h`` is replaced.

**Resume.** A run is finished when its newest valid checkpoint is at train.total_steps
(:func:`~reasonrl.preflight.run_state`, as ``reasonrl train`` decides): a sweep started again
never touches it. A run that was stopped or killed mid-way resumes from its newest committed
checkpoint through the trainer's own resume (the steps after that checkpoint are redone, the
rows they wrote dropped); one without a checkpoint starts over. A run directory whose
config.yaml differs from the config the sweep now gives it is an error before anything runs.

**Failures.** A run that ends with an error a restart would meet again (a
:class:`~reasonrl.errors.FatalError`: bad input, a limit, an unusable directory) is recorded
as failed and the sweep goes on with the others; any other error, a worker that died or timed
out, is retried from the run's last checkpoint up to its resilience.max_restarts times. The
sweep exits 1 when some run failed. SIGINT or SIGTERM stop the runs in progress after their
current step with a checkpoint (:meth:`SweepWorker.stop`, a call that runs beside the run's),
and the sweep exits 128 + the signal.

Every run writes its console lines to ``RUN_DIR/console.log``; the sweep's own record is
``DIR/events.jsonl`` (``sweep_start``, ``run_start``, ``run_done``, ``run_failed``,
``sweep_stopped``, ``sweep_done``). At the end, the summary of the finished runs goes to the
terminal, ``summary.csv``, ``summary.json`` and ``report.html`` (:mod:`reasonrl.experiments.summary`).
``reasonrl sweep --fit-mix`` then fits the mixture law of a sweep over mix weights
(:func:`write_mix_law`).
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import sys
import threading
import time
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator

from tqdm import tqdm

from reasonrl.config import Config, ConfigError, to_dict
from reasonrl.errors import FatalError, ResumeError, RunDirError, error_line
from reasonrl.experiments.summary import RunResult, format_table, read_result, summarize, write_summary
from reasonrl.experiments.sweep import Sweep, SweepRun, read_sweep
from reasonrl.metrics import EventLog, read_jsonl, write_atomic
from reasonrl.preflight import config_changes, preflight, run_state
from reasonrl.runtime.process import start_worker_processes

if TYPE_CHECKING:
    from reasonrl.controller import Controller

SPEC_FILE = "sweep.json"
"""The resolved sweep, written at each start (``reasonrl sweep --status`` reads it)."""
LOCK_FILE = "sweep.lock"


class SweepLock:
    """The exclusive lock of a sweep directory (``flock`` on DIR/sweep.lock, released by the
    kernel when the process ends); its text names the holder's pid."""

    def __init__(self, root: Path) -> None:
        self.path = Path(root) / LOCK_FILE
        self.fd: int | None = None

    def acquire(self) -> SweepLock:
        """Take the lock; RunDirError naming the holder when another sweep has it."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip()
            os.close(fd)
            raise RunDirError(f"{self.path.parent}: another reasonrl sweep is running in this directory ({holder}); "
                              "wait for it or stop it") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"pid": os.getpid(), "since": time.strftime("%Y-%m-%dT%H:%M:%S")}).encode(), 0)
        self.fd = fd
        return self

    def holder(self) -> str | None:
        """The holder's text when another process holds the lock, else None."""
        if not self.path.is_file():
            return None
        fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            return os.pread(fd, 200, 0).decode(errors="replace").strip()
        finally:
            os.close(fd)
        return None

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class RunLog:
    """A run's console lines, appended to ``RUN_DIR/console.log`` (opened at the first line:
    the trainer checks and locks the directory before it logs)."""

    def __init__(self, run_dir: Path) -> None:
        self.path = Path(run_dir) / "console.log"

    def __call__(self, line: str) -> None:
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(f"{line}\n")


def train_run(cfg: Config, started: Callable[[Controller], None] = lambda controller: None) -> int | None:
    """Train the run of ``cfg`` to its end in this process; the signal that stopped it early
    (SIGINT, SIGTERM), else None. ``started`` is handed the run's controller before it trains."""
    from reasonrl.controller import Controller

    controller = Controller.from_config(cfg, log=RunLog(Path(cfg.run.dir)))
    started(controller)
    controller.run()
    return controller.stopped_by


class SweepWorker:
    """A worker of ``sweep.parallel`` > 1 (a process, or a Ray actor with runtime.engine=ray):
    trains the runs it is handed, one at a time, their workers started by a fork of this
    process where it can (prepared as it starts). :meth:`stop` runs beside :meth:`train`."""

    def __init__(self) -> None:
        start_worker_processes(("reasonrl.build",))
        self._controller: Controller | None = None
        self._stop: int | None = None

    def train(self, cfg: Config) -> int | None:
        try:
            return train_run(cfg, self._started)
        finally:
            self._controller = None

    def _started(self, controller: Controller) -> None:
        self._controller = controller
        if self._stop is not None:
            controller.request_stop(self._stop)

    def stop(self, signum: int) -> None:
        """End the run in training after its current step, with a checkpoint, as ``signum``
        would (a run about to start stops before its first step)."""
        self._stop = signum
        controller = self._controller
        if controller is not None:
            controller.request_stop(signum)


@dataclass
class _Pending:
    run: SweepRun
    cfg: Config
    attempt: int = 0


class _Progress:
    """The progress bar over the runs, the sweep's events and the runs' outcomes."""

    def __init__(self, total: int, finished: int, events: EventLog) -> None:
        self.bar = tqdm(total=total, initial=finished, unit="run", desc="sweep", file=sys.stderr, dynamic_ncols=True)
        self.events = events
        self.running: dict[str, float] = {}
        self.done: list[SweepRun] = []
        self.failed: dict[str, str] = {}

    def start(self, p: _Pending) -> None:
        state = run_state(p.cfg)
        self.running[p.run.label] = time.monotonic()
        self.events.emit("run_start", None, run=p.run.label, attempt=p.attempt + 1, from_step=state.step)
        self._show()

    def finish(self, p: _Pending) -> None:
        seconds = time.monotonic() - self.running.pop(p.run.label)
        self.done.append(p.run)
        self.events.emit("run_done", None, run=p.run.label, seconds=round(seconds, 3))
        result = read_result(p.run.dir, None)
        acc = f"final val/acc {result.final:.3f}, best {result.best:.3f}" if result else "no val/acc"
        tqdm.write(f"{p.run.label}: done in {seconds:.0f} s, {acc}", file=sys.stderr)
        self.bar.update(1)
        self._show()

    def fail(self, p: _Pending, error: str, retry: bool) -> None:
        self.running.pop(p.run.label, None)
        self.events.emit("run_failed", None, run=p.run.label, attempt=p.attempt + 1, error=error, retry=retry)
        tqdm.write(f"{p.run.label}: failed ({error}); " + ("starting it again from its last checkpoint" if retry
                                                           else "the sweep goes on without it"), file=sys.stderr)
        if not retry:
            self.failed[p.run.label] = error
        self._show()

    def _show(self) -> None:
        self.bar.set_postfix_str(", ".join(self.running) or "", refresh=True)

    def close(self) -> None:
        self.bar.close()


def _outcome(p: _Pending, err: BaseException | str, progress: _Progress, queue: deque[_Pending]) -> None:
    """A run that ended with ``err`` (an exception, or why its worker was replaced): failed for
    good when a restart would meet it again or its restarts are spent, else queued again first."""
    fatal = isinstance(err, FatalError)
    retry = not fatal and p.attempt < p.cfg.resilience.max_restarts
    progress.fail(p, err if isinstance(err, str) else error_line(err), retry)
    if retry:
        queue.appendleft(_Pending(p.run, p.cfg, p.attempt + 1))


def _run_here(queue: deque[_Pending], progress: _Progress) -> int | None:
    """Train the queued runs one after another in this process; the signal that stopped one."""
    while queue:
        p = queue.popleft()
        progress.start(p)
        try:
            stopped_by = train_run(p.cfg)
        except Exception as err:  # noqa: BLE001 - recorded, retried or failed; the sweep goes on
            _outcome(p, err, progress, queue)
            continue
        if stopped_by is not None:
            return stopped_by
        progress.finish(p)
    return None


def _run_pool(queue: deque[_Pending], progress: _Progress, sweep: Sweep) -> int | None:
    """Train the queued runs in ``sweep.parallel`` workers: processes, or Ray actors when the
    runs use Ray (each run's controller then places its own roles on the cluster); the signal
    that stopped the sweep (each running run is asked to stop after its step, with a
    checkpoint; a second signal stops at once)."""
    from reasonrl.runtime.pool import PoolStart, RestartPolicy

    workers = min(sweep.options.parallel, len(queue))
    where = "ray" if queue[0].cfg.runtime.engine == "ray" else "process"
    cluster, ray_options = _join_cluster(list(queue), workers) if where == "ray" else (None, None)
    start = PoolStart("sweep", workers, sweep.options.run_timeout_h * 3600, where=where,
                      restarts=RestartPolicy(budget=1000), concurrent=("stop",), ray_options=ray_options)
    try:
        pool = start(SweepWorker, [()] * workers)
    except BaseException:
        if cluster is not None:
            cluster.close()
        raise
    busy: dict[int, _Pending] = {}
    stopped: list[int] = []

    def stop_runs(signum: int) -> None:
        for index in list(busy):
            pool.group.submit_to(index, "stop", signum)

    def on_signal(signum: int, frame) -> None:
        if stopped:  # a second signal: stop at once
            pool.group.kill()
            raise KeyboardInterrupt
        stopped.append(signum)
        tqdm.write(f"sweep: {signal.Signals(signum).name}: the runs in progress stop after their step, with a "
                   "checkpoint (again: stop at once)", file=sys.stderr)
        # sent from a thread: the handler may have interrupted this thread inside a send to a worker
        threading.Thread(target=stop_runs, args=(signum,), name="reasonrl-sweep-stop", daemon=True).start()

    handlers = {}
    if threading.current_thread() is threading.main_thread():
        handlers = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        while busy or (queue and not stopped):
            for index in range(workers):
                if index not in busy and queue and not stopped:
                    busy[index] = p = queue.popleft()
                    progress.start(p)
                    pool.submit(index, "train", p.cfg, key=p.run.label)
            for done in pool.wait():
                p = busy.pop(done.index)
                if done.outcome == "ok" and done.value is None:
                    progress.finish(p)
                elif done.outcome == "ok":  # stopped by a signal of its own (Ctrl-C reaches the workers too)
                    stopped.append(done.value)
                    progress.running.pop(p.run.label, None)
                else:
                    _outcome(p, done.value if done.outcome == "error" else f"{done.outcome}: {done.value}", progress,
                             queue)
    finally:
        for s, handler in handlers.items():
            signal.signal(s, handler)
        try:
            pool.close()
        finally:
            if cluster is not None:
                cluster.close()
    return stopped[0] if stopped else None


def _join_cluster(pending: list[_Pending], workers: int):
    """(cluster, the sweep actors' ``ray_options``) for ``workers`` runs at once on Ray: join the
    runs' ``runtime.ray_address``, or start a local cluster sized for ``workers`` of the largest
    run (its actors' CPUs and object store, :func:`~reasonrl.build.local_cluster_size`, plus the
    trainer's ``run.threads``). Each sweep actor holds what its run's trainer uses (it runs the
    policy's rank 0): ``run.threads`` CPUs, and a GPU with ``run.device=cuda``."""
    from reasonrl.build import local_cluster_size
    from reasonrl.runtime.ray import connect
    from reasonrl.runtime.threads import available_cores
    from reasonrl.runtime.topology import plan as plan_roles
    from reasonrl.warmstart import resolve_model_dir

    trainer = [{"CPU": max(1, p.cfg.run.threads), **({"GPU": 1} if p.cfg.run.device.startswith("cuda") else {})}
               for p in pending]
    sizes = [local_cluster_size(p.cfg, plan_roles(p.cfg), resolve_model_dir(p.cfg, lambda line: None)) for p in pending]
    cpus = workers * max(cpus + need["CPU"] for (cpus, _), need in zip(sizes, trainer))
    cluster = connect(pending[0].cfg.runtime, max(cpus, available_cores()),
                      object_store_bytes=workers * max(store for _, store in sizes))
    largest = max(trainer, key=lambda need: (need.get("GPU", 0), need["CPU"]))
    return cluster, {"resources": [largest] * workers}


def check_sweep_dir(root: Path) -> None:
    """RunDirError unless ``root`` is a new or empty directory or a sweep's (sweep.json or
    sweep.lock in it)."""
    if root.exists() and not root.is_dir():
        raise RunDirError(f"--dir {root}: is a file, not a directory; choose a directory for the sweep")
    entries = sorted(p.name for p in root.iterdir()) if root.is_dir() else []
    if entries and SPEC_FILE not in entries and LOCK_FILE not in entries:
        shown = ", ".join(entries[:3]) + (f" and {len(entries) - 3} more" if len(entries) > 3 else "")
        raise RunDirError(f"--dir {root}: holds files that are not a sweep's ({shown}); choose a new or empty directory")


def check_resumable(cfg: Config) -> None:
    """ResumeError when ``cfg.run.dir`` holds a run written with a config this one may not
    resume (another config_hash), naming the keys that differ."""
    changes = config_changes(cfg)
    if changes:
        raise ResumeError(f"{cfg.run.dir}: this run directory holds a run with another config than the sweep gives it "
                          f"now ({', '.join(changes[:6])}); restore the sweep file, or give the sweep another --dir")


def plan(sweep: Sweep, root: Path) -> list[tuple[SweepRun, Config]]:
    """Every run with its config (cores split by sweep.parallel); ConfigError or ResumeError
    before anything runs."""
    from reasonrl.runtime.threads import available_cores

    cores = available_cores()
    planned = [(run, sweep.config(run, cores)) for run in sweep.runs(root)]
    for _, cfg in planned:
        check_resumable(cfg)
    if sweep.options.parallel > 1:
        for key in ("engine", "ray_address"):
            values = {getattr(cfg.runtime, key) for _, cfg in planned}
            if len(values) > 1:
                raise ConfigError(f"{sweep.source}: runtime.{key} differs between runs ({', '.join(sorted(map(repr, values)))}) "
                                  f"with sweep.parallel = {sweep.options.parallel}: the runs that train at once all "
                                  "run on this machine or all on one Ray cluster", f"runtime.{key}")
    return planned


def run_sweep(sweep: Sweep, root: Path, log: Callable[[str], None] = print) -> int:
    """Train every run of ``sweep`` under ``root`` that is not finished, then write and print
    the summary (see the module docstring). 0: every run finished; 1: some run failed;
    128 + N: stopped by signal N."""
    root = Path(root)
    check_sweep_dir(root)
    lock = SweepLock(root).acquire()
    try:
        planned = plan(sweep, root)
        write_atomic(root / SPEC_FILE, json.dumps(sweep.to_dict(), indent=2) + "\n")
        pending = [_Pending(run, cfg) for run, cfg in planned if run_state(cfg).kind != "complete"]
        events = EventLog(root)
        events.emit("sweep_start", None, runs=len(planned), finished=len(planned) - len(pending), pid=os.getpid(),
                    parallel=sweep.options.parallel)
        log(f"sweep {root}: {len(sweep.cells)} cells x {len(sweep.seeds)} seeds = {len(planned)} runs, "
            f"{len(planned) - len(pending)} finished, {len(pending)} to train"
            + (f", {sweep.options.parallel} at once" if sweep.options.parallel > 1 and pending else ""))
        stopped_by, done = None, []
        if pending:
            with _quiet_model_loading():
                _prepare(pending, log)
                # the runs' workers (and the sweep's worker processes) start by a fork of this
                # process, which has imported what they need, while it runs one thread
                start_worker_processes(("reasonrl.build", __name__))
                progress = _Progress(len(planned), len(planned) - len(pending), events)
                queue = deque(pending)
                try:
                    stopped_by = (_run_here(queue, progress) if sweep.options.parallel == 1
                                  else _run_pool(queue, progress, sweep))
                finally:
                    progress.close()
            failed, done = progress.failed, progress.done
        else:
            failed = {}
        unfinished = {p.run.label for p in pending} - {run.label for run in done}
        finished = [run for run, _ in planned if run.label not in unfinished]
        cells = summarize(sweep, _results(sweep, finished))
        paths = write_summary(root, sweep, cells)
        log(format_table(cells, sweep.target))
        log(f"summary: {', '.join(str(p) for p in paths[:3])}")
        if stopped_by is not None:
            events.emit("sweep_stopped", None, signal=signal.Signals(stopped_by).name, finished=len(finished))
            log(f"sweep stopped by {signal.Signals(stopped_by).name}: {len(finished)} of {len(planned)} runs finished; "
                "run the same command again to go on")
            return 128 + stopped_by
        events.emit("sweep_done", None, finished=len(finished), failed=sorted(failed))
        if failed:
            log(f"{len(failed)} run{'s' if len(failed) > 1 else ''} failed (events: {root / 'events.jsonl'}):\n"
                + "\n".join(f"  {label}: {error}" for label, error in failed.items()))
            return 1
        return 0
    finally:
        lock.release()


@contextmanager
def _quiet_model_loading() -> Iterator[None]:
    """No progress bars of Hugging Face loading and saving (every run loads and exports its
    model) beside the sweep's, while the sweep trains: in this process, and in the worker
    processes it starts (through the environment they inherit). Restored afterwards."""
    from transformers.utils import logging as transformers_logging

    variable, before = "HF_HUB_DISABLE_PROGRESS_BARS", os.environ.get("HF_HUB_DISABLE_PROGRESS_BARS")
    enabled = transformers_logging.is_progress_bar_enabled()
    os.environ[variable] = "1"
    transformers_logging.disable_progress_bar()
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(variable, None)
        else:
            os.environ[variable] = before
        if enabled:
            transformers_logging.enable_progress_bar()


def _prepare(pending: list[_Pending], log: Callable[[str], None]) -> None:
    """Check one run of each cell with :func:`preflight` and build each embedded warm start the
    runs need, once, before any run starts."""
    from reasonrl.warmstart import resolve_model_dir

    checked: set[str] = set()
    warm: set[str] = set()
    for p in pending:
        if p.run.cell.name in checked:
            continue
        checked.add(p.run.cell.name)
        try:
            preflight(p.cfg)
        except FatalError as err:
            raise type(err)(f"cell {p.run.cell.name}: {err}") from None
        key = json.dumps([to_dict(p.cfg.sft), p.cfg.data.families, p.cfg.env.name])
        if p.cfg.model.path == "embedded" and key not in warm:
            warm.add(key)
            resolve_model_dir(p.cfg, log)


def _results(sweep: Sweep, finished: list[SweepRun]) -> dict[tuple[str, int], RunResult]:
    results = {}
    for run in finished:
        result = read_result(run.dir, sweep.target)
        if result is not None:
            results[(run.cell.name, run.seed)] = result
    return results


def write_mix_law(sweep: Sweep, root: Path, log: Callable[[str], None] = print) -> Path:
    """Fit the mixture law (:mod:`reasonrl.experiments.mixfit`) to the finished runs of the
    sweep in ``root``, log it and write ``root/mix_fit.json``; ConfigError when the cells vary
    no mixture or too few of them finished."""
    from reasonrl.experiments.mixfit import fit_mix, law_json

    finished = [run for run, cfg in plan(sweep, root) if run_state(cfg).kind == "complete"]
    law = fit_mix(sweep, _results(sweep, finished))
    path = Path(root) / "mix_fit.json"
    write_atomic(path, json.dumps(law_json(law), indent=2) + "\n")
    log(law.describe())
    log(f"mixture law: {path}")
    return path


def status_text(root: Path) -> str:
    """Where the sweep in ``root`` stands: running or not, each run's state (finished with its
    final val/acc, at step k of N, failed, not started) and the summary of the finished runs."""
    root = Path(root)
    spec = root / SPEC_FILE
    if not spec.is_file():
        raise ConfigError(f"{root}: no {SPEC_FILE}; not a sweep directory (reasonrl sweep SWEEP.yaml --dir {root} "
                          "starts one)")
    sweep = read_sweep(spec)
    holder = SweepLock(root).holder()
    failed = _failed_runs(root / "events.jsonl")
    planned = plan(sweep, root)
    cells: dict[str, dict[int, str]] = {c.name: {} for c in sweep.cells}
    counts = {"finished": 0, "in progress": 0, "failed": 0, "not started": 0}
    finished = []
    for run, cfg in planned:
        state = run_state(cfg)
        rows = read_jsonl(run.dir / "metrics.jsonl") if (run.dir / "metrics.jsonl").is_file() else []
        if state.kind == "complete":
            result = read_result(run.dir, None)
            text, kind = f"done {result.final:.3f}" if result else "done", "finished"
            finished.append(run)
        elif run.label in failed:
            text, kind = "failed", "failed"
        elif rows or state.kind == "resume":
            step = max([state.step, *(r["step"] for r in rows)])
            text, kind = f"step {step}/{cfg.train.total_steps}", "in progress"
        else:
            text, kind = "-", "not started"
        counts[kind] += 1
        cells[run.cell.name][run.seed] = text
    header = ["cell", *(f"seed {s}" for s in sweep.seeds)]
    grid = [header, *([name, *(by_seed[s] for s in sweep.seeds)] for name, by_seed in cells.items())]
    widths = [max(len(r[i]) for r in grid) for i in range(len(header))]
    lines = [f"sweep {root}: " + (f"running ({_holder_text(holder)})" if holder else "not running"),
             f"runs: {len(planned)}; " + ", ".join(f"{n} {kind}" for kind, n in counts.items()),
             "", *("  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in grid)]
    for label, error in failed.items():
        lines.append(f"failed {label}: {error}")
    if finished:
        lines += ["", format_table(summarize(sweep, _results(sweep, finished)), sweep.target)]
    return "\n".join(lines)


def _holder_text(holder: str) -> str:
    """``pid N since TIME`` of the sweep lock's text (the text itself when it is not the lock's JSON)."""
    try:
        data = json.loads(holder)
        return f"pid {data['pid']} since {data['since']}"
    except (ValueError, KeyError, TypeError):
        return holder


def _failed_runs(path: Path) -> dict[str, str]:
    """{run label: error} of the runs whose last record in the sweep's events is a failure
    that was not retried."""
    last: dict[str, dict] = {}
    for event in read_jsonl(path) if path.is_file() else []:
        if event.get("kind") in ("run_start", "run_done", "run_failed"):
            last[event["run"]] = event
    return {run: e["error"] for run, e in last.items() if e["kind"] == "run_failed" and not e["retry"]}
