"""The reward-function protocol, loading a function by name or import path, and grading.

A reward function is called ``fn(response, ground_truth, **row)``: ``row`` holds the prompt's
``data_source`` and the other columns of its dataset row (``extra_info``, ``test_list``, ...),
each passed only when the function's signature names it, all of them when it takes
``**kwargs`` (so ``fn(response, ground_truth)`` gets none). It returns a dict with ``score``
(a finite number), optionally ``acc`` (correct; default ``score > 0``) and ``pred`` (the
extracted answer), and any other fields, which are kept with the sample and logged.

A :class:`Grader` is what ``reward.*`` configures: ``reward.fn``, the functions chosen per
``data_source`` (``reward.by_source``), the range of the built-in rules' scores
(``reward.range``) and the format reward (``reward.format``) on top::

    s = fn_for(data_source)(response, ground_truth, **row)["score"]
    score = lo + (s + 1) / 2 * (hi - lo) + reward.format_score * [response is in reward.format]

with ``(lo, hi) = reward.range``: the built-in rules score from -1 (wrong) to +1 (right), so
the default ``[-1, 1]`` keeps their scores and ``[0, 1]`` gives {0, 1} rewards. A sample whose
grading failed scores ``lo``.
"""

from __future__ import annotations

import inspect
import math
import sys
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Protocol

from reasonrl.config import RewardConfig
from reasonrl.errors import InputError
from reasonrl.plugins import is_plugin_spec, load_object
from reasonrl.reward.format import format_rule
from reasonrl.reward.math import INVALID, boxed_score, dapo_score, gsm8k_score

if TYPE_CHECKING:
    import torch

FAILURE_SCORE = -1.0
"""The score given to a sample whose reward function raised, returned something malformed or
timed out, under the default ``reward.range`` (in general its low end, :meth:`Grader.failed`)."""

BUILTIN: dict[str, Callable[[str, str], dict]] = {"dapo": dapo_score, "boxed": boxed_score, "gsm8k": gsm8k_score}

_ALLOWED = ("'dapo', 'boxed', 'gsm8k', 'math_verify', 'code' or an import path 'package.module:function' "
            "or 'path/to/file.py:function'")
_MAX_ERROR_CHARS = 300
_RESERVED = ("score", "acc", "pred")


class RewardFn(Protocol):
    """Scores one response against its ground truth (and, if it asks, the row's fields).

    Returns a dict with ``score`` (a finite float), ``acc`` (bool: the answer is correct),
    ``pred`` (str: the answer that was extracted) and any extra fields.
    """

    def __call__(self, response: str, ground_truth: str, **row: Any) -> dict: ...


def load_reward_fn(spec: str, cfg: RewardConfig | None = None) -> RewardFn:
    """The reward function named by ``spec``: ``"dapo"``, ``"boxed"``, ``"gsm8k"``,
    ``"math_verify"`` (reasonrl/reward/verify.py, the optional math-verify package), ``"code"``
    (reasonrl/reward/code.py, the sandboxed program runner, set up by ``cfg``) or
    ``"package.module:function"`` or ``"path/to/file.py:function"``
    (:func:`reasonrl.plugins.load_object`).

    Raises InputError naming the spec when the module or file cannot be loaded, has no such
    attribute, or the attribute is not callable.
    """
    if spec in BUILTIN:
        return BUILTIN[spec]
    if spec == "math_verify":
        from reasonrl.reward.verify import load_math_verify

        return load_math_verify()
    if spec == "code":
        from reasonrl.reward.code import make_code_reward

        return make_code_reward(cfg or RewardConfig())
    if not is_plugin_spec(spec):
        raise InputError(f"reward function {spec!r}: unknown name; expected {_ALLOWED}")
    fn = load_object(spec, "reward function")
    if not callable(fn):
        raise InputError(f"reward function {spec!r}: {spec.rpartition(':')[2]!r} is a {type(fn).__name__}, not a callable")
    return fn


def parse_by_source(entries: tuple[str, ...]) -> dict[str, str]:
    """``{data_source: fn spec}`` from ``reward.by_source`` entries ``'SOURCE=FN'``; a
    malformed or repeated entry is an InputError naming reward.by_source."""
    out: dict[str, str] = {}
    for entry in entries:
        source, sep, spec = entry.rpartition("=")
        if not sep or not source.strip() or not spec.strip():
            raise InputError(f"reward.by_source: entry {entry!r} is not 'SOURCE=FN' (for example 'openai/gsm8k=gsm8k')")
        if source.strip() in out:
            raise InputError(f"reward.by_source: data source {source.strip()!r} is given twice")
        out[source.strip()] = spec.strip()
    return out


