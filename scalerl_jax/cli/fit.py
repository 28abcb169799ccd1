"""Fit the ScaleRL sigmoid law to runs' validation curves; print a table, write RUN_DIR/fit/.

    python experiments/fit.py RUN_DIR [RUN_DIR ...]

Examples:
    python experiments/fit.py runs/scalerl runs/dapo --fit-start 1500 --alternatives
    python experiments/fit.py runs/scalerl --fit-start 1500 --fit-end 8000 --out /tmp/fits
    python experiments/fit.py --compare runs/scalerl runs/dapo runs/cispo   # who wins, by how much
    python experiments/fit.py runs/seed0 runs/seed1 runs/seed2 --pool --name scalerl
    python experiments/fit.py runs/scalerl --x compute.flops --r0 free --procedure grid
    python experiments/fit.py runs/testbed-mix --domain code     # one domain of a mixture

A RUN_DIR holds metrics.jsonl; a directory of seed run dirs is pooled as one curve. Per run:
RUN_DIR/fit/{fit.txt, fit.json, fit.png}, or OUT/<run name>/ with --out OUT (read-only runs,
several windows of one run); with several runs also compare.{txt,json,png} (in --compare-dir,
else OUT, else the first run's fit/). `--compare` states who wins each comparison by the
paper's rule and by how much, with intervals (`--pairwise`: every pair, not each against the
first). `--fit-end X` checks the extrapolation on the points after X. `--domain NAME` fits a
mixture run's NAME curve (y = per_domain.NAME) into RUN_DIR/fit/NAME/. Failed fits are reported
with their reason. Exit status 2 on bad input (missing run directory, key path or domain).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

from scalerl_jax.errors import UserError
from scalerl_jax.scaling import compare, fit, plot, report


def parse_args(argv=None) -> argparse.Namespace:
    """The CLI's flags; long because it declares one flag after another."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR")
    p.add_argument(
        "--x",
        default="compute.device_hours",
        help="x key path in eval records (compute.flops, compute.tokens, step, ...)",
    )
    p.add_argument("--y", default="pass_rate", help="y key path (e.g. per_domain.math)")
    p.add_argument(
        "--domain",
        default=None,
        help="fit this domain's curve of a mixture run (= --y per_domain.NAME), "
        "written to RUN_DIR/fit/NAME/",
    )
    p.add_argument("--r0", default="measured", help="'measured' (first eval), 'free' or a number")
    p.add_argument(
        "--fit-start",
        type=float,
        default=0.0,
        help="fit points with x >= this (paper: 1500 GPU-hours)",
    )
    p.add_argument(
        "--fit-end",
        type=float,
        default=None,
        help="fit points with x <= this; the extrapolation check is then the error "
        "on the points after it",
    )
    p.add_argument(
        "--procedure",
        choices=("optax", "grid"),
        default="optax",
        help="grid: the paper's grid over A and C_mid with B fitted",
    )
    p.add_argument("--grid-a", type=float, nargs=3, metavar=("LO", "HI", "STEP"))
    p.add_argument("--grid-cmid", type=float, nargs=3, metavar=("LO", "HI", "N"))
    p.add_argument(
        "--record-breaking",
        action="store_true",
        help="fit only points above all earlier ones (IsoCompute)",
    )
    p.add_argument("--bootstrap", type=int, default=200, help="resamples (0: no intervals)")
    p.add_argument(
        "--interval",
        choices=("ar1", "pairs"),
        default="ar1",
        help="bootstrap: 'ar1' models serially correlated evaluation noise (holds its "
        "coverage when consecutive evaluations share a policy); 'pairs' "
        "resamples evaluations (with --block, runs of them)",
    )
    p.add_argument(
        "--block", type=int, default=1, help="with --interval pairs: evaluations per resampled run"
    )
    p.add_argument("--level", type=float, default=0.95)
    p.add_argument(
        "--extrapolate",
        type=float,
        default=0.5,
        help="fit on this fraction of the largest compute, test on the rest (0: off; "
        "with --fit-end the check uses the points after it instead)",
    )
    p.add_argument(
        "--target",
        type=float,
        default=None,
        help="compute at which to predict R (default: 2x the largest)",
    )
    p.add_argument("--alternatives", action="store_true", help="also fit power law, Tan et al.")
    p.add_argument("--pool", action="store_true", help="pool all RUN_DIRs as seeds of one run")
    p.add_argument("--name", default=None, help="name of the pooled run")
    p.add_argument("--margin", type=float, default=compare.A_MARGIN)
    p.add_argument("--compare-dir", default=None, help="where compare.* go")
    p.add_argument(
        "--out",
        default=None,
        metavar="DIR",
        help="write each run's results to DIR/<run name>/ instead of RUN_DIR/fit/",
    )
    p.add_argument(
        "--compare",
        action="store_true",
        help="recipe comparison: who wins by the paper's rule, by how much, with "
        "intervals (A, or B refitted at the shared A)",
    )
    p.add_argument(
        "--pairwise",
        action="store_true",
        help="with --compare: every pair instead of each run against the first",
    )
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
    return fit.FitSpec(
        r0=r0,
        fit_start=args.fit_start,
        fit_end=args.fit_end,
        procedure=args.procedure,
        record_breaking=args.record_breaking,
        steps=args.steps,
        polish_steps=args.polish,
        num_inits=args.inits,
        lr=args.lr,
        a_grid=a_grid,
        cmid_grid=cmid_grid,
    )


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        return run(args)
    except (UserError, FileNotFoundError, KeyError, ValueError) as err:
        # Bad input (missing run dir, key path, config value): one line, not a traceback.
        print(f"fit.py: error: {err.args[0] if err.args else err}", file=sys.stderr)
        return 2


