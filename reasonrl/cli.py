"""Command line: ``reasonrl train | config | sft | eval | demo | export | report | forecast | sweep | samples | drill | env-check | trace``.

    reasonrl train recipes/dapo.yaml train.total_steps=50 run.dir=runs/dapo
    reasonrl train dapo --dry-run                check config, data, reward, model, device, context; print the plan
    reasonrl config [RECIPE] [key=value ...]     the resolved config as YAML; --keys: every key with type, default, help
    reasonrl sft [RECIPE] [key=value ...]        build (or find) the cached warm start
    reasonrl eval [RECIPE] [--model DIR] [--data FILE] [key=value ...]   mean@k, pass@k, maj@k, greedy accuracy
    reasonrl demo [key=value ...]                the embedded example end to end, then a report
    reasonrl export RUN_DIR [--step N] [--adapter] OUT   a run's policy as a Hugging Face model directory (LoRA: merged, or --adapter)
    reasonrl report RUN_DIR [RUN_DIR ...]        PNG plots and report.html comparing runs
    reasonrl forecast RUN_DIR [--at 0.3]         held-out accuracy's fitted curve: plateau, final val/acc, step to eval.target
    reasonrl sweep SWEEP.yaml --dir DIR [k=v]    every cell x seed of a sweep file, resumable; summary with intervals
    reasonrl sweep --status DIR                  where a sweep stands
    reasonrl sweep SWEEP.yaml --dir DIR --fit-mix   then a mixture law's best static mix (a sweep over mix weights)
    reasonrl samples RUN_DIR [--step N] [--wrong|--right]   the prompts, responses and rewards a run kept
    reasonrl drill [--steps N] [key=value ...]   one fault of each kind on the demo: detection, recovery, ETTR
    reasonrl env-check NAME [--policy scripted] [env.args.k=v ...]   play an environment and check it
    reasonrl trace RUN_DIR                       per trainer rank: collectives, waits, bandwidth; the slow or stuck rank

Exit codes: 0 done (also a complete run started again); 1 a failure the supervisor could not recover from; 2 bad usage or input, or
another error that a restart would meet again (one line on stderr, no restart); 128 + N after
signal N (130 after Ctrl-C, 143 after SIGTERM, 129 after SIGHUP), with a checkpoint written.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import signal
import sys
import textwrap
from pathlib import Path

from reasonrl import __version__
from reasonrl.config import RECIPES, dump_text, keys_help, load, load_recipe, recipe_path
from reasonrl.errors import EXIT_FATAL, FatalError, InputError, InputNotFound, error_line
from reasonrl.preflight import preflight, run_state, same_run
from reasonrl.resilience.rundir import ATTEMPT_ENV, SUPERVISOR_ENV
from reasonrl.runtime.threads import openmp_waits

def cmd_train(args: argparse.Namespace) -> int:
    """Check the run (:mod:`reasonrl.preflight`), then train; by default in a supervised child
    process that is restarted after failures. ``--dry-run``: only the checks and the plan.

    Supervised, the checks run in the supervisor's first child, which loads torch and
    ``transformers`` to train anyway (a restart skips them): the supervisor itself stays a
    small process that loads neither. It only finds a complete run complete, and takes the
    run directory's lock."""
    recipe = recipe_path(args.recipe)
    cfg = load(recipe, args.overrides)
    supervising = not args.no_supervisor and cfg.resilience.supervise and not args.dry_run
    if not supervising:  # this process loads torch: its OpenMP threads' wait, chosen first (else by the supervisor)
        args.openmp_waits = openmp_waits()
    if SUPERVISOR_ENV in os.environ and os.environ.get(ATTEMPT_ENV, "1") != "1":
        return _train_here(cfg)  # a restart: the first child checked this run
    if supervising:
        if run_state(cfg).kind == "complete" and same_run(cfg):
            print(complete_summary(cfg))
            return 0
        from reasonrl.resilience.supervisor import train_supervised

        return train_supervised(cfg, [sys.executable, "-m", "reasonrl.cli", "train", "--no-supervisor", str(recipe),
                                      *args.overrides])
    plan = preflight(cfg)
    if args.dry_run:
        print(plan.describe())
        return 0
    if plan.state.kind == "complete" and same_run(cfg):
        print(complete_summary(cfg))
        return 0
    print(plan.starting(args.openmp_waits), flush=True)
    return _train_here(cfg)


