"""The curriculum (``data.curriculum_window``): prompts the policy always solves, or always
fails, rest out of the pool of training prompts for a while.

    curriculum = Curriculum(window=3, revisit=20)
    curriculum.observe(row, correct, n)      # each scored group of the rollout batch, in draw order
    retired, returned = curriculum.end_batch()
    row in curriculum.resting                # out of the pool: the sampler passes over it
    curriculum.release(rows)                 # back early: the pool had nothing else left to draw

Each observation of a prompt is the outcome of one scored group of its ``n`` samples:
``S`` (solved: all ``n`` right), ``F`` (failed: none right) or ``M`` (mixed). A prompt whose
last K = ``window`` observations are all ``S``, or all ``F``, retires in the rollout batch b
that made them so: it is out of the pool for batches b + 1 .. b + ``revisit`` and back for
b + revisit + 1. Its observations are kept, so a prompt back from rest that is solved (or
failed) once more retires again at once. Such groups teach a group-relative estimator nothing
(every advantage 0), which is why dynamic sampling drops them; the curriculum stops drawing
them (Online Difficulty Filtering, arXiv 2504.03380, keeps prompts of intermediate pass rate;
prime-rl's DifficultyPoolSampler pools tasks by their latest reward).
"""

from __future__ import annotations


def outcome(correct: int, n: int) -> str:
    """``S`` when all ``n`` samples of a group were right, ``F`` when none was, else ``M``."""
    return "S" if correct == n else "F" if correct == 0 else "M"


class Curriculum:
    """The observations of every prompt drawn so far and the prompts resting out of the pool.

    ``windows``: {row: its last ``window`` outcomes, oldest first, as a string like ``"SSF"``};
    ``resting``: {row: the last rollout batch it stays out}; ``batches``: rollout batches ended.
    """

    def __init__(self, window: int, revisit: int) -> None:
        if window < 1 or revisit < 1:
            raise ValueError(f"Curriculum: window and revisit must be >= 1, got {window} and {revisit}")
        self.window, self.revisit = window, revisit
        self.batches = 0
        self.windows: dict[int, str] = {}
        self.resting: dict[int, int] = {}
        self._retired = self._returned = 0

    def observe(self, row: int, correct: int, n: int) -> None:
        """One scored group of ``row`` in the current rollout batch (``correct`` of ``n`` right);
        the prompt retires when its last ``window`` outcomes are all S or all F."""
        kept = (self.windows.get(row, "") + outcome(correct, n))[-self.window:]
        self.windows[row] = kept
        if len(kept) == self.window and kept[0] != "M" and kept == kept[0] * self.window and row not in self.resting:
            self.resting[row] = self.batches + 1 + self.revisit
            self._retired += 1

    def end_batch(self) -> tuple[int, int]:
        """End the current rollout batch: ``(retired, returned)``, the prompts that left the pool
        in it and those whose rest ended with it (they may be drawn from the next one on)."""
        self.batches += 1
        back = [row for row, last in self.resting.items() if last <= self.batches]
        for row in back:
            del self.resting[row]
        counts = (self._retired, self._returned + len(back))
        self._retired = self._returned = 0
        return counts

    def release(self, rows) -> None:
        """``rows`` back in the pool before their rest ends (when nothing else is left to draw
        from); counted as returned in the current rollout batch."""
        for row in rows:
            if self.resting.pop(row, None) is not None:
                self._returned += 1

    def state_dict(self) -> dict:
        """``{"batches", "windows", "resting"}``, plain types (between rollout batches: nothing
        is pending then)."""
        return {"batches": self.batches, "windows": dict(self.windows), "resting": dict(self.resting)}

    def load_state_dict(self, state: dict) -> None:
        self.batches = int(state["batches"])
        self.windows = {int(row): str(w) for row, w in state["windows"].items()}
        self.resting = {int(row): int(last) for row, last in state["resting"].items()}
        self._retired = self._returned = 0
