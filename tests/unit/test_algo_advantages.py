"""reasonrl.algo.advantages: hand-computed values and Python-loop references."""

import math
import random
from collections import defaultdict

import pytest
import torch

from reasonrl.algo import (GROUP_ESTIMATORS, batch_normalised, dr_grpo, gae, grpo, lite_ppo, outcome_to_token_rewards,
                           reinforce_pp, rloo)

EPS = 1e-6


def test_grpo_hand():
    # group 5: [1, -1, 1, 1]: mean 0.5, squared deviations .25 + 2.25 + .25 + .25 = 3,
    # unbiased var 3 / 3 = 1, std 1 -> (s - 0.5) / (1 + eps) = [.5, -1.5, .5, .5] / (1 + eps)
    # group -3: [2] alone: mean 0, std 1 -> 2 / (1 + eps)
    scores = torch.tensor([1.0, 2.0, -1.0, 1.0, 1.0])
    ids = torch.tensor([5, -3, 5, 5, 5])
    expected = torch.tensor([0.5, 2.0, -1.5, 0.5, 0.5]) / (1 + EPS)
    assert torch.allclose(grpo(scores, ids), expected, atol=1e-7)
    # all-equal group: std 0 -> 0 / eps = 0
    assert torch.equal(grpo(torch.tensor([1.0, 1.0]), torch.tensor([0, 0])), torch.zeros(2))


def test_dr_grpo_hand():
    # same groups: s - mean, mean of the singleton is 0 -> [.5, 2, -1.5, .5, .5]
    scores = torch.tensor([1.0, 2.0, -1.0, 1.0, 1.0])
    ids = torch.tensor([5, -3, 5, 5, 5])
    assert torch.allclose(dr_grpo(scores, ids), torch.tensor([0.5, 2.0, -1.5, 0.5, 0.5]))


def test_lite_ppo_hand():
    # groups a=[1, 0], b=[0, 0], c=[1, 1]: group means .5, 0, 1 -> centred [.5, -.5, 0, 0, 0, 0]
    # batch std of the RAW scores: mean .5, six squared deviations of .25 = 1.5, / 5 = .3 -> sqrt(.3)
    # (the std of the centred scores would be sqrt(.5 / 5) = sqrt(.1): a different number)
    scores = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0])
    ids = torch.tensor([11, 11, 4, 4, 9, 9])
    expected = torch.tensor([0.5, -0.5, 0.0, 0.0, 0.0, 0.0]) / (math.sqrt(0.3) + EPS)
    assert torch.allclose(lite_ppo(scores, ids), expected, atol=1e-6)
    # batch of one: std 1, group of one: mean 0 -> 3 / (1 + eps)
    assert lite_ppo(torch.tensor([3.0]), torch.tensor([0])).item() == pytest.approx(3 / (1 + EPS))


def test_batch_normalised_hand():
    # the same six scores, groups ignored: batch mean .5, unbiased std sqrt(.3) (as above) ->
    # (s - .5) / sqrt(.3): the all-correct group c gets +.5 / sqrt(.3), not 0 as under grpo
    scores = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0])
    ids = torch.tensor([11, 11, 4, 4, 9, 9])
    expected = torch.tensor([0.5, -0.5, -0.5, -0.5, 0.5, 0.5]) / (math.sqrt(0.3) + EPS)
    assert torch.allclose(batch_normalised(scores, ids), expected, atol=1e-6)
    # {0, 1} and {-1, 1} rewards give the same advantages up to eps: the normalisation is affine-invariant
    assert torch.allclose(batch_normalised(2 * scores - 1, ids), expected, atol=1e-5)
    assert batch_normalised(torch.tensor([3.0]), torch.tensor([0])).item() == 0.0  # a batch of one


def test_rloo_hand():
    # group [3, 1, 2]: 3 - (1+2)/2 = 1.5, 1 - (3+2)/2 = -1.5, 2 - (3+1)/2 = 0; singleton -> 0
    scores = torch.tensor([3.0, 7.0, 1.0, 2.0])
    ids = torch.tensor([2, 8, 2, 2])
    assert torch.allclose(rloo(scores, ids), torch.tensor([1.5, 0.0, -1.5, 0.0]))


def test_outcome_to_token_rewards_hand():
    # last valid tokens: row 0 at t=1, row 1 at t=2 (a hole at t=1), row 2 has none
    mask = torch.tensor([[1, 1, 0], [1, 0, 1], [0, 0, 0]])
    got = outcome_to_token_rewards(torch.tensor([2.0, 3.0, 4.0]), mask)
    assert torch.equal(got, torch.tensor([[0.0, 2.0, 0.0], [0.0, 0.0, 3.0], [0.0, 0.0, 0.0]]))


