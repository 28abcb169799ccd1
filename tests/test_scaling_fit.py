"""Sigmoid-law fitting: parameter recovery, agreement with SciPy, degenerate inputs, the paper's
grid procedure and comparison rule, bootstrap, pooling, extrapolation and the alternative forms.

Synthetic curves come from the paper's Table 1 (scaling/synthetic_curves.py): 100 evaluations evenly
spaced up to 8 x C_mid, noise 0.005 (mean@16 over 1,000 prompts plus training wobble), R0 fixed
to a noisy step-0 measurement.
"""

import re
import warnings

import numpy as np
import pytest
from scipy.optimize import curve_fit

from scalerl_jax.scaling import (
    Curve,
    FitSpec,
    bootstrap_fit,
    compare_fits,
    extrapolate,
    fit_curve,
    fit_log_linear,
    fit_power_law,
    fit_seeds,
    fit_sigmoid_batch,
    record_breaking,
    sigmoid_law,
)
from scalerl_jax.scaling.bootstrap import resample_weights
from scalerl_jax.scaling.synthetic_curves import PAPER_TABLE1, make_curves, within_tolerance


N_TABLE = 100  # 10 seeds of every Table 1 row


@pytest.fixture(scope="module")
def batch():
    """Table 1 curves plus a flat and a decreasing one, so every batch test shares one compile."""
    x, y, r0, truth = make_curves(N_TABLE, seed=1)
    rng = np.random.default_rng(0)
    x = np.concatenate([x, x[:2]])
    y = np.concatenate(
        [
            y,
            [
                0.4 + 0.005 * rng.standard_normal(x.shape[1]),
                0.6 - 0.2 * np.linspace(0, 1, x.shape[1]),
            ],
        ]
    )
    return x, y, np.concatenate([r0, [0.4, 0.6]]), truth


@pytest.fixture(scope="module")
def table1_fits(batch):
    x, y, r0, truth = batch
    return x, y, r0, truth, fit_sigmoid_batch(x, y, R0=r0)


@pytest.mark.fast
def test_recovers_table1_parameters_on_most_seeds(table1_fits):
    # Required: A within 0.01, B within 0.15, C_mid within 10% on >= 90% of the 100 curves (98%
    # when written; the spread of the least-squares estimate under this noise misses the rest).
    *_, truth, out = table1_fits
    table = {k: v[:N_TABLE] for k, v in out.items()}
    ok = within_tolerance(table, truth)
    assert all(r is None for r in table["reasons"]), [r for r in table["reasons"] if r]
    assert ok["all"].mean() >= 0.90, {k: v.mean() for k, v in ok.items()}
    assert ok["A"].mean() >= 0.95 and ok["C_mid"].mean() >= 0.95
    # Every Table 1 row (10 seeds each) is recovered on most of its seeds, not just on average.
    per_row = ok["all"].reshape(10, len(PAPER_TABLE1)).mean(axis=0)
    assert per_row.min() >= 0.7, dict(zip([r[0] for r in PAPER_TABLE1], per_row))


def test_batch_marks_degenerate_curves_nan_with_reasons(table1_fits):
    *_, out = table1_fits
    assert out["reasons"][N_TABLE].startswith("flat")
    assert out["reasons"][N_TABLE + 1].startswith("decreasing")
    assert np.isnan(out["A"][N_TABLE:]).all() and np.isnan(out["B"][N_TABLE:]).all()


def test_recovery_with_free_r0(batch):
    x, y, _, truth = batch
    out = fit_sigmoid_batch(x, y)
    ok = within_tolerance({k: v[:N_TABLE] for k, v in out.items()}, truth)
    assert ok["A"].mean() >= 0.9 and ok["all"].mean() >= 0.9, {k: v.mean() for k, v in ok.items()}
    assert np.nanmax(np.abs(out["R0"][:N_TABLE] - truth["R0"])) < 0.05


