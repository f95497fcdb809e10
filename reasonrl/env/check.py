"""``env_check``: play an environment for a few episodes and report what is wrong with it.

    report = env_check("grid", {"size": 4}, episodes=20, policy="scripted")
    print(report.describe())          # returns, lengths, success rate, timing, then PASS or the problems
    report.problems                   # [] when it passed

Every episode runs twice at once on the same seed with the same actions, in two slots of an
:class:`~reasonrl.env.pool.EnvPool` over ``workers`` (a
:class:`~reasonrl.runtime.pool.PoolStart` of one worker process, as ``reasonrl env-check``
gives it: a hanging call is reported after its timeout, never waited on; None: in this
process). Problems found:

- a reset or step that raises, returns the wrong types (:func:`~reasonrl.env.base.check_step`'s
  message, naming the method and the field), or takes longer than the workers' timeout;
- the two copies disagreeing: a reset whose observation is not determined by its seed, or a
  step whose transition (observation, reward, terminated, truncated) is not determined by the
  seed and the actions so far (an env drawing from a random state it shares with other envs,
  such as the ``random`` module's, disagrees too: it would in a pool);

and warned about (a warning does not fail the check): a seed that changes nothing observable.
Seed dependence is judged over whole episodes: the first observations of the seeds, and when
those are all the same (guess-the-number: the secret shows only in the rewards), the first
episode's actions replayed on every other seed, comparing each step's observation, reward,
terminated and truncated. Only when every seed gives the same replay is the seed ignored.

Policies: ``random`` plays the env's ``sample_action(rng)`` when it has one, else random short
strings; ``scripted`` plays its ``demonstration(seed)``. An episode still running after
``max_turns`` turns (or after the demonstration) is cut, which is not a problem.
"""

from __future__ import annotations

import random
import statistics
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from reasonrl.env.registry import env_attribute, make_env
from reasonrl.env.pool import EnvFailure, EnvPool
from reasonrl.env.tools import TOOL_CALL_PATTERN, TOOL_RESPONSE_FORMAT
from reasonrl.errors import InputError

POLICIES = ("random", "scripted")
RANDOM_ALPHABET = "UDLRab01 :"
"""The characters of the random actions played when the env has no ``sample_action``."""
_BAR_CHARS = 30
_HISTOGRAM_BINS = 5


@dataclass
class EnvCheckReport:
    """What :func:`env_check` saw: per played episode its return (sum of rewards), length (policy
    turns) and success; how the episodes ended (``terminated``, ``truncated``, ``cut``,
    ``failed``); the seconds each reset and step took inside the env; and the problems, one
    line each (a repeated problem once, with the number of episodes it was seen in); the
    warnings, one line each, do not fail it."""

    name: str
    args: dict[str, Any]
    policy: str
    seeds: range
    problems: list[str] = field(default_factory=list)
    returns: list[float] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)
    successes: list[bool] = field(default_factory=list)
    endings: Counter[str] = field(default_factory=Counter)
    reset_s: list[float] = field(default_factory=list)
    step_s: list[float] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.problems

    @property
    def success_rate(self) -> float:
        """The fraction of played episodes (those that did not fail) that succeeded."""
        return sum(self.successes) / len(self.successes) if self.successes else 0.0

    @property
    def timing(self) -> dict[str, tuple[float, float]]:
        """``{"reset": (median_s, max_s), "step": (median_s, max_s)}`` (zeros when none ran)."""
        return {name: (statistics.median(times), max(times)) if times else (0.0, 0.0)
                for name, times in (("reset", self.reset_s), ("step", self.step_s))}

    def describe(self) -> str:
        """The report as text: the returns (min, mean, max and a histogram), lengths, success
        rate, endings and timing, the warnings, then ``PASS`` or ``FAIL`` and the problems."""
        seeds = f"seed {self.seeds.start}" if len(self.seeds) == 1 else f"seeds {self.seeds.start}..{self.seeds[-1]}"
        lines = [f"env-check {self.name} {self.args} (policy {self.policy}, {len(self.seeds)} episodes, {seeds})"]
        if self.returns:
            lines.append(f"return:  {_spread(self.returns)}")
            lines += [f"  {label:>12} | {'#' * bar} {count}" for label, bar, count in _histogram(self.returns)]
            lines.append(f"length:  {_spread(self.lengths)} turns")
            lines.append(f"success: {self.success_rate:.1%} ({sum(self.successes)} of {len(self.successes)})")
        ended = ", ".join(f"{self.endings[k]} {k}" for k in ("terminated", "truncated", "cut", "failed"))
        lines.append(f"ended:   {ended}")
        timing = self.timing
        lines.append("timing:  " + "; ".join(f"{name} median {_ms(med)}, max {_ms(top)}"
                                             for name, (med, top) in timing.items()))
        lines += [f"warning: {w}" for w in self.warnings]
        lines += ["PASS"] if self.passed else ["FAIL", *(f"  - {p}" for p in self.problems)]
        return "\n".join(lines)


