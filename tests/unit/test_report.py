"""Run report: plots, config differences and events for one and several runs."""

import json
import re

import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import to_hex

from reasonrl.cli import main
from reasonrl.config import dump, load
from reasonrl.errors import InputError
from reasonrl.report import Run, line_figure, plot_specs, stage_series, timing_figure, write_report
from tests.conftest import fill

PNG = b"\x89PNG\r\n\x1a\n"

LINE_PLOTS = [
    "reward.png", "accuracy.png", "accuracy_by_source.png", "data_mix.png", "curriculum.png", "response_length.png",
    "entropy.png", "clipfrac.png",
    "policy_loss.png", "kl.png", "grad_norm.png", "lr.png", "dynamic_sampling.png", "throughput.png",
]


def _rows(scale):
    """Four steps of the metrics a DAPO run logs; validation on even steps."""
    rows = []
    for step in range(1, 5):
        row = {
            "step": step,
            "time": 30.0 * step,
            "critic/score/mean": scale * step,
            "train/acc": 0.1 * step,
            "response_length/mean": 100 + step,
            "response_length/clip_ratio": 0.05 * step,
            "actor/entropy": 1.0 / step,
            "actor/pg_clipfrac": 0.01 * step,
            "actor/pg_clipfrac_lower": 0.001 * step,
            "actor/pg_loss": -0.01 * step,
            "actor/grad_norm": 0.5 + step,
            "actor/ppo_kl": 0.001 * step,
            "actor/kl_loss": 0.002 * step,
            "actor/lr": 1e-4,
            "batch/kept_groups": 16,
            "batch/dropped_all_correct": step,
            "batch/dropped_all_wrong": 5 - step,
            "batch/samples_per_kept_group": 8 + step,
            "perf/throughput": 1000.0 + step,
            "perf/total_num_tokens": 5000 + step,
            "timing_s/gen": 2.0,
            "timing_s/update_actor": 1.0,
            "timing_s/step": 3.5,
            "data/mix/embedded/add": 0.5 + 0.05 * step,
            "data/mix/embedded/mul": 0.5 - 0.05 * step,
            "data/mix_acc/embedded/add": 0.1 * step,
            "data/curriculum/retired": step,
            "data/curriculum/returned": step - 1,
            "data/curriculum/out_of_pool": 2 * step,
        }
        if step % 2 == 0:
            row |= {"val/acc": 0.125 * step, "val/acc_greedy": 0.2 * step, "val/pass@4": 0.25 * step,
                    "val/acc/embedded/add": 0.2 * step, "val/acc/embedded/mul": 0.1 * step}
        rows.append(row)
    return rows


EVENTS = [  # a crash at step 3 restarted from the step-2 checkpoint, then a rollback at step 4
    {"time": 100.0, "kind": "start", "step": 0, "resumed": False},
    {"time": 160.0, "kind": "checkpoint", "step": 2, "path": "checkpoints/step_2"},
    {"time": 190.0, "kind": "crash", "step": 3, "attempt": 1, "returncode": 1, "backoff_s": 1.0,
     "stderr_tail": "Traceback (most recent call last):\n  ...\nRuntimeError: <boom> & co"},
    {"time": 195.0, "kind": "start", "step": 2, "resumed": True},
    {"time": 196.0, "kind": "resume", "step": 2, "from_step": 2, "path": "checkpoints/step_2"},
    {"time": 230.0, "kind": "recovered", "step": 3, "recover_s": 40.0, "steps_lost": 1, "from_step": 2, "failures": 1},
    {"time": 260.0, "kind": "rollback", "step": 4, "reason": "spike in grad_norm", "to": "checkpoints/step_2",
     "from_step": 2, "recover_s": 2.5},
]


def _write_run(run_dir, rows, overrides=None, events=None):
    """A run directory: metrics.jsonl, a real config.yaml (from ``overrides``) and events.jsonl when given."""
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if overrides is not None:
        dump(load(None, [f"run.dir={run_dir}", *overrides]), run_dir / "config.yaml")
    if events is not None:
        (run_dir / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))


def _section(page, heading):
    """The HTML from ``<h2>heading</h2>`` to the next ``<h2>``."""
    return page.split(f"<h2>{heading}</h2>", 1)[1].split("<h2>", 1)[0]