def test_agrees_with_scipy_curve_fit_where_it_converges(table1_fits):
    x, y, r0, truth, out = table1_fits
    compared = 0
    for i in range(0, 100, 5):
        law = lambda c, A, B, C, r=r0[i]: sigmoid_law(c, A, B, C, r)  # noqa: E731
        p0 = [min(y[i].max() + 0.02, 0.99), 1.5, float(np.median(x[i]))]
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                (A, B, C), _ = curve_fit(law, x[i], y[i], p0=p0, maxfev=5000)
        except RuntimeError:
            continue  # scipy did not converge: nothing to agree with
        if not (np.isfinite([A, B, C]).all() and A <= 1 and B > 0 and C > 0):
            continue
        compared += 1
        assert abs(out["A"][i] - A) < 2e-3 and abs(out["B"][i] - B) < 0.03, (i, out["A"][i], A)
        assert abs(out["C_mid"][i] / C - 1) < 0.01
        rmse_scipy = np.sqrt(np.mean((law(x[i], A, B, C) - y[i]) ** 2))
        assert out["rmse"][i] <= rmse_scipy * (1 + 1e-3) + 1e-6
    assert compared >= 15


def test_reaches_scipy_optimum_on_the_lower_part_of_curves(batch):
    # Only compute <= 1.5 x C_mid (an early run, or the first half in an extrapolation check): a
    # flat valley where plain Adam stops short. SciPy starts from the truth to find the optimum.
    x, y, r0, truth = batch
    w = np.zeros_like(x)
    w[:N_TABLE] = x[:N_TABLE] <= 1.5 * truth["C_mid"][:, None]
    out = fit_sigmoid_batch(x, y, w, R0=r0)
    compared = 0
    for i in range(0, N_TABLE, 4):
        on = w[i] > 0
        law = lambda c, A, B, C, r=r0[i]: sigmoid_law(c, A, B, C, r)  # noqa: E731
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                p, _ = curve_fit(
                    law,
                    x[i, on],
                    y[i, on],
                    maxfev=5000,
                    p0=[truth[k][i] for k in ("A", "B", "C_mid")],
                    bounds=([-np.inf, 1e-6, 1e-9], [1.0, np.inf, np.inf]),
                )
        except RuntimeError:
            continue
        compared += 1
        rmse_scipy = np.sqrt(np.mean((law(x[i, on], *p) - y[i, on]) ** 2))
        if out["reasons"][i] is None:  # a flagged fit says so; an unflagged one must be optimal
            assert out["rmse"][i] <= rmse_scipy * (1 + 1e-3) + 1e-6, (i, out["A"][i], p)
    assert compared >= 20 and sum(r is None for r in out["reasons"][:N_TABLE]) >= 90


def _curve(
    name, A=0.61, B=1.92, C_mid=2542.0, R0=0.3, noise=0.005, n=100, cmax=16000.0, seed=0, x0=True
):
    rng = np.random.default_rng(seed)
    x = cmax * np.arange(0 if x0 else 1, n + 1) / n
    y = np.where(x > 0, sigmoid_law(np.maximum(x, 1e-9), A, B, C_mid, R0), R0)
    return Curve(name, x, y + noise * rng.standard_normal(len(x)))


@pytest.mark.parametrize(
    "case, make, words",
    [
        ("flat", lambda: _curve("flat", A=0.3005), "flat"),
        (
            "decreasing",
            lambda: Curve("dec", np.linspace(100, 16000, 60), 0.6 - 0.2 * np.linspace(0, 1, 60)),
            "decreasing",
        ),
        ("too few", lambda: _curve("few", n=3), "too few points"),
        (
            "no saturation",
            lambda: Curve("lin", np.linspace(100, 16000, 100), np.linspace(0.3, 0.6, 100)),
            "not identified",
        ),
    ],
)
def test_degenerate_inputs_give_reasons_not_numbers(case, make, words):
    result = fit_curve(make())
    assert not result.ok and words in result.reason, (case, result)
    assert not hasattr(result, "A")


