"""PromptSampler: epochs are permutations, batches cross epochs cleanly, state restores exactly."""

from __future__ import annotations

import random

import pytest
import torch

from reasonrl.data.sampler import PromptSampler


def take(sampler: PromptSampler, batches: int, size: int) -> list[list[int]]:
    return [sampler.next(size) for _ in range(batches)]


def test_each_epoch_is_a_permutation_across_batch_boundaries():
    sampler = PromptSampler(num_items=10, seed=0)
    flat = [i for batch in take(sampler, 10, 3) for i in batch]
    assert all(len(b) == 3 for b in take(PromptSampler(10, 0), 10, 3))
    for epoch in range(3):
        assert sorted(flat[epoch * 10 : (epoch + 1) * 10]) == list(range(10))
    assert flat[:10] != flat[10:20]
    assert sampler.state_dict() == {"epoch": 3, "position": 0}


def test_batch_larger_than_dataset_spans_epochs():
    sampler = PromptSampler(num_items=3, seed=1)
    batch = sampler.next(7)
    assert len(batch) == 7
    assert sorted(batch[:3]) == sorted(batch[3:6]) == [0, 1, 2]
    assert sampler.state_dict() == {"epoch": 2, "position": 1}


def test_deterministic_and_independent_of_global_rng():
    torch.manual_seed(123)
    random.seed(123)
    a = take(PromptSampler(50, seed=7), 20, 8)
    torch.manual_seed(999)
    random.seed(999)
    torch.rand(100)
    b = take(PromptSampler(50, seed=7), 20, 8)
    assert a == b
    assert a != take(PromptSampler(50, seed=8), 20, 8)


def test_no_shuffle_is_sequential():
    sampler = PromptSampler(5, seed=0, shuffle=False)
    assert take(sampler, 3, 2) == [[0, 1], [2, 3], [4, 0]]
    assert sampler.state_dict() == {"epoch": 1, "position": 1}


@pytest.mark.parametrize("num_items, batch_size", [(17, 5), (12, 4), (4, 6)])
def test_restore_at_random_points(num_items, batch_size):
    rng = random.Random(num_items * 100 + batch_size)
    for _ in range(5):
        original = PromptSampler(num_items, seed=3)
        take(original, rng.randrange(0, 15), batch_size)
        restored = PromptSampler(num_items, seed=3)
        restored.load_state_dict(original.state_dict())
        assert restored.state_dict() == original.state_dict()
        assert take(restored, 10, batch_size) == take(original, 10, batch_size)


def test_restore_exactly_at_epoch_boundary():
    original = PromptSampler(12, seed=5)
    take(original, 3, 4)
    state = original.state_dict()
    assert state == {"epoch": 1, "position": 0}
    restored = PromptSampler(12, seed=5)
    restored.load_state_dict(state)
    assert take(restored, 7, 4) == take(original, 7, 4)


def test_validation():
    with pytest.raises(ValueError, match="num_items must be >= 1, got 0"):
        PromptSampler(0, seed=0)
    sampler = PromptSampler(4, seed=0)
    with pytest.raises(ValueError, match=r"'position' must be an int in \[0, 4\), got 4"):
        sampler.load_state_dict({"epoch": 0, "position": 4})
    with pytest.raises(ValueError, match="'epoch' must be an int >= 0, got None"):
        sampler.load_state_dict({"position": 0})
