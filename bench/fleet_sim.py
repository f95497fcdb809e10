"""The rollout fleet at 1 to 64 workers, by simulation: ``bench/fleet.py --simulate`` (every figure simulated).

Two cores cannot run 64 rollout workers, so this drives the real rollout code with a latency
model. Real: the producer (:class:`~reasonrl.rollout.source.RolloutProducer`: prompt
sampler, rollout scheduler with dynamic sampling, prompt records), the router and failover
(:class:`~reasonrl.rollout.fleet.RolloutFleet`, with the run's fail-slow detector), the
staleness-bounded queue (:class:`~reasonrl.rollout.source.AsyncSource`), the rollout workers
(:class:`~reasonrl.workers.RolloutWorker`), the prompt records' writer (``prompts.jsonl``),
the event log, the ledger check (:func:`~reasonrl.ledger.check_ledger`) and ETTR
(:func:`~reasonrl.resilience.ettr.effective_time`). Modelled:

- generation: ``rollout.backend=sim`` (:mod:`reasonrl.rollout.sim`): no model, response
  lengths drawn from the distribution recorded from a real run, ``--seconds-per-token`` of
  modelled time per generated token of a worker;
- rewards: :class:`~reasonrl.rollout.sim.SimRewards` (the recorded per-prompt accuracy);
- the trainer: each step takes the real queue's batch, then ``--update-s`` modelled seconds,
  then publishes version + 1 (no tensors: the sim workers have no weights to load);
- the workers' machines: :class:`SimGroup`, a WorkerGroup of threads with simulated process
  ids, where starting a worker (a replacement) takes ``--start-s`` modelled seconds;
- faults, at modelled times: a worker death (its pending and later calls fail with
  WorkerDied, as a killed process's do), a hang (its calls never answer, as a SIGSTOPped
  process's), a slow worker (each generation call takes ``factor`` times as long), a worker
  leaving (the fleet's last worker takes no new calls; it finishes the ones it has).

Modelled seconds pass ``--time-scale`` times as fast in real time (0.05: a modelled minute in
3 s); every time the real code measures (step times, the trainer's idle time, seconds lost)
is divided by it, and every timeout it is given is multiplied by it. The harness's own
Python work therefore counts ``1 / time-scale`` times over; ``--overhead`` runs the same
configuration with no modelled time at all, which measures it.
"""

from __future__ import annotations

import itertools
import json
import queue
import random
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Callable

import yaml

from reasonrl.config import load
from reasonrl.data.splits import tokenize_prompts
from reasonrl.data.tokenizer import build_char_tokenizer
from reasonrl.env.splits import run_splits
from reasonrl.ledger import check_ledger
from reasonrl.metrics import EventLog, StepLog, read_jsonl
from reasonrl.models.loading import EMBEDDED_MAX_POSITIONS, load_tokenizer, model_context
from reasonrl.resilience.ettr import WORKER_REPLACED, effective_time
from reasonrl.resilience.guards import run_detectors
from reasonrl.restarts import RestartPolicy
from reasonrl.rollout.fleet import FLEET_CONCURRENT, RolloutFleet
from reasonrl.rollout.sim import SimRewards, Workload
from reasonrl.rollout.source import AsyncSource, RolloutProducer
from reasonrl.runtime import WorkerDied, WorkerTimeout
from reasonrl.runtime.group import ThreadGroup, gather
from reasonrl.runtime.topology import reset_start
from reasonrl.types import WeightsUpdate
from reasonrl.workers import RolloutWorker

RECIPE = Path(__file__).resolve().parent.parent / "reasonrl" / "recipes" / "dapo.yaml"

FIRST_PID = 1 << 22
"""Simulated process ids count up from here (above Linux's default pid_max, so never a real one)."""


class SimClock:
    """Modelled seconds, passing ``scale`` real seconds each."""

    def __init__(self, scale: float) -> None:
        self.scale = scale
        self.began = time.perf_counter()

    def zero(self) -> None:
        """Start counting modelled time now."""
        self.began = time.perf_counter()

    def now(self) -> float:
        """Modelled seconds since the clock started."""
        return (time.perf_counter() - self.began) / self.scale

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds * self.scale)

    def modelled(self, real_s: float) -> float:
        return real_s / self.scale


