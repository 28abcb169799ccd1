"""The real entry point, experiments/run.py, in subprocesses with one CPU device: SFT warm-up,
RL, evaluation, checkpoints, TensorBoard, the end-of-run fit; resume; bad input refused."""

import json
import os
import subprocess
import sys

import pytest

from scalerl_jax.config import DataConfig
from scalerl_jax.data.prompts import PromptSource
from scalerl_jax.data.synthetic_tasks import CharTokenizer
from scalerl_jax.metrics import read_metrics
from scalerl_jax.train.feed import PromptFeed

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = [
    "model.hidden_size=32",
    "model.intermediate_size=64",
    "model.num_layers=1",
    "model.num_heads=2",
    "model.num_kv_heads=2",
    "sft.steps=20",
    "sft.batch_size=16",
    "data.num_validation=32",
    "eval.num_prompts=32",
    "eval.k=2",
    "eval.every_steps=3",
    "pipeline.prompts_per_step=4",
    "pipeline.generations_per_prompt=4",
    "checkpoint_every=3",
]


def run_cli(*args, timeout=600, env=None):
    """experiments/run.py in a fresh process on one CPU device (no fake devices)."""
    full_env = {
        **os.environ,
        "JAX_PLATFORMS": "cpu",
        "XLA_FLAGS": "",
        "PYTHONPATH": os.pathsep.join([ROOT, os.path.join(ROOT, "tests")]),  # this checkout first
        **(env or {}),
    }
    return subprocess.run(
        [sys.executable, os.path.join(ROOT, "experiments", "run.py"), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
        cwd=ROOT,
    )


def test_main_job_warms_up_trains_fits_and_resumes(tmp_path):
    workdir = str(tmp_path / "run")
    done = run_cli("--workdir", workdir, "--steps", "3", *TINY)
    assert done.returncode == 0, done.stderr[-3000:]
    # SFT stage: an HF checkpoint plus its summary; the RL stage started from it.
    sft_summary = os.path.join(workdir, "sft", "summary.json")
    summary = json.load(open(sft_summary))
    assert summary["final_loss"] < summary["first_loss"] and summary["excluded"] == 32
    assert os.path.exists(os.path.join(workdir, "sft", "model", "model.safetensors"))
    log = read_metrics(workdir)
    assert [r["step"] for r in log.of("train")] == [1, 2, 3]
    evals = log.of("eval")
    assert [r["step"] for r in evals] == [0, 3]
    assert evals[-1]["compute"]["device_hours"] > 0 and evals[-1]["num_prompts"] == 32
    assert os.path.isdir(os.path.join(workdir, "checkpoints", "3"))
    assert os.listdir(os.path.join(workdir, "tensorboard", "rl"))
    fit = json.load(open(os.path.join(workdir, "fit", "fit.json")))  # 2 points: a reason
    assert fit["fit"]["ok"] is False and "too few points" in fit["fit"]["reason"]
    assert "validation pass rate" in done.stdout and "fit: none (too few points" in done.stdout
    # Not a terminal: no progress bar redraws, plain log lines only.
    assert "\r" not in done.stderr and "progress: rl" in done.stderr

    # The same command with more steps resumes: no step twice, the warm-up is reused.
    mtime = os.path.getmtime(sft_summary)
    done = run_cli("--workdir", workdir, "--steps", "5", *TINY)
    assert done.returncode == 0, done.stderr[-3000:]
    assert os.path.getmtime(sft_summary) == mtime
    log = read_metrics(workdir)
    assert [r["step"] for r in log.of("train")] == [1, 2, 3, 4, 5]
    assert [r["resumed"] for r in log.of("run")] == [False, True]
    evals = log.of("eval")
    assert [r["step"] for r in evals] == [0, 3, 5]
    assert evals[-1]["compute"]["device_hours"] > evals[-2]["compute"]["device_hours"]


def test_bad_input_is_refused_without_touching_the_workdir(tmp_path):
    workdir = tmp_path / "run"
    done = run_cli("--workdir", str(workdir), "pipeline.mode=bogus")
    assert done.returncode == 2 and "PipelineConfig.mode='bogus'" in done.stderr
    done = run_cli("--workdir", str(workdir), "optim.nope=1")
    assert done.returncode == 2 and "OptimConfig has no field 'nope'" in done.stderr
    done = run_cli("--workdir", str(workdir), "data.source=missing.jsonl")
    assert done.returncode == 2 and "missing.jsonl" in done.stderr
    assert not workdir.exists()  # nothing written by failing commands

    # A workdir started with another config is refused, and left as it was.
    from scalerl_jax import recipes
    from scalerl_jax.config import apply_overrides

    workdir.mkdir()
    old = apply_overrides(recipes.testbed(), TINY).to_dict()
    old["seed"] = 7
    (workdir / "config.json").write_text(json.dumps(old))
    done = run_cli("--workdir", str(workdir), *TINY)
    assert done.returncode == 2 and "config.json" in done.stderr and "seed: 7 -> 0" in done.stderr
    assert sorted(os.listdir(workdir)) == ["config.json"]


@pytest.mark.fast
def test_prompt_feed_replays_inflight_prompts_under_their_tickets():
    tok = CharTokenizer()
    cfg = DataConfig(source="synthetic:addition?num=50", num_validation=5)
    feed = PromptFeed(PromptSource(cfg, tok), tok)
    issued = [next(feed) for _ in range(6)]
    assert [p.ticket for p in issued] == list(range(6))
    for p in issued[:2]:
        feed.consumed(p.ticket)
    state = json.loads(json.dumps(feed.state_dict()))  # must survive JSON (checkpoint meta)

    resumed = PromptFeed(PromptSource(cfg, tok), tok)
    resumed.load_state_dict(state)
    replay = [next(resumed) for _ in range(4)]
    assert [p.prompt_id for p in replay] == [p.prompt_id for p in issued[2:]]
    assert [p.ticket for p in replay] == [2, 3, 4, 5]
    assert replay[0].tokens == issued[2].tokens
    # ... then the stream continues exactly where the original would have.
    nxt = next(resumed)
    assert (nxt.prompt_id, nxt.ticket) == (next(feed).prompt_id, 6)


@pytest.mark.fast
def test_run_rejects_unknown_recipe():
    done = run_cli("--recipe", "nope")
    assert done.returncode == 2 and "invalid choice" in done.stderr


@pytest.mark.parametrize("bad", ["pipeline=3", "nokey", "=3", "optim.b1=x"])
def test_override_syntax_errors(bad):
    from scalerl_jax import recipes
    from scalerl_jax.config import ConfigError, apply_overrides

    with pytest.raises(ConfigError):
        apply_overrides(recipes.testbed(), [bad])
