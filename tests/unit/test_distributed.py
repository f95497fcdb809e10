"""Data-parallel helpers without a process group: the token split, the collective trace (written,
read, analysed, tabulated), the rank monitor's rule and the rank fault specs."""

from __future__ import annotations

import json

import pytest
import torch

from reasonrl.config import ResilienceConfig, RuntimeConfig
from reasonrl.errors import InputError
from reasonrl.metrics import EventLog, read_jsonl
from reasonrl.resilience.collectives import Found, RankMonitor, TraceReader, analyse, format_table
from reasonrl.resilience.faults import parse_faults
from reasonrl.runtime import LocalGroup, WorkerTimeout
from reasonrl.runtime.ranks import RankGroup
from reasonrl.trainer.distributed import CollectiveError, CollectiveTimeout, TraceWriter, split_rows

# ---------------------------------------------------------------------- the split


def test_the_token_split_is_balanced_disjoint_and_deterministic():
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(3, 40, (64,), generator=g)
    rows = torch.arange(8, 56)  # one mini-batch of 48 rows
    for world in (2, 3, 4):
        parts = split_rows(rows, lengths, [1.0] * world)
        assert sorted(torch.cat(parts).tolist()) == rows.tolist()  # every row once
        assert all(p.tolist() == sorted(p.tolist()) for p in parts)
        loads = [int(lengths[p].sum()) for p in parts]
        assert max(loads) - min(loads) <= int(lengths[rows].max())
        again = split_rows(rows.clone(), lengths.clone(), [1.0] * world)
        assert all(torch.equal(a, b) for a, b in zip(parts, again))


def test_the_split_balances_tokens_not_rows():
    lengths = torch.tensor([100, 10, 10, 10, 10, 10, 10, 10, 10, 10, 10])
    first, second = split_rows(torch.arange(11), lengths, [1.0, 1.0])
    assert first.tolist() == [0] and second.tolist() == list(range(1, 11))  # 100 tokens each


def test_the_split_follows_the_speed_weights():
    lengths = torch.full((40,), 10)
    parts = split_rows(torch.arange(40), lengths, [0.75, 0.25])
    assert [len(p) for p in parts] == [30, 10]
    slow_first = split_rows(torch.arange(40), lengths, [0.2, 0.8])
    assert [len(p) for p in slow_first] == [8, 32]


def test_the_split_of_nothing_and_bad_weights():
    empty = split_rows(torch.arange(0), torch.ones(4), [1.0, 1.0])
    assert [p.numel() for p in empty] == [0, 0]
    assert [p.tolist() for p in split_rows(torch.tensor([3]), torch.ones(4), [1.0, 1.0])] == [[3], []]
    with pytest.raises(ValueError, match="one positive weight per rank"):
        split_rows(torch.arange(4), torch.ones(4), [1.0, 0.0])


# ---------------------------------------------------------------------- traces
T0 = 1_700_000_000.0


class Traces:
    """Hand-written trace files of ``world`` ranks: per step a ``begin``, a gradient all-reduce
    entered after each rank's compute, then a metrics all-reduce."""

    def __init__(self, trace_dir, world: int, incarnation: str = "s1", t0: float = T0) -> None:
        self.dir, self.world, self.incarnation, self.t, self.seq = trace_dir, world, incarnation, t0, 0

    def line(self, rank: int, **record) -> None:
        record.update(incarnation=self.incarnation, rank=rank, mono=record["t"] - T0)
        with open(self.dir / f"rank{rank}.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")

    def run(self, steps: range, late: dict[int, float] | None = None, compute: dict[int, float] | None = None) -> None:
        """Steps where rank r computes ``compute[r]`` (0.2 s) plus ``late[r]`` before the gradients."""
        for step in steps:
            for r in range(self.world):
                self.line(r, ev="begin", world=self.world, step=step, call="update", t=self.t + 0.001 * r)
            arrive = {r: self.t + (compute or {}).get(r, 0.2) + (late or {}).get(r, 0.0) + 0.001 * r for r in range(self.world)}
            done = max(arrive.values()) + 0.01
            for what, nbytes in (("grads", 4_000_000), ("metrics", 64)):
                self.seq += 1
                for r in range(self.world):
                    self.line(r, ev="enter", seq=self.seq, op="all_reduce", what=what, bytes=nbytes, step=step, t=arrive[r])
                    self.line(r, ev="exit", seq=self.seq, t=done)
                arrive = {r: done + 0.001 for r in range(self.world)}
                done += 0.01
            self.t = done + 0.05

    def stall(self, step: int, entered: tuple[int, ...]) -> float:
        """Ranks ``entered`` begin ``step`` and enter its gradient all-reduce; the others never do.
        Returns the time they entered."""
        self.seq += 1
        for r in entered:
            self.line(r, ev="begin", world=self.world, step=step, call="update", t=self.t)
            self.line(r, ev="enter", seq=self.seq, op="all_reduce", what="grads", bytes=4_000_000, step=step, t=self.t + 0.2)
        return self.t + 0.2


