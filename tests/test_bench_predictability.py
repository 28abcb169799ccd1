"""bench/predictability.py's analysis on run logs written here: the half-compute fit recovers a
known sigmoid's end, the forecast check counts a run's intervals honestly (a miss, a pair with no
fit, `stable` while wrong), and a recipe's paper batch is scaled to the testbed's. No training:
the runs themselves are the benchmark."""

import argparse
import json
import os

import numpy as np
import pytest
from _scripts import load_script

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def bench():
    return load_script("bench/predictability.py", "predictability_bench")


def _write_run(workdir, evals, forecasts=()):
    os.makedirs(workdir, exist_ok=True)
    with open(os.path.join(workdir, "metrics.jsonl"), "w") as f:
        for step, flops, rate in evals:
            record = {"event": "eval", "step": step, "wall_s": float(step)}
            record.update(compute={"flops": flops}, pass_rate=rate)
            f.write(json.dumps(record) + "\n")
        for record in forecasts:
            f.write(json.dumps({"event": "forecast", **record}) + "\n")
    return str(workdir)


def _sigmoid(c, r0=0.25, a=0.75, c_mid=4e11, b=1.5):
    return r0 + (a - r0) / (1 + (c_mid / c) ** b)


def test_half_fit_predicts_a_sigmoids_end_from_its_first_half(bench, tmp_path):
    rng = np.random.default_rng(0)
    flops = np.arange(21) * 1e11
    rates = [0.25] + [_sigmoid(c) + rng.normal(0, 0.003) for c in flops[1:]]
    workdir = _write_run(
        tmp_path / "run", [(18 * i, x, y) for i, (x, y) in enumerate(zip(flops, rates))]
    )
    args = argparse.Namespace(x="compute.flops", fit_start=0.0)
    row = bench.half_fit(workdir, seed=0, args=args)
    assert row["fit_points"] == 10  # the 10 evaluations after R0 up to half the compute
    assert row["final"] == pytest.approx(rates[-1])
    assert abs(row["error"]) < 0.02, row
    assert row["rise"] > 0.02 and row["A"] == pytest.approx(0.75, abs=0.03)
    table = bench.half_fit_table([row])
    assert "within 0.02: 1/1" in table and f"{row['error']:+.3f}" in table
    png = bench.plot_half_fits([row], args, str(tmp_path / "halffit.png"))
    assert os.path.getsize(png) > 10_000


@pytest.mark.fast
def test_forecast_check_counts_misses_no_fit_and_wrong_stable(bench, tmp_path):
    forecasts = [  # x_max reaches 25%, 50%, 75% of the final compute (1e12) in turn
        {"step": 45, "x_max": 2.5e11, "ok": False, "reason": "too few points", "stable": False},
        {
            "step": 90,
            "x_max": 5e11,
            "at_budget": 0.70,
            "at_budget_lo": 0.66,
            "at_budget_hi": 0.74,
            "stable": False,
        },
        {
            "step": 99,
            "x_max": 5.5e11,
            "at_budget": 0.0,
            "at_budget_lo": 0.0,
            "at_budget_hi": 0.0,
            "stable": True,
        },  # later than the first to reach 50%: unused
        {
            "step": 135,
            "x_max": 7.6e11,
            "at_budget": 0.65,
            "at_budget_lo": 0.63,
            "at_budget_hi": 0.67,
            "stable": True,
        },
    ]
    workdir = _write_run(tmp_path / "run", [(0, 0.0, 0.25)], forecasts)
    checks = bench.forecast_checks(workdir, final_x=1e12, final_y=0.70)
    assert [c["share"] for c in checks] == [0.25, 0.5, 0.75]
    assert [c["step"] for c in checks] == [45, 90, 135]
    assert [c["covers"] for c in checks] == [None, True, False]
    assert checks[2]["miss"] == pytest.approx(0.03)
    table = bench.forecast_table([dict(seed=3, kind="short", final=0.70, **c) for c in checks])
    assert "1/3 (run, share) pairs (33%" in table and "1 with no fit yet" in table
    assert "'stable' while the interval missed by > 0.02: 1" in table
    assert "no fit: too few points" in table


def test_replay_makes_the_trainers_forecast_at_each_evaluation(bench, tmp_path):
    from scalerl_jax.scaling.forecast import forecast

    # Compute per step grows with the step, as completions lengthen.
    steps = np.arange(0, 100, 9)
    flops = 1e10 * steps * (1 + steps / 100)
    rates = [0.25] + [_sigmoid(c) for c in flops[1:]]
    workdir = _write_run(tmp_path / "run", list(zip(steps.tolist(), flops.tolist(), rates)))
    records = bench.replay_forecasts(workdir, 180, "compute.flops", n_boot=20)
    assert [r["step"] for r in records] == list(steps)
    assert not records[0]["ok"] and records[-1]["ok"]
    last = records[-1]
    # The budget projected as the trainer does: from the recent compute per step, beyond the
    # average's projection, up to the rate's trend (exact here: compute is quadratic in steps).
    assert last["budget_lo"] > flops[-1] * 180 / steps[-1]
    assert last["budget_hi"] == pytest.approx(1e10 * 180 * (1 + 180 / 100))
    again = forecast(
        flops,
        rates,
        budget=last["budget"],
        budget_range=(last["budget_lo"], last["budget_hi"]),
        target=None,
        n_boot=20,
        seed=99,
        x_key="compute.flops",
    )
    assert again["at_budget_lo"] == pytest.approx(last["at_budget_lo"])
    assert again["at_budget_hi"] == pytest.approx(last["at_budget_hi"])
    checks = bench.forecast_checks(workdir, 2.5 * flops[-1], 0.7, records)
    assert [c["share"] for c in checks] == [0.25]  # the data reach 25% of that compute only


def test_recipe_overrides_scale_the_papers_batch_to_the_testbed(bench):
    from scalerl_jax import recipes

    assert bench.recipe_overrides("scalerl") == []
    assert "pipeline.mode=ppo_off_policy" in bench.recipe_overrides("scalerl-loo:off-policy")
    dapo = bench.recipe_overrides("dapo")
    testbed, paper = recipes.get("testbed"), recipes.get("scalerl")
    want = round(
        testbed.pipeline.prompts_per_step
        * recipes.get("dapo").pipeline.prompts_per_step
        / paper.pipeline.prompts_per_step
    )
    assert f"pipeline.prompts_per_step={want}" in dapo and want != testbed.pipeline.prompts_per_step
    assert "model.fp32_head=false" in dapo  # booleans as JSON, which the override parser reads
