"""The latency-model backend (rollout.backend=sim): rows from the seeds alone, lengths by the
recorded distribution's inverse CDF, the modelled time of a call, the modelled reward, and a
rollout worker over it that loads no model."""

from __future__ import annotations

import json

import pytest
import torch

from reasonrl.rollout import sim
from reasonrl.rollout.sim import SimGenerator, SimRewards, Workload
from reasonrl.types import Prompt, SamplingParams

PAD, EOS, VOCAB = 0, 1, 12
PARAMS = SamplingParams(max_new_tokens=4)

# Lengths 1..4 ended by EOS: 1 once, 3 twice; 1 truncated at 4. The CDF over
# (L=1, L=2, L=3, L=4, truncated) is 0.25, 0.25, 0.75, 0.75, 1.
SMALL = Workload(max_new_tokens=4, lengths=(1, 0, 2, 0), truncated=1, prompt_accuracy=(1, 0, 1), recorded={})


def backend(workload: Workload = SMALL, seconds_per_token: float = 0.0, time_scale: float = 1.0) -> SimGenerator:
    return SimGenerator(PAD, [EOS], VOCAB, workload, seconds_per_token, time_scale)


def test_lengths_invert_the_recorded_cdf_and_stretch_to_a_longer_limit():
    u = torch.tensor([0.1, 0.3, 0.74, 0.8, 0.999])
    lengths, truncated = SMALL.draw_lengths(u, 4)
    assert lengths.tolist() == [1, 3, 3, 4, 4] and truncated.tolist() == [False, False, False, True, True]
    lengths, truncated = SMALL.draw_lengths(u, 8)  # L -> ceil(L * 8 / 4)
    assert lengths.tolist() == [2, 6, 6, 8, 8] and truncated.tolist() == [False, False, False, True, True]
    assert SMALL.mean_length() == pytest.approx((1 + 3 + 3 + 4) / 4)
    assert SMALL.mean_length(8) == pytest.approx((2 + 6 + 6 + 8) / 4)


def test_rows_depend_on_their_group_seed_alone_and_end_as_drawn():
    g = backend()
    both = g.generate([[5, 6], [7]], 3, PARAMS, [11, 12])
    again = g.generate([[5, 6], [7]], 3, PARAMS, [11, 12])
    alone = g.generate([[7]], 3, PARAMS, [12])
    assert torch.equal(both.response_ids, again.response_ids)
    T = alone.response_ids.shape[1]
    assert torch.equal(both.response_ids[3:, :T], alone.response_ids) and not both.response_ids[3:, T:].any()
    assert not torch.equal(g.generate([[7]], 3, PARAMS, [13]).response_ids, alone.response_ids)
    ids, mask = both.response_ids, both.response_mask.bool()
    for row in range(both.size):
        L = int(both.lengths[row])
        assert mask[row, :L].all() and not mask[row, L:].any()
        body = ids[row, : L - 1] if bool(both.eos[row]) else ids[row, :L]
        assert ((body != PAD) & (body != EOS)).all()  # ordinary ids only
        assert bool(both.eos[row]) == (int(ids[row, L - 1]) == EOS) != bool(both.truncated[row])
        assert bool(both.truncated[row]) == (L == 4 and int(ids[row, L - 1]) != EOS)
    assert torch.allclose(both.logprobs[mask], torch.tensor(-torch.log(torch.tensor(VOCAB - 2.0)).item()))


def test_the_recorded_workload_is_what_the_rows_follow():
    w = Workload.load()
    assert w.recorded and len(w.lengths) == w.max_new_tokens
    batch = backend(w).generate([[5]] * 512, 8, SamplingParams(max_new_tokens=w.max_new_tokens), list(range(512)))
    assert float(batch.lengths.float().mean()) == pytest.approx(w.mean_length(), rel=0.05)
    share = float(batch.truncated.float().mean())
    assert share == pytest.approx(w.truncated / (sum(w.lengths) + w.truncated), abs=0.02)


def test_a_call_takes_the_modelled_time_scaled(monkeypatch):
    slept = []
    monkeypatch.setattr(sim.time, "sleep", slept.append)
    batch = backend(seconds_per_token=0.5, time_scale=0.01).generate([[5], [6]], 4, PARAMS, [1, 2])
    assert sim.modelled_seconds(batch.lengths, 0.5) == 0.5 * int(batch.lengths.sum())
    assert slept == [pytest.approx(0.5 * int(batch.lengths.sum()) * 0.01)]
    backend(seconds_per_token=0.0).generate([[5]], 4, PARAMS, [1])
    assert len(slept) == 1  # no modelled time: no sleep


def test_the_modelled_reward_follows_the_prompt_accuracy():
    g = backend()
    batch = g.generate([[5]] * 40, 4, PARAMS, list(range(40)))
    prompts = [Prompt(id=f"p{i // 4}", text="", ground_truth="") for i in range(batch.size)]
    always_wrong = Workload(4, (1, 0, 2, 0), 1, (1, 0), {})  # k = 1: every prompt 0 of 1 correct
    always_right = Workload(4, (1, 0, 2, 0), 1, (0, 1), {})
    assert not SimRewards(always_wrong, 0).score(batch, prompts).acc.any()
    right = SimRewards(always_right, 0).score(batch, prompts)
    assert right.acc.all() and torch.equal(right.scores, torch.ones(batch.size))
    half = SimRewards(SMALL, 0).score(batch, prompts)  # each prompt 0 or 2 of 2: all wrong or all right
    groups = half.acc.view(40, 4)
    assert (groups.all(1) | ~groups.any(1)).all() and groups.all(1).any() and (~groups.any(1)).any()
    assert torch.equal(SimRewards(SMALL, 0).score(batch, prompts).acc, half.acc)


def test_a_rollout_worker_over_the_sim_backend_loads_no_model(tmp_path):
    from reasonrl.config import load
    from reasonrl.data.tokenizer import build_char_tokenizer
    from reasonrl.types import WeightsUpdate
    from reasonrl.workers import RolloutWorker

    tokenizer = build_char_tokenizer()
    tokenizer.save_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": len(tokenizer), "max_position_embeddings": 64}))
    worker = RolloutWorker(load(None, ["rollout.backend=sim", "rollout.sim_seconds_per_token=0"]), tmp_path)
    worker.load_weights(WeightsUpdate(3, {}))
    batch = worker.generate([[5, 6]], 2, SamplingParams(max_new_tokens=8), [7])
    assert batch.size == 2 and (batch.versions[batch.response_mask > 0] == 3).all()
    assert worker.capabilities() == {"streams": False, "episodic": False}