def test_a_clean_trace_has_no_outlier(tmp_path):
    Traces(tmp_path, 3).run(range(1, 7))
    report = analyse(tmp_path, now=T0 + 10)
    assert report.slow is None and report.stuck is None
    assert report.world == 3 and report.steps == [1, 2, 3, 4, 5, 6] and report.collectives == 12
    assert [s.collectives for s in report.ranks] == [12, 12, 12]
    # per step 4 MB + 64 B, moved in 0.01 s + 0.009 s after the last rank arrived
    assert report.ranks[0].bytes == 6 * 4_000_064
    assert report.ranks[0].allreduce_mb_s == pytest.approx(4_000_064 / 0.019 / 1e6, rel=1e-3)
    assert "no outlier" in format_table(report)


def test_the_rank_the_others_wait_for_is_named_slow(tmp_path):
    Traces(tmp_path, 4).run(range(1, 7), late={2: 0.8})
    report = analyse(tmp_path, now=T0 + 30)
    assert report.slow is not None and report.slow.rank == 2
    assert report.slow.lateness_s == pytest.approx(0.8, abs=0.01)
    assert report.slow.late_steps == 4 and report.slow.window == 4
    assert report.stuck is None
    stats = {s.rank: s for s in report.ranks}
    assert stats[2].times_last == 6 and stats[2].wait_s < stats[0].wait_s
    assert stats[2].compute_s == pytest.approx(6 * (0.2 + 0.8 + 0.001), abs=1e-6)  # since its begin, then its exit
    table = format_table(report)
    assert "slow rank: 2" in table and "no outlier" not in table
    header, *rows = table.splitlines()[1:6]
    assert header.split() == ["rank", "collectives", "wait_s", "mean_order", "times_last", "compute_s", "MB", "allreduce_MB/s"]
    assert [row.split()[0] for row in rows] == ["0", "1", "2", "3"]


def test_lateness_below_the_thresholds_is_no_outlier(tmp_path):
    Traces(tmp_path, 2).run(range(1, 7), late={1: 0.3})
    assert analyse(tmp_path, now=T0 + 30).slow is None  # under min_s = 0.5 s
    assert analyse(tmp_path, now=T0 + 30, min_s=0.1).slow.rank == 1
    # 0.3 s late on the others' 0.2 s of compute passes ratio 1.5 (it needs 0.1 s), not ratio 3 (0.4 s)
    assert analyse(tmp_path, now=T0 + 30, min_s=0.1, ratio=3.0).slow is None


def test_the_rank_that_never_entered_the_newest_collective_is_stuck(tmp_path):
    traces = Traces(tmp_path, 3)
    traces.run(range(1, 4))
    end = traces.stall(4, entered=(0, 2)) - 0.2
    assert analyse(tmp_path, now=end + 30).stuck is None  # not yet past the timeout
    report = analyse(tmp_path, now=end + 200.2, stuck_after_s=120)
    stuck = report.stuck
    assert stuck is not None and stuck.rank == 1 and stuck.ranks == (1,)
    assert (stuck.op, stuck.what, stuck.seq, stuck.step, stuck.waiting) == ("all_reduce", "grads", 7, 4, (0, 2))
    assert stuck.waited_s == pytest.approx(200.0)
    line = "stuck rank: 1 (never entered all_reduce(grads) #7 at step 4; ranks 0, 2 entered it 200.0 s ago)"
    assert format_table(report).splitlines()[-1] == line


