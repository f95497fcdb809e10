"""CPU time used on the whole machine, to report how much other processes used during a benchmark."""

from __future__ import annotations

from reasonrl.runtime.threads import cpu_jiffies


def busy_jiffies() -> int:
    """CPU time all processes used since boot, in clock ticks (0 where /proc is absent)."""
    try:
        return cpu_jiffies()[0]
    except OSError:
        return 0
