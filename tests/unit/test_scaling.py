"""reasonrl scale: counts checked against the run's config and its min/max, kept in
scale.json, taken by a run that starts again, and seen once by a running run."""

from __future__ import annotations

import json
import os

import pytest

from reasonrl.cli import main
from reasonrl.config import ConfigError, dump, load
from reasonrl.errors import InputError
from reasonrl.runtime.scaling import ScaleSchedule, ScaleWatch, request_scale, requested, scaled, schedule


def run_dir(tmp_path, *overrides):
    cfg = load(None, [f"run.dir={tmp_path}", *overrides])
    dump(cfg, tmp_path / "config.yaml")
    return cfg


def test_counts_are_kept_merged_and_a_restarted_run_takes_them(tmp_path, capsys):
    cfg = run_dir(tmp_path, "runtime.roles.rollout.max=4")
    assert requested(tmp_path) == {}
    assert main(["scale", str(tmp_path), "rollout=3"]) == 0
    assert "rollout: 3 workers, applied before its next step" in capsys.readouterr().out
    assert request_scale(tmp_path, {"reward": 2}) == {"reward": 2, "rollout": 3}
    assert json.loads((tmp_path / "scale.json").read_text()) == {"reward": 2, "rollout": 3}
    assert main(["scale", str(tmp_path), "env=2"]) == 0
    assert "env: 2 workers, applied when it next starts" in capsys.readouterr().out
    again = scaled(cfg, tmp_path)
    assert again.runtime.roles.rollout.count == 3 and again.runtime.roles.reward.count == 2
    assert again.runtime.roles.rollout.max == 4 and scaled(cfg, tmp_path / "elsewhere") is cfg


@pytest.mark.parametrize("counts, message", [
    ({"rollout": 5}, "rollout=5 is outside runtime.roles.rollout.min/.max: expected an integer [1, 4]"),
    ({"rollout": 0}, "rollout=0 is outside"),
    ({"critic": 2}, "'critic' cannot be scaled"),
])
def test_a_count_outside_the_bounds_is_refused_and_nothing_is_written(tmp_path, counts, message):
    run_dir(tmp_path, "runtime.roles.rollout.max=4")
    with pytest.raises(InputError, match=message.replace("[", r"\[").replace("]", r"\]")):
        request_scale(tmp_path, counts)
    assert not (tmp_path / "scale.json").exists()


def test_the_cli_names_a_malformed_count_and_a_directory_that_is_no_run(tmp_path, capsys):
    run_dir(tmp_path)
    assert main(["scale", str(tmp_path), "rollout:3"]) == 2
    assert "'rollout:3' is not ROLE=N" in capsys.readouterr().err
    assert main(["scale", str(tmp_path / "nothing"), "rollout=2"]) == 2
    assert "config.yaml: no such file" in capsys.readouterr().err


def test_a_running_run_sees_each_new_rollout_count_once(tmp_path):
    cfg = run_dir(tmp_path)
    watch = ScaleWatch(tmp_path, cfg)
    assert watch.poll() == {}
    request_scale(tmp_path, {"rollout": 3})
    assert watch.poll() == {"rollout": 3} and watch.poll() == {}
    request_scale(tmp_path, {"env": 2})  # an environment count waits for the next start
    os.utime(tmp_path / "scale.json", ns=(1, 1))
    assert watch.poll() == {}
    request_scale(tmp_path, {"reward": 2})
    assert watch.poll() == {"reward": 2}
    request_scale(tmp_path, {"rollout": 1})
    assert watch.poll() == {"rollout": 1}


def test_the_config_keeps_counts_within_min_and_max():
    with pytest.raises(ConfigError, match=r"runtime.roles.rollout.count = 5: must be within runtime.roles.rollout.min=1 "
                                          r"and runtime.roles.rollout.max=4"):
        load(None, ["runtime.roles.rollout.count=5", "runtime.roles.rollout.max=4", "runtime.roles.rollout.min=1"])
    with pytest.raises(ConfigError, match=r"runtime.roles.reward.max = 1: must be 0 \(no bound\) or >= runtime.roles.reward.min"):
        load(None, ["runtime.roles.reward.min=2", "runtime.roles.reward.max=1"])


