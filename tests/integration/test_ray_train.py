"""Training with runtime.engine=ray on a local cluster: a seeded synchronous run with two rollout
actors ends with the local run's weights, the cluster listens on loopback only while it trains,
rollout-side faults act on Ray and name the worker, and a killed rollout actor is replaced with
no prompt lost or used twice (the DAPO recipe's run on Ray, killed and resumed, is in
tests/e2e/test_recipes.py).

The Ray runs are ``reasonrl train`` processes of their own: the process that starts a local
cluster must import ray itself, after setting its loopback-only switch."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import socket
import sys
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file

from reasonrl.config import load
from reasonrl.controller import Controller
from reasonrl.metrics import read_jsonl
from tests.conftest import tiny_run
from tests.integration.test_async import _assert_every_prompt_used_once, _events, _rollout_pids, _wait_for, values
from tests.ray_fixtures import RayHead, is_loopback, listening_sockets, process_tree

if importlib.util.find_spec("ray") is None:
    pytest.skip("ray is not installed (pip install 'reasonrl[ray]')", allow_module_level=True)

pytestmark = [pytest.mark.timeout(600), pytest.mark.xdist_group("ray")]  # one local cluster at a time


def _train(recipe: str, overrides: list[str]) -> subprocess.Popen:
    command = [sys.executable, "-m", "reasonrl.cli", "train", recipe, "--no-supervisor", *overrides]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(proc: subprocess.Popen, timeout_s: float = 300) -> None:
    try:
        _, err = proc.communicate(timeout=timeout_s)
    finally:
        proc.kill()
    assert proc.returncode == 0, err[-3000:]


def test_a_seeded_synchronous_ray_run_ends_with_the_local_runs_weights(model_dir, tmp_path):
    common = ["run.threads=1", "runtime.roles.rollout.threads=1", "runtime.roles.rollout.count=2",
              "algo.kl_loss_coef=0.01"]  # a reference actor too
    Controller.from_config(load("recipes/grpo.yaml", [*tiny_run(model_dir, tmp_path / "local", 4), *common])).run()
    _finish(_train("grpo", [*tiny_run(model_dir, tmp_path / "ray", 4), *common, "runtime.engine=ray"]))
    local, ray = (load_file(tmp_path / d / "final" / "model.safetensors") for d in ("local", "ray"))
    assert local.keys() == ray.keys()
    for name in local:
        assert (local[name] - ray[name]).abs().max() <= 1e-6, name
    rows = {d: read_jsonl(tmp_path / d / "metrics.jsonl") for d in ("local", "ray")}
    assert [values(r) for r in rows["local"]] == [values(r) for r in rows["ray"]]
    assert all(r["timing_s/weight_sync"] > 0 for r in rows["ray"])  # each version crossed to the actor
    events = read_jsonl(tmp_path / "ray" / "events.jsonl")
    [started] = [e for e in events if e["kind"] == "rollout_started"]
    assert len(set(started["pids"])) == 2 and not any(e["kind"].startswith("rollout_worker_") for e in events)
    assert all(r["rollout/worker1/groups"] > 0 for r in rows["ray"])  # both actors served every step


@pytest.mark.long
def test_environment_workers_on_ray_are_actors_of_their_own_placed_by_runtime_roles_env(model_dir, tmp_path):
    log = tmp_path / "envs.log"  # each environment built appends its process and that one's parent
    proc = _train("grpo", [f"model.path={model_dir}", f"run.dir={tmp_path / 'run'}", "run.progress=false",
                           "run.threads=1", "data.train_size=32", "data.test_size=4", "train.total_steps=2",
                           "train.prompts_per_step=4", "rollout.n=2", "train.mini_batch_size=8",
                           "train.micro_batch_size=8", "rollout.max_new_tokens=4", "eval.every_steps=2",
                           "eval.n_prompts=4", "eval.k=1", "checkpoint.every_steps=0", "runtime.engine=ray",
                           "runtime.roles.rollout.count=2", "runtime.roles.rollout.threads=1",
                           "env.name=tests.env_fixtures:RecordsItsProcess", f"env.args={{log: {log}}}",
                           "env.max_turns=2", "runtime.roles.env.count=1", "runtime.roles.env.cpus=0.5"])
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, _[-3000:]
    [line] = [line.strip() for line in out.splitlines() if line.strip().startswith("env ")]
    assert line.split()[1:3] == ["ray", "x3x1"] and "0.5 cpu" in line, line  # validation's pool and one per actor
    rows = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in rows if "actor/grad_norm" in r] == [1, 2] and "val/acc" in rows[-1]
    assert all(r["rollout/worker0/groups"] > 0 and r["rollout/worker1/groups"] > 0 for r in rows if "actor/grad_norm" in r)
    [started] = [e for e in read_jsonl(tmp_path / "run" / "events.jsonl") if e["kind"] == "rollout_started"]
    rollout = set(started["pids"])
    built = {tuple(entry.split()) for entry in log.read_text().splitlines()}
    actors = {actor: (int(pid), int(parent)) for pid, parent, actor in built if actor != "-"}
    assert len(actors) == 3, built  # validation's pool's actor and the one of each rollout actor
    assert any(actor == "-" for *_, actor in built)  # the pre-start check's resets, in a process of the driver's
    pids, parents = {pid for pid, _ in actors.values()}, {parent for _, parent in actors.values()}
    assert not pids & (rollout | {proc.pid}) and not parents & rollout  # beside the rollout actors, not inside them


@pytest.mark.serial  # the slowed actor is found by wall time
@pytest.mark.long
@pytest.mark.skipif(not os.path.exists("/proc/net/tcp"), reason="needs Linux /proc")
def test_while_a_ray_run_trains_it_listens_on_loopback_only_and_a_killed_rollout_actor_loses_no_prompt(model_dir, tmp_path):
    # the slow fault starts once the reward actor's restart (reward_error@2) is out of the slowdown
    # baseline (steps 5-8); a Ray call's own overhead is most of a tiny generation's time, so the 8x
    # sleep shows as about 3x per token
    proc = _train("grpo", [*tiny_run(model_dir, tmp_path, 20), "run.threads=1", "runtime.roles.rollout.threads=1",
                           "runtime.engine=ray", "algo.dynamic_sampling=true", "algo.max_gen_batches=20",
                           "rollout.mode=async", "rollout.max_staleness=1", "algo.off_policy=tis",
                           "runtime.roles.rollout.count=2", "runtime.roles.reward.count=1",
                           "faults=[reward_error@2,reward_timeout@3,slow@9:worker=1:factor=8]",
                           "runtime.roles.reward.timeout_s=1", "resilience.slow_window=4",
                           "resilience.slow_min_s=0.005", "runtime.roles.rollout.quarantine_ratio=0"])
    try:
        survivor, actor = _rollout_pids(tmp_path, after_steps=1)
        slow = _wait_for(lambda: [e for e in _events(tmp_path) if e["kind"] == "slowdown" and e["worker"] == 1]
                         or proc.poll() is not None, 120, "the slowed rollout actor's detection")
        assert slow is not True, "the run ended before the slowed rollout actor was detected"
        assert slow[0]["stage"] == "gen" and slow[0]["step"] < 20
        sockets = listening_sockets(process_tree(proc.pid))  # the trainer, GCS, raylet, agents, actors
        assert len(sockets) >= 5, sockets
        assert actor in {pid for pid, *_ in sockets}
        exposed = [s for s in sockets if not is_loopback(s[2])]
        assert not exposed, f"listening beyond loopback: {exposed}"
        os.kill(actor, signal.SIGKILL)  # mid-run: its groups in flight go to the other actor or its replacement
        _wait_for(lambda: any(e["kind"] == "rollout_worker_died" for e in read_jsonl(tmp_path / "events.jsonl")), 120,
                  "the rollout actor's replacement")
        _finish(proc)
    finally:
        proc.kill()
    events = read_jsonl(tmp_path / "events.jsonl")
    incidents = [(e["kind"], e["worker"], e["pid"]) for e in events if e["kind"].startswith("rollout_worker_")]
    assert incidents[0] == ("rollout_worker_died", 1, actor)
    # its replacement starts beside the generation: it joins unless the run ended first
    assert all(kind == "rollout_worker_joined" and worker == 1 and pid != actor for kind, worker, pid in incidents[1:])
    assert [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == list(range(1, 21))
    _assert_every_prompt_used_once(tmp_path)
    failed = [" ".join(e["errors"]) for e in events if e["kind"] == "reward_failed"]  # at the producer's step
    assert any("reward[0]: RuntimeError: injected reward error" in f for f in failed), failed
    assert any("reward[0]: timeout after 1s" in f for f in failed), failed


def test_a_run_joins_a_head_started_with_ray_start_on_loopback(model_dir, tmp_path):
    # docs/ray.md's line: the head turns token authentication on, which the driver finds and sends
    temp_dir = f"/tmp/rrh{os.getpid()}"  # short: Ray's unix socket paths live under it
    head = RayHead(temp_dir)
    try:
        env = {k: v for k, v in os.environ.items() if k not in ("RAY_AUTH_MODE", "RAY_ADDRESS")}
        done = subprocess.run([sys.executable, "-m", "reasonrl.cli", "train", "grpo", "--no-supervisor",
                               *tiny_run(model_dir, tmp_path, 2), "run.threads=1", "runtime.engine=ray",
                               f"runtime.ray_address={head.address}", "runtime.roles.rollout.threads=1"],
                              env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        assert [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == [1, 2]
        assert head.pids(), "the head ended with the run"
        [started] = [e for e in read_jsonl(tmp_path / "events.jsonl") if e["kind"] == "rollout_started"]
        logs = {path.name for path in Path(temp_dir).glob("session_*/logs/worker-*")}
        assert any(name.endswith(f"-{started['pids'][0]}.err") for name in logs), logs  # the head's raylet ran it
    finally:
        head.stop()
        subprocess.run(["rm", "-rf", temp_dir], timeout=60)
    assert not head.pids()


def test_a_cluster_that_does_not_answer_is_an_input_error_with_no_restart(model_dir, tmp_path):
    with socket.socket() as probe:  # a loopback port nothing listens on
        probe.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{probe.getsockname()[1]}"
    proc = subprocess.run([sys.executable, "-m", "reasonrl.cli", "train", "grpo", *tiny_run(model_dir, tmp_path / "run", 2),
                           "runtime.engine=ray", f"runtime.ray_address={address}",
                           "runtime.ray_join_timeout_s=2"],
                          capture_output=True, text=True, timeout=60)  # a wrong address ends within 60 s
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert f"runtime.ray_address = {address!r}: could not join a Ray cluster there" in proc.stderr
    assert f"_node_ip_address='127.0.0.1'" in proc.stderr  # a loopback address is dialled on loopback
    assert not (tmp_path / "run").exists()  # nothing was written: no event, no restart, and the directory is gone


def test_a_parallel_sweep_on_ray_trains_each_run_in_an_actor_and_sigterm_stops_them_with_a_checkpoint(model_dir,
                                                                                                    tmp_path):
    """sweep.parallel=2 with runtime.engine=ray: both runs train at once, each in a Ray actor of
    its own whose controller places the run's reward actor on the cluster; SIGTERM reaches each
    run through a call beside its training (signals do not reach a run inside an actor's call)
    and stops it after its step with a checkpoint: exit 143, every run resumable from there
    (the resume itself is the trainer's, tested with the process sweep in test_sweep.py)."""
    from tests.integration.test_sweep import REPO, committed, write_sweep

    spec = write_sweep(tmp_path / "sweep.yaml", model_dir, [0], {"algo.eps_high": [0.2, 0.28]},
                       sweep={"parallel": 2})
    data = json.loads(spec.read_text())
    data["set"] |= {"runtime.engine": "ray", "train.total_steps": 8, "eval.every_steps": 4, "reward.fn": "dapo",
                    "runtime.roles.reward.count": 1, "algo.kl_loss_coef": 0.0}
    spec.write_text(json.dumps(data))
    root = tmp_path / "sweep"
    runs = [root / cell / "seed_0" for cell in ("algo.eps_high=0.2", "algo.eps_high=0.28")]
    command = [sys.executable, "-m", "reasonrl.cli", "sweep", str(spec), "--dir", str(root)]
    first = subprocess.Popen(command, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    try:
        _wait_for(lambda: all((committed(r) or 0) >= 1 for r in runs) or first.poll() is not None, 240,
                  "a checkpoint of both runs")
        assert first.poll() is None, first.communicate()[0][-3000:]
        first.send_signal(signal.SIGTERM)
        out, _ = first.communicate(timeout=120)
    finally:
        first.kill()
    assert first.returncode == 128 + signal.SIGTERM, out[-3000:]
    stopped = {r: committed(r) for r in runs}
    assert all(1 <= step < 8 for step in stopped.values()), stopped  # both were training when it came
    trainers = set()
    for run in runs:
        events = read_jsonl(run / "events.jsonl")
        [start] = [e for e in events if e["kind"] == "start"]
        trainers.add(start["pid"])
        assert [r["step"] for r in read_jsonl(run / "metrics.jsonl")][-1] == stopped[run]  # stopped at its checkpoint
    assert len(trainers) == 2 and first.pid not in trainers  # at once, in two actors
    logs = {p.name for p in Path("/tmp/ray").glob("session_*/logs/worker-*")}  # another test may start a cluster too
    assert all(any(name.endswith(f"-{pid}.err") for name in logs) for pid in trainers), (trainers, logs)
    sweep_events = read_jsonl(root / "events.jsonl")
    assert [e["signal"] for e in sweep_events if e["kind"] == "sweep_stopped"] == ["SIGTERM"]
