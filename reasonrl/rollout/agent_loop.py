"""Multi-turn episodes: the policy and an environment take turns, token ids in, token ids out.

    loop = AgentLoop(backend, pool, tokenizer, cfg.env, eos_ids, pad_id)
    batch = loop.generate(prompts, n, params, seeds, reset_seeds)   # a RolloutBatch of episodes

Row ``i * n + j`` is sample ``j`` of prompt ``i``: an episode of environment slot ``i * n + j``
(of its wave, below) reset with ``reset_seeds[i]``, so the ``n`` samples of a prompt are a group of
trajectories from one initial state. Its policy tokens are sampled with the row's seed
(``seeds[i]`` and ``j``, :func:`~reasonrl.rollout.seeds.row_seeds`), the ``t``-th of the
episode with ``uniforms(row seed, t)``: the same whatever wave or batch the episode runs in. Its trajectory is::

    prompt_i | turn_1  obs_1  turn_2  obs_2 ... turn_K
               ^ policy (sampled ids, EOS included)   ^ environment (observation_ids(obs_k))

Every id is kept as it was sampled or encoded, never re-tokenised from text: the prompt ids
given are the trajectory's start (the reset observation's text is not used), each turn is the
backend continuation's sampled ids (:meth:`~reasonrl.rollout.hf.Continuation.generate_turn`), each
observation is appended to the continuation as ids (:meth:`~reasonrl.rollout.hf.Continuation.extend`:
the fast backend feeds them into the key/value cache without encoding the prefix again). The
text the environment sees is the turn's ids decoded with special tokens skipped.

An episode ends when the environment says terminated (``eos``) or truncated, after
``env.max_turns`` turns, or when the next observation would leave no room for one policy
token within ``env.max_tokens`` (the tokens after the prompt, the policy's and the
environment's): the last two are truncations and the observation is not appended (neither
is the observation after the last turn). Each turn samples at most
``min(params.max_new_tokens, env.max_tokens - tokens so far)`` tokens. A failure of the
environment (an ``EnvFailure`` at reset or step) ends that episode only, as failed: its
action mask is zeroed (never trained), its return is 0 and ``error`` its message.

With ``B`` rows and ``S = pool.size`` slots, episodes run in waves of ``S`` rows (rounded
down to whole groups when ``S >= n``), each wave one continuation; ``reset_many`` gets one seed per
row of the wave (slots ``0 .. w-1``) and ``step_many`` one action per slot (None: inactive).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from reasonrl.config import EnvConfig
from reasonrl.errors import InputError
from reasonrl.rollout.hf import Continuation, Turn, eos_tuple, pad_prompts
from reasonrl.rollout.seeds import check_seeds, row_seeds
from reasonrl.types import RolloutBatch, SamplingParams

SYSTEM_PLACEHOLDER = {"role": "system", "content": ""}
"""Stands for whatever a chat template puts before the first message (see :func:`observation_ids`)."""


def observation_ids(tokenizer: Any, text: str, role: str = "user") -> list[int]:
    """The token ids that an environment observation ``text`` appends to a trajectory.

    With a chat template, the rendering of a new ``role`` message with the generation prompt
    and without what the template puts before the first message (Qwen's default system
    prompt, Llama 3's BOS and system header): with ``s`` an empty system message standing in
    for that and ``m = {"role": role, "content": text}``::

        A = render([s]),   B = render([s, m], add_generation_prompt=True)
        ids = tokenize(B[len(A.rstrip()):], add_special_tokens=False)

    so the ids are the whitespace the template writes after a message's end marker (Qwen's
    ``\\n`` after the policy's ``<|im_end|>``), the message's block and the assistant header:
    ``\\n<|im_start|>user\\n{text}<|im_end|>\\n<|im_start|>assistant\\n`` for Qwen2.5. Without a
    template: ``text``'s ids (no special tokens). The embedded character tokenizer's template
    joins the contents (A is empty), so both give ``text``'s character ids.
    """
    if not getattr(tokenizer, "chat_template", None):
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])
    head = tokenizer.apply_chat_template([SYSTEM_PLACEHOLDER], tokenize=False)
    full = tokenizer.apply_chat_template(
        [SYSTEM_PLACEHOLDER, {"role": role, "content": text}], tokenize=False, add_generation_prompt=True
    )
    if not full.startswith(head):
        raise InputError(f"the tokenizer's chat template renders a system message and a {role} message "
                         f"not as the system message's rendering followed by more ({head!r} vs {full[:len(head)]!r}): "
                         "it cannot render an observation on its own")
    return list(tokenizer(full[len(head.rstrip()):], add_special_tokens=False)["input_ids"])


def episode_return(rewards: Sequence[float], mode: str, gamma: float) -> float:
    """``sum_t gamma**t * r_t`` (turns t = 0, 1, ...) for ``env.reward=turn``, else ``sum_t r_t``."""
    if mode == "turn":
        return float(sum(gamma**t * r for t, r in enumerate(rewards)))
    return float(sum(rewards))


@dataclass
class Episode:
    """One row's trajectory while it runs, then what it ended with."""

    ids: list[int] = field(default_factory=list)
    """The response: turns and observations, concatenated."""
    logprobs: list[float] = field(default_factory=list)
    """Sampling log-probs on the policy's tokens, 0 on the environment's."""
    action: list[bool] = field(default_factory=list)
    """True on the policy's tokens."""
    turn_ends: list[int] = field(default_factory=list)
    """Index in ``ids`` of each turn's last token."""
    rewards: list[float] = field(default_factory=list)
    """Each turn's reward."""
    env_tokens: int = 0
    terminated: bool = False
    truncated: bool = False
    error: str = ""
    info: dict = field(default_factory=dict)
    """The last step's info."""

    def add_turn(self, turn: Turn) -> None:
        self.ids += turn.tokens
        self.logprobs += turn.logprobs
        self.action += [True] * len(turn.tokens)
        self.turn_ends.append(len(self.ids) - 1)

    def add_observation(self, ids: list[int]) -> None:
        self.ids += ids
        self.logprobs += [0.0] * len(ids)
        self.action += [False] * len(ids)
        self.env_tokens += len(ids)

    @property
    def failed(self) -> bool:
        return bool(self.error)

    def record(self, mode: str, gamma: float) -> dict[str, Any]:
        """What ``RolloutBatch.episodes`` holds for the row."""
        ret = 0.0 if self.failed else episode_return(self.rewards, mode, gamma)
        success = bool(self.info.get("success", ret > 0)) and not self.failed
        return {"return": ret, "success": success, "failed": self.failed, "turns": len(self.turn_ends),
                "error": self.error, "env_tokens": self.env_tokens}

    def token_rewards(self, mode: str) -> list[tuple[int, float]]:
        """``(index, reward)`` pairs: each turn's reward on its last token (``turn``), or the
        return on the last policy token (``final``); none for a failed episode."""
        if self.failed or not self.turn_ends:
            return []
        if mode == "turn":
            return list(zip(self.turn_ends, self.rewards))
        return [(self.turn_ends[-1], float(sum(self.rewards)))]


def unpack(result: Any, size: int, slot: int) -> tuple[tuple | None, str]:
    """``(the pool's tuple, "")`` for a ``size``-tuple, else ``(None, why)``: an EnvFailure's message,
    or what was wrong with the result."""
    if isinstance(result, tuple) and len(result) == size and not hasattr(result, "message"):
        return result, ""
    if hasattr(result, "message"):
        return None, str(result.message)
    return None, f"env slot {slot}: expected a {size}-tuple or an EnvFailure from the pool, got {type(result).__name__}"


class AgentLoop:
    """Generates multi-turn episodes with a backend's continuation and an environment pool (see
    the module docstring).

    ``backend``: a FastGenerator or HFGenerator (anything with ``model`` and ``start(prompts,
    n, capacity, rows, eos_ids) -> Continuation``: capacity ``env.max_tokens``, ``rows`` the row seeds); ``pool``: an EnvPool (``size``, ``reset_many``, ``step_many``);
    ``tokenizer``: the policy's (decodes turns, encodes observations: :func:`observation_ids`);
    turns end on any of ``eos_ids``; responses are padded with ``pad_id``.
    """

    streams = False
    episodic = True

    def __init__(self, backend: Any, pool: Any, tokenizer: Any, env_cfg: EnvConfig, eos_ids: int | Sequence[int],
                 pad_id: int) -> None:
        if not hasattr(backend, "start"):
            raise InputError(f"env.name = {env_cfg.name!r}: multi-turn episodes need a rollout backend with continuations "
                             f"(rollout.backend=fast or hf, rollout.interrupt=false); got {type(backend).__name__}")
        if pool.size < 1:
            raise ValueError(f"pool.size: expected at least one environment slot, got {pool.size}")
        self.backend = backend
        self.pool = pool
        self.tokenizer = tokenizer
        self.cfg = env_cfg
        self.eos_ids = eos_tuple(eos_ids)
        self.pad_id = pad_id
        self.trainer_numerics = backend.trainer_numerics

    def load_weights(self, tensors: dict[str, torch.Tensor]) -> None:
        self.backend.load_weights(tensors)

    def generate(
        self, prompts: list[list[int]], n: int, params: SamplingParams, seeds: Sequence[int], reset_seeds: Sequence[int]
    ) -> RolloutBatch:
        """``n`` episodes per prompt: ``prompts[i]`` the ids of prompt ``i``'s first observation
        as the chat template renders it, its environments reset with ``reset_seeds[i]``, its
        policy tokens sampled with the group seed ``seeds[i]`` (module docstring).

        The batch (see :class:`~reasonrl.types.RolloutBatch`): ``response_ids`` the
        trajectories after their prompts, ``response_mask`` 1 on all their tokens,
        ``action_mask`` 1 on the policy's (0 on a failed row), ``logprobs`` the sampling
        log-probs there and 0 on the environment's tokens; ``eos``: the environment
        terminated the episode; ``truncated``: it truncated it or a budget did (both False
        on a failed row); ``versions`` 0 (the rollout worker stamps them);
        ``token_rewards``: ``env.reward=final``: the return ``sum_t r_t`` on the last policy
        token, ``turn``: each ``r_t`` on turn ``t``'s last token (0 on a failed row);
        ``episodes``: per row ``return`` (``env.reward=turn``: ``sum_t env.gamma**t r_t``,
        else ``sum_t r_t``; 0 when failed), ``success`` (the last step's
        ``info["success"]`` when given, else ``return > 0``; False when failed), ``failed``,
        ``turns`` (policy turns sampled, a failed step's included), ``error`` (the
        EnvFailure's message, "" when none) and ``env_tokens`` (environment tokens in the
        response).
        """
        check_seeds(seeds, prompts)
        if len(reset_seeds) != len(prompts):
            raise ValueError(f"reset_seeds: expected one reset seed per prompt ({len(prompts)}), got {len(reset_seeds)}")
        rows = row_seeds(seeds, n)
        episodes: list[Episode] = []
        for lo, hi in self._waves(len(prompts) * n, n):
            episodes += self._wave(prompts, n, reset_seeds, rows[lo:hi], lo, hi, params)
        return self._assemble(prompts, n, episodes)

    def _waves(self, B: int, n: int) -> list[tuple[int, int]]:
        """Row ranges ``[lo, hi)`` of at most ``pool.size`` rows, whole groups when ``pool.size >= n``."""
        size = self.pool.size // n * n if self.pool.size >= n else self.pool.size
        return [(lo, min(lo + size, B)) for lo in range(0, B, size)]

    def _continuation(self, prompts: list[list[int]], n: int, rows: torch.Tensor, lo: int, hi: int) -> Continuation:
        """The continuation of rows ``lo .. hi - 1`` with row seeds ``rows`` (each distinct prompt
        encoded once when they are whole groups)."""
        if lo % n == 0 and hi % n == 0:
            return self.backend.start(prompts[lo // n : hi // n], n, self.cfg.max_tokens, rows, self.eos_ids)
        return self.backend.start([prompts[r // n] for r in range(lo, hi)], 1, self.cfg.max_tokens, rows, self.eos_ids)

    def _wave(self, prompts, n, reset_seeds, rows: torch.Tensor, lo: int, hi: int, params: SamplingParams) -> list[Episode]:
        """The episodes of rows ``lo .. hi - 1`` (row seeds ``rows``) on pool slots ``0 .. hi - lo - 1``."""
        continuation = self._continuation(prompts, n, rows, lo, hi)
        episodes = [Episode() for _ in range(lo, hi)]
        resets = self.pool.reset_many([reset_seeds[r // n] for r in range(lo, hi)])
        live = []
        for slot, episode in enumerate(episodes):
            _, episode.error = unpack(resets[slot], 2, slot)
            if not episode.failed:
                live.append(slot)
        while live:
            live = self._turn(continuation, episodes, live, params)
        return episodes

    def _turn(self, continuation: Continuation, episodes: list[Episode], live: list[int], params: SamplingParams) -> list[int]:
        """One turn of the ``live`` slots: sample, step, append the observations that fit; the slots still live."""
        limits = {k: min(params.max_new_tokens, self.cfg.max_tokens - len(episodes[k].ids)) for k in live}
        for k in [k for k in live if limits[k] <= 0]:
            episodes[k].truncated = True
        live = [k for k in live if limits[k] > 0]
        if not live:
            return []
        actions: list[str | None] = [None] * self.pool.size
        for k, turn in zip(live, continuation.generate_turn(live, params, [limits[k] for k in live])):
            episodes[k].add_turn(turn)
            actions[k] = self.tokenizer.decode(turn.tokens, skip_special_tokens=True)
        results = self.pool.step_many(actions)
        going, observations = [], []
        for k in live:
            ids = self._step(episodes[k], results[k], k)
            if ids is not None:
                episodes[k].add_observation(ids)
                going.append(k)
                observations.append(ids)
        if going:
            continuation.extend(going, observations)
        return going

    def _step(self, episode: Episode, result: Any, slot: int) -> list[int] | None:
        """Record a step's result in ``episode``; the observation's ids when the episode goes on."""
        step, episode.error = unpack(result, 5, slot)
        if episode.failed:
            return None
        observation, reward, terminated, truncated, info = step
        episode.rewards.append(float(reward))
        episode.info = dict(info or {})
        if terminated or truncated:
            episode.terminated, episode.truncated = bool(terminated), bool(truncated) and not terminated
            return None
        if len(episode.turn_ends) >= self.cfg.max_turns:
            episode.truncated = True
            return None
        if not isinstance(observation, str):
            episode.error = f"env slot {slot}: expected a text observation, got {type(observation).__name__}"
            return None
        ids = observation_ids(self.tokenizer, observation)
        if len(episode.ids) + len(ids) >= self.cfg.max_tokens:  # no room left for a policy token
            episode.truncated = True
            return None
        return ids

    def _assemble(self, prompts: list[list[int]], n: int, episodes: list[Episode]) -> RolloutBatch:
        """The RolloutBatch of the episodes (rows in order), on the backend's device."""
        B, T = len(episodes), max([len(e.ids) for e in episodes] + [0])
        ids = torch.full((B, T), self.pad_id, dtype=torch.long)
        mask, action, logprobs, rewards = (torch.zeros((B, T)) for _ in range(4))
        for r, e in enumerate(episodes):
            L = len(e.ids)
            ids[r, :L] = torch.tensor(e.ids, dtype=torch.long)
            mask[r, :L] = 1.0
            logprobs[r, :L] = torch.tensor(e.logprobs)
            if not e.failed:
                action[r, :L] = torch.tensor(e.action, dtype=torch.float)
            for index, reward in e.token_rewards(self.cfg.reward):
                rewards[r, index] = reward
        prompt_ids, prompt_mask = pad_prompts(prompts, n, self.pad_id)
        device = next(self.backend.model.parameters()).device
        batch = RolloutBatch(
            prompt_ids=prompt_ids,
            prompt_mask=prompt_mask,
            response_ids=ids,
            response_mask=mask,
            logprobs=logprobs,
            eos=torch.tensor([e.terminated and not e.failed for e in episodes]),
            truncated=torch.tensor([e.truncated and not e.failed for e in episodes]),
            group_ids=torch.arange(B) // n,
            versions=torch.zeros((B, T), dtype=torch.long),
            action_mask=action,
            token_rewards=rewards,
        )
        for name in ("prompt_ids", "prompt_mask", "response_ids", "response_mask", "logprobs", "eos", "truncated",
                     "group_ids", "versions", "action_mask", "token_rewards"):
            setattr(batch, name, getattr(batch, name).to(device))
        batch.episodes = [e.record(self.cfg.reward, self.cfg.gamma) for e in episodes]
        return batch

    @staticmethod
    def stats(batch: RolloutBatch) -> dict[str, float]:
        """Episode metrics of a batch: ``env/failed`` the number of failed episodes; the
        others means over the episodes that did not fail (0 when none): ``env/turns_mean``,
        ``env/success_rate``, ``env/return_mean``, ``env/env_tokens_mean`` (environment tokens
        in the response), ``env/truncated_rate``."""
        episodes = batch.episodes or []
        ok = [r for r, e in enumerate(episodes) if not e["failed"]]
        truncated = batch.truncated.tolist()

        def mean(values: list[float]) -> float:
            return float(sum(values) / len(values)) if values else 0.0

        return {
            "env/turns_mean": mean([episodes[r]["turns"] for r in ok]),
            "env/success_rate": mean([float(episodes[r]["success"]) for r in ok]),
            "env/return_mean": mean([episodes[r]["return"] for r in ok]),
            "env/failed": float(len(episodes) - len(ok)),
            "env/env_tokens_mean": mean([episodes[r]["env_tokens"] for r in ok]),
            "env/truncated_rate": mean([float(truncated[r]) for r in ok]),
        }
