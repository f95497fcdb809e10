"""Worker classes for runtime tests, importable by the worker processes."""

import os
import threading
import time


class Counter:
    """A stateful worker: ``add`` accumulates, ``wait_for_flag`` blocks until ``set_flag`` runs beside it."""

    def __init__(self, start: int = 0) -> None:
        self.total = start
        self.flag = threading.Event()

    def add(self, x: int) -> int:
        self.total += x
        return self.total

    def pid(self) -> int:
        return os.getpid()

    def fail(self, message: str) -> None:
        raise ValueError(message)

    def sleep(self, seconds: float) -> float:
        time.sleep(seconds)
        return seconds

    def set_flag(self) -> bool:
        self.flag.set()
        return True

    def wait_for_flag(self, timeout_s: float) -> bool:
        return self.flag.wait(timeout_s)

    def die(self) -> None:
        os._exit(3)


def broken(*args):
    raise RuntimeError("cannot build this worker")


class Echo:
    """Returns what it is sent."""

    def echo(self, value):
        return value


class ScriptedRollouts:
    """A rollout worker without a model, for fleet tests: sample j of a group with seed s has
    ``1 + (s * 7 + j * 3) % max_new_tokens`` tokens, each token id ``s % 97 + t``, so a group's
    rows and the decode step it completes at depend on its seed alone. ``stream`` reports
    groups step by step through a StreamOutbox, as RolloutWorker does; ``step_s`` paces it;
    ``die_at`` (a seed) makes the process exit when that group is generated, once: the file
    ``flag`` marks that it did, so its replacement serves the group (without ``flag``: every
    time); ``hang_at`` makes it sleep for good instead, and ``raise_at`` raise (-1: on every
    call)."""

    streams = True
    episodic = False

    def __init__(self, step_s: float = 0.0, die_at: int | None = None, flag: str = "", hang_at: int | None = None,
                 raise_at: int | None = None) -> None:
        from reasonrl.rollout.fleet import StreamOutbox

        self.step_s, self.die_at, self.flag, self.hang_at, self.raise_at = step_s, die_at, flag, hang_at, raise_at
        self.version = 0
        self.outbox = StreamOutbox()
        self.calls: list[list[int]] = []

    def capabilities(self):
        return {"streams": True, "episodic": False}

    def _rows(self, seeds, n, max_new, cap=None):
        import torch

        from reasonrl.types import RolloutBatch

        B = len(seeds) * n
        lengths = [min(1 + (s * 7 + j * 3) % max_new, cap or max_new) for s in seeds for j in range(n)]
        T = max(lengths) if lengths else 0
        ids = torch.zeros(B, T, dtype=torch.long)
        mask = torch.zeros(B, T)
        for r, (s, length) in enumerate(zip([s for s in seeds for _ in range(n)], lengths)):
            ids[r, :length] = torch.arange(length) + s % 97
            mask[r, :length] = 1
        return RolloutBatch(torch.ones(B, 2, dtype=torch.long), torch.ones(B, 2, dtype=torch.long), ids, mask,
                            -mask * 0.5, torch.tensor([length < max_new for length in lengths]),
                            torch.tensor([length == max_new for length in lengths]),
                            torch.arange(len(seeds)).repeat_interleave(n), mask.long() * self.version)

    def generate(self, prompts, n, params, seeds):
        self.calls.append(list(seeds))
        self._maybe_die(seeds)
        time.sleep(self.step_s * params.max_new_tokens)
        return self._rows(list(seeds), n, params.max_new_tokens)

    def stream(self, prompts, n, params, seeds):
        self.calls.append(list(seeds))
        self._maybe_die(seeds)
        max_new = params.max_new_tokens
        done_at = [max(1 + (s * 7 + j * 3) % max_new for j in range(n)) - 1 for s in seeds]
        self.outbox.open()
        stopped_at = None
        for t in range(max_new):
            time.sleep(self.step_s)
            groups = [g for g, d in enumerate(done_at) if d == t]
            if groups and self.outbox.put(groups, self._rows([seeds[g] for g in groups], n, max_new)):
                stopped_at = t
                break
        entries = self.outbox.close()
        aborted = [g for g, d in enumerate(done_at) if stopped_at is not None and d > stopped_at]
        lengths = self._rows([seeds[g] for g in aborted], n, max_new, cap=stopped_at + 1 if aborted else None).lengths.tolist()
        return {"entries": entries, "aborted": aborted, "aborted_lengths": lengths}

    def _maybe_die(self, seeds):
        if self.die_at in seeds and not (self.flag and os.path.exists(self.flag)):
            if self.flag:
                open(self.flag, "w").close()
            os._exit(9)
        if self.hang_at in seeds:
            time.sleep(3600)
        if self.raise_at == -1 or self.raise_at in seeds:
            raise RuntimeError(f"injected error on seeds {list(seeds)}")

    def poll_stream(self, wait_s):
        return self.outbox.poll(wait_s)

    def stop_stream(self):
        self.outbox.stop()

    def load_weights(self, update):
        self.version = update.version

    def offer_weights(self, update):
        self.version = update.version

    def pid(self):
        return os.getpid()


def tag_worker(worker, role, index):
    """A spawn ``wrap``: records the role and index on the worker, where it was built."""
    worker.tag = f"{role}[{index}] in {os.getpid()}"
    return worker


class Tagged(Counter):
    def get_tag(self):
        return self.tag


class DeltaRollouts(ScriptedRollouts):
    """ScriptedRollouts that hold weights as a rollout worker does (deltas applied to the
    version held, whole checksummed versions verified) and record what reached them:
    ``(method, "delta" or "whole", version)`` per call."""

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.held = None
        self.received: list[tuple[str, str, int]] = []

    def _take(self, method, update):
        from reasonrl.rollout.weight_sync import apply_delta, verify
        from reasonrl.types import WeightsDelta

        if isinstance(update, WeightsDelta):
            self.held = apply_delta(self.held, update)
        else:
            self.held = verify(update)
        self.received.append((method, "delta" if isinstance(update, WeightsDelta) else "whole", update.version))
        return self.held

    def load_weights(self, update):
        self.version = self._take("load_weights", update).version

    def offer_weights(self, update):
        self.version = self._take("offer_weights", update).version

    def stage_weights(self, update):
        self._take("stage_weights", update)

    def load_staged(self, version):
        self.version = version

    def report(self):
        """(what reached this worker, the held version's tensors)."""
        return self.received, self.held.tensors
