"""Data-parallel trainer ranks over ``torch.distributed``: the process group, the split of a
mini-batch among the ranks, the gradient all-reduce, and the record of every collective.

    dp = DataParallel.connect(rank, world, "tcp://127.0.0.1:29511", timeout_s=120, device="cpu",
                              recorder=TraceWriter(run_dir / "trace", rank, world, incarnation))
    dp.begin(step, "update")                          # a call of the step starts (traced)
    own = dp.own(rows, lengths)                       # this rank's rows of a global mini-batch
    loss = dp.reduce_gradients(params, local_loss)    # one SUM all-reduce per dtype
    norm = dp.clip(params, max_norm)                  # the global norm: every rank holds the same grads

The math (``total`` the mini-batch's normaliser of :func:`~reasonrl.algo.agg_normaliser`,
computed by every rank from the whole mini-batch, which every rank holds)::

    loss_rank = sum over the rank's own rows of aggregate(l, m, agg, total=total)
    sum over ranks of loss_rank = aggregate over the whole mini-batch = the single-rank loss
    grad = sum over ranks of grad(loss_rank)           (all-reduce SUM, never a mean)

The rows of a mini-batch are disjoint among the ranks, so N ranks compute the single-rank
update (up to the order of floating-point sums), whatever the split. The split balances
prompt + response tokens, weighted by per-rank speed weights (:attr:`DataParallel.shares`) so
that a slow rank can be given less.

Backends: gloo on CPU, nccl on CUDA; the rendezvous is ``tcp://127.0.0.1:PORT`` (loopback, a
free port chosen by the parent: :func:`loopback_init_method`) or a ``file://`` path, bounded by
``timeout_s``, which is also every collective's timeout (then :class:`CollectiveTimeout`).

Tracing: every collective goes through :meth:`DataParallel.traced`, which calls the
:class:`Recorder` before (``enter``) and after (``exit``) it. :class:`TraceWriter` appends two
JSON lines per collective to ``trace_dir/rank<R>.jsonl``, each flushed as it is written, so a
rank stuck in (or before) a collective leaves its last ``enter`` line (or none) on disk::

    {"ev": "begin", "incarnation", "rank", "world", "step", "call", "t", "mono"}   a call starts
    {"ev": "enter", "incarnation", "rank", "seq", "op", "what", "bytes", "step", "t", "mono"}
    {"ev": "exit",  "incarnation", "rank", "seq", "t", "mono"[, "error"]}

``t`` is ``time.time()`` (comparable across the ranks of a machine, and across machines with
synchronised clocks), ``mono`` ``time.monotonic()`` (durations within a rank). ``seq`` counts
the rank's collectives from 1 in its ``incarnation`` (one process group's life); all ranks issue
the same collectives in the same order, so equal ``seq`` is the same collective.
:mod:`reasonrl.resilience.collectives` reads the files.
"""

from __future__ import annotations

import datetime
import json
import pickle
import socket
import time
from pathlib import Path
from typing import Any, Callable, Iterable

import torch
import torch.distributed as dist


def backend_for(device: str) -> str:
    """The process-group backend for ``run.device``: nccl on CUDA, gloo otherwise."""
    return "nccl" if torch.device(device).type == "cuda" else "gloo"


def loopback_init_method() -> str:
    """``tcp://127.0.0.1:PORT`` with a port free now (bound to port 0 and released): rank 0
    listens there for the others' rendezvous, on loopback only."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


def split_rows(rows: torch.Tensor, lengths: torch.Tensor, weights: list[float]) -> list[torch.Tensor]:
    """Split ``rows`` among ``len(weights)`` ranks by tokens, deterministically.

    Greedy longest-first (LPT): the rows sorted by ``lengths[row]`` descending (ties: the
    lower row first), each given to the rank r that minimises ``(load_r + length) / w_r``
    (ties: the lower rank), ``load_r`` the tokens given to r so far. With equal weights the
    loads differ by at most the longest row; with unequal ones load_r / w_r do. Each rank's
    rows are returned in ascending order (a rank may get none).
    """
    if not weights or any(not w > 0 for w in weights):
        raise ValueError(f"split_rows: weights={weights}; expected one positive weight per rank")
    if rows.numel() == 0:
        return [rows[:0] for _ in weights]
    lens = lengths[rows].tolist()
    order = sorted(range(len(lens)), key=lambda i: (-lens[i], int(rows[i])))
    loads = [0.0] * len(weights)
    owner = [0] * len(lens)
    for i in order:
        rank = min(range(len(weights)), key=lambda r: ((loads[r] + lens[i]) / weights[r], r))
        owner[i] = rank
        loads[rank] += lens[i]
    keep = torch.tensor(owner, device=rows.device)
    return [rows[keep == r].sort().values for r in range(len(weights))]


class CollectiveError(RuntimeError):
    """A collective failed on this rank (a peer died, the group broke); the message names the
    rank, the collective (op, what, sequence number) and the step."""


class CollectiveTimeout(CollectiveError):
    """A collective did not complete within the group's timeout: some rank never entered it."""