class SlowableWorker:
    """A rollout worker on a machine that may turn slow: while ``factor`` > 1 each generation
    call takes ``factor`` times as long (it sleeps for the difference, as the ``slow`` fault's
    wrapper does)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.factor = 1.0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def generate(self, *args, **kwargs):
        began = time.perf_counter()
        out = self.inner.generate(*args, **kwargs)
        if self.factor > 1:
            time.sleep((self.factor - 1) * (time.perf_counter() - began))
        return out


class _Life:
    """One life of a simulated worker (one simulated process): its thread, its calls in order,
    its pid. ``alive``, then ``frozen`` (answers nothing) or ``dead`` (every call fails)."""

    def __init__(self, pid: int, name: str) -> None:
        self.pid, self.state = pid, "alive"
        self.worker: Any = None
        self.lock = threading.Lock()
        self.pending: set[Future] = set()
        self.calls: queue.Queue = queue.Queue()
        self.thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while (call := self.calls.get()) is not None:
            future, fn, args, kwargs = call
            with self.lock:
                if self.state != "alive":
                    continue  # a frozen or dead process runs nothing more
            try:
                outcome = (True, fn(*args, **kwargs))
            except BaseException as err:  # noqa: BLE001 - delivered through the future
                outcome = (False, err)
            self._answer(future, outcome)

    def _answer(self, future: Future, outcome: tuple[bool, Any]) -> None:
        with self.lock:
            if self.state != "alive" or future.done():
                return  # a frozen process does not answer; a dead one's futures have failed already
            self.pending.discard(future)
        ok, value = outcome
        future.set_result(value) if ok else future.set_exception(value)

    def submit(self, fn: Callable, *args, concurrent: bool = False, **kwargs) -> Future:
        """``fn(*args, **kwargs)`` after the calls before it, or at once in the caller's thread
        (``concurrent``); a future that fails at once when the process is dead, and never
        finishes while it is frozen."""
        future: Future = Future()
        with self.lock:
            if self.state == "dead":
                future.set_exception(WorkerDied(f"simulated worker pid {self.pid} is dead"))
                return future
            self.pending.add(future)
            if self.state == "frozen":
                return future
        if concurrent:
            try:
                outcome = (True, fn(*args, **kwargs))
            except BaseException as err:  # noqa: BLE001
                outcome = (False, err)
            self._answer(future, outcome)
        else:
            self.calls.put((future, fn, args, kwargs))
        return future

    def end(self, state: str) -> None:
        """The process dies (``dead``: every pending call fails with WorkerDied) or stops (``frozen``)."""
        with self.lock:
            self.state = state
            failing = list(self.pending) if state == "dead" else []
            if state == "dead":
                self.pending.clear()
        for future in failing:
            if not future.done():
                future.set_exception(WorkerDied(f"simulated worker pid {self.pid} died with calls pending"))
        if state == "dead":
            self.calls.put(None)


class SimGroup:
    """A WorkerGroup of simulated worker processes: each a thread with a simulated pid,
    serving its calls in order (a method in ``concurrent`` at once, beside a running call).
    ``restart(i)`` ends worker ``i``'s process (its calls in flight fail) and starts a new one
    with a new pid, which takes ``start_s`` modelled seconds on ``clock`` (or the real time
    building it takes, when longer: ``slow_starts`` counts those). ``factory()`` builds a
    worker in its thread.

    The simulated machine room (the faults): :meth:`die`, :meth:`freeze`, :meth:`slow`,
    :meth:`leave`."""

    def __init__(self, factory: Callable[[], Any], count: int, *, name: str, timeout_s: float, clock: SimClock,
                 start_s: float, concurrent: tuple[str, ...] = ()) -> None:
        self.factory, self.name, self.timeout_s, self.clock, self.start_s = factory, name, timeout_s, clock, start_s
        self.concurrent = frozenset(concurrent)
        self._pids = itertools.count(FIRST_PID)
        self._lock = threading.Lock()
        self.slow_starts = 0
        self.lives: list[_Life] = []
        """Every worker slot's current life; the first :attr:`size` take calls."""
        self._ended: list[_Life] = []
        """The lives replaced by a restart, whose threads may still finish a call."""
        self.size = count
        try:
            self.lives = [self._start(i) for i in range(count)]
            gather([life.submit(self._build, life) for life in self.lives], timeout_s, f"{name}: building the workers")
        except BaseException:
            self.close()
            raise

    def _start(self, index: int) -> _Life:
        return _Life(next(self._pids), f"reasonrl-sim-{self.name}{index}")

    def _build(self, life: _Life) -> None:
        life.worker = self.factory()

    @property
    def pids(self) -> list[int]:
        with self._lock:
            return [life.pid for life in self.lives]

    def submit(self, method: str, *args: Any, **kwargs: Any) -> list[Future]:
        return [self.submit_to(i, method, *args, **kwargs) for i in range(self.size)]

    def submit_to(self, index: int, method: str, *args: Any, **kwargs: Any) -> Future:
        with self._lock:
            life = self.lives[index]
        return life.submit(lambda: getattr(life.worker, method)(*args, **kwargs), concurrent=method in self.concurrent)

    def call(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        return gather(self.submit(method, *args, **kwargs), self.timeout_s, f"{self.name}.{method}")

    def restart(self, index: int) -> None:
        """Replace worker ``index`` by a new process (``start_s`` modelled seconds)."""
        began = time.perf_counter()
        with self._lock:
            old = self.lives[index]
        old.end("dead")
        with self._lock:
            self._ended.append(old)
        life = self._start(index)
        life.submit(self._build, life).result(timeout=self.timeout_s)
        left = self.start_s * self.clock.scale - (time.perf_counter() - began)
        if left > 0:
            time.sleep(left)
        else:
            self.slow_starts += 1
        with self._lock:
            self.lives[index] = life

    def kill(self) -> None:
        with self._lock:
            lives = list(self.lives)
        for life in lives:
            life.end("dead")

    def close(self) -> None:
        """Close every worker after the calls it holds, and wait (``timeout_s`` at most) for
        every thread that served one, the replaced ones' included, to end: a thread left inside
        a torch call when the interpreter exits is ended by Python in C++ code, which aborts the
        process ("terminate called without an active exception")."""
        with self._lock:
            lives, ended = list(self.lives), list(self._ended)
        for life in lives:
            close = getattr(life.worker, "close", None)
            if close is not None:
                life.submit(close)
            life.calls.put(None)
        deadline = time.perf_counter() + self.timeout_s
        for life in lives + ended:
            life.thread.join(timeout=max(0.0, deadline - time.perf_counter()))

    # ------------------------------------------------------------ the machine room
    def running(self) -> list[int]:
        """The workers taking calls whose process runs (neither dead nor frozen)."""
        with self._lock:
            return [i for i, life in enumerate(self.lives[: self.size]) if life.state == "alive"]

    def die(self, index: int) -> int:
        """Worker ``index``'s process dies (SIGKILL); its pid."""
        with self._lock:
            life = self.lives[index]
        life.end("dead")
        return life.pid

    def freeze(self, index: int) -> int:
        """Worker ``index``'s process stops answering (SIGSTOP) until it is replaced; its pid."""
        with self._lock:
            life = self.lives[index]
        life.end("frozen")
        return life.pid

    def slow(self, index: int, factor: float) -> int:
        """Worker ``index``'s machine turns ``factor`` times slower (its replacement is not); its pid."""
        with self._lock:
            life = self.lives[index]
        life.worker.factor = factor
        return life.pid

    def leave(self) -> int:
        """The last worker takes no new calls (the fleet stops seeing it); the calls it holds
        finish. Its index."""
        with self._lock:
            if self.size <= 1:
                raise ValueError(f"{self.name}: the last worker cannot leave")
            self.size -= 1
            return self.size


# ---------------------------------------------------------------- faults
FAULT_KINDS = ("death", "hang", "slow", "leave")
"""What the fault script can do to the simulated workers."""


def parse_at(text: str) -> list[tuple[float, str, dict]]:
    """``--at``: comma-separated ``kind@seconds[:worker=W][:factor=F]`` items (kind one of
    :data:`FAULT_KINDS`; ``worker`` for a death, hang or slow worker, else one drawn among the
    running ones; ``factor`` for slow, default 3)."""
    script = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        head, *options = item.split(":")
        kind, _, at = head.partition("@")
        fields = dict(option.split("=", 1) for option in options)
        if kind not in FAULT_KINDS or not at or not set(fields) <= {"worker", "factor"}:
            raise SystemExit(f"--at {item!r}: expected kind@seconds[:worker=W][:factor=F], kind one of "
                             f"{', '.join(FAULT_KINDS)}")
        parsed: dict[str, Any] = {"factor": float(fields.get("factor", 3.0))} if kind == "slow" else {}
        if "worker" in fields:
            parsed["worker"] = int(fields["worker"])
        script.append((float(at), kind, parsed))
    return script


def fault_script(args, workers: int) -> list[tuple[float, str, dict]]:
    """(modelled time, kind, fields) of every scripted fault, in time order: those of ``--at``,
    and deaths, hangs and leaves at even intervals (``--deaths-per-min``, ``--hangs-per-min``,
    ``--leaves-per-min``; the first death after one interval, the first hang after 1.5, the
    first leave after 1.25, so that kinds of equal rates do not coincide); ``--slow K:F`` slows
    K workers drawn with ``--fault-seed`` F times from the start. A death, hang or slow worker
    without a ``worker`` hits one drawn among the running ones when it happens (``pick``, a
    uniform drawn here with ``--fault-seed``); a leave is always the last worker's."""
    rng = random.Random(args.fault_seed)
    script = parse_at(args.at)
    for kind, rate, offset in (("death", args.deaths_per_min, 0.0), ("hang", args.hangs_per_min, 0.5),
                               ("leave", args.leaves_per_min, 0.25)):
        if rate > 0:
            every = 60.0 / rate
            script += [(every * (k + offset), kind, {}) for k in range(1, int(args.horizon_s / every) + 1)]
    if args.slow:
        count, factor = args.slow.split(":")
        script += [(0.0, "slow", {"worker": w, "factor": float(factor)}) for w in rng.sample(range(workers), int(count))]
    script.sort(key=lambda e: e[0])
    return [(at, kind, fields if "worker" in fields or kind == "leave" else {**fields, "pick": rng.random()})
            for at, kind, fields in script]


class FaultRunner:
    """Applies the fault script to a SimGroup at its modelled times, on a thread of its own,
    writing ``sim_fault`` events (kind, worker, pid)."""

    def __init__(self, group: SimGroup, script: list[tuple[float, str, dict]], clock: SimClock,
                 emit: Callable[..., None]) -> None:
        self.group, self.script, self.clock, self.emit = group, script, clock, emit
        self.applied: list[dict] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="reasonrl-sim-faults", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        for at, kind, fields in self.script:
            if self._stop.wait(max(0.0, at - self.clock.now()) * self.clock.scale):
                return
            g = self.group
            if kind == "leave":
                if g.size <= 1:
                    continue
                record = {"fault": kind, "worker": g.leave()}
            else:
                if "worker" in fields:
                    worker = fields["worker"]
                else:  # a worker whose process still runs (a dead or stopped one not replaced yet is spared)
                    alive = g.running()
                    if not alive:
                        continue
                    worker = alive[int(fields["pick"] * len(alive))]
                act = {"death": g.die, "hang": g.freeze, "slow": lambda w: g.slow(w, fields["factor"])}[kind]
                record = {"fault": kind, "worker": worker, "pid": act(worker),
                          **({"factor": fields["factor"]} if kind == "slow" else {})}
            record["at_s"] = round(at, 3)
            self.applied.append(record)
            self.emit("sim_fault", **record)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


# ---------------------------------------------------------------- the run
def model_dir(root: Path) -> Path:
    """A model directory without weights: the embedded character tokenizer and a config.json
    with its vocabulary and context (what the sim workers and the prompts need)."""
    tokenizer = build_char_tokenizer()
    tokenizer.save_pretrained(root)
    (root / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": len(tokenizer),
                                                  "max_position_embeddings": EMBEDDED_MAX_POSITIONS,
                                                  "eos_token_id": tokenizer.eos_token_id}))
    return root


