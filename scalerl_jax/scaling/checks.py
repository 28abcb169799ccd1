"""Degenerate-fit detection, vectorised over curves: a reason string, or None when usable.

Before fitting: too few points, flat or decreasing data. After fitting: parameters the data do
not pin down (asymptote at its bound, midpoint far outside the data, step-like B), divergence,
and an optimiser still improving. A degenerate fit is reported with its reason, never as numbers.
"""

from __future__ import annotations

import numpy as np

TREND_Z = 3.0  # |rise| / its standard error below this is "flat"
A_BOUND_TOL = 1e-3  # A within this of 1 sits on the A <= 1 constraint
CMID_RATIO = 10.0  # C_mid beyond 10x the data range (either side) is not identified
B_MAX = 20.0  # steeper than this is a step between two evaluations
CONVERGE_RTOL = 1e-3  # RMSE still falling by more than this fraction near the end
CONVERGE_ATOL = 1e-5


def _sorted_valid(x: np.ndarray, y: np.ndarray, w: np.ndarray):
    """Rows sorted so each curve's valid points (w > 0) come first, in x order."""
    valid = w > 0
    order = np.argsort(np.where(valid, x, np.inf), axis=1, kind="stable")
    take = lambda a: np.take_along_axis(a, order, axis=1)  # noqa: E731
    return take(x), take(y), take(valid), valid.sum(axis=1)


def data_reasons(x: np.ndarray, y: np.ndarray, w: np.ndarray, n_free: np.ndarray) -> list:
    """Pre-fit reasons for curves [n, m] (weights w > 0 mark the points in the fit)."""
    xs, ys, valid, n = _sorted_valid(x, y, w)
    m = xs.shape[1]
    rank = np.arange(m)[None, :]
    distinct = 1 + np.sum(valid[:, 1:] & (np.diff(xs, axis=1) > 0), axis=1)
    third = np.maximum(n // 3, 1)[:, None]
    first = (rank < third) & valid
    last = (rank >= n[:, None] - third) & valid
    with np.errstate(invalid="ignore", divide="ignore"):
        rise = (np.sum(np.where(last, ys, 0), 1) - np.sum(np.where(first, ys, 0), 1)) / third[:, 0]
        # Second differences cancel a linear trend, so this measures noise, not the rise.
        d2 = ys[:, 2:] - 2 * ys[:, 1:-1] + ys[:, :-2] if m >= 3 else np.zeros((len(n), 0))
        d2_on = rank[:, : max(m - 2, 0)] + 2 < n[:, None]
        sigma = np.sqrt(np.sum(np.where(d2_on, d2**2, 0), 1) / np.maximum(d2_on.sum(1), 1) / 6.0)
        z = rise / (sigma * np.sqrt(2.0 / third[:, 0]))
    z = np.where(np.isnan(z), 0.0, z)  # noise-free and no rise
    need = n_free.astype(int) + 2
    # Conditions in priority order; strings are built only for the curves that fail.
    failing = [
        (
            n < need,
            lambda i: (
                f"too few points: {n[i]} in the fit window, need >= {need[i]} for "
                f"{need[i] - 2} free parameters"
            ),
        ),
        (distinct < 3, lambda i: f"too few distinct compute values: {distinct[i]}, need >= 3"),
        (
            z <= -TREND_Z,
            lambda i: (
                f"decreasing: last third of points averages {rise[i]:+.4f} vs "
                f"the first third (noise ~{sigma[i]:.4f}, z = {z[i]:.1f})"
            ),
        ),
        (
            z < TREND_Z,
            lambda i: (
                f"flat: no significant rise over the fit window (last third minus "
                f"first third = {rise[i]:+.4f}, noise ~{sigma[i]:.4f}, "
                f"z = {z[i]:.1f} < {TREND_Z:g})"
            ),
        ),
    ]
    return _first_reasons(len(n), failing)


def _first_reasons(n: int, failing: list) -> list:
    reasons = [None] * n
    for cond, text in failing:
        for i in np.flatnonzero(cond):
            if reasons[i] is None:
                reasons[i] = text(i)
    return reasons


def fit_reasons(
    params: dict,
    free: np.ndarray,
    x_lo: np.ndarray,
    x_hi: np.ndarray,
    rmse: np.ndarray,
    rmse_before: np.ndarray,
) -> list:
    """Post-fit reasons. params: arrays A, B, C_mid, R0; free [n, 4] in that order.
    Long because it is a table: one (failing mask, message) row per check, in order."""
    A, B, C, R0 = (np.asarray(params[k]) for k in ("A", "B", "C_mid", "R0"))
    fa, fb, fc = free[:, 0], free[:, 1], free[:, 2]
    finite = np.isfinite(np.stack([A, B, C, R0, rmse])).all(axis=0)
    with np.errstate(invalid="ignore"):
        failing = [
            (~finite, lambda i: "optimiser diverged: non-finite parameters"),
            (
                fa & (A > 1.0 - A_BOUND_TOL),
                lambda i: (
                    f"asymptote at the A <= 1 bound (A = {A[i]:.4f}): the data show no "
                    f"saturation, so A is not identified"
                ),
            ),
            (
                fa & (A < R0),
                lambda i: (
                    f"fitted asymptote A = {A[i]:.3f} is below R0 = "
                    f"{R0[i]:.3f}: the curve decreases"
                ),
            ),
            (
                fc & (C > CMID_RATIO * x_hi),
                lambda i: (
                    f"midpoint C_mid = {C[i]:.3g} is beyond {CMID_RATIO:g}x the largest "
                    f"compute fitted ({x_hi[i]:.3g}): the curve has not bent, so A and C_mid "
                    f"are not identified"
                ),
            ),
            (
                fc & (C < x_lo / CMID_RATIO),
                lambda i: (
                    f"midpoint C_mid = {C[i]:.3g} is below 1/{CMID_RATIO:g} of the smallest "
                    f"compute fitted ({x_lo[i]:.3g}): the curve saturated before the window, "
                    f"so B and C_mid are not identified"
                ),
            ),
            (
                fb & (B > B_MAX),
                lambda i: (
                    f"B = {B[i]:.1f} > {B_MAX:g}: a step between two "
                    f"evaluations, too few points near the midpoint"
                ),
            ),
            (
                rmse_before - rmse > CONVERGE_RTOL * rmse + CONVERGE_ATOL,
                lambda i: (
                    f"optimiser still improving at the end (RMSE {rmse_before[i]:.5f} -> "
                    f"{rmse[i]:.5f} over the last polish steps, at A = {A[i]:.3f}, "
                    f"C_mid = {C[i]:.3g}); raise polish_steps (an A still climbing to 1 is "
                    f"one the data do not identify)"
                ),
            ),
        ]
    return _first_reasons(len(A), failing)