class Recorder:
    """Where a rank's calls and collectives are recorded. This base records nothing
    (``runtime.trace_collectives=false``); :class:`TraceWriter` writes them down, and fault
    drills wrap a recorder to act just before a collective."""

    def begin(self, step: int, call: str) -> None:
        """A call (``update``, ``logprobs``, ``connect``...) of ``step`` starts."""

    def enter(self, seq: int, op: str, what: str, nbytes: int) -> None:
        """The rank is about to enter collective ``seq``."""

    def exit(self, seq: int, error: str | None = None) -> None:
        """Collective ``seq`` returned (or raised ``error``)."""

    def close(self) -> None:
        """No more records."""


class TraceWriter(Recorder):
    """Appends rank ``rank``'s records to ``trace_dir/rank<rank>.jsonl`` (the module docstring's
    format), one line each, flushed as written; ``incarnation`` tells this process group's records
    from those of earlier ones (a restarted run appends to the same files)."""

    def __init__(self, trace_dir: str | Path, rank: int, world: int, incarnation: str) -> None:
        self.path = Path(trace_dir) / f"rank{rank}.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.rank, self.world, self.incarnation = rank, world, incarnation
        self.step = 0
        self._file = open(self.path, "a", encoding="utf-8", buffering=1)

    def _write(self, record: dict[str, Any]) -> None:
        record.update(incarnation=self.incarnation, rank=self.rank, t=time.time(), mono=time.monotonic())
        self._file.write(json.dumps(record, sort_keys=True) + "\n")
        self._file.flush()

    def begin(self, step: int, call: str) -> None:
        self.step = step
        self._write({"ev": "begin", "world": self.world, "step": step, "call": call})

    def enter(self, seq: int, op: str, what: str, nbytes: int) -> None:
        self._write({"ev": "enter", "seq": seq, "op": op, "what": what, "bytes": nbytes, "step": self.step})

    def exit(self, seq: int, error: str | None = None) -> None:
        self._write({"ev": "exit", "seq": seq} | ({} if error is None else {"error": error}))

    def close(self) -> None:
        self._file.close()


