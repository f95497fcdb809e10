"""How a worker that dies or hangs is replaced: one restart policy for every pool of workers
(reward and environment workers, :mod:`reasonrl.runtime.pool`; rollout workers,
:mod:`reasonrl.rollout.fleet`), and the one back-off rule it shares with the trainer's
supervisor (:mod:`reasonrl.resilience.supervisor`)."""

from __future__ import annotations

from dataclasses import dataclass


def backoff_pause(restart: int, backoff_s: float, max_backoff_s: float) -> float:
    """Seconds to wait before restart number ``restart`` (1-based) in a row of the same process:

        pause(1) = 0,    pause(n) = min(max_backoff_s, backoff_s * 2**(n - 2))  for n >= 2

    The first restart after progress does not wait (a fault that is not a loop costs no idle
    time); a process that keeps failing without progress waits longer each time."""
    return 0.0 if restart <= 1 else min(max_backoff_s, backoff_s * 2 ** (restart - 2))


@dataclass(frozen=True)
class RestartPolicy:
    """At most ``budget`` restarts of one worker in a row (a call it answers, even with an
    exception, resets the count), and between two restarts of the same worker in a row a
    pause of ``backoff_s``, doubled for each further one up to ``max_backoff_s`` (the first
    restart does not wait)."""

    budget: int = 10
    backoff_s: float = 0.1
    max_backoff_s: float = 5.0

    def __post_init__(self) -> None:
        if type(self.budget) is not int or self.budget < 0:
            raise ValueError(f"RestartPolicy budget: got {self.budget!r}, expected an integer >= 0")
        if self.backoff_s < 0 or self.max_backoff_s < self.backoff_s:
            raise ValueError(f"RestartPolicy backoff: got backoff_s={self.backoff_s}, max_backoff_s="
                             f"{self.max_backoff_s}; expected 0 <= backoff_s <= max_backoff_s")

    def pause_s(self, restart: int) -> float:
        """Seconds between the previous restart and restart number ``restart`` (1-based) of
        the same worker in a row (:func:`backoff_pause`)."""
        return backoff_pause(restart, self.backoff_s, self.max_backoff_s)