@dataclass(frozen=True)
class Grade:
    """One graded sample: ``failed`` when the function raised, returned something malformed
    or timed out (``error`` says why; ``score`` is then ``FAILURE_SCORE``), ``timed_out``
    when it ran past its time limit; ``extras`` holds the function's other fields and
    ``format`` (0 or 1) under reward.format."""

    score: float
    acc: bool
    pred: str = INVALID
    failed: bool = False
    error: str = ""
    extras: dict[str, Any] = field(default_factory=dict)
    timed_out: bool = False


def failed_grade(low: float, error: str, timed_out: bool = False) -> Grade:
    """The grade of a sample whose scoring failed with ``error`` (``timed_out``: by running
    past its time limit): ``low``, the low end of ``reward.range``, not correct."""
    return Grade(low, False, INVALID, True, _one_line(error), timed_out=timed_out)


class Grader:
    """A default reward function, functions per data source and an optional format rule as
    one callable (what ``reward.*`` configures: :meth:`from_config`); :meth:`grade` never
    raises for anything a reward function does (``sys.exit()`` included, and a KeyboardInterrupt
    off the main thread; on it, Ctrl-C is the run's)."""

    def __init__(self, default: RewardFn, by_source: dict[str, RewardFn] | None = None,
                 format_check: Callable[[str], bool] | None = None, format_score: float = 0.0,
                 score_range: tuple[float, float] = (FAILURE_SCORE, 1.0)) -> None:
        self.default = default
        self.by_source = by_source or {}
        self.format_check, self.format_score = format_check, format_score
        self.low, self.high = score_range
        self._keywords: dict[int, frozenset[str] | None] = {}

    @classmethod
    def from_config(cls, cfg: RewardConfig) -> "Grader":
        """The grader of ``reward.fn``, ``reward.by_source``, ``reward.range`` and ``reward.format``."""
        by_source = {source: load_reward_fn(spec, cfg) for source, spec in parse_by_source(cfg.by_source).items()}
        check = format_rule(cfg.format) if cfg.format else None
        low, high = cfg.range
        return cls(load_reward_fn(cfg.fn, cfg), by_source, check, cfg.format_score, (low, high))

    def rescale(self, score: float) -> float:
        """A score on the built-in rules' scale [-1, 1] on ``[low, high]``:
        ``low + (score + 1) / 2 * (high - low)`` (the identity for the default [-1, 1])."""
        if (self.low, self.high) == (FAILURE_SCORE, 1.0):
            return score
        return self.low + (score + 1.0) / 2.0 * (self.high - self.low)

    def failed(self, error: str, timed_out: bool = False) -> Grade:
        """:func:`failed_grade` at the low end of this grader's range."""
        return failed_grade(self.low, error, timed_out)

    def fn_for(self, data_source: str) -> RewardFn:
        """The reward function of rows from ``data_source``."""
        return self.by_source.get(data_source, self.default)

    def grade(self, response: str, ground_truth: str, row: dict[str, Any] | None = None) -> Grade:
        """The sample's grade; ``row`` holds ``data_source`` and the row's other fields."""
        row = row or {}
        fn = self.fn_for(row.get("data_source", ""))
        try:
            result = fn(response, ground_truth, **self._row_kwargs(fn, row))
            score, acc, pred, extras = check_result(result)
        except Exception as e:
            return self.failed(f"{type(e).__name__}: {e}")
        except SystemExit as e:  # sys.exit() in a reward function ends this sample's grading, not the run
            return self.failed(f"the reward function called sys.exit({e.code!r})")
        except KeyboardInterrupt:
            if threading.current_thread() is threading.main_thread():
                raise  # Ctrl-C arrives on the main thread: the run's to handle
            return self.failed("the reward function raised KeyboardInterrupt")
        score = self.rescale(score)
        if self.format_check is not None:
            formatted = self.format_check(response)
            score += self.format_score if formatted else 0.0
            extras["format"] = float(formatted)
        return Grade(score, acc, pred, extras=extras)

    def _row_kwargs(self, fn: RewardFn, row: dict[str, Any]) -> dict[str, Any]:
        """The fields of ``row`` that ``fn`` takes as keyword arguments."""
        key = id(fn)
        if key not in self._keywords:
            self._keywords[key] = _keyword_names(fn)
        names = self._keywords[key]
        return {k: v for k, v in row.items() if (names is None and k not in _POSITIONAL) or (names and k in names)}


_POSITIONAL = ("response", "ground_truth")


