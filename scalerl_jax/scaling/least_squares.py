"""Weighted least squares for one curve from K starts (callers vmap over curves): Optax Adam,
then a few Levenberg-Marquardt steps.

Adam on reparameterised parameters in standardised log-compute coordinates searches from K
starts (the best continues); Levenberg-Marquardt finishes in the flat valleys where Adam's
steps shrink before arriving. Not optax.lbfgs: its line search is a while-loop, which under
vmap runs every curve as long as the slowest. Measurements: docs/scaling.md.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import optax

DECAY_TO = 0.02  # final learning rate as a fraction of the initial one
ADAM_B1, ADAM_B2 = 0.8, 0.9


def standardise_log_x(x: jax.Array, w: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """u = (log x - mu) / sd over the points with weight > 0; also returns (mu, sd).

    Working in u makes one learning rate fit curves on any axis (device-hours, FLOPs, steps).
    """
    on = w > 0
    lx = jnp.log(jnp.where(on, x, 1.0))
    n = jnp.maximum(jnp.sum(on), 1)
    mu = jnp.sum(jnp.where(on, lx, 0.0)) / n
    sd = jnp.sqrt(jnp.sum(jnp.where(on, (lx - mu) ** 2, 0.0)) / n)
    sd = jnp.where(sd > 0, sd, 1.0)
    return (lx - mu) / sd, mu, sd


def weighted_mse(pred: jax.Array, y: jax.Array, w: jax.Array) -> jax.Array:
    return jnp.sum(w * (pred - y) ** 2) / jnp.maximum(jnp.sum(w), 1e-12)


def optimise(
    predict: Callable,
    theta0: jax.Array,
    u: jax.Array,
    y: jax.Array,
    w: jax.Array,
    aux,
    *,
    steps: int,
    explore_steps: int,
    lr: float,
    polish_steps: int,
):
    """Minimises weighted MSE of predict(theta, u, aux) from K starts theta0 [K, P].

    Returns (theta [P], mse, mse a quarter of the polish earlier) for the best start. The last
    value lets callers tell a converged fit from one still improving.
    """
    # Constant rate while exploring, then decay: at a constant rate Adam's normalised steps
    # keep bouncing around the optimum once gradients vanish.
    schedule = optax.join_schedules(
        [optax.constant_schedule(lr), optax.cosine_decay_schedule(lr, steps, alpha=DECAY_TO)],
        boundaries=[explore_steps],
    )
    # Short moment memories (b1 0.8, b2 0.9 instead of 0.9, 0.999): the problem is deterministic
    # and its curvature changes along the path, so fast-adapting step sizes converge in about
    # half the steps (a plateau of settings b1 <= 0.8, b2 <= 0.95 works as well).
    opt = optax.adam(schedule, b1=ADAM_B1, b2=ADAM_B2)
    sw = jnp.maximum(jnp.sum(w), 1e-12)

    def loss(theta):
        return weighted_mse(predict(theta, u, aux), y, w)

    def run(theta, state, n):
        def body(carry, _):
            th, st = carry
            grad = jax.grad(loss)(th)
            updates, st = opt.update(grad, st, th)
            return (optax.apply_updates(th, updates), st), None

        (theta, state), _ = jax.lax.scan(body, (theta, state), None, length=n)
        return theta, state

    states = jax.vmap(opt.init)(theta0)
    thetas, states = jax.vmap(lambda t, s: run(t, s, explore_steps))(theta0, states)
    losses = jax.vmap(loss)(thetas)
    best = jnp.argmin(jnp.where(jnp.isfinite(losses), losses, jnp.inf))
    theta, _ = run(thetas[best], jax.tree_util.tree_map(lambda a: a[best], states), steps)
    residual = lambda t: jnp.sqrt(w) * (predict(t, u, aux) - y)  # noqa: E731
    theta, costs = levenberg_marquardt(residual, theta, polish_steps)
    return theta, costs[-1] / sw, costs[-1 - max(polish_steps // 4, 1)] / sw


def levenberg_marquardt(residual: Callable, theta: jax.Array, iters: int, lam: float = 1e-3):
    """`iters` damped Gauss-Newton steps on sum(residual(theta)^2) -> (theta, costs [iters+1]).

    A step is kept only if it lowers the cost (damping then falls), else the damping rises.
    Parameters the residual does not depend on (held fixed) get a zero step.
    """
    cost0 = jnp.sum(residual(theta) ** 2)

    def body(carry, _):
        theta, lam, cost = carry
        r = residual(theta)
        J = jax.jacfwd(residual)(theta)
        g, H = J.T @ r, J.T @ J
        d = jnp.diag(H)
        damped = H + lam * jnp.diag(d) + jnp.diag(jnp.where(d > 0, 0.0, 1.0))
        new = theta - _solve_small_spd(damped, g)
        new_cost = jnp.sum(residual(new) ** 2)
        ok = jnp.isfinite(new_cost) & (new_cost < cost)
        carry = (
            jnp.where(ok, new, theta),
            jnp.where(ok, lam * 0.3, lam * 10.0),
            jnp.where(ok, new_cost, cost),
        )
        return carry, carry[2]

    (theta, _, _), costs = jax.lax.scan(body, (theta, lam, cost0), None, length=iters)
    return theta, jnp.concatenate([cost0[None], costs])


def top_k_starts(candidates: jax.Array, sse: jax.Array, k: int) -> jax.Array:
    """The k candidate rows [N, P] with the lowest finite SSE (k <= N)."""
    sse = jnp.where(jnp.isfinite(sse), sse, jnp.inf)
    return candidates[jax.lax.top_k(-sse, k)[1]]


def _solve_small_spd(M: jax.Array, v: jax.Array) -> jax.Array:
    """M^-1 v for a small symmetric positive definite M, by unrolled Gauss-Jordan.

    Why not jnp.linalg.solve: per curve it is a LAPACK call on a 4x4 matrix, which cost more
    than the rest of a Levenberg-Marquardt step. Without pivoting this is stable for SPD M.
    """
    n = M.shape[0]
    rows = [jnp.concatenate([M[i], v[i : i + 1]]) for i in range(n)]
    for i in range(n):
        rows[i] = rows[i] / rows[i][i]
        for j in range(n):
            if j != i:
                rows[j] = rows[j] - rows[j][i] * rows[i]
    return jnp.stack([r[n] for r in rows])