def sim_config(args, run_dir: Path, seconds_per_token: float):
    """The DAPO recipe with the simulated fleet's settings (``rollout.backend=sim``), on the
    recorded run's task families and response limit."""
    scale, workload = args.time_scale, Workload.load()
    overrides = [
        f"run.dir={run_dir}", f"run.seed={args.seed}", f"train.total_steps={args.steps}",
        f"train.prompts_per_step={args.prompts_per_step}", f"train.mini_batch_size={args.prompts_per_step * 8}",
        "train.micro_batch_size=8", "rollout.backend=sim", f"rollout.sim_seconds_per_token={seconds_per_token}",
        f"rollout.max_new_tokens={workload.max_new_tokens}",  # the recorded lengths as they are
        f"data.families=[{','.join(workload.recorded['families'])}]",  # the recorded run's prompts
        f"rollout.sim_time_scale={scale}", f"rollout.max_staleness={args.staleness}", "rollout.mode=async",
        f"runtime.roles.rollout.count={args.workers}", f"runtime.roles.rollout.timeout_s={args.timeout_s * scale}",
        f"resilience.rollout_restarts={args.max_restarts}", f"resilience.slow_min_s={0.5 * scale}",
        *(["algo.off_policy=tis"] if args.staleness else []),
    ]
    return load(RECIPE, overrides)


