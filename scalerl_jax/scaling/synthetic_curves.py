"""Synthetic validation curves from the paper's published fits, for tests and benchmarks.

Design of a curve: `n_points` evaluations evenly spaced in compute (an eval every N steps) up to
`span` x C_mid (the paper's long runs reach several C_mid), R0 drawn from `r0_range`, Gaussian
noise `noise` on every point. Realistic noise: mean@16 over 1,000 prompts has a sampling
standard error of about sqrt(0.2 / 16,000) ~ 0.0035; training wobble adds to it, so 0.005.
The measured R0 is the step-0 evaluation, with the same noise.
"""

from __future__ import annotations

import numpy as np

from scalerl_jax.scaling.sigmoid import sigmoid_law

# ScaleRL paper, Table 1: (run, C_mid in GPU-hours, B, A).
PAPER_TABLE1 = (
    ("ScaleRL 8B", 2542, 1.92, 0.610),
    ("ScaleRL 32k gen", 11272, 1.89, 0.645),
    ("8 gen/prompt", 2542, 2.44, 0.585),
    ("24 gen/prompt", 3054, 2.22, 0.590),
    ("32 gen/prompt", 2936, 2.07, 0.595),
    ("Scout 17Bx16 MoE", 4242, 1.65, 0.710),
    ("batch 512", 2818, 1.77, 0.605),
    ("batch 2048", 10909, 1.70, 0.645),
    ("math+code: math", 2896, 2.05, 0.595),
    ("math+code: code", 1675, 1.09, 0.615),
)

TOLERANCE = {"A": 0.01, "B": 0.15, "C_mid": 0.10}  # absolute, absolute, relative


def make_curves(
    n_curves: int,
    *,
    n_points: int = 100,
    noise: float = 0.005,
    span: float = 8.0,
    r0_range: tuple[float, float] = (0.15, 0.35),
    seed: int = 0,
) -> tuple:
    """Curves cycling through Table 1. Returns x, y [n_curves, n_points], measured R0 [n_curves]
    and the truth {"A", "B", "C_mid", "R0"} (arrays [n_curves])."""
    rng = np.random.default_rng(seed)
    rows = np.array([PAPER_TABLE1[i % len(PAPER_TABLE1)][1:] for i in range(n_curves)], float)
    cmid, B, A = rows.T
    R0 = rng.uniform(*r0_range, n_curves)
    x = (span * cmid)[:, None] * np.arange(1, n_points + 1)[None, :] / n_points
    y = sigmoid_law(x, A[:, None], B[:, None], cmid[:, None], R0[:, None])
    y = y + noise * rng.standard_normal(y.shape)
    r0_measured = R0 + noise * rng.standard_normal(n_curves)
    return x, y, r0_measured, {"A": A, "B": B, "C_mid": cmid, "R0": R0}


def within_tolerance(fit: dict, truth: dict, tol: dict = TOLERANCE) -> dict:
    """Per-curve booleans: each parameter within tolerance of the truth, and "all" of them."""
    ok = {
        "A": np.abs(np.asarray(fit["A"]) - truth["A"]) <= tol["A"],
        "B": np.abs(np.asarray(fit["B"]) - truth["B"]) <= tol["B"],
        "C_mid": np.abs(np.asarray(fit["C_mid"]) / truth["C_mid"] - 1.0) <= tol["C_mid"],
    }
    ok["all"] = ok["A"] & ok["B"] & ok["C_mid"]
    return ok
