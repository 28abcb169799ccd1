"""Is the testbed's curve predictable? Several seeds of a longer testbed run; each is fitted on
the first half of its compute and asked for its final validation pass rate.

    python bench/predictability.py                   # seeds 0 1 2, 360 RL steps each
    python bench/predictability.py --seeds 0 --steps 200
    python bench/predictability.py --out bench/out/pred-lr1e-5 optim.learning_rate=1e-5

Positional KEY=VALUE overrides go to every seed's `experiments/run.py` (use a fresh --out for
each set: a workdir refuses a changed config).

For each seed: the sigmoid law R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B) (R0 measured, x =
`compute.flops` unless `--x compute.device_hours`) is fitted to the evaluations with compute <= half
of the run's total, then predicts R at the last evaluation's compute; the error is predicted
minus observed. `--fit-start F` leaves out the evaluations below F x the run's compute (the paper
skips its first 1.5k GPU-hours), the same share for every seed. Also reported: the observed pass
rate at half the compute (interpolated) and the rise from there to the end (the prediction is
worth making only when the curve still rises), the fit on all points (A, B, C_mid) and the
observed mean of the last three evaluations (the "asymptote seen"). The paper's margin on A is
0.02.

Runs go to bench/out/predictability/seed<N> (reused when complete); results to stdout and
bench/out/predictability/predictability.json.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from scalerl_jax.metrics import read_metrics  # noqa: E402
from scalerl_jax.scaling import FitSpec, fit_curve  # noqa: E402
from scalerl_jax.scaling.report import load_curve  # noqa: E402

FORECAST_SHARES = (0.25, 0.5, 0.75)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--steps", type=int, default=360)
    p.add_argument("--eval-every", type=int, default=18)
    p.add_argument("--x", default="compute.flops",
                   help="compute axis (FLOPs by default: on a shared machine device-hours "
                        "also measure the other jobs)")
    p.add_argument("--fit-start", type=float, default=0.0, metavar="F",
                   help="fit from F x the run's compute (default 0: from the first evaluation)")
    p.add_argument("--out", default=os.path.join(ROOT, "bench", "out", "predictability"))
    p.add_argument("overrides", nargs="*", metavar="KEY.PATH=VALUE",
                   help="config overrides for every run")
    args = p.parse_args(argv)
    rows = []
    for seed in args.seeds:
        workdir = os.path.join(args.out, f"seed{seed}")
        log = os.path.join(workdir, "metrics.jsonl")
        done = os.path.exists(log) and any(
            r["step"] == args.steps for r in read_metrics(workdir).of("eval"))
        if not done:
            cmd = [sys.executable, os.path.join(ROOT, "experiments", "run.py"), "--workdir",
                   workdir, "--seed", str(seed), "--steps", str(args.steps),
                   f"eval.every_steps={args.eval_every}", f"forecast.x_key={args.x}",
                   *args.overrides]
            print("$", " ".join(cmd[1:]), flush=True)
            subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
        curve, _ = load_curve([workdir], x_key=args.x)
        half = 0.5 * float(np.nanmax(curve.x))
        first = fit_curve(curve, FitSpec(fit_start=args.fit_start * 2 * half, fit_end=half))
        whole = fit_curve(curve, FitSpec())
        final_x, final_y = float(curve.x[-1]), float(curve.y[-1])
        row = {"seed": seed, "points": len(curve.x), "fit_points": first.n_points,
               "base": float(curve.y[0]), "final": final_y,
               "last3_mean": float(np.mean(curve.y[-3:])), "half_compute": half,
               "at_half": float(np.interp(half, curve.x, curve.y)),
               "wall_s": max(r["wall_s"] for r in read_metrics(workdir).of("eval"))}
        row.update(rise=final_y - row["at_half"], curve=[round(float(y), 4) for y in curve.y])
        if first.ok:
            pred = float(first.predict(final_x))
            row.update(predicted=pred, error=pred - final_y, A_half=float(first.A),
                       B_half=float(first.B), C_mid_half=float(first.C_mid))
        else:
            row.update(predicted=None, error=None, reason=first.reason)
        if whole.ok:
            row.update(A=float(whole.A), B=float(whole.B), C_mid=float(whole.C_mid))
        row["forecasts"] = forecast_checks(workdir, final_x, final_y)
        rows.append(row)
    print(f"{'seed':>4} {'pts':>4} {'fit':>4} {'base':>6} {'half':>6} {'final':>6} {'rise':>6} "
          f"{'pred':>6} {'error':>7} {'A(half)':>7} {'B(half)':>7} {'A(all)':>7} {'B(all)':>6} "
          f"{'C_mid(all)':>10} {'wall_s':>6}")
    for r in rows:
        f = lambda key, fmt: "-" if r.get(key) is None else format(r[key], fmt)  # noqa: E731
        print(f"{r['seed']:>4} {r['points']:>4} {r['fit_points']:>4} {r['base']:>6.3f} "
              f"{r['at_half']:>6.3f} {r['final']:>6.3f} {r['rise']:>+6.3f} "
              f"{f('predicted', '.3f'):>6} {f('error', '+.3f'):>7} {f('A_half', '.3f'):>7} "
              f"{f('B_half', '.2f'):>7} {f('A', '.3f'):>7} {f('B', '.2f'):>6} "
              f"{f('C_mid', '.3g'):>10} {r['wall_s']:>6.0f}")
        if r.get("reason"):
            print(f"     seed {r['seed']}: no fit on the first half: {r['reason']}")
    errors = [abs(r["error"]) for r in rows if r.get("error") is not None]
    if errors:
        print(f"mean |error| {np.mean(errors):.3f}, max {np.max(errors):.3f} "
              f"(paper's margin 0.02); within 0.02: {sum(e <= 0.02 for e in errors)}/{len(rows)}")
    print_forecasts(rows)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "predictability.json"), "w") as f:
        json.dump({"args": vars(args), "rows": rows}, f, indent=2)
    return 0


def forecast_checks(workdir: str, final_x: float, final_y: float) -> list:
    """The run's online forecast (its `forecast` records) at 25/50/75% of its compute: the first
    forecast whose data reach that share, its predicted final pass rate and 95% interval, whether
    the interval holds the observed last evaluation, and whether it was flagged `stable`."""
    records = [r for r in read_metrics(workdir).of("forecast") if r.get("x_max")]
    out = []
    for share in FORECAST_SHARES:
        rec = next((r for r in records if r["x_max"] >= share * final_x), None)
        if rec is None:
            continue
        lo, hi = rec.get("at_budget_lo"), rec.get("at_budget_hi")
        miss = None if lo is None else max(lo - final_y, final_y - hi, 0.0)
        out.append({"share": share, "step": rec["step"], "ok": rec.get("ok"),
                    "predicted": rec.get("at_budget"), "lo": lo, "hi": hi,
                    "covers": miss == 0.0, "miss": miss, "stable": bool(rec.get("stable"))})
    return out


def print_forecasts(rows: list) -> None:
    checks = [(r["seed"], c) for r in rows for c in r["forecasts"]]
    if not checks:
        return
    print("\nonline forecast of the final pass rate (95% interval) at a share of the compute:")
    print(f"{'seed':>4} {'share':>5} {'step':>5} {'final':>6} {'pred':>6} {'interval':>15} "
          f"{'covers':>6} {'stable':>6}")
    for seed, c in checks:
        final = next(r["final"] for r in rows if r["seed"] == seed)
        interval = "-" if c["lo"] is None else f"[{c['lo']:.3f}, {c['hi']:.3f}]"
        pred = "-" if c["predicted"] is None else f"{c['predicted']:.3f}"
        print(f"{seed:>4} {c['share']:>5.2f} {c['step']:>5} {final:>6.3f} {pred:>6} "
              f"{interval:>15} {str(c['covers']):>6} {str(c['stable']):>6}")
    covered = sum(c["covers"] for _, c in checks)
    wrong_stable = sum(c["stable"] and (c["miss"] is None or c["miss"] > 0.02) for _, c in checks)
    print(f"intervals holding the final value: {covered}/{len(checks)} "
          f"({covered / len(checks):.0%}; goal >= 90%); 'stable' while the interval missed by "
          f"> 0.02: {wrong_stable}")


if __name__ == "__main__":
    sys.exit(main())
