"""Runs under hostile conditions: errors that would repeat end at once with exit 2 and one line;
values that cannot train are refused by key; odd run directories; disk full at a checkpoint; a
refused resume writes nothing; a run that never applied an update exports nothing."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

from reasonrl.checkpoint import find_latest, load_checkpoint
from reasonrl.cli import main
from reasonrl.metrics import read_jsonl
from reasonrl.preflight import CHECK_WORKERS_AFTER_A_TIMEOUT
from tests.conftest import fill, tiny_run


def train(capsys, model_dir, run_dir, *extra, steps=2):
    """``reasonrl train grpo --no-supervisor`` in this process: (exit code, stderr lines)."""
    capsys.readouterr()
    code = main(["train", "grpo", *tiny_run(model_dir, run_dir, steps), "--no-supervisor", *extra])
    return code, capsys.readouterr().err.strip().splitlines()


def files(run_dir):
    """{name: bytes} of a run directory's files, but its lock (which names who holds it)."""
    return {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file() and p.name != "run.lock"}


def assert_fatal(code, err, *needles):
    """Exit 2 with the error as the last stderr line, one line, and no traceback."""
    assert code == 2, err
    assert not any("Traceback" in line for line in err), err
    assert err and err[-1].startswith("reasonrl train: error: "), err
    for needle in needles:
        assert needle in err[-1], (needle, err[-1])


def test_a_missing_extra_is_one_exit_2_line_naming_it_before_anything_loads(capsys, model_dir, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError, as when it is not installed
    monkeypatch.setitem(sys.modules, "vllm", None)
    assert_fatal(*train(capsys, model_dir, tmp_path / "a", "runtime.engine=ray"), "runtime.engine = 'ray'",
                 "pip install 'reasonrl[ray]'")
    assert_fatal(*train(capsys, model_dir, tmp_path / "b", "rollout.backend=vllm"), "pip install 'reasonrl[vllm]'")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_a_ray_that_fails_to_import_ends_a_supervised_run_with_one_exit_2_line_and_no_restart(model_dir, tmp_path):
    """A ray package that is there but cannot be imported passes preflight's look-up; the trainer's
    import of it is then an input error: exit 2 at once, one line, never restarted. The run wrote
    nothing, so the supervisor removes the directory it made for it: no event, no restart."""
    broken = tmp_path / "site" / "ray"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text('raise ImportError("ray is broken here")\n')
    run = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(broken.parent), os.getcwd()])}
    proc = subprocess.run([sys.executable, "-m", "reasonrl.cli", "train", "grpo", *tiny_run(model_dir, run),
                           "runtime.engine=ray"], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if "error" in line.lower()]
    assert errors == ["reasonrl train: error: runtime.engine = 'ray' needs the ray package, which cannot be imported "
                      "(ImportError: ray is broken here); install it with pip install 'reasonrl[ray]'"], proc.stderr
    assert not run.exists()


def test_a_reward_function_that_calls_sys_exit_ends_a_supervised_run_with_one_exit_2_line_and_no_restart(model_dir,
                                                                                                        tmp_path):
    """Each sample it grades fails (sys.exit ends the grading, not the trainer); past
    resilience.reward_max_failures in a row the run ends: exit 2, the last failure named, never
    restarted (it would fail again)."""
    run = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "reasonrl.cli", "train", "grpo", *tiny_run(model_dir, run),
                           "reward.fn=tests.reward_fixtures:exits_on_answers", "resilience.reward_max_failures=4"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert "samples in a row failed" in last and "the reward function called sys.exit(3)" in last, last
    assert not {"crash", "recovered", "gave_up"} & {e["kind"] for e in read_jsonl(run / "events.jsonl")}


def test_an_import_path_reward_that_hangs_is_cut_at_its_time_limit_at_the_default_count(capsys, model_dir, tmp_path):
    """runtime.roles.reward.count=0 (the default) still grades an import-path function in a
    worker process, killed at runtime.roles.reward.timeout_s: each hanging sample is a recorded
    timeout failure, the run trains on."""
    run = tmp_path / "run"
    code, err = train(capsys, model_dir, run, "reward.fn=tests.reward_fixtures:stuck_coin",
                      "runtime.roles.reward.timeout_s=0.5", "resilience.reward_max_failures=100", steps=2)
    assert code == 0, err
    rows = [r for r in read_jsonl(run / "metrics.jsonl") if r["step"] > 0]
    assert len(rows) == 2 and sum(r["reward/timeouts"] for r in rows) > 0, rows
    failed = [e for e in read_jsonl(run / "events.jsonl") if e["kind"] == "reward_failed"]
    assert failed and all("timeout after 0.5s" in error for e in failed for error in e["errors"]), failed