def _train_here(cfg) -> int:
    """Train in this process (:func:`reasonrl.api.train_in_process`) and print the run's summary;
    a standby trainer the supervisor retired prints nothing."""
    from reasonrl.api import train_in_process

    summary, stopped_by = train_in_process(cfg)
    if stopped_by is not None:
        return 128 + stopped_by
    if summary is not None:
        print(json.dumps(summary))
    return 0


def cmd_sft(args: argparse.Namespace) -> int:
    """Build (or find) the recipe's warm start: of its shipped environment (env.name), else of
    the embedded task."""
    from reasonrl.warmstart import resolve_model_dir
    from reasonrl.warmstart.sft import ensure_warm_start

    cfg = load_recipe(args.recipe, args.overrides)
    out = resolve_model_dir(cfg) if cfg.model.path == "embedded" else ensure_warm_start(cfg.sft, cfg.data.families)
    print(out)
    print((out / "sft_summary.json").read_text())
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    """Evaluate models (--model, default model.path) on datasets (--data, default the held-out
    split): a table on stdout (--json: one JSON object), every sample to a JSONL file."""
    from reasonrl.api import evaluate
    from reasonrl.evaluation import format_table

    cfg = load_recipe(args.recipe, args.overrides)
    results = evaluate(cfg, args.model, args.data, step=args.step, sources=args.source, limit=args.limit,
                       samples=args.out)
    if args.json:
        print(json.dumps(results))
    else:
        print(format_table(results))
        print(f"samples: {results['samples']}")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    """The DAPO recipe on the embedded task, then the report; a second call finds the run
    complete and only prints its results."""
    from reasonrl.report import write_report

    cfg = load(RECIPES / "dapo.yaml", ["run.dir=runs/demo", *args.overrides])
    plan = preflight(cfg)
    if plan.state.kind == "complete" and same_run(cfg):
        print(complete_summary(cfg))
    else:
        from reasonrl.controller import Controller

        print(f"memory: {plan.memory}", flush=True)
        print(f"openmp: threads wait {args.openmp_waits}", flush=True)
        controller = Controller.from_config(cfg)
        controller.run()
        if controller.stopped_by is not None:
            return 128 + controller.stopped_by
    from reasonrl.metrics import forecast_text, read_jsonl

    rows = [r for r in read_jsonl(Path(cfg.run.dir) / "metrics.jsonl") if "val/acc" in r]
    report = write_report([cfg.run.dir])
    before, after = rows[0], rows[-1]
    print(f"\nheld-out accuracy (mean over {cfg.eval.k} samples): {before['val/acc']:.3f} -> {after['val/acc']:.3f}")
    if "val/acc_greedy" in before:
        print(f"held-out greedy accuracy:                   {before['val/acc_greedy']:.3f} -> {after['val/acc_greedy']:.3f}")
    if "forecast/plateau" in after:
        print(f"forecast of held-out accuracy (fit to {after['forecast/evals']:.0f} validations, 95% intervals): "
              + " ".join(forecast_text(after)))
    print(f"report: {report}")
    print(f"trained policy: {Path(cfg.run.dir) / 'final'}")
    return 0


def cmd_config(args: argparse.Namespace) -> int:
    """Print the resolved config as YAML, or with ``--keys`` every key with type, default and help."""
    cfg = load_recipe(args.recipe, args.overrides)
    if not args.keys:
        print(dump_text(cfg), end="")
        return 0
    for k in keys_help(cfg):
        differs = f"; here: {json.dumps(k.value)}" if k.value != k.default else ""
        print(f"{k.key}  ({k.type}, default {json.dumps(k.default)}{differs})")
        print(textwrap.indent(k.help, "    "))
    return 0


def complete_summary(cfg) -> str:
    """What a finished run reports when it is started again: that it is complete, its last
    held-out metrics with their forecast (without a validation, its last training metrics),
    and its ETTR figures."""
    from reasonrl.api import complete_line, rows_summary
    from reasonrl.metrics import console_fields
    from reasonrl.resilience.supervisor import summarize_run

    run_dir = Path(cfg.run.dir)
    val = rows_summary(run_dir, console_fields(cfg.rollout.mode))
    figures = summarize_run(run_dir)
    summary = {"step": cfg.train.total_steps, **val, **{k: figures[k] for k in ("ettr", "time_lost_s", "incidents")}}
    return complete_line(cfg) + "\n" + json.dumps(summary)


