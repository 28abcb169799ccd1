"""Scaling-curve fitting: the ScaleRL sigmoid law fitted with Optax, compared, extrapolated.

    from scalerl_jax.scaling import Curve, FitSpec, fit_curve, bootstrap_fit, compare_fits

Modules: sigmoid (the law, batched jitted fitter), fit (one curve: window, R0, result types),
grid (the paper's grid procedure), bootstrap (intervals, bands, per-seed fits), compare (the
paper's comparison rule, extrapolation checks), alternatives (power law, Tan et al. log-linear),
plot (PNGs), report (run directories -> table and fit/ outputs), checks (degenerate fits),
least_squares (Optax Adam from several starts, Levenberg-Marquardt finish), forecast
(the online forecast during a run) and forecast_child (its child process's loop).

The names below load their module on first use (PEP 562): the forecast's child process imports
this package on its way to forecast_child.py, and must choose its JAX platform before anything
imports JAX.
"""

import importlib

_EXPORTS = {
    "alternatives": ("LogLinearFit", "PowerLawFit", "fit_log_linear", "fit_power_law"),
    "bootstrap": ("Bootstrap", "bootstrap_fit", "fit_seeds", "seed_spread"),
    "compare": ("A_MARGIN", "Comparison", "Extrapolation", "compare_fits", "extrapolate"),
    "fit": (
        "Curve",
        "FitFailure",
        "FitResult",
        "FitSpec",
        "SigmoidFit",
        "fit_curve",
        "record_breaking",
        "window_mask",
    ),
    "grid": ("PAPER_A_GRID", "PAPER_CMID_GRID", "fit_grid"),
    "sigmoid": ("fit_sigmoid_batch", "sigmoid_law"),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}


def __getattr__(name: str):
    if name not in _MODULE_OF:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_MODULE_OF[name]}"), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_MODULE_OF))


__all__ = sorted(_MODULE_OF)