def test_the_newest_incarnation_is_analysed_and_earlier_ones_counted(tmp_path):
    Traces(tmp_path, 2, incarnation="old").run(range(1, 6), late={1: 1.0})
    Traces(tmp_path, 2, incarnation="new", t0=T0 + 1000).run(range(1, 6))
    report = analyse(tmp_path, now=T0 + 2000)
    assert report.incarnation == "new" and report.incarnations == 2 and report.slow is None
    assert "1 earlier incarnation(s)" in format_table(report)


def test_no_trace_is_an_input_error(tmp_path):
    with pytest.raises(InputError, match="no collective trace"):
        analyse(tmp_path)


def test_the_writer_flushes_each_line_and_the_reader_waits_for_a_partial_one(tmp_path):
    writer = TraceWriter(tmp_path, rank=1, world=2, incarnation="abc")
    writer.begin(3, "update")
    writer.enter(1, "all_reduce", "grads", 128)
    lines = (tmp_path / "rank1.jsonl").read_text().splitlines()  # on disk before exit: a hang leaves it
    assert [json.loads(x)["ev"] for x in lines] == ["begin", "enter"]
    assert json.loads(lines[1]) | {"t": 0, "mono": 0} == {"ev": "enter", "seq": 1, "op": "all_reduce", "what": "grads",
                                                          "bytes": 128, "step": 3, "incarnation": "abc", "rank": 1, "t": 0, "mono": 0}
    reader = TraceReader(tmp_path)
    incarnation = reader.read()
    assert incarnation.world == 2 and incarnation.collectives[1].enter.keys() == {1} and not incarnation.collectives[1].exit
    with open(tmp_path / "rank1.jsonl", "a", encoding="utf-8") as f:
        f.write('{"ev": "exit", "se')  # cut mid-line
    assert not reader.read().collectives[1].exit
    with open(tmp_path / "rank1.jsonl", "a", encoding="utf-8") as f:
        f.write('q": 1, "incarnation": "abc", "rank": 1, "t": 5.0, "mono": 5.0}\n')
    assert reader.read().collectives[1].exit == {1: 5.0}
    writer.exit(2, error="RuntimeError: boom")
    writer.close()
    assert json.loads((tmp_path / "rank1.jsonl").read_text().splitlines()[-1])["error"] == "RuntimeError: boom"


# ---------------------------------------------------------------------- the monitor
def test_the_monitor_gives_a_straggler_less_then_equal_shares_once_it_recovers(tmp_path):
    events = EventLog(tmp_path)
    traces = Traces(tmp_path, 2)
    monitor = RankMonitor(tmp_path, 2, events, ResilienceConfig(slow_ratio=1.5, slow_min_s=0.5), RuntimeConfig())
    traces.run(range(1, 2), late={1: 0.8})
    assert monitor.after_step(1).events == [] and monitor.after_step(1).shares is None  # one step is no evidence
    traces.run(range(2, 3), late={1: 0.8})
    found = monitor.after_step(2)
    [event] = found.events
    assert event["kind"] == "straggler" and event["rank"] == 1 and event["lateness_s"] == pytest.approx(0.8, abs=0.01)
    # compute per share: rank 0 0.201 s / 0.5, rank 1 1.001 s / 0.5: rank 1 gets a sixth of the tokens
    assert found.shares == pytest.approx([5 / 6, 1 / 6], abs=0.01) and event["share"] == pytest.approx(1 / 6, abs=0.01)
    assert monitor.shares == found.shares
    # still slow, on its smaller share: the shares stay
    traces.run(range(3, 4), compute={0: 0.2 / 0.6, 1: 1.0 / 3})
    assert monitor.after_step(3) == Found([])
    # recovered from step 4 on: the same compute per share on both ranks; the median over the
    # steps since the onset (the last 4) says so at step 6
    for step in (4, 5, 6):
        traces.run(range(step, step + 1), compute={r: 0.4 * monitor.shares[r] for r in range(2)})
        back = monitor.after_step(step)
        assert bool(back.events) == (step == 6)
    assert [e["kind"] for e in back.events] == ["straggler_recovered"] and back.shares == [0.5, 0.5]
    logged = [(e["kind"], e["step"], e["rank"]) for e in read_jsonl(tmp_path / "events.jsonl")]
    assert logged == [("straggler", 2, 1), ("straggler_recovered", 6, 1)]