def test_a_reward_module_that_hangs_or_exits_at_import_fails_the_pre_start_check_with_one_line(capsys, model_dir, tmp_path,
                                                                                              monkeypatch):
    """The check imports an import-path reward in a process of its own, killed at its limit:
    exit 2, one line naming the function and the limit; nothing imported it in this process."""
    import reasonrl.preflight

    monkeypatch.setattr(reasonrl.preflight, "IMPORT_TIMEOUT_S", 2.0)
    (tmp_path / "hangs.py").write_text("import time\ntime.sleep(3600)\n\ndef score(response, truth):\n    return 0.0\n")
    (tmp_path / "exits.py").write_text("import os\nos._exit(0)\n")
    (tmp_path / "table.py").write_text("score = {'not': 'callable'}\n")
    for spec, needle in [(f"{tmp_path}/hangs.py:score", "importing it did not end within 2 s"),
                         (f"{tmp_path}/exits.py:score", "importing it ended the interpreter (exit status 0)"),
                         (f"{tmp_path}/table.py:score", "'score' is a dict, not a callable")]:
        code, err = train(capsys, model_dir, tmp_path / "run", f"reward.fn={spec}", "--dry-run")
        assert_fatal(code, err, f"reward function = {spec!r}: ", needle)
        assert not (tmp_path / "run").exists()
    assert not [m for m in sys.modules if m.startswith(("reasonrl_plugin_hangs", "reasonrl_plugin_exits", "reasonrl_plugin_table"))]


def test_the_pre_start_check_grades_rows_and_refuses_a_reward_that_fails_or_hangs_on_all_of_them(capsys, model_dir,
                                                                                                   tmp_path):
    """Before anything loads, an empty response and the ground truth of rows of the data are
    graded as training would (an import-path function in a worker process, each sample killed at
    runtime.roles.reward.timeout_s): every sample failing is one exit-2 line naming a row and the
    error; some failing is a note in the plan."""
    run = tmp_path / "run"
    for fn, needle in [("exits", "the reward function called sys.exit(3)"), ("hangs", "reward[0]: timeout after 1s")]:
        code, err = train(capsys, model_dir, run, f"reward.fn=tests.reward_fixtures:{fn}",
                          "runtime.roles.reward.timeout_s=1", "--dry-run")
        assert_fatal(code, err, "reward check: every sample failed, e.g. row ", "with an empty response", needle)
        assert not run.exists()
    capsys.readouterr()
    code = main(["train", "grpo", *tiny_run(model_dir, run, 2), "--no-supervisor", "--dry-run",
                 "reward.fn=tests.reward_fixtures:fails_on_empty"])
    out = capsys.readouterr().out
    assert code == 0 and not run.exists()
    reward = next(line for line in out.splitlines() if line.startswith("reward"))
    assert "reward check: " in reward and " samples failed, e.g. row " in reward, reward
    assert "with an empty response: reward[0]: ValueError: no answer to parse" in reward, reward


