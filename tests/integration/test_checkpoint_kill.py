"""SIGKILL processes that are saving checkpoints, at random moments: the newest committed
checkpoint must always load, validate and hold the data of its step."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

from reasonrl.checkpoint import find_latest, load_checkpoint, CheckpointWriter

# Imports torch once, then for each line on stdin forks a writer (printing its pid) that
# resumes after the newest checkpoint and saves ~1M-element checkpoints until killed; it
# reaps the writer and prints the signal that ended it. Forking spares a torch import
# (seconds on a busy machine) per kill.
ZYGOTE = """
import os, sys
from pathlib import Path
import torch
from reasonrl.checkpoint import find_latest, CheckpointWriter

root = Path(sys.argv[1])
for _ in sys.stdin:
    pid = os.fork()
    if pid == 0:
        try:
            step = int(find_latest(root).name.split("_")[1]) + 1
            base = torch.arange(1 << 20, dtype=torch.float32)
            while True:
                CheckpointWriter(root, 2).save(step, {"policy": {"w": base + step}}, {"step": step})
                step += 1
        finally:
            os._exit(1)
    print(pid, flush=True)
    _, status = os.waitpid(pid, 0)
    print(os.WTERMSIG(status) if os.WIFSIGNALED(status) else -1, flush=True)
"""

KILLS = 5


def test_sigkill_while_saving_never_loses_the_newest_checkpoint(tmp_path: Path) -> None:
    base = torch.arange(1 << 20, dtype=torch.float32)
    CheckpointWriter(tmp_path, 2).save(0, {"policy": {"w": base}}, {"step": 0})
    delays = random.Random(0)
    last = 0
    zygote = subprocess.Popen(
        [sys.executable, "-c", ZYGOTE, str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        for kill in range(KILLS):
            zygote.stdin.write("start\n")
            zygote.stdin.flush()
            writer = int(zygote.stdout.readline())
            time.sleep(delays.uniform(0.05, 0.4))
            os.kill(writer, signal.SIGKILL)
            assert int(zygote.stdout.readline()) == signal.SIGKILL, f"kill {kill}: writer died"

            latest = find_latest(tmp_path)
            assert latest is not None, f"kill {kill}: no valid checkpoint left"
            step, tensors, state = load_checkpoint(latest)
            assert step >= last and state == {"step": step}
            assert torch.equal(tensors["policy"]["w"], base + step)
            last = step
    finally:
        zygote.kill()
        zygote.wait()
    assert last > 0, "the writers never committed a checkpoint"

    CheckpointWriter(tmp_path, 2).save(last + 1, {"policy": {"w": base}}, {"step": last + 1})
    assert {p.name for p in tmp_path.iterdir()} == {f"step_{last}", f"step_{last + 1}"}
