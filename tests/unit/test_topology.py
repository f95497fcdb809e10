"""The topology: one plan of where every role runs, printed one line per role, and spawn."""

from __future__ import annotations

import os

import pytest

from reasonrl.config import load
from reasonrl.errors import InputError
from reasonrl.runtime import LocalGroup, ProcessGroup
from reasonrl.runtime.group import ThreadGroup
from reasonrl.runtime.pool import PoolStart
from reasonrl.runtime.threads import available_cores
from reasonrl.runtime.topology import plan, pool_start, spawn
from tests.worker_fixtures import Tagged, tag_worker


def where(overrides):
    topology = plan(load(None, overrides))
    return {role: (p.where, p.count, p.colocate) for role, p in topology.roles.items()}, topology


def test_sync_shares_the_policy_module_on_a_gpu_and_rollout_workers_get_processes_elsewhere():
    roles, topology = where(["run.device=cuda"])
    assert roles == {"policy": ("inline", 1, ""), "rollout": ("thread", 1, "policy"), "reward": ("inline", 1, "")}
    assert not topology.starts_processes()
    roles, topology = where([])  # a CPU: a process decodes faster than a thread beside the trainer
    assert roles["rollout"] == ("process", 1, "") and topology.starts_processes()
    # environment workers are the controller's children only where the rollout workers are its threads
    assert where(["run.device=cuda", "env.name=grid", "runtime.roles.env.count=2"])[1].starts_processes()
    assert not where(["runtime.engine=ray", "env.name=grid", "runtime.roles.env.count=2"])[1].starts_processes()
    roles, _ = where(["rollout.mode=async", "runtime.roles.rollout.count=2", "runtime.roles.rollout.threads=1",
                      "runtime.roles.reward.count=2", "algo.kl_loss_coef=0.01"])
    assert roles == {"policy": ("inline", 1, ""), "reference": ("inline", 1, ""), "rollout": ("process", 2, ""),
                     "reward": ("process", 2, "")}
    roles, _ = where(["runtime.roles.rollout.colocate=none", "runtime.roles.rollout.count=3"])  # sync with processes
    assert roles["rollout"] == ("process", 3, "")
    roles, _ = where(["rollout.mode=lockstep", "runtime.roles.rollout.colocate=policy", "runtime.roles.rollout.count=2"])
    assert roles["rollout"] == ("thread", 2, "policy")


def test_ray_puts_every_role_but_rank_0_in_actors():
    roles, topology = where(["runtime.engine=ray", "runtime.roles.rollout.count=2", "algo.adv_estimator=gae",
                             "runtime.trainer_ranks=2", "env.name=grid"])
    assert roles["rollout"] == ("ray", 2, "") and roles["critic"] == ("ray", 1, "") and roles["policy"] == ("ray", 2, "")
    # environment workers: a pool of actors for each rollout actor and one for validation
    assert roles["env"] == ("ray", 2, "") and topology["env"].pools == 3 and topology["env"].line().split()[1:3] == ["ray", "x3x2"]
    assert topology.ray_actors() == {"policy": 1, "critic": 1, "rollout": 2, "env": 6}


def test_reward_workers_are_ray_actors_on_ray_two_pools_of_count_and_processes_elsewhere():
    roles, topology = where(["runtime.engine=ray", "runtime.roles.reward.count=2", "runtime.roles.reward.timeout_s=7",
                             "env.name=grid", "runtime.roles.env.count=3"])
    assert roles["reward"] == ("ray", 2, "") and topology["reward"].pools == 2
    assert topology.ray_actors()["reward"] == 4  # the rollout producer's pool and validation's, each in its bundles
    assert topology["reward"].line().split()[1:3] == ["ray", "x2x2"]

    class Reservation:  # the shape of reasonrl.runtime.ray.Reservation.options
        def options(self, role):
            return {"resources": [{"CPU": 1.0}] * 4, "placement": [f"{role} bundle {i}" for i in range(4)]}

    second = pool_start(topology["reward"], part=1, reservation=Reservation())
    assert (second.where, second.count, second.timeout_s) == ("ray", 2, 7.0)
    assert second.ray_options["placement"] == ["reward bundle 2", "reward bundle 3"]
    env = topology["env"]  # validation's pool (0) and rollout actor i's (i + 1), each in its bundles
    assert (env.where, env.pools) == ("ray", 2) and topology.ray_actors()["env"] == 6

    class EnvReservation:
        def options(self, role):
            return {"resources": [{"CPU": 0.5}] * 6, "placement": [f"{role} bundle {i}" for i in range(6)]}

    assert pool_start(env, part=1, reservation=EnvReservation()).ray_options["placement"] == [f"env bundle {i}" for i in (3, 4, 5)]
    grown = pool_start(env, part=2, reservation=EnvReservation())  # a rollout actor the fleet grew: outside the bundles
    assert grown.ray_options == {"resources": [{"CPU": 0.5}] * 3} and grown.count == 3
    _, local_env = where(["env.name=grid", "runtime.roles.env.count=3", "runtime.roles.rollout.count=2"])
    assert pool_start(local_env["env"], part=2) == PoolStart("env", 3, local_env["env"].timeout_s)  # every pool alike
    with pytest.raises(ValueError, match="pool 2 of 2"):
        pool_start(topology["reward"], part=2)
    _, local = where(["runtime.roles.reward.count=2"])
    assert pool_start(local["reward"]) == PoolStart("reward", 2, local["reward"].timeout_s)
    assert local.ray_actors() == {}
    _, inline = where([])
    assert pool_start(inline["reward"]) is None