def cmd_drill(args: argparse.Namespace) -> int:
    """Rehearse every fault kind on the embedded demo; print and save the table."""
    from reasonrl.resilience.drill import format_table, run_drill

    root = Path(args.dir)
    rows, ettr = run_drill(args.overrides, root, args.steps, RECIPES / "dapo.yaml")
    table = format_table(rows, ettr)
    (root / "drill.md").write_text(table + "\n")
    (root / "drill.json").write_text(json.dumps({"rows": rows, "ettr": ettr}, indent=2))
    print(table)
    ok = all(r["detected"] and (r["weights_equal"] or not r["expected_equal"]) for r in rows)
    return 0 if ok else 1


def cmd_env_check(args: argparse.Namespace) -> int:
    """Play an environment with a random or scripted policy and report what it does; exit 1
    when a check fails (wrong return types, a reset that ignores or misreads its seed, errors,
    slow calls)."""
    from reasonrl.env.check import env_check
    from reasonrl.runtime.pool import PoolStart

    if args.list:
        from reasonrl.env.registry import ENVS

        print("\n".join(ENVS))
        return 0
    if args.name is None:
        raise InputError("env-check: expected an environment name (a shipped one: --list; module:Class; or path/to/file.py:Class)")
    cfg = load(None, [f"env.name={args.name}", *args.overrides])
    e = cfg.env
    workers = PoolStart("env", 1, cfg.runtime.roles.env.timeout_s)  # a hanging call is reported, never waited on
    report = env_check(e.name, e.args, args.episodes, args.seed, args.policy, workers,
                       args.max_turns or e.max_turns, e.tools, e.tool_call_pattern, e.tool_response_format)
    print(report.describe())
    return 0 if report.passed else 1


def cmd_trace(args: argparse.Namespace) -> int:
    """The collectives of a run with several trainer ranks, per rank (wait, arrival order,
    bandwidth), and the slow or stuck rank, by the thresholds of the run's config.yaml."""
    from reasonrl.resilience.collectives import TRACE_DIR, analyse, format_table

    run_dir = Path(args.run_dir)
    cfg = load(run_dir / "config.yaml") if (run_dir / "config.yaml").is_file() else load(None)
    r = cfg.resilience
    report = analyse(run_dir / TRACE_DIR, stuck_after_s=cfg.runtime.collective_timeout_s, ratio=r.slow_ratio,
                     min_s=r.slow_min_s)
    print(format_table(report))
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    """A run's policy (the newest checkpoint, or --step N) as a Hugging Face model directory; a
    LoRA run's merged, or (--adapter) its adapter directory."""
    from reasonrl.checkpoint.export import export_model

    try:
        print(export_model(args.run_dir, args.out, args.step, args.force, args.adapter))
    except OSError as err:  # a full or read-only disk: nothing was left half-written
        raise InputError(f"{args.out}: the export could not be written ({error_line(err)})") from err
    return 0


def cmd_ledger(args: argparse.Namespace) -> int:
    """Every prompt draw of a run and its one fate (prompts.jsonl): counts per fate; exit 0
    when every draw has exactly one, 1 naming the draws that break the rule."""
    from reasonrl.ledger import check_ledger

    ledger = check_ledger(args.run_dir)
    print(ledger.describe())
    return 0 if ledger.ok else 1


def cmd_scale(args: argparse.Namespace) -> int:
    """Ask a run for other worker counts (ROLE=N ...): kept in RUN_DIR/scale.json; a running run
    applies a rollout count before its next step (with --at-step K, before the collect of step
    K's batch), reward and env counts when it next starts."""
    from reasonrl.runtime.scaling import LIVE, request_scale

    counts = {}
    for item in args.counts:
        role, sep, count = item.partition("=")
        if not sep or not count.strip().isdigit():
            raise InputError(f"reasonrl scale: {item!r} is not ROLE=N (for example rollout=3)")
        counts[role.strip()] = int(count)
    merged = request_scale(args.run_dir, counts, at_step=args.at_step)
    for role, n in sorted(counts.items()):
        if args.at_step is not None:
            when = f"from the collect of step {args.at_step}'s batch on, every worker serving before it"
        elif role in LIVE:
            when = "before its next step (if it is running), else when it starts"
        else:
            when = "when it next starts"
        print(f"{role}: {n} workers, applied {when}")
    print(f"kept in {Path(args.run_dir) / 'scale.json'}: {merged}")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from reasonrl.report import write_report

    print(write_report(args.run_dirs, args.out))
    return 0


