"""``export_model``: a run's checkpoint as a Hugging Face model directory, and final/ written the same way."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig, Qwen2Config, Qwen2ForCausalLM

import reasonrl.checkpoint.export as export
from reasonrl.checkpoint import CheckpointWriter, load_checkpoint
from reasonrl.checkpoint.export import MARKER, PROBES, export_model, training_tokenizer, write_model_dir
from reasonrl.config import dump, load
from reasonrl.controller import Controller
from reasonrl.models.loading import build_tiny_model, load_model, load_tokenizer, torch_dtype
from reasonrl.data.tokenizer import CHAT_TEMPLATE, build_char_tokenizer
from reasonrl.errors import InputError
from tests.conftest import tiny_run

TEXTS = (*PROBES, "12*34=?\n", " leading space", "tab\there", "~`{}|\\", "\x00\x7f control", "")


def fake_run(root, model_dir, steps=(1, 3), dtype="float32"):
    """A run directory holding config.yaml and committed checkpoints whose policy weights are
    those of the model architecture in ``model_dir`` drawn afresh with seed 100 + step."""
    run = root / "run"
    dump(load(None, [f"model.path={model_dir}", f"run.dir={run}", f"model.dtype={dtype}"]), run / "config.yaml")
    writer = CheckpointWriter(run / "checkpoints", keep=10)
    config = AutoConfig.from_pretrained(model_dir)
    for step in steps:
        torch.manual_seed(100 + step)
        weights = AutoModelForCausalLM.from_config(config).to(torch_dtype(dtype)).state_dict()
        writer.save(step, {"policy": weights}, {"policy": {"optimizer": {}, "version": step}})
    return run


def logits(model, text="12+3=?\n47"):
    ids = torch.tensor([build_char_tokenizer()(text)["input_ids"]])
    with torch.no_grad():
        return model(input_ids=ids).logits.float()


@pytest.fixture(scope="module")
def real_run(model_dir, tmp_path_factory):
    """A 2-step run on the tiny model, a checkpoint after each step, and its final/."""
    run = tmp_path_factory.mktemp("export-run")
    Controller.from_config(load(None, [*tiny_run(model_dir, run, steps=2), "checkpoint.every_steps=1"])).run()
    return run


def test_export_tokenises_like_training_and_holds_the_checkpoint_weights(model_dir, tmp_path):
    run = fake_run(tmp_path, model_dir)
    out = export_model(run, tmp_path / "out")
    assert out == tmp_path / "out"
    assert {"config.json", "model.safetensors", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
            "chat_template.jinja", MARKER} <= {p.name for p in out.iterdir()}
    reloaded, trained = AutoTokenizer.from_pretrained(out), load_tokenizer(model_dir)
    for text in TEXTS:
        assert reloaded(text)["input_ids"] == trained(text)["input_ids"], repr(text)
    assert (reloaded.eos_token_id, reloaded.pad_token_id, reloaded.padding_side) == (1, 0, "left")
    q = "47+38=?\n"
    assert reloaded.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False) == q

    expected = load_model(model_dir)
    base = logits(expected)
    expected.load_state_dict(load_checkpoint(run / "checkpoints/step_3")[1]["policy"])  # the newest step
    exported = AutoModelForCausalLM.from_pretrained(out)
    torch.testing.assert_close(logits(exported), logits(expected), atol=1e-5, rtol=1e-5)
    assert not torch.allclose(logits(exported), base, atol=1e-3)  # the trained weights, not the base model's
    marker = json.loads((out / MARKER).read_text())
    assert marker["checkpoint"] == str(run / "checkpoints/step_3") and marker["policy_version"] == 3


def test_export_keeps_the_dtype_the_policy_was_trained_in(model_dir, tmp_path):
    run = fake_run(tmp_path, model_dir, steps=(2,), dtype="bfloat16")
    out = export_model(run, tmp_path / "out")
    assert {t.dtype for t in load_file(out / "model.safetensors").values()} == {torch.bfloat16}
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    weights = load_checkpoint(run / "checkpoints/step_2")[1]["policy"]
    exported = AutoModelForCausalLM.from_pretrained(out, dtype=torch.bfloat16).state_dict()
    assert all(torch.equal(exported[name], weights[name]) for name in exported)


def test_step_selects_the_checkpoint_and_a_missing_one_lists_the_steps(model_dir, tmp_path):
    run = fake_run(tmp_path, model_dir, steps=(1, 3))
    out = export_model(run, tmp_path / "out", step=1)
    weights = load_checkpoint(run / "checkpoints/step_1")[1]["policy"]
    assert torch.equal(load_file(out / "model.safetensors")["model.embed_tokens.weight"], weights["model.embed_tokens.weight"])
    assert json.loads((out / MARKER).read_text())["policy_version"] == 1
    with pytest.raises(InputError, match=rf"^{run}: no checkpoint for step 2 under {run}/checkpoints; valid checkpoints: step 1, 3$"):
        export_model(run, tmp_path / "other", step=2)
    assert not (tmp_path / "other").exists()


def test_a_damaged_checkpoint_is_skipped_by_default_and_refused_by_step(model_dir, tmp_path):
    run = fake_run(tmp_path, model_dir, steps=(1, 3))
    part = run / "checkpoints/step_3/policy.safetensors"
    part.write_bytes(part.read_bytes()[:-8] + b"garbage!")
    out = export_model(run, tmp_path / "out")
    assert json.loads((out / MARKER).read_text())["checkpoint"] == str(run / "checkpoints/step_1")
    with pytest.raises(InputError, match=r"step_3: cannot be exported \(.*sha256.*\); valid checkpoints: step 1$"):
        export_model(run, tmp_path / "other", step=3)


def test_generation_config_holds_the_ids_the_trainer_stops_on_and_pads_with(tmp_path):
    model_dir = tmp_path / "model"
    tok = build_char_tokenizer()
    tok.pad_token = None  # the trainer pads with EOS
    model = build_tiny_model(len(tok), 32, 2, 4, 2, 64, pad_id=0, eos_id=7, seed=0)
    model.save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    run = fake_run(tmp_path, model_dir, steps=(1,))
    out = export_model(run, tmp_path / "out")
    generation = GenerationConfig.from_pretrained(out)
    assert (generation.eos_token_id, generation.pad_token_id) == ([1, 7], 1)
    assert AutoTokenizer.from_pretrained(out).pad_token_id == 1


def test_a_foreign_or_file_target_is_refused_and_a_previous_export_replaced(model_dir, tmp_path):
    run = fake_run(tmp_path, model_dir, steps=(1, 3))
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(InputError, match=rf"^{foreign}: holds files that are not a reasonrl export \(notes.txt; no {MARKER}\)"):
        export_model(run, foreign)
    assert [p.name for p in foreign.iterdir()] == ["notes.txt"]
    (tmp_path / "file").write_text("x")
    with pytest.raises(InputError, match="exists and is not a directory"):
        export_model(run, tmp_path / "file")
    (tmp_path / "empty").mkdir()
    export_model(run, tmp_path / "empty", step=1)
    with pytest.raises(InputError, match="holds a previous export.*--force"):
        export_model(run, tmp_path / "empty", step=3)
    export_model(run, tmp_path / "empty", step=3, force=True)  # over its own previous export
    assert json.loads((tmp_path / "empty" / MARKER).read_text())["policy_version"] == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "file", "foreign", "run"]


def test_a_failure_midway_leaves_no_partial_directory_and_the_previous_export_intact(model_dir, tmp_path, monkeypatch):
    run = fake_run(tmp_path, model_dir, steps=(1, 3))

    def disk_full(*args):
        raise OSError(28, "No space left on device")

    export_model(run, tmp_path / "previous", step=1)
    before = {p.name: p.read_bytes() for p in (tmp_path / "previous").iterdir()}
    monkeypatch.setattr(export, "generation_config", disk_full)  # after the weights and the tokenizer are written
    with pytest.raises(OSError, match="No space left"):
        export_model(run, tmp_path / "out")
    with pytest.raises(OSError, match="No space left"):
        export_model(run, tmp_path / "previous", step=3, force=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["previous", "run"]
    assert {p.name: p.read_bytes() for p in (tmp_path / "previous").iterdir()} == before


def test_a_model_type_whose_auto_tokenizer_tokenises_differently_is_refused(tmp_path):
    tok = build_char_tokenizer()
    config = Qwen2Config(vocab_size=len(tok), hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=64, pad_token_id=0, eos_token_id=1)
    with pytest.raises(InputError, match=r"AutoTokenizer.from_pretrained loads a Qwen2Tokenizer for model_type 'qwen2'"):
        write_model_dir(Qwen2ForCausalLM(config), tok, tmp_path / "out", {})
    assert list(tmp_path.iterdir()) == []


def test_the_embedded_tokenizer_renders_the_raw_prompt_and_old_caches_get_the_template(model_dir, tmp_path):
    q = "47+38=?\n"
    messages = [{"role": "user", "content": q}]
    assert build_char_tokenizer().apply_chat_template(messages, add_generation_prompt=True, tokenize=False) == q
    old = tmp_path / "old-cache"
    shutil.copytree(model_dir, old)
    (old / "chat_template.jinja").unlink()
    assert not load_tokenizer(old).chat_template
    assert training_tokenizer(load(None), old).chat_template == CHAT_TEMPLATE  # model.path=embedded
    assert not training_tokenizer(load(None, [f"model.path={old}"]), old).chat_template  # another model: as saved


def test_final_is_written_like_an_export_of_the_last_checkpoint(real_run, tmp_path):
    final, out = real_run / "final", export_model(real_run, tmp_path / "out")
    assert sorted(p.name for p in final.iterdir()) == sorted(p.name for p in out.iterdir())
    a, b = load_file(final / "model.safetensors"), load_file(out / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    for name in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        assert (final / name).read_text() == (out / name).read_text(), name
    marker = json.loads((out / MARKER).read_text())
    assert (marker["checkpoint"], marker["policy_version"]) == (str(real_run / "checkpoints/step_2"), 2)
    assert json.loads((final / MARKER).read_text())["policy_version"] == 2
    step_1 = export_model(real_run, tmp_path / "step_1", step=1)
    assert json.loads((step_1 / MARKER).read_text())["policy_version"] == 1


def test_a_run_with_final_and_no_checkpoint_exports_final_and_one_with_neither_is_an_error(real_run, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(real_run / "config.yaml", run / "config.yaml")
    with pytest.raises(InputError, match=rf"^{run}: nothing to export: no valid checkpoint under {run}/checkpoints, and no final/$"):
        export_model(run, tmp_path / "out")
    shutil.copytree(real_run / "final", run / "final")
    out = export_model(run, tmp_path / "out")
    a, b = load_file(run / "final/model.safetensors"), load_file(out / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert json.loads((out / MARKER).read_text())["exported_from"] == str(run / "final")
    with pytest.raises(FileNotFoundError, match=rf"{tmp_path}: not a reasonrl run directory \(no config.yaml there\)"):
        export_model(tmp_path, tmp_path / "other")


def test_an_export_into_a_run_directory_is_refused_even_with_force(model_dir, tmp_path):
    run = fake_run(tmp_path, model_dir, steps=(1, 3))
    for target in (run / "final", run, run / "checkpoints" / "x"):
        with pytest.raises(InputError, match="inside the run directory"):
            export_model(run, target, step=1, force=True)
    assert not (run / "final").exists()


def test_auto_map_entries_without_their_code_file_are_dropped(tmp_path):
    path = tmp_path / "config.json"
    (tmp_path / "modeling_kept.py").write_text("")
    path.write_text(json.dumps({"auto_map": {"AutoConfig": "modeling_kept.C", "AutoModel": "repo--modeling_gone.M"}}))
    export._drop_missing_auto_map(path)
    assert json.loads(path.read_text())["auto_map"] == {"AutoConfig": "modeling_kept.C"}
    path.write_text(json.dumps({"auto_map": {"AutoModel": "modeling_gone.M"}, "x": 1}))
    export._drop_missing_auto_map(path)
    assert json.loads(path.read_text()) == {"x": 1}


@pytest.fixture(scope="module")
def lora_run(model_dir, tmp_path_factory):
    """A 2-step LoRA run (rank 4, a learning rate that moves the adapters) on the tiny model."""
    run = tmp_path_factory.mktemp("export-lora-run")
    Controller.from_config(load(None, [*tiny_run(model_dir, run, steps=2), "checkpoint.every_steps=1", "model.lora.rank=4",
                           "train.lr=5e-2"])).run()
    return run


def test_a_lora_run_exports_the_merged_model_that_plain_transformers_loads_and_generates_with(lora_run, model_dir, tmp_path):
    from reasonrl.models.lora import load_adapters, load_policy

    checkpoint = load_file(lora_run / "checkpoints/step_2/policy.safetensors")
    assert checkpoint and all(".lora_A." in k or ".lora_B." in k for k in checkpoint)  # the adapters alone
    out = export_model(lora_run, tmp_path / "merged")
    assert "adapter_config.json" not in {p.name for p in out.iterdir()}
    merged = AutoModelForCausalLM.from_pretrained(out)  # plain transformers, no peft
    assert not any("lora" in name or "base_layer" in name for name, _ in merged.named_parameters())
    base = AutoModelForCausalLM.from_pretrained(model_dir)
    policy = load_policy(model_dir, load(lora_run / "config.yaml"))
    load_adapters(policy, checkpoint)
    torch.testing.assert_close(logits(merged), logits(policy), atol=1e-5, rtol=1e-5)
    assert (logits(merged) - logits(base)).abs().max() > 1e-3  # training moved it
    tok = AutoTokenizer.from_pretrained(out)
    ids = tok("12+3=?\n", return_tensors="pt")
    generated = merged.generate(**ids, max_new_tokens=6, do_sample=False)
    assert generated.shape[1] > ids["input_ids"].shape[1]
    final = load_file(lora_run / "final/model.safetensors")  # final/ is the merged model too
    exported = load_file(out / "model.safetensors")
    assert final.keys() == exported.keys() and all(torch.equal(final[k], exported[k]) for k in final)


def test_a_lora_run_exports_its_adapter_directory_that_peft_loads(lora_run, model_dir, tmp_path):
    from peft import PeftModel

    from reasonrl.cli import main

    out = tmp_path / "adapter"
    assert main(["export", str(lora_run), str(out), "--adapter"]) == 0
    names = {p.name for p in out.iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors", "tokenizer.json", MARKER} <= names
    assert "model.safetensors" not in names
    config = json.loads((out / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"], config["base_model_name_or_path"]) == (4, 16.0, str(model_dir))
    peft = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(model_dir), out).eval()
    merged = AutoModelForCausalLM.from_pretrained(export_model(lora_run, tmp_path / "merged"))
    torch.testing.assert_close(logits(peft), logits(merged), atol=1e-5, rtol=1e-5)
    with pytest.raises(InputError, match=r"--adapter exports LoRA adapters, and this run trained every parameter"):
        export_model(fake_run(tmp_path, model_dir), tmp_path / "no", adapter=True)