def _nbytes(tensors: Iterable[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _flatten(tensors: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for t in tensors])


class DataParallel:
    """Rank ``rank`` of ``world`` in the default process group: the data-parallel context of
    :func:`~reasonrl.trainer.update.update_policy` and of the trainer rank worker.

    ``shares`` are the ranks' speed weights (equal by default; every rank must hold the same
    ones, :meth:`set_shares`). ``strategy`` is ``ddp`` (gradients all-reduced here) or ``fsdp``
    (the module is FSDP2-sharded by its owner, which reduce-scatters gradients in backward:
    every rank then runs the same number of forward passes, :meth:`micro_batches`).
    """

    def __init__(self, rank: int, world: int, device: str, timeout_s: float, recorder: Recorder,
                 strategy: str = "ddp") -> None:
        if not 0 <= rank < world:
            raise ValueError(f"DataParallel: rank={rank}, world={world}; expected 0 <= rank < world")
        if strategy not in ("ddp", "fsdp"):
            raise ValueError(f"train.strategy: {strategy!r}; expected ddp or fsdp")
        self.rank, self.world, self.device, self.timeout_s = rank, world, device, timeout_s
        self.recorder, self.strategy = recorder, strategy
        self.shares = [1.0 / world] * world
        self.seq = 0
        self.step = 0

    @classmethod
    def connect(cls, rank: int, world: int, init_method: str, timeout_s: float, device: str,
                recorder: Recorder, strategy: str = "ddp") -> DataParallel:
        """Join the default process group (:func:`backend_for` ``device``) at ``init_method``;
        blocks until all ``world`` ranks joined, at most ``timeout_s`` (then a RuntimeError
        from torch naming the rendezvous)."""
        if dist.is_initialized():
            raise RuntimeError("DataParallel.connect: this process already belongs to a process group")
        dist.init_process_group(backend_for(device), init_method=init_method, rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=timeout_s))
        return cls(rank, world, device, timeout_s, recorder, strategy)

    def close(self) -> None:
        """Leave the process group and close the recorder."""
        if dist.is_initialized():
            dist.destroy_process_group()
        self.recorder.close()

    # ------------------------------------------------------------------ the split
    def set_shares(self, weights: list[float]) -> None:
        """Speed weights per rank (normalised to sum 1): the rank's part of each split."""
        if len(weights) != self.world or any(not w > 0 for w in weights):
            raise ValueError(f"DataParallel.set_shares: {weights}; expected {self.world} positive weights")
        total = float(sum(weights))
        self.shares = [float(w) / total for w in weights]

    def own(self, rows: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """This rank's part of ``rows`` (:func:`split_rows` by ``lengths`` and :attr:`shares`);
        every rank computes the same split, so the parts are disjoint and cover ``rows``."""
        return split_rows(rows, lengths, self.shares)[self.rank]

    def passes(self, micros: list[torch.Tensor], filler: torch.Tensor) -> list[tuple[torch.Tensor, bool]]:
        """``(rows, real)`` per forward pass. ddp: ``micros`` as they are. fsdp: every forward
        is a collective (the parameters are all-gathered), so the ranks agree on the most
        passes any rank needs (an all-reduce MAX) and pad with passes over ``filler`` marked
        ``real=False``, whose results are discarded (their loss is multiplied by 0)."""
        passes = [(m, True) for m in micros]
        if self.strategy != "fsdp":
            return passes
        count = torch.tensor([len(micros)], device=self.device)
        self.all_reduce(count, "passes", dist.ReduceOp.MAX)
        return passes + [(filler, False)] * (int(count) - len(micros))

    def settle(self, model: torch.nn.Module) -> None:
        """After forward passes without a backward (scoring): fsdp reshards every FSDP module.
        A forward leaves the root module's parameters gathered for the backward it expects;
        without one they stay gathered, and the next training backward then misses their
        reduce-scatter (each rank keeping only its own part of their gradients). ddp: nothing."""
        if self.strategy != "fsdp":
            return
        from torch.distributed.fsdp import FSDPModule

        for module in model.modules():
            if isinstance(module, FSDPModule):
                module.reshard()

    # ------------------------------------------------------------------ collectives
    def begin(self, step: int, call: str) -> None:
        """A call of ``step`` starts on this rank (recorded; the collectives that follow carry the step)."""
        self.step = step
        self.recorder.begin(step, call)

    def traced(self, op: str, what: str, nbytes: int, run: Callable[[], Any]) -> Any:
        """``run()`` (one collective) between the recorder's ``enter`` and ``exit``; a failure
        becomes a :class:`CollectiveError` (:class:`CollectiveTimeout` after ``timeout_s``)
        naming the rank, the collective and the step."""
        self.seq += 1
        seq = self.seq
        self.recorder.enter(seq, op, what, nbytes)
        began = time.monotonic()
        try:
            out = run()
        except Exception as err:  # noqa: BLE001 - every failure of a collective is reported the same way
            self.recorder.exit(seq, error=f"{type(err).__name__}: {err}")
            waited = time.monotonic() - began
            kind = CollectiveTimeout if waited >= 0.9 * self.timeout_s else CollectiveError
            raise kind(f"rank {self.rank}: {op}({what}) #{seq} at step {self.step} failed after {waited:.1f} s "
                       f"(collective timeout {self.timeout_s} s): {err}") from err
        self.recorder.exit(seq)
        return out

    def all_reduce(self, tensor: torch.Tensor, what: str, op: dist.ReduceOp = dist.ReduceOp.SUM) -> torch.Tensor:
        """``tensor`` reduced over the ranks in place (SUM by default); returns it."""
        self.traced("all_reduce", what, _nbytes([tensor]), lambda: dist.all_reduce(tensor, op=op))
        return tensor

    def gather_objects(self, obj: Any, what: str) -> list[Any]:
        """Every rank's ``obj`` (picklable), in rank order."""
        out: list[Any] = [None] * self.world
        nbytes = len(pickle.dumps(obj))
        self.traced("all_gather_object", what, nbytes, lambda: dist.all_gather_object(out, obj))
        return out

    def gather_rows(self, values: torch.Tensor, mine: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(values [B, T] of every rank's rows, known [B] bool)`` from this rank's rows
        ``mine`` [B] bool of ``values``: one SUM all-reduce of ``[values * mine | mine]``
        (the ranks' rows are disjoint, so the sum is each row from its owner)."""
        packed = torch.cat([values * mine[:, None], mine[:, None].to(values.dtype)], dim=1)
        self.all_reduce(packed, "rows")
        return packed[:, :-1], packed[:, -1] > 0

    def broadcast_module(self, module: torch.nn.Module, what: str = "weights") -> None:
        """Rank 0's parameters to every rank: one broadcast per dtype of flattened parameters."""
        params = list(module.parameters())
        with torch.no_grad():
            for dtype in dict.fromkeys(p.dtype for p in params):
                group = [p for p in params if p.dtype == dtype]
                flat = _flatten([p.detach() for p in group])
                self.traced("broadcast", what, _nbytes([flat]), lambda: dist.broadcast(flat, src=0))
                for p, chunk in zip(group, flat.split([p.numel() for p in group])):
                    p.copy_(chunk.view_as(p))

    def reduce_gradients(self, params: list[torch.nn.Parameter], loss: float) -> float:
        """Sum the gradients of ``params`` and the mini-batch loss share ``loss`` over the ranks;
        returns the summed loss, the same on every rank.

        ddp: one all-reduce per gradient dtype of the flattened gradients; the float32 buffer
        (one of its own for models without float32 parameters) also carries ``loss`` and, per
        parameter, the number of ranks that have a gradient for it: a parameter no rank's rows
        reached keeps ``grad = None`` (as in a single-rank run, where AdamW skips it), one that
        some rank's rows reached gets the sum, the other ranks contributing zeros. fsdp: FSDP
        reduce-scattered the gradients in backward; only ``loss`` is all-reduced here.
        """
        if self.strategy == "fsdp":
            return float(self.all_reduce(torch.tensor([loss], device=self.device), "grads"))
        extra = torch.tensor([loss] + [float(p.grad is not None) for p in params], dtype=torch.float32, device=self.device)
        groups: dict[torch.dtype, list[int]] = {}
        for i, p in enumerate(params):
            groups.setdefault(p.dtype, []).append(i)
        groups.setdefault(torch.float32, [])
        has: list[bool] = []
        for dtype, group in sorted(groups.items(), key=lambda item: item[0] != torch.float32):
            parts = [torch.zeros_like(params[i]) if params[i].grad is None else params[i].grad for i in group]
            if dtype == torch.float32:
                parts.append(extra)
            flat = self.all_reduce(_flatten(parts), "grads")
            if dtype == torch.float32:
                extra = flat[-extra.numel():]
                has = (extra[1:] > 0).tolist()
            sizes = [params[i].numel() for i in group]
            for i, chunk in zip(group, flat.split(sizes + [flat.numel() - sum(sizes)])):
                params[i].grad = chunk.view_as(params[i]) if has[i] else None
        return float(extra[0])

    def clip(self, params: list[torch.nn.Parameter], max_norm: float) -> torch.Tensor:
        """``clip_grad_norm_`` of the global gradients (ddp: after :meth:`reduce_gradients` every
        rank holds them whole; fsdp: the norm over the shards); returns the norm, a plain tensor."""
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        full = getattr(norm, "full_tensor", None)
        return full() if full is not None else norm

    def reduce_metrics(self, sums: dict[str, list[float]], shares: set[str], means: set[str],
                       minibatches: int) -> dict[str, float]:
        """The global metrics of an update from each rank's per-mini-batch ``shares`` (parts of
        mini-batch aggregates: summed over ranks, averaged over the ``minibatches``) and
        per-micro-batch ``means`` (averaged over every rank's micro-batches), in one all-reduce
        (the key names are agreed first with one object gather)."""
        keys = self.gather_objects((sorted(shares), sorted(means)), "metric_keys")
        share_keys = sorted({k for s, _ in keys for k in s})
        mean_keys = sorted({k for _, m in keys for k in m})
        local = [sum(sums.get(k, [])) for k in share_keys + mean_keys] + [len(sums.get(k, [])) for k in mean_keys]
        total = self.all_reduce(torch.tensor(local, dtype=torch.float64, device=self.device), "metrics").tolist()
        out = {k: total[i] / minibatches for i, k in enumerate(share_keys)}
        counts = total[len(share_keys) + len(mean_keys):]
        for i, k in enumerate(mean_keys):
            out[k] = total[len(share_keys) + i] / counts[i] if counts[i] else 0.0
        return out
