"""Supervised warm starts of the embedded model for the shipped environments (``grid``, ``tool_arith``).

The embedded model knows nothing of an environment's text, so reinforcement learning from
scratch would see no successes to learn from. As :mod:`reasonrl.warmstart.sft` does for the
embedded task, the tiny model is first trained on demonstrations, here whole episodes of the
env's scripted policy made imperfect on purpose (:data:`SPECS`):

* ``grid``: each move is an optimal one (the first move of a shortest path from where the
  agent stands, ties drawn at random) with probability ``mix``, else a uniformly random move.
  The labels are noisy, so the sampled policy is too: it wins some boards and loses others,
  and RL sharpens it.
* ``tool_arith``: a fraction ``mix`` of the demonstrations call the calculator and answer with
  its result (the env's ``demonstration``), the rest answer at once with a guess that is never
  right (its ``guess``; the guessed number itself is left out of the labels: it is noise no
  model could predict, and it disturbs the copying of the calculator's result). The sampled
  policy calls the calculator about that often, and RL raises that. Copying the expression
  into the call and the result into the answer is learnt all at once after a few hundred
  steps, and much later when most demonstrations guess, so a first phase trains on
  ``first_mix`` (95%) calling demonstrations until the sampled success reaches
  ``first_until``, and the second on ``mix`` at a tenth of the learning rate.

Each demonstration is played through the env and laid out exactly as
:class:`~reasonrl.rollout.agent_loop.AgentLoop` lays out an episode (the embedded tokenizer's
chat template only joins the message contents)::

    ids(first observation) + ids(action 1) + EOS + ids(observation 1) + ... + ids(last action) + EOS

with labels on the policy's turns only (their EOS included), -100 elsewhere
(:func:`sft_example`), and cut where the loop's budgets (``env.max_turns``, ``env.max_tokens``,
``rollout.max_new_tokens``) would cut the episode. Every ``eval_every`` steps the sampled
(temperature 1) success rate is measured with the real AgentLoop over an in-process EnvPool
on ``eval_episodes`` held-out seeds from 10**9 (the run's held-out initial states), with the
run's episode settings; training stops at the first measurement inside the spec's ``band``
(in the last phase), or after ``min(sft.max_steps, spec.max_steps)`` steps. The model (sizes,
learning rate, batch size and seed from ``sft.*``) is saved with its tokenizer under
``$REASONRL_CACHE/warmstart/env-<name>-<hash>/`` beside ``sft_summary.json`` (``success``: the
last measurement; ``history``: every one). The hash covers the env's name, arguments and tools,
the episode settings above, the ``sft`` settings, the spec and :data:`FORMAT_VERSION`; a second
call only returns the directory. :func:`reasonrl.warmstart.resolve_model_dir` picks it for
``model.path=embedded`` with such an ``env.name``.

    out = ensure_env_warm_start(cfg)          # cfg.env.name in SPECS
    json.loads((out / "sft_summary.json").read_text())["success"]
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from reasonrl.config import Config, EnvConfig
from reasonrl.warmstart.cache import build_once, cache_root
from reasonrl.warmstart.sft import sft_model, sft_step
from reasonrl.data.tokenizer import build_char_tokenizer
from reasonrl.env.base import Env
from reasonrl.env.pool import EnvPool
from reasonrl.env.registry import env_attribute, make_env
from reasonrl.env.splits import HELD_OUT_SEED
from reasonrl.errors import InputError
from reasonrl.rollout.agent_loop import AgentLoop, observation_ids
from reasonrl.rollout.fast import FastGenerator
from reasonrl.rollout.seeds import group_seed
from reasonrl.types import SamplingParams

FORMAT_VERSION = 2
"""Bump when the demonstrations, their tokenisation or the training change what a cached model is."""


@dataclass(frozen=True)
class WarmStartSpec:
    """How one environment's warm start is made."""

    mix: float
    """grid: the probability of the scripted optimal move (else a random one); tool_arith: the
    fraction of demonstrations that call the calculator (the others guess)."""
    band: tuple[float, float]
    """The intended sampled success rate: training on the noisy demonstrations stops at the first
    measurement within it."""
    first_mix: float | None = None
    """The ``mix`` of a first phase of training, on demonstrations closer to the scripted policy,
    until a measurement reaches ``first_until``; None: ``mix`` from the start. A skill that the
    noise would slow down a lot (tool_arith: copying the expression and the result, learnt all
    at once after a few hundred steps) is learnt first, and the second phase then brings the
    policy's choice (call or guess) down into the band. The first phase keeps some noise too:
    a choice that was never made (a first token always ``<``) is upset badly when it starts
    to be."""
    first_until: float = 0.0
    """The success rate that ends the first phase."""
    noisy_lr_scale: float = 1.0
    """After a first phase, ``mix``'s demonstrations are trained on at ``sft.lr`` times this (at
    the full rate the switch makes the call-or-guess choice swing from always to never)."""
    min_noisy_steps: int = 0
    """After a first phase, steps on ``mix``'s demonstrations before a measurement may stop
    training (the choice settles near ``mix`` over some tens of steps, overshooting first)."""
    max_steps: int = 600
    """Training steps at most (also at most ``sft.max_steps``)."""
    eval_every: int = 20
    """Measure the sampled success rate every N steps."""
    eval_episodes: int = 64
    """Held-out episodes of a measurement (seeds HELD_OUT_SEED ..)."""