def test_the_monitor_names_the_stuck_rank_after_a_timeout(tmp_path):
    events = EventLog(tmp_path)
    traces = Traces(tmp_path, 2)
    traces.run(range(1, 3))
    traces.stall(3, entered=(0,))
    monitor = RankMonitor(tmp_path, 2, events, ResilienceConfig(), RuntimeConfig(collective_timeout_s=120))
    assert monitor.on_timeout(3) == 1
    [hang] = [e for e in read_jsonl(tmp_path / "events.jsonl") if e["kind"] == "hang"]
    fields = ("step", "rank", "op", "what", "seq", "waiting")
    assert [hang[k] for k in fields] == [3, 1, "all_reduce", "grads", 5, [0]]


# ---------------------------------------------------------------------- the group
class FakeRank:
    """A rank in this process whose ``work`` answers, or fails as a rank's call would."""

    def __init__(self, rank: int, outcome: dict[int, Exception]) -> None:
        self.rank, self.outcome, self.closed = rank, outcome, False

    def connect(self, init_method: str, incarnation: str) -> int:
        assert init_method.startswith("tcp://127.0.0.1:") and len(incarnation) == 12
        return 1000 + self.rank

    def work(self, x: int) -> int:
        if self.rank in self.outcome:
            raise self.outcome[self.rank]
        return x + self.rank

    def close(self) -> None:
        self.closed = True


def rank_group(outcome: dict[int, Exception]) -> tuple[RankGroup, list[FakeRank]]:
    workers = [FakeRank(r, outcome) for r in range(3)]
    return RankGroup(lambda r: LocalGroup([workers[r]]), 3, timeout_s=5), workers


def test_the_rank_group_calls_every_rank_and_keeps_rank_zeros_answer():
    group, workers = rank_group({})
    assert group.pids == [1000, 1001, 1002] and group.local is workers[0]
    assert group.call("work", 10) == [10, 11, 12] and group.first("work", 10) == 10
    group.close()
    assert all(w.closed for w in workers)


def test_the_rank_group_reports_the_cause_of_a_failed_call():
    # a rank's own error is the cause; the others' collectives failed because of it
    group, _ = rank_group({0: CollectiveError("rank 0: all_reduce(grads) #3 failed"), 2: KeyError("bad row")})
    with pytest.raises(KeyError, match="bad row"):
        group.call("work", 1)
    assert group.broken
    group, _ = rank_group({1: CollectiveTimeout("rank 1: all_reduce(grads) #3 at step 4 failed after 4.0 s")})
    with pytest.raises(WorkerTimeout, match=r"policy.work: ranks \[\] did not answer within 5 s; rank 1: all_reduce"):
        group.call("work", 1)


# ---------------------------------------------------------------------- faults
def test_rank_fault_specs():
    plan = parse_faults(["slow_rank@3", "hang_rank@5:rank=2", "slow_rank@9:rank=0:factor=2:steps=2"])
    assert [f.spec for f in plan.faults] == ["slow_rank@3:rank=1:factor=3.0:steps=8", "hang_rank@5:rank=2",
                                             "slow_rank@9:rank=0:factor=2.0:steps=2"]
    assert plan.rank_factor(1, 2) == 1.0 and plan.rank_factor(1, 3) == 3.0 and plan.rank_factor(1, 10) == 3.0
    assert plan.rank_factor(1, 11) == 1.0 and plan.rank_factor(0, 10) == 2.0 and plan.rank_factor(0, 11) == 1.0
    plan.stall_rank(2, 4)  # not due: returns
    plan.stall_rank(1, 5)
    with pytest.raises(InputError, match="bad value '-1' for key 'rank': expected a trainer rank"):
        parse_faults(["hang_rank@2:rank=-1"])
    with pytest.raises(InputError, match="unknown key 'worker' for kind 'hang_rank'; allowed keys: rank"):
        parse_faults(["hang_rank@2:worker=1"])
