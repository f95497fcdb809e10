"""The effective training time ratio (ETTR) of a run: one definition, from its event log.

    ETTR = productive / (productive + lost)

- ``productive``: the ``timing_s/step`` of every step in ``metrics.jsonl`` (each step once, its
  last row) whose update stands, that is all steps but the *wasted* ones: a step whose
  non-finite update was skipped (``nonfinite`` event), and the steps a rollback undid (from
  the step it restored, ``from_step``, exclusive, to the rollback's step).
- ``lost``: the time incidents cost.
  - A failure the supervisor restarted after (``crash``, ``killed``, ``hang``): from the moment
    the state the restart resumed from was in hand (the ``checkpoint`` event of that step, or
    the ``state_time`` of a resume from the in-memory snapshot, or the failed attempt's
    ``start`` when it is later) to the restarted trainer's ``resume``
    event. The steps done and lost in between, the detection, the back-off and the reload
    are all in it. Consecutive failures before one successful restart count once. The
    interval never reaches back before the invocation the failure happened in (the failure's
    ``started``, when its attempt began, and the last ``done``, ``stopped``, ``gave_up`` or
    ``fatal`` before it), and a failure no restart of its invocation resumed from counts from
    the newest ``checkpoint`` before it to that invocation's ``gave_up``, ``stopped`` or ``fatal``.
  - A rollback: the wasted steps' time plus the restore (``recover_s``).
  - A skipped non-finite step: its time.
  - A rollout worker lost within a step (``rollout_worker_died``, ``rollout_worker_hung``): the
    share of the fleet's generation it cost,

        seconds_lost / workers

    (``seconds_lost``: how long its unfinished groups had run before they moved to other
    workers; ``workers``: the fleet's size then), taken out of that step's productive time.
    One of ``workers`` workers' output over ``seconds_lost`` is generated again, which the
    fleet's output pays as that many seconds of all of it: a single worker's loss is its whole
    ``seconds_lost``, one of 64's a 64th. Its replacement starts beside the generation
    (``rollout_worker_joined``) and costs the step nothing.
- Neither: loading, validation and checkpoints outside an incident, and the time between two
  invocations of a run (a stopped run resumed later loses nothing).

``MTTR`` is the mean ``recover_s`` of the supervisor's ``recovered`` events (from the detection
of a failure to the first new trained step). The controller writes these figures to every
``metrics.jsonl`` row, the supervisor to ``summary.json`` and the report shows them: all three
call :func:`effective_time`, so they agree.
"""

from __future__ import annotations

import collections
from typing import Any

FAILURES = frozenset({"crash", "killed", "hang"})
"""Event kinds of a trainer that the supervisor saw fail (and restarts)."""

INCIDENT_KINDS = FAILURES | frozenset({
    "gave_up", "rollback", "nonfinite", "spike", "slowdown", "straggler", "checkpoint_failed", "checkpoint_skipped",
    "snapshot_failed", "snapshot_skipped",
    "reward_failed", "env_failed", "worker_restarted", "rollout_worker_died", "rollout_worker_hung",
    "rollout_worker_gone", "rollout_worker_quarantined", "rollout_groups_failed", "rollout_scale_failed", "run_failed",
    "write_failed",
})
"""Event kinds of a failure: the run's incidents (what ``incidents`` counts)."""

LIFECYCLE_KINDS = frozenset({
    "start", "resume", "recovered", "done", "stopped", "checkpoint", "slowdown_recovered", "straggler_recovered",
    "rollout_leftover", "rollout_started", "rollout_worker_joined", "rollout_worker_left", "rollout_scaled",
    "reward_scaled", "scale_deferred", "data_changed", "fault_injected", "fatal",
    "sweep_start", "sweep_done", "sweep_stopped", "run_start", "run_done",
})
"""Event kinds that record the run's (or a sweep's) course rather than a failure: starts, stops,
checkpoints, recoveries, resizes, a drill's injections (the failure an injection causes is an
event of its own) and a fatal error's end (the run stops; nothing is restarted)."""

ENDS = frozenset({"done", "stopped", "gave_up", "fatal"})
"""Event kinds that end an invocation of a run (the supervisor's last event)."""