def out_dir(args, dirs: list, name: str) -> str:
    """RUN_DIR/fit[/DOMAIN], or OUT/<run name>[/DOMAIN] with --out."""
    sub = [args.domain] if args.domain else []
    if args.out is None:
        return os.path.join(dirs[0], "fit", *sub)
    return os.path.join(args.out, name.split(":")[0], *sub)


def _check_flags(args) -> None:
    if args.compare and len(args.run_dirs) < 2 and not args.pool:
        raise ValueError(f"--compare needs at least two runs; got {len(args.run_dirs)}")
    if args.compare and args.pool:
        raise ValueError("--compare compares runs; --pool makes them one curve: drop one")
    if args.pairwise and not args.compare:
        raise ValueError("--pairwise applies to --compare only")
    if args.block != 1 and args.interval != "pairs":
        raise ValueError(
            f"--block {args.block} applies to --interval pairs only (the default "
            "'ar1' interval estimates the noise's correlation itself)"
        )


def _use_domain(args, groups: list[list[str]]) -> None:
    """Point args.y at --domain's validation curve, which every group must have."""
    if args.y != "pass_rate":
        raise ValueError(
            f"--domain {args.domain} sets the y key (per_domain.{args.domain}); drop --y {args.y}"
        )
    args.y = report.domain_y_key(args.domain)
    for dirs in groups:
        known = report.run_domains(dirs)
        if args.domain not in known:
            raise ValueError(
                f"--domain {args.domain}: {', '.join(dirs)} has no such "
                f"validation curve; its domains: {known or 'none (one source)'}"
            )


def _analyse(args, spec, dirs: list[str]):
    """Fit one group of run dirs and write its results."""
    name = args.name if args.pool else None
    if args.domain is not None:
        name = f"{name or os.path.basename(os.path.normpath(dirs[0]))}:{args.domain}"
    curve, notes = report.load_curve(dirs, name=name, x_key=args.x, y_key=args.y)
    analysis = report.analyse(
        curve,
        spec,
        n_boot=args.bootstrap,
        level=args.level,
        interval=args.interval,
        block=args.block,
        target=args.target,
        extrapolate_fraction=args.extrapolate,
        with_alternatives=args.alternatives,
        seed=args.seed,
        notes=notes,
    )
    out = out_dir(args, dirs, analysis.curve.name)
    for path in report.write_run(analysis, spec, out, plots=not args.no_plots):
        print(f"wrote {path}", file=sys.stderr)
    return analysis


def _compare(args, spec, analyses, groups: list[list[str]], text: str) -> str:
    """Compare several fits (decisions or plain comparisons), write them; return the text."""
    out = (
        args.compare_dir
        or args.out
        or os.path.join(groups[0][0], "fit", *([args.domain] if args.domain else []))
    )
    os.makedirs(out, exist_ok=True)
    if args.compare:
        decisions = report.decide_all(
            analyses,
            spec,
            args.margin,
            pairwise=args.pairwise,
            n_boot=args.bootstrap,
            level=args.level,
            interval=args.interval,
            seed=args.seed,
        )
        text += "\n\n" + report.format_decisions(decisions, args.margin, args.pairwise)
        with open(os.path.join(out, "compare.json"), "w") as f:
            json.dump(report.decisions_json(decisions), f, indent=2)
        print(f"wrote {os.path.join(out, 'compare.json')}", file=sys.stderr)
    else:
        comparisons = report.compare_all(analyses, spec, args.margin)
        text += "\n\n" + report.format_comparisons(comparisons, args.margin)
    with open(os.path.join(out, "compare.txt"), "w") as f:
        f.write(text + "\n")
    print(f"wrote {os.path.join(out, 'compare.txt')}", file=sys.stderr)
    if not args.no_plots:
        path = plot.plot_compare(
            os.path.join(out, "compare.png"),
            [a.curve for a in analyses],
            [a.fit for a in analyses],
            target=args.target,
        )
        print(f"wrote {path}", file=sys.stderr)
    return text


def run(args) -> int:
    _check_flags(args)
    spec = make_spec(args)
    groups = [args.run_dirs] if args.pool else [[d] for d in args.run_dirs]
    if args.domain is not None:
        _use_domain(args, groups)
    analyses = [_analyse(args, spec, dirs) for dirs in groups]
    names = [a.curve.name for a in analyses]
    if args.out is not None and len(set(names)) < len(names):
        print(
            f"fit.py: warning: runs share a name ({names}); with --out the later ones "
            "overwrote the earlier ones' results",
            file=sys.stderr,
        )
    text = report.format_table(analyses)
    if len(analyses) > 1:
        text = _compare(args, spec, analyses, groups, text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