SPECS: dict[str, WarmStartSpec] = {
    "grid": WarmStartSpec(mix=0.8, band=(0.3, 0.5), max_steps=400, eval_episodes=128),
    "tool_arith": WarmStartSpec(mix=0.4, band=(0.25, 0.5), first_mix=0.95, first_until=0.6,
                                 noisy_lr_scale=0.1, min_noisy_steps=40),
}
"""The shipped environments that have a warm start, by ``env.name``."""


@dataclass
class Demo:
    """One demonstration episode: ``observations[0]`` is the first observation, ``observations[i]``
    the one after action ``i`` (non-final actions only: ``len(observations) == len(actions)``)."""

    seed: int
    observations: list[str]
    actions: list[str]
    success: bool
    info: dict[str, Any] = field(default_factory=dict)
    unlabelled: dict[int, tuple[int, int]] = field(default_factory=dict)
    """Turn index -> the character span ``[start, end)`` of that action left out of the labels
    (a guessed number: noise no model could predict, which would only disturb the others)."""


def has_warm_start(name: str) -> bool:
    """Whether ``env.name`` is a shipped env with a warm start here."""
    return name in SPECS


def env_of(e: EnvConfig) -> Env:
    """The env of ``e`` as the run builds it (arguments and tools)."""
    return make_env(e.name, e.args, e.tools, e.tool_call_pattern, e.tool_response_format)


# --- demonstrations -----------------------------------------------------------------------------


def play(env: Env, seed: int, act: Callable[[int], str], max_turns: int) -> Demo:
    """The episode of ``seed`` with action ``act(turn)`` at each turn, for at most ``max_turns``
    turns (the agent loop's ``env.max_turns``)."""
    observation, _ = env.reset(seed)
    observations, actions, success = [observation], [], False
    for turn in range(max_turns):
        action = act(turn)
        actions.append(action)
        observation, reward, terminated, truncated, info = env.step(action)
        if terminated or truncated:
            success = bool(info.get("success", reward > 0))
            break
        if turn + 1 < max_turns:
            observations.append(observation)
    return Demo(seed, observations, actions, success)


def grid_demo(env: Env, seed: int, rng: random.Random, mix: float, max_turns: int) -> Demo:
    """A ``grid`` episode: each move the optimal one from where the agent stands with
    probability ``mix``, else a uniformly random one."""
    board = env_attribute(env, "board")(seed)
    agent = [board.start]

    def act(turn: int) -> str:
        move = rng.choice("UDLR") if rng.random() >= mix else _optimal_move(board, agent[0], rng)
        target = board.move(agent[0], move)
        if target is not None:
            agent[0] = target
        return move

    return play(env, seed, act, max_turns)


