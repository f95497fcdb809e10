"""Fault specs, firing once per run across restarts, and the real effect of each action."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from reasonrl.resilience.faults import FIRED_FILE, KINDS, parse_faults
from reasonrl.resilience.guards import read_hang_dump
from reasonrl.metrics import read_jsonl


def test_parse_fills_defaults_and_describes():
    plan = parse_faults(["crash@5", "slow@8:factor=2.5:worker=1", "hang@3", "reward_error@4:count=2"])
    assert [f.spec for f in plan.faults] == [
        "crash@5",
        "slow@8:factor=2.5:worker=1:stage=gen:steps=8",
        "hang@3:stage=gen",
        "reward_error@4:count=2",
    ]
    assert dict(plan.faults[1].params) == {"factor": 2.5, "worker": 1, "stage": "gen", "steps": 8}
    assert plan.faults[0].kind == "crash" and plan.faults[0].step == 5 and dict(plan.faults[0].params) == {"stage": None}
    assert not plan.fired and parse_faults([]).faults == []


@pytest.mark.parametrize(
    ("spec", "parts"),
    [
        ("boom@3", ["'boom'", "allowed kinds: crash, sigkill, hang"]),
        ("crsh@3", ["did you mean 'crash'"]),
        ("crash", ["missing '@step'", "kind@step"]),
        ("crash@x", ["step 'x'", "integer >= 1"]),
        ("nan@0", ["step '0'"]),
        ("slow@3:speed=2", ["unknown key 'speed'", "allowed keys: factor, worker, stage, steps"]),
        ("nan@3:count=1", ["unknown key 'count' for kind 'nan'", "allowed keys: none"]),
        ("slow@3:factor", ["'factor' is not key=value"]),
        ("slow@3:factor=fast", ["bad value 'fast' for key 'factor'", "number > 1"]),
        ("slow@3:factor=0.5", ["bad value '0.5'"]),
        ("slow@3:worker=-1", ["bad value '-1' for key 'worker'", "integer >= 0"]),
        ("hang@3:stage=a b", ["bad value 'a b' for key 'stage'"]),
        ("reward_timeout@3:count=0", ["bad value '0' for key 'count'"]),
    ],
)
def test_bad_spec_errors_name_spec_part_and_allowed(spec, parts):
    with pytest.raises(ValueError) as err:
        parse_faults(["crash@1", spec])
    message = str(err.value)
    assert f"fault spec {spec!r}" in message
    for part in parts:
        assert part in message


def test_duplicate_faults_are_rejected():
    with pytest.raises(ValueError, match=r"'hang@3:stage=gen'.*the same fault as 'hang@3'"):
        parse_faults(["hang@3", "hang@3:stage=gen"])


def test_the_stages_a_fault_may_name_are_the_controllers():
    import ast
    import inspect

    from reasonrl import controller
    from reasonrl.config.faults import STAGES

    calls = [n for n in ast.walk(ast.parse(inspect.getsource(controller))) if isinstance(n, ast.Call)
             and isinstance(n.func, ast.Attribute) and n.func.attr == "stage"]
    assert sorted({c.args[1].value for c in calls}) == sorted(STAGES)


def test_fires_once_across_a_restart(tmp_path):
    specs = ["crash@5", "nan@6", "reward_timeout@7:count=3", "sigkill@9"]
    plan = parse_faults(specs).bind(tmp_path)
    plan.fire("crash", 4)
    with pytest.raises(RuntimeError, match="injected crash at step 5"):
        plan.fire("crash", 5, stage="gen")
    plan.fire("crash", 5, stage="gen")  # fired: no-op
    assert plan.poison_loss(6) and not plan.poison_loss(6)
    assert plan.reward_fault(7) == ("reward_timeout", 3) and plan.reward_fault(7) is None
    assert json.loads((tmp_path / FIRED_FILE).read_text())["fired"] == [
        "crash@5", "nan@6", "reward_timeout@7:count=3",
    ]
    restarted = parse_faults(specs).bind(tmp_path)  # a new process on the same run directory
    restarted.fire("crash", 5, stage="gen")
    assert restarted.at("crash", 5) is None and not restarted.poison_loss(6)
    assert restarted.reward_fault(7) is None
    assert restarted.at("sigkill", 9).spec == "sigkill@9"
    assert [f.spec in restarted.fired for f in restarted.faults] == [True, True, True, False]
    events = read_jsonl(tmp_path / "events.jsonl")
    assert [(e["kind"], e["fault"], e["step"]) for e in events] == [
        ("fault_injected", "crash@5", 5), ("fault_injected", "nan@6", 6),
        ("fault_injected", "reward_timeout@7:count=3", 7),
    ]
    assert events[0]["stage"] == "gen"


def test_stage_restricted_fault_waits_for_its_stage():
    plan = parse_faults(["crash@2:stage=update"])
    plan.fire("crash", 2, stage="gen")
    plan.fire("crash", 2)
    with pytest.raises(RuntimeError, match="crash@2:stage=update"):
        plan.fire("crash", 2, stage="update")


def test_fire_and_at_reject_other_kinds():
    plan = parse_faults(["nan@1"])
    with pytest.raises(ValueError, match="fire performs crash, sigkill, hang"):
        plan.fire("nan", 1)
    with pytest.raises(ValueError, match="unknown kind 'crahs'"):
        plan.at("crahs", 1)
    assert set(KINDS) >= {"crash", "sigkill", "hang", "nan", "slow", "ckpt_kill"}


def test_slow_factor_over_its_window(tmp_path):
    specs = ["slow@3:factor=3:worker=1:steps=4", "slow@5:factor=2:worker=1:stage=gen:steps=1"]
    plan = parse_faults(specs).bind(tmp_path)
    factors = [plan.slow_factor("gen", 1, step) for step in range(1, 9)]
    assert factors == [1.0, 1.0, 3.0, 3.0, 6.0, 3.0, 1.0, 1.0]  # overlapping windows multiply
    assert plan.slow_factor("gen", 0, 4) == 1.0 and plan.slow_factor("update", 1, 4) == 1.0
    restarted = parse_faults(specs).bind(tmp_path)
    assert [restarted.slow_factor("gen", 1, step) for step in range(3, 7)] == [1.0] * 4
    assert len(read_jsonl(tmp_path / "events.jsonl")) == 2


CHILDREN = {
    "sigkill": """
        from reasonrl.resilience.faults import parse_faults
        plan = parse_faults(["sigkill@3"]).bind(RUN_DIR)
        plan.fire("sigkill", 3, stage="update")
        print("survived", flush=True)
    """,
    "crash": """
        from reasonrl.resilience.faults import parse_faults
        plan = parse_faults(["crash@2"]).bind(RUN_DIR)
        plan.fire("crash", 2)
    """,
    "hang": """
        from reasonrl.resilience.faults import parse_faults
        from reasonrl.resilience.guards import StageWatchdog
        plan = parse_faults(["hang@4"]).bind(RUN_DIR)
        watchdog = StageWatchdog(1.0, RUN_DIR / "hang_dump.txt")
        watchdog.beat("gen")
        plan.fire("hang", 4, stage="gen")
    """,
    "ckpt_kill": """
        import torch
        from reasonrl.resilience.faults import parse_faults
        from reasonrl.resilience.injection import checkpoint_writer
        plan = parse_faults(["ckpt_kill@2"]).bind(RUN_DIR)
        writer = checkpoint_writer(RUN_DIR / "checkpoints", 2, plan)
        tensors = {"policy": {"w": torch.ones(4)}, "critic": {"v": torch.zeros(2)}}
        for step in (1, 2):
            writer.save(step, tensors, {"step": step})
        print("survived", flush=True)
    """,
    "light": """
        import sys
        import reasonrl.resilience.faults, reasonrl.resilience.guards
        assert "torch" not in sys.modules, "importing faults/guards pulled in torch"
    """,
}


@pytest.fixture(scope="module")
def children(tmp_path_factory):
    """Run every child at once (each imports reasonrl anew); yield name -> (run_dir, proc)."""
    procs = {}
    for name, body in CHILDREN.items():
        run_dir = tmp_path_factory.mktemp(name)
        code = f"from pathlib import Path\nRUN_DIR = Path({str(run_dir)!r})\n" + textwrap.dedent(body)
        procs[name] = (run_dir, subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                                                  stderr=subprocess.PIPE, text=True))
    yield procs
    for _, proc in procs.values():
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _finish(children, name):
    run_dir, proc = children[name]
    out, err = proc.communicate(timeout=30)
    return run_dir, proc.returncode, out, err


def test_sigkill_really_kills(children):
    run_dir, rc, out, _ = _finish(children, "sigkill")
    assert rc == -9 and "survived" not in out
    assert json.loads((run_dir / FIRED_FILE).read_text())["fired"] == ["sigkill@3"]  # recorded before acting
    (event,) = read_jsonl(run_dir / "events.jsonl")
    assert event["fault"] == "sigkill@3" and event["stage"] == "update"


def test_crash_exits_with_a_traceback(children):
    run_dir, rc, _, err = _finish(children, "crash")
    assert rc == 1
    assert "Traceback (most recent call last)" in err and "RuntimeError: injected crash at step 2" in err
    assert parse_faults(["crash@2"]).bind(run_dir).at("crash", 2) is None


def test_hang_is_caught_by_the_watchdog(children):
    run_dir, rc, _, _ = _finish(children, "hang")
    assert rc != 0
    dump = read_hang_dump(run_dir / "hang_dump.txt")
    assert dump["stage"] == "gen" and "_hang_forever" in dump["stacks"]


def test_ckpt_kill_dies_mid_write_and_keeps_the_previous_checkpoint(children):
    from reasonrl.checkpoint import find_latest

    run_dir, rc, out, _ = _finish(children, "ckpt_kill")
    assert rc == -9 and "survived" not in out
    root = run_dir / "checkpoints"
    assert find_latest(root) == root / "step_1"
    (partial,) = root.glob(".tmp-step_2-*")
    assert [p.name for p in partial.iterdir()] == ["policy.safetensors"]  # first file only
    (event,) = read_jsonl(run_dir / "events.jsonl")
    assert event["fault"] == "ckpt_kill@2" and event["file"].endswith("policy.safetensors")


def test_faults_and_guards_import_without_torch(children):
    _, rc, _, err = _finish(children, "light")
    assert rc == 0, err


def test_a_plan_bound_before_another_process_fired_a_fault_does_not_fire_it_again(tmp_path):
    """A standby trainer binds the run directory long before the trainer it replaces fires its
    faults: the plan reads the fired file again when it changed."""
    standby = parse_faults(["crash@3", "nan@4"]).bind(tmp_path)
    trainer = parse_faults(["crash@3", "nan@4"]).bind(tmp_path)
    with pytest.raises(RuntimeError, match="injected crash"):
        trainer.fire("crash", 3, stage="gen")
    standby.fire("crash", 3, stage="gen")  # already fired: nothing happens
    assert standby.at("nan", 4) is not None and trainer.poison_loss(4)
    assert standby.at("nan", 4) is None and not standby.poison_loss(4)


def test_worker_faults_picks_each_roles_wrapper_and_its_step_clock_stays_in_this_process(tmp_path):
    import pickle

    from reasonrl.resilience.injection import FaultyPolicy, FaultyRewards, FaultyRollout, WorkerFaults, unwrapped

    class Worker:
        version = 3

    plan = parse_faults(["nan@2", "reward_error@3", "slow@4:worker=1"]).bind(tmp_path)
    faults = WorkerFaults(plan, clock=lambda: 2)
    policy, reward, rollout, reference = (faults(Worker(), role, 1) for role in ("policy", "reward", "rollout", "reference"))
    assert type(policy) is FaultyPolicy and policy.clock() == 2 and type(unwrapped(policy)) is Worker
    assert type(reward) is FaultyRewards and type(reference) is Worker
    assert type(rollout) is FaultyRollout and rollout.clock() == 4  # its weights' version trains step 4 next
    assert type(WorkerFaults(parse_faults(["slow@4"]).bind(tmp_path))(Worker(), "policy", 0)) is Worker  # no nan fault
    moved = pickle.loads(pickle.dumps(faults))  # a rollout worker's process gets the plan, not the controller's clock
    assert moved.clock is None and type(moved(Worker(), "rollout", 0)) is FaultyRollout
    with pytest.raises(RuntimeError, match="policy wrapper needs the controller's step clock"):
        moved(Worker(), "policy", 0)
