"""bench/rollout.py --gen-bound: the matrix products it charges a generation, counted by hand."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from rollout import matrix_seconds  # noqa: E402

from reasonrl.types import RolloutBatch  # noqa: E402


class Work:
    """A ProductTimer that charges a product's multiply-adds instead of timing it."""

    def linear(self, m: int, k: int, n: int) -> float:
        return m * k * n

    def attention(self, rows: int, kv_heads: int, group: int, queries: int, keys: int, head_dim: int) -> float:
        return 2 * rows * kv_heads * group * queries * keys * head_dim


def test_a_generation_is_charged_its_prefill_and_each_decode_step_for_the_rows_still_generating():
    # hidden 4, 2 query heads and 1 kv head of 2 dims, MLP 6 wide, vocabulary 5, one layer;
    # one prompt of 3 tokens, 2 samples of 3 and 1 tokens
    model = SimpleNamespace(config=SimpleNamespace(hidden_size=4, intermediate_size=6, vocab_size=5, num_attention_heads=2,
                                                   num_key_value_heads=1, num_hidden_layers=1))
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    batch = RolloutBatch(prompt_ids=torch.ones(2, 3, dtype=torch.long), prompt_mask=torch.ones(2, 3, dtype=torch.long),
                         response_ids=torch.ones(2, 3, dtype=torch.long), response_mask=mask, logprobs=torch.zeros(2, 3),
                         eos=torch.ones(2, dtype=torch.bool), truncated=torch.zeros(2, dtype=torch.bool),
                         group_ids=torch.zeros(2, dtype=torch.long), versions=torch.zeros(2, 3, dtype=torch.long))

    def layer(m: int, keys: int, queries: int) -> int:  # q/k/v 4 -> 8, o 4 -> 4, gate/up 4 -> 12, down 6 -> 4; attention
        return m * 4 * 8 + m * 4 * 4 + m * 4 * 12 + m * 6 * 4 + 2 * (m // queries) * 1 * 2 * queries * keys * 2

    prefill = layer(3, keys=3, queries=3) + 1 * 4 * 5  # the prompt's 3 positions; the head on the last one
    # the 3-token sample feeds its tokens 0 and 1 (token 2 is sampled from step 1's logits) over 4 and 5 keys;
    # the 1-token sample ended with the prefill's logits
    decode = layer(1, keys=4, queries=1) + 4 * 5 + layer(1, keys=5, queries=1) + 4 * 5
    assert prefill == 452 and decode == 352
    assert matrix_seconds(model, batch, 2, Work()) == prefill + decode


def test_the_gen_bound_mode_names_what_it_cannot_run():
    import subprocess

    bench = Path(__file__).resolve().parents[2] / "bench" / "rollout.py"
    for args, said in ((["--lengths", "24,x"], "--lengths: expected caps on new tokens like 24,48 (integers >= 1), got '24,x'"),
                       (["--device", "cuda"], "--gen-bound runs on the CPU from fp32 weights")):
        done = subprocess.run([sys.executable, str(bench), "--gen-bound", *args], capture_output=True, text=True, timeout=120)
        assert done.returncode == 2 and said in done.stderr, done.stderr
