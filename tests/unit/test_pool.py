"""The prompt pool: uniform draws are the sampler's own, adaptive draws pick sources by their
weights, the curriculum's resting prompts are passed over, and the state restores exactly."""

from __future__ import annotations

import pytest

from reasonrl.config import DataConfig
from reasonrl.data.pool import PromptPool, hashed_uniform, pick
from reasonrl.data.sampler import PromptSampler
from reasonrl.errors import InputError

SOURCES = ["a"] * 10 + ["b"] * 10  # rows 0..9 from a, 10..19 from b

def test_pick_takes_the_interval_that_holds_u():
    assert pick([0.2, 0.0, 0.8], 0.1) == 0
    assert pick([0.2, 0.0, 0.8], 0.2) == 2  # [0.2, 1.0) is the last source's; the empty one is never picked
    assert pick([0.5, 0.5], 0.5) == 1
    assert pick([1.0, 3.0, 0.0], 0.999999) == 1  # weights need not sum to 1
    assert 0.0 <= hashed_uniform(0, 7) < 1.0 and hashed_uniform(0, 7) == hashed_uniform(0, 7) != hashed_uniform(1, 7)

def test_uniform_pool_draws_as_the_sampler_and_keeps_its_state():
    pool, sampler = PromptPool(DataConfig(), SOURCES, seed=3), PromptSampler(len(SOURCES), 3)
    assert pool.next(7) + pool.next(20) == sampler.next(7) + sampler.next(20)
    assert pool.state_dict() == sampler.state_dict()
    assert pool.end_batch([(0, 2, 2)]) == {}  # nothing to learn or log

def skewed(**overrides) -> DataConfig:
    """A mix whose weights jump to the normalised needs at once (rate 1) without a floor."""
    return DataConfig(mix="adaptive", mix_by="gap", mix_target=1.0, mix_floor=0.0, mix_rate=1.0, mix_ema=0.0, **overrides)

def test_adaptive_draws_follow_the_weights_and_each_source_its_own_epochs():
    pool = PromptPool(skewed(), SOURCES, seed=0)
    first = pool.next(200)
    assert 70 <= sum(row < 10 for row in first) <= 130  # equal weights at the start
    # a solved 1 in 4 and b 3 in 4 of their samples: needs (0.75, 0.25), weights (0.75, 0.25)
    metrics = pool.end_batch([(0, 1, 4), (10, 3, 4)])
    assert metrics == {"data/mix/a": 0.5, "data/mix/b": 0.5, "data/mix_acc/a": 0.25, "data/mix_acc/b": 0.75}
    rows = pool.next(1000)
    assert 710 <= sum(row < 10 for row in rows) <= 790  # about 750 from a (sd 14)
    a_rows = [row for row in first + rows if row < 10]
    for e in range(len(a_rows) // 10):  # a's draws: one permutation of its rows after another
        assert sorted(a_rows[10 * e : 10 * e + 10]) == list(range(10))

def test_adaptive_state_restores_the_same_draws_and_weights():
    pool = PromptPool(skewed(curriculum_window=1, curriculum_revisit=2), SOURCES, seed=5)
    pool.next(13)
    pool.end_batch([(3, 0, 2), (12, 1, 2)])
    pool.next(5)
    state = pool.state_dict()
    assert set(state) == {"sources", "drawn", "mix", "curriculum"} and state["drawn"] == 18
    restored = PromptPool(skewed(curriculum_window=1, curriculum_revisit=2), SOURCES, seed=5)
    restored.load_state_dict(state)
    assert restored.next(40) == pool.next(40)
    assert restored.mix.weights == pool.mix.weights
    with pytest.raises(ValueError, match="its parts .* are not those of this run's data.mix and data.curriculum_window"):
        PromptPool(DataConfig(), SOURCES, seed=5).load_state_dict(state)
    with pytest.raises(ValueError, match=r"it draws from the sources \['a', 'b'\], this run's data has \['a', 'c'\]"):
        PromptPool(skewed(curriculum_window=1, curriculum_revisit=2), ["a"] * 10 + ["c"] * 10, seed=5).load_state_dict(state)

def test_static_draws_follow_the_fixed_weights_which_no_batch_moves():
    data = DataConfig(mix="static", mix_weights={"a": 0.8, "b": 0.2})
    pool = PromptPool(data, SOURCES, seed=0)
    rows = pool.next(1000)
    assert 770 <= sum(row < 10 for row in rows) <= 830  # about 800 from a (sd 13)
    metrics = pool.end_batch([(0, 1, 4), (10, 3, 4)])
    assert metrics == {"data/mix/a": 0.8, "data/mix/b": 0.2, "data/mix_acc/a": 0.25, "data/mix_acc/b": 0.75}
    assert pool.mix.probabilities() == [0.8, 0.2]  # the accuracies moved nothing
    restored = PromptPool(data, SOURCES, seed=0)
    restored.load_state_dict(pool.state_dict())
    assert restored.next(50) == pool.next(50)
    with pytest.raises(InputError, match=r"data\.mix_weights = \{'a': 1\.0\}: must name exactly the training data's "
                                         r"sources a, b"):
        PromptPool(DataConfig(mix="static", mix_weights={"a": 1.0}), SOURCES, seed=0)


def test_curriculum_passes_over_resting_prompts_until_they_return():
    pool = PromptPool(DataConfig(curriculum_window=1, curriculum_revisit=1), ["s"] * 4, seed=0)
    pool.next(4)
    metrics = pool.end_batch([(0, 2, 2), (1, 0, 2), (2, 1, 2)])  # 0 solved, 1 failed: both rest one batch
    assert metrics == {"data/curriculum/retired": 2.0, "data/curriculum/returned": 0.0, "data/curriculum/out_of_pool": 2.0}
    assert set(pool.next(12)) == {2, 3}
    assert pool.end_batch([])["data/curriculum/returned"] == 2.0
    assert set(pool.next(12)) == {0, 1, 2, 3}

def test_a_source_whose_prompts_all_rest_is_not_drawn_and_a_pool_all_resting_comes_back():
    pool = PromptPool(skewed(curriculum_window=1, curriculum_revisit=5), ["a", "a", "b", "b"], seed=1)
    pool.next(4)
    pool.end_batch([(0, 2, 2), (1, 0, 2)])  # every prompt of a rests
    assert set(pool.next(30)) == {2, 3}
    pool.end_batch([(2, 2, 2), (3, 2, 2)])  # and now every prompt of b
    pool.next(1)  # nothing left: all come back at once
    assert pool.curriculum.resting == {}
    assert pool.end_batch([])["data/curriculum/returned"] == 4.0