def _optimal_move(board, cell: tuple[int, int], rng: random.Random) -> str:
    """A first move of a shortest hole-free path from ``cell`` to the goal, drawn uniformly among
    all such moves (breadth-first distances to the goal); a random move when there is none."""
    dist = {board.goal: 0}
    queue = deque([board.goal])
    while queue:
        here = queue.popleft()
        for move in "UDLR":
            nxt = board.move(here, move)
            if nxt is not None and nxt not in board.holes and nxt not in dist:
                dist[nxt] = dist[here] + 1
                queue.append(nxt)
    if cell not in dist:
        return rng.choice("UDLR")
    best = [move for move in "UDLR" if (nxt := board.move(cell, move)) is not None and dist.get(nxt, -1) == dist[cell] - 1]
    return rng.choice(best)


def tool_arith_demo(env: Env, seed: int, rng: random.Random, mix: float, max_turns: int) -> Demo:
    """A ``tool_arith`` episode: with probability ``mix`` the env's ``demonstration`` (calculator
    call, then its result as the answer), else its ``guess`` (a wrong answer at once)."""
    uses_tool = rng.random() < mix
    turns = env_attribute(env, "demonstration" if uses_tool else "guess")(seed)
    demo = play(env, seed, lambda turn: turns[min(turn, len(turns) - 1)], min(max_turns, len(turns)))
    demo.info["tool"] = uses_tool
    if not uses_tool:  # the guessed number is not trained on: only that it answers at once
        for i, action in enumerate(demo.actions):
            number = _NUMBER.search(action)
            if number:
                demo.unlabelled[i] = number.span()
    return demo


_NUMBER = re.compile(r"-?\d[\d,.]*")


DEMOS: dict[str, Callable[[Env, int, random.Random, float, int], Demo]] = {
    "grid": grid_demo,
    "tool_arith": tool_arith_demo,
}


def demonstrations(e: EnvConfig, seeds: range, mix: float, rng: random.Random) -> list[Demo]:
    """One noisy demonstration per seed of ``e.name`` (see the module)."""
    env = env_of(e)
    try:
        return [DEMOS[e.name](env, seed, rng, mix, e.max_turns) for seed in seeds]
    finally:
        close = getattr(env, "close", None)
        if callable(close):
            close()


def sft_example(demo: Demo, tokenizer, eos_id: int, max_tokens: int | None = None,
                max_new_tokens: int | None = None) -> tuple[list[int], list[int]]:
    """``(input_ids, labels)`` of ``demo`` laid out as the agent loop lays out an episode (see the
    module): labels are the ids on the policy's turns (their EOS included), -100 on the
    prompt, the observations and a turn's ``demo.unlabelled`` span. With ``max_tokens``
    (``env.max_tokens``) and ``max_new_tokens`` (``rollout.max_new_tokens``) the example ends where the agent loop's budgets would end the
    episode: before a turn longer than the tokens it may sample, before an observation that
    leaves no room for a policy token."""
    ids = list(tokenizer(demo.observations[0])["input_ids"])
    labels = [-100] * len(ids)
    prompt = len(ids)
    for i, action in enumerate(demo.actions):
        turn, turn_labels = _turn_ids(tokenizer, action, demo.unlabelled.get(i), eos_id)
        limit = min(max_new_tokens or len(turn), (max_tokens or len(ids) + len(turn)) - (len(ids) - prompt))
        if len(turn) > limit:
            break
        ids += turn
        labels += turn_labels
        if i + 1 < len(demo.actions):
            observation = observation_ids(tokenizer, demo.observations[i + 1])
            if max_tokens is not None and len(ids) - prompt + len(observation) >= max_tokens:
                break
            ids += observation
            labels += [-100] * len(observation)
    return ids, labels


def _turn_ids(tokenizer, action: str, unlabelled: tuple[int, int] | None, eos_id: int) -> tuple[list[int], list[int]]:
    """A turn's ids (EOS appended) and labels: the ids, -100 on the ``unlabelled`` character span
    (tokenised apart from the rest, exact for the character tokenizer)."""
    def encode(text: str) -> list[int]:
        return list(tokenizer(text, add_special_tokens=False)["input_ids"]) if text else []

    if unlabelled is None:
        ids = encode(action) + [eos_id]
        return ids, list(ids)
    start, end = unlabelled
    head, middle, tail = encode(action[:start]), encode(action[start:end]), encode(action[end:]) + [eos_id]
    return head + middle + tail, head + [-100] * len(middle) + tail


