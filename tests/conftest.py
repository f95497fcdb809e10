"""Shared fixtures: a tiny random Qwen2 and a synthetic rollout batch."""

from __future__ import annotations

import os
from pathlib import Path

# make test runs two workers and their runs' processes on two cores: the threads sleep at a
# barrier, as a run beside other work does (reasonrl.runtime.threads.openmp_waits)
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:  # torch and transformers load in the workers, not in pytest-xdist's controller
    from transformers import Qwen2ForCausalLM

    from reasonrl.types import RolloutBatch

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
"""The real public data files beside the checkout (../shared/data)."""


def shared(name: str) -> str:
    """The path of ``../shared/data/<name>``; the test is skipped when the file is absent."""
    file = SHARED_DATA / name
    if not file.is_file():
        pytest.skip(f"{file} is absent")
    return str(file)

PAD, EOS, VOCAB = 0, 1, 32


@pytest.fixture
def small_disk(tmp_path):
    """A 1 MiB tmpfs at ``tmp_path/disk``, unmounted after the test; skipped where it cannot
    be mounted (mounting needs root). :func:`fill` leaves no space on it."""
    import subprocess

    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)], capture_output=True).returncode != 0:
        pytest.skip("cannot mount a small tmpfs here (needs root)")
    yield disk
    subprocess.run(["umount", "--lazy", str(disk)], check=True)


def fill(disk: Path) -> None:
    """Write ``disk/filler`` until the file system is full: whole pages, so that a file with
    nothing in it cannot take another byte."""
    fd = os.open(disk / "filler", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        for size in (1 << 16, 1 << 12):
            try:
                while True:
                    os.write(fd, bytes(size))
            except OSError as err:
                assert err.errno == 28, err  # ENOSPC
    finally:
        os.close(fd)


def pytest_configure(config):
    """Under pytest-xdist (make test), pin each worker to one core of its own: the runs in it
    size their torch threads by the cores they may use (reasonrl.runtime.available_cores), so
    two workers never run two multi-threaded torch processes on the same cores, where their
    spinning threads slow each other several times over."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if worker.startswith("gw") and hasattr(os, "sched_setaffinity"):
        cores = sorted(os.sched_getaffinity(0))
        if len(cores) > 1:
            os.sched_setaffinity(0, {cores[int(worker[2:]) % len(cores)]})



@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    """The tests marked ``long`` first, the rest after, each in collection order: pytest-xdist's
    workers take the tests in that order, so the longest start early and the short ones fill
    the end (in ``make test``'s serial part, two of eight tests take 30-45 s).

    Under ``--dist loadgroup``, give each test marked ``xdist_group`` its group's suffix
    (``nodeid@group``), by which xdist sends a group's tests to one worker. pytest 9 reads a
    node's id from ``_id``; pytest-xdist 3.8 writes the suffix to ``_nodeid`` only, so without
    this its groups are ignored (two Ray clusters at once, the rank processes started twice)."""
    items.sort(key=lambda item: item.get_closest_marker("long") is None)
    if not getattr(config.option, "loadgroup", False):  # set in xdist's workers only
        return
    for item in items:
        groups = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                         for m in item.iter_markers("xdist_group")})
        if groups and "@" not in item.nodeid:
            from _pytest.nodeid import coerce_node_id

            item._id = coerce_node_id(f"{item.nodeid}@{'_'.join(groups)}")


def tiny_qwen2(seed: int = 0) -> Qwen2ForCausalLM:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
        tie_word_embeddings=True,
        pad_token_id=PAD,
        eos_token_id=EOS,
    )
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(config)


def synthetic_rollout(B: int = 8, P: int = 5, T: int = 7, seed: int = 0) -> RolloutBatch:
    """Left-padded prompts and right-padded responses of varied lengths (one empty response)."""
    import torch

    from reasonrl.types import RolloutBatch

    g = torch.Generator().manual_seed(seed)
    prompt_len = torch.randint(2, P + 1, (B,), generator=g)
    resp_len = torch.randint(1, T + 1, (B,), generator=g)
    resp_len[-1] = 0
    prompt_ids = torch.full((B, P), PAD)
    prompt_mask = torch.zeros((B, P), dtype=torch.long)
    response_ids = torch.full((B, T), PAD)
    response_mask = torch.zeros((B, T))
    for b in range(B):
        prompt_ids[b, P - prompt_len[b] :] = torch.randint(2, VOCAB, (int(prompt_len[b]),), generator=g)
        prompt_mask[b, P - prompt_len[b] :] = 1
        response_ids[b, : resp_len[b]] = torch.randint(2, VOCAB, (int(resp_len[b]),), generator=g)
        response_mask[b, : resp_len[b]] = 1
    return RolloutBatch(
        prompt_ids=prompt_ids,
        prompt_mask=prompt_mask,
        response_ids=response_ids,
        response_mask=response_mask,
        logprobs=torch.zeros((B, T)),
        eos=torch.zeros(B, dtype=torch.bool),
        truncated=torch.ones(B, dtype=torch.bool),
        group_ids=torch.arange(B) // 4,
        versions=torch.zeros((B, T), dtype=torch.long),
    )


@pytest.fixture
def rollout() -> RolloutBatch:
    return synthetic_rollout()


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory):
    """A tiny random Qwen2 with the character tokenizer, saved as a Hugging Face model directory."""
    from reasonrl.models.loading import build_tiny_model
    from reasonrl.data.tokenizer import build_char_tokenizer

    out = tmp_path_factory.mktemp("tiny")
    tok = build_char_tokenizer()
    build_tiny_model(len(tok), 32, 2, 4, 2, 64, tok.pad_token_id, tok.eos_token_id, seed=0).save_pretrained(out)
    tok.save_pretrained(out)
    return out


def tiny_run(model_dir, run_dir, steps: int = 3) -> list[str]:
    """Overrides for a seconds-long run on ``model_dir``: 4 prompts x 2 samples, 8 new tokens,
    a hash-of-text reward that is right for about half the samples."""
    return [
        f"model.path={model_dir}",
        f"run.dir={run_dir}",
        "run.progress=false",
        "data.train_size=64",
        "data.test_size=16",
        "rollout.n=2",
        "rollout.max_new_tokens=8",
        "train.prompts_per_step=4",
        "train.mini_batch_size=4",
        "train.micro_batch_size=2",
        f"train.total_steps={steps}",
        "eval.every_steps=0",
        "eval.n_prompts=8",
        "reward.fn=tests.reward_fixtures:coin",
    ]
