"""Worker classes for runtime tests, importable by the worker processes."""

import os
import threading
import time


class Counter:
    """A stateful worker: ``add`` accumulates, ``wait_for_flag`` blocks until ``set_flag`` runs beside it."""

    def __init__(self, start: int = 0) -> None:
        self.total = start
        self.flag = threading.Event()

    def add(self, x: int) -> int:
        self.total += x
        return self.total

    def pid(self) -> int:
        return os.getpid()

    def fail(self, message: str) -> None:
        raise ValueError(message)

    def sleep(self, seconds: float) -> float:
        time.sleep(seconds)
        return seconds

    def set_flag(self) -> bool:
        self.flag.set()
        return True

    def wait_for_flag(self, timeout_s: float) -> bool:
        return self.flag.wait(timeout_s)

    def die(self) -> None:
        os._exit(3)


def broken(*args):
    raise RuntimeError("cannot build this worker")


class Echo:
    """Returns what it is sent."""

    def echo(self, value):
        return value