def cmd_forecast(args: argparse.Namespace) -> int:
    """Fit the run's held-out accuracy (its validations up to ``--upto STEP``, or up to
    ``--at FRACTION`` of train.total_steps; default all) and print the forecast: the plateau,
    val/acc at train.total_steps and the step at which the target is reached, with 95%
    intervals; where the run has a validation at train.total_steps, whether it lies in the
    forecast's interval."""
    from reasonrl.experiments.forecast import EXCLUDE, evaluations, forecast, format_step
    from reasonrl.metrics import read_jsonl

    run_dir = Path(args.run_dir)
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        raise InputNotFound(f"{path}: no such file; expected a run directory (run.dir)")
    rows = read_jsonl(path)
    cfg = load(run_dir / "config.yaml") if (run_dir / "config.yaml").is_file() else None
    horizon = cfg.train.total_steps if cfg else max((r["step"] for r in rows), default=0)
    target = args.target if args.target is not None else cfg.eval.target if cfg else None
    if args.at is not None and args.upto is not None:
        raise InputError("forecast: give --at FRACTION or --upto STEP, not both")
    if args.at is not None and not 0 < args.at <= 1:
        raise InputError(f"forecast: --at {args.at}: expected a fraction of train.total_steps in (0, 1]")
    upto = int(args.at * horizon) if args.at is not None else args.upto
    steps, samples, acc = evaluations(rows, upto)
    try:
        fc = forecast(steps, samples, acc, horizon, target, exclude=EXCLUDE if args.exclude is None else args.exclude)
    except ValueError as err:
        raise InputError(f"forecast {run_dir}" + (f" up to step {upto}" if upto is not None else "") + f": {err}") from None
    measured = next((r["val/acc"] for r in rows if r["step"] == horizon and r.get("val/acc") is not None), None)
    inside = None if measured is None else fc.final_lo <= measured <= fc.final_hi
    reached = next((r["step"] for r in sorted(rows, key=lambda r: r["step"])
                    if target is not None and r.get("val/acc") is not None and r["val/acc"] >= target), None)
    if args.json:
        out = {"run_dir": str(run_dir), "upto": fc.last_step, "evals": fc.evals, "level": fc.level,
               "r0": fc.curve.r0, "a": fc.curve.a, "b": fc.curve.b, "c_mid": fc.curve.c_mid,
               "plateau": [fc.plateau, fc.plateau_lo, fc.plateau_hi], "horizon": horizon,
               "final": [fc.final, fc.final_lo, fc.final_hi], "measured_final": measured, "inside": inside,
               "target": target, "target_step": None if target is None else
               [format_step(x) for x in (fc.target_step, fc.target_step_lo, fc.target_step_hi)],
               "measured_target_step": reached}
        print(json.dumps(out))
        return 0
    print(f"{run_dir}: {fc.describe()}")
    if measured is not None:
        print(f"measured val/acc at step {horizon}: {measured:.3f}, "
              + ("inside" if inside else "outside") + f" the {fc.level:.0%} prediction interval")
    if target is not None and upto is not None:
        print(f"measured: val/acc first reached {target:g} at step " + (f"{reached}" if reached is not None else
                                                                       "- (not within the run)"))
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    """Train every cell x seed of a sweep file under --dir (resuming a sweep that was stopped),
    then print and write its summary; ``--status DIR``: where a sweep stands. ``--fit-mix``:
    then the mixture law of a sweep over mix weights. Exit 1 when some run failed."""
    from reasonrl.experiments.mixfit import mixtures
    from reasonrl.experiments.runner import SPEC_FILE, run_sweep, status_text, write_mix_law
    from reasonrl.experiments.sweep import read_sweep

    if args.status is not None:
        if args.sweep is not None or args.dir is not None or args.overrides:
            raise InputError("sweep --status DIR takes no sweep file, no --dir and no overrides")
        print(status_text(Path(args.status)))
        if args.fit_mix:
            write_mix_law(read_sweep(Path(args.status) / SPEC_FILE), Path(args.status))
        return 0
    if args.sweep is None or args.dir is None:
        raise InputError("sweep: expected a sweep file and --dir DIR (reasonrl sweep SWEEP.yaml --dir DIR), or "
                         "--status DIR")
    sweep = read_sweep(args.sweep, args.overrides)
    if args.fit_mix:
        mixtures(sweep)  # a sweep that varies no mixture is refused before anything trains
    code = run_sweep(sweep, Path(args.dir))
    if args.fit_mix and code in (0, 1):
        write_mix_law(sweep, Path(args.dir))
    return code


