"""Multi-turn runs end to end: a user's gymnasium.Env on the GRPO recipe, environments that
hang or raise, and ``reasonrl env-check`` on the command line."""

from __future__ import annotations

import gymnasium
import pytest

from reasonrl.cli import main
from reasonrl.config import load
from reasonrl.controller import Controller
from reasonrl.metrics import read_jsonl


class EchoDigits(gymnasium.Env):
    """A text gymnasium.Env: the observation is a digit drawn from the seed, and the episode
    runs two turns; each turn earns 0.5 when it starts with that digit."""

    observation_space = gymnasium.spaces.Text(16)
    action_space = gymnasium.spaces.Text(64)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.digit, self.turn = str(int(self.np_random.integers(10))), 0
        return f"{self.digit}=", {}

    def step(self, action):
        self.turn += 1
        reward = 0.5 if action.startswith(self.digit) else 0.0
        return f"{self.digit}=", reward, self.turn == 2, False, {}


def _run(tmp_path, *overrides):
    cfg = load("recipes/grpo.yaml", [f"run.dir={tmp_path / 'run'}", "train.total_steps=3", "train.prompts_per_step=4",
                                     "rollout.n=4", "train.mini_batch_size=16", "train.micro_batch_size=16",
                                     "eval.every_steps=3", "eval.n_prompts=4", "eval.k=2", "checkpoint.every_steps=0",
                                     "data.train_size=64", "data.test_size=8", "rollout.max_new_tokens=6",
                                     "resilience.supervise=false", "run.progress=false", *overrides])
    controller = Controller.from_config(cfg, log=lambda *a: None)
    controller.run()
    return cfg.run.dir, read_jsonl(tmp_path / "run" / "metrics.jsonl")


def test_a_text_gymnasium_env_trains_on_the_grpo_recipe(tmp_path):
    run_dir, rows = _run(tmp_path, f"env.name={__name__}:EchoDigits", "env.max_turns=2", "runtime.roles.env.count=1")
    steps = [r for r in rows if "actor/grad_norm" in r]
    assert len(steps) == 3
    assert all(r["env/turns_mean"] == 2.0 for r in steps)  # two turns, the environment's tokens between them
    assert any(r["actor/grad_norm"] > 0 for r in steps)  # returns differ within groups: it learns from them
    assert all(0.0 <= r["critic/score/mean"] <= 1.0 for r in steps)
    assert "val/acc" in rows[-1]
    assert (tmp_path / "run" / "final" / "config.json").is_file()


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_episodes_run_on_two_rollout_workers_each_episode_on_one(tmp_path, mode):
    run_dir, rows = _run(tmp_path, f"env.name={__name__}:EchoDigits", "env.max_turns=2", "runtime.roles.env.count=1",
                         "runtime.roles.rollout.count=2", f"rollout.mode={mode}", "runtime.roles.rollout.threads=1")
    steps = [r for r in rows if "actor/grad_norm" in r]
    assert len(steps) == 3 and all(r["env/turns_mean"] == 2.0 for r in steps)  # every episode ran its two turns
    assert all(r["rollout/worker0/groups"] > 0 and r["rollout/worker1/groups"] > 0 for r in steps)
    assert all(r["rollout/worker0/groups"] + r["rollout/worker1/groups"] == 4 for r in steps)  # a group, whole, on one worker
    assert (tmp_path / "run" / "final" / "config.json").is_file()


@pytest.mark.parametrize("env, needles", [
    ("HangingReset", ["reset(3), the first observation of a train prompt",
                      "reset() took longer than runtime.roles.env.timeout_s = 2s"]),
    ("HugeObservation", ["reset(0)", "2,000,000 characters, more than the 100,000"]),
    ("RaisingReset", ["reset(1)", "RuntimeError: no board for seed 1"]),
])
def test_a_reset_that_hangs_floods_or_raises_fails_the_pre_start_check_with_one_line(capsys, tmp_path, env, needles):
    """The pre-start check resets the environment for every initial state in a worker process
    killed at runtime.roles.env.timeout_s: exit 2, one line naming the seed and the limit."""
    code = main(["train", "grpo", "--dry-run", f"run.dir={tmp_path / 'run'}", f"env.name=tests.env_fixtures:{env}",
                 "runtime.roles.env.timeout_s=2", "data.train_size=8", "data.test_size=2", "run.progress=false"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and not any("Traceback" in line for line in err), err
    assert err[-1].startswith(f"reasonrl train: error: env.name = 'tests.env_fixtures:{env}': "), err
    assert all(needle in err[-1] for needle in needles), err[-1]
    assert not (tmp_path / "run").exists()


def test_environments_that_hang_or_raise_end_their_episodes_as_failed_and_the_run_completes(tmp_path):
    """At runtime.roles.env.count=0 an import-path environment still steps in a worker process,
    killed at runtime.roles.env.timeout_s (tests/unit/test_env.py drives pools of several)."""
    run_dir, rows = _run(tmp_path, "env.name=tests.env_fixtures:FlakyBySeed", "env.max_turns=1", "runtime.roles.env.count=0",
                         "runtime.roles.env.timeout_s=1.0")
    steps = [r for r in rows if "actor/grad_norm" in r]
    assert len(steps) == 3
    assert sum(r["env/failed"] for r in steps) > 0
    events = read_jsonl(tmp_path / "run" / "events.jsonl")
    failed = [e for e in events if e["kind"] == "env_failed"]
    assert failed, "no env_failed event"
    errors = " ".join(error for e in failed for error in e["errors"])
    assert "broken board" in errors and "took longer than runtime.roles.env.timeout_s = 1s" in errors
    assert (tmp_path / "run" / "final" / "config.json").is_file()


def test_env_check_passes_on_the_shipped_environments_and_names_a_broken_one(capsys):
    assert main(["env-check", "grid", "--policy", "scripted", "--max-turns", "6", "--episodes", "6"]) == 0
    assert "PASS" in capsys.readouterr().out
    assert main(["env-check", "tool_arith", "--policy", "scripted", "--episodes", "4"]) == 0
    assert "success: 100.0%" in capsys.readouterr().out
    assert main(["env-check", "tests.env_fixtures:WrongReward", "--episodes", "2"]) == 1
    assert "reward of type" in capsys.readouterr().out
    assert main(["env-check", "tests.env_fixtures:Unseeded", "--episodes", "3"]) == 1
    out = capsys.readouterr().out
    assert "reset(0) twice gave different observations" in out


@pytest.mark.parametrize("name", ["nope", "tests.env_fixtures:Missing"])
def test_env_check_on_an_unknown_environment_is_an_error_naming_env_name(name, capsys):
    assert main(["env-check", name]) == 2
    assert "env.name" in capsys.readouterr().err
