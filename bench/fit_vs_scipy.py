"""Batched Optax sigmoid fit vs a loop of scipy.optimize.curve_fit on the same noisy curves.

    python bench/fit_vs_scipy.py [--curves 1000] [--points 100] [--noise 0.005] [--rounds 3]
        [--threads 1]

Curves cycle through the paper's Table 1 (scaling/synthetic_curves.py): evaluations evenly
spaced up to 8 x C_mid, Gaussian noise, R0 fixed to a noisy step-0 measurement (the same value
for both fitters). Success: A within 0.01, B within 0.15 and C_mid within 10% of the truth.

Timing: after a compile call, --rounds rounds each time one batched call (best of 3) and then one
pass of the SciPy loop (default Levenberg-Marquardt, unconstrained, from a data-driven p0); the
speed-up is the median of the per-round ratios, so load changes on a shared machine cancel. Once,
SciPy with bounds (trust-region reflective) for the same constraints as ours (A <= 1, B > 0,
C_mid > 0). --threads 1 (default) runs XLA on one thread, like SciPy; 0 keeps XLA's default.
Agreement: the two optima match (|dA| < 1e-3, |dB| < 0.01, |dC_mid| < 0.5%) where SciPy converged.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings


def _threads_from_argv() -> int:
    # XLA reads its flags when jax is imported, so this is decided before the import below.
    argv = sys.argv[1:]
    for i, arg in enumerate(argv):
        if arg.startswith("--threads="):
            return int(arg.split("=", 1)[1])
        if arg == "--threads" and i + 1 < len(argv):
            return int(argv[i + 1])
    return 1


if _threads_from_argv() == 1:
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen="
        "false intra_op_parallelism_threads=1"
    ).strip()

import jax  # noqa: E402
import numpy as np  # noqa: E402
from scipy.optimize import curve_fit  # noqa: E402

from scalerl_jax.scaling.sigmoid import fit_sigmoid_batch, sigmoid_law  # noqa: E402
from scalerl_jax.scaling.synthetic_curves import make_curves, within_tolerance  # noqa: E402


def scipy_loop(x, y, r0, bounds: bool) -> tuple[dict, float]:
    n = len(x)
    out = {k: np.full(n, np.nan) for k in ("A", "B", "C_mid", "rmse")}
    kw = dict(bounds=([-np.inf, 1e-6, 1e-9], [1.0, np.inf, np.inf])) if bounds else {}
    t0 = time.perf_counter()
    for i in range(n):
        law = lambda c, A, B, C, r=r0[i]: sigmoid_law(c, A, B, C, r)  # noqa: E731
        p0 = [min(y[i].max() + 0.02, 0.99), 1.5, float(np.median(x[i]))]
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                p, _ = curve_fit(law, x[i], y[i], p0=p0, maxfev=5000, **kw)
        except (RuntimeError, ValueError):
            continue
        out["A"][i], out["B"][i], out["C_mid"][i] = p
        out["rmse"][i] = np.sqrt(np.mean((law(x[i], *p) - y[i]) ** 2))
    return out, time.perf_counter() - t0


def agreement(ours: dict, ref: dict) -> tuple[float, float]:
    """(fraction of converged SciPy fits matched, fraction where our RMSE is not worse)."""
    conv = np.isfinite(ref["A"]) & (ref["A"] <= 1) & (ref["B"] > 0) & (ref["C_mid"] > 0)
    same = (
        (np.abs(ours["A"] - ref["A"]) < 1e-3)
        & (np.abs(ours["B"] - ref["B"]) < 0.01)
        & (np.abs(ours["C_mid"] / ref["C_mid"] - 1) < 0.005)
    )
    not_worse = ours["rmse"] <= ref["rmse"] * (1 + 1e-4) + 1e-7
    return float(same[conv].mean()), float(not_worse[conv].mean())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--curves", type=int, default=1000)
    p.add_argument("--points", type=int, default=100)
    p.add_argument("--noise", type=float, default=0.005)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="1: single-threaded XLA; 0: default")
    p.add_argument("--no-bounds", action="store_true", help="skip the (slow) bounded SciPy loop")
    args = p.parse_args()

    x, y, r0, truth = make_curves(
        args.curves, n_points=args.points, noise=args.noise, seed=args.seed
    )
    threads = "1 XLA thread" if args.threads == 1 else "XLA default threads"
    print(
        f"{args.curves} curves x {args.points} points, noise {args.noise}, "
        f"{jax.devices()[0].platform}, {threads}, {os.cpu_count()} CPUs, "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    t0 = time.perf_counter()
    ours = fit_sigmoid_batch(x, y, R0=r0)
    first = time.perf_counter() - t0
    ours_ts, lm_ts = [], []
    for _ in range(args.rounds):
        best = np.inf
        for _ in range(3):
            t0 = time.perf_counter()
            ours = fit_sigmoid_batch(x, y, R0=r0)
            best = min(best, time.perf_counter() - t0)
        ours_ts.append(best)
        lm, t = scipy_loop(x, y, r0, bounds=False)
        lm_ts.append(t)
    ratios = np.array(lm_ts) / np.array(ours_ts)
    rows = [
        ("optax batched (one call)", ours, min(ours_ts)),
        ("scipy curve_fit loop (LM)", lm, min(lm_ts)),
    ]
    if not args.no_bounds:
        trf, trf_t = scipy_loop(x, y, r0, bounds=True)
        rows.append(("scipy curve_fit loop (bounds, TRF)", trf, trf_t))

    print(f"optax first call (compile + run): {first:.2f} s")
    print(
        "per round (optax s, scipy LM s, ratio): "
        + "; ".join(f"{o:.3f}, {t:.2f}, {r:.1f}x" for o, t, r in zip(ours_ts, lm_ts, ratios))
    )
    print(
        f"speed-up over the SciPy LM loop: median {np.median(ratios):.1f}x "
        f"(range {ratios.min():.1f}-{ratios.max():.1f}x)"
    )
    print(
        f"{'method':36s} {'time s':>8s} {'success':>8s} {'A ok':>6s} {'B ok':>6s} "
        f"{'C ok':>6s} {'no fit':>6s}"
    )
    for name, res, t in rows:
        ok = within_tolerance(res, truth)
        failed = int(np.sum(~np.isfinite(res["A"])))
        print(
            f"{name:36s} {t:8.3f} {ok['all'].mean():8.3f} {ok['A'].mean():6.3f} "
            f"{ok['B'].mean():6.3f} {ok['C_mid'].mean():6.3f} {failed:6d}"
        )
    same, not_worse = agreement(ours, lm)
    print(
        f"agreement with converged LM fits: same optimum {same:.3f}, RMSE not worse {not_worse:.3f}"
    )


if __name__ == "__main__":
    main()