def cmd_samples(args: argparse.Namespace) -> int:
    """The samples a run kept (RUN_DIR/samples.jsonl), filtered by step, split and correctness."""
    from reasonrl.samples import format_samples, read_samples

    path = Path(args.run_dir) / "samples.jsonl"
    if not path.is_file():
        raise InputError(f"{path}: no such file; the run kept no samples (run.keep_samples=0, or it has not "
                         "finished a step)")
    correct = True if args.right else False if args.wrong else None
    records = read_samples(path, args.step, args.split, correct)
    if args.step is None and records:  # the newest step that has any
        newest = max(r["step"] for r in records)
        records = [r for r in records if r["step"] == newest]
    records = records[: args.limit] if args.limit else records
    if args.json:
        print("\n".join(json.dumps(r) for r in records))
    elif records:
        print(format_samples(records))
    else:
        print(f"{path}: no samples match", file=sys.stderr)
    return 0


class _HelpWithKeys(argparse.Action):
    """``-h``: the command's help, then every config key with its type, default and the first
    line of its help (``reasonrl config --keys`` prints the whole help)."""

    def __init__(self, option_strings, dest, help=None):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        lines = [f"  {k.key} ({k.type} = {json.dumps(k.default)}): {_first_sentence(k.help)}" for k in keys_help()]
        print(parser.format_help())
        print("config keys (dotted key=value overrides; `reasonrl config [RECIPE] --keys` for the full help):")
        print("\n".join(lines))
        parser.exit()


def _first_sentence(text: str, limit: int = 100) -> str:
    """The first sentence of ``text`` on one line, cut to ``limit`` characters."""
    line = " ".join(text.split())
    sentence = line.split(". ")[0].rstrip(".") + "."
    return sentence if len(sentence) <= limit else sentence[: limit - 3].rstrip() + "..."


