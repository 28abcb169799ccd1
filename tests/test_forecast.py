"""Online forecast: the fit fields on a known curve, the stability rule, a background refit that
never blocks the caller, and forecast events written by a real (tiny) training run."""

import time

import numpy as np
import pytest

from scalerl_jax.config import ConfigError, ForecastConfig
from scalerl_jax.metrics import read_metrics
from scalerl_jax.progress import Progress, forecast_text
from scalerl_jax.scaling import Curve, FitSpec, fit_curve, report, sigmoid_law
from scalerl_jax.scaling.forecast import (
    Forecaster,
    forecast,
    is_stable,
    projected_budget,
    required_compute,
)
from test_pipeline import tiny_config as pipeline_tiny_config

FIELDS = (
    "ok",
    "reason",
    "x_key",
    "n_points",
    "x_max",
    "interval",
    "A",
    "A_lo",
    "A_hi",
    "B",
    "B_lo",
    "B_hi",
    "C_mid",
    "C_mid_lo",
    "C_mid_hi",
    "R0",
    "budget",
    "budget_lo",
    "budget_hi",
    "budget_source",
    "at_budget",
    "at_budget_lo",
    "at_budget_hi",
    "at_budget_free_r0",
    "target",
    "compute_to_target",
    "compute_to_target_lo",
    "compute_to_target_hi",
    "stable",
    "superseded",
    "fit_s",
)


@pytest.mark.fast
def test_stable_once_A_settles_within_the_margin():
    assert not is_stable([])
    assert not is_stable([0.60, 0.61])  # fewer than three forecasts
    assert is_stable([0.60, 0.61, 0.615])
    assert not is_stable([0.60, 0.61, 0.621])  # moved 0.021 over the last three
    assert is_stable([0.40, 0.55, 0.60, 0.61, 0.615])  # only the last three count
    assert not is_stable([0.60, 0.61, 0.615, 0.64])
    assert not is_stable([0.60, None, 0.61, 0.605])  # a failed fit among the last three
    assert is_stable([0.60, None, 0.61, 0.605, 0.60])
    assert not is_stable([0.60, 0.60, float("nan")])


@pytest.mark.fast
def test_required_compute_inverts_the_law():
    A, B, C_mid, R0 = 0.6, 1.9, 800.0, 0.2
    c = required_compute(0.5, A, B, C_mid, R0)
    assert sigmoid_law(c, A, B, C_mid, R0) == pytest.approx(0.5, abs=1e-9)
    assert required_compute(0.4, A, B, C_mid, R0) == pytest.approx(C_mid)  # half the gain
    assert required_compute(0.1, A, B, C_mid, R0) == 0.0
    assert required_compute(0.6, A, B, C_mid, R0) is None


def test_projected_budget_follows_the_recent_compute_per_step():
    # Compute per step grows (completions lengthen): 1 per step for 30 steps, then 2.
    steps = np.arange(0, 61, 10)
    xs = np.where(steps <= 30, steps, 30 + 2 * (steps - 30)).astype(float)
    # At step 60 the last third (steps 40-60) ran at 2 per step: 90 + 2 x 60 left = 210. The
    # average since step 0 (1.5 per step) would say 180. The last half's rates (2, 2, 2) have
    # no trend, so the range is that one value.
    assert projected_budget(steps, xs, 120) == pytest.approx((210.0, 210.0, 210.0))
    assert projected_budget(steps[:4], xs[:4], 120)[0] == pytest.approx(120.0)  # constant rate
    # Only the evaluation before the last in the window: its rate; one point: the average.
    assert projected_budget([0, 30, 45], [0.0, 30.0, 60.0], 90)[0] == pytest.approx(150.0)
    assert projected_budget([20], [40.0], 100) == pytest.approx((200.0, 200.0, 200.0))
    assert projected_budget([0], [0.0], 100) is None  # before step 1
    assert projected_budget([0, 10], [0.0, 0.0], 100) is None  # no compute counted yet
    assert projected_budget([0, 10], [0.0, 5.0], 10) == pytest.approx((5.0, 5.0, 5.0))  # at the end


def test_projected_budget_range_reaches_a_growing_rate():
    """A compute per step that keeps growing linearly (x quadratic in steps): the range's high
    end, the rate's trend carried on, is the exact total; the low end, the recent rate held,
    falls short; the middle is their geometric mean. A falling rate adds nothing above."""
    steps = np.arange(0, 91, 9)
    x = lambda s: 5.0 * s + 0.05 * s**2  # noqa: E731 - rate 5 + 0.1 s
    lo, mid, hi = projected_budget(steps, x(steps.astype(float)), 360)
    assert hi == pytest.approx(x(360.0))
    assert lo < 0.8 * x(360.0)
    assert mid == pytest.approx((lo * hi) ** 0.5)
    falling = 50.0 * steps - 0.05 * steps**2.0
    lo, mid, hi = projected_budget(steps, falling, 360)
    assert lo == mid == hi


