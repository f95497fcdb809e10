"""Whether a process id names a live process, without signalling it."""

from __future__ import annotations

import os


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
