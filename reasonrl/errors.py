"""The errors that end a run for good: starting it again unchanged would meet them again.

    FatalError                      exit code 2, one line, never restarted by the supervisor
      InputError (ValueError)       a config key, file, row, field or model directory no run can use
        InputNotFound (FileNotFoundError)   a file or directory that is not there
      ResumeError                   the run directory cannot be resumed with this config or data
      LimitError                    a deterministic limit was reached (dynamic sampling, reward
                                    failures, a final checkpoint that cannot be written)
      RunDirError                   the run directory is unusable or in use by another trainer
      WriteError (OSError)          a file could not be written: a full disk, a read-only or
                                    over-quota file system (the same disk would refuse a restart)

Anything else that ends a trainer (a crash, a kill, a hang, an I/O error) is what the supervisor
restarts from the last checkpoint. Every message names the key, file or field and what was
expected, so the CLI prints it as it is, without a traceback.
"""

from __future__ import annotations

import os

EXIT_FATAL = 2
"""Exit code of ``reasonrl`` for a FatalError (and for command-line usage errors)."""


class FatalError(Exception):
    """An error that a restart would meet again: exit 2, no restart, one clear message."""


class InputError(FatalError, ValueError):
    """A configuration value, data file, row, field, reward function or model directory that no
    run can use; the message names it and says what was expected."""


class InputNotFound(InputError, FileNotFoundError):
    """An input file or directory that does not exist."""


class ResumeError(FatalError):
    """The run directory holds a run that this configuration or this data cannot continue."""


class LimitError(FatalError):
    """A deterministic limit was reached: the same run would reach it again."""


class RunDirError(FatalError):
    """The run directory cannot be used: not a directory, not writable, holding files that
    reasonrl did not write, or locked by another trainer."""


class WriteError(FatalError, OSError):
    """A file (or directory) could not be written: ``filename``, with the OS error's ``errno``
    and ``strerror``; ``disk`` is the mount point of its file system and ``note`` what became
    of the run. Being an OSError too, it is caught wherever a failed write is."""

    def __init__(self, code: int | None, strerror: str | None, filename: str = "", note: str = "") -> None:
        super().__init__(code, strerror, filename)
        self.note = note

    @classmethod
    def of(cls, path, err: OSError) -> WriteError:
        """``err`` (raised writing ``path``) as a WriteError naming ``path``; one already is kept."""
        if isinstance(err, WriteError):
            return err
        return cls(err.errno, err.strerror or str(err), str(path))

    def noted(self, note: str) -> WriteError:
        """The same error with ``note`` saying what became of the run."""
        return WriteError(self.errno, self.strerror, self.filename, note)

    @property
    def cause(self) -> str:
        """Why, in words: ``"no space left on device"``, ``"read-only file system"``, ..."""
        return os.strerror(self.errno).lower() if self.errno else (self.strerror or "an I/O error")

    @property
    def disk(self) -> str:
        """The mount point of the file system that holds ``filename``."""
        path = os.path.realpath(self.filename or ".")
        while not os.path.ismount(path):
            path = os.path.dirname(path)
        return path

    def __str__(self) -> str:
        text = f"{self.filename}: cannot write ({self.cause}; the file system at {self.disk})"
        return f"{text}; {self.note}" if self.note else text


def error_line(err: BaseException) -> str:
    """An exception in one line for a message: ``"TypeName: first line of its text"``."""
    text = str(err).strip().split("\n", 1)[0]
    return f"{type(err).__name__}: {text}" if text else type(err).__name__