class GraderWorker:
    """What a reward worker process (or Ray actor) runs: the grader of ``reward``, one sample a
    call, on ``threads`` torch threads (the pool's :class:`~reasonrl.runtime.pool.PoolStart`)
    where the reward function uses torch. Its module imports no torch, so a worker that grades
    with a function that needs none starts in a fraction of a second."""

    def __init__(self, reward: RewardConfig, threads: int = 1) -> None:
        self.grader = Grader.from_config(reward)
        torch = sys.modules.get("torch")  # loaded by the function's module, or not at all
        if torch is not None:
            torch.set_num_threads(threads)

    def grade(self, text: str, truth: str, row: dict[str, Any]) -> Grade:
        """The grade of one sample (a failed Grade when the reward function raises)."""
        return self.grader.grade(text, truth, row)


def _keyword_names(fn: Callable) -> frozenset[str] | None:
    """Names ``fn`` accepts by keyword after its first two parameters; None when it takes
    ``**kwargs`` (every field)."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return frozenset()
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return None
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)][:2]
    return frozenset(p.name for p in params if p not in positional
                     and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))


def row_fields(prompt) -> dict[str, Any]:
    """The keyword fields a reward function may take for ``prompt``: its ``data_source`` and
    the other columns of its row."""
    return {**prompt.extra, "data_source": prompt.data_source}


@dataclass
class Grades:
    """A batch of grades: ``scores [B] float32``, ``acc [B] bool``, ``failed [B] bool``, one
    error line per failed sample (``"sample i: ..."``), the extracted answers, the extra
    fields of each sample and ``timed_out [B] bool`` (failed by running past the time limit;
    all False when not given)."""

    scores: torch.Tensor
    acc: torch.Tensor
    failed: torch.Tensor
    errors: list[str]
    preds: list[str]
    extras: list[dict[str, Any]]
    timed_out: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.timed_out is None:
            import torch

            self.timed_out = torch.zeros_like(self.failed)

    @staticmethod
    def of(grades: list[Grade]) -> "Grades":
        import torch  # here, not at the top: a grader's worker process imports this module without torch

        return Grades(
            torch.tensor([g.score for g in grades], dtype=torch.float32),
            torch.tensor([g.acc for g in grades], dtype=torch.bool),
            torch.tensor([g.failed for g in grades], dtype=torch.bool),
            [f"sample {i}: {g.error}" for i, g in enumerate(grades) if g.failed],
            [g.pred for g in grades],
            [g.extras for g in grades],
            torch.tensor([g.timed_out for g in grades], dtype=torch.bool),
        )


def score_batch(fn: RewardFn | Grader, texts: list[str], ground_truths: list[str],
                rows: list[dict[str, Any]] | None = None) -> Grades:
    """Grade each (text, ground truth[, row]) with ``fn`` (a reward function or a Grader).

    A sample fails when ``fn`` raises or returns something other than a dict with a finite
    numeric ``score``; it then gets the range's low end (``FAILURE_SCORE`` by default) and
    ``acc = False``. A missing ``acc`` key means ``score > 0``. Never raises for anything ``fn`` does; different list lengths
    are a ValueError.
    """
    if len(texts) != len(ground_truths) or (rows is not None and len(rows) != len(texts)):
        raise ValueError(f"score_batch: {len(texts)} texts but {len(ground_truths)} ground truths"
                         + (f" and {len(rows)} rows" if rows is not None else ""))
    grader = fn if isinstance(fn, Grader) else Grader(fn)
    return Grades.of([grader.grade(t, g, rows[i] if rows else None) for i, (t, g) in enumerate(zip(texts, ground_truths))])


def check_result(result: object) -> tuple[float, bool, str, dict[str, Any]]:
    """``(score, acc, pred, extras)`` from a reward function's result; ValueError when it is
    malformed. Extras are the other fields whose values are numbers, strings or booleans."""
    if not isinstance(result, dict):
        raise ValueError(f"reward function returned a {type(result).__name__}, expected a dict with 'score'")
    if "score" not in result:
        raise ValueError(f"reward function result has no 'score' (keys: {sorted(map(str, result))})")
    raw = result["score"]
    if isinstance(raw, (str, bytes)):
        raise ValueError(f"reward function score {raw!r} is not a number")
    score = float(raw)
    if not math.isfinite(score):
        raise ValueError(f"reward function score {score} is not finite")
    extras = {str(k): v for k, v in result.items() if k not in _RESERVED and _loggable(v)}
    return score, bool(result.get("acc", score > 0)), str(result.get("pred", INVALID)), extras


def _loggable(value: object) -> bool:
    """A number, string or boolean (a float only when finite)."""
    return isinstance(value, (int, str, bool)) or (isinstance(value, float) and math.isfinite(value))


def _one_line(message: str) -> str:
    message = " ".join(message.split())
    return message if len(message) <= _MAX_ERROR_CHARS else message[: _MAX_ERROR_CHARS - 3] + "..."