def test_after_a_sample_that_hangs_the_pre_start_check_grades_the_other_rows_in_several_workers(model_dir, tmp_path):
    """A function that ran past its timeout on the check's first sample is likely to hang on the
    rest: they go to several workers at once, each sample here to a process of its own (graded
    one after another, each hang would replace the one worker: fewer processes than samples), so
    a function that hangs on every row costs a few timeouts, not one per sample."""
    pids = tmp_path / "pids"
    proc = subprocess.run([sys.executable, "-m", "reasonrl.cli", "train", "grpo", *tiny_run(model_dir, tmp_path / "run", 2),
                           "--no-supervisor", "--dry-run", "reward.fn=tests.reward_fixtures:hangs_on_empty",
                           "runtime.roles.reward.timeout_s=1"],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "REWARD_PIDS": str(pids)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    reward = next(line for line in proc.stdout.splitlines() if line.startswith("reward"))
    assert "with an empty response: reward[0]: timeout after 1s" in reward, reward
    graded = pids.read_text().split()  # a process per call: the first sample's, then one for each other
    assert 4 <= len(graded) <= 1 + CHECK_WORKERS_AFTER_A_TIMEOUT and len(set(graded)) == len(graded), graded


@pytest.mark.parametrize("override, key", [
    ("train.grad_clip=-1", "train.grad_clip"),
    ("train.lr=.inf", "train.lr"),
    ("train.grad_clip=.nan", "train.grad_clip"),
    ("algo.kl_loss_coef=-0.1", "algo.kl_loss_coef"),
    ("runtime.roles.rollout.count=0", "runtime.roles.rollout.count"),
    ("rollout.max_new_tokens=0", "rollout.max_new_tokens"),
])
def test_values_that_cannot_train_are_refused_by_key(capsys, model_dir, tmp_path, override, key):
    code, err = train(capsys, model_dir, tmp_path / "run", override)
    assert_fatal(code, err, key)
    assert not (tmp_path / "run").exists()  # refused before anything was created


def test_errors_that_would_repeat_exit_2_with_one_line(capsys, model_dir, tmp_path):
    if not torch.cuda.is_available():
        assert_fatal(*train(capsys, model_dir, tmp_path / "cuda", "run.device=cuda"), "run.device", "no CUDA")
    no_weights = tmp_path / "no_weights"
    shutil.copytree(model_dir, no_weights)
    (no_weights / "model.safetensors").unlink()
    assert_fatal(*train(capsys, no_weights, tmp_path / "a"), "model.path", "cannot load the model")
    truncated = tmp_path / "truncated"
    shutil.copytree(model_dir, truncated)
    weights = truncated / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    assert_fatal(*train(capsys, truncated, tmp_path / "b"), "model.path", "cannot load the model")
    no_tokenizer = tmp_path / "no_tokenizer"
    no_tokenizer.mkdir()
    for name in ("config.json", "generation_config.json", "model.safetensors"):
        if (model_dir / name).exists():
            shutil.copy(model_dir / name, no_tokenizer / name)
    assert_fatal(*train(capsys, no_tokenizer, tmp_path / "c"), "no tokenizer files")
    assert_fatal(*train(capsys, model_dir, tmp_path / "d", "reward.fn=tests.reward_fixtures:never",
                        "algo.dynamic_sampling=true", "algo.max_gen_batches=1"), "algo.max_gen_batches")
    assert_fatal(*train(capsys, model_dir, tmp_path / "e", "reward.fn=tests.reward_fixtures:broken",
                        "resilience.reward_max_failures=3"), "broken reward function")


def test_odd_run_directories_get_one_clear_line(capsys, model_dir, tmp_path):
    a_file = tmp_path / "file"
    a_file.write_text("not a directory")
    assert_fatal(*train(capsys, model_dir, a_file), "is a file")
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "metrics.jsonl").write_text('{"step": 1, "loss": 0.5}\n')
    assert_fatal(*train(capsys, model_dir, foreign), "holds files reasonrl did not write (metrics.jsonl)")
    assert (foreign / "metrics.jsonl").read_text() == '{"step": 1, "loss": 0.5}\n'  # untouched
    read_only = tmp_path / "read_only"
    read_only.mkdir()
    if os.geteuid() == 0:  # root writes anywhere a permission bit forbids: use a read-only mount
        if subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(read_only)]).returncode != 0:
            pytest.skip("cannot mount a read-only tmpfs here")
    else:
        read_only.chmod(0o555)
    try:
        assert_fatal(*train(capsys, model_dir, read_only), "not writable")
    finally:
        if os.geteuid() == 0:
            subprocess.run(["umount", str(read_only)], check=True)


