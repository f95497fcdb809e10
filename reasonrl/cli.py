"""Command line: ``reasonrl train | sft | eval | demo | report``.

    reasonrl train recipes/dapo.yaml train.total_steps=50 run.dir=runs/dapo
    reasonrl sft [RECIPE] [key=value ...]        build (or find) the cached warm start
    reasonrl eval RECIPE [key=value ...]         held-out accuracy of model.path (or a run's final/)
    reasonrl demo [key=value ...]                the embedded example end to end, then a report
    reasonrl report RUN_DIR [RUN_DIR ...]        PNG plots and report.html comparing runs
    reasonrl drill [--steps N] [key=value ...]   one fault of each kind on the demo: detection, recovery, ETTR

Exit codes: 0 done; 1 a failure the supervisor could not recover from; 2 bad usage or input, or
another error that a restart would meet again (one line on stderr, no restart); 128 + N after
signal N (130 after Ctrl-C, 143 after SIGTERM, 129 after SIGHUP), with a checkpoint written.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path

from reasonrl.config import load
from reasonrl.errors import EXIT_FATAL, FatalError

RECIPES = Path(__file__).resolve().parent.parent / "recipes"


def _recipe(name: str | None) -> Path | None:
    """A recipe path; a bare name like 'dapo' means recipes/dapo.yaml."""
    if name is None:
        return None
    path = Path(name)
    if not path.exists() and (RECIPES / f"{name}.yaml").exists():
        return RECIPES / f"{name}.yaml"
    return path


def cmd_train(args: argparse.Namespace) -> int:
    """Train; by default in a supervised child process that is restarted after failures."""
    recipe = _recipe(args.recipe)
    cfg = load(recipe, args.overrides)
    if args.no_supervisor or not cfg.resilience.supervise:
        from reasonrl.controller import Controller
        from reasonrl.resilience.rundir import follow_supervisor

        follow_supervisor()
        controller = Controller(cfg)
        last = controller.run()
        if controller.stopped_by is not None:
            return 128 + controller.stopped_by
        print(json.dumps({k: round(v, 4) for k, v in last.items() if k.startswith("val/")}))
        return 0
    from reasonrl.resilience.supervisor import train_supervised

    return train_supervised(cfg, [sys.executable, "-m", "reasonrl.cli", "train", "--no-supervisor", str(recipe), *args.overrides])


def cmd_sft(args: argparse.Namespace) -> int:
    from reasonrl.data.sft import ensure_warm_start

    cfg = load(_recipe(args.recipe), args.overrides)
    out = ensure_warm_start(cfg.sft, cfg.data.families)
    print(out)
    print((out / "sft_summary.json").read_text())
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from reasonrl.evaluation import evaluate

    cfg = load(_recipe(args.recipe), args.overrides)
    print(json.dumps({k: round(v, 4) for k, v in evaluate(cfg).items()}))
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from reasonrl.controller import Controller
    from reasonrl.report import write_report

    cfg = load(RECIPES / "dapo.yaml", ["run.dir=runs/demo", *args.overrides])
    controller = Controller(cfg)
    controller.run()
    if controller.stopped_by is not None:
        return 128 + controller.stopped_by
    from reasonrl.metrics import read_jsonl

    rows = [r for r in read_jsonl(Path(cfg.run.dir) / "metrics.jsonl") if "val/acc" in r]
    report = write_report([cfg.run.dir])
    before, after = rows[0], rows[-1]
    print(f"\nheld-out accuracy (mean over {cfg.eval.k} samples): {before['val/acc']:.3f} -> {after['val/acc']:.3f}")
    if "val/acc_greedy" in before:
        print(f"held-out greedy accuracy:                   {before['val/acc_greedy']:.3f} -> {after['val/acc_greedy']:.3f}")
    print(f"report: {report}")
    print(f"trained policy: {Path(cfg.run.dir) / 'final'}")
    return 0


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


def cmd_report(args: argparse.Namespace) -> int:
    from reasonrl.report import write_report

    print(write_report(args.run_dirs, args.out))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="reasonrl", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, fn, needs_recipe in (("train", cmd_train, True), ("sft", cmd_sft, False), ("eval", cmd_eval, True)):
        p = sub.add_parser(name)
        p.add_argument("recipe", nargs=None if needs_recipe else "?", help="recipe YAML or a name in recipes/ (dapo, grpo, ...)")
        p.add_argument("overrides", nargs="*", help="dotted key=value overrides")
        p.set_defaults(fn=fn)
        if name == "train":
            p.add_argument("--no-supervisor", action="store_true", help="train in this process (no restarts after failures)")
    p = sub.add_parser("demo")
    p.add_argument("overrides", nargs="*")
    p.set_defaults(fn=cmd_demo)
    p = sub.add_parser("drill", help="inject one fault of each kind into the demo and tabulate detection and recovery")
    p.add_argument("overrides", nargs="*")
    p.add_argument("--dir", default="runs/drill")
    p.add_argument("--steps", type=int, default=80)
    p.set_defaults(fn=cmd_drill)
    p = sub.add_parser("report")
    p.add_argument("run_dirs", nargs="+")
    p.add_argument("--out", default=None)
    p.set_defaults(fn=cmd_report)
    # Positionals may follow flags (`train grpo --no-supervisor a=b`): argparse leaves the
    # later ones over, which belong to the command's positional list.
    args, rest = parser.parse_known_args(argv)
    positional = "overrides" if hasattr(args, "overrides") else "run_dirs" if hasattr(args, "run_dirs") else None
    if rest and (positional is None or any(r.startswith("-") for r in rest)):
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    if rest:
        setattr(args, positional, [*getattr(args, positional), *rest])
    if args.command == "sft" and args.recipe and "=" in args.recipe:
        args.overrides, args.recipe = [args.recipe, *args.overrides], None
    try:
        return args.fn(args)
    except FatalError as err:
        print(f"reasonrl {args.command}: error: {err}", file=sys.stderr)
        return EXIT_FATAL
    except KeyboardInterrupt:
        print(f"reasonrl {args.command}: interrupted", file=sys.stderr)
        return 128 + signal.SIGINT


if __name__ == "__main__":
    sys.exit(main())