class _Problems:
    """Problems by kind: the first message of each kind, and in how many episodes it was seen."""

    def __init__(self) -> None:
        self._first: dict[tuple[str, ...], str] = {}
        self._count: Counter[tuple[str, ...]] = Counter()

    def add(self, key: tuple[str, ...], message: str) -> None:
        self._first.setdefault(key, message)
        self._count[key] += 1

    def lines(self) -> list[str]:
        return [message + (f" (in {self._count[key]} episodes)" if self._count[key] > 1 else "")
                for key, message in self._first.items()]


def env_check(name: str, args: dict[str, Any] | None = None, episodes: int = 20, seed: int = 0,
              policy: str = "random", workers: Callable[..., Any] | None = None, max_turns: int = 50,
              tools: Sequence[str] = (), tool_call_pattern: str = TOOL_CALL_PATTERN,
              tool_response_format: str = TOOL_RESPONSE_FORMAT) -> EnvCheckReport:
    """Play ``episodes`` episodes of ``name`` (built as :func:`~reasonrl.env.registry.make_env`
    builds it) on seeds ``seed .. seed + episodes - 1`` with ``policy``, at most ``max_turns``
    turns each, and report (see the module). An env that cannot be built, or a ``scripted``
    policy for an env without ``demonstration``, is an InputError."""
    if policy not in POLICIES:
        raise InputError(f"env-check policy = {policy!r}: expected one of {', '.join(POLICIES)}")
    if type(episodes) is not int or episodes < 1:
        raise InputError(f"env-check episodes = {episodes!r}: expected an integer >= 1")
    args = dict(args or {})
    local = make_env(name, args, tools, tool_call_pattern, tool_response_format)
    play = _policy(local, name, policy)
    report = EnvCheckReport(name, args, policy, range(seed, seed + episodes))
    problems = _Problems()
    played: list[tuple[int, str, list[str]]] = []
    with EnvPool(name, args, size=2, workers=workers, tools=tools,
                 tool_call_pattern=tool_call_pattern, tool_response_format=tool_response_format) as pool:
        for episode_seed in report.seeds:
            episode = _play_episode(pool, episode_seed, play, max_turns, report, problems)
            if episode is not None:
                played.append((episode_seed, *episode))
        if len(played) > 1 and len({first for _, first, _ in played}) == 1:
            ignored = _seed_ignored(pool, played)
            if ignored is not None:
                report.warnings.append(f"all {len(played)} seeds gave the same first observation "
                                       f"{_short(played[0][1])}{ignored}: the seed changes nothing observable "
                                       "(is reset(seed) using its seed?)")
    report.problems = problems.lines()
    return report


def _seed_ignored(pool: EnvPool, played: list[tuple[int, str, list[str]]]) -> str | None:
    """Replay the actions of the first played episode on every other played seed: None when
    some seed's replay differs from the first's (the seed shows in a later observation, a
    reward or an ending) or a replay failed, else the words of the warning saying what was
    compared ("" when the episode had no actions)."""
    seed, _, actions = played[0]
    reference = _replay(pool, seed, actions)
    if reference is None:
        return None
    for other, _, _ in played[1:]:
        replay = _replay(pool, other, actions)
        if replay is None or replay != reference:
            return None
    if not actions:
        return ""
    return f", and the {len(actions)} actions of seed {seed}'s episode gave the same steps on every seed"


def _replay(pool: EnvPool, seed: int, actions: list[str]) -> tuple[Any, ...] | None:
    """The transitions ``(first observation, (observation, reward, terminated, truncated) per
    step)`` of ``actions`` played on ``seed`` in slot 0 until the episode ends; None when a
    call failed (the played episodes report failures)."""
    (reset,) = pool.reset_many([seed])
    if isinstance(reset, EnvFailure):
        return None
    trace: list[Any] = [reset[0]]
    for action in actions:
        (step,) = pool.step_many([action])
        if isinstance(step, EnvFailure):
            return None
        trace.append(tuple(step[:4]))
        if step[2] or step[3]:
            break
    return tuple(trace)


