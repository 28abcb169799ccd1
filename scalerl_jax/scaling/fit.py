"""Fitting one run's validation curve to the sigmoid law (ScaleRL paper, Eq. 1).

    R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B)

A `Curve` holds a run's (compute, pass-rate) points, or several seeds' points pooled. A `FitSpec`
says how to fit: R0 measured (each seed's first evaluation, averaged), free or given; the fit
window (compute after `fit_start`, paper ~1.5k GPU-hours); the Optax fit or the paper's grid
procedure; the record-breaking pre-filter. `fit_curve` returns a `SigmoidFit`, or a `FitFailure`
whose reason says why the data cannot support a fit (never numbers for a degenerate fit).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar, Literal, Optional, Union

import numpy as np

from scalerl_jax.scaling.grid import fit_grid
from scalerl_jax.scaling.sigmoid import fit_sigmoid_batch, sigmoid_law

PAD_TO = 128  # point counts are padded to a multiple of this so runs share compiled shapes


@dataclasses.dataclass(frozen=True)
class Curve:
    """Validation points of one run, or of several seeds pooled (`seed` tells them apart)."""

    name: str
    x: np.ndarray
    y: np.ndarray
    seed: Optional[np.ndarray] = None  # int per point; None: a single run
    x_key: str = "compute.device_hours"
    y_key: str = "pass_rate"

    def __post_init__(self):
        x, y = np.asarray(self.x, np.float64), np.asarray(self.y, np.float64)
        if x.ndim != 1 or x.shape != y.shape:
            raise ValueError(f"Curve {self.name!r}: x{x.shape} and y{y.shape} must be equal 1-D")
        seed = np.zeros(len(x), np.int64) if self.seed is None else np.asarray(self.seed)
        if seed.shape != x.shape:
            raise ValueError(f"Curve {self.name!r}: seed{seed.shape} must match x{x.shape}")
        order = np.lexsort((x, seed))
        object.__setattr__(self, "x", x[order])
        object.__setattr__(self, "y", y[order])
        object.__setattr__(self, "seed", seed[order])

    @property
    def seeds(self) -> np.ndarray:
        return np.unique(self.seed)  # type: ignore[arg-type]  # None becomes zeros in __post_init__

    def initial_value(self) -> tuple[float, float]:
        """(x, y) of each seed's first finite evaluation, averaged over seeds: the measured R0."""
        ok = np.isfinite(self.x) & np.isfinite(self.y)
        firsts = np.concatenate(
            [np.flatnonzero(ok & (self.seed == s))[:1] for s in self.seeds]
        ).astype(int)
        if not len(firsts):
            raise ValueError(f"Curve {self.name!r}: no finite evaluation to measure R0 from")
        return float(np.mean(self.x[firsts])), float(np.mean(self.y[firsts]))


@dataclasses.dataclass(frozen=True)
class FitSpec:
    """How to fit. The window is fit_start <= compute <= fit_end (paper: from 1500 GPU-hours);
    compute 0 (the step-0 evaluation, R0) is never in it."""

    r0: Union[str, float] = "measured"  # "measured" | "free" | a number
    fit_start: float = 0.0
    fit_end: Optional[float] = None
    procedure: str = "optax"  # "optax" | "grid" (paper: grid over A and C_mid, fit B)
    record_breaking: bool = False  # fit only points above every earlier one (IsoCompute)
    steps: int = 20  # Adam steps for the best start, after explore_steps for each of num_inits
    explore_steps: int = 20
    polish_steps: int = 20  # Levenberg-Marquardt steps at the end
    num_inits: int = 4
    lr: float = 0.05
    a_grid: Optional[tuple] = None  # grid procedure; None: the paper's grids
    cmid_grid: Optional[tuple] = None

    def __post_init__(self):
        if not (self.r0 in ("measured", "free") or isinstance(self.r0, (int, float))):
            raise ValueError(f"FitSpec.r0={self.r0!r}: must be 'measured', 'free' or a number")
        if self.procedure not in ("optax", "grid"):
            raise ValueError(f"FitSpec.procedure={self.procedure!r}: must be 'optax' or 'grid'")
        if self.fit_end is not None and self.fit_end <= self.fit_start:
            raise ValueError(
                f"FitSpec.fit_end={self.fit_end} must exceed fit_start={self.fit_start}"
            )
        for name, least in (
            ("steps", 1),
            ("explore_steps", 1),
            ("num_inits", 1),
            ("polish_steps", 4),
        ):
            if getattr(self, name) < least:
                raise ValueError(f"FitSpec.{name}={getattr(self, name)}: must be >= {least}")
        if not self.lr > 0:
            raise ValueError(f"FitSpec.lr={self.lr}: must be > 0")

    def optim(self) -> dict:
        """The optimiser settings, as keyword arguments of the fitting functions."""
        return dict(
            steps=self.steps,
            explore_steps=self.explore_steps,
            polish_steps=self.polish_steps,
            lr=self.lr,
        )


