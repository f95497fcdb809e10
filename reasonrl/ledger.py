"""The prompt ledger: every draw of the run's prompt sampler has exactly one fate.

    ledger = check_ledger(run_dir)      # from prompts.jsonl and events.jsonl, nothing else
    print(ledger.describe())            # counts per fate, then every draw that breaks the rule
    ledger.ok                           # True when every draw has exactly one fate

A run records, per step (``prompts.jsonl``), the draws its collects made with their
scheduler fate (``kept``, ``all_correct``, ``all_wrong``, ``surplus``, ``aborted``, ``failed``: out
of retries on the rollout fleet), the kept
groups it trained and the kept groups dropped as stale; when it ends it records what was left
(the ``rollout_leftover`` event: draws of collects not yet reported, groups still queued, stale
drops not yet reported). A resumed run truncates ``prompts.jsonl`` to its checkpoint, so these
records describe one history whatever the kills, restarts and failovers along the way.

The rule: the draw indices are ``0..D-1`` with each recorded once; a ``kept`` draw is then
exactly one of trained (at a step), dropped stale, or queued at the stop; the other fates are
final. A draw breaks the rule when it is missing, drawn twice, trained twice, trained and
dropped, given an outcome without having been kept, or kept with no outcome at all (lost).
A run that has not finished has no ``rollout_leftover`` record for its last step: its kept
draws without an outcome may still be in flight, so its ledger is open, not ok.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from reasonrl.errors import InputError
from reasonrl.metrics import read_jsonl

FATES = ("trained", "stale", "all_correct", "all_wrong", "surplus", "aborted", "failed", "left_over")
"""The final fate of a draw, in the order :meth:`Ledger.describe` prints them."""


@dataclass
class Ledger:
    """The fates of a run's draws: ``counts`` per fate (:data:`FATES`), ``draws`` in all,
    ``problems`` (one line per draw that breaks the rule, naming it), ``open`` (kept draws with
    no outcome in a run that has not finished) and ``finished``."""

    draws: int
    counts: Counter = field(default_factory=Counter)
    problems: list[str] = field(default_factory=list)
    open: list[int] = field(default_factory=list)
    finished: bool = True

    @property
    def ok(self) -> bool:
        """Every draw has exactly one fate: no problem, and nothing open."""
        return not self.problems and not self.open

    def describe(self) -> str:
        """The counts per fate, the verdict, and every problem."""
        lines = [f"draws: {self.draws}"] + [f"  {fate:<12} {self.counts[fate]}" for fate in FATES]
        if self.open:
            lines.append(f"  {'in flight':<12} {len(self.open)} (the run has not finished: draws {_span(self.open)})")
        if self.ok:
            lines.append("ok: every draw has exactly one fate")
        else:
            lines.append(f"broken: {len(self.problems)} draws break the rule" if self.problems
                         else "open: the run has not finished, so some draws have no fate yet")
            lines += [f"  {p}" for p in self.problems]
        return "\n".join(lines)


def check_ledger(run_dir: str | Path) -> Ledger:
    """The ledger of the run in ``run_dir`` (see the module docstring for the rule)."""
    run_dir = Path(run_dir)
    path = run_dir / "prompts.jsonl"
    if not path.is_file():
        raise InputError(f"{path}: no such file; is {run_dir} a run directory (run.dir) with a finished step?")
    records = read_jsonl(path)
    for r in records:
        if not {"step", "drawn", "trained", "stale"} <= set(r):
            raise InputError(f"{path}: the record of step {r.get('step')} lacks one of step, drawn, trained, stale")
    last_step = records[-1]["step"] if records else 0
    leftovers = [e for e in read_jsonl(run_dir / "events.jsonl") if e.get("kind") == "rollout_leftover"] \
        if (run_dir / "events.jsonl").is_file() else []
    leftover = leftovers[-1] if leftovers and leftovers[-1]["step"] == last_step else None
    drawn = [(d, fate, r["step"]) for r in records for d, _, fate in r["drawn"]]
    outcomes = [(d, "trained", r["step"]) for r in records for d in r["trained"]]
    outcomes += [(d, "stale", r["step"]) for r in records for d in r["stale"]]
    if leftover is not None:
        drawn += [(d, fate, None) for d, _, fate in leftover["drawn"]]
        outcomes += [(d, "stale", None) for d in leftover["stale"]] + [(d, "left_over", None) for d in leftover["queued"]]

    ledger = Ledger(draws=len({d for d, _, _ in drawn}), finished=leftover is not None)
    fate_of: dict[int, str] = {}
    for d, fate, step in drawn:
        if d in fate_of:
            ledger.problems.append(f"draw {d}: drawn twice ({_at(step)})")
        else:
            fate_of[d] = fate
    top = max(fate_of, default=-1)
    missing = sorted(set(range(top + 1)) - set(fate_of))
    if missing:
        ledger.problems.append(f"draws {_span(missing)}: never recorded (the draws are 0..{top})")
    given: dict[int, tuple[str, int | None]] = {}
    for d, outcome, step in outcomes:
        if fate_of.get(d) != "kept":
            ledger.problems.append(f"draw {d}: {outcome} {_at(step)} but it was "
                                   + ("never drawn" if d not in fate_of else f"not kept ({fate_of[d]})"))
        elif d in given:
            ledger.problems.append(f"draw {d}: {given[d][0]} {_at(given[d][1])} and {outcome} {_at(step)}")
        else:
            given[d] = (outcome, step)
    for d, fate in sorted(fate_of.items()):
        if fate != "kept":
            ledger.counts[fate] += 1
        elif d in given:
            ledger.counts[given[d][0]] += 1
        elif leftover is None:
            ledger.open.append(d)
        else:
            ledger.problems.append(f"draw {d}: kept, then never trained, dropped or left over (lost)")
    return ledger


def _at(step: int | None) -> str:
    return "at the stop" if step is None else f"at step {step}"


def _span(draws: list[int]) -> str:
    """``0-3, 7, 9-10``: the draws as runs of consecutive indices."""
    runs: list[list[int]] = []
    for d in draws:
        if runs and d == runs[-1][1] + 1:
            runs[-1][1] = d
        else:
            runs.append([d, d])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)
