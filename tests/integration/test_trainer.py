"""The controller on a tiny random model: dynamic sampling, the run directory, resume, bad input."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from reasonrl.cli import main
from reasonrl.config import load
from reasonrl.controller import Controller
from reasonrl.models.loading import load_model
from reasonrl.errors import ResumeError
from reasonrl.metrics import read_jsonl
from reasonrl.rollout.scheduler import DynamicSamplingError
from tests.conftest import tiny_run


def config(model_dir, run_dir, *overrides):
    return load(None, [*tiny_run(model_dir, run_dir), *overrides])


def test_dynamic_sampling_refills_the_batch_with_mixed_groups(model_dir, tmp_path):
    controller = Controller.from_config(config(model_dir, tmp_path, "algo.dynamic_sampling=true", "algo.max_gen_batches=20", "algo.oversample=1.0"))
    got = controller.source.next_batch(0)
    batch, counts = got.scored, got.metrics
    # Exactly 4 groups of 2, each with one right and one wrong sample.
    assert batch.size == 8
    for g in torch.unique(batch.rollout.group_ids):
        assert batch.acc[batch.rollout.group_ids == g].tolist() in ([True, False], [False, True])
    assert counts["batch/kept_groups"] == 4
    dropped = counts["batch/dropped_all_correct"] + counts["batch/dropped_all_wrong"]
    assert counts["batch/wasted_samples"] == counts["batch/generated_samples"] - 8
    started = counts["batch/generated_samples"] + counts["batch/aborted_samples"]
    assert counts["batch/samples_per_kept_group"] == started / 4
    assert dropped >= 1 and counts["batch/num_gen_batches"] >= 2  # with n=2, half the groups are uniform


def test_dynamic_sampling_gives_up_with_a_clear_error(model_dir, tmp_path):
    controller = Controller.from_config(config(model_dir, tmp_path, "algo.dynamic_sampling=true", "algo.max_gen_batches=3", "reward.fn=tests.reward_fixtures:never"))
    with pytest.raises(DynamicSamplingError, match=r"algo.max_gen_batches"):
        controller.source.next_batch(0)


def test_run_writes_the_run_directory(model_dir, tmp_path):
    Controller.from_config(config(model_dir, tmp_path, "eval.every_steps=3", "algo.adv_estimator=gae", "rollout.n=1")).run()
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    for key in ("critic/score/mean", "actor/pg_loss", "actor/pg_clipfrac", "critic/vf_loss", "response_length/mean", "timing_s/gen", "timing_s/update_critic"):
        assert key in rows[1], key
    assert "val/acc" in rows[0] and "val/pass@4" in rows[3] and "val/acc_greedy" in rows[3]
    assert (tmp_path / "config.yaml").is_file() and load(tmp_path / "config.yaml").algo.adv_estimator == "gae"
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    assert (tmp_path / "checkpoints" / "step_3" / "COMMITTED").is_file()
    final = load_model(tmp_path / "final")
    torch.testing.assert_close(final.state_dict()["lm_head.weight"], load_file(tmp_path / "checkpoints/step_3/policy.safetensors")["lm_head.weight"])


@pytest.mark.parametrize("train_size", [64, 8])
def test_resumed_run_ends_with_the_same_weights_and_rows(model_dir, tmp_path, train_size):
    # With 8 training prompts and 4 per step, the resume at step 2 falls exactly on an epoch boundary.
    straight, split = tmp_path / "straight", tmp_path / "split"
    data = f"data.train_size={train_size}"
    Controller.from_config(config(model_dir, straight, data, "train.total_steps=4", "eval.every_steps=2")).run()
    first = Controller.from_config(config(model_dir, split, data, "train.total_steps=2", "eval.every_steps=2", "checkpoint.every_steps=1"))
    first.run()
    sampler = first.source.cursor["sampler"]  # the producer's state after the last batch delivered
    assert sampler == ({"epoch": 1, "position": 0} if train_size == 8 else {"epoch": 0, "position": 8})
    Controller.from_config(config(model_dir, split, data, "train.total_steps=4", "eval.every_steps=2", "checkpoint.every_steps=1")).run()
    a = load_file(straight / "checkpoints/step_4/policy.safetensors")
    b = load_file(split / "checkpoints/step_4/policy.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)
    drop = lambda r: {k: v for k, v in r.items() if not k.startswith("timing_s/") and not k.endswith("/busy_s") and k not in ("time", "ettr", "time_lost_s", "mttr_s", "perf/throughput", "perf/max_memory_gb")}
    assert [drop(r) for r in read_jsonl(straight / "metrics.jsonl")] == [drop(r) for r in read_jsonl(split / "metrics.jsonl")]
    kinds = [e["kind"] for e in read_jsonl(split / "events.jsonl")]
    assert "resume" in kinds


def test_resumed_run_with_the_adaptive_mix_and_the_curriculum_ends_with_the_same_mix_and_weights(model_dir, tmp_path):
    """data.mix=adaptive, with held-out accuracies folded in, and the curriculum: a run stopped
    at step 2 (after a validation whose accuracies only collect 4 takes in) and resumed ends
    with the same policy weights, mix weights, resting prompts and metric rows as one never stopped."""
    settings = ["data.train_size=8", "data.mix=adaptive", "data.mix_floor=0.1", "data.mix_rate=0.5",
                "data.curriculum_window=1", "data.curriculum_revisit=1", "eval.every_steps=2", "checkpoint.every_steps=1"]
    straight, split = tmp_path / "straight", tmp_path / "split"
    whole = Controller.from_config(config(model_dir, straight, *settings, "train.total_steps=4"))
    whole.run()
    Controller.from_config(config(model_dir, split, *settings, "train.total_steps=2")).run()
    resumed = Controller.from_config(config(model_dir, split, *settings, "train.total_steps=4"))
    resumed.run()
    a = load_file(straight / "checkpoints/step_4/policy.safetensors")
    b = load_file(split / "checkpoints/step_4/policy.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)
    pool = whole.source.cursor["sampler"]
    assert pool == resumed.source.cursor["sampler"] and pool["mix"]["weights"] != {s: 1 / 3 for s in pool["mix"]["weights"]}
    drop = lambda r: {k: v for k, v in r.items() if not k.startswith("timing_s/") and not k.endswith("/busy_s") and k not in ("time", "ettr", "time_lost_s", "mttr_s", "perf/throughput", "perf/max_memory_gb")}
    rows = read_jsonl(straight / "metrics.jsonl")
    assert [drop(r) for r in rows] == [drop(r) for r in read_jsonl(split / "metrics.jsonl")]
    weights = [[r[f"data/mix/embedded/{f}"] for f in ("add", "mul", "sum")] for r in rows[1:]]
    assert weights[0] == pytest.approx([1 / 3] * 3) and all(sum(w) == pytest.approx(1.0) for w in weights)
    assert len({tuple(w) for w in weights}) == 4  # the weights moved every step
    assert sum(r["data/curriculum/retired"] for r in rows[1:]) > 0
    # the last validation's accuracies wait for a collect 5 that never came
    assert [sorted(h["accuracy"]) for h in whole.source.held_out] == [["embedded/add", "embedded/mul", "embedded/sum"]]


def test_a_lora_run_killed_with_sigkill_resumes_bit_identically(model_dir, tmp_path):
    """model.lora.rank=4: the checkpoints hold the adapters alone (and AdamW over them); a run
    SIGKILLed in its update at step 3 and restarted by the supervisor from step 2's checkpoint
    ends with the adapters, and the metric rows, of a run never stopped."""
    import subprocess
    import sys

    settings = ["model.lora.rank=4", "train.lr=1e-2", "train.total_steps=4", "checkpoint.every_steps=1", "checkpoint.keep=5",
                "resilience.backoff_s=0.05"]
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    from reasonrl.cli import RECIPES

    Controller.from_config(load(RECIPES / "grpo.yaml", [*tiny_run(model_dir, straight), *settings])).run()
    command = [sys.executable, "-m", "reasonrl.cli", "train", "grpo", *tiny_run(model_dir, killed), *settings,
               "faults=[sigkill@3:stage=update_actor]"]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    events = read_jsonl(killed / "events.jsonl")
    assert [e["signal"] for e in events if e["kind"] == "killed"] == ["SIGKILL"]
    assert [e["from_step"] for e in events if e["kind"] == "recovered"] == [2]
    a = load_file(straight / "checkpoints/step_4/policy.safetensors")
    b = load_file(killed / "checkpoints/step_4/policy.safetensors")
    assert a.keys() == b.keys() and a and all(".lora_A." in k or ".lora_B." in k for k in a)
    assert all(torch.equal(a[k], b[k]) for k in a)
    first = load_file(straight / "checkpoints/step_1/policy.safetensors")
    assert any(not torch.equal(first[k], a[k]) for k in a if ".lora_A." in k)  # A trains too, once B has moved
    drop = lambda r: {k: v for k, v in r.items() if not k.startswith("timing_s/") and not k.endswith("/busy_s") and k not in ("time", "ettr", "time_lost_s", "mttr_s", "perf/throughput", "perf/max_memory_gb")}
    assert [drop(r) for r in read_jsonl(straight / "metrics.jsonl")] == [drop(r) for r in read_jsonl(killed / "metrics.jsonl")]
    final = load_model(killed / "final")  # the merged model
    assert not any("lora" in name for name, _ in final.named_parameters())


def test_resume_with_an_incompatible_config_is_refused(model_dir, tmp_path):
    Controller.from_config(config(model_dir, tmp_path, "train.total_steps=1")).run()
    with pytest.raises(ResumeError, match="different configuration"):
        Controller.from_config(config(model_dir, tmp_path, "train.total_steps=2", "algo.eps_high=0.3")).run()


def test_resume_onto_weights_of_another_shape_is_refused(model_dir, tmp_path):
    """A model directory replaced in place (a warm start of another version, say) after its
    checkpoint was written: a ResumeError (exit 2, no restart), not a crash to restart."""
    import shutil

    from reasonrl.models.loading import build_tiny_model, load_tokenizer

    base = tmp_path / "model"
    shutil.copytree(model_dir, base)
    Controller.from_config(config(base, tmp_path / "run", "train.total_steps=1")).run()
    tok = load_tokenizer(base)
    build_tiny_model(len(tok), 48, 2, 4, 2, 64, tok.pad_token_id, tok.eos_token_id, seed=0).save_pretrained(base)
    with pytest.raises(ResumeError, match=r"step_1: does not fit this run .*another model"):
        Controller.from_config(config(base, tmp_path / "run", "train.total_steps=2")).run()


def _main(capsys, *args):
    """``reasonrl ARGS`` in this process: (exit code, stderr)."""
    capsys.readouterr()
    code = main(list(args))
    return code, capsys.readouterr().err


def test_cli_reports_bad_config_and_missing_data(model_dir, tmp_path, capsys):
    code, err = _main(capsys, "train", "dapo", "algo.eps_hgih=0.3")
    assert code == 2 and "did you mean algo.eps_high" in err
    code, err = _main(capsys, "train", "dapo", "algo.eps_high=0.1")
    assert code == 2 and "algo.eps_high" in err and "eps_low" in err
    # (tests/integration/test_hostile.py: through the supervisor, such an error is never retried)
    code, err = _main(capsys, "train", "dapo", f"model.path={model_dir}", f"run.dir={tmp_path / 'run'}",
                      "data.source=/nonexistent/train.jsonl", "--no-supervisor")
    assert code == 2 and "/nonexistent/train.jsonl" in err
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"prompt": "1+1=?", "ground_truth": "2"}\n{"prompt": "2+2=?"}\n')
    code, err = _main(capsys, "train", "dapo", f"model.path={model_dir}", f"run.dir={tmp_path / 'run'}", f"data.source={rows}",
                      "--no-supervisor")
    assert code == 2 and "rows.jsonl" in err and "line 2" in err and "ground_truth" in err
    # Overrides may come after a flag; they are all read (here the bad one after it).
    code, err = _main(capsys, "train", "dapo", f"model.path={model_dir}", "--no-supervisor", "algo.eps_hgih=0.3")
    assert code == 2 and "did you mean algo.eps_high" in err
    with pytest.raises(SystemExit) as exit_:
        main(["train", "dapo", "--no-supervisor", "--fast"])
    assert exit_.value.code == 2 and "unrecognized arguments: --fast" in capsys.readouterr().err


def test_sampling_logprobs_equal_recomputed_ones_so_reuse_is_exact(model_dir, tmp_path):
    from reasonrl.trainer.logprobs import compute_logprobs

    controller = Controller.from_config(config(model_dir, tmp_path, "rollout.top_k=5", "rollout.temperature=0.7"))
    r = controller.source.next_batch(0).scored.rollout
    assert controller.anchor_is_behaviour(r, 0)  # 'auto' with the built-in generator in fp32, at the same version
    assert not controller.anchor_is_behaviour(r, 1)  # a stale batch is recomputed
    [policy] = controller.policy.workers
    recomputed = compute_logprobs(policy.module, r, temperature=0.7, micro_batch_size=3)
    assert r.response_mask.sum() > 0
    torch.testing.assert_close(r.logprobs * r.response_mask, recomputed, rtol=0, atol=2e-5)
    metrics = controller.step()
    assert "timing_s/old_log_prob" not in metrics and "off_policy/behaviour_kl" not in metrics
    recompute = Controller.from_config(config(model_dir, tmp_path / "b", "train.old_logprobs=recompute"))
    metrics = recompute.step()
    assert "timing_s/old_log_prob" in metrics
    # the recomputed anchor is the sampler's, to float tolerance: no behaviour gap to speak of
    assert metrics["off_policy/behaviour_kl"] < 1e-8 and metrics["off_policy/ess"] > 1 - 1e-6


def test_a_run_logs_its_forecast_once_it_has_enough_validations(model_dir, tmp_path, capsys):
    from reasonrl.experiments.forecast import evaluations, forecast

    Controller.from_config(config(model_dir, tmp_path, "train.total_steps=6", "eval.every_steps=1", "eval.greedy=false",
                      "eval.target=0.9", "run.log_every=6")).run()
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1, 2, 3, 4, 5, 6]
    # 8 samples a step: at step 6 the validation of step 1 (8 of 48 samples) is in the first
    # quarter and left out, 5 remain to fit; at step 5 only 4 would.
    assert not any(k.startswith("forecast/") for r in rows[:6] for k in r)
    expected = forecast(*evaluations(rows), horizon=6, target=0.9).metrics()  # reasonrl forecast --upto 6
    assert {k: v for k, v in rows[6].items() if k.startswith("forecast/")} == expected
    assert rows[6]["forecast/evals"] == 6 and rows[6]["forecast/target"] == 0.9
    assert f"plateau={expected['forecast/plateau']:.3f}" in capsys.readouterr().err  # the console line of step 6