@pytest.mark.fast
def test_fit_window_and_measured_r0():
    curve = _curve("c")
    fit = fit_curve(curve, FitSpec(fit_start=1500))
    assert fit.ok and fit.x_range[0] > 1500 and fit.R0 == pytest.approx(curve.y[0])
    assert abs(fit.A - 0.61) < 0.01 and fit.n_points == int((curve.x > 1500).sum())
    assert not fit_curve(curve, FitSpec(fit_start=15000)).ok  # 6 flat-topped points left


@pytest.mark.fast
def test_paper_grid_procedure():
    fit = fit_curve(_curve("c", seed=3), FitSpec(procedure="grid"))
    assert fit.ok and fit.procedure == "grid"
    assert abs(fit.A - 0.61) <= 0.01 and abs(fit.B - 1.92) < 0.2
    assert round(fit.A / 0.005) * 0.005 == pytest.approx(fit.A, abs=1e-6)  # on the A grid
    beyond = fit_curve(_curve("high", A=0.9), FitSpec(procedure="grid"))
    assert not beyond.ok and "edge of the A grid" in beyond.reason


def test_comparison_rule():
    base = _curve("base", A=0.610, B=1.6, seed=4)
    steeper = _curve("steeper", A=0.620, B=2.4, seed=5)
    higher = _curve("higher", A=0.660, B=1.6, seed=6)
    c = compare_fits(base, steeper)
    assert c.rule == "B" and c.winner == "steeper" and c.B_refit[1] > c.B_refit[0]
    assert c.A_shared == pytest.approx(0.5 * sum(c.A))
    c = compare_fits(base, higher)
    assert c.rule == "A" and c.winner == "higher" and c.B_refit is None
    failed = compare_fits(base, _curve("flat", A=0.3005))
    assert not failed.ok and "flat" in failed.reason


def test_bootstrap_intervals_cover_truth():
    covered = 0
    for seed in range(8):
        curve = _curve("c", seed=10 + seed)
        fit = fit_curve(curve)
        boot = bootstrap_fit(curve, FitSpec(), fit, n_boot=100, seed=seed)
        lo, hi = boot.intervals["A"]
        assert lo <= fit.A <= hi and boot.n_ok == 100
        assert np.all(boot.band_lo <= boot.band_hi)
        covered += lo <= 0.61 <= hi
    assert covered >= 6  # nominal 95%; 8 curves


def test_pooled_seeds_stratified_resampling_and_per_seed_fits():
    parts = [_curve(f"s{i}", n=40, seed=20 + i) for i in range(3)]
    pooled = Curve(
        "pooled",
        np.concatenate([p.x for p in parts]),
        np.concatenate([p.y for p in parts]),
        np.repeat([0, 1, 2], len(parts[0].x)),
    )
    assert pooled.initial_value()[1] == pytest.approx(np.mean([p.y[0] for p in parts]))
    mask = pooled.x > 0
    w = resample_weights(mask, pooled.seed, 50, 4, np.random.default_rng(0))
    for s in range(3):
        on = pooled.seed == s
        assert np.all(w[:, on].sum(1) == (mask & on).sum())  # each seed keeps its size
    assert np.all(w[:, ~mask] == 0)
    per_seed = fit_seeds(pooled, FitSpec())
    assert sorted(per_seed) == [0, 1, 2] and all(f.ok for f in per_seed.values())
    assert max(abs(f.A - 0.61) for f in per_seed.values()) < 0.02
    assert fit_curve(pooled).n_points == int(mask.sum())


def test_extrapolation_from_half_the_compute():
    curve = _curve("c", n=100, seed=7)
    e = extrapolate(curve, fraction=0.5, n_boot=100)
    assert e.split == pytest.approx(8000) and e.n_heldout == 50
    assert e.rmse < 0.015 and abs(e.final_err) < 0.02 and e.coverage >= 0.7
    too_early = extrapolate(curve, FitSpec(fit_start=9000), fraction=0.5)
    assert not too_early.ok and "fit_start" in too_early.reason