def test_a_refused_resume_writes_nothing_and_changed_data_needs_consent(capsys, model_dir, tmp_path):
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{i}+1=", "ground_truth": str(i + 1)}) + "\n" for i in range(40)))
    run = tmp_path / "run"
    code, err = train(capsys, model_dir, run, f"data.source={data}")
    assert code == 0, err
    before = files(run)
    assert_fatal(*train(capsys, model_dir, run, f"data.source={data}", "algo.eps_high=0.3"), "different configuration",
                 "algo.eps_high: 0.2 -> 0.3")
    assert files(run) == before  # config.yaml, events: as they were
    # --dry-run refuses it as the run does, and so does a run asked for more steps
    assert_fatal(*train(capsys, model_dir, run, f"data.source={data}", "algo.eps_high=0.3", "--dry-run"),
                 "different configuration", "algo.eps_high: 0.2 -> 0.3")
    assert_fatal(*train(capsys, model_dir, run, f"data.source={data}", "algo.eps_high=0.3", steps=3),
                 "different configuration", "algo.eps_high: 0.2 -> 0.3")
    assert files(run) == before
    # The same path with other rows: refused, unless asked for.
    data.write_text("".join(json.dumps({"prompt": f"{i}+2=", "ground_truth": str(i + 2)}) + "\n" for i in range(40)))
    assert_fatal(*train(capsys, model_dir, run, f"data.source={data}", steps=3), "training data differs", "resume.allow_data_change=true")
    assert files(run) == before
    assert_fatal(*train(capsys, model_dir, run, f"data.source={data}", "--dry-run", steps=3), "training data differs",
                 "resume.allow_data_change=true")
    code, err = train(capsys, model_dir, run, f"data.source={data}", "resume.allow_data_change=true", "--dry-run",
                      steps=3)
    assert code == 0, err
    assert files(run) == before
    code, err = train(capsys, model_dir, run, f"data.source={data}", "resume.allow_data_change=true", steps=3)
    assert code == 0, err
    changed = [e for e in read_jsonl(run / "events.jsonl") if e["kind"] == "data_changed"]
    assert len(changed) == 1 and changed[0]["step"] == 2


class _CallsAFunction:
    """Pickled as a call of ``os.getpid``: a global ``torch.load(weights_only=True)`` refuses."""

    def __reduce__(self):
        return os.getpid, ()


def _poison_state(checkpoint):
    """Replace ``checkpoint``'s state.pt with a pickle that ``torch.load(weights_only=True)``
    refuses, its manifest and COMMITTED marker rewritten to match: the checkpoint verifies and
    cannot be loaded."""
    import hashlib

    state = checkpoint / "state.pt"
    torch.save({"controller": _CallsAFunction()}, state)
    manifest = json.loads((checkpoint / "manifest.json").read_text())
    manifest["files"]["state.pt"] = {"size": state.stat().st_size, "sha256": hashlib.sha256(state.read_bytes()).hexdigest()}
    raw = json.dumps(manifest, indent=2, sort_keys=True).encode() + b"\n"
    (checkpoint / "manifest.json").write_bytes(raw)
    (checkpoint / "COMMITTED").write_bytes(hashlib.sha256(raw).hexdigest().encode() + b"\n")


def test_a_checkpoint_that_verifies_but_cannot_be_loaded_falls_back_to_the_one_before(capsys, model_dir, tmp_path):
    run = tmp_path / "run"
    assert train(capsys, model_dir, run, "checkpoint.every_steps=1", steps=2)[0] == 0
    _poison_state(run / "checkpoints" / "step_2")
    assert find_latest(run / "checkpoints") == run / "checkpoints" / "step_2"  # its hashes match
    code, err = train(capsys, model_dir, run, "checkpoint.every_steps=1", steps=3)
    assert code == 0, err
    events = read_jsonl(run / "events.jsonl")
    skipped = [e for e in events if e["kind"] == "checkpoint_skipped"]
    assert [(e["step"], e["path"]) for e in skipped] == [(2, str(run / "checkpoints" / "step_2"))]
    assert "state.pt: cannot be loaded" in skipped[0]["reason"] and "GLOBAL posix.getpid" in skipped[0]["reason"]
    resume = [e for e in events if e["kind"] == "resume"][-1]
    assert resume["from_step"] == 1 and resume["path"] == str(run / "checkpoints" / "step_1")
    assert [r["step"] for r in read_jsonl(run / "metrics.jsonl")] == [1, 2, 3]  # step 2 trained again, row replaced

    alone = tmp_path / "alone"  # no checkpoint before it: exit 2 naming it, nothing restarted or written
    assert train(capsys, model_dir, alone, "checkpoint.every_steps=1", steps=1)[0] == 0
    _poison_state(alone / "checkpoints" / "step_1")
    before = files(alone)
    assert_fatal(*train(capsys, model_dir, alone, "checkpoint.every_steps=1", steps=2),
                 str(alone / "checkpoints" / "step_1" / "state.pt"), "cannot be loaded", "no earlier checkpoint loads")
    assert files(alone) == before