def _policy(env: Any, name: str, policy: str) -> Callable[[int, int, random.Random], str | None]:
    """``play(seed, turn, rng)``: the action of ``turn`` (0-based) in the episode of ``seed``,
    None when a scripted policy has no more."""
    if policy == "scripted":
        demonstration = env_attribute(env, "demonstration")
        if not callable(demonstration):
            raise InputError(f"env-check policy = 'scripted': env {name!r} has no demonstration(seed) method; "
                             "use policy random")
        cache: dict[int, list[str]] = {}

        def scripted(seed: int, turn: int, rng: random.Random) -> str | None:
            actions = cache.setdefault(seed, list(demonstration(seed)))
            return actions[turn] if turn < len(actions) else None

        return scripted
    sample = env_attribute(env, "sample_action")
    if callable(sample):
        return lambda seed, turn, rng: sample(rng)
    return lambda seed, turn, rng: "".join(rng.choice(RANDOM_ALPHABET) for _ in range(rng.randint(1, 6)))


def _play_episode(pool: EnvPool, seed: int, play, max_turns: int, report: EnvCheckReport,
                  problems: _Problems) -> tuple[str, list[str]] | None:
    """One episode in both slots of ``pool``, its outcome added to ``report``: its first
    observation and the actions played, None when its reset failed."""
    resets = pool.reset_many([seed, seed])
    _times(pool, report.reset_s)
    if _failed(resets, seed, problems, "reset"):
        report.endings["failed"] += 1
        return None
    (first, _), (again, _) = resets
    if first != again:
        problems.add(("determinism", "reset"), f"seed {seed}: reset({seed}) twice gave different observations: "
                                               f"{_short(first)} then {_short(again)}")
    rng = random.Random(seed)
    total, turns, actions = 0.0, 0, []
    while turns < max_turns and (action := play(seed, turns, rng)) is not None:
        actions.append(action)
        steps = pool.step_many([action, action])
        _times(pool, report.step_s)
        turns += 1
        if _failed(steps, seed, problems, "step"):
            report.endings["failed"] += 1
            return first, actions
        step, copy = steps
        total += step[1]
        if step[:4] != copy[:4]:
            problems.add(("determinism", "step"),
                         f"seed {seed}, turn {turns} (action {_short(action)}): the same actions gave different "
                         f"transitions: {_short(step[:4])} then {_short(copy[:4])}")
        if step[2] or step[3]:
            report.endings["terminated" if step[2] else "truncated"] += 1
            _add(report, total, turns, bool(step[4].get("success", total > 0)))
            return first, actions
        if step[:4] != copy[:4]:  # the copies have diverged: comparing further says nothing
            break
    report.endings["cut"] += 1
    _add(report, total, turns, False)
    return first, actions


def _failed(results: list[Any], seed: int, problems: _Problems, method: str) -> bool:
    """Record the failures among ``results``; whether there were any."""
    failures = [r for r in results if isinstance(r, EnvFailure)]
    for failure in failures[:1]:
        problems.add((failure.kind, method), f"seed {seed}: {failure.message}")
    return bool(failures)


def _add(report: EnvCheckReport, total: float, turns: int, success: bool) -> None:
    report.returns.append(total)
    report.lengths.append(turns)
    report.successes.append(success)


def _times(pool: EnvPool, into: list[float]) -> None:
    into.extend(t for t in pool.last_call_s if t is not None)


def _spread(values: Sequence[float]) -> str:
    return f"min {min(values):g} mean {statistics.fmean(values):.3g} max {max(values):g}"


def _histogram(values: Sequence[float]) -> list[tuple[str, int, int]]:
    """``(label, bar length, count)`` rows: one per value when there are at most
    :data:`_HISTOGRAM_BINS` distinct values, else equal-width bins from min to max."""
    distinct = sorted(set(values))
    if len(distinct) <= _HISTOGRAM_BINS:
        rows = [(f"{v:g}", sum(1 for x in values if x == v)) for v in distinct]
    else:
        lo, hi = distinct[0], distinct[-1]
        width = (hi - lo) / _HISTOGRAM_BINS
        counts = Counter(min(int((x - lo) / width), _HISTOGRAM_BINS - 1) for x in values)
        rows = [(f"{lo + b * width:.3g}..{lo + (b + 1) * width:.3g}", counts[b]) for b in range(_HISTOGRAM_BINS)]
    top = max(count for _, count in rows)
    return [(label, round(_BAR_CHARS * count / top), count) for label, count in rows]


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g} ms"


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
