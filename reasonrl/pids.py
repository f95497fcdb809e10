"""Whether a process id names a live process, without signalling it; a signal when this
process's parent dies."""

from __future__ import annotations

import os
import sys

_PR_SET_PDEATHSIG = 1


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` runs (``kill(pid, 0)``): one of another user, which may not be
    signalled, counts as running; a zombie (ended, not yet reaped: an orphan whose reaper is
    slow or absent in a container) does not."""
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return True  # no /proc to ask: it exists


def signal_at_parent_death(signum: int) -> None:
    """Have Linux send this process ``signum`` once its parent (the thread that forked it) ends
    (``PR_SET_PDEATHSIG``); elsewhere nothing. A parent that ended already goes unnoticed: the
    caller compares ``os.getppid()`` after this call."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signum, 0, 0, 0)
