"""Render the README's picture from a finished `make demo` run: the report's reward and accuracy
panels of that run, stacked, as ``docs/img/demo_report.png``.

    .venv/bin/python docs/gen_img.py [RUN_DIR]      # RUN_DIR: runs/demo by default

The panels are the report's own (:func:`reasonrl.report.plot_specs`, :func:`reasonrl.report.line_figure`),
so the picture shows what ``runs/demo/report.html`` shows. The PNG is committed; run this again
after ``make demo`` when the demo's figures change.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from reasonrl.report import line_figure, load_run, plot_specs

OUT = Path(__file__).parent / "img" / "demo_report.png"


def render(run_dir: str | Path, out: Path = OUT) -> Path:
    """Write the reward and accuracy panels of the run in ``run_dir`` to ``out``; returns ``out``."""
    run = load_run(run_dir)
    specs = plot_specs([run])
    fig = line_figure([run], specs["accuracy.png"] + specs["reward.png"])
    if fig is None:
        raise SystemExit(f"{run_dir}: no accuracy or reward in metrics.jsonl; run `make demo` first")
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format="png", dpi=80)
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", nargs="?", default="runs/demo")
    print(render(parser.parse_args().run_dir))
