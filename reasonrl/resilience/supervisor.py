"""The process around the trainer: restart on failure, hang detection, recovery and ETTR.

    result = supervise([sys.executable, "-m", "reasonrl.cli", "train", "--no-supervisor", recipe],
                       run_dir, RestartPolicy())
    write_summary(run_dir, summarize_run(run_dir, wall_s=result.wall_s))

The child resumes from its last committed checkpoint when started again on the same run
directory, so a restart is simply the same command run again. The supervisor classifies each
failure, appends it to ``events.jsonl`` and, once the restarted child has logged its first new
step, appends a ``recovered`` event. Events it writes (besides ``time``, ``kind``, ``step``):

- ``crash`` (non-zero exit), ``killed`` (ended by a signal) and ``hang`` (the child's watchdog
  wrote ``hang_dump.txt``, or the heartbeat file ``hang_dump.stage`` went stale and the
  supervisor killed the child): ``step`` = last step in ``metrics.jsonl``, ``detect_s``,
  ``attempt``, ``started`` (when the attempt's process started, unix time), ``returncode``,
  ``stderr_tail``, ``backoff_s`` (``None`` when giving up);
  ``killed`` adds ``signal``; ``hang`` adds ``source`` ("watchdog" or "heartbeat"), ``stage``,
  ``stack`` (the dump, at most ``STACK_CHARS`` characters) and ``dump`` (where it was moved).
- ``recovered``: ``step`` = first new step, ``recover_s`` (detection of the first unrecovered
  failure to that step), ``steps_lost``, ``from_step``, ``failures`` (failures it covers).
- ``gave_up``: ``restarts``, ``message``. ``stopped``: ``signal``, ``returncode``.
  ``done``: ``restarts``, ``wall_s``. ``fatal``: ``returncode`` (2) and ``message``, the
  child's last stderr line: an error a restart would meet again (:mod:`reasonrl.errors`),
  which ends supervision at once. A child that exits 2 before the directory is this run's
  refused the run: its checks (:mod:`reasonrl.preflight`, in the first child) failed, or its
  resume check found another run's directory. The supervisor then writes nothing (no event, no
  ``summary.json``; ``SupervisorResult.refused``), and :func:`train_supervised` removes the
  lock file and the directory again when it made them. The directory is this run's once a child of this
  supervision has written to it (anything beside ``run.lock``) where it held no run, or has
  passed its resume check (its ``resume`` event) where it held one (``config.yaml``).

Each child gets ``REASONRL_ATTEMPT`` (:data:`~reasonrl.resilience.rundir.ATTEMPT_ENV`): 1 for
the first, which checks the run before it trains, 2 and up for the restarts, which do not.
With ``preload`` (``resilience.trainer_template``: :data:`TRAINER_PRELOAD`) every child is
forked from a template process that imported those modules once
(:class:`~reasonrl.runtime.zygote.Template`), so a restart does not import torch again; the
template ends with supervision, and one that ended early leaves the next children to fresh
processes, as does a template that could not start (the supervisor says why on stderr).

A failure counts as recovered only once a restarted child has trained a step past the one it
resumed from (or has finished the run); ``recovered`` says with ``warm`` whether that child was
the standby. A failure at a later step than every earlier one is no repeat of them: its
back-off starts over.

With ``standby``, once the child has trained a step and recovered from any failure, the supervisor
starts the same command as a standby: it builds its roles, then waits on a pipe
(:func:`~reasonrl.resilience.rundir.await_go`). The next restart gives it the go instead of
starting a trainer that builds its roles then, and a new standby is started once that one has recovered. A standby
that died meanwhile is replaced by a trainer started then. ``summary.json`` holds the figures of
:func:`reasonrl.resilience.ettr.effective_time`. An event or the summary that cannot be
written (a full disk) goes to stderr instead, and supervision goes on and ends as it would.

The child itself writes ``start`` (each start) and ``resume`` (with ``from_step``) events.
"""

