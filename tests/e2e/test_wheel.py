"""The built wheel works on its own: recipes ship inside it and resolve by name anywhere.

Builds the wheel from a copy of the source tree (no stale build/ of the checkout, no race with
another build), installs it with --no-deps into a fresh venv outside the repository, and trains
DAPO for 2 steps there with that venv's ``reasonrl`` console script, from a directory that has
no recipes/, with PYTHONPATH cleared. Nothing is downloaded: the fresh venv sees the
dependencies through a .pth line naming this venv's site-packages (a .pth file in a directory
that a .pth line adds is not read, so this venv's editable install of reasonrl stays out). It
reuses the cached warm start ($REASONRL_CACHE or ~/.cache/reasonrl): built already, the run
takes seconds; otherwise it trains the warm start first (minutes).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from importlib.metadata import version
from pathlib import Path

import pytest
import yaml

from reasonrl.cli import RECIPES
from reasonrl.config import load
from reasonrl.warmstart.cache import warm_start_dir
from reasonrl.metrics import read_jsonl

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
SKIP = shutil.ignore_patterns(".git", ".venv", "runs", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache", ".cache")


def _run(cmd, timeout, **kw):
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, **kw)
    assert proc.returncode == 0, f"{cmd}: exit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return proc


def test_wheel_installs_and_trains_from_its_own_recipes(tmp_path):
    # the wheel, from a copy of the source, built with this venv's setuptools
    assert int(version("setuptools").split(".")[0]) >= 77, "building needs setuptools>=77 here (pyproject's build-system)"
    src = tmp_path / "src"
    shutil.copytree(REPO, src, symlinks=True, ignore=SKIP)
    dist = tmp_path / "dist"
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet", "-w", dist, src], 300)
    [wheel] = dist.glob("reasonrl-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names, recipe = zf.namelist(), yaml.safe_load(zf.read("reasonrl/recipes/dapo.yaml"))
    shipped = {Path(n).name for n in names if n.startswith("reasonrl/recipes/")}
    assert "dapo.yaml" in shipped and shipped == {p.name for p in RECIPES.glob("*.yaml")}, shipped
    assert not [n for n in names if n.split("/")[0] in ("tests", "bench", "docs", "recipes")], names

    # a fresh venv with the wheel alone in it, then this venv's packages behind it
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", venv], 120)
    py = venv / "bin" / "python"
    _run([sys.executable, "-m", "pip", "--python", py, "install", "--no-deps", "--no-index", "--quiet", wheel], 120)
    site = _run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], 60).stdout.strip()
    ours = dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib"))
    Path(site, "_deps_of_the_test_venv.pth").write_text("".join(f"{p}\n" for p in ours))

    work = tmp_path / "work"  # the cwd: no recipes/, not the checkout
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    where = json.loads(_run([py, "-c", "import json, reasonrl, reasonrl.cli; "
                                       "print(json.dumps([reasonrl.__file__, str(reasonrl.cli.RECIPES)]))"],
                            60, cwd=work, env=env).stdout)
    for path in where:
        assert Path(path).is_relative_to(venv), where

    # a name that is no recipe: exit 2, and the message names the recipes there are
    proc = subprocess.run([venv / "bin" / "reasonrl", "train", "nosuch"], capture_output=True, text=True, timeout=120,
                          cwd=work, env=env)
    assert proc.returncode == 2 and "nosuch" in proc.stderr and "dapo, dapo_async, dapo_lora, dr_grpo, grpo" in proc.stderr, proc.stderr

    # 2 supervised DAPO steps by name (the supervisor's child is `python -m reasonrl.cli` of the
    # fresh venv too), with the wheel's recipe; the warm start from the user's cache. One
    # generation batch a step (dynamic sampling off): seconds, not a minute, on 2 busy cores.
    cfg = load(RECIPES / "dapo.yaml")
    ready = (warm_start_dir(cfg.sft, cfg.data.families) / "sft_summary.json").is_file()
    run = tmp_path / "run"
    overrides = {"run.dir": run, "run.progress": "false", "train.total_steps": 2, "train.prompts_per_step": 4,
                 "rollout.n": 4, "train.mini_batch_size": 16, "train.micro_batch_size": 16, "eval.every_steps": 0,
                 "checkpoint.every_steps": 0, "algo.dynamic_sampling": "false"}
    _run([venv / "bin" / "reasonrl", "train", "dapo", *(f"{k}={v}" for k, v in overrides.items())],
         180 if ready else 840, cwd=work, env=env)
    assert (run / "final" / "config.json").is_file() and (run / "final" / "model.safetensors").is_file()
    assert [r["step"] for r in read_jsonl(run / "metrics.jsonl") if r["step"] > 0] == [1, 2]
    saved = yaml.safe_load((run / "config.yaml").read_text())
    for section, values in recipe.items():  # the wheel's dapo.yaml, applied
        for key, value in values.items():
            if f"{section}.{key}" not in overrides:
                assert saved[section][key] == value, (section, key)
    assert list(work.iterdir()) == []  # nothing written to the cwd