def test_a_full_disk_at_a_checkpoint_keeps_the_previous_one_and_training_goes_on(capsys, model_dir, tmp_path):
    run = tmp_path / "run"
    code, err = train(capsys, model_dir, run, "checkpoint.every_steps=2", "checkpoint.keep=3", "faults=[disk_full@4]", steps=6)
    assert code == 0, err
    assert any(f"the previous checkpoint ({run / 'checkpoints' / 'step_2'}) is intact" in line for line in err), err
    events = read_jsonl(run / "events.jsonl")
    (failed,) = [e for e in events if e["kind"] == "checkpoint_failed"]
    assert failed["step"] == 4 and failed["cause"] == "no space left on device"
    assert "No space left on device" in failed["error"] and "unexpected pos" not in failed["error"]
    assert [e["step"] for e in events if e["kind"] == "checkpoint"] == [2, 6]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_2", "step_6"]  # no half-written step_4
    assert load_checkpoint(run / "checkpoints/step_2")[0] == 2 and (run / "final").is_dir()


def on_a_full_disk(run, disk, name, directory=False):
    """A fresh run directory whose ``name`` (a file, or a directory) is on ``disk``, filled up."""
    run.mkdir()
    (run / "run.lock").touch()  # a reasonrl run directory, with nothing in it yet
    if directory:
        (disk / name).mkdir()
    (run / name).symlink_to(disk / name)
    fill(disk)
    return run / name


