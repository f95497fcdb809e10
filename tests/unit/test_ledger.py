"""The prompt ledger (reasonrl ledger): every draw has exactly one fate, from the run's records."""

from __future__ import annotations

import json

import pytest

from reasonrl.cli import main
from reasonrl.errors import InputError
from reasonrl.ledger import check_ledger


def write(run_dir, records, leftover=None):
    (run_dir / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    events = [{"kind": "start", "step": 0}]
    if leftover is not None:
        events.append({"kind": "rollout_leftover", "step": records[-1]["step"], **leftover})
    (run_dir / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))


# Step 1 draws 0-3 (2 all-correct, 3 kept early and trained at step 2); step 2 draws 4-6 (6
# failed: out of retries on the rollout fleet), trains 0, 1 and 3, drops 4 as stale; at the
# stop 5 is still queued and draw 7 was drawn, surplus.
RECORDS = [
    {"step": 1, "drawn": [[0, 10, "kept"], [1, 11, "kept"], [2, 12, "all_correct"], [3, 13, "kept"]],
     "trained": [], "stale": []},
    {"step": 2, "drawn": [[4, 14, "kept"], [5, 15, "kept"], [6, 16, "failed"]], "trained": [0, 1, 3], "stale": [4]},
]
LEFTOVER = {"drawn": [[7, 17, "surplus"]], "queued": [5], "stale": []}


def test_a_clean_run_has_one_fate_per_draw_and_counts_them(tmp_path, capsys):
    write(tmp_path, RECORDS, LEFTOVER)
    ledger = check_ledger(tmp_path)
    assert ledger.ok and ledger.draws == 8 and ledger.problems == [] and ledger.open == []
    assert dict(ledger.counts) == {"trained": 3, "stale": 1, "all_correct": 1, "left_over": 1, "surplus": 1,
                                   "failed": 1}
    assert main(["ledger", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "draws: 8" in out and "ok: every draw has exactly one fate" in out


@pytest.mark.parametrize("change, problem", [
    (lambda r, l: r[1]["trained"].append(0), "draw 0: trained at step 2 and trained at step 2"),
    (lambda r, l: r[1]["trained"].remove(1), "draw 1: kept, then never trained, dropped or left over (lost)"),
    (lambda r, l: r[1]["drawn"].pop(0), "draws 4: never recorded (the draws are 0..7)"),
    (lambda r, l: l["drawn"].append([2, 12, "kept"]), "draw 2: drawn twice (at the stop)"),
    (lambda r, l: r[1]["stale"].append(2), "draw 2: stale at step 2 but it was not kept (all_correct)"),
    (lambda r, l: l["queued"].append(9), "draw 9: left_over at the stop but it was never drawn"),
    (lambda r, l: l["stale"].append(3), "draw 3: trained at step 2 and stale at the stop"),
    (lambda r, l: r[1]["trained"].append(6), "draw 6: trained at step 2 but it was not kept (failed)"),
])
def test_each_broken_rule_names_the_draw_and_exits_1(tmp_path, capsys, change, problem):
    records, leftover = json.loads(json.dumps(RECORDS)), json.loads(json.dumps(LEFTOVER))
    change(records, leftover)
    write(tmp_path, records, leftover)
    ledger = check_ledger(tmp_path)
    assert not ledger.ok and problem in ledger.problems, ledger.problems
    assert main(["ledger", str(tmp_path)]) == 1
    assert problem in capsys.readouterr().out


def test_an_unfinished_run_is_open_not_ok(tmp_path):
    write(tmp_path, RECORDS)  # no rollout_leftover: draw 5 may still be in flight
    ledger = check_ledger(tmp_path)
    assert not ledger.ok and ledger.problems == [] and ledger.open == [5] and not ledger.finished
    assert "the run has not finished" in ledger.describe()


def test_a_missing_or_malformed_record_names_the_file(tmp_path):
    with pytest.raises(InputError, match="prompts.jsonl: no such file"):
        check_ledger(tmp_path)
    (tmp_path / "prompts.jsonl").write_text(json.dumps({"step": 1, "drawn": []}) + "\n")
    with pytest.raises(InputError, match="the record of step 1 lacks"):
        check_ledger(tmp_path)
