"""Per-group seeds and the counter-based uniforms (reasonrl.rollout.seeds) against a pure-Python
reference of the same formulas."""

import pytest
import torch

from reasonrl.rollout.seeds import BELOW_ONE, check_seeds, combine, group_seed, mix64, row_seeds, uniforms

M = 2**64


def reference_uniform(row: int, t: int) -> float:
    """The module docstring's formula, written out on Python ints: splitmix64 of
    ``row ^ (t * G)``, its top 53 bits over 2**53."""
    z = ((row % M) ^ (t * 0x9E3779B97F4A7C15 % M)) + 0x9E3779B97F4A7C15
    z %= M
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9 % M
    z = (z ^ (z >> 27)) * 0x94D049BB133111EB % M
    z ^= z >> 31
    return (z >> 11) / 2**53


def test_mix64_is_splitmix64():
    # splitmix64 seeded with 0 outputs 0xE220A8397B1DCDAF first (state 0 + G, finalised);
    # state 1 gives mix64(G) as its second state's output.
    assert mix64(0) == 0xE220A8397B1DCDAF
    assert mix64(0x9E3779B97F4A7C15) == 0x6E789E6AA1B965F4


def test_group_and_row_seeds_are_62_bit_and_distinct():
    seeds = [group_seed(run, d) for run in (0, 1, 2**40) for d in range(50)]
    assert all(0 <= s < 2**62 for s in seeds)
    assert len(set(seeds)) == len(seeds)
    assert group_seed(7, 3) == combine(7, 3) == mix64(mix64(7) ^ 3) >> 2
    rows = row_seeds([11, 12], 3)
    assert rows.dtype == torch.long and rows.shape == (6,)
    assert rows.tolist() == [combine(s, j) for s in (11, 12) for j in range(3)]
    with pytest.raises(ValueError, match="^n: "):
        row_seeds([1], 0)


@pytest.mark.parametrize("t", [0, 1, 5, 2**40])
def test_uniforms_match_the_python_reference(t):
    rows = torch.tensor([0, 1, 2**62 - 1, 12345678901234567, group_seed(3, 4), -1], dtype=torch.long)
    got = uniforms(rows, t)
    assert got.shape == (6, 1) and got.dtype == torch.float32
    want = torch.tensor([reference_uniform(r, t) for r in rows.tolist()], dtype=torch.float64).float()
    assert torch.equal(got[:, 0], want.clamp(max=BELOW_ONE))
    per_row_t = uniforms(rows, torch.full((6,), t, dtype=torch.long))
    assert torch.equal(per_row_t, got)


def test_uniforms_depend_only_on_seed_and_counter():
    rows = row_seeds([group_seed(0, d) for d in range(8)], 4)
    t = torch.arange(rows.shape[0]) % 5
    whole = uniforms(rows, t)
    perm = torch.randperm(rows.shape[0], generator=torch.Generator().manual_seed(0))
    assert torch.equal(uniforms(rows[perm], t[perm]), whole[perm])
    assert torch.equal(uniforms(rows[3:4], t[3:4]), whole[3:4])  # a batch of one


def test_uniforms_distribution():
    u = uniforms(torch.arange(200_000, dtype=torch.long) * 7919, 3)
    assert (u >= 0).all() and (u < 1).all()
    assert abs(u.mean().item() - 0.5) < 0.005
    assert abs(u.var().item() - 1 / 12) < 0.002
    steps = torch.cat([uniforms(torch.tensor([42]), t) for t in range(20_000)])
    assert abs(steps.mean().item() - 0.5) < 0.01  # one row's stream over its counter


def test_uniforms_never_round_to_one():
    # Top 53 bits all ones: (2**53 - 1) / 2**53 rounds to 1.0 in float32 without the clamp.
    assert float(torch.tensor((2**53 - 1) / 2**53, dtype=torch.float64).float()) == 1.0
    assert BELOW_ONE < 1.0 and torch.tensor(BELOW_ONE).float().item() == BELOW_ONE


def test_uniforms_check_their_input():
    with pytest.raises(ValueError, match="^rows: "):
        uniforms(torch.tensor([1.0]), 0)


def test_check_seeds_names_the_argument():
    check_seeds([1, 2], [[5], [6]])
    with pytest.raises(ValueError, match=r"^seeds: expected one seed per prompt group \(2\), got 1"):
        check_seeds([1], [[5], [6]])
    with pytest.raises(ValueError, match="^seeds: expected integers"):
        check_seeds([1.5, 2], [[5], [6]])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_uniforms_same_on_cuda():
    rows = row_seeds([group_seed(1, d) for d in range(16)], 8)
    t = torch.arange(rows.shape[0]) % 7
    assert torch.equal(uniforms(rows.cuda(), t.cuda()).cpu(), uniforms(rows, t))