def build_parser() -> argparse.ArgumentParser:
    """The ``reasonrl`` parser with every subcommand (``main`` runs it; docs/gen_ref.py documents it)."""
    parser = argparse.ArgumentParser(prog="reasonrl", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"reasonrl {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, fn, needs_recipe in (("train", cmd_train, True), ("sft", cmd_sft, False), ("eval", cmd_eval, False),
                                   ("config", cmd_config, False)):
        p = sub.add_parser(name, add_help=False, formatter_class=argparse.RawDescriptionHelpFormatter)
        p.add_argument("-h", "--help", action=_HelpWithKeys, help="show this help and every config key, then exit")
        p.add_argument("recipe", nargs=None if needs_recipe else "?", help="recipe YAML or a packaged recipe name (dapo, grpo, ...)")
        p.add_argument("overrides", nargs="*", help="dotted key=value overrides")
        p.set_defaults(fn=fn)
        if name == "train":
            p.add_argument("--no-supervisor", action="store_true", help="train in this process (no restarts after failures)")
            p.add_argument("--dry-run", action="store_true",
                           help="check config, data, reward function, model directory, device and context length, "
                                "print what would run, and exit (nothing is loaded or written)")
        if name == "config":
            p.add_argument("--keys", action="store_true", help="list every key with its type, default and help")
        if name == "eval":
            p.add_argument("--model", action="append", default=[], metavar="PATH",
                           help="a Hugging Face model directory, or a run directory (its final/; with --step N its "
                                "checkpoint); repeat for several (default: model.path)")
            p.add_argument("--step", type=int, default=None, help="evaluate the run directories' checkpoints/step_N")
            p.add_argument("--data", action="append", default=[], metavar="FILE",
                           help="a dataset any data.source takes (a DatasetDict: its test split); repeat for several "
                                "(default: the held-out split of data.*)")
            p.add_argument("--source", action="append", default=[], metavar="NAME",
                           help="only rows of this data_source (e.g. MATH-500); repeatable")
            p.add_argument("--limit", type=int, default=None, metavar="N", help="the first N rows of each dataset "
                           "(default: every row)")
            p.add_argument("--out", default=None, metavar="FILE.jsonl",
                           help="where every sample goes (default: eval_results/eval-<UTC time>.jsonl)")
            p.add_argument("--json", action="store_true", help="print the results as one JSON object")
    p = sub.add_parser("demo")
    p.add_argument("overrides", nargs="*")
    p.set_defaults(fn=cmd_demo)
    p = sub.add_parser("drill", help="inject one fault of each kind into the demo and tabulate detection and recovery")
    p.add_argument("overrides", nargs="*")
    p.add_argument("--dir", default="runs/drill")
    p.add_argument("--steps", type=int, default=80)
    p.set_defaults(fn=cmd_drill)
    p = sub.add_parser("env-check", help="play an environment with a random or scripted policy; check its "
                                         "protocol, determinism by seed and timing; print returns and lengths")
    p.add_argument("name", nargs="?", default=None, help="a shipped environment (grid, tool_arith), module:Class or path/to/file.py:Class")
    p.add_argument("overrides", nargs="*", help="env.* and runtime.roles.env.* overrides (env.args.size=5, runtime.roles.env.timeout_s=2, ...)")
    p.add_argument("--list", action="store_true", help="list the shipped environments")
    p.add_argument("--episodes", type=int, default=20, help="episodes to play (default 20)")
    p.add_argument("--seed", type=int, default=0, help="the first reset seed (default 0)")
    p.add_argument("--policy", choices=("random", "scripted"), default="random",
                   help="random actions, or the environment's demonstration (default random)")
    p.add_argument("--max-turns", type=int, default=0, help="turns per episode (default: env.max_turns)")
    p.set_defaults(fn=cmd_env_check)
    p = sub.add_parser("trace", help="per trainer rank: collectives, wait time, arrival order, bandwidth; the "
                                     "slow or stuck rank")
    p.add_argument("run_dir", help="the run directory (run.dir) of a run with runtime.trainer_ranks > 1")
    p.set_defaults(fn=cmd_trace)
    p = sub.add_parser("export", help="write a run's policy as a Hugging Face model directory")
    p.add_argument("run_dir", help="the run directory (run.dir)")
    p.add_argument("out", help="the directory to write (new or empty, outside any run directory)")
    p.add_argument("--force", action="store_true", help="replace a previous export in OUT")
    p.add_argument("--step", type=int, default=None, help="export checkpoints/step_N (default: the newest valid checkpoint)")
    p.add_argument("--adapter", action="store_true", help="a LoRA run: write the adapter directory (peft format) "
                                                          "instead of the merged model")
    p.set_defaults(fn=cmd_export)
    p = sub.add_parser("ledger", help="check that every prompt draw of a run has exactly one fate (trained, dropped "
                                      "stale, filtered, left over); exit 1 naming the draws that do not")
    p.add_argument("run_dir", help="the run directory (run.dir)")
    p.set_defaults(fn=cmd_ledger)
    p = sub.add_parser("scale", help="change a run's worker counts (rollout=N live; reward=N, env=N at its next "
                                     "start), within runtime.roles.<role>.min/.max")
    p.add_argument("run_dir", help="the run directory (run.dir)")
    p.add_argument("counts", nargs="+", metavar="ROLE=N", help="rollout=3, reward=2, env=4")
    p.add_argument("--at-step", type=int, default=None, metavar="K",
                   help="rollout=N from the collect of step K's batch on (a schedule: a run started again, and a "
                        "lockstep run, resize at the same collects); without it a rollout count replaces the schedule")
    p.set_defaults(fn=cmd_scale)
    p = sub.add_parser("report")
    p.add_argument("run_dirs", nargs="+")
    p.add_argument("--out", default=None)
    p.set_defaults(fn=cmd_report)
    p = sub.add_parser("forecast", help="fit a run's held-out accuracy against samples (ScaleRL's sigmoid): the "
                                        "plateau, val/acc at the last step and the step a target is reached, with "
                                        "95%% intervals")
    p.add_argument("run_dir", help="the run directory (run.dir)")
    p.add_argument("--at", type=float, default=None, metavar="FRACTION",
                   help="fit only the validations up to this fraction of train.total_steps (0.3: the first 30%%)")
    p.add_argument("--upto", type=int, default=None, metavar="STEP", help="fit only the validations up to STEP")
    p.add_argument("--target", type=float, default=None, help="the held-out accuracy to forecast the step of "
                                                              "(default: the run's eval.target)")
    p.add_argument("--exclude", type=float, default=None, metavar="FRACTION",
                   help="leave the validations before this fraction of the samples generated out of the fit (the "
                        "first still anchors R0; default 0.25, as a run's own forecast)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(fn=cmd_forecast)
    p = sub.add_parser("sweep", help="train every cell x seed of a sweep file (resumable) and summarise them: means "
                                     "with intervals over seeds, differences to the baseline, verdicts (docs/sweeps.md)")
    p.add_argument("sweep", nargs="?", default=None, help="the sweep file (recipe, set, grid or cells, seeds, baseline, "
                                                         "target, sweep)")
    p.add_argument("overrides", nargs="*", help="sweep.parallel=N, sweep.run_timeout_h=H; any other dotted "
                                                "key=value is added to the sweep's set")
    p.add_argument("--dir", default=None, help="the sweep directory: one run directory per cell and seed, the summary")
    p.add_argument("--status", default=None, metavar="DIR", help="print where the sweep in DIR stands and exit")
    p.add_argument("--fit-mix", action="store_true",
                   help="after a sweep over mix weights (one key of weight lists, or numeric keys summing to 1 in "
                        "every cell), fit a quadratic mixture law to the final val/acc and print the static mix it "
                        "predicts best, with 95%% intervals (DIR/mix_fit.json)")
    p.set_defaults(fn=cmd_sweep)
    p = sub.add_parser("samples", help="print the prompts, responses and rewards a run kept")
    p.add_argument("run_dir", help="the run directory (run.dir)")
    p.add_argument("--step", type=int, default=None, help="the samples of step N (default: the newest step)")
    p.add_argument("--split", choices=("train", "val"), default=None, help="training or validation samples (default: both)")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--wrong", action="store_true", help="only incorrect samples")
    which.add_argument("--right", action="store_true", help="only correct samples")
    p.add_argument("--limit", type=int, default=20, help="at most N samples (0: all; default 20)")
    p.add_argument("--json", action="store_true", help="one JSON record per line")
    p.set_defaults(fn=cmd_samples)
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line as the commands read it; bad usage exits 2 with argparse's message."""
    parser = build_parser()
    # Positionals may follow flags (`train grpo --no-supervisor a=b`): argparse leaves the
    # later ones over, which belong to the command's positional list.
    args, rest = parser.parse_known_args(argv)
    positional = "overrides" if hasattr(args, "overrides") else "run_dirs" if hasattr(args, "run_dirs") else None
    if rest and (positional is None or any(r.startswith("-") for r in rest)):
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    if rest:
        setattr(args, positional, [*getattr(args, positional), *rest])
    if args.command in ("sft", "eval", "config") and args.recipe and "=" in args.recipe:
        args.overrides, args.recipe = [args.recipe, *args.overrides], None
    return args


TRAINING_COMMANDS = ("train", "demo", "sft", "eval", "sweep", "drill")
"""The commands that run torch: how its OpenMP threads wait is chosen before they load it."""


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.command in TRAINING_COMMANDS and args.command != "train":  # before anything loads torch (train: cmd_train)
        args.openmp_waits = openmp_waits()
    try:
        return args.fn(args)
    except FatalError as err:
        print(f"reasonrl {args.command}: error: {err}", file=sys.stderr)
        return EXIT_FATAL
    except KeyboardInterrupt:
        print(f"reasonrl {args.command}: interrupted", file=sys.stderr)
        return 128 + signal.SIGINT
    except BrokenPipeError:  # `reasonrl config --keys | head`: the reader has gone
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE


def run() -> None:
    """The ``reasonrl`` command (the console script, ``python -m reasonrl.cli``): :func:`main`,
    then exit with its code. Everything alive then is frozen out of the garbage collector
    (``gc.freeze``) first: the interpreter's collections at exit would otherwise walk every
    object of torch and ``transformers`` once more (most of a second of CPU) before the process
    could end. Exit handlers, file closing and flushing run as always."""
    code = main()
    gc.freeze()
    sys.exit(code)


if __name__ == "__main__":
    run()
