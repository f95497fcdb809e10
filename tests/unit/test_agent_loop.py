"""AgentLoop and the backends' continuations: multi-turn trajectories are the ids sampled and encoded.

The environment is scripted (:class:`ScriptedPool`, the EnvPool interface duck-typed); the
policy is the tiny Qwen2 of ``test_rollout_hf`` (vocabulary 48: the character tokenizer's
first 48 ids, newline, digits, a-z, A-H) whose EOS follows every ``1`` (id 5, ``TRIGGER``) it
reads, or the embedded tiny Llama over the whole character vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest
import torch

from reasonrl.config import EnvConfig
from reasonrl.models.loading import build_tiny_model
from reasonrl.data.tokenizer import build_char_tokenizer
from reasonrl.rollout.agent_loop import AgentLoop, episode_return, observation_ids
from reasonrl.rollout.fast import FastGenerator
from reasonrl.rollout.hf import HFGenerator
from reasonrl.trainer.logprobs import compute_logprobs
from reasonrl.types import SamplingParams
from reasonrl.rollout.seeds import row_seeds
from tests.unit.test_rollout_hf import EOS, PAD, TRIGGER, seeds, tiny_qwen2

@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny tensors: one thread, not a spin-wait on cores other processes share (restored after)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


TOK = build_char_tokenizer()
assert (TOK.pad_token_id, TOK.eos_token_id, TOK.convert_tokens_to_ids("1")) == (PAD, EOS, TRIGGER)


def ids(text: str) -> list[int]:
    return TOK(text, add_special_tokens=False)["input_ids"]


PROMPTS = [ids("go\n7"), ids("find\nabc")]
SEEDS = [11, 42]


@dataclass
class Failure:
    """An EnvFailure as the pool reports it."""

    slot: int
    message: str
    kind: str = "error"


class ScriptedPool:
    """Every slot's episode lasts ``length`` steps: step ``t`` (1-based) returns the
    observation ``f"obs{t}\\ns{seed}"``, reward ``rewards[t - 1]``, terminated at ``t == length``
    with ``info`` ``final_info`` there (else ``{}``). ``fail``: ``{(slot, t): message}``, step
    ``t`` of ``slot`` (t = 0: its reset) is an EnvFailure. It records what it was given."""

    def __init__(self, size: int, length: int = 3, rewards=(0.5, 0.0, 1.0), fail=None, final_info=None) -> None:
        self.size, self.length, self.rewards = size, length, list(rewards) + [0.0] * length
        self.fail, self.final_info = fail or {}, final_info or {}
        self.resets: list[list[int]] = []
        self.actions: list[list[str]] = [[] for _ in range(size)]
        self.observations: list[list[str]] = [[] for _ in range(size)]

    def reset_many(self, seeds: list[int]):
        self.resets.append(list(seeds))
        self.seed, self.t = list(seeds), [0] * len(seeds)
        self.actions = [[] for _ in range(self.size)]
        self.observations = [[] for _ in range(self.size)]
        return [Failure(k, self.fail[k, 0]) if (k, 0) in self.fail else (f"start {s}", {}) for k, s in enumerate(seeds)]

    def step_many(self, actions: list[str | None]):
        assert len(actions) == self.size
        return [None if a is None else self._step(k, a) for k, a in enumerate(actions)]

    def _step(self, k: int, action: str):
        self.t[k] += 1
        t = self.t[k]
        self.actions[k].append(action)
        if (k, t) in self.fail:
            return Failure(k, self.fail[k, t], "timeout")
        done = t == self.length
        self.observations[k].append(f"obs{t}\ns{self.seed[k]}")
        return self.observations[k][-1], self.rewards[t - 1], done, False, self.final_info if done else {}


class Recorder:
    """A backend whose continuations record, per row, every turn sampled and every extension."""

    def __init__(self, backend) -> None:
        self.backend, self.model, self.trainer_numerics = backend, backend.model, backend.trainer_numerics
        self.turns: dict[int, list] = {}
        self.extended: dict[int, list[list[int]]] = {}

    def start(self, prompts, n, capacity, rows, eos_ids):
        continuation = self.backend.start(prompts, n, capacity, rows, eos_ids)
        recorder = self

        class Recording:
            def generate_turn(self, rows, params, limits):
                turns = continuation.generate_turn(rows, params, limits)
                for r, turn in zip(rows, turns):
                    recorder.turns.setdefault(r, []).append(turn)
                return turns

            def extend(self, rows, token_lists):
                for r, tokens in zip(rows, token_lists):
                    recorder.extended.setdefault(r, []).append(list(tokens))
                continuation.extend(rows, token_lists)

        return Recording()


def env(**overrides) -> EnvConfig:
    return replace(EnvConfig(name="scripted", max_turns=4, max_tokens=64), **overrides)


def run(backend, pool, cfg: EnvConfig, params: SamplingParams, n: int = 2, seed: int = 0):
    loop = AgentLoop(backend, pool, TOK, cfg, EOS, PAD)
    return loop.generate(PROMPTS, n, params, seeds(PROMPTS, seed), SEEDS)


SAMPLE = SamplingParams(temperature=1.0, max_new_tokens=6)
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=6)


def test_trained_ids_are_the_ids_sampled_and_returned():
    model = tiny_qwen2(trigger_bias=30.0)
    backend = Recorder(FastGenerator(model, PAD, EOS))
    pool = ScriptedPool(4)
    batch = run(backend, pool, env(), SAMPLE, seed=3)
    B, T = batch.response_ids.shape
    assert not any(e["failed"] for e in batch.episodes) and batch.eos.all()
    retokenised_differs = False
    for r in range(B):
        turns, observations = backend.turns[r], backend.extended[r]
        assert len(turns) == 3 and len(observations) == 2  # the observation after the last turn is not appended
        assert observations == [ids(o) for o in pool.observations[r][:2]]  # the pool's text, encoded once
        assert pool.actions[r] == [TOK.decode(t.tokens, skip_special_tokens=True) for t in turns]
        expected, action, logprobs = [], [], []
        for k, turn in enumerate(turns):
            extra = observations[k] if k < len(observations) else []
            expected += turn.tokens + extra
            action += [1.0] * len(turn.tokens) + [0.0] * len(extra)
            logprobs += turn.logprobs + [0.0] * len(extra)
        L = len(expected)
        assert batch.response_ids[r, :L].tolist() == expected and batch.response_ids[r, L:].eq(PAD).all()
        assert batch.response_mask[r].tolist() == [1.0] * L + [0.0] * (T - L)
        assert batch.action_mask[r].tolist() == action + [0.0] * (T - L)
        assert batch.logprobs[r].tolist() == torch.tensor(logprobs + [0.0] * (T - L)).tolist()
        assert batch.episodes[r]["env_tokens"] == sum(map(len, observations))
        retokenised = ids(TOK.decode(expected, skip_special_tokens=True))
        retokenised_differs |= retokenised != expected
    assert retokenised_differs  # the policy sampled special ids (EOS mid-trajectory, pad, unk) that text loses
    assert (batch.response_ids == EOS).logical_and(batch.action_mask.bool()).any()
    # The trainer's log-probs (environment tokens attended to) are the sampling log-probs.
    trained = compute_logprobs(model, batch, SAMPLE.temperature, micro_batch_size=B)
    action = batch.action_mask.bool()
    torch.testing.assert_close(trained[action], batch.logprobs[action], atol=1e-5, rtol=0)
    assert batch.logprobs[~action].eq(0).all()


@pytest.mark.parametrize("model, params", [
    ("embedded", GREEDY),
    ("trigger", GREEDY),
    ("trigger", SAMPLE),  # the same draws: the tokens agree wherever the logits do
])
def test_fast_and_hf_continuations_agree(model, params):
    if model == "embedded":
        module = build_tiny_model(len(TOK), 32, 2, 4, 2, 64, PAD, EOS, seed=0)
    else:
        module = tiny_qwen2(trigger_bias=30.0)
    cfg = env(max_tokens=40)
    fast = run(FastGenerator(module, PAD, EOS), ScriptedPool(4), cfg, params, seed=5)
    hf = run(HFGenerator(module, PAD, EOS), ScriptedPool(4), cfg, params, seed=5)
    for name in ("prompt_ids", "prompt_mask", "response_ids", "response_mask", "action_mask", "eos", "truncated",
                 "token_rewards"):
        assert torch.equal(getattr(fast, name), getattr(hf, name)), name
    torch.testing.assert_close(fast.logprobs, hf.logprobs, atol=1e-5, rtol=0)
    assert fast.episodes == hf.episodes


def test_continuations_continue_ragged_rows_alike_without_encoding_the_prefix_again():
    # Rows of different lengths, turns of different limits, rows leaving at different turns.
    model = tiny_qwen2(trigger_bias=30.0)
    prompts = [[3, 9, 14], [7, 2, 30, 41, TRIGGER], [22, 8]]
    widths: list[tuple[int, int]] = []
    model.model.embed_tokens.register_forward_pre_hook(lambda m, args: widths.append(tuple(args[0].shape)))
    runs = []
    for backend in (FastGenerator(model, PAD, EOS), HFGenerator(model, PAD, EOS)):
        widths.clear()
        continuation = backend.start(prompts, 2, 40, row_seeds(seeds(prompts, 7), 2))
        turns = [continuation.generate_turn(range(6), SAMPLE, [5, 3, 7, 1, 6, 2])]
        continuation.extend([0, 2, 3, 5], [[7, 8, 9], [10], [], [11, 12, 13, 14]])
        turns.append(continuation.generate_turn([0, 1, 2, 5], SAMPLE, 6))
        continuation.extend([1, 5], [[20, 21], [22]])
        turns.append(continuation.generate_turn([1, 5], SAMPLE, [8, 3]))
        runs.append((turns, list(widths)))
    (fast, fast_widths), (hf, _) = runs
    assert [[t.tokens for t in turn] for turn in fast] == [[t.tokens for t in turn] for turn in hf]
    for a, b in zip(fast, hf):
        for x, y in zip(a, b):
            assert x.eos == y.eos and max([abs(p - q) for p, q in zip(x.logprobs, y.logprobs)] + [0.0]) < 1e-5
    assert fast[0][2].eos and fast[0][2].tokens == [EOS]  # prompt 1 ends with the trigger
    assert fast_widths[0] == (3, 5)  # one prefill of the distinct prompts
    assert max(w for _, w in fast_widths[1:]) == 5  # then chunks only: a turn's pending token and an extension
    with pytest.raises(ValueError, match="capacity of 40"):
        continuation.extend([0], [[4] * 40])


def test_turn_and_token_budgets_truncate():
    model = tiny_qwen2()
    pool = ScriptedPool(4, length=5)
    batch = run(FastGenerator(model, PAD, EOS), pool, env(max_turns=2), GREEDY)
    assert [e["turns"] for e in batch.episodes] == [2] * 4 and batch.truncated.all() and not batch.eos.any()
    assert all(len(a) == 2 for a in pool.actions)
    # 20 tokens: turn 6 + "obs1\\ns11" 8 + turn 6 = 20, then the next observation cannot fit.
    backend = Recorder(FastGenerator(model, PAD, EOS))
    batch = run(backend, ScriptedPool(4, length=5), env(max_tokens=20), GREEDY)
    assert batch.truncated.all() and batch.lengths.max() <= 20
    for r, e in enumerate(batch.episodes):
        assert e["turns"] == len(backend.turns[r]) == len(backend.extended[r]) + 1
        assert batch.lengths[r] == sum(len(t.tokens) for t in backend.turns[r]) + e["env_tokens"]
    # A turn is cut to what is left of the budget: 6 + 8 + 6 + 8 leaves 2 of 30.
    batch = run(FastGenerator(model, PAD, EOS), ScriptedPool(4, length=5), env(max_tokens=30), GREEDY)
    assert batch.lengths.tolist() == [30] * 4 and [e["turns"] for e in batch.episodes] == [3] * 4


def test_env_failure_ends_only_its_episode():
    model = tiny_qwen2()
    pool = ScriptedPool(4, fail={(1, 2): "worker timed out after 10 s", (2, 0): "reset crashed"})
    batch = run(FastGenerator(model, PAD, EOS), pool, env(), GREEDY)
    failed = [e["failed"] for e in batch.episodes]
    assert failed == [False, True, True, False]
    assert batch.episodes[1]["error"] == "worker timed out after 10 s" and batch.episodes[2]["error"] == "reset crashed"
    assert batch.episodes[0]["error"] == ""
    for r in (1, 2):
        assert batch.action_mask[r].eq(0).all() and batch.token_rewards[r].eq(0).all()
        assert batch.episodes[r]["return"] == 0.0 and not batch.episodes[r]["success"]
    assert batch.episodes[1]["turns"] == 2 and batch.lengths[1] > 0  # its tokens are there, never trained
    assert batch.episodes[2]["turns"] == 0 and batch.lengths[2] == 0
    for r in (0, 3):
        assert batch.episodes[r]["turns"] == 3 and batch.eos[r] and batch.action_mask[r].sum() > 0
    stats = AgentLoop.stats(batch)
    assert stats["env/failed"] == 2.0 and stats["env/turns_mean"] == 3.0 and stats["env/success_rate"] == 1.0


@pytest.mark.parametrize("params", [GREEDY, SAMPLE])
def test_groups_share_their_seed_and_waves_give_the_same_episodes(params):
    # Sampled too: each row draws from its own seed and token counter, whatever wave it runs in.
    model = tiny_qwen2(trigger_bias=30.0)
    pool = ScriptedPool(4)
    whole = run(FastGenerator(model, PAD, EOS), pool, env(), params)
    assert pool.resets == [[11, 11, 42, 42]] and whole.group_ids.tolist() == [0, 0, 1, 1]
    waves = ScriptedPool(3)  # one group per wave (whole groups)
    batch = run(FastGenerator(model, PAD, EOS), waves, env(), params)
    assert waves.resets == [[11, 11], [42, 42]]
    single = ScriptedPool(1)  # fewer slots than samples per prompt: one row per wave
    one = run(FastGenerator(model, PAD, EOS), single, env(), params)
    assert single.resets == [[11], [11], [42], [42]]
    for other in (batch, one):
        assert torch.equal(other.response_ids, whole.response_ids) and other.episodes == whole.episodes


@pytest.mark.parametrize("mode", ["final", "turn"])
def test_token_rewards_and_return(mode):
    model = tiny_qwen2()
    backend = Recorder(FastGenerator(model, PAD, EOS))
    rewards = (0.5, -0.25, 1.0)
    batch = run(backend, ScriptedPool(4, rewards=rewards), env(reward=mode, gamma=0.5), GREEDY)
    for r in range(batch.size):
        ends, position = [], 0
        for k, turn in enumerate(backend.turns[r]):
            position += len(turn.tokens)
            ends.append(position - 1)
            position += len(backend.extended[r][k]) if k < len(backend.extended[r]) else 0
        expected = torch.zeros(batch.response_ids.shape[1])
        if mode == "turn":
            expected[ends] = torch.tensor(rewards)
        else:
            expected[ends[-1]] = sum(rewards)
        assert torch.equal(batch.token_rewards[r], expected)
        assert batch.action_mask[r, ends].eq(1).all()
    want = 0.5 + 0.5 * -0.25 + 0.25 * 1.0 if mode == "turn" else 1.25
    assert episode_return(rewards, mode, 0.5) == want
    assert [e["return"] for e in batch.episodes] == [want] * 4 and all(e["success"] for e in batch.episodes)
    stats = AgentLoop.stats(batch)
    assert stats == {"env/turns_mean": 3.0, "env/success_rate": 1.0, "env/return_mean": want, "env/failed": 0.0,
                     "env/env_tokens_mean": stats["env/env_tokens_mean"], "env/truncated_rate": 0.0}
    assert stats["env/env_tokens_mean"] == sum(e["env_tokens"] for e in batch.episodes) / 4 > 0


def test_success_comes_from_the_terminal_info_when_given():
    model = tiny_qwen2()
    batch = run(FastGenerator(model, PAD, EOS), ScriptedPool(4, final_info={"success": False}), env(), GREEDY)
    assert all(e["return"] > 0 and not e["success"] for e in batch.episodes)
    batch = run(FastGenerator(model, PAD, EOS), ScriptedPool(4, rewards=(0.0, 0.0, 0.0)), env(), GREEDY)
    assert not any(e["success"] for e in batch.episodes)


def test_observation_ids_render_a_new_message_without_the_template_head():
    assert observation_ids(TOK, "obs1\ns2") == ids("obs1\ns2")  # the embedded template joins the contents
    chatml = build_char_tokenizer()
    chatml.chat_template = (
        "{% if messages[0]['role'] != 'system' %}<|im_start|>system\nYou are helpful.<|im_end|>\n{% endif %}"
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    assert observation_ids(chatml, "hi") == ids("\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")


def test_a_backend_without_continuations_is_an_input_error():
    class NoContinuations:
        trainer_numerics = False

    with pytest.raises(Exception, match="rollout.backend=fast or hf"):
        AgentLoop(NoContinuations(), ScriptedPool(2), TOK, env(), EOS, PAD)
