"""Environments for tests, loaded by import path (env.name=tests.env_fixtures:NAME)."""

from __future__ import annotations

import os
import random
import time


class Faulty:
    """A reasonrl Env that misbehaves on request: the action ``raise`` raises, ``hang`` sleeps
    30 s, ``exit`` ends its process, ``lambda`` returns an info that does not pickle, ``win``
    ends the episode with reward 1; any other action is echoed with the turn number. A negative
    reset seed raises. ``demonstration`` plays ``script``."""

    def __init__(self, script: tuple[str, ...] = ("win",)):
        self.script = list(script)
        self.turn = 0

    def reset(self, seed):
        if seed < 0:
            raise ValueError("negative seed")
        self.turn = 0
        return f"seed {seed}", {}

    def step(self, action):
        self.turn += 1
        if action == "raise":
            raise ValueError("boom")
        if action == "hang":
            time.sleep(30)
        if action == "exit":
            os._exit(3)
        if action == "lambda":
            return "x", 0.0, False, False, {"f": lambda: 0}
        if action == "win":
            return "won", 1.0, True, False, {"success": True}
        return f"{action} {self.turn}", 0.0, False, False, {}

    def demonstration(self, seed):
        return self.script


class WrongReward(Faulty):
    """Returns its reward as text."""

    def step(self, action):
        return "x", "1", False, False, {}


class Unseeded(Faulty):
    """A first observation drawn from the ``random`` module, whatever the seed."""

    def reset(self, seed):
        return f"start {random.random()}", {}


class SeedIgnored(Faulty):
    """The same first observation for every seed."""

    def reset(self, seed):
        return "start", {}


class GuessNumber:
    """Guess the number 0..9 that the seed picks: the first observation is the same for every
    seed, the seed shows only in the replies and rewards."""

    def reset(self, seed):
        self.secret = seed % 10
        return "guess a number 0..9", {}

    def step(self, action):
        guess = action.strip()
        if guess == str(self.secret):
            return "right", 1.0, True, False, {"success": True}
        higher = guess.isdigit() and int(guess) < self.secret
        return ("higher" if higher else "lower"), 0.0, False, False, {}

    def demonstration(self, seed):
        return [str(seed % 10)]

    def sample_action(self, rng):
        return str(rng.randrange(10))


class NoisyStep(Faulty):
    """Seeded resets, but steps drawn from the ``random`` module."""

    def step(self, action):
        return f"{random.random()}", 0.0, False, False, {}


class NeedsLevel:
    """An env whose constructor needs ``level``."""

    def __init__(self, level: int):
        self.level = level

    def reset(self, seed):
        return f"level {self.level}", {}

    def step(self, action):
        return "done", 0.0, True, False, {}


class Exploding:
    """An env whose constructor fails."""

    def __init__(self):
        raise RuntimeError("no GPU here")


class NotAnEnv:
    """A class with neither reset nor step."""


class GemLike:
    """Gymnasium's keyword API without gymnasium (as GEM's environments): ``reset(seed=...,
    options=...)``, and a step that returns a list instead of a tuple on ``list``."""

    def reset(self, seed=None, options=None):
        self.seed = seed
        return f"gem {seed}", {"options": options}

    def step(self, action):
        if action == "list":
            return ["x", 0.0, True, False, {}]
        return f"{self.seed}:{action}", 0.5, True, False, {}


def __getattr__(name):
    """``TextGym``, defined on first use: gymnasium (0.4 s to import) is imported only by the
    tests that need it, not by every env worker that loads this module."""
    if name != "TextGym":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import gymnasium
    import numpy as np

    class TextGym(gymnasium.Env):
        """A text ``gymnasium.Env``: the first observation is a number drawn from the seeded
        ``np_random``; a step returns numpy's float and bool types."""

        observation_space = gymnasium.spaces.Text(64)
        action_space = gymnasium.spaces.Text(64)

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            self.start = int(self.np_random.integers(1000))
            return f"start {self.start}", {}

        def step(self, action):
            return f"{self.start} {action}", np.float32(0.5), np.bool_(action == "stop"), np.bool_(False), {}

    globals()["TextGym"] = TextGym
    return TextGym


class FlakyBySeed:
    """A reasonrl Env whose episodes of some seeds break: seed % 5 == 1 hangs at its first
    step, seed % 5 == 2 raises there; any other episode ends at its first step with reward 1
    when the action starts with a digit, else 0."""

    def reset(self, seed):
        self.seed = seed
        return f"{seed % 10}?", {}

    def step(self, action):
        if self.seed % 5 == 1:
            time.sleep(60)
        if self.seed % 5 == 2:
            raise RuntimeError(f"broken board {self.seed}")
        won = action[:1].isdigit()
        return "done", float(won), True, False, {"success": won}


class HangingReset(Faulty):
    """reset(3) hangs (sleeps 600 s); the other seeds answer."""

    def reset(self, seed):
        if seed == 3:
            time.sleep(600)
        return super().reset(seed)


class HugeObservation(Faulty):
    """Every reset returns an observation of 2,000,000 characters."""

    def reset(self, seed):
        super().reset(seed)
        return "x" * 2_000_000, {}


class RaisingReset(Faulty):
    """reset(1) raises."""

    def reset(self, seed):
        if seed == 1:
            raise RuntimeError("no board for seed 1")
        return super().reset(seed)


class RecordsItsProcess(GuessNumber):
    """GuessNumber, built in a process that appends ``pid ppid actor`` to the file ``log`` (one
    line per environment built; ``actor``: the Ray actor's id where the process is one, else
    ``-``): where an environment worker runs shows there."""

    def __init__(self, log: str):
        import sys

        ray = sys.modules.get("ray")
        actor = ray.get_runtime_context().get_actor_id() if ray is not None and ray.is_initialized() else None
        with open(log, "a") as f:
            f.write(f"{os.getpid()} {os.getppid()} {actor or '-'}\n")