def run_sim(args, seconds_per_token: float, update_s: float, fault_free: bool, root: Path) -> dict:
    """One simulated run; its figures (modelled seconds)."""
    run_dir = root / f"{'free' if fault_free else 'faults'}-spt{seconds_per_token:g}"
    cfg = sim_config(args, run_dir, seconds_per_token)
    clock = SimClock(args.time_scale)
    directory = model_dir(root / "model")
    prompts, ids, pad_id = _prompts(cfg, directory)
    events = EventLog(run_dir)
    step = 0
    emit = lambda kind, **fields: events.emit(kind, step, **fields)  # noqa: E731
    _, detector = run_detectors(cfg.resilience, events)
    role = cfg.runtime.roles.rollout
    workload = Workload.load()
    group = SimGroup(lambda: SlowableWorker(RolloutWorker(cfg, directory)), args.workers, name="rollout",
                     timeout_s=max(role.timeout_s, 60.0), clock=clock, start_s=args.start_s, concurrent=FLEET_CONCURRENT)
    fleet = RolloutFleet(group, pad_id=pad_id, streams=False, episodic=False, timeout_s=role.timeout_s,
                         restarts=RestartPolicy(budget=cfg.resilience.rollout_restarts),
                         group_retries=cfg.rollout.group_retries, failures=(WorkerDied, WorkerTimeout),
                         quarantine_ratio=role.quarantine_ratio, quarantine_steps=role.quarantine_steps,
                         quarantine_min_s=cfg.resilience.slow_min_s, detector=detector, clock=lambda: step + 1,
                         emit=emit)
    producer = RolloutProducer(cfg, fleet, SimRewards(workload, cfg.run.seed), prompts, ids, pad_id)

    def launch() -> ThreadGroup:
        return ThreadGroup(lambda p: p, [(producer,)], name="rollout producer", timeout_s=role.timeout_s,
                           concurrent=("offer_weights", "stage_weights", "pids"))

    source = AsyncSource(launch, WeightsUpdate(0, {}), n=cfg.rollout.n, pad_id=pad_id, want=cfg.train.prompts_per_step,
                         max_staleness=cfg.rollout.max_staleness, lockstep=False,
                         timeout_s=args.collect_timeout_s * args.time_scale, emit=emit)
    faults = FaultRunner(group, [] if fault_free else fault_script(args, args.workers), clock, emit)
    records = StepLog(run_dir / "prompts.jsonl")
    steps: list[dict] = []
    version = 0
    began = time.perf_counter()
    clock.zero()
    try:
        source.publish(WeightsUpdate(0, {}))  # the producer starts and collects ahead
        faults.start()
        while step < args.steps:
            t0 = time.perf_counter()
            got = source.next_batch(version)
            clock.sleep(update_s)  # the modelled update
            version += 1
            source.publish(WeightsUpdate(version, {}))
            step += 1
            records.log(step, got.record)
            r = got.scored.rollout
            oldest = r.oldest_versions().view(-1, cfg.rollout.n).amin(1)
            steps.append({"step_s": time.perf_counter() - t0, "idle_s": got.metrics["timing_s/trainer_idle"],
                          "rows": r.size, "tokens": got.metrics["batch/generated_tokens"],
                          "staleness": (version - 1 - oldest).tolist()})
        events.emit("rollout_leftover", step, **source.leftover())
        for collect, _, _ in list(source.outstanding):  # collects ahead end here, not beside the next run
            collect.exception(timeout=args.collect_timeout_s * args.time_scale)
    finally:
        faults.stop()
        records.close()
        wall = time.perf_counter() - began
        source.close()
        group.close()
    return {**summarize(args, run_dir, clock, steps, seconds_per_token), "real_s": round(wall, 2),
            "faults": "none" if fault_free else "scripted", "faults_applied": faults.applied,
            "slow_starts": group.slow_starts}