def _labelled(examples: list[tuple[list[int], list[int]]]) -> list[tuple[list[int], list[int]]]:
    """The examples with at least one label (one cut before its first turn teaches nothing)."""
    return [x for x in examples if any(label != -100 for label in x[1])]


def _batch(examples: list[tuple[list[int], list[int]]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded input ids, labels (-100 on padding) and attention mask."""
    L = max(len(ids) for ids, _ in examples)
    input_ids = torch.tensor([ids + [pad_id] * (L - len(ids)) for ids, _ in examples])
    labels = torch.tensor([lab + [-100] * (L - len(lab)) for _, lab in examples])
    attn = torch.tensor([[1] * len(ids) + [0] * (L - len(ids)) for ids, _ in examples])
    return input_ids, labels, attn


# --- measurement ---------------------------------------------------------------------------------


def sampled_success(model, tokenizer, e: EnvConfig, seeds: list[int], max_new_tokens: int,
                    sample_seed: int, temperature: float = 1.0) -> tuple[float, list[dict[str, Any]]]:
    """The success rate of ``model``'s sampled episodes from ``seeds`` (one each), run by the real
    :class:`~reasonrl.rollout.agent_loop.AgentLoop` over an in-process :class:`EnvPool`, episode
    ``i`` sampling with the group seed ``group_seed(sample_seed, i)``; also the episodes' records."""
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    backend = FastGenerator(model, pad, eos)
    prompts = []
    env = env_of(e)
    try:
        for seed in seeds:
            observation, _ = env.reset(seed)
            prompts.append(list(tokenizer(observation)["input_ids"]))
    finally:
        close = getattr(env, "close", None)
        if callable(close):
            close()
    params = SamplingParams(temperature=temperature, max_new_tokens=max_new_tokens)
    with EnvPool(e.name, e.args, size=len(seeds), tools=e.tools, tool_call_pattern=e.tool_call_pattern,
                 tool_response_format=e.tool_response_format) as pool:
        loop = AgentLoop(backend, pool, tokenizer, e, (eos,), pad)
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                batch = loop.generate(prompts, 1, params, [group_seed(sample_seed, i) for i in range(len(seeds))],
                                      list(seeds))
        finally:
            model.train(was_training)
    episodes = batch.episodes or []
    return sum(bool(ep.get("success")) for ep in episodes) / max(1, len(episodes)), episodes


# --- the cached warm start -----------------------------------------------------------------------


def _key(cfg: Config) -> dict[str, Any]:
    """What a cached env warm start depends on."""
    e = cfg.env
    return {
        "env": e.name,
        "args": e.args,
        "tools": list(e.tools),
        "tool_call_pattern": e.tool_call_pattern,
        "tool_response_format": e.tool_response_format,
        "max_turns": e.max_turns,
        "max_tokens": e.max_tokens,
        "max_new_tokens": cfg.rollout.max_new_tokens,
        "sft": asdict(cfg.sft),
        "spec": asdict(SPECS[e.name]),
        "v": FORMAT_VERSION,
    }


def env_warm_start_dir(cfg: Config) -> Path:
    """Where the warm start of ``cfg.env`` is cached (see the module)."""
    key = json.dumps(_key(cfg), sort_keys=True, default=str)
    return cache_root() / "warmstart" / f"env-{cfg.env.name}-{hashlib.sha256(key.encode()).hexdigest()[:16]}"


def ensure_env_warm_start(cfg: Config, log: Callable[[str], None] = print) -> Path:
    """The cached warm-start model directory of ``cfg.env.name`` (a key of :data:`SPECS`), training
    it first if it is not there yet."""
    if cfg.env.name not in SPECS:
        raise ValueError(f"env.name = {cfg.env.name!r} has no warm start; expected one of {', '.join(SPECS)}")
    out = env_warm_start_dir(cfg)
    if not (out / "sft_summary.json").is_file():
        log(f"warm start: training the embedded model on {cfg.env.name} demonstrations (cached in {out})")
    return build_once(out, lambda tmp: train_env_sft(cfg, tmp, log))


def train_env_sft(cfg: Config, out_dir: Path, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Train on demonstrations of ``cfg.env`` until the sampled held-out success rate is in the
    spec's band (or the step limit; see the module); save the model and tokenizer to
    ``out_dir``; return the summary. Runs on one torch thread (restored after): the tiny
    model's products gain little from more, and on a busy machine more threads are many times
    slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _train(cfg, out_dir, log)
    finally:
        torch.set_num_threads(threads)


def _train(cfg: Config, out_dir: Path, log: Callable[[str], None]) -> dict[str, Any]:
    e, s, spec = cfg.env, cfg.sft, SPECS[cfg.env.name]
    start = time.time()
    tokenizer = build_char_tokenizer()
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    model = sft_model(s, tokenizer)
    max_steps = min(s.max_steps, spec.max_steps)
    count = s.batch_size * max_steps // 4 + s.batch_size
    rng = random.Random(s.seed)
    noisy = demonstrations(e, range(count), spec.mix, rng)
    first = demonstrations(e, range(count, 2 * count), spec.first_mix, rng) if spec.first_mix is not None else []
    limits = (e.max_tokens, cfg.rollout.max_new_tokens)
    noisy_examples = _labelled([sft_example(d, tokenizer, eos, *limits) for d in noisy])
    first_examples = _labelled([sft_example(d, tokenizer, eos, *limits) for d in first])
    longest_turn = max(len(tokenizer(a)["input_ids"]) + 1 for d in noisy + first for a in d.actions)
    if longest_turn > cfg.rollout.max_new_tokens:
        log(f"warm start: {e.name} demonstration turns take up to {longest_turn} tokens, more than "
            f"rollout.max_new_tokens = {cfg.rollout.max_new_tokens}: sampled turns will be cut")
    if not noisy_examples or (first and not first_examples):
        raise InputError(f"warm start of env {e.name}: no demonstration has a turn within the episode budgets "
                         f"(rollout.max_new_tokens = {cfg.rollout.max_new_tokens}, env.max_tokens = {e.max_tokens}; "
                         f"turns take up to {longest_turn} tokens)")
    seeds = list(range(HELD_OUT_SEED, HELD_OUT_SEED + spec.eval_episodes))
    opt = torch.optim.AdamW(model.parameters(), lr=s.lr, weight_decay=0.0)
    gen = torch.Generator().manual_seed(s.seed)
    history, success, step, switched = [], 0.0, 0, None
    phase = "first" if first_examples else "noisy"
    for step in range(1, max_steps + 1):
        examples = first_examples if phase == "first" else noisy_examples
        idx = torch.randint(len(examples), (s.batch_size,), generator=gen).tolist()
        input_ids, labels, attn = _batch([examples[i] for i in idx], pad)
        for group in opt.param_groups:
            group["lr"] = s.lr * min(1.0, step / 20) * (spec.noisy_lr_scale if switched else 1.0)
        loss = sft_step(model, opt, input_ids, labels, attn)
        if step % spec.eval_every == 0 or step == max_steps:
            success, _ = sampled_success(model, tokenizer, e, seeds, cfg.rollout.max_new_tokens, s.seed + step)
            history.append([step, phase, round(success, 4)])
            log(f"warm start step {step} ({phase} phase): loss {loss.item():.3f}, "
                f"sampled held-out success {success:.3f}")
            if phase == "first" and success >= spec.first_until:
                phase, switched = "noisy", step
            elif (phase == "noisy" and spec.band[0] <= success <= spec.band[1]
                  and step - (switched or 0) >= spec.min_noisy_steps):
                break
    if not spec.band[0] <= success <= spec.band[1]:
        log(f"warm start: {e.name} stopped after {step} steps at sampled success {success:.3f}, outside the "
            f"intended {spec.band[0]}-{spec.band[1]} (a larger sft.max_steps or an easier env.args may reach it)")
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return {
        "env": e.name,
        "env_args": e.args,
        "steps": step,
        "success": success,
        "band": list(spec.band),
        "in_band": spec.band[0] <= success <= spec.band[1],
        "eval_episodes": spec.eval_episodes,
        "mix": spec.mix,
        "first_mix": spec.first_mix,
        "first_steps": switched,
        "demo_success": round(sum(d.success for d in noisy) / len(noisy), 4),
        "history": history,
        "seconds": round(time.time() - start, 1),
        "params": sum(p.numel() for p in model.parameters()),
    }