def test_the_plan_prints_one_line_per_role_starting_with_its_name():
    _, topology = where(["rollout.mode=async", "runtime.roles.rollout.count=2", "runtime.roles.rollout.threads=1",
                         "algo.adv_estimator=gae", "env.name=grid"])
    lines = topology.lines()
    assert [line.split()[0] for line in lines] == ["policy", "critic", "rollout", "reward", "env"]
    assert lines[2].split()[1:3] == ["process", "x2"] and "threads 1" in lines[2] and "timeout 600 s" in lines[2]


def test_the_rollout_line_says_when_validation_generates_with_another_backend():
    """Validation generates over the policy's module with fast (rollout.backend=fast) or hf:
    a vllm or sim run's plan says so, a fast or hf run's needs no word."""
    for backend, validation in [("fast", None), ("hf", None), ("vllm", "hf"), ("sim", "hf")]:
        _, topology = where([f"rollout.backend={backend}"])
        [line] = [line for line in topology.lines() if line.startswith("rollout")]
        said = f"; validation: {validation} backend over the policy's module)"
        assert (said in line) == (validation is not None), line


def test_a_rollout_sharing_the_policy_module_must_not_run_ahead():
    with pytest.raises(InputError, match=r"runtime.roles.rollout.colocate = policy: .*rollout.max_staleness = 1"):
        where(["rollout.mode=async", "rollout.max_staleness=1", "algo.off_policy=bypass",
               "runtime.roles.rollout.colocate=policy"])


def test_spawn_builds_each_worker_where_its_role_runs_and_wraps_it_there():
    _, topology = where(["rollout.mode=async", "runtime.roles.rollout.count=2"])
    group = spawn(topology["rollout"], Tagged, [(1,), (2,)], wrap=tag_worker)
    try:
        assert isinstance(group, ProcessGroup)
        tags = group.call("get_tag")
        assert [t.split(" in ")[0] for t in tags] == ["rollout[0]", "rollout[1]"]
        assert {int(t.split(" in ")[1]) for t in tags} == set(group.pids) and os.getpid() not in group.pids
        assert group.call("add", 0) == [1, 2]
    finally:
        group.close()
    _, topology = where(["runtime.roles.rollout.colocate=policy"])
    thread = spawn(topology["rollout"], Tagged, [(5,)], wrap=tag_worker, concurrent=("set_flag",))
    inline = spawn(topology["policy"], Tagged, [(7,)])
    assert isinstance(thread, ThreadGroup) and isinstance(inline, LocalGroup)
    assert thread.call("get_tag") == [f"rollout[0] in {os.getpid()}"] and inline.call("add", 1) == [8]
    thread.close()
    with pytest.raises(ValueError, match=r"spawn\(rollout\): 2 argument tuples for 1 workers"):
        spawn(topology["rollout"], Tagged, [(1,), (2,)])


@pytest.mark.parametrize("cores, staleness, count, rollout", [
    (2, 0, 1, 2),  # each side in its turn takes every core
    (2, 1, 1, 1),  # generation beside training: the cores split
    (8, 1, 2, 2),  # four for the two rollout workers, four for the trainer
    (8, 0, 2, 4),
    (1, 1, 1, 1),  # never fewer than one thread
])
def test_generation_beside_training_splits_the_cores_between_the_two_sides(cores, staleness, count, rollout):
    beside = ["rollout.mode=async", "algo.off_policy=tis"] if staleness else []
    common = [f"rollout.max_staleness={staleness}", f"runtime.roles.rollout.count={count}", *beside]
    _, topology = where([f"run.threads={cores}", *common])
    assert (topology["policy"].threads, topology["rollout"].threads) == (0, rollout)  # run.threads: the trainer's
    _, topology = where(common)  # the trainer's share of the cores this process may use
    available = available_cores()
    assert topology["policy"].threads == (max(1, available - max(1, available // 2)) if staleness else 0)