def _prompts(cfg, directory: Path):
    """The training prompts of ``cfg`` with their token ids, and the padding id."""
    tokenizer = load_tokenizer(directory)
    splits = run_splits(cfg, reset_start(cfg))
    train = tokenize_prompts(splits.train, tokenizer, cfg, model_context(directory), splits.train_from)
    return train.prompts, train.ids, tokenizer.pad_token_id


def summarize(args, run_dir: Path, clock: SimClock, steps: list[dict], seconds_per_token: float) -> dict:
    """A run's figures in modelled seconds: ETTR, the ledger and the incidents over the whole
    run; the step time, the trainer's idle time and the throughput over the steps after
    ``--warmup``; the staleness of every trained group."""
    events = read_jsonl(run_dir / "events.jsonl")
    ends = [i for i, e in enumerate(events) if e["kind"] == "rollout_leftover"]
    events = events[: ends[-1] + 1] if ends else events  # the run ends at its leftover record
    ettr = effective_time(events, {i + 1: s["step_s"] for i, s in enumerate(steps)})
    replaced = [e for e in events if e["kind"] in WORKER_REPLACED]
    joined = [e for e in events if e["kind"] == "rollout_worker_joined"]
    ledger = check_ledger(run_dir)
    sim = clock.modelled
    measured = steps[args.warmup:] or steps
    total = lambda key: sum(s[key] for s in measured)  # noqa: E731
    run_s = sim(total("step_s"))
    ideal = args.workers / seconds_per_token if seconds_per_token else None
    tokens_per_s = total("tokens") / run_s if run_s else 0.0
    return {
        "simulated": True,
        "steps": len(steps),
        "steps_measured": len(measured),
        "step_s_median": round(sim(statistics.median(s["step_s"] for s in measured)), 3),
        "step_s_mean": round(run_s / len(measured), 3),
        "ettr": round(ettr["ettr"], 4),
        "ledger_ok": ledger.ok,
        "ledger": dict(ledger.counts),
        "ledger_problems": ledger.problems[:5] + ([f"{len(ledger.open)} draws open"] if ledger.open else []),
        "trainer_idle_frac": round(total("idle_s") / total("step_s"), 4),
        "trainer_idle_s_per_step": round(sim(total("idle_s")) / len(measured), 3),
        "trained_samples_per_s": round(total("rows") / run_s, 3) if run_s else None,
        "tokens_per_s": round(tokens_per_s, 2),
        "ideal_tokens_per_s": round(ideal, 2) if ideal else None,
        "throughput_vs_ideal": round(tokens_per_s / ideal, 4) if ideal else None,
        "staleness": {str(k): v for k, v in sorted(Counter(a for s in steps for a in s["staleness"]).items())},
        "groups_moved": sum(e.get("groups_moved", 0) for e in replaced),
        "seconds_lost": round(sim(sum(e.get("seconds_lost", 0.0) for e in replaced)), 2),
        "incidents": ettr["incidents"],
        "join_times_s": [round(sim(e["seconds"]), 2) for e in joined],
    }