def test_report_compares_configs_plots_and_events(tmp_path):
    runs = tmp_path / "runs"
    _write_run(runs / "dapo", _rows(0.1), ["algo.adv_estimator=grpo", "algo.eps_high=0.28"], EVENTS)
    _write_run(runs / "ppo", _rows(0.2), ["algo.adv_estimator=gae"])
    _write_run(runs / "bare", [{"step": 1, "critic/score/mean": 0.3}])  # no config.yaml, no events.jsonl
    html_path = write_report([runs / "dapo", runs / "ppo", runs / "bare"])
    out = runs / "report"
    assert html_path == out / "report.html"
    page = html_path.read_text()

    for name in [*LINE_PLOTS, "timing.png"]:
        assert (out / name).read_bytes().startswith(PNG), name
        assert f'src="{name}"' in page, name
    assert not (out / "ettr.png").exists() and not (out / "recovery.png").exists()  # no such keys: no plots

    assert "dapo (grpo)" in page and "ppo (gae)" in page and "bare" in page
    # dapo: val/acc first 0.250, last/best 0.500; greedy 0.400 / 0.800; ppo's final score 0.800; 2 min
    for number in ["0.250", "0.500", "0.400", "0.800", "0:02:00"]:
        assert number in page

    diff = _section(page, "Config differences")
    main_table = diff.split("</table>", 1)[0]
    assert "<td>algo.eps_high</td><td>0.28</td><td>0.2</td>" in main_table
    assert "<td>algo.adv_estimator</td><td>grpo</td><td>gae</td>" in main_table
    assert main_table.count("<tr>") == 3  # the header and the two keys that differ: no equal key listed
    assert "algo.eps_low" not in diff and "train.lr" not in diff
    assert "run.dir" not in main_table and "<td>run.dir</td>" in diff  # folded apart
    assert "No config.yaml in: bare" in diff

    events = _section(page, "Events")
    dapo_events, ppo_events, bare_events = events.split("<h3>")[1:]
    assert "<td>3</td><td>crash</td>" in dapo_events and "<td>4</td><td>rollback</td>" in dapo_events
    assert "reason=spike in grad_norm" in dapo_events
    assert "stderr_tail=RuntimeError: &lt;boom&gt; &amp; co" in dapo_events  # the last line, escaped
    assert "<boom>" not in page
    assert "No events.jsonl" in ppo_events and "No events.jsonl" in bare_events

    configs = _section(page, "Configs")
    assert "eps_high: 0.28" in configs and "bare: no config.yaml" in configs


def test_plots_have_integer_steps_and_mark_events():
    rows = [{"step": s, "actor/pg_loss": 0.1 * s, "val/acc/a": 0.5, "val/acc/b": 0.25} for s in range(1, 5)]
    runs = [Run("dapo", rows, events=EVENTS), Run("grpo", rows)]
    specs = plot_specs(runs)
    fig = line_figure(runs, specs["policy_loss.png"])
    [ax] = fig.axes
    ticks = ax.get_xticks()
    assert len(ticks) >= 3 and all(t == int(t) for t in ticks)  # the default locator puts ticks at 1.5, 2.5, ...
    verticals = sorted(line.get_xdata()[0] for line in ax.lines if len(set(line.get_xdata())) == 1)
    assert verticals == [3, 4]  # crash and recovered at 3, rollback at 4; not start, checkpoint, resume
    assert sorted(t.get_text() for t in ax.texts) == ["crash, recovered", "rollback"]
    assert all(line.get_color() == "C0" for line in ax.lines if len(set(line.get_xdata())) == 1)  # dapo's colour
    by_source = line_figure(runs, specs["accuracy_by_source.png"])
    assert [a.get_title() for a in by_source.axes] == ["held-out accuracy: a", "held-out accuracy: b"]
    assert line_figure(runs, specs["throughput.png"]) is None  # no run has perf/*
    assert line_figure(runs, specs["data_mix.png"]) is None and line_figure(runs, specs["curriculum.png"]) is None
    # three sources: two columns, each legend beside its axes, clear of the next column, inside the figure
    three = [Run("dapo", [{**row, "val/acc/c": 0.75} for row in rows])]
    fig = line_figure(three, plot_specs(three)["accuracy_by_source.png"])
    a, b, c = fig.axes
    renderer = FigureCanvasAgg(fig).get_renderer()
    boxes = {ax: ax.get_legend().get_window_extent(renderer) for ax in (a, b, c)}
    assert all(box.x0 > ax.get_window_extent(renderer).x1 for ax, box in boxes.items())
    assert boxes[a].x1 < b.get_window_extent(renderer).x0 and boxes[b].x1 <= fig.bbox.x1


def test_the_plots_mark_incidents_and_recoveries_not_the_runs_course():
    events = [{"time": 1.0, "kind": "rollout_started", "step": 0, "pids": [7]},
              {"time": 2.0, "kind": "rollout_scaled", "step": 2, "workers": 2},
              {"time": 3.0, "kind": "rollout_worker_gone", "step": 3, "worker": 1},
              {"time": 4.0, "kind": "checkpoint", "step": 4}, {"time": 5.0, "kind": "slowdown_recovered", "step": 5}]
    assert Run("r", [], events=events).marked_steps() == {3: ["rollout_worker_gone"], 5: ["slowdown_recovered"]}


