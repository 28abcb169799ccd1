"""The compute allocator (scaling/allocate.py, experiments/allocate.py) picks the known best
allocation at a budget from short runs whose curves cross."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from scalerl_jax.scaling import Curve, FitSpec, sigmoid_law
from scalerl_jax.scaling.allocate import Candidate, recommend, summary
from test_fit_cli import write_run

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Three batch sizes: the small one rises first and saturates lowest, the large one starts
# slowest and ends highest (the paper's batch-size result), so their curves cross.
TRUTH = {
    "small": dict(A=0.58, B=2.2, C_mid=1.0),
    "medium": dict(A=0.62, B=1.9, C_mid=2.0),
    "large": dict(A=0.66, B=1.7, C_mid=4.0),
}
R0 = 0.2


def short_run(name: str, reach: float, points: int = 30, noise: float = 0.004, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = np.concatenate([[0.0], np.linspace(reach / points, reach, points)])
    with np.errstate(divide="ignore"):
        y = sigmoid_law(x, R0=R0, **TRUTH[name])
    return Curve(name, x, y + noise * rng.standard_normal(len(x)))


def true_best(budget: float) -> str:
    return max(TRUTH, key=lambda n: sigmoid_law(budget, R0=R0, **TRUTH[n]))


@pytest.mark.parametrize("budget", [2.0, pytest.param(60.0, marks=pytest.mark.fast)])
def test_planner_picks_the_known_best_allocation(budget):
    # Short runs reach 6 compute units: enough to see each curve bend, far short of the end.
    candidates = [Candidate(n, short_run(n, 6.0, seed=i)) for i, n in enumerate(TRUTH)]
    seen_best = max(candidates, key=lambda c: c.curve.y[-1]).label
    rec = recommend(candidates, budget, FitSpec(), n_boot=100)
    assert rec.best.candidate.label == true_best(budget)
    for opt in rec.options:
        truth = sigmoid_law(budget, R0=R0, **TRUTH[opt.candidate.label])
        assert abs(opt.predicted - truth) < 0.02, (opt.candidate.label, opt.predicted, truth)
        assert opt.lo <= opt.predicted <= opt.hi
    if budget > 10:
        # The point of planning: the best of the short runs is not the best at the budget.
        assert seen_best != "large" and rec.best.candidate.label == "large"
        # 10x beyond the data the interval is wide: the summary must say when the gap is
        # within it (here it is: large 0.646 [0.596, 0.719] vs medium 0.620).
        text = summary(rec, "GPU-hours")
        assert rec.clear == (rec.best.lo > rec.runner_up.predicted)
        assert ("a clear choice" in text) == rec.clear
        assert ("within the uncertainty" in text) == (not rec.clear)
        assert rec.options[0].extrapolation == pytest.approx(budget / 6.0)


def test_planner_refuses_bad_input_and_reports_failed_fits():
    good = Candidate("a", short_run("small", 6.0))
    with pytest.raises(ValueError, match="budget=0"):
        recommend([good, Candidate("b", short_run("large", 6.0))], 0.0)
    with pytest.raises(ValueError, match="at least two"):
        recommend([good], 10.0)
    with pytest.raises(ValueError, match="labels must differ"):
        recommend([good, good], 10.0)
    flat = Curve("flat", np.arange(10.0), np.full(10, 0.2))
    rec = recommend([good, Candidate("flat", flat)], 10.0, n_boot=0)
    assert rec.best.candidate.label == "a" and rec.options[-1].predicted is None
    assert rec.options[-1].reason


def test_plan_cli_ranks_runs_and_writes_table_json_png(tmp_path):
    runs = []
    for i, (name, batch) in enumerate((("small", 16), ("large", 64))):
        d = tmp_path / f"batch{batch}"
        p = TRUTH[name]
        write_run(str(d), A=p["A"], B=p["B"], C_mid=p["C_mid"] / 2, R0=R0, steps=100, seed=i)
        with open(d / "config.json", "w") as f:
            json.dump(
                {
                    "pipeline": {"prompts_per_step": batch, "generations_per_prompt": 8},
                    "sampler": {"max_new_tokens": 80},
                },
                f,
            )
        runs.append(str(d))
    out = tmp_path / "allocation"
    done = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "experiments", "allocate.py"),
            "--budget",
            "30",
            "--bootstrap",
            "50",
            "--out",
            str(out),
            *runs,
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "batch64 (64x8, 80 tok) is predicted" in done.stdout
    plan = json.load(open(out / "allocation.json"))
    assert plan["best"].startswith("batch64") and plan["budget"] == 30.0
    assert [o["settings"]["prompts_per_step"] for o in plan["options"]] == [64, 16]
    assert open(out / "allocation.png", "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    bad = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "experiments", "allocate.py"),
            "--budget",
            "30",
            runs[0],
            str(tmp_path / "nope"),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert bad.returncode == 2 and "no metrics.jsonl in" in bad.stderr