# ---------------------------------------------------------------- the command line
def add_sim_arguments(group) -> None:
    """The options of ``bench/fleet.py --simulate`` (modelled seconds)."""
    group.add_argument("--workers", type=int, default=64, help="rollout workers, 1 to 64")
    group.add_argument("--staleness", type=int, default=1, help="rollout.max_staleness, 0 to 4 (async)")
    group.add_argument("--prompts-per-step", type=int, default=None, help="train.prompts_per_step (default 2 per worker)")
    group.add_argument("--seconds-per-token", type=float, default=0.03,
                       help="modelled seconds a worker spends per generated token (rollout.sim_seconds_per_token)")
    group.add_argument("--update-s", type=float, default=40.0, help="modelled seconds of the trainer's update a step")
    group.add_argument("--start-s", type=float, default=20.0,
                       help="modelled seconds a new worker process takes to start and load the weights")
    group.add_argument("--timeout-s", type=float, default=120.0,
                       help="modelled seconds a worker may be silent (runtime.roles.rollout.timeout_s)")
    group.add_argument("--collect-timeout-s", type=float, default=3600.0, help="modelled seconds a collect may take")
    group.add_argument("--time-scale", type=float, default=0.1, help="real seconds per modelled second")
    group.add_argument("--deaths-per-min", type=float, default=1.0, help="worker deaths per modelled minute")
    group.add_argument("--hangs-per-min", type=float, default=0.0, help="worker hangs per modelled minute")
    group.add_argument("--leaves-per-min", type=float, default=0.0, help="workers leaving per modelled minute")
    group.add_argument("--slow", default="", help="K:F: K workers, drawn with --fault-seed, F times slower from the start")
    group.add_argument("--at", default="",
                       help="faults at given times: kind@seconds[:worker=W][:factor=F],... (death, hang, slow, leave)")
    group.add_argument("--fault-seed", type=int, default=0, help="seed of the workers the faults hit")
    group.add_argument("--max-restarts", type=int, default=10000, help="resilience.rollout_restarts")
    group.add_argument("--no-compare", action="store_true", help="skip the fault-free run of each seed (with faults scripted)")
    group.add_argument("--keep", default=None,
                       help="write the run directories here (reasonrl ledger DIR/<run> reads them); default: a temporary one")
    group.add_argument("--overhead", action="store_true",
                       help="also run each seed fault-free with no modelled time: the harness's own time")


