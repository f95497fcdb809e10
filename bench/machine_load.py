"""CPU time used on the whole machine, to report how much other processes used during a benchmark."""

from __future__ import annotations


def busy_jiffies() -> int:
    """CPU time all processes used since boot, in clock ticks (0 where /proc is absent)."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except OSError:
        return 0
    return sum(fields) - fields[3] - fields[4]  # minus idle and iowait