@dataclasses.dataclass(frozen=True)
class SigmoidFit:
    A: float
    B: float
    C_mid: float
    R0: float
    rmse: float
    n_points: int
    x_range: tuple  # (smallest, largest) compute fitted
    r0_mode: str  # "measured" | "free" | "given"
    fixed: tuple = ()  # names of parameters held fixed, e.g. ("A",) in a comparison refit
    procedure: str = "optax"
    # A class constant, not a field: `if not fit.ok` tells the checker which of FitResult it is.
    ok: ClassVar[Literal[True]] = True

    def predict(self, C):
        return sigmoid_law(np.asarray(C, np.float64), self.A, self.B, self.C_mid, self.R0)


@dataclasses.dataclass(frozen=True)
class FitFailure:
    reason: str
    n_points: int
    ok: ClassVar[Literal[False]] = False


FitResult = Union[SigmoidFit, FitFailure]


def record_breaking(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Mask of points whose y exceeds every earlier point's (in x order); the first is kept.

    IsoCompute (2603.12151) fits its sigmoid to these "record-breaking" points only.
    """
    order = np.argsort(x, kind="stable")
    ys = y[order]
    earlier_max = np.concatenate([[-np.inf], np.maximum.accumulate(ys)[:-1]])
    mask = np.empty(len(y), bool)
    mask[order] = ys > earlier_max
    return mask


def window_mask(curve: Curve, spec: FitSpec) -> np.ndarray:
    """Points the fit uses: compute in [fit_start, fit_end] and > 0, finite, optionally
    record-breaking. Both bounds are inclusive: `fit_start=1500` keeps a point at 1,500."""
    x, y = curve.x, curve.y
    mask = (x >= spec.fit_start) & (x > 0) & np.isfinite(y) & np.isfinite(x)
    if spec.fit_end is not None:
        mask &= x <= spec.fit_end
    if spec.record_breaking:
        for s in curve.seeds:
            on = curve.seed == s
            mask[on] &= record_breaking(x[on], y[on])
    return mask


def r0_value(curve: Curve, spec: FitSpec) -> tuple[float, str]:
    """(R0 to hold fixed or NaN for free, mode name)."""
    if spec.r0 == "measured":
        return curve.initial_value()[1], "measured"
    if spec.r0 == "free":
        return float("nan"), "free"
    return float(spec.r0), "given"


def padded(curve: Curve, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """x, y, w [1, m'] with m' a multiple of PAD_TO (pads carry weight 0)."""
    m = len(curve.x)
    size = max(PAD_TO, -(-m // PAD_TO) * PAD_TO)
    x, y, w = np.ones(size), np.zeros(size), np.zeros(size)
    x[:m], y[:m], w[:m] = curve.x, np.nan_to_num(curve.y), mask.astype(np.float64)
    return x[None], y[None], w[None]


def fit_curve(curve: Curve, spec: FitSpec = FitSpec(), *, A: Optional[float] = None) -> FitResult:
    """Fits one curve (all its seeds pooled). A: hold the asymptote fixed (comparison refits)."""
    mask = window_mask(curve, spec)
    r0, r0_mode = r0_value(curve, spec)
    x, y, w = padded(curve, mask)
    if spec.procedure == "grid" and A is None:
        out = fit_grid(
            x[0], y[0], w[0], R0=r0, a_grid=spec.a_grid, cmid_grid=spec.cmid_grid, **spec.optim()
        )
        return result_from(out, 0, mask, curve, r0_mode, procedure="grid")
    out = fit_sigmoid_batch(x, y, w, A=A, R0=r0, num_inits=spec.num_inits, **spec.optim())
    return result_from(out, 0, mask, curve, r0_mode, fixed=("A",) if A is not None else ())


def result_from(
    out: dict,
    i: int,
    mask: np.ndarray,
    curve: Curve,
    r0_mode: str,
    fixed: tuple = (),
    procedure: str = "optax",
) -> FitResult:
    n = int(mask.sum())
    if out["reasons"][i] is not None:
        return FitFailure(reason=out["reasons"][i], n_points=n)
    xs = curve.x[mask]
    return SigmoidFit(
        A=float(out["A"][i]),
        B=float(out["B"][i]),
        C_mid=float(out["C_mid"][i]),
        R0=float(out["R0"][i]),
        rmse=float(out["rmse"][i]),
        n_points=n,
        x_range=(float(xs.min()), float(xs.max())),
        r0_mode=r0_mode,
        fixed=fixed + (("R0",) if r0_mode != "free" else ()),
        procedure=procedure,
    )