from __future__ import annotations

import codecs
import collections
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reasonrl.config import Config
from reasonrl.errors import EXIT_FATAL, WriteError
from reasonrl.metrics import EventLog, read_jsonl, write_atomic
from reasonrl.resilience.ettr import effective_time, step_seconds
from reasonrl.resilience.guards import read_hang_dump
from reasonrl.resilience.rundir import (ATTEMPT_ENV, LOCK_FILE, SNAPSHOT_ENV, STANDBY_ENV, SUPERVISOR_ENV, RunLock,
                                        check_run_dir, new_snapshot_dir)
from reasonrl.restarts import backoff_pause
from reasonrl.runtime.process import PRELOAD
from reasonrl.runtime.threads import CHOICE_ENV, openmp_waits
from reasonrl.runtime.zygote import Template

HANG_DUMP = "hang_dump.txt"
"""The stack dump the child's faulthandler watchdog writes before it exits."""

HEARTBEAT = "hang_dump.stage"
"""The child's heartbeat: the current stage's name; its modification time is the last beat."""

STACK_CHARS = 20_000
"""A hang event keeps at most this many characters of the stack dump."""

TAIL_LINES = 50
"""Lines of the child's stderr kept for a failure event."""

_POLL_S = 0.1
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@dataclass(frozen=True)
class RestartPolicy:
    """When and how often to restart a failed trainer.

    The first of consecutive restarts starts at once, the k-th (k >= 1, counted from 0) waits
    ``min(backoff_s * 2**(k-1), backoff_max_s)`` (:func:`reasonrl.restarts.backoff_pause`); a child
    that ran at least ``reset_after_s`` before failing, or failed after a later step than any
    failure before it (the run got further: no crash loop), resets k to 0. While the child runs,
    a heartbeat file older than ``heartbeat_timeout_s`` gets it killed as hung.
    """

    max_restarts: int = 5
    backoff_s: float = 1.0
    backoff_max_s: float = 30.0
    heartbeat_timeout_s: float = 300.0
    reset_after_s: float = 600.0

    def __post_init__(self) -> None:
        for name in ("max_restarts", "backoff_s", "backoff_max_s", "reset_after_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"RestartPolicy.{name}: got {getattr(self, name)}, expected a value >= 0")
        if self.heartbeat_timeout_s <= 0:
            raise ValueError(f"RestartPolicy.heartbeat_timeout_s: got {self.heartbeat_timeout_s}, expected > 0")

    def backoff(self, k: int) -> float:
        """Seconds to wait before the restart with backoff exponent ``k`` (0 for the first of
        consecutive restarts)."""
        return backoff_pause(k + 1, self.backoff_s, self.backoff_max_s)


@dataclass
class SupervisorResult:
    """How supervision ended: the last child's return code (negative: killed by that signal),
    the number of restarts, the failure events (as written), the seconds supervised, and
    whether the child refused the run before the directory was this run's (its checks failed,
    or its resume check did: nothing was written to the directory then), or a stop signal came
    before the first child started (while the template imported)."""

    returncode: int
    restarts: int
    incidents: list[dict] = field(default_factory=list)
    wall_s: float = 0.0
    refused: bool = False


class _StderrTail:
    """Copies a child's stderr to ours as it arrives (progress bars included) and keeps its
    last ``TAIL_LINES`` lines, each as a terminal would show it after carriage returns."""

    def __init__(self, stream) -> None:
        self._fd = stream.fileno()
        self._stream = stream
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._lines: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self._partial = ""
        self._thread = threading.Thread(target=self._run, name="supervisor-stderr", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while chunk := os.read(self._fd, 65536):
            text = self._decoder.decode(chunk)
            self._echo(chunk, text)
            self._add(text)
        self._stream.close()

    @staticmethod
    def _echo(chunk: bytes, text: str) -> None:
        """Pass output on; a closed or broken stderr of ours must not stop the draining."""
        try:
            out = getattr(sys.stderr, "buffer", None)
            if out is not None:
                out.write(chunk)
                out.flush()
            else:
                sys.stderr.write(text)
                sys.stderr.flush()
        except (OSError, ValueError):
            pass

    def _add(self, text: str) -> None:
        *lines, partial = (self._partial + text).split("\n")
        self._lines.extend(line.rsplit("\r", 1)[-1] for line in lines)
        self._partial = partial[-4096:]

    def join(self, timeout: float) -> None:
        """Wait until the child's stderr is closed (all its processes are gone)."""
        self._thread.join(timeout)

    def text(self) -> str:
        """The kept lines, newest last."""
        partial = self._partial.rsplit("\r", 1)[-1]
        return "\n".join([*self._lines, partial] if partial.strip() else self._lines)


class _Child:
    """One run of the trainer command in its own process group, with its exit time recorded;
    a ``standby`` one waits, built, for :meth:`go` (``started`` is then the time of the go).
    With a ``template``, the command (``python -m MODULE ...``) runs in a process the template
    forks, which follows the template (:data:`~reasonrl.resilience.rundir.SUPERVISOR_ENV`: the
    process whose end orphans it); else in a process of its own."""

    def __init__(self, command: list[str], env: dict[str, str] | None, pass_fds: tuple[int, ...],
                 standby: bool = False, template: Template | None = None) -> None:
        self.started = time.time()
        self.first_beat: float | None = None
        """When the supervisor first saw this child's heartbeat (it trains from then on)."""
        self.warm = standby
        self._go: int | None = None
        env = dict(env or {})
        if standby:
            wait, self._go = os.pipe()
            env[STANDBY_ENV], pass_fds = str(wait), (*pass_fds, wait)
        try:
            self.proc = self._start(command, env, pass_fds, template)
        finally:
            if standby:
                os.close(wait)
        self.tail = _StderrTail(self.proc.stderr)
        self.exit_time = 0.0
        self.exited = threading.Event()
        threading.Thread(target=self._wait, name="supervisor-wait", daemon=True).start()

    @staticmethod
    def _start(command: list[str], env: dict[str, str], pass_fds: tuple[int, ...], template: Template | None):
        if template is not None:
            forked = {**env, SUPERVISOR_ENV: str(template.pid)} if SUPERVISOR_ENV in env else env
            try:
                return template.run_module(command[2], command[3:], forked, pass_fds)
            except OSError as err:  # it does not answer: this child starts as a process of its own
                print(f"reasonrl supervisor: the trainer template did not fork ({err}); starting a fresh process",
                      file=sys.stderr, flush=True)
        return subprocess.Popen(command, env={**os.environ, **env}, stderr=subprocess.PIPE, start_new_session=True,
                                pass_fds=pass_fds)

    def _wait(self) -> None:
        self.proc.wait()
        self.exit_time = time.time()
        self.exited.set()

    def go(self) -> None:
        """Tell a standby to train (it goes on once built)."""
        self.started = time.time()
        try:
            os.write(self._go, b"g")
        except BrokenPipeError:
            pass  # it died meanwhile: the watch sees its exit
        os.close(self._go)
        self._go = None

    def retire(self) -> None:
        """End a standby that was never needed: kill its process group, reap it."""
        if self._go is not None:
            os.close(self._go)
            self._go = None
        self.signal(signal.SIGKILL, group=True)
        self.exited.wait(10.0)
        self.reap()

    def signal(self, signum: int, group: bool = False) -> None:
        """Send ``signum`` to the child (or to its whole process group); gone already is fine."""
        try:
            if group:
                os.killpg(self.proc.pid, signum)
            else:
                self.proc.send_signal(signum)
        except (ProcessLookupError, PermissionError):
            pass

    def reap(self) -> None:
        """After the child exited: kill what is left of its process group, drain its stderr."""
        self.signal(signal.SIGKILL, group=True)
        self.tail.join(timeout=5.0)


@dataclass
class _Pending:
    """Failures not yet recovered from: when the first was detected, the highest step seen
    before them, and ``metrics.jsonl`` as it was at the latest one."""

    since: float
    last_step: int
    rows: list[dict]
    failures: int = 1


def _rows(path: Path) -> list[dict]:
    return read_jsonl(path) if path.exists() else []


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except FileNotFoundError:
        return None


class _Supervisor:
    """The restart loop behind ``supervise``: one child at a time, failures classified and logged."""

    def __init__(self, command: list[str], run_dir: Path, policy: RestartPolicy, env: dict | None,
                 pass_fds: tuple[int, ...], standby: bool = False, preload: tuple[str, ...] | None = None) -> None:
        self.command = command
        self.keep_standby = standby
        self.standby: _Child | None = None
        self.preload = preload
        self.template: Template | None = None
        self.run_dir = run_dir
        self.policy = policy
        self.env = env
        self.pass_fds = pass_fds
        self.events = EventLog(run_dir)
        self.metrics = run_dir / "metrics.jsonl"
        self.restarts = 0
        self.exponent = 0
        self.frontier = 0
        """The highest step any failure happened after."""
        self.incidents: list[dict] = []
        self.pending: _Pending | None = None
        self.child: _Child | None = None
        self.stop_signal: int | None = None
        self.wake = threading.Event()
        self.began = time.time()
        self.held_run = (run_dir / "config.yaml").exists()
        """The directory held a run when supervision began (one a resume check may refuse)."""
        self.refused = False

    def run(self) -> int:
        """Run children until one succeeds, a stop signal arrives or restarts run out."""
        started = time.monotonic()
        if self.preload is not None and self.command[1:2] == ["-m"]:
            self.template, why_not = Template.start(self.preload, shown=tuple(self.command[1:]))
            if self.template is None:
                print(f"reasonrl supervisor: each trainer starts as a process of its own: no template ({why_not})",
                      file=sys.stderr, flush=True)
            if self.stop_signal is not None:  # while the template imported: no child ran, nothing is written
                self.refused = True
                return 128 + self.stop_signal
        while True:
            child = self.child = self._next_child()
            hang, detected = self._watch(child)
            child.reap()
            returncode = child.proc.returncode
            if self.stop_signal is None and returncode == 0:
                if self.pending is not None:
                    self._recovered(child, finished=True)
                self._emit("done", self._last_step(), restarts=self.restarts, wall_s=time.monotonic() - started)
                return 0
            if self.stop_signal is None and returncode == EXIT_FATAL:
                # Bad config or data, a deterministic limit: the same command would fail the same way again.
                if not self._ours():
                    self.refused = True  # its checks failed, or maybe another run's directory: leave it as it was
                    return returncode
                tail = child.tail.text().strip()
                self._emit("fatal", self._last_step(), returncode=returncode,
                                 message=tail.rsplit("\n", 1)[-1] if tail else "")
                return returncode
            if self.stop_signal is None:
                incident = self._failure(child, hang, detected)
                if incident["backoff_s"] is None:
                    self._give_up(incident)
                    return returncode
                self.wake.wait(incident["backoff_s"])
            if self.stop_signal is not None:
                self._emit("stopped", self._last_step(), signal=_signal_name(self.stop_signal),
                                 returncode=returncode)
                return 128 + self.stop_signal
            self.restarts += 1

    def _emit(self, kind: str, step: int | None, **fields: Any) -> None:
        """Append an event to ``events.jsonl``; where it cannot be written (a full disk), put it
        on stderr instead (without the stderr tail and stack it repeats) and go on."""
        try:
            self.events.emit(kind, step, **fields)
        except OSError as err:
            shown = {k: v for k, v in fields.items() if k not in ("stderr_tail", "stack")}
            print(f"reasonrl supervisor: {WriteError.of(self.events.path, err)}; the event: "
                  + json.dumps({"kind": kind, "step": step, **shown}, default=str), file=sys.stderr, flush=True)

    def _ours(self) -> bool:
        """Whether the run directory is this run's (the module docstring): a child of this
        supervision has written to it where it held no run, or passed its resume check."""
        if not self.held_run:
            return any(p.name != LOCK_FILE for p in self.run_dir.iterdir())
        return any(e["kind"] == "resume" and e["time"] >= self.began for e in _rows(self.events.path))

    def _watch(self, child: _Child) -> tuple[tuple[str, float] | None, float]:
        """Wait for the child to exit, logging recovery and killing it if its heartbeat goes
        stale. Returns ``(stage, detect_s)`` when it was killed for that (else None) and the
        time the failure was noticed."""
        hang = None
        while not child.exited.wait(_POLL_S):
            if self.pending is not None:
                self._recovered(child)
            self._start_standby(child)
            if hang is None and self.stop_signal is None:
                hang = self._stale_heartbeat(child)
                if hang is not None:
                    child.signal(signal.SIGKILL, group=True)
        detected = time.time()
        if self.pending is not None:
            self._recovered(child)
        return hang, detected

    def _next_child(self) -> _Child:
        """The standby, told to go, when there is one alive; else a new trainer."""
        standby, self.standby = self.standby, None
        if standby is not None and standby.proc.poll() is None:
            standby.go()
            return standby
        if standby is not None:
            standby.reap()
        return _Child(self.command, {**(self.env or {}), ATTEMPT_ENV: str(self.restarts + 1)}, self.pass_fds,
                      template=self._live_template())

    def _live_template(self) -> Template | None:
        """The template to fork the next child from: None once it has ended, which is said once."""
        if self.template is not None and not self.template.alive():
            print("reasonrl supervisor: the trainer template ended; each trainer starts as a process of its own",
                  file=sys.stderr, flush=True)
            self.template.close()
            self.template = None
        return self.template

    def _start_standby(self, child: _Child) -> None:
        """Start a standby once ``child`` has trained a step (a metrics row written after its
        first heartbeat) and no failure is pending: its build then slows neither a start, nor
        the first step (whose stages the hang watchdog times), nor a recovery."""
        if not self.keep_standby or self.standby is not None or self.pending is not None or self.stop_signal is not None:
            return
        if child.first_beat is None:
            beat = _mtime(self.run_dir / HEARTBEAT)
            child.first_beat = beat if beat is not None and beat >= child.started else None
        elif (_mtime(self.metrics) or 0.0) > child.first_beat:
            env = {**(self.env or {}), ATTEMPT_ENV: str(self.restarts + 2)}  # a restart: no checks
            self.standby = _Child(self.command, env, self.pass_fds, standby=True, template=self._live_template())

    def retire_standby(self) -> None:
        """Kill the standby, if there is one (supervision is ending)."""
        standby, self.standby = self.standby, None
        if standby is not None:
            standby.retire()

    def _stale_heartbeat(self, child: _Child) -> tuple[str, float] | None:
        beat = _mtime(self.run_dir / HEARTBEAT)
        if beat is None or beat < child.started:
            return None  # this child has not beaten yet (start-up, warm start): nothing to time
        silent_s = time.time() - beat
        if silent_s <= self.policy.heartbeat_timeout_s:
            return None
        return self._stage(), silent_s

    def _stage(self) -> str:
        try:
            return (self.run_dir / HEARTBEAT).read_text(encoding="utf-8", errors="replace").strip()
        except FileNotFoundError:
            return ""

    def _last_step(self) -> int | None:
        rows = _rows(self.metrics)
        return rows[-1]["step"] if rows else None

    def _failure(self, child: _Child, hang: tuple[str, float] | None, detected: float) -> dict[str, Any]:
        """Classify the failed child, log it, and remember it until the run recovers."""
        rows = _rows(self.metrics)
        step = rows[-1]["step"] if rows else None
        kind, fields = self._classify(child, hang, detected)
        if detected - child.started >= self.policy.reset_after_s or (step or 0) > self.frontier:
            self.exponent = 0  # ran long, or got further than at any failure before: not a crash loop
        self.frontier = max(self.frontier, step or 0)
        giving_up = self.restarts >= self.policy.max_restarts
        fields["backoff_s"] = None if giving_up else self.policy.backoff(self.exponent)
        self.exponent += 1
        fields["stderr_tail"] = child.tail.text()
        self._emit(kind, step, **fields)
        incident = {"kind": kind, "step": step, **fields}
        self.incidents.append(incident)
        self._remember(detected, step, rows)
        self._announce(incident)
        return incident

    def _classify(self, child: _Child, hang: tuple[str, float] | None, detected: float) -> tuple[str, dict[str, Any]]:
        """The failure's kind and its fields: a hang (killed for a stale heartbeat, or a stack
        dump written during this attempt), a kill by a signal, or a crash."""
        returncode = child.proc.returncode
        fields: dict[str, Any] = {"attempt": self.restarts + 1, "started": child.started, "returncode": returncode}
        dump = self._move_dump(child.started)
        if hang is None and dump is None:
            fields["detect_s"] = detected - child.exit_time
            if returncode < 0:
                return "killed", {**fields, "signal": _signal_name(-returncode)}
            return "crash", fields
        if hang is not None:
            (stage, detect_s), source = hang, "heartbeat"
        else:
            beat = max(_mtime(self.run_dir / HEARTBEAT) or 0.0, child.started)
            stage, detect_s, source = self._stage(), detected - beat, "watchdog"
        return "hang", {**fields, "source": source, "stage": stage, "detect_s": detect_s,
                        **(dump or {"stack": "", "dump": ""})}

    def _move_dump(self, started: float) -> dict[str, str] | None:
        """``stack`` (at most ``STACK_CHARS`` characters) and ``dump`` (its new name) when this
        attempt wrote ``hang_dump.txt``, which is moved to the next free ``hang_dump.<n>.txt``."""
        dump = self.run_dir / HANG_DUMP
        found = read_hang_dump(dump) if (_mtime(dump) or 0.0) >= started else None
        if found is None:
            return None
        stack = found["stacks"]
        n = 1
        while (target := dump.with_name(f"hang_dump.{n}.txt")).exists():
            n += 1
        os.replace(dump, target)
        if len(stack) > STACK_CHARS:
            stack = stack[:STACK_CHARS] + f"\n... ({len(stack) - STACK_CHARS} more characters in {target.name})"
        return {"stack": stack, "dump": target.name}

    def _remember(self, detected: float, step: int | None, rows: list[dict]) -> None:
        if self.pending is None:
            self.pending = _Pending(since=detected, last_step=step or 0, rows=rows)
        else:
            self.pending.last_step = max(self.pending.last_step, step or 0)
            self.pending.rows = rows
            self.pending.failures += 1

    def _recovered(self, child: _Child, finished: bool = False) -> None:
        """Log ``recovered`` once the child has trained a step past the one it resumed from (a
        metrics row with a step time that is not one of the rows from before the failure), or
        has finished the run."""
        pending = self.pending
        resumes = [e for e in _rows(self.events.path) if e["kind"] == "resume" and e["time"] >= child.started]
        if not resumes and not finished:
            return
        from_step = resumes[-1]["from_step"] if resumes else pending.last_step
        rows = _rows(self.metrics)
        new = next((i for i, row in enumerate(rows) if "timing_s/step" in row and row["step"] > from_step
                    and (i >= len(pending.rows) or row != pending.rows[i])), None)
        if new is None and not finished:
            return
        step = rows[new]["step"] if new is not None else (rows[-1]["step"] if rows else None)
        self._emit("recovered", step, recover_s=time.time() - pending.since,
                         steps_lost=max(0, pending.last_step - from_step), from_step=from_step,
                         failures=pending.failures, warm=child.warm)
        self.pending = None

    def _announce(self, incident: dict[str, Any]) -> None:
        detail = incident.get("signal") or incident.get("stage") or f"exit code {incident['returncode']}"
        then = ("" if incident["backoff_s"] is None else
                f"; restart {self.restarts + 1}/{self.policy.max_restarts} in {incident['backoff_s']:.2f} s")
        print(f"reasonrl supervisor: {incident['kind']} at step {incident['step']} ({detail}){then}",
              file=sys.stderr, flush=True)

    def _give_up(self, incident: dict[str, Any]) -> None:
        last_line = incident["stderr_tail"].strip().rsplit("\n", 1)[-1] if incident["stderr_tail"].strip() else ""
        message = (f"gave up after {self.restarts} restarts (RestartPolicy.max_restarts="
                   f"{self.policy.max_restarts}): the last attempt ended with a {incident['kind']} at step "
                   f"{incident['step']} (return code {incident['returncode']})"
                   + (f": {last_line}" if last_line else "") + f"; see {self.events.path}")
        self._emit("gave_up", incident["step"], restarts=self.restarts, message=message)
        print(f"reasonrl supervisor: {message}", file=sys.stderr, flush=True)

    def on_signal(self, signum: int, frame) -> None:
        """Ctrl-C, SIGTERM or SIGHUP: ask the child to checkpoint and stop (SIGTERM); a second
        one kills it."""
        child = self.child
        if self.stop_signal is None:
            self.stop_signal = signum
            if child is not None:
                child.signal(signal.SIGTERM)
        elif child is not None:
            child.signal(signal.SIGKILL, group=True)
        self.wake.set()


def supervise(command: list[str], run_dir: Path, policy: RestartPolicy, env: dict | None = None,
              pass_fds: tuple[int, ...] = (), standby: bool = False,
              preload: tuple[str, ...] | None = None) -> SupervisorResult:
    """Run ``command`` (the trainer) until it exits 0, restarting it after failures.

    The child runs in its own process group with our stdout and stderr (its last stderr lines
    are kept for the events); ``env`` adds variables to ours and ``pass_fds`` are inherited.
    Each failure is classified as a hang, a kill by a signal or a crash and logged to
    ``run_dir/events.jsonl`` (see the module docstring); after ``policy.max_restarts``
    restarts a ``gave_up`` event ends supervision, and exit code 2 (an error that would repeat)
    ends it at once. SIGINT, SIGTERM and SIGHUP sent to this process (main thread only) are
    forwarded to the child as SIGTERM, so it checkpoints and exits; that is not a failure, the
    return code is then 128 + the signal's number, and a second signal kills the child.
    ``standby``: keep a standby child ready for the next restart (the module docstring).
    ``preload``: where ``command`` is ``python -m MODULE ...``, each child is forked from a
    template that imported these modules once (:class:`~reasonrl.runtime.zygote.Template`),
    which ends with supervision; where none starts, each child is a process of its own.
    """
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    sup = _Supervisor(list(command), run_dir, policy, env, tuple(pass_fds), standby, preload)
    handlers = {}
    if threading.current_thread() is threading.main_thread():
        handlers = {signum: signal.signal(signum, sup.on_signal) for signum in _STOP_SIGNALS}
    start = time.monotonic()
    try:
        returncode = sup.run()
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
        sup.retire_standby()
        if sup.child is not None and sup.child.proc.poll() is None:
            sup.child.signal(signal.SIGKILL, group=True)
            sup.child.proc.wait()
        if sup.template is not None:
            sup.template.close()
    return SupervisorResult(returncode, sup.restarts, sup.incidents, time.monotonic() - start, sup.refused)


def summarize_run(run_dir: Path, wall_s: float | None = None) -> dict[str, Any]:
    """The figures of :func:`~reasonrl.resilience.ettr.effective_time` for a run directory
    (``time_lost_s`` being its ``lost_s``), plus ``wall_s`` when given (one invocation's
    supervised seconds: informational, ETTR does not use it)."""
    run_dir = Path(run_dir)
    figures = effective_time(_rows(run_dir / "events.jsonl"), step_seconds(_rows(run_dir / "metrics.jsonl")))
    figures["time_lost_s"] = figures.pop("lost_s")
    if wall_s is not None:
        figures["wall_s"] = wall_s
    return figures


def write_summary(run_dir: Path, summary: dict[str, Any]) -> None:
    """Write ``run_dir/summary.json`` atomically (:func:`~reasonrl.metrics.write_atomic`)."""
    write_atomic(Path(run_dir) / "summary.json", json.dumps(summary, indent=2, sort_keys=True) + "\n")


def _remove_made(run_dir: Path, made_dir: bool) -> None:
    """Remove what :func:`train_supervised` made for a run its child refused: its lock file,
    and the directory (when it made that too and nothing else is in it)."""
    (run_dir / LOCK_FILE).unlink(missing_ok=True)
    if made_dir:
        try:
            run_dir.rmdir()
        except OSError:
            pass  # something else is in it: it stays


TRAINER_PRELOAD = ("reasonrl.cli", "reasonrl.api", "reasonrl.controller", *PRELOAD, "torch.utils.tensorboard")
"""What the trainer template imports (``resilience.trainer_template``): most of a trainer's
imports (Ray's not: it reads its settings when imported), seconds of CPU that each trainer
forked from it, a restart included, does not spend."""


def train_supervised(cfg: Config, command: list[str]) -> int:
    """Run ``command`` (a trainer) under the supervisor, holding the run directory's lock with
    it; write and print the run's summary (not when the child refused the directory:
    ``SupervisorResult.refused``; on stderr when ``summary.json`` cannot be written).
    RunDirError when the directory is unusable or another trainer holds it."""
    r = cfg.resilience
    # Chosen here, before the template loads torch, for every trainer: they say it, and do not choose again.
    waits = openmp_waits("a standby trainer builds beside the running one (resilience.standby)" if r.standby else "")
    # The parent's heartbeat check backs up the in-process watchdog, so it waits longer.
    heartbeat = 2 * r.hang_timeout_s if r.hang_timeout_s > 0 else float("inf")
    policy = RestartPolicy(max_restarts=r.max_restarts, backoff_s=r.backoff_s, heartbeat_timeout_s=heartbeat)
    run_dir = Path(cfg.run.dir)
    made_dir, made_lock = not run_dir.exists(), not (run_dir / LOCK_FILE).exists()
    check_run_dir(run_dir)
    lock = RunLock(run_dir, "supervisor").acquire()
    # The trainers' in-memory snapshots (resilience.snapshot_every): this supervision's only.
    snapshots = new_snapshot_dir() if r.snapshot_every > 0 else None
    try:
        pass_fds, env = lock.inherit()
        env[CHOICE_ENV] = waits
        if snapshots is not None:
            env[SNAPSHOT_ENV] = str(snapshots)
        result = supervise(command, run_dir, policy, env=env, pass_fds=pass_fds, standby=r.standby,
                           preload=TRAINER_PRELOAD if r.trainer_template else None)
        if result.refused:  # the child said why; the directory stays as it was
            if made_lock:
                _remove_made(run_dir, made_dir)
            return result.returncode
        summary = summarize_run(run_dir, wall_s=result.wall_s)
        try:
            write_summary(run_dir, summary)
        except OSError as err:  # a full disk: the summary goes to stderr, supervision ends as it would
            print(f"reasonrl supervisor: {WriteError.of(run_dir / 'summary.json', err)}; the summary: "
                  + json.dumps(summary, sort_keys=True), file=sys.stderr, flush=True)
    finally:
        if snapshots is not None:
            shutil.rmtree(snapshots, ignore_errors=True)
        lock.release()
    print(json.dumps({"restarts": result.restarts, **{k: summary[k] for k in ("ettr", "mttr_s", "time_lost_s", "steps_lost", "incidents")}}))
    return result.returncode
