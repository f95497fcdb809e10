"""Reward functions for tests, loaded by import path (reward.fn=tests.reward_fixtures:NAME)."""

import hashlib
import os
import sys
import time


def coin(response: str, ground_truth: str) -> dict:
    """Correct for about half of all responses, decided by a hash of the text (deterministic)."""
    ok = hashlib.sha256(response.encode()).digest()[0] % 2 == 0
    return {"score": 1.0 if ok else -1.0, "acc": ok}


def reports_its_modules(response: str, ground_truth: str) -> dict:
    """Scores 0 and says whether this process holds torch and transformers' Llama module."""
    return {"score": 0.0, "torch": "torch" in sys.modules,
            "transformers": "transformers.models.llama.modeling_llama" in sys.modules}


def hangs_on_empty(response: str, ground_truth: str) -> dict:
    """Appends this process's id to the file $REWARD_PIDS, then hangs on an empty response and
    scores 0 on any other."""
    with open(os.environ["REWARD_PIDS"], "a") as f:
        f.write(f"{os.getpid()}\n")
    if not response:
        time.sleep(3600)
    return {"score": 0.0}


def never(response: str, ground_truth: str) -> dict:
    return {"score": -1.0, "acc": False}


def broken(response: str, ground_truth: str) -> dict:
    raise RuntimeError("broken reward function")


def by_row(response: str, ground_truth: str, data_source: str, extra_info: dict | None = None) -> dict:
    """Right when the response names the row's data source and its extra_info index; reports
    the response's length as an extra field."""
    index = (extra_info or {}).get("index")
    ok = response == f"{data_source}:{index}"
    return {"score": 1.0 if ok else -1.0, "acc": ok, "pred": response, "chars": len(response)}


def every_field(response: str, ground_truth: str, **row) -> dict:
    """Scores the number of row fields it was given, and lists their names."""
    return {"score": float(len(row)), "pred": ",".join(sorted(row))}


def sleepy(response: str, ground_truth: str) -> dict:
    """Hangs (30 s) on the response ``sleep``; otherwise right when the response is the ground truth."""
    if response == "sleep":
        time.sleep(30)
    ok = response == ground_truth
    return {"score": 1.0 if ok else -1.0, "acc": ok}


def slow_coin(response: str, ground_truth: str) -> dict:
    """``coin``, 10 ms a response: a tiny run's steps last long enough to be caught mid-way."""
    time.sleep(0.01)
    return coin(response, ground_truth)


def torch_threads(response: str, ground_truth: str) -> dict:
    """Right when the response is the ground truth; reports the torch threads of the grading process."""
    import torch

    return {"score": 1.0 if response == ground_truth else -1.0, "threads": torch.get_num_threads()}


def exits(response: str, ground_truth: str) -> dict:
    """Calls sys.exit(3): a reward function that ends its process instead of returning."""
    import sys

    sys.exit(3)


def interrupts(response: str, ground_truth: str) -> dict:
    """Raises KeyboardInterrupt, as if Ctrl-C had been pressed while it graded."""
    raise KeyboardInterrupt


def stuck_coin(response: str, ground_truth: str) -> dict:
    """``coin``, but a response whose hash's first byte is a multiple of 4 hangs for an hour."""
    if hashlib.sha256(response.encode()).digest()[0] % 4 == 0:
        time.sleep(3600)
    return coin(response, ground_truth)


def exits_on_answers(response: str, ground_truth: str) -> dict:
    """``exits`` for any response but the empty one and the ground truth (which the pre-start
    check grades): a function that passes the check and ends its process on the model's answers."""
    if response in ("", ground_truth):
        return {"score": 0.0}
    return exits(response, ground_truth)


def hangs(response: str, ground_truth: str) -> dict:
    """Never returns (an hour) on any response."""
    time.sleep(3600)
    return {"score": 0.0}


def fails_on_empty(response: str, ground_truth: str) -> dict:
    """Raises on the empty response; ``coin`` otherwise."""
    if not response:
        raise ValueError("no answer to parse")
    return coin(response, ground_truth)


def broken_on_answers(response: str, ground_truth: str) -> dict:
    """``broken`` for any response but the two the pre-start check grades (see ``exits_on_answers``)."""
    if response in ("", ground_truth):
        return {"score": 0.0}
    return broken(response, ground_truth)
