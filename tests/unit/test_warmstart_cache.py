"""Warm starts built on a cold cache by several processes at once are trained once."""

from __future__ import annotations

import json
import multiprocessing as mp
import time
from pathlib import Path

from reasonrl.warmstart.cache import build_once


def _train(tmp: Path, log: Path) -> dict:
    with open(log, "a") as f:
        f.write("trained\n")
    time.sleep(0.5)  # long enough that the other process asks while this one trains
    tmp.mkdir(parents=True)
    (tmp / "model.safetensors").write_text("weights")
    return {"steps": 1}


def _build(out: str, log: str) -> None:
    built = build_once(Path(out), lambda tmp: _train(tmp, Path(log)))
    assert (built / "model.safetensors").read_text() == "weights"


def test_two_processes_on_a_cold_cache_train_it_once_and_both_read_it(tmp_path):
    out, log = tmp_path / "warmstart" / "abc", tmp_path / "trained.log"
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_build, args=(str(out), str(log))) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0, "a builder failed or did not finish within 30 s"
    assert log.read_text() == "trained\n"
    assert json.loads((out / "sft_summary.json").read_text()) == {"steps": 1}
    assert not list(out.parent.glob("abc.tmp-*"))
    # built: a later call trains nothing
    assert build_once(out, lambda tmp: _train(tmp, log)) == out and log.read_text() == "trained\n"
