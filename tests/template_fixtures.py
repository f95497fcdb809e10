"""Run by a Template's child as ``python -m tests.template_fixtures FD MODE`` (tests/integration/test_zygote.py):
writes what it finds of its process to descriptor FD as one JSON line, then ends as MODE says: ``exit3``
(``sys.exit(3)``), ``message`` (``sys.exit("a message")``), ``raise`` (an uncaught error), ``wait`` (sleeps
until killed) or ``ok``. A non-daemon thread it starts prints once the main module is done; an exit handler
prints after it."""

from __future__ import annotations

import atexit
import json
import os
import signal
import sys
import threading
import time


def main() -> None:
    fd, mode = int(sys.argv[1]), sys.argv[2]
    found = {"argv": sys.argv[1:], "argv0": sys.argv[0], "pid": os.getpid(), "ppid": os.getppid(),
             "session_leader": os.getsid(0) == os.getpid(), "env": os.environ.get("TEMPLATE_CHILD_VAR"),
             "inherited_env": os.environ.get("TEMPLATE_START_VAR"), "torch": "torch" in sys.modules,
             "sigint_default": signal.getsignal(signal.SIGINT) is signal.default_int_handler,
             "stdin": os.readlink("/proc/self/fd/0"), "name": __name__}
    with os.fdopen(fd, "w") as out:
        out.write(json.dumps(found) + "\n")
    atexit.register(lambda: print("exit handler", flush=True))
    threading.Thread(target=lambda: (time.sleep(0.2), print("thread done", flush=True))).start()
    sys.stderr.write(f"stderr of {mode}\n")
    if mode == "exit3":
        sys.exit(3)
    if mode == "message":
        sys.exit("a message")
    if mode == "raise":
        raise ValueError("raised at the top")
    if mode == "wait":
        time.sleep(600)


if __name__ == "__main__":
    main()