@pytest.fixture(scope="module")
def known_curve():
    rng = np.random.default_rng(0)
    x = np.concatenate([[0.0], np.linspace(200.0, 3000.0, 24)])
    y = sigmoid_law(np.maximum(x, 1e-9), 0.6, 1.9, 800.0, 0.2) + 0.004 * rng.standard_normal(25)
    y[0] = 0.2
    return x, y


def test_forecast_fields_on_a_known_curve(known_curve):
    x, y = known_curve
    f = forecast(x, y, budget=6000.0, target=0.55, n_boot=100)
    assert f["ok"] and f["reason"] is None and f["n_points"] == 24 and f["x_max"] == 3000.0
    for name in ("A", "B", "C_mid"):
        assert f[f"{name}_lo"] <= f[name] <= f[f"{name}_hi"]
    assert f["A_lo"] <= 0.6 <= f["A_hi"] and f["A_hi"] - f["A_lo"] < 0.05
    truth_at_budget = sigmoid_law(6000.0, 0.6, 1.9, 800.0, 0.2)
    assert f["at_budget_lo"] <= f["at_budget"] <= f["at_budget_hi"]
    assert abs(f["at_budget"] - truth_at_budget) < 0.02
    c = f["compute_to_target"]
    assert sigmoid_law(c, f["A"], f["B"], f["C_mid"], f["R0"]) == pytest.approx(0.55, abs=1e-6)
    assert f["compute_to_target_lo"] < c < f["compute_to_target_hi"]
    truth_c = required_compute(0.55, 0.6, 1.9, 800.0, 0.2)
    assert f["compute_to_target_lo"] < truth_c < f["compute_to_target_hi"]
    assert "AR(1)" in f["interval"]
    # A target above the whole interval of A: no compute reaches it.
    high = forecast(x, y, budget=None, target=min(f["A_hi"] + 0.02, 0.99), n_boot=100)
    assert high["compute_to_target"] is None and high["compute_to_target_lo"] is None
    assert high["compute_to_target_hi"] is None and high["at_budget"] is None
    # Too few points: every field is there, with the reason.
    few = forecast(x[:3], y[:3], budget=10.0, target=0.5, n_boot=100)
    assert not few["ok"] and "too few points" in few["reason"] and few["A"] is None
    assert set(few) == set(high)


def test_interval_at_the_budget_holds_the_free_r0_fits_too(known_curve):
    """The interval at the budget is the envelope of the measured-R0 and the free-R0 fits'
    prediction intervals; the point forecast stays the measured-R0 fit's."""
    x, y = known_curve
    x, y = x[:9], y.copy()[:9]
    y[0] -= 0.03  # a first evaluation below the curve the run then follows (a slow start)
    f = forecast(x, y, budget=6000.0, target=None, n_boot=100, seed=3)
    free = forecast(x, y, budget=6000.0, target=None, n_boot=100, seed=3, spec=FitSpec(r0="free"))
    assert f["ok"] and f["at_budget_free_r0"] == pytest.approx(free["at_budget"])
    assert f["at_budget_lo"] <= free["at_budget_lo"] < free["at_budget_hi"] <= f["at_budget_hi"]
    measured = fit_curve(Curve("c", x, y), FitSpec())
    assert f["at_budget"] == pytest.approx(float(measured.predict(6000.0)))
    assert f["at_budget"] != pytest.approx(free["at_budget"], abs=1e-3)  # two different fits
    assert f["at_budget_lo"] <= f["at_budget"] <= f["at_budget_hi"]


def test_interval_at_a_projected_budget_holds_both_ends_of_its_range(known_curve):
    """A projected budget is a range: the interval holds an evaluation at either end (for this
    increasing curve: from the low end's lower edge to the high end's upper edge); the point
    forecast stays at the budget."""
    x, y = known_curve
    common = dict(target=None, n_boot=100, seed=3)
    ranged = forecast(x, y, budget=6000.0, budget_range=(4000.0, 9000.0), **common)
    at_lo = forecast(x, y, budget=4000.0, **common)
    at_hi = forecast(x, y, budget=9000.0, **common)
    at_mid = forecast(x, y, budget=6000.0, **common)
    assert ranged["at_budget"] == pytest.approx(at_mid["at_budget"])
    assert ranged["at_budget_lo"] == pytest.approx(at_lo["at_budget_lo"])
    assert ranged["at_budget_hi"] == pytest.approx(at_hi["at_budget_hi"])
    assert ranged["at_budget_lo"] < at_mid["at_budget_lo"] < at_mid["at_budget_hi"]
    assert at_mid["at_budget_hi"] < ranged["at_budget_hi"]
    assert (ranged["budget_lo"], ranged["budget_hi"]) == (4000.0, 9000.0)
    assert (at_mid["budget_lo"], at_mid["budget_hi"]) == (6000.0, 6000.0)
    with pytest.raises(ValueError, match="budget_range=.*must hold budget=6000"):
        forecast(x, y, budget=6000.0, budget_range=(7000.0, 9000.0), **common)


def sleepy(seconds, calls):
    def run(x, y, **kwargs):
        calls.append((len(x), kwargs["budget"], kwargs["budget_range"]))
        time.sleep(seconds)
        return {"ok": True, "A": 0.5 + 0.001 * len(x), "A_lo": 0.49, "A_hi": 0.52}

    return run


