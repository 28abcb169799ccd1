"""The proof that the loop learns: a shortened testbed run (the real entry point: SFT warm-up,
then PipelineRL with every ScaleRL piece on) raises the held-out pass rate by a margin that
sampling noise cannot explain."""

import json
import math
import os

from scalerl_jax.metrics import read_metrics
from test_run import run_cli

# The testbed recipe with a shorter warm-up and RL, a larger RL step, two evaluations.
SHORT = [
    "--steps",
    "30",
    "sft.steps=220",
    "sft.optim.total_steps=220",
    "optim.learning_rate=5e-5",
    "eval.every_steps=30",
    "eval.num_prompts=200",
    "data.num_validation=200",
    "checkpoint_every=30",
]


def test_shortened_testbed_run_raises_the_validation_pass_rate(tmp_path):
    workdir = str(tmp_path / "testbed")
    done = run_cli("--workdir", workdir, *SHORT, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    evals = read_metrics(workdir).of("eval")
    assert [e["step"] for e in evals] == [0, 30]
    base, final = evals
    assert 0.05 <= base["pass_rate"] <= 0.4  # the warm-up leaves room to learn
    # Per-prompt standard errors; a rise of 6 of them has probability < 1e-8 under no change.
    z = (final["pass_rate"] - base["pass_rate"]) / math.hypot(
        base["pass_rate_se"], final["pass_rate_se"]
    )
    assert final["pass_rate"] - base["pass_rate"] >= 0.15 and z >= 6, (base, final, z)
    train = read_metrics(workdir).of("train")
    assert sum(r["stale_groups"] for r in train) == 0
    assert max(r["staleness_max"] for r in train) <= 8
    # Learning to count on shows as longer completions.
    assert train[-1]["mean_completion_len"] > train[0]["mean_completion_len"]
    fit = json.load(open(os.path.join(workdir, "fit", "fit.json")))  # 2 points: no fit, a reason
    assert fit["fit"]["ok"] is False and fit["fit"]["reason"]