def test_the_stage_plot_stacks_the_stage_seconds_only_and_draws_waits_as_lines():
    """An async step of 3.5 s: its stages add up to it; the trainer's wait (inside gen), the
    rollout side's seconds and a group's mean in-flight time overlap them and are lines."""
    waits = {"timing_s/trainer_idle": 1.9, "timing_s/rollout_idle": 0.7, "timing_s/rollout_gen": 2.6,
             "timing_s/reward": 0.1, "timing_s/group_in_flight": 4.0, "timing_s/group_queued": 0.2,
             "timing_s/weight_sync": 0.4}
    rows = [{"step": 0, "val/acc": 0.25, "timing_s/testing": 0.75}]
    rows += [{"step": s, "timing_s/step": 3.5, "timing_s/update_actor": 1.0, "timing_s/gen": 2.0, "timing_s/publish": 0.5,
              **waits} for s in (1, 2)]
    series = stage_series(Run("async", rows))
    assert series.steps == [0, 1, 2]
    assert list(series.stacked) == ["timing_s/gen", "timing_s/update_actor", "timing_s/publish", "timing_s/testing"]
    assert series.stacked["timing_s/gen"] == [0.0, 2.0, 2.0] and series.stacked["timing_s/testing"] == [0.75, 0.0, 0.0]
    assert [sum(seconds) for seconds in zip(*series.stacked.values())] == [0.75, 3.5, 3.5]  # the step, not 5 s
    assert series.lines == {key: ([1, 2], [value, value]) for key, value in sorted(waits.items())}
    assert stage_series(Run("untimed", [{"step": 1, "timing_s/step": 1.0}])) is None
    fig = timing_figure([Run("async", rows)])
    [ax] = fig.axes
    colours = [to_hex(p.get_facecolor()) for p in ax.patches[::3]] + [to_hex(line.get_color()) for line in ax.lines]
    assert len(colours) == len(set(colours)) == 4 + 7  # a colour of its own for each series
    legend = ax.get_legend()
    assert legend.get_bbox_to_anchor().x0 > ax.get_window_extent().x1  # beside the axes, not over them


def test_the_data_mix_plot_has_a_panel_a_source_with_its_weights_over_the_steps():
    runs = [Run("adaptive", _rows(0.1))]
    fig = line_figure(runs, plot_specs(runs)["data_mix.png"])
    add, mul = fig.axes
    assert add.get_title().startswith("sampling weight: embedded/add") and mul.get_title().startswith("sampling weight: embedded/mul")
    weights, accuracy = add.lines  # the weight, and the accuracy average dashed
    assert list(weights.get_xdata()) == [1, 2, 3, 4] and list(weights.get_ydata()) == pytest.approx([0.55, 0.6, 0.65, 0.7])
    assert accuracy.get_linestyle() == "--" and len(mul.lines) == 1  # mul has no accuracy average logged


def test_one_run_without_config_defaults_to_run_dir(tmp_path):
    run = tmp_path / "solo"
    rows = [
        {"step": 1, "critic/score/mean": 0.5, "ettr": 0.9, "time_lost_s": 1.0, "mttr_s": 0.0},
        {"step": 2, "critic/score/mean": 0.6, "ettr": 0.875, "time_lost_s": 6.25, "mttr_s": 5.125},
    ]
    _write_run(run, rows)
    html_path = write_report([run])
    assert html_path == run / "report.html"
    for name in ["reward.png", "ettr.png", "recovery.png"]:
        assert (run / name).read_bytes().startswith(PNG)
    assert not (run / "accuracy.png").exists() and not (run / "timing.png").exists()
    page = html_path.read_text()
    assert "solo" in page and 'src="recovery.png"' in page
    assert "Config differences" not in page and "solo: no config.yaml" in page and "No events.jsonl" in page
    for number in ["0.875", "6.250", "5.125"]:  # last ETTR, time lost, MTTR in the summary table
        assert number in page


