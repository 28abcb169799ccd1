"""Smoke test of the real entry point: experiments/run.py on the embedded testbed, then resume."""
import importlib.util
import json
import os

import pytest

from scalerl_jax.config import DataConfig
from scalerl_jax.data.prompts import PromptSource
from scalerl_jax.data.synthetic import CharTokenizer
from scalerl_jax.metrics import read_metrics
from scalerl_jax.train.feed import PromptFeed

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run_main():
    spec = importlib.util.spec_from_file_location("run_main", os.path.join(ROOT, "experiments",
                                                                           "run.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


def test_run_entry_point_trains_evaluates_checkpoints_and_resumes(tmp_path, capsys):
    main = _run_main()
    workdir = str(tmp_path / "run")
    assert main(["--steps", "2", "--workdir", workdir]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["step"] == 2
    assert os.path.exists(os.path.join(workdir, "config.json"))
    assert os.path.isdir(os.path.join(workdir, "checkpoints", "2"))
    log = read_metrics(workdir)
    assert [r["step"] for r in log.of("train")] == [1, 2]
    evals = log.of("eval")
    assert [r["step"] for r in evals] == [0, 2]
    assert 0.0 <= evals[-1]["pass_rate"] <= 1.0
    assert evals[-1]["compute"]["device_hours"] > 0
    assert evals[-1]["compute"]["tokens"] > 0

    # Same command, more steps: resumes at step 2 (no step 1-2 again), compute keeps growing.
    assert main(["--steps", "3", "--workdir", workdir]) == 0
    log = read_metrics(workdir)
    assert [r["step"] for r in log.of("train")] == [1, 2, 3]
    runs = log.of("run")
    assert [r["resumed"] for r in runs] == [False, True]
    evals = log.of("eval")
    assert evals[-1]["step"] == 3
    assert evals[-1]["compute"]["device_hours"] > evals[-2]["compute"]["device_hours"]


def test_prompt_feed_replays_inflight_prompts_after_resume():
    tok = CharTokenizer()
    cfg = DataConfig(source="synthetic:addition?num=50", num_validation=5)
    feed = PromptFeed(PromptSource(cfg, tok), tok)
    issued = [next(feed) for _ in range(6)]
    for p in issued[:2]:
        feed.consumed(p.metadata["seq"])
    state = json.loads(json.dumps(feed.state_dict()))  # must survive JSON (checkpoint meta)

    resumed = PromptFeed(PromptSource(cfg, tok), tok)
    resumed.load_state_dict(state)
    replay = [next(resumed) for _ in range(4)]
    assert [p.prompt_id for p in replay] == [p.prompt_id for p in issued[2:]]
    assert replay[0].tokens == issued[2].tokens
    # ... then the stream continues exactly where the original would have.
    assert next(resumed).prompt_id == next(feed).prompt_id


def test_run_rejects_unknown_recipe():
    with pytest.raises(SystemExit):
        _run_main()(["--recipe", "nope"])
