"""Scaling-curve fitting: the ScaleRL sigmoid law fitted with Optax, compared, extrapolated.

    from scalerl_jax.scaling import Curve, FitSpec, fit_curve, bootstrap_fit, compare_fits

Modules: sigmoid (the law, batched jitted fitter), fit (one curve: window, R0, result types),
grid (the paper's grid procedure), bootstrap (intervals, bands, per-seed fits), compare (the
paper's comparison rule, extrapolation checks), alternatives (power law, Tan et al. log-linear),
plot (PNGs), report (run directories -> table and fit/ outputs), checks (degenerate fits),
engine (least squares: Optax Adam from several starts, Levenberg-Marquardt finish).
"""
from scalerl_jax.scaling.alternatives import (LogLinearFit, PowerLawFit, fit_log_linear,
                                              fit_power_law)
from scalerl_jax.scaling.bootstrap import Bootstrap, bootstrap_fit, fit_seeds, seed_spread
from scalerl_jax.scaling.compare import (A_MARGIN, Comparison, Extrapolation, compare_fits,
                                         extrapolate)
from scalerl_jax.scaling.fit import (Curve, FitFailure, FitResult, FitSpec, SigmoidFit,
                                     fit_curve, record_breaking, window_mask)
from scalerl_jax.scaling.grid import PAPER_A_GRID, PAPER_CMID_GRID, fit_grid
from scalerl_jax.scaling.sigmoid import fit_sigmoid_batch, sigmoid_law

__all__ = [
    "A_MARGIN", "Bootstrap", "Comparison", "Curve", "Extrapolation", "FitFailure", "FitResult",
    "FitSpec", "LogLinearFit", "PAPER_A_GRID", "PAPER_CMID_GRID", "PowerLawFit", "SigmoidFit",
    "bootstrap_fit", "compare_fits", "extrapolate", "fit_curve", "fit_grid", "fit_log_linear",
    "fit_power_law", "fit_seeds", "fit_sigmoid_batch", "record_breaking", "seed_spread",
    "sigmoid_law", "window_mask",
]