WORKER_REPLACED = frozenset({"rollout_worker_died", "rollout_worker_hung"})
"""A rollout worker lost within a step: its ``seconds_lost`` (the time its unfinished groups
had run, which other workers generate again) over the fleet's ``workers`` count as lost time."""


def effective_time(events: list[dict[str, Any]], step_s: dict[int, float]) -> dict[str, Any]:
    """ETTR and its parts (module docstring) from the events (in file order) and
    ``step_s`` = {step: timing_s/step}: ``ettr``, ``productive_s``, ``lost_s``, ``mttr_s``,
    ``steps_lost`` (steps redone after failures, from the ``recovered`` events),
    ``steps_wasted`` (skipped or undone updates), ``steps`` and ``incidents`` (event counts by
    kind, of the :data:`INCIDENT_KINDS` only). ETTR is 1.0 before any time is counted."""
    wasted: set[int] = set()
    lost = in_steps = 0.0
    for event in events:
        kind = event["kind"]
        if kind in WORKER_REPLACED:  # inside a step's time: lost, not productive
            in_steps += event.get("seconds_lost", 0.0) / max(1, event.get("workers", 1))
        elif kind == "nonfinite" and event.get("action") == "skip":
            wasted.add(event["step"])
        elif kind == "rollback":
            undone = set(range(event.get("from_step", 0) + 1, event["step"] + 1))
            lost += event.get("recover_s", 0.0)
            wasted |= undone
    lost += _failure_time(events)
    wasted_s = sum(step_s.get(step, 0.0) for step in wasted)
    productive = max(0.0, sum(step_s.values()) - wasted_s - in_steps)
    lost += wasted_s + in_steps
    recoveries = [e for e in events if e["kind"] == "recovered"]
    total = productive + lost
    return {
        "ettr": productive / total if total > 0 else 1.0,
        "productive_s": productive,
        "lost_s": lost,
        "mttr_s": sum(e["recover_s"] for e in recoveries) / len(recoveries) if recoveries else 0.0,
        "steps_lost": sum(e.get("steps_lost", 0) for e in recoveries),
        "steps_wasted": len(wasted & set(step_s)),
        "steps": len(step_s),
        "incidents": dict(collections.Counter(e["kind"] for e in events if e["kind"] in INCIDENT_KINDS)),
    }


def _failure_time(events: list[dict[str, Any]]) -> float:
    """Seconds from the state each restart resumed from to that restart's ``resume`` event,
    once per restart that followed one or more failures, within the failure's invocation."""
    lost = 0.0
    floor = float("-inf")  # the end of the previous interval (or invocation): intervals never overlap
    i = 0
    while i < len(events):
        if events[i]["kind"] in ENDS:
            floor = max(floor, events[i]["time"])
        if events[i]["kind"] not in FAILURES:
            i += 1
            continue
        first = events[i]
        j = next((k for k in range(i + 1, len(events)) if events[k]["kind"] == "resume" or events[k]["kind"] in ENDS), None)
        end = events[j] if j is not None else None
        restarted = end is not None and end["kind"] == "resume"
        from_step = end.get("from_step", 0) if restarted else None
        before = events[:i]
        checkpoint = end.get("state_time") if restarted else None  # a resume from the snapshot
        if checkpoint is None:
            checkpoint = next((e["time"] for e in reversed(before)  # none resumed: the newest one stands
                               if e["kind"] == "checkpoint" and (not restarted or e["step"] == from_step)), None)
        start = next((e["time"] for e in reversed(before) if e["kind"] == "start"), None)
        anchors = [t for t in (checkpoint, start, first.get("started")) if t is not None]
        anchor = max([floor, *anchors]) if anchors else max(floor, first["time"])
        stop = end["time"] if end is not None else max(e["time"] for e in events[i:])
        lost += max(0.0, stop - anchor)
        floor = stop
        i = (j + (1 if restarted else 0)) if j is not None else len(events)
    return lost


def step_seconds(rows: list[dict[str, Any]]) -> dict[int, float]:
    """{step: timing_s/step} of ``metrics.jsonl`` rows, the last row of each step winning."""
    return {row["step"]: float(row["timing_s/step"]) for row in rows if "timing_s/step" in row}
