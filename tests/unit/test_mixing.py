"""Adaptive domain mixing: the weight update's formulas on hand-computed values, the mix's
state, and the curriculum's retire-and-return rule."""

from __future__ import annotations

import pytest

from reasonrl.data.curriculum import Curriculum, outcome
from reasonrl.data.mixing import SourceMix, ema_update, floored, held_out_accuracy, needs, normalised, smoothed
from reasonrl.errors import InputError


def test_accuracy_average_starts_at_the_first_value_then_moves_by_one_minus_ema():
    assert ema_update(None, 0.4, 0.8) == 0.4
    assert ema_update(0.4, 0.9, 0.8) == pytest.approx(0.8 * 0.4 + 0.2 * 0.9)  # 0.5
    assert ema_update(0.4, 0.9, 0.0) == 0.9


def test_needs_by_gap_and_by_signal_with_an_unobserved_source_explored():
    # gap to 0.9: 0.7, 0.2, (unobserved: the largest, 0.7), 0 (above the target)
    assert needs([0.2, 0.7, None, 1.0], "gap", 0.9) == pytest.approx([0.7, 0.2, 0.7, 0.0])
    # a * (1 - a): 0.16, 0.25 (one half: the most), (unobserved: 0.25), 0 (always solved)
    assert needs([0.2, 0.5, None, 1.0], "signal", 0.9) == pytest.approx([0.16, 0.25, 0.25, 0.0])
    assert needs([None, None], "gap", 1.0) == [0.0, 0.0]
    with pytest.raises(ValueError, match="data.mix_by = 'loss'"):
        needs([0.5], "loss", 1.0)


def test_normalised_smoothed_and_floored_weights():
    r = normalised([0.7, 0.2, 0.7, 0.0])
    assert r == pytest.approx([0.4375, 0.125, 0.4375, 0.0])
    assert normalised([0.0, 0.0]) == [0.5, 0.5]  # nothing to move toward: equal
    w = smoothed([0.25] * 4, r, 0.3)  # 0.7 * 0.25 + 0.3 * r
    assert w == pytest.approx([0.30625, 0.2125, 0.30625, 0.175])
    p = floored(w, 0.05)  # 0.05 + (1 - 4 * 0.05) * w
    assert p == pytest.approx([0.295, 0.22, 0.295, 0.19]) and sum(p) == pytest.approx(1.0)
    assert floored(w, 0.25) == pytest.approx([0.25] * 4)  # floor 1/S: equal weights
    with pytest.raises(InputError, match=r"data.mix_floor = 0.3: expected a value in \[0, 1/4\] for the 4 data sources"):
        floored(w, 0.3)


def test_source_mix_two_updates_by_hand():
    mix = SourceMix(["b", "a", "a"], by="gap", target=1.0, floor=0.1, rate=0.5, ema=0.5)
    assert mix.sources == ["a", "b"] and mix.probabilities() == pytest.approx([0.5, 0.5])
    mix.observe({"a": 0.2, "b": 0.6})
    mix.update()  # d = (0.8, 0.4), r = (2/3, 1/3), w = (7/12, 5/12), p = 0.1 + 0.8 w
    assert mix.weights == pytest.approx([7 / 12, 5 / 12])
    assert mix.probabilities() == pytest.approx([0.1 + 0.8 * 7 / 12, 0.1 + 0.8 * 5 / 12])
    mix.observe({"a": 0.6, "c": 0.1})  # a: 0.5 * 0.2 + 0.5 * 0.6 = 0.4; c is no source of this mix
    mix.update()  # d = (0.6, 0.4) = r, w = (7/24 + 0.3, 5/24 + 0.2)
    assert mix.accuracy == pytest.approx([0.4, 0.6])
    assert mix.weights == pytest.approx([7 / 24 + 0.3, 5 / 24 + 0.2])
    restored = SourceMix(["a", "b"], by="gap", target=1.0, floor=0.1, rate=0.5, ema=0.5)
    restored.load_state_dict(mix.state_dict())
    assert restored.weights == mix.weights and restored.accuracy == mix.accuracy
    with pytest.raises(ValueError, match=r"the checkpoint mixes the sources \['a', 'b'\], this run's data has \['a', 'c'\]"):
        SourceMix(["a", "c"], by="gap", target=1.0, floor=0.1, rate=0.5, ema=0.5).load_state_dict(mix.state_dict())


def test_weights_settle_at_the_floored_needs_and_signal_prefers_one_half():
    mix = SourceMix(["easy", "half", "hard"], by="signal", target=1.0, floor=0.05, rate=0.3, ema=0.8)
    for _ in range(60):
        mix.observe({"easy": 0.9, "half": 0.5, "hard": 0.0})
        mix.update()
    # d = (0.09, 0.25, 0): r = (0.09, 0.25, 0) / 0.34; p = 0.05 + 0.85 r
    assert mix.probabilities() == pytest.approx([0.05 + 0.85 * 0.09 / 0.34, 0.05 + 0.85 * 0.25 / 0.34, 0.05], abs=1e-6)


def test_a_mix_needs_two_sources_and_known_modes():
    with pytest.raises(InputError, match="data.mix = 'adaptive': mixes data sources, and the training data has one"):
        SourceMix(["only"] * 3, by="gap", target=1.0, floor=0.0, rate=0.5, ema=0.5)
    with pytest.raises(InputError, match="data.mix_floor = 0.6"):
        SourceMix(["a", "b"], by="gap", target=1.0, floor=0.6, rate=0.5, ema=0.5)


def test_held_out_accuracy_takes_the_per_source_metrics_only():
    metrics = {"val/acc": 0.5, "val/acc/embedded/add": 0.25, "val/acc/embedded/mul": 0.75, "val/pass@4": 1.0,
               "val/acc_greedy": 0.5}
    assert held_out_accuracy(metrics) == {"embedded/add": 0.25, "embedded/mul": 0.75}


def test_outcomes_of_a_group():
    assert (outcome(8, 8), outcome(0, 8), outcome(3, 8)) == ("S", "F", "M")


def test_curriculum_retires_after_window_equal_outcomes_and_returns_after_revisit_batches():
    c = Curriculum(window=2, revisit=2)
    c.observe(5, 8, 8)
    c.observe(6, 3, 8)
    assert c.end_batch() == (0, 0) and c.resting == {}  # batch 1: one S is not yet a window of two
    c.observe(5, 8, 8)
    c.observe(6, 4, 8)
    assert c.end_batch() == (1, 0)  # batch 2: 5 solved twice -> out for batches 3 and 4; 6 is mixed
    assert c.resting == {5: 4} and c.windows == {5: "SS", 6: "MM"}
    assert c.end_batch() == (0, 0) and 5 in c.resting  # batch 3
    assert c.end_batch() == (0, 1) and c.resting == {}  # batch 4 ends its rest
    c.observe(5, 0, 8)  # back: failed once, "SF"
    c.observe(5, 0, 8)  # "FF": all failed in the window -> retires again
    assert c.end_batch() == (1, 0) and c.resting == {5: 7}
    c.release([5, 9])
    assert c.end_batch() == (0, 1) and c.resting == {}


def test_curriculum_state_round_trips():
    c = Curriculum(window=1, revisit=3)
    c.observe(1, 2, 2)
    c.end_batch()
    restored = Curriculum(window=1, revisit=3)
    restored.load_state_dict(c.state_dict())
    assert (restored.batches, restored.windows, restored.resting) == (1, {1: "S"}, {1: 4})
