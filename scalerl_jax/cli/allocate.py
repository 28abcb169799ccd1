"""Compute allocation: from short runs of different allocations, the one to run at a budget.

    python experiments/allocate.py --budget BUDGET RUN_DIR RUN_DIR [RUN_DIR ...]

Examples:
    python experiments/allocate.py --budget 20000 runs/scalerl-batch512 runs/scalerl \
        runs/scalerl-batch2048
    python experiments/allocate.py --budget 5e15 --x compute.flops --record-breaking \
        runs/gen8 runs/gen16

Each RUN_DIR is a short run of one setting (prompts per batch x generations per prompt,
generation length: read from its config.json). Each curve is fitted with the sigmoid law and
extrapolated to the budget (in the units of --x), with a bootstrap interval; the table ranks the
settings by the predicted pass rate there. Written to --out (default: ./allocation/):
allocation.txt, allocation.json, allocation.png. Exit status 2 on bad input.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

from scalerl_jax import cli
from scalerl_jax.errors import UserError
from scalerl_jax.scaling import allocate, fit, plot, report


def parse_args(argv=None) -> argparse.Namespace:
    p = cli.parser(__doc__)
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR")
    p.add_argument(
        "--budget", type=float, required=True, help="compute to plan for, in the units of --x"
    )
    p.add_argument("--x", default="compute.device_hours", help="compute key path of eval records")
    p.add_argument("--y", default="pass_rate", help="y key path (e.g. per_domain.math)")
    p.add_argument(
        "--record-breaking",
        action="store_true",
        help="fit only points above all earlier ones (IsoCompute)",
    )
    p.add_argument(
        "--fit-start", type=float, default=0.0, help="fit points with x at or above this"
    )
    p.add_argument("--bootstrap", type=int, default=200, help="resamples (0: no intervals)")
    p.add_argument("--level", type=float, default=0.95)
    p.add_argument("--out", default="allocation", help="output directory (default: ./allocation)")
    return p.parse_args(argv)


def settings_of(run_dir: str) -> tuple[str, dict]:
    """(label, settings) from RUN_DIR/config.json: batch shape and generation length."""
    path = os.path.join(run_dir, "config.json")
    if not os.path.isfile(path):
        return os.path.basename(os.path.normpath(run_dir)), {}
    with open(path) as f:
        cfg = json.load(f)
    pipe, sampler = cfg.get("pipeline", {}), cfg.get("sampler", {})
    settings = {
        "prompts_per_step": pipe.get("prompts_per_step"),
        "generations_per_prompt": pipe.get("generations_per_prompt"),
        "max_new_tokens": sampler.get("max_new_tokens"),
    }
    name = os.path.basename(os.path.normpath(run_dir))
    label = (
        f"{name} ({settings['prompts_per_step']}x{settings['generations_per_prompt']}, "
        f"{settings['max_new_tokens']} tok)"
    )
    return label, settings


def table(rec: allocate.Recommendation) -> str:
    pct = f"{100 * rec.level:.0f}%"
    head = (
        f"{'setting':<44} {'pts':>4} {'A':>6} {'B':>5} {'C_mid':>9}  "
        f"{'predicted at budget [' + pct + ']':<28} {'reach':>6}"
    )
    lines = [head, "-" * len(head)]
    for o in rec.options:
        if o.predicted is None:
            lines.append(f"{o.candidate.label:<44} {o.fit.n_points:>4}  no fit: {o.reason}")
            continue
        f = o.fit
        lines.append(
            f"{o.candidate.label:<44} {f.n_points:>4} {f.A:>6.3f} {f.B:>5.2f} "
            f"{f.C_mid:>9.3g}  {o.predicted:.3f} [{o.lo:.3f}, {o.hi:.3f}]"
            f"{'':<8} {o.extrapolation:>5.1f}x"
        )
    return "\n".join(lines)


def _num(v):
    return float(v) if v is not None and math.isfinite(v) else None


def allocation_json(rec: allocate.Recommendation, args) -> dict:
    options = []
    for o in rec.options:
        fitted = (
            {k: _num(getattr(o.fit, k)) for k in ("A", "B", "C_mid", "R0")} if o.fit.ok else None
        )
        options.append(
            {
                "label": o.candidate.label,
                "settings": o.candidate.settings,
                "predicted": _num(o.predicted),
                "lo": _num(o.lo),
                "hi": _num(o.hi),
                "extrapolation": _num(o.extrapolation),
                "n_points": o.fit.n_points,
                "fit": fitted,
                "reason": o.reason,
            }
        )
    return {
        "budget": rec.budget,
        "x": args.x,
        "y": args.y,
        "level": rec.level,
        "record_breaking": args.record_breaking,
        "best": rec.best.candidate.label if rec.best else None,
        "clear": rec.clear,
        "options": options,
    }


def main(argv=None) -> int:
    args = parse_args(argv)
    missing = [d for d in args.run_dirs if not os.path.isfile(os.path.join(d, "metrics.jsonl"))]
    if missing:
        print(f"allocate.py: error: no metrics.jsonl in {', '.join(missing)}", file=sys.stderr)
        return 2
    if len(args.run_dirs) < 2:
        print("allocate.py: error: give at least two RUN_DIRs (one per setting)", file=sys.stderr)
        return 2
    if not args.budget > 0:
        print(f"allocate.py: error: --budget {args.budget}: must be > 0", file=sys.stderr)
        return 2
    candidates = []
    for d in args.run_dirs:
        label, settings = settings_of(d)
        try:
            curve, notes = report.load_curve([d], name=label, x_key=args.x, y_key=args.y)
        except (UserError, KeyError) as err:
            print(f"allocate.py: error: {d}: {err}", file=sys.stderr)
            return 2
        for note in notes:
            print(f"note: {note}", file=sys.stderr)
        candidates.append(allocate.Candidate(label, curve, settings))
    spec = fit.FitSpec(fit_start=args.fit_start, record_breaking=args.record_breaking)
    try:
        rec = allocate.recommend(
            candidates, args.budget, spec, n_boot=args.bootstrap, level=args.level
        )
    except (UserError, ValueError) as err:
        print(f"allocate.py: error: {err}", file=sys.stderr)
        return 2
    x_label = plot.axis_label(args.x)
    text = table(rec) + "\n\n" + allocate.summary(rec, x_label) + "\n"
    print(text, end="")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "allocation.txt"), "w") as f:
        f.write(text)
    with open(os.path.join(args.out, "allocation.json"), "w") as f:
        json.dump(allocation_json(rec, args), f, indent=2)
    plot.plot_allocation(os.path.join(args.out, "allocation.png"), rec, args.x, args.y)
    print(f"written: {args.out}/allocation.txt, allocation.json, allocation.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