def test_reinforce_pp_hand():
    # gamma .5; row 0 rewards [0, 0, 1, 0], mask [1, 1, 1, 0]: G = [.25, .5, 1, 0]
    # row 1 rewards [0, 2, 0, 0], mask [1, 1, 0, 0]: G = [1, 2, 0, 0]
    # valid G: .25, .5, 1, 1, 2: mean .95, squared deviations .49 + .2025 + .0025 + .0025 + 1.1025 = 1.8,
    # unbiased var 1.8 / 4 = .45 -> A = (G - .95) / sqrt(.45 + 1e-8) on valid tokens, 0 elsewhere
    rewards = torch.tensor([[0.0, 0.0, 1.0, 0.0], [0.0, 2.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]])
    adv, ret = reinforce_pp(rewards, mask, gamma=0.5)
    g = torch.tensor([[0.25, 0.5, 1.0, 0.0], [1.0, 2.0, 0.0, 0.0]])
    assert torch.allclose(ret, g)
    assert torch.allclose(adv, (g - 0.95) / math.sqrt(0.45 + 1e-8) * mask, atol=1e-6)


def test_gae_hand():
    # gamma = lam = .5. Row 0: mask [1, 1, 0], rewards [0, 1, 0], values [.5, .25, 9]
    #   t=2 masked: L=0, V'=0;  t=1: delta = 1 + 0 - .25 = .75, L = .75, V' = .25
    #   t=0: delta = 0 + .5*.25 - .5 = -.375, L = -.375 + .25*.75 = -.1875
    # Row 1: mask [1, 0, 1] (a hole), rewards [0, 0, 1], values [.5, 7, .25]
    #   t=2: delta = 1 - .25 = .75, L = .75, V' = .25;  t=1 masked: L and V' carried (.75, .25)
    #   t=0: delta = .5*.25 - .5 = -.375, L = -.375 + .25*.75 = -.1875
    # returns = L + values. Valid L: -.1875, .75, -.1875, .75: mean .28125, deviations +-.46875,
    # unbiased var 4 * .46875^2 / 3 -> whitened +-.46875 / sqrt(.29296875) = +-sqrt(3)/2
    rewards = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    values = torch.tensor([[0.5, 0.25, 9.0], [0.5, 7.0, 0.25]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 1.0]])
    adv, ret = gae(rewards, values, mask, gamma=0.5, lam=0.5)
    raw = torch.tensor([[-0.1875, 0.75, 0.0], [-0.1875, 0.75, 0.75]])
    assert torch.allclose(ret, raw + values)
    h = math.sqrt(3) / 2
    assert torch.allclose(adv, torch.tensor([[-h, h, 0.0], [-h, 0.0, h]]), atol=1e-5)


# ---------------------------------------------------------------- loop references


def _random_groups(rng, gen):
    ids = []
    for gid in rng.sample([-7, 3, 42, 1000, 5, 17, 0, 999], k=rng.randint(2, 7)):
        ids += [gid] * rng.choice([1, 2, 3, 4, 5])
    rng.shuffle(ids)
    scores = torch.where(
        torch.rand(len(ids), generator=gen) > 0.5,
        (torch.rand(len(ids), generator=gen) > 0.5).double(),  # binary scores create ties and std-0 groups
        torch.randn(len(ids), generator=gen, dtype=torch.float64),
    )
    return scores, torch.tensor(ids)


def _loop_group_adv(scores, ids, kind):
    members = defaultdict(list)
    for i, gid in enumerate(ids.tolist()):
        members[gid].append(float(scores[i]))
    batch = [float(s) for s in scores]
    batch_mean = sum(batch) / len(batch)
    batch_std = math.sqrt(sum((s - batch_mean) ** 2 for s in batch) / (len(batch) - 1))
    out = []
    for i, gid in enumerate(ids.tolist()):
        g, s = members[gid], float(scores[i])
        n = len(g)
        mean = sum(g) / n if n > 1 else 0.0
        std = math.sqrt(sum((x - sum(g) / n) ** 2 for x in g) / (n - 1)) if n > 1 else 1.0
        if kind == "grpo":
            out.append((s - mean) / (std + EPS))
        elif kind == "dr_grpo":
            out.append(s - mean)
        elif kind == "lite_ppo":
            out.append((s - mean) / (batch_std + EPS))
        else:  # rloo: s minus the mean of the others
            others = list(g)
            others.remove(s)
            out.append(s - sum(others) / len(others) if others else 0.0)
    return torch.tensor(out, dtype=torch.float64)


@pytest.mark.parametrize("kind,fn", [("grpo", grpo), ("dr_grpo", dr_grpo), ("lite_ppo", lite_ppo), ("rloo", rloo)])
def test_group_advantages_match_loop(kind, fn):
    rng, gen = random.Random(1), torch.Generator().manual_seed(1)
    for _ in range(10):
        scores, ids = _random_groups(rng, gen)
        assert torch.allclose(fn(scores, ids), _loop_group_adv(scores, ids, kind), atol=1e-9)


def _loop_whiten(x, mask):
    vals = [float(x[b, t]) for b in range(x.shape[0]) for t in range(x.shape[1]) if mask[b, t] > 0]
    mean = sum(vals) / len(vals)
    var = sum((v - mean) ** 2 for v in vals) / (len(vals) - 1)
    out = torch.zeros_like(x)
    for b in range(x.shape[0]):
        for t in range(x.shape[1]):
            if mask[b, t] > 0:
                out[b, t] = (float(x[b, t]) - mean) / math.sqrt(var + 1e-8)
    return out


