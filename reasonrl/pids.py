"""Whether a process id names a live process, without signalling it."""

from __future__ import annotations

import os


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists (``kill(pid, 0)``): one of another user, which may not
    be signalled, counts as alive; a zombie not yet reaped too."""
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):
        return False
    except PermissionError:
        return True
    return True
