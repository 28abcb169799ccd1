"""Compute allocation: which setting of a scaling axis (prompts per batch, generations per
prompt, generation length, ...) reaches the highest pass rate at a compute budget, judged from
short runs of each setting.

Each setting's curve is fitted with the sigmoid law (optionally on its record-breaking points
only, as the paper's IsoCompute plots do) and extrapolated to the budget, with a bootstrap
interval for the predicted pass rate. Settings are ranked by that prediction. The best is
"clear" when its interval's lower end is above the runner-up's prediction; otherwise the
choice is within the uncertainty and the note says so. The paper's observation behind this:
curves of different allocations cross (a larger batch starts slower and ends higher), so the
best choice at the budget is often not the best one seen in the short runs.
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import numpy as np

from scalerl_jax.scaling.bootstrap import bootstrap_fit
from scalerl_jax.scaling.fit import Curve, FitResult, FitSpec, fit_curve


@dataclasses.dataclass(frozen=True)
class Candidate:
    label: str  # e.g. "48x16, 14k tokens"
    curve: Curve
    settings: dict = dataclasses.field(default_factory=dict)  # the axis values, for the table


@dataclasses.dataclass(frozen=True)
class Option:
    candidate: Candidate
    fit: FitResult
    predicted: Optional[float]  # pass rate at the budget; None when the fit failed
    lo: float
    hi: float
    extrapolation: float  # budget / the most compute the short run reached
    reason: Optional[str] = None  # why there is no prediction


@dataclasses.dataclass(frozen=True)
class Recommendation:
    budget: float
    options: tuple  # Options, best prediction first; failed fits last
    level: float

    @property
    def best(self) -> Optional[Option]:
        first = self.options[0] if self.options else None
        return first if first is not None and first.predicted is not None else None

    @property
    def runner_up(self) -> Optional[Option]:
        ranked = [o for o in self.options if o.predicted is not None]
        return ranked[1] if len(ranked) > 1 else None

    @property
    def clear(self) -> bool:
        """The best's interval lies above the runner-up's prediction."""
        best, second = self.best, self.runner_up
        # Ranked options have a prediction and its interval.
        return best is not None and (second is None or best.lo > second.predicted)  # type: ignore[operator]


def recommend(
    candidates: Sequence[Candidate],
    budget: float,
    spec: FitSpec = FitSpec(),
    *,
    n_boot: int = 200,
    level: float = 0.95,
    seed: int = 0,
) -> Recommendation:
    """Fit each candidate, predict its pass rate at `budget` (same units as the curves' x)."""
    if not budget > 0:
        raise ValueError(f"recommend: budget={budget} must be > 0")
    if len(candidates) < 2:
        raise ValueError(f"recommend: {len(candidates)} candidate(s); compare at least two")
    labels = [c.label for c in candidates]
    if len(set(labels)) != len(labels):
        raise ValueError(f"recommend: candidate labels must differ, got {labels}")
    options = []
    for cand in candidates:
        xs = cand.curve.x[np.isfinite(cand.curve.x)]
        reach = budget / float(xs.max()) if len(xs) and xs.max() > 0 else float("nan")
        fit = fit_curve(cand.curve, spec)
        if not fit.ok:
            options.append(Option(cand, fit, None, np.nan, np.nan, reach, fit.reason))
            continue
        predicted = float(fit.predict(budget))
        lo = hi = float("nan")
        if n_boot:
            band_x = np.array([budget])
            boot = bootstrap_fit(
                cand.curve, spec, fit, n_boot=n_boot, level=level, seed=seed, band_x=band_x
            )
            lo, hi = float(boot.band_lo[0]), float(boot.band_hi[0])
        options.append(Option(cand, fit, predicted, lo, hi, reach))
    options.sort(key=lambda o: (o.predicted is None, -(o.predicted or 0.0)))
    return Recommendation(budget=float(budget), options=tuple(options), level=level)


def summary(rec: Recommendation, x_label: str) -> str:
    """The recommendation in a sentence or two."""
    best, second = rec.best, rec.runner_up
    if best is None:
        return "no recommendation: no candidate could be fitted"
    pct = f"{100 * rec.level:.0f}%"
    text = (
        f"at a budget of {rec.budget:.4g} {x_label}, {best.candidate.label} is predicted "
        f"to reach {best.predicted:.3f} [{best.lo:.3f}, {best.hi:.3f}] ({pct})"
    )
    if second is not None:
        gap = best.predicted - second.predicted  # type: ignore[operator]  # both ranked
        text += f", {gap:+.3f} above {second.candidate.label} ({second.predicted:.3f}); " + (
            "a clear choice"
            if rec.clear
            else "within the uncertainty: run both longer or add seeds before committing"
        )
    far = max(best.extrapolation, second.extrapolation if second else 0.0)
    if far > 10:
        text += (
            f". The budget is {far:.0f}x the compute of the short runs: an extrapolation "
            "that far rests on the sigmoid's form, not on data"
        )
    return text
