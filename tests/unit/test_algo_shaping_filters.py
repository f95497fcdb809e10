"""reasonrl.algo.shaping, .filters and .evaluation: hand-computed values and loop references."""

import itertools
import math
import random
from collections import defaultdict

import pytest
import torch

from reasonrl.algo import group_outcomes, keep_groups, overlong_filter_mask, overlong_penalty, pass_at_k


def test_overlong_penalty_hand():
    # max_len 20, buffer 4 -> expected 16; penalty = min(-(L - 16) / 4 * factor, 0)
    # L: 10 -> 0, 16 -> 0, 17 -> -.25, 18 -> -.5, 20 -> -1, 22 -> -1.5
    lengths = torch.tensor([10, 16, 17, 18, 20, 22])
    expected = torch.tensor([0.0, 0.0, -0.25, -0.5, -1.0, -1.5])
    assert torch.allclose(overlong_penalty(lengths, 20, 4, 1.0), expected)
    assert torch.allclose(overlong_penalty(lengths, 20, 4, 0.5), expected * 0.5)
    # buffer == max_len: expected 0, penalty -L / 20
    assert torch.allclose(overlong_penalty(torch.tensor([5]), 20, 20, 1.0), torch.tensor([-0.25]))


@pytest.mark.parametrize("buffer_len", [0, -1, 21])
def test_overlong_penalty_validates_buffer(buffer_len):
    with pytest.raises(ValueError, match=f"buffer_len={buffer_len}, max_len=20"):
        overlong_penalty(torch.tensor([1]), 20, buffer_len, 1.0)


def test_overlong_filter_mask_hand():
    got = overlong_filter_mask(torch.tensor([True, False, True]))
    assert got.dtype == torch.float32
    assert torch.equal(got, torch.tensor([0.0, 1.0, 0.0]))


def test_keep_groups_hand():
    # 10: [1, 0] mixed -> keep; -2: [1, 1] -> drop; 99: [0] alone -> keep (as verl); 7: [.5, .5, .25] -> keep
    metric = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.5, 0.5, 0.25])
    ids = torch.tensor([10, 10, -2, -2, 99, 7, 7, 7])
    assert keep_groups(metric, ids).tolist() == [True, True, False, False, True, True, True, True]
    # bool metric
    assert keep_groups(torch.tensor([True, True, False, True]), torch.tensor([1, 2, 2, 1])).tolist() == [
        False,
        True,
        True,
        False,
    ]


def test_keep_groups_matches_loop():
    rng, gen = random.Random(5), torch.Generator().manual_seed(5)
    for _ in range(10):
        ids = [gid for gid in rng.sample([-4, 8, 31, 2, 77, 1000], k=4) for _ in range(rng.randint(1, 4))]
        rng.shuffle(ids)
        metric = (torch.rand(len(ids), generator=gen) * 3).floor()  # values in {0, 1, 2}: ties are common
        members = defaultdict(list)
        for i, gid in enumerate(ids):
            members[gid].append(float(metric[i]))
        ref = [len(set(members[gid])) > 1 or len(members[gid]) == 1 for gid in ids]
        assert keep_groups(metric, torch.tensor(ids)).tolist() == ref


def test_group_outcomes_hand():
    # 3: [1, 1] all correct; 8: [0, 0] all wrong; 1: [1, 0] mixed; 42: [1] all correct
    acc = torch.tensor([True, True, False, False, True, False, True])
    ids = torch.tensor([3, 3, 8, 8, 1, 1, 42])
    assert group_outcomes(acc, ids) == (2, 1, 1)


def test_pass_at_k_hand():
    # 1 - C(3, 2) / C(5, 2) = 1 - 3/10
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)
    assert pass_at_k(3, 1, 1) == pytest.approx(1 / 3)
    assert pass_at_k(4, 0, 1) == 0.0
    assert pass_at_k(4, 4, 4) == 1.0
    assert pass_at_k(4, 2, 3) == 1.0  # n - c = 2 < k: every 3-subset holds a correct sample


def test_pass_at_k_matches_brute_force():
    for n in range(1, 7):
        for c in range(n + 1):
            for k in range(1, n + 1):
                subsets = list(itertools.combinations([1] * c + [0] * (n - c), k))
                brute = sum(any(s) for s in subsets) / len(subsets)
                assert pass_at_k(n, c, k) == pytest.approx(brute, abs=1e-12)
                assert pass_at_k(n, c, k) == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k), abs=1e-12)


@pytest.mark.parametrize("n,c,k,match", [(4, 1, 0, "k=0"), (4, 1, 5, "k=5"), (4, 5, 1, "c=5"), (4, -1, 1, "c=-1")])
def test_pass_at_k_validates(n, c, k, match):
    with pytest.raises(ValueError, match=match):
        pass_at_k(n, c, k)
