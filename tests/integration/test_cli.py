"""The command line a new user explores: config listing, dry runs, versions, exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest
import yaml

from reasonrl.cli import RECIPES, main
from reasonrl.config import Config, keys_help, load
from reasonrl.metrics import CONSOLE_FIELDS, read_jsonl
from tests.conftest import tiny_run


def _main(capsys, *args):
    """``reasonrl ARGS`` in this process: (exit code, stdout, stderr)."""
    capsys.readouterr()
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_config_keys_lists_every_key_with_type_default_help_and_the_recipe_value(capsys):
    code, out, _ = _main(capsys, "config", "dapo", "--keys")
    assert code == 0
    listed = {line.split("  (")[0]: line for line in out.splitlines() if not line.startswith(" ")}
    assert set(listed) == {k.key for k in keys_help()}
    assert listed["algo.eps_high"] == "algo.eps_high  (float, default 0.2; here: 0.28)"
    assert listed["rollout.backend"].startswith("rollout.backend  (hf | fast | vllm | sim, default \"fast\"")
    help_lines = out.split("algo.eps_high  (")[1].splitlines()[1]
    assert help_lines.strip() == "Upper clip range (clip-higher when > eps_low)."


def test_config_prints_the_resolved_config_as_yaml_that_loads_back(capsys, tmp_path):
    code, out, _ = _main(capsys, "config", "dapo", "algo.eps_high=0.3", "train.total_steps=7")
    assert code == 0
    tree = yaml.safe_load(out)
    assert tree["algo"]["eps_high"] == 0.3 and tree["train"]["total_steps"] == 7
    (tmp_path / "resolved.yaml").write_text(out)
    assert load(tmp_path / "resolved.yaml") == load(RECIPES / "dapo.yaml", ["algo.eps_high=0.3", "train.total_steps=7"])
    code, out, _ = _main(capsys, "config", "train.lr=3e-4")  # no recipe: the defaults
    assert code == 0 and yaml.safe_load(out)["train"]["lr"] == 3e-4
    assert load(None) == Config()


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out.strip() == f"reasonrl {version('reasonrl')}"


def test_a_dry_run_with_a_bad_data_path_fails_at_once_without_loading_a_model(tmp_path):
    """In a fresh interpreter: exit 2 naming the path, with neither torch nor transformers nor
    any model weights loaded (no wall time is asserted: a busy machine would fail it)."""
    script = ("import sys; from reasonrl.cli import main; code = main(sys.argv[1:]); "
              "print(code, 'transformers' in sys.modules, 'torch' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", script, "train", "dapo", "--dry-run", "data.source=/nonexistent/train.parquet",
                           f"run.dir={tmp_path / 'run'}"], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    # reported before torch or transformers load (what makes it quick, on any machine)
    assert proc.stdout.split() == ["2", "False", "False"], proc.stdout + proc.stderr
    assert "data.source = '/nonexistent/train.parquet': no such file" in proc.stderr
    assert not (tmp_path / "run").exists()


def test_a_recipe_that_is_not_utf8_ends_reasonrl_train_with_one_exit_2_line(tmp_path):
    recipe = tmp_path / "latin1.yaml"
    recipe.write_bytes("algo:\n  eps_high: 0.3\n# caf\u00e9\n".encode("latin-1"))
    proc = subprocess.run([sys.executable, "-m", "reasonrl.cli", "train", str(recipe), f"run.dir={tmp_path / 'run'}"],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    [line] = proc.stderr.strip().splitlines()
    assert f"{recipe}, line 3: not UTF-8 text (byte 0xe9 at offset 27)" in line, line
    assert not (tmp_path / "run").exists()


def test_the_checks_before_an_embedded_run_load_no_model_code(tmp_path):
    """What the supervisor runs before its trainer (a dry run: the same checks) tokenises with
    the generic tokenizer alone: no model class of transformers, no warm-start trainer."""
    script = ("import sys; from reasonrl.cli import main; code = main(sys.argv[1:]); "
              "print(code, *(m in sys.modules for m in ('transformers.modeling_utils', 'reasonrl.warmstart.sft')))")
    proc = subprocess.run([sys.executable, "-c", script, "train", "dapo", "--dry-run", f"run.dir={tmp_path / 'run'}",
                           "data.train_size=64"], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.stdout.split()[-3:] == ["0", "False", "False"], proc.stdout + proc.stderr


def test_a_dry_run_refuses_the_faults_a_run_would_refuse_and_passes_any_combination(capsys, model_dir, tmp_path):
    run = tmp_path / "run"
    for faults, needle in (("faults=[crash@1,crash@3]", "faults = 'crash@3': scheduled at step 3, past the last step "
                                                        "(train.total_steps = 2)"),
                           ("faults=[slow_rank@1]", "names trainer rank 1; runtime.trainer_ranks = 1")):
        code, _, dry = _main(capsys, "train", "grpo", "--dry-run", *tiny_run(model_dir, run, 2), faults)
        assert code == 2 and needle in dry, dry
        code, _, real = _main(capsys, "train", "grpo", "--no-supervisor", *tiny_run(model_dir, run, 2), faults)
        assert code == 2 and real == dry and not run.exists()  # the same line, before anything was created
    code, _, err = _main(capsys, "train", "grpo", "--dry-run", *tiny_run(model_dir, run, 2),
                         "faults=[ckpt_kill@1,disk_full@2,crash@2,sigkill@1:stage=gen]")
    assert code == 0, err


def test_a_dry_run_checks_everything_prints_the_plan_and_writes_nothing(capsys, model_dir, tmp_path):
    run = tmp_path / "run"
    code, out, err = _main(capsys, "train", "grpo", "--dry-run", *tiny_run(model_dir, run, 2))
    assert code == 0, err
    assert f"run.dir      {run}: a new run" in out
    assert "data         embedded: 64 training prompts, 16 held out" in out
    assert f"model        {model_dir} on cpu" in out
    assert "memory       ~" in out and "GB at peak" in out
    assert not run.exists()
    code, _, err = _main(capsys, "train", "grpo", "--dry-run", *tiny_run(model_dir, run, 2), "reward.fn=nowhere:score")
    assert code == 2 and "reward function = 'nowhere:score'" in err
    code, _, err = _main(capsys, "train", "grpo", "--dry-run", *tiny_run(model_dir, run, 2), f"model.path={tmp_path}")
    assert code == 2 and "not a Hugging Face model directory" in err
    code, _, err = _main(capsys, "train", "grpo", "--dry-run", *tiny_run(model_dir, run, 2), "run.device=cuda:7")
    assert code == 2 and "run.device" in err
    # The tiny model holds 256 positions: its 8-token prompts and 250 new tokens do not fit.
    code, _, err = _main(capsys, "train", "grpo", "--dry-run", *tiny_run(model_dir, run, 2), "rollout.max_new_tokens=250")
    assert code == 2 and "rollout.max_new_tokens = 250" in err and "context of 256 tokens" in err
    # A batch whose step needs more memory than this machine has: an error naming what to lower.
    huge = ["train.prompts_per_step=400000", "rollout.n=16", "train.mini_batch_size=6400000"]
    code, _, err = _main(capsys, "train", "grpo", "--dry-run", *tiny_run(model_dir, run, 2), *huge)
    assert code == 2 and "GB at peak" in err and "train.memory_check=false" in err, err
    # An adaptive mix over a dataset's sources, counted once the data is read.
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"prompt": f"{i}+1=?", "ground_truth": str(i + 1), "data_source": f"s{i % 3}"}) + "\n"
                            for i in range(30)))
    code, _, err = _main(capsys, "train", "grpo", "--dry-run", *tiny_run(model_dir, run, 2), f"data.source={rows}",
                         "data.mix=adaptive", "data.mix_floor=0.4")
    assert code == 2 and "data.mix_floor = 0.4: expected a value in [0, 1/3] for the 3 data sources" in err, err
    one = tmp_path / "one.jsonl"
    one.write_text("".join(json.dumps({"prompt": f"{i}+1=?", "ground_truth": str(i + 1)}) + "\n" for i in range(30)))
    code, _, err = _main(capsys, "train", "grpo", "--dry-run", *tiny_run(model_dir, run, 2), f"data.source={one}",
                         "data.mix=adaptive")
    assert code == 2 and "data.mix = 'adaptive': mixes data sources, and the training data has one" in err, err
    assert not run.exists()


def test_a_dry_run_prints_where_every_role_runs_one_line_each(capsys, model_dir, tmp_path):
    run = tmp_path / "run"
    code, out, err = _main(capsys, "train", "grpo", "--dry-run", *tiny_run(model_dir, run, 2), "runtime.engine=ray",
                           "runtime.roles.rollout.count=2", "algo.kl_loss_coef=0.01")
    assert code == 0, err
    roles = out[out.index("\nroles\n") + 7:].splitlines()
    assert [line.split()[0] for line in roles] == ["policy", "reference", "rollout", "reward"]
    assert roles[1].split()[1:3] == ["ray", "x1"] and roles[2].split()[1:3] == ["ray", "x2"]
    assert "1 cpu, 0 gpu each" in roles[2] and not run.exists()
    code, _, err = _main(capsys, "train", "grpo", "--dry-run", *tiny_run(model_dir, run, 2), "rollout.mode=async",
                         "rollout.max_staleness=1", "algo.off_policy=tis", "runtime.roles.rollout.colocate=policy")
    assert code == 2 and "runtime.roles.rollout.colocate = policy" in err


def test_a_normal_train_runs_the_same_checks_before_loading_anything(capsys, model_dir, tmp_path):
    run = tmp_path / "run"
    code, _, err = _main(capsys, "train", "grpo", "--no-supervisor", *tiny_run(model_dir, run, 2), "rollout.max_new_tokens=250")
    assert code == 2 and "context of 256 tokens" in err
    assert not run.exists()


@pytest.mark.slow
def test_a_complete_run_started_again_says_so_prints_its_summary_and_exits_0(capsys, model_dir, tmp_path, monkeypatch):
    """Also through ``reasonrl demo`` (the DAPO recipe), whose second call in a row exits 0."""
    monkeypatch.chdir(tmp_path)  # the demo's report goes under the working directory
    run = tmp_path / "run"
    overrides = [*tiny_run(model_dir, run, 2), "eval.every_steps=2", "algo.overlong_buffer=0"]
    code, _, err = _main(capsys, "train", "dapo", "--no-supervisor", *overrides)
    assert code == 0, err
    final = (run / "final" / "model.safetensors").stat().st_mtime_ns
    code, out, _ = _main(capsys, "train", "dapo", *overrides)
    assert code == 0
    said, summary = out.strip().splitlines()
    assert said == f"{run}: the run is already complete (2 steps; raise train.total_steps to go on)"
    summary = json.loads(summary)
    assert summary["step"] == 2 and 0 <= summary["val/acc"] <= 1 and summary["ettr"] == 1.0
    code, out, err = _main(capsys, "demo", *overrides)
    assert code == 0, err
    assert "the run is already complete" in out and "held-out accuracy" in out and "report:" in out
    code, out, _ = _main(capsys, "train", "dapo", "--dry-run", *overrides, "train.total_steps=4")
    assert code == 0 and f"run.dir      {run}: resume from step 2 ({run / 'checkpoints' / 'step_2'})" in out
    assert (run / "final" / "model.safetensors").stat().st_mtime_ns == final  # nothing was redone
    code, _, err = _main(capsys, "train", "dapo", "--no-supervisor", *overrides, "algo.eps_high=0.3")
    assert code == 2 and "different configuration" in err
    code, out, err = _main(capsys, "export", str(run), str(tmp_path / "hf"), "--step", "2")
    assert code == 0 and out.strip() == str(tmp_path / "hf") and (tmp_path / "hf" / "model.safetensors").is_file(), err
    code, _, err = _main(capsys, "export", str(run), str(tmp_path / "hf"), "--step", "5", "--force")
    assert code == 2 and "no checkpoint for step 5" in err and "valid checkpoints: step 2" in err


def test_a_run_without_validation_ends_by_printing_its_last_training_metrics(capsys, model_dir, tmp_path):
    run = tmp_path / "run"
    code, out, err = _main(capsys, "train", "grpo", "--no-supervisor", *tiny_run(model_dir, run, 1))  # eval.every_steps=0
    assert code == 0, err
    [row] = read_jsonl(run / "metrics.jsonl")
    shown = {key: round(row[key], 4) for _, key in CONSOLE_FIELDS if key in row}
    assert json.loads(out.strip().splitlines()[-1]) == shown and "critic/score/mean" in shown and "val/acc" not in shown
    code, out, _ = _main(capsys, "train", "grpo", *tiny_run(model_dir, run, 1))  # complete: the same metrics again
    assert code == 0 and json.loads(out.strip().splitlines()[-1]).items() >= shown.items()


def test_the_console_script_reports_usage_errors_with_exit_2(tmp_path):
    proc = subprocess.run([Path(sys.executable).parent / "reasonrl", "train", "dapo", "algo.nope=1", f"run.dir={tmp_path}"],
                          capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": ""})
    assert proc.returncode == 2 and "algo.nope" in proc.stderr and "Traceback" not in proc.stderr


def test_train_help_lists_every_config_key(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["train", "--help"])
    out = capsys.readouterr().out
    assert exit_.value.code == 0 and "--dry-run" in out
    listed = [line.split(" (")[0].strip() for line in out.split("config keys")[1].splitlines()[1:]]
    assert listed == [k.key for k in keys_help()]
    assert '  algo.eps_high (float = 0.2): Upper clip range (clip-higher when > eps_low).' in out