def simulate(args, seeds: list[int], machine: dict, commit: str) -> dict:
    """Per seed, the fault-free run and the run with the scripted faults (only the first when
    no fault is scripted, only the second with ``--no-compare``; with ``--overhead`` also the
    run with no modelled time); their figures and medians over seeds, the scripted run's at
    the top (the fault-free run's when none is scripted)."""
    if not 1 <= args.workers <= 64:
        raise SystemExit(f"--workers {args.workers}: expected 1 to 64")
    if not 0 <= args.staleness <= 4:
        raise SystemExit(f"--staleness {args.staleness}: expected 0 to 4")
    args.steps = args.steps or 20
    args.prompts_per_step = args.prompts_per_step or 2 * args.workers
    args.horizon_s = 86400.0
    workload = Workload.load()
    scripted = bool(fault_script(args, args.workers))
    out: dict = {
        "bench": "fleet", "simulated": True, "machine": machine, "commit": commit, "seeds": seeds,
        "workers": args.workers, "max_staleness": args.staleness, "steps": args.steps, "warmup": args.warmup,
        "model": {"prompts_per_step": args.prompts_per_step, "n": 8, "seconds_per_token": args.seconds_per_token,
                  "update_s": args.update_s, "start_s": args.start_s, "timeout_s": args.timeout_s,
                  "time_scale": args.time_scale, "deaths_per_min": args.deaths_per_min,
                  "hangs_per_min": args.hangs_per_min, "leaves_per_min": args.leaves_per_min, "slow": args.slow,
                  "at": args.at,
                  "max_new_tokens": workload.max_new_tokens, "lengths": "as recorded, not stretched",
                  "mean_length": round(workload.mean_length(), 3), "workload": workload.recorded},
    }
    runs: dict[str, list[dict]] = {"faults": [], "free": [], "overhead": []}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = args.keep or tmp
        for seed in seeds:
            args.seed = seed
            plan = [("free", args.seconds_per_token, args.update_s, True)] if not (scripted and args.no_compare) else []
            if scripted:
                plan.append(("faults", args.seconds_per_token, args.update_s, False))
            if args.overhead:
                plan.append(("overhead", 0.0, 0.0, True))
            for name, spt, update_s, fault_free in plan:
                result = {"seed": seed, **run_sim(args, spt, update_s, fault_free, Path(tmp) / f"s{seed}-{name}")}
                runs[name].append(result)
                print(json.dumps({"run": name, **{k: v for k, v in result.items() if k != "faults_applied"}}),
                      file=sys.stderr, flush=True)
    out.update(combined(runs["faults"] or runs["free"]))  # no fault scripted: the fault-free figures
    if runs["free"] and runs["faults"]:
        out["fault_free"] = combined(runs["free"])
        free, faulty = out["fault_free"]["trainer_idle_s_per_step"], out["trainer_idle_s_per_step"]
        out["idle_vs_fault_free"] = round(faulty / free, 4) if free else None
        # the idle seconds a step the faults add, as a share of the fault-free step
        out["idle_rise_vs_step"] = round((faulty - free) / out["fault_free"]["step_s_mean"], 4)
    if runs["overhead"]:
        out["overhead"] = combined(runs["overhead"])
    out["runs"] = runs
    return out