def eval_record(step, x, y=0.3):
    return {"event": "eval", "step": step, "pass_rate": y, "compute": {"device_hours": x}}


def test_forecaster_never_blocks_and_counts_superseded_jobs():
    calls = []
    f = Forecaster(run=sleepy(0.4, calls), total_steps=100)
    waits = []
    for step in (0, 10, 20):  # the 2nd waits while the 1st runs; the 3rd supersedes it
        t0 = time.monotonic()
        f.submit(eval_record(step, step * 0.5))
        waits.append(time.monotonic() - t0)
        while not calls:  # let the worker thread start the first fit
            time.sleep(0.005)
    assert max(waits) < 0.05, waits
    assert f.poll() == []  # nothing finished yet, and poll does not wait either
    done = f.finish(timeout=10)
    assert [d["step"] for d in done] == [0, 20] and f.superseded == 1
    assert all(d["superseded"] == 1 for d in done)
    # The third job saw all three points; its budget is projected from compute per step.
    # (A constant rate: the projection's range is that one value.)
    total = pytest.approx(20 * 0.5 * 100 / 20)
    assert calls == [(1, None, None), (3, total, (total, total))]
    assert done[1]["budget_source"] == "projected" and done[1]["fit_s"] >= 0.4
    f._thread.join(2)
    assert not f._thread.is_alive()  # finish() stopped the worker


def test_forecaster_stability_failures_and_disabled():
    f = Forecaster(
        run=lambda x, y, **kw: {"ok": True, "A": 0.61}, budget=5.0, history=[0.60, 0.605]
    )  # a resumed run's earlier forecasts
    f.submit(eval_record(30, 3.0))
    (done,) = f.finish(timeout=10)
    assert done["stable"] and done["budget_source"] == "config" and f.history[-1] == 0.61

    def broken(x, y, **kwargs):
        raise FloatingPointError("nan in the fit")

    f = Forecaster(run=broken, history=[0.6, 0.6])
    f.submit(eval_record(5, 1.0))
    (done,) = f.finish(timeout=10)
    assert not done["ok"] and "nan in the fit" in done["reason"] and not done["stable"]

    off = Forecaster(run=broken, enabled=False)
    off.submit(eval_record(5, 1.0))
    assert off.poll() == [] and off.finish() == [] and off._thread is None
    with pytest.raises(ConfigError, match="ForecastConfig.target=1.5"):
        ForecastConfig(target=1.5)


def test_progress_shows_the_forecast():
    assert (
        forecast_text({"ok": True, "A": 0.7412, "A_lo": 0.72, "A_hi": 0.76, "stable": True})
        == "A≈0.74±0.02 stable"
    )
    assert forecast_text({"ok": False, "A": None}) == "A≈ n/a"
    bar = Progress("rl", 10, enabled=False)
    bar.set_eval(4, 0.52)
    bar.set_forecast({"ok": True, "A": 0.6, "A_lo": 0.58, "A_hi": 0.62, "stable": False})
    assert bar.postfix().endswith("val 0.520@4 | A≈0.60±0.02")


def tiny_config(workdir, *overrides, steps):
    # test_pipeline's tiny testbed run, evaluating every 2 steps (a forecast needs 5 points).
    return pipeline_tiny_config(
        workdir, "eval.every_steps=2", "checkpoint_every=10", *overrides, steps=steps
    )


def test_training_run_writes_forecast_events(tmp_path):
    from test_tracking import read_scalars
    from scalerl_jax.train import trainer

    # x = step: the tiny model's pass rate is noise around 0.5, but the forecast is still
    # written at every evaluation, with a reason when the points support no fit.
    cfg = tiny_config(
        tmp_path / "run",
        "forecast.x_key=step",
        "forecast.target=0.9",
        "forecast.n_boot=20",
        steps=8,
    )
    result = trainer.run(cfg, fit=False)
    log = read_metrics(result.workdir)
    eval_steps = [e["step"] for e in log.of("eval")]
    assert eval_steps == [0, 2, 4, 6, 8]
    forecasts = log.of("forecast")
    assert forecasts, "no forecast event"
    assert {f["step"] for f in forecasts} <= set(eval_steps)
    assert forecasts[-1]["step"] == 8  # the end of the run waits for the last refit
    assert len(forecasts) + forecasts[-1]["superseded"] == len(eval_steps)
    for f in forecasts:
        assert set(FIELDS) <= set(f), set(FIELDS) - set(f)
        assert f["x_key"] == "step" and f["target"] == 0.9
        assert f["budget_source"] == "projected"
        assert f["ok"] or f["reason"]
    assert forecasts[0]["step"] == 0 and "too few points" in forecasts[0]["reason"]
    assert forecasts[-1]["budget"] == pytest.approx(8.0)  # x = step: the last step
    # Forecast events change nothing for readers of the validation curve.
    curve, _ = report.load_curve([result.workdir], x_key="step")
    assert list(curve.x) == eval_steps
    tags = read_scalars(str(tmp_path / "run" / "tensorboard" / "rl"))
    assert "forecast/n_points" in tags and "forecast/stable" in tags
