"""Other curve forms, for comparison with the sigmoid.

* Power law R = A - D / C^B (the sigmoid's C >> C_mid limit). The paper's warning: fitted on
  1.5k-50k GPU-hours it put A at 1.0 (the bound) where the sigmoid gave 0.645; such a fit is
  returned with a note, since showing that is the point of the comparison.
* Tan et al. (2509.25300) log-linear form: log(1 - R) = -k log C + E, for one model size
  (their k(N) varies across sizes). It has no asymptote below 1.

The record-breaking pre-filter (IsoCompute) is `fit.record_breaking`, applied via FitSpec.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import ClassVar, Literal, Union

import jax
import jax.numpy as jnp
import numpy as np

from scalerl_jax.scaling import checks, least_squares
from scalerl_jax.scaling.fit import Curve, FitFailure, FitSpec, padded, window_mask


@dataclasses.dataclass(frozen=True)
class PowerLawFit:
    A: float
    B: float
    log_D: float  # D itself overflows on a FLOPs axis
    rmse: float
    n_points: int
    note: str = ""
    ok: ClassVar[Literal[True]] = True

    def predict(self, C):
        return self.A - np.exp(self.log_D - self.B * np.log(np.asarray(C, np.float64)))


@dataclasses.dataclass(frozen=True)
class LogLinearFit:
    k: float
    E: float
    rmse: float
    n_points: int
    ok: ClassVar[Literal[True]] = True

    def predict(self, C):
        return 1.0 - np.exp(self.E - self.k * np.log(np.asarray(C, np.float64)))


def _power_predict(theta, u, aux):
    del aux
    return 1.0 - jnp.exp(theta[0]) - jnp.exp(theta[2] - jnp.exp(theta[1]) * u)


def _power_starts(u, y, w, k):
    """For a few asymptotes above the data, regress log(A - y) on u in closed form."""
    ymax = jnp.max(jnp.where(w > 0, y, -jnp.inf))
    A = jnp.clip(ymax + jnp.array([0.01, 0.05, 0.15, 0.4]), -1.0, 0.999)
    A = jnp.maximum(A, ymax + 1e-3)
    z = jnp.log(jnp.maximum(A[:, None] - y[None, :], 1e-6))
    sw = jnp.maximum(jnp.sum(w), 1e-12)
    ub, zb = jnp.sum(w * u) / sw, jnp.sum(w * z, axis=1) / sw
    slope = jnp.sum(w * (u - ub) * (z - zb[:, None]), axis=1) / jnp.maximum(
        jnp.sum(w * (u - ub) ** 2), 1e-12
    )
    Bn = jnp.maximum(-slope, 0.05)
    e = zb + Bn * ub
    cand = jnp.stack([jnp.log(1.0 - A), jnp.log(Bn), e], axis=1)
    sse = jax.vmap(lambda t: jnp.sum(w * (_power_predict(t, u, None) - y) ** 2))(cand)
    return least_squares.top_k_starts(cand, sse, k)


@functools.partial(jax.jit, static_argnames=("steps", "explore_steps", "polish_steps", "lr"))
def _power_core(x, y, w, *, steps, explore_steps, polish_steps, lr):
    u, mu, sd = least_squares.standardise_log_x(x, w)
    theta0 = _power_starts(u, y, w, 4)
    theta, mse, mse_before = least_squares.optimise(
        _power_predict,
        theta0,
        u,
        y,
        w,
        None,
        steps=steps,
        explore_steps=explore_steps,
        lr=lr,
        polish_steps=polish_steps,
    )
    B = jnp.exp(theta[1]) / sd
    # exp(e - Bn u) = exp(e + B mu - B log C): log D = e + B mu
    return (
        jnp.stack([1.0 - jnp.exp(theta[0]), B, theta[2] + B * mu]),
        jnp.sqrt(mse),
        jnp.sqrt(mse_before),
    )


def fit_power_law(curve: Curve, spec: FitSpec = FitSpec()) -> Union[PowerLawFit, FitFailure]:
    """R = A - D / C^B on the same window as the sigmoid fit (A <= 1, B > 0, D > 0)."""
    mask = window_mask(curve, spec)
    x, y, w = padded(curve, mask)
    n = int(mask.sum())
    reason = checks.data_reasons(x, y, w, np.array([3]))[0]
    if reason is not None:
        return FitFailure(reason=reason, n_points=n)
    p, rmse, rmse_before = _power_core(
        jnp.asarray(x[0], jnp.float32),
        jnp.asarray(y[0], jnp.float32),
        jnp.asarray(w[0], jnp.float32),
        **spec.optim(),
    )
    A, B, log_D = (float(v) for v in np.asarray(p, np.float64))
    rmse, rmse_before = float(rmse), float(rmse_before)
    if not np.all(np.isfinite([A, B, log_D, rmse])):
        return FitFailure(reason="optimiser diverged: non-finite parameters", n_points=n)
    note = ""
    if A > 1.0 - checks.A_BOUND_TOL:
        note = "A at the A <= 1 bound: the power law sees no saturation"
    elif rmse_before - rmse > checks.CONVERGE_RTOL * rmse + checks.CONVERGE_ATOL:
        note = "optimiser still improving at the end; raise polish_steps"
    return PowerLawFit(A=A, B=B, log_D=log_D, rmse=rmse, n_points=n, note=note)


def fit_log_linear(curve: Curve, spec: FitSpec = FitSpec()) -> Union[LogLinearFit, FitFailure]:
    """Tan et al.: least squares of log(1 - R) on log C (closed form), points with R < 1."""
    mask = window_mask(curve, spec) & (curve.y < 1.0)
    n = int(mask.sum())
    x, y, w = padded(curve, mask)
    reason = checks.data_reasons(x, y, w, np.array([2]))[0]
    if reason is not None:
        return FitFailure(reason=reason, n_points=n)
    lx, ly = np.log(curve.x[mask]), np.log(1.0 - curve.y[mask])
    slope, intercept = np.polyfit(lx, ly, 1)
    if slope >= 0:
        return FitFailure(
            reason=f"log(1 - R) does not fall with log C (slope {slope:+.3f})", n_points=n
        )
    fit = LogLinearFit(k=float(-slope), E=float(intercept), rmse=0.0, n_points=n)
    rmse = float(np.sqrt(np.mean((fit.predict(curve.x[mask]) - curve.y[mask]) ** 2)))
    return dataclasses.replace(fit, rmse=rmse)