def test_a_full_disk_at_the_metrics_stops_the_supervised_run_with_a_checkpoint_and_one_line(model_dir, small_disk,
                                                                                            tmp_path):
    run = tmp_path / "run"
    metrics = on_a_full_disk(run, small_disk, "metrics.jsonl")
    proc = subprocess.run([sys.executable, "-m", "reasonrl.cli", "train", "grpo", *tiny_run(model_dir, run, 3)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    disk = small_disk.resolve()
    line = (f"reasonrl train: error: {metrics}: cannot write (no space left on device; the file system at {disk}); "
            f"the run stopped at step 1 and a rerun resumes from {run / 'checkpoints' / 'step_1'}; free space on {disk} "
            "and run the same command again")
    assert proc.stderr.strip().splitlines()[-1] == line
    events = read_jsonl(run / "events.jsonl")
    (failed,) = [e for e in events if e["kind"] == "write_failed"]
    assert (failed["step"], failed["path"], failed["disk"], failed["cause"]) == (1, str(metrics), str(disk),
                                                                                 "no space left on device")
    assert events[-1]["kind"] == "fatal" and events[-1]["message"] == line  # the supervisor's: it did not restart
    assert not {"crash", "gave_up"} & {e["kind"] for e in events}
    assert load_checkpoint(run / "checkpoints" / "step_1")[0] == 1
    assert json.loads((run / "summary.json").read_text())["incidents"] == {"write_failed": 1}


@pytest.mark.parametrize("name, override", [("samples.jsonl", "run.keep_samples=4"),
                                            ("tensorboard", "run.loggers=[tensorboard]"), ("prompts.jsonl", None)])
def test_a_full_disk_at_the_samples_prompts_or_tensorboard_stops_the_run_with_one_line(capsys, model_dir, small_disk,
                                                                                       tmp_path, name, override):
    run = tmp_path / "run"
    target = on_a_full_disk(run, small_disk, name, directory=name == "tensorboard")
    code, err = train(capsys, model_dir, run, *([override] if override else []), steps=3)
    assert_fatal(code, err, f"{target}: cannot write (no space left on device; the file system at {small_disk.resolve()})",
                 f"the run stopped at step 1 and a rerun resumes from {run / 'checkpoints' / 'step_1'}")
    assert [e["path"] for e in read_jsonl(run / "events.jsonl") if e["kind"] == "write_failed"] == [str(target)]
    assert [r["step"] for r in read_jsonl(run / "metrics.jsonl")] == [1]


def test_a_full_disk_before_the_first_step_is_one_line_naming_config_yaml(capsys, model_dir, small_disk):
    run = small_disk / "run"  # the whole run directory on the full disk: config.yaml is its first file
    run.mkdir()
    (run / "run.lock").touch()
    fill(small_disk)
    code, err = train(capsys, model_dir, run)
    assert_fatal(code, err, f"{run / 'config.yaml'}: cannot write (no space left on device; the file system at "
                            f"{small_disk.resolve()})")
    assert not (run / "config.yaml").exists() and not (run / "metrics.jsonl").exists()


def test_a_final_checkpoint_that_cannot_be_written_is_retried_then_an_error(capsys, model_dir, tmp_path):
    run = tmp_path / "run"
    code, err = train(capsys, model_dir, run, "checkpoint.final_retries=2", "faults=[disk_full@2:count=5]")
    assert_fatal(code, err, "final checkpoint could not be written in 2 attempts (no space left on device)",
                 "no checkpoint of this run has been written, so a rerun starts from the beginning")
    assert not any("intact" in line for line in err), err  # there is none to keep
    assert [e["attempt"] for e in read_jsonl(run / "events.jsonl") if e["kind"] == "checkpoint_failed"] == [1, 2]
    assert find_latest(run / "checkpoints") is None and not (run / "final").exists()


def test_a_run_that_never_applied_an_update_ends_non_zero_and_exports_nothing(capsys, model_dir, tmp_path):
    run = tmp_path / "run"
    code, err = train(capsys, model_dir, run, "faults=[nan@1,nan@2,nan@3]", "resilience.nonfinite_max_consecutive=2", steps=3)
    assert_fatal(code, err, "no update was applied in 3 steps")
    assert not (run / "final").exists()
    kinds = [e["kind"] for e in read_jsonl(run / "events.jsonl")]
    assert kinds.count("nonfinite") == 3 and kinds.count("rollback") == 1


def test_the_supervisor_does_not_restart_an_error_that_would_repeat(capsys, model_dir, tmp_path):
    run = tmp_path / "run"
    assert train(capsys, model_dir, run)[0] == 0
    before = files(run)

    def supervised(*extra, steps=2):
        return subprocess.run([sys.executable, "-m", "reasonrl.cli", "train", "grpo", *tiny_run(model_dir, run, steps), *extra],
                              capture_output=True, text=True, timeout=120)

    proc = supervised("algo.eps_high=0.3")
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and "different configuration" in proc.stderr.strip().splitlines()[-1]
    assert files(run) == before  # no restart, and a refused resume writes nothing: no fatal event, no summary.json
    # A new run its first child's checks refuse: exit 2 with their line, and nothing left behind, in a
    # directory the supervisor made or in an empty one it was given.
    fresh, empty = tmp_path / "fresh", tmp_path / "empty"
    empty.mkdir()
    for new in (fresh, empty):
        proc = subprocess.run([sys.executable, "-m", "reasonrl.cli", "train", "grpo", *tiny_run(model_dir, new, 2),
                               "reward.fn=nowhere:score"], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert proc.stderr.strip().splitlines()[-1].startswith("reasonrl train: error: reward function = 'nowhere:score'")
    assert not fresh.exists() and list(empty.iterdir()) == []
    # A fatal error of a run that passed its resume check (this run's): the fatal event stays.
    proc = supervised("checkpoint.final_retries=1", "faults=[disk_full@3:count=5]", steps=3)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    events = read_jsonl(run / "events.jsonl")
    assert events[-1]["kind"] == "fatal" and "final checkpoint could not be written" in events[-1]["message"]
    assert not {"crash", "recovered", "gave_up"} & {e["kind"] for e in events}


def test_checkpoints_come_by_wall_time_too(capsys, model_dir, tmp_path):
    run = tmp_path / "run"
    code, err = train(capsys, model_dir, run, "checkpoint.every_steps=0", "checkpoint.every_minutes=1e-6", steps=3)
    assert code == 0, err
    assert [e["step"] for e in read_jsonl(run / "events.jsonl") if e["kind"] == "checkpoint"] == [1, 2, 3]