def _random_token_batch(gen, b=4, t=6):
    rewards = torch.randn(b, t, generator=gen, dtype=torch.float64)
    values = torch.randn(b, t, generator=gen, dtype=torch.float64)
    mask = (torch.rand(b, t, generator=gen) > 0.3).double()  # holes anywhere (multi-turn style)
    mask[0] = 0.0
    mask[0, :2] = 1.0
    return rewards, values, mask


def test_reinforce_pp_matches_loop():
    gen = torch.Generator().manual_seed(2)
    for gamma in (1.0, 0.9):
        rewards, _, mask = _random_token_batch(gen)
        ref = torch.zeros_like(rewards)
        for b in range(rewards.shape[0]):
            running = 0.0
            for t in reversed(range(rewards.shape[1])):
                if mask[b, t]:  # a masked position (an environment's token) passes the return on
                    running = float(rewards[b, t]) + gamma * running
                ref[b, t] = running
        adv, ret = reinforce_pp(rewards, mask, gamma=gamma)
        assert torch.allclose(ret, ref, atol=1e-12)
        assert torch.allclose(adv, _loop_whiten(ref, mask), atol=1e-9)


def test_reinforce_pp_credits_earlier_turns_across_environment_tokens():
    # Two policy turns [1, 1] and [1], an environment token between them, the reward 1 on
    # the last policy token: every policy token's return is 1 (gamma 1); resetting at the
    # environment's token (verl's single-turn recursion) would give the first turn 0.
    rewards = torch.tensor([[0.0, 0.0, 0.0, 1.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0, 1.0, 0.0]])
    _, ret = reinforce_pp(rewards, mask, gamma=1.0)
    assert ret[0, [0, 1, 3]].tolist() == [1.0, 1.0, 1.0]
    _, ret = reinforce_pp(rewards, mask, gamma=0.5)
    assert ret[0, [0, 1, 3]].tolist() == [0.25, 0.5, 1.0]


def test_gae_matches_loop():
    gen = torch.Generator().manual_seed(3)
    for gamma, lam in ((1.0, 1.0), (0.99, 0.95), (0.5, 0.0)):
        rewards, values, mask = _random_token_batch(gen)
        raw = torch.zeros_like(rewards)
        for b in range(rewards.shape[0]):
            next_value, last = 0.0, 0.0
            for t in reversed(range(rewards.shape[1])):
                if mask[b, t] > 0:
                    delta = float(rewards[b, t]) + gamma * next_value - float(values[b, t])
                    last = delta + gamma * lam * last
                    next_value = float(values[b, t])
                raw[b, t] = last
        adv, ret = gae(rewards, values, mask, gamma=gamma, lam=lam)
        assert torch.allclose(ret, raw + values, atol=1e-12)
        assert torch.allclose(adv, _loop_whiten(raw, mask), atol=1e-9)


def test_outcome_to_token_rewards_matches_loop():
    gen = torch.Generator().manual_seed(4)
    mask = (torch.rand(6, 5, generator=gen) > 0.5).long()
    scores = torch.randn(6, generator=gen)
    ref = torch.zeros(6, 5)
    for b in range(6):
        valid = [t for t in range(5) if mask[b, t]]
        if valid:
            ref[b, valid[-1]] = scores[b]
    assert torch.equal(outcome_to_token_rewards(scores, mask), ref)


def test_every_estimator_is_one_call_of_the_registry_masked_by_the_loss_mask():
    from typing import get_args, get_type_hints

    from reasonrl.algo import ESTIMATORS, AdvantageInputs
    from reasonrl.config.schema import AlgoConfig

    assert set(ESTIMATORS) == set(get_args(get_type_hints(AlgoConfig)["adv_estimator"]))  # the config's names, all
    scores, ids = torch.tensor([1.0, -1.0, 1.0, 1.0]), torch.tensor([0, 0, 1, 1])
    action = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]], dtype=torch.float32)
    loss = action.clone()
    loss[1] = 0  # a filtered row: nothing of it trains
    values = torch.linspace(-0.5, 0.5, 16).reshape(4, 4)
    x = AdvantageInputs(scores, ids, action, loss, None, values, gamma=0.9, lam=0.8)
    for name in GROUP_ESTIMATORS:
        adv, returns = ESTIMATORS[name](x)
        assert torch.equal(adv, GROUP_ESTIMATORS[name](scores, ids)[:, None] * loss) and returns is None
    rewards = outcome_to_token_rewards(scores, action)
    adv, returns = ESTIMATORS["reinforce_pp"](x)
    assert torch.equal(adv, reinforce_pp(rewards, action, 0.9)[0] * loss) and returns is None
    adv, returns = ESTIMATORS["gae"](x)
    expected, expected_returns = gae(rewards, values, action, 0.9, 0.8)
    assert torch.equal(adv, expected * loss) and torch.equal(returns, expected_returns)
    assert not adv[1].any()
    with pytest.raises(ValueError, match="critic's values"):
        ESTIMATORS["gae"](AdvantageInputs(scores, ids, action, loss))
