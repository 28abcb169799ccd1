"""The paper's fitting procedure: grid over A and C_mid, fit B for each pair, keep the best.

Paper: A in {0.450, 0.455, ..., 0.800}, C_mid 100 linear values in [100, 40000] GPU-hours, B by
SciPy curve_fit per pair. Here all 7,100 pairs are one batched Optax call (A and C_mid held
fixed, B and a free R0 fitted). The published C_mid values are off this grid, so the authors
refined it somehow; the default Optax fit (all parameters continuous) is that refinement.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from scalerl_jax.scaling import checks
from scalerl_jax.scaling.sigmoid import PARAMS, fit_sigmoid_batch

PAPER_A_GRID = tuple(np.round(np.arange(0.450, 0.80001, 0.005), 3))
PAPER_CMID_GRID = tuple(np.linspace(100.0, 40000.0, 100))


def fit_grid(
    x: np.ndarray,
    y: np.ndarray,
    w: np.ndarray,
    *,
    R0: float,
    a_grid: Optional[tuple] = None,
    cmid_grid: Optional[tuple] = None,
    steps: int = 20,
    explore_steps: int = 20,
    polish_steps: int = 20,
    lr: float = 0.05,
) -> dict:
    """One curve x, y, w [m]; R0 NaN = free. Returns fit_sigmoid_batch's dict for one curve."""
    a_values, cmid_values = _grids(a_grid, cmid_grid)
    r0_free = not np.isfinite(R0)
    free = np.array([[False, True, False, r0_free]])
    on = w > 0
    xw, yw = np.where(on, x, 1.0), np.where(on, y, 0.0)
    reason = checks.data_reasons(xw[None], yw[None], w[None], free.sum(1))[0]
    nan = np.full(1, np.nan)
    if reason is not None:
        return {**{k: nan for k in PARAMS + ("rmse", "rmse_before")}, "reasons": [reason]}
    aa, cc = (g.ravel() for g in np.meshgrid(a_values, cmid_values, indexing="ij"))
    n = len(aa)
    tile = lambda v: np.broadcast_to(v, (n, len(v)))  # noqa: E731
    out = fit_sigmoid_batch(
        tile(x),
        tile(y),
        tile(w),
        A=aa,
        C_mid=cc,
        R0=R0,
        steps=steps,
        explore_steps=explore_steps,
        polish_steps=polish_steps,
        num_inits=2,
        lr=lr,
        check=False,
        n_c=1,
    )
    rmse = np.where(np.isfinite(out["rmse"]), out["rmse"], np.inf)
    best = int(np.argmin(rmse))
    one = {name: out[name][best : best + 1] for name in PARAMS + ("rmse", "rmse_before")}
    reason = checks.fit_reasons(
        one,
        free,
        xw[on].min(keepdims=True),
        xw[on].max(keepdims=True),
        one["rmse"],
        one["rmse_before"],
    )[0]
    if reason is None:
        reason = _edge_reason("A", one["A"][0], a_values) or _edge_reason(
            "C_mid", one["C_mid"][0], cmid_values
        )
    if reason is not None:
        one = {k: nan for k in one}
    one["reasons"] = [reason]
    return one


def _grids(a_grid: Optional[tuple], cmid_grid: Optional[tuple]):
    """The A and C_mid grids (the paper's by default), checked."""
    a_values = np.asarray(PAPER_A_GRID if a_grid is None else a_grid, np.float64)
    cmid_values = np.asarray(PAPER_CMID_GRID if cmid_grid is None else cmid_grid, np.float64)
    if a_values.ndim != 1 or cmid_values.ndim != 1 or len(a_values) < 2 or len(cmid_values) < 2:
        raise ValueError(
            f"grid procedure: a_grid ({a_values.shape}) and cmid_grid "
            f"({cmid_values.shape}) must be 1-D with >= 2 values"
        )
    if a_values.max() > 1 or cmid_values.min() <= 0:
        raise ValueError(
            f"grid procedure: need A <= 1 (max {a_values.max()}) and C_mid > 0 "
            f"(min {cmid_values.min()})"
        )
    return a_values, cmid_values


def _edge_reason(name: str, value: float, grid: np.ndarray) -> Optional[str]:
    if np.isclose(value, grid.min()) or np.isclose(value, grid.max()):
        return (
            f"grid optimum on the edge of the {name} grid ({name} = {value:.4g}, grid "
            f"{grid.min():.4g}..{grid.max():.4g}): the best fit lies outside; widen the grid"
        )
    return None