@pytest.mark.fast
def test_power_law_and_log_linear_alternatives():
    x = np.linspace(500, 50000, 100)
    rng = np.random.default_rng(8)
    power = Curve("p", x, 0.7 - np.exp(2.0 - 0.5 * np.log(x)) + 0.002 * rng.standard_normal(100))
    pl = fit_power_law(power)
    assert pl.ok and abs(pl.A - 0.7) < 0.02 and abs(pl.B - 0.5) < 0.1 and not pl.note
    # The paper's warning: on a sigmoid that is still bending, the power law overshoots A.
    sig = _curve("s", A=0.645, B=1.70, C_mid=10909, cmax=50000, n=100, seed=9)
    spec = FitSpec(fit_start=1500)
    assert fit_power_law(sig, spec).A > fit_curve(sig, spec).A + 0.02
    k, E = 0.2, 0.5
    tan = Curve("t", x, 1 - np.exp(E - k * np.log(x)))
    ll = fit_log_linear(tan)
    assert ll.k == pytest.approx(k, rel=1e-6) and ll.E == pytest.approx(E, rel=1e-6)


def test_record_breaking_filter():
    x = np.array([1.0, 2, 3, 4, 5, 6])
    y = np.array([0.2, 0.3, 0.25, 0.3, 0.35, 0.34])
    assert record_breaking(x, y).tolist() == [True, True, False, False, True, False]
    assert record_breaking(x[::-1], y[::-1]).tolist() == [False, True, False, False, True, True]
    curve = _curve("c", noise=0.01, seed=11)
    fit = fit_curve(curve, FitSpec(record_breaking=True))
    assert fit.ok and fit.n_points < int((curve.x > 0).sum())


def test_a_fit_stopped_while_improving_says_where_it_was():
    """A testbed run's 8 evaluations at a quarter of its compute (bench/out/predictability,
    short-seed6), still rising with no bend: the default polish stops while A is still
    climbing, and the reason shows that A; with more polish A reaches its bound."""
    x = [0.0, 1.609e11, 2.945e11, 4.489e11, 6.104e11, 7.741e11, 9.486e11, 1.133e12]
    y = [0.2406, 0.2562, 0.2844, 0.3069, 0.3262, 0.3538, 0.3856, 0.4113]
    curve = Curve("seed6", np.array(x), np.array(y))
    stopped = fit_curve(curve)
    assert not stopped.ok and "still improving" in stopped.reason
    assert re.search(r"at A = 0\.\d{3}, C_mid = ", stopped.reason), stopped.reason
    polished = fit_curve(curve, FitSpec(polish_steps=200))
    assert not polished.ok and "A <= 1 bound" in polished.reason


def test_sigmoid_law_far_from_its_midpoint_is_exact_and_silent():
    """No overflow warning far below C_mid (1 / (1 + exp(z)) with z ~ 1e3), same values as the
    textbook form where that one is finite, numpy and jax alike."""
    import jax.numpy as jnp

    C = np.array([1e-300, 1e-3, 1.0, 40.0, 1e6, 1e300])
    A, B, C_mid, R0 = 0.74, 2.5, 40.0, 0.1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = sigmoid_law(C, A, B, C_mid, R0)
    assert got[0] == pytest.approx(R0) and got[-1] == pytest.approx(A)
    textbook = R0 + (A - R0) / (1.0 + np.exp(B * (np.log(C_mid) - np.log(C[1:-1]))))
    np.testing.assert_allclose(got[1:-1], textbook, rtol=1e-12)
    np.testing.assert_allclose(
        np.asarray(sigmoid_law(jnp.asarray(C[1:-1]), A, B, C_mid, R0)), textbook, rtol=1e-5
    )