def test_a_report_onto_a_full_disk_is_one_exit_2_line(small_disk, tmp_path, capsys):
    run = tmp_path / "solo"
    _write_run(run, [{"step": 1, "critic/score/mean": 0.5}, {"step": 2, "critic/score/mean": 0.6}])
    fill(small_disk)
    code = main(["report", str(run), "--out", str(small_disk / "report")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "Traceback" not in err[0], err
    assert err[0].startswith("reasonrl report: error: ") and f"(no space left on device; the file system at {small_disk.resolve()})" in err[0]
    assert not (small_disk / "report" / "report.html").exists()


def test_malformed_events_and_config_name_the_line(tmp_path):
    run = tmp_path / "bad"
    _write_run(run, [{"step": 1}])
    (run / "events.jsonl").write_text('{"time": 1.0, "kind": "start", "step": 0}\n\n{"time": 2.0, "step": 1}\n')
    with pytest.raises(InputError, match=re.escape("events.jsonl, line 3: not an event: kind=None")):
        write_report([run])
    (run / "events.jsonl").unlink()
    (run / "config.yaml").write_text("algo:\n  eps_high: 0.28\n   eps_low: [\n")
    with pytest.raises(InputError, match=re.escape("config.yaml, line 3")):
        write_report([run])
    (run / "config.yaml").write_text("- algo\n")
    with pytest.raises(InputError, match="config.yaml, line 1: expected a mapping"):
        write_report([run])


def test_missing_run_dir_or_metrics(tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere"):
        write_report([tmp_path / "nowhere"])
    (tmp_path / "empty_dir").mkdir()
    with pytest.raises(FileNotFoundError, match="empty_dir"):
        write_report([tmp_path / "empty_dir"])


def test_metrics_without_rows(tmp_path):
    run = tmp_path / "blank"
    run.mkdir()
    (run / "metrics.jsonl").write_text("")
    with pytest.raises(ValueError, match="blank"):
        write_report([run])


def _record(step, split, prompt_id, sample, correct, response="Answer: 3"):
    return {"step": step, "split": split, "prompt_id": prompt_id, "data_source": "embedded/add", "sample": sample,
            "prompt": "1+2=?", "response": response, "ground_truth": "3", "pred": "3" if correct else "4",
            "score": 1.0 if correct else -1.0, "correct": correct, "length": 9, "truncated": False}


def test_report_shows_a_few_validation_samples_per_validation_step_wrong_first(tmp_path):
    run = tmp_path / "dapo"
    _write_run(run, _rows(0.1))
    records = [_record(1, "train", "t0", 0, False, "train <only>")]
    records += [_record(2, "val", f"p{i}", j, i % 2 == 0, f"step 2 p{i} s{j} <b>") for i in range(5) for j in range(2)]
    records += [_record(4, "val", "p0", 0, True, "step 4 p0")]
    (run / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    page = write_report([run]).read_text()
    samples = _section(page, "Validation samples")
    step2, step4 = samples.split("<summary>step ")[1:]
    assert step2.startswith("2<") and step4.startswith("4<")
    shown = re.findall(r"step 2 p(\d) s(\d)", step2)
    assert shown == [("1", "0"), ("3", "0"), ("0", "0")]  # the 2 wrong first samples, then a right one: 3 in all
    assert "&lt;b&gt;" in step2 and "<b>" not in samples and "train" not in samples
    assert "step 4 p0" in step4


def test_report_without_samples_has_no_samples_section(tmp_path):
    _write_run(tmp_path / "bare", _rows(0.1))
    assert "Validation samples" not in write_report([tmp_path / "bare"]).read_text()


def test_report_shows_the_forecast_of_a_run_with_enough_validations(tmp_path):
    from reasonrl.experiments.forecast import Curve, evaluations, forecast

    curve = Curve(0.3, 0.8, 1.5, 2000.0)
    rows = [{"step": s, "batch/generated_samples": 100.0 * (s > 0)} | ({"val/acc": float(curve(100.0 * s))} if s % 2 == 0 else {})
            for s in range(0, 21)]
    # The last two validations logged their forecasts, as a run does.
    for upto in (18, 20):
        fc = forecast(*evaluations(rows, upto), 30, 0.7)
        rows[upto] |= fc.metrics()
    _write_run(tmp_path / "long", rows, ["train.total_steps=30", "eval.target=0.7"])
    _write_run(tmp_path / "short", _rows(0.1))  # 2 validations
    page = write_report([tmp_path / "long", tmp_path / "short"], tmp_path / "out").read_text()
    assert (tmp_path / "out" / "forecast.png").read_bytes().startswith(PNG) and 'src="forecast.png"' in page
    section = _section(page, "Forecast of held-out accuracy")
    expected = forecast(*evaluations(rows), 30, 0.7)  # every validation, to train.total_steps
    assert f"plateau (A): {expected.plateau:.3f}" in section and "val/acc at step 30" in section
    assert "val/acc 0.7 reached at step" in section
    assert "no forecast: not enough evaluations: no samples generated" in section  # its rows have no batch/*
    table = page.split("<h2>")[0]  # the summary table: the plateau and the step to eval.target with their intervals
    assert f"<td>{expected.plateau:.3f} [{expected.plateau_lo:.3f}, {expected.plateau_hi:.3f}]</td>" in table
    assert f"<td>0.7: {expected.target_step:.0f} [" in table