def test_the_idle_rule_adds_a_worker_when_the_trainer_waits_and_then_waits_itself():
    from reasonrl.runtime.scaling import IdleRule

    rule = IdleRule(load(None, ["runtime.roles.rollout.scale_up_idle=0.3", "runtime.roles.rollout.scale_up_steps=3",
                                "runtime.roles.rollout.max=3"]))
    # idle shares 0.5, 0.2, 0.4: mean 0.367 > 0.3 at the third step
    assert [rule.observe(i, 1.0) for i in (0.5, 0.2, 0.4)] == [None, None, 2]
    assert [rule.observe(0.9, 1.0) for _ in range(3)] == [None, None, 3]  # K steps of history again first
    assert [rule.observe(0.9, 1.0) for _ in range(3)] == [None, None, None]  # at max
    rule.scaled_to(1)
    assert [rule.observe(0.1, 1.0) for _ in range(3)] == [None, None, None]  # mean 0.1: not waiting enough
    assert IdleRule(load(None)).observe(1.0, 1.0) is None  # off by default
    with pytest.raises(ConfigError, match=r"runtime.roles.rollout.max = 0: must be set \(> 0\) when"):
        load(None, ["runtime.roles.rollout.scale_up_idle=0.3"])


def test_a_schedule_gives_each_collect_the_count_of_the_last_step_at_or_before_it(tmp_path, capsys):
    cfg = run_dir(tmp_path, "runtime.roles.rollout.max=4")
    sizes = ScaleSchedule(tmp_path)
    assert sizes.count(1) is None
    assert main(["scale", str(tmp_path), "rollout=3", "--at-step", "4"]) == 0
    assert "from the collect of step 4's batch on" in capsys.readouterr().out
    request_scale(tmp_path, {"rollout": 1}, at_step=8)
    request_scale(tmp_path, {"rollout": 2}, at_step=4)  # the same step: replaced
    assert json.loads((tmp_path / "scale.json").read_text()) == {"schedule": [[4, 2], [8, 1]]}
    assert [sizes.count(c) for c in (1, 3, 4, 7, 8, 20)] == [None, None, 2, 2, 1, 1]
    assert schedule(tmp_path) == [(4, 2), (8, 1)] and requested(tmp_path) == {}
    assert scaled(cfg, tmp_path) is cfg  # a restart starts with the plain count; collects take the schedule
    request_scale(tmp_path, {"reward": 2})  # another role leaves the schedule alone
    assert schedule(tmp_path) == [(4, 2), (8, 1)]
    request_scale(tmp_path, {"rollout": 3})  # a rollout count without a step replaces it
    assert json.loads((tmp_path / "scale.json").read_text()) == {"reward": 2, "rollout": 3}
    assert sizes.count(20) is None


@pytest.mark.parametrize("counts, at_step, message", [
    ({"rollout": 2}, 0, "--at-step 0: expected a step >= 1 and rollout=N alone"),
    ({"reward": 2}, 3, "--at-step 3: expected a step >= 1 and rollout=N alone"),
    ({"rollout": 9}, 3, "rollout=9 is outside runtime.roles.rollout.min/.max"),
])
def test_a_bad_scheduled_count_is_refused_and_nothing_is_written(tmp_path, counts, at_step, message):
    run_dir(tmp_path, "runtime.roles.rollout.max=4")
    with pytest.raises(InputError, match=message):
        request_scale(tmp_path, counts, at_step=at_step)
    assert not (tmp_path / "scale.json").exists()


def test_a_malformed_schedule_names_the_file(tmp_path):
    run_dir(tmp_path)
    (tmp_path / "scale.json").write_text(json.dumps({"schedule": [[4, "two"]]}))
    with pytest.raises(InputError, match=r"scale.json: 'schedule' must be a list of \[step, rollout count\] pairs"):
        ScaleSchedule(tmp_path).count(4)