def combined(runs: list[dict]) -> dict:
    """Medians over seeds of the ratios and times; the staleness counts, groups moved, seconds
    lost and join times of every run together; ``ledger_ok`` when every run's ledger is clean."""
    median = lambda key: round(statistics.median(r[key] for r in runs), 4) if all(r[key] is not None for r in runs) else None  # noqa: E731
    staleness: Counter = Counter()
    for r in runs:
        staleness.update({int(k): v for k, v in r["staleness"].items()})
    return {
        "ettr": median("ettr"),
        "ledger_ok": all(r["ledger_ok"] for r in runs),
        "trainer_idle_frac": median("trainer_idle_frac"),
        "trainer_idle_s_per_step": median("trainer_idle_s_per_step"),
        "step_s_median": median("step_s_median"),
        "step_s_mean": median("step_s_mean"),
        "trained_samples_per_s": median("trained_samples_per_s"),
        "throughput_vs_ideal": median("throughput_vs_ideal"),
        "staleness": {str(k): v for k, v in sorted(staleness.items())},
        "groups_moved": sum(r["groups_moved"] for r in runs),
        "seconds_lost": round(sum(r["seconds_lost"] for r in runs), 2),
        "join_times_s": [t for r in runs for t in r["join_times_s"]],
    }


# ---------------------------------------------------------------- recording the workload
def record_workload(run_dir: Path, command: str, commit: str) -> dict:
    """The workload of a finished run (``reasonrl train ... run.keep_samples`` > 0): from its
    validation samples (``samples.jsonl``, split ``val``, the k sampled ones, not the greedy
    one) the response lengths, whether each hit the limit, and each prompt's correct count
    out of k. Validation samples are every response the policy gave, unfiltered, where the
    training batch holds only the groups dynamic sampling kept."""
    rows = [r for r in read_jsonl(run_dir / "samples.jsonl") if r["split"] == "val" and not r.get("greedy")]
    if not rows:
        raise SystemExit(f"{run_dir}/samples.jsonl: no sampled validation records")
    resolved = yaml.safe_load((run_dir / "config.yaml").read_text(encoding="utf-8"))
    limit = resolved["eval"]["max_new_tokens"] or resolved["rollout"]["max_new_tokens"]
    lengths = [0] * limit
    truncated = 0
    for r in rows:
        if r["truncated"]:
            truncated += 1
        else:
            lengths[r["length"] - 1] += 1
    per_prompt: dict[tuple[int, str], list[bool]] = {}
    for r in rows:
        per_prompt.setdefault((r["step"], r["prompt_id"]), []).append(bool(r["correct"]))
    k = Counter(len(v) for v in per_prompt.values()).most_common(1)[0][0]
    accuracy = [0] * (k + 1)
    for v in per_prompt.values():
        if len(v) == k:
            accuracy[sum(v)] += 1
    return {
        "recorded": {
            "what": (f"response lengths (tokens, EOS included) of the {len(rows)} sampled validation responses "
                     f"(eval.k={k} at T=1 for each held-out prompt, greedy ones left out) at the validations of "
                     f"steps {sorted({r['step'] for r in rows})}; per-prompt correct counts out of k from the "
                     "same samples. Lengths as recorded, not scaled (the sim stretches them only when "
                     "rollout.max_new_tokens differs, and says so)."),
            "command": command,
            "commit": commit,
            "families": list(resolved["data"]["families"]),
        },
        "max_new_tokens": limit,
        "lengths": lengths,
        "truncated": truncated,
        "prompt_accuracy": accuracy,
    }
