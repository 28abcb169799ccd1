"""Fit the ScaleRL sigmoid law to runs' validation curves; print a table, write RUN_DIR/fit/.

    python experiments/fit.py RUN_DIR [RUN_DIR ...]

Examples:
    python experiments/fit.py runs/scalerl runs/dapo --fit-start 1500 --alternatives
    python experiments/fit.py runs/seed0 runs/seed1 runs/seed2 --pool --name scalerl
    python experiments/fit.py runs/scalerl --x compute.flops --r0 free --procedure grid

A RUN_DIR holds metrics.jsonl; a directory of seed run dirs is pooled as one curve. Per run:
RUN_DIR/fit/{fit.txt, fit.json, fit.png}; with several runs also compare.{txt,png} (in the first
run's fit/ unless --compare-dir). Failed fits are reported with their reason. Exit status 2 on
bad input (missing run directory or key path).
"""
from __future__ import annotations

import argparse
import os
import sys

# Runs from a checkout without installing the package.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

from scalerl_jax.scaling import compare, fit, plot, report  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR")
    p.add_argument("--x", default="compute.device_hours",
                   help="x key path in eval records (compute.flops, compute.tokens, step, ...)")
    p.add_argument("--y", default="pass_rate", help="y key path (e.g. per_domain.math)")
    p.add_argument("--r0", default="measured", help="'measured' (first eval), 'free' or a number")
    p.add_argument("--fit-start", type=float, default=0.0,
                   help="fit points with x above this (paper: 1500 GPU-hours)")
    p.add_argument("--fit-end", type=float, default=None)
    p.add_argument("--procedure", choices=("optax", "grid"), default="optax",
                   help="grid: the paper's grid over A and C_mid with B fitted")
    p.add_argument("--grid-a", type=float, nargs=3, metavar=("LO", "HI", "STEP"))
    p.add_argument("--grid-cmid", type=float, nargs=3, metavar=("LO", "HI", "N"))
    p.add_argument("--record-breaking", action="store_true",
                   help="fit only points above all earlier ones (IsoCompute)")
    p.add_argument("--bootstrap", type=int, default=200, help="resamples (0: no intervals)")
    p.add_argument("--block", type=int, default=1, help="bootstrap block length (evaluations)")
    p.add_argument("--level", type=float, default=0.95)
    p.add_argument("--extrapolate", type=float, default=0.5,
                   help="fit on this fraction of the largest compute, test on the rest (0: off)")
    p.add_argument("--target", type=float, default=None,
                   help="compute at which to predict R (default: 2x the largest)")
    p.add_argument("--alternatives", action="store_true", help="also fit power law, Tan et al.")
    p.add_argument("--pool", action="store_true", help="pool all RUN_DIRs as seeds of one run")
    p.add_argument("--name", default=None, help="name of the pooled run")
    p.add_argument("--margin", type=float, default=compare.A_MARGIN)
    p.add_argument("--compare-dir", default=None)
    p.add_argument("--steps", type=int, default=20, help="Adam steps (after exploring)")
    p.add_argument("--polish", type=int, default=20, help="Levenberg-Marquardt steps at the end")
    p.add_argument("--inits", type=int, default=4)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-plots", action="store_true")
    return p.parse_args(argv)


def make_spec(args) -> fit.FitSpec:
    r0 = args.r0 if args.r0 in ("measured", "free") else float(args.r0)
    a_grid = cmid_grid = None
    if args.grid_a:
        lo, hi, step = args.grid_a
        a_grid = tuple(np.round(np.arange(lo, hi + step / 2, step), 6))
    if args.grid_cmid:
        lo, hi, n = args.grid_cmid
        cmid_grid = tuple(np.linspace(lo, hi, int(n)))
    return fit.FitSpec(r0=r0, fit_start=args.fit_start, fit_end=args.fit_end,
                       procedure=args.procedure, record_breaking=args.record_breaking,
                       steps=args.steps, polish_steps=args.polish, num_inits=args.inits,
                       lr=args.lr,
                       a_grid=a_grid, cmid_grid=cmid_grid)


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        return run(args)
    except (FileNotFoundError, KeyError, ValueError) as err:
        # Bad input (missing run dir, key path, config value): one line, not a traceback.
        print(f"fit.py: error: {err.args[0] if err.args else err}", file=sys.stderr)
        return 2


def run(args) -> int:
    spec = make_spec(args)
    groups = [args.run_dirs] if args.pool else [[d] for d in args.run_dirs]
    analyses = []
    for dirs in groups:
        curve, notes = report.load_curve(dirs, name=args.name if args.pool else None,
                                         x_key=args.x, y_key=args.y)
        analyses.append(report.analyse(
            curve, spec, n_boot=args.bootstrap, level=args.level, block=args.block,
            target=args.target, extrapolate_fraction=args.extrapolate,
            with_alternatives=args.alternatives, seed=args.seed, notes=notes))
        out = os.path.join(dirs[0], "fit")
        for path in report.write_run(analyses[-1], spec, out, plots=not args.no_plots):
            print(f"wrote {path}", file=sys.stderr)
    text = report.format_table(analyses)
    if len(analyses) > 1:
        comparisons = report.compare_all(analyses, spec, args.margin)
        text += "\n\n" + report.format_comparisons(comparisons, args.margin)
        out = args.compare_dir or os.path.join(groups[0][0], "fit")
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "compare.txt"), "w") as f:
            f.write(text + "\n")
        print(f"wrote {os.path.join(out, 'compare.txt')}", file=sys.stderr)
        if not args.no_plots:
            path = plot.plot_compare(os.path.join(out, "compare.png"),
                                     [a.curve for a in analyses], [a.fit for a in analyses],
                                     target=args.target)
            print(f"wrote {path}", file=sys.stderr)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
