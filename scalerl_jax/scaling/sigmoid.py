"""Batched sigmoid-law fitting: many curves x many starts in one jitted call (Optax Adam from
several starts, then a Levenberg-Marquardt finish; see least_squares.py).

    R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B)

In u = log C the law is a logistic, R0 + (A - R0) * sigmoid(B * (u - log C_mid)), and the fit
works there (standardised per curve), with constraints by reparameterisation: A = 1 - exp(a)
(A <= 1), B = exp(b) (B > 0), C_mid = exp(c) (C_mid > 0); R0 is free or fixed. Any of A, B, C_mid,
R0 can be held fixed per curve, which gives the paper's grid procedure (A and C_mid fixed, B
fitted) and its comparison rule (A fixed at a shared value) from the same code.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from scalerl_jax.scaling import checks, least_squares

PARAMS = ("A", "B", "C_mid", "R0")


def sigmoid_law(C, A, B, C_mid, R0):
    """R(C) for C > 0; numpy or jax arrays, broadcasting."""
    xp = jnp if isinstance(C, jax.Array) else np
    # 1 / (1 + exp(z)) as (1 - tanh(z / 2)) / 2: equal, and no overflow far below C_mid.
    return R0 + (A - R0) * 0.5 * (1.0 - xp.tanh(0.5 * B * (xp.log(C_mid) - xp.log(C))))


def _predict(theta, u, aux):
    fixed, value = aux  # [4] bool; [4] values to hold, B and C_mid already in u-coordinates
    A = jnp.where(fixed[0], value[0], 1.0 - jnp.exp(theta[0]))
    B = jnp.where(fixed[1], value[1], jnp.exp(theta[1]))
    c = jnp.where(fixed[2], value[2], theta[2])
    R0 = jnp.where(fixed[3], value[3], theta[3])
    return R0 + (A - R0) * jax.nn.sigmoid(B * (u - c))


def _starts(u, y, w, fixed, value, k, n_b, n_c):
    """Grid over (B, c) with the linear parameters (A, R0) solved in closed form; best k."""
    b = jnp.log(jnp.array([0.5, 1.0, 2.0, 4.0][:n_b]))
    c = jnp.linspace(-2.5, 3.0, n_c) if n_c > 1 else jnp.zeros(1)
    bb, cc = (g.ravel() for g in jnp.meshgrid(b, c, indexing="ij"))
    bb = jnp.where(fixed[1], jnp.log(value[1]), bb)
    cc = jnp.where(fixed[2], value[2], cc)

    sw, swy, swyy = jnp.sum(w), jnp.sum(w * y), jnp.sum(w * y * y)

    def candidate(bc):
        # y ~ A*s + R0*(1-s) is linear in (A, R0). With t = 1 - s every sum the normal equations
        # and the SSE need follows from three sums over the points.
        s = jax.nn.sigmoid(jnp.exp(bc[0]) * (u - bc[1]))
        ws = w * s
        s1, ss, sy = jnp.sum(ws), jnp.sum(ws * s), jnp.sum(ws * y)
        st, tt, ty = s1 - ss, sw - 2.0 * s1 + ss, swy - sy
        tiny = 1e-12
        det = ss * tt - st * st + tiny
        A_both, R0_both = (sy * tt - ty * st) / det, (ss * ty - st * sy) / det
        A_r0 = (sy - value[3] * st) / (ss + tiny)  # R0 fixed
        R0_a = (ty - value[0] * st) / (tt + tiny)  # A fixed
        A = jnp.where(fixed[0], value[0], jnp.where(fixed[3], A_r0, A_both))
        R0 = jnp.where(fixed[3], value[3], jnp.where(fixed[0], R0_a, R0_both))
        A, R0 = jnp.clip(A, -1.0, 0.999), jnp.clip(R0, -0.5, 1.5)
        sse = swyy - 2.0 * (A * sy + R0 * ty) + A * A * ss + 2.0 * A * R0 * st + R0 * R0 * tt
        return jnp.stack([jnp.log1p(-A), bc[0], bc[1], R0]), sse

    # One candidate at a time keeps the working set at [curves, points] (cache-sized) instead
    # of [curves, candidates, points], which made this step memory-bound.
    cand, sse = jax.lax.map(candidate, jnp.stack([bb, cc], axis=1))
    return least_squares.top_k_starts(cand, sse, k)


@functools.partial(
    jax.jit, static_argnames=("steps", "explore_steps", "polish_steps", "k", "lr", "n_b", "n_c")
)
def _fit_core(x, y, w, fixed, value, *, steps, explore_steps, polish_steps, k, lr, n_b, n_c):
    def one(x, y, w, fixed, value):
        u, mu, sd = least_squares.standardise_log_x(x, w)
        # Fixed B and C_mid are given in natural units; map them to u-coordinates.
        value_u = jnp.stack([value[0], value[1] * sd, (jnp.log(value[2]) - mu) / sd, value[3]])
        value_u = jnp.where(fixed, value_u, 1.0)
        theta0 = _starts(u, y, w, fixed, value_u, k, n_b, n_c)
        theta, mse, mse_before = least_squares.optimise(
            _predict,
            theta0,
            u,
            y,
            w,
            (fixed, value_u),
            steps=steps,
            explore_steps=explore_steps,
            lr=lr,
            polish_steps=polish_steps,
        )
        A = jnp.where(fixed[0], value[0], 1.0 - jnp.exp(theta[0]))
        B = jnp.where(fixed[1], value[1], jnp.exp(theta[1]) / sd)
        C = jnp.where(fixed[2], value[2], jnp.exp(mu + sd * theta[2]))
        R0 = jnp.where(fixed[3], value[3], theta[3])
        return jnp.stack([A, B, C, R0]), jnp.sqrt(mse), jnp.sqrt(mse_before)

    return jax.vmap(one)(x, y, w, fixed, value)


def _per_curve(v, n: int, name: str) -> np.ndarray:
    """None -> all free (NaN); scalar or [n] -> [n] float array; NaN entries mean free."""
    if v is None:
        return np.full(n, np.nan)
    arr = np.asarray(v, np.float64)
    arr = np.full(n, float(arr)) if arr.ndim == 0 else arr
    if arr.shape != (n,):
        raise ValueError(f"fixed {name} has shape {arr.shape}; need a scalar or ({n},)")
    return arr


def fit_sigmoid_batch(
    x,
    y,
    w=None,
    *,
    A=None,
    B=None,
    C_mid=None,
    R0=None,
    steps: int = 20,
    explore_steps: int = 20,
    polish_steps: int = 20,
    num_inits: int = 4,
    lr: float = 0.05,
    check: bool = True,
    n_b: int = 4,
    n_c: int = 12,
) -> dict:
    """Fits curves x, y [n, m] (or [m]) in one jitted call (least_squares.optimise: K starts x
    explore_steps of Adam, `steps` more for the best, then `polish_steps` of Levenberg-Marquardt).

    w: per-point weights (bootstrap counts, fit-window masks); points with x <= 0 or non-finite y
    get weight 0. A, B, C_mid, R0: None (free), a scalar, or [n] values (NaN = free) to hold fixed.
    Returns numpy arrays A, B, C_mid, R0, rmse [n] and `reasons` (list; None where usable). With
    check=True degenerate curves get a reason and NaN parameters; with check=False only the raw
    optimum is returned (bootstrap resamples use this).
    """
    x = np.atleast_2d(np.asarray(x, np.float64))
    y = np.atleast_2d(np.asarray(y, np.float64))
    if x.shape != y.shape:
        raise ValueError(f"fit_sigmoid_batch: x{x.shape} and y{y.shape} must match")
    w = np.ones_like(x) if w is None else np.broadcast_to(np.asarray(w, np.float64), x.shape)
    w = np.where((x > 0) & np.isfinite(x) & np.isfinite(y), w, 0.0)
    xs, ys = np.where(w > 0, x, 1.0), np.where(w > 0, y, 0.0)
    n = x.shape[0]
    value = np.stack([_per_curve(v, n, name) for v, name in zip((A, B, C_mid, R0), PARAMS)], 1)
    fixed = np.isfinite(value)
    free = ~fixed
    reasons = checks.data_reasons(xs, ys, w, free.sum(1)) if check else [None] * n
    if all(r is not None for r in reasons):  # nothing worth fitting: skip the compile and run
        nan = np.full(n, np.nan)
        return {**{name: nan for name in PARAMS + ("rmse", "rmse_before")}, "reasons": reasons}
    p, rmse, rmse_before = _fit_core(
        jnp.asarray(xs, jnp.float32),
        jnp.asarray(ys, jnp.float32),
        jnp.asarray(w, jnp.float32),
        jnp.asarray(fixed),
        jnp.asarray(np.where(fixed, value, 1.0), jnp.float32),
        steps=steps,
        explore_steps=explore_steps,
        polish_steps=polish_steps,
        k=min(num_inits, n_b * n_c),
        lr=lr,
        n_b=n_b,
        n_c=n_c,
    )
    p, rmse, rmse_before = (np.asarray(a, np.float64) for a in (p, rmse, rmse_before))
    out: dict[str, Any] = {name: p[:, i] for i, name in enumerate(PARAMS)}
    out["rmse"], out["rmse_before"] = rmse, rmse_before
    if not check:
        out["reasons"] = reasons
        return out
    on = w > 0
    x_lo = np.where(on, xs, np.inf).min(1)
    x_hi = np.where(on, xs, -np.inf).max(1)
    post = checks.fit_reasons(out, free, x_lo, x_hi, rmse, rmse_before)
    out["reasons"] = [r if r is not None else q for r, q in zip(reasons, post)]
    bad = np.array([r is not None for r in out["reasons"]])
    for name in PARAMS + ("rmse",):
        out[name] = np.where(bad, np.nan, out[name])
    return out
