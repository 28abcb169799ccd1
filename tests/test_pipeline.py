"""PipelineRL-k / ppo_off_policy / sync: the admission rule, and the real loop on 8 fake devices
(4 trainer, 4 sampler) with a tiny random model and a verifier that gives any policy mixed
rewards, so every step has a real loss."""

import dataclasses

import numpy as np
import pytest

from scalerl_jax import recipes
from scalerl_jax.config import ConfigError, MeshConfig, ModelConfig, PipelineConfig, apply_overrides
from scalerl_jax.data.synthetic_tasks import CharTokenizer
from scalerl_jax.metrics import read_metrics
from scalerl_jax.train import trainer
from scalerl_jax.train.pipeline import Schedule

# Timing and throughput differ between runs; everything else must not (sync mode).
TIMING = (
    "wall_s",
    "wait_s",
    "train_s",
    "step_s",
    "samples_per_s",
    "trainer_wait_frac",
    "sampler_idle_frac",
    "queue_depth",
    "admitted_ahead",
    "eval_seconds",
    "_line",
    "compute",
)


def tiny_config(workdir, *overrides, steps=6):
    tiny = ModelConfig(
        name="tiny",
        vocab_size=CharTokenizer().vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_layers=1,
        num_heads=2,
        num_kv_heads=2,
        max_position_embeddings=64,
        tie_embeddings=True,
    )
    cfg = dataclasses.replace(
        recipes.testbed(),
        model=tiny,
        sft=None,
        workdir=str(workdir),
        steps=steps,
        mesh=MeshConfig(trainer_devices_per_host=4),
    )
    return apply_overrides(
        cfg,
        [
            "data.source=synthetic:countup?num=400",
            "data.num_validation=16",
            "reward.verifier=_verifiers:even_length",
            "reward.workers=2",
            "sampler.max_concurrent_decodes=16",
            "sampler.max_target_length=40",
            "sampler.max_new_tokens=20",
            "sampler.think_min=8",
            "sampler.think_max=12",
            "pipeline.prompts_per_step=4",
            "pipeline.generations_per_prompt=4",
            "pipeline.max_lag=2",
            "eval.every_steps=3",
            "eval.num_prompts=8",
            "eval.k=2",
            "checkpoint_every=3",
            "optim.learning_rate=1e-3",
            *overrides,
        ],
    )


def train_records(workdir):
    return read_metrics(workdir).of("train")


def test_schedule_admission_limits_and_pushes():
    pipe = Schedule.from_config(PipelineConfig(mode="pipeline", max_lag=8, prompts_per_step=48))
    assert pipe.limit(0) == 9 * 48 and pipe.limit(5) == 14 * 48 and pipe.max_staleness == 8
    assert all(pipe.pushes(v) for v in range(10))
    sync = Schedule.from_config(PipelineConfig(mode="sync", prompts_per_step=48))
    assert sync.limit(0) == 48 and sync.limit(3) == 4 * 48 and sync.max_staleness == 0
    ppo = Schedule.from_config(
        PipelineConfig(mode="ppo_off_policy", max_lag=4, prompts_per_step=10)
    )
    assert [ppo.limit(v) for v in (0, 3, 4, 7, 8)] == [40, 40, 80, 80, 120]
    assert [ppo.pushes(v) for v in range(1, 9)] == [False, False, False, True] * 2
    assert ppo.max_staleness == 3
    # Every ticket admitted at the sampler's version v is trained within max_staleness versions.
    for sched in (pipe, sync, ppo):
        for version in range(12):
            for ticket in range(sched.limit(version)):
                trained_at = ticket // sched.batch
                assert trained_at - version <= sched.max_staleness or trained_at < version
    # Uneven host shares add up to the batch; fewer prompts than hosts is refused.
    shares = [
        Schedule.from_config(PipelineConfig(prompts_per_step=6), 4, h).batch for h in range(4)
    ]
    assert shares == [2, 2, 1, 1]
    with pytest.raises(
        ConfigError,
        match=r"prompts_per_step=3 must be at least the number of "
        r"hosts \(4\)",
    ):
        Schedule.from_config(PipelineConfig(prompts_per_step=3), num_hosts=4)


def test_pipeline_mode_never_discards_and_bounds_staleness(tmp_path):
    result = trainer.run(tiny_config(tmp_path / "run", steps=8), fit=False)
    records = train_records(result.workdir)
    assert [r["step"] for r in records] == list(range(1, 9))
    assert sum(r["stale_groups"] for r in records) == 0
    assert max(r["staleness_max"] for r in records) <= 2  # k
    assert max(r["staleness_max"] for r in records) >= 1  # the sampler really ran ahead
    assert all(r["admitted_ahead"] <= 2 * 4 for r in records)  # k x B prompts beyond the step
    assert all(r["batch_groups"] == 4 for r in records)  # every step got its B groups
    assert any(r["batch_kept_groups"] > 0 and r["loss"] != 0 for r in records)
    from scalerl_jax.progress import RL_FIELDS

    assert all(f.key in records[-1] for f in RL_FIELDS)  # the progress bar shows real fields
    for key in ("queue_depth", "sampler_idle_frac", "trainer_wait_frac", "staleness_mean"):
        assert all(np.isfinite(r[key]) for r in records), key


def _comparable(records):
    return [{k: v for k, v in r.items() if k not in TIMING} for r in records]


def test_sync_is_reproducible_and_resume_matches_an_uninterrupted_run(tmp_path):
    whole = trainer.run(tiny_config(tmp_path / "whole", "pipeline.mode=sync"), fit=False)
    trainer.run(tiny_config(tmp_path / "cut", "pipeline.mode=sync", steps=3), fit=False)
    resumed = trainer.run(tiny_config(tmp_path / "cut", "pipeline.mode=sync"), fit=False)
    assert resumed.step == whole.step == 6
    a, b = train_records(whole.workdir), train_records(resumed.workdir)
    assert [r["step"] for r in b] == list(range(1, 7))
    assert all(r["staleness_max"] == 0 and r["data_versions"] == 1 for r in a)
    assert any(r["loss"] != 0 for r in a)
    assert _comparable(a) == _comparable(b)
    evals_a = [(e["step"], e["pass_rate"]) for e in read_metrics(whole.workdir).of("eval")]
    evals_b = [(e["step"], e["pass_rate"]) for e in read_metrics(resumed.workdir).of("eval")]
    assert evals_a == evals_b and [s for s, _ in evals_a] == [0, 3, 6]


@pytest.mark.fast
def test_trainer_scores_tokens_at_the_samplers_temperature(tmp_path):
    """In sync mode every batch is sampled by the parameters that train on it, so the trainer's
    log-prob of each token must equal the sampler's: at temperature 0.5 too (the trainer divides
    its logits by the sampler's temperature; scoring at 1 gave a KL of ~0.009 here)."""
    cfg = tiny_config(tmp_path / "t", "pipeline.mode=sync", "sampler.temperature=0.5")
    records = train_records(trainer.run(dataclasses.replace(cfg, steps=2), fit=False).workdir)
    assert [r["step"] for r in records] == [1, 2] and records[0]["tokens"] > 0
    for r in records:
        assert abs(r["kl_sampler_k1"]) < 1e-4 and r["kl_sampler_k3"] < 1e-5, r
        assert abs(r["ratio_max"] - 1) < 1e-2, r


def test_ppo_off_policy_takes_k_steps_per_round_with_frozen_weights(tmp_path):
    result = trainer.run(tiny_config(tmp_path / "ppo", "pipeline.mode=ppo_off_policy"), fit=False)
    records = train_records(result.workdir)
    # Rounds of k=2 steps: data generated by version 0 is used at versions 0 and 1, data of
    # version 2 at versions 2 and 3, ...: staleness 0, 1, 0, 1, ... and one version per batch.
    assert [r["staleness_min"] for r in records] == [0, 1, 0, 1, 0, 1]
    assert [r["staleness_max"] for r in records] == [0, 1, 0, 1, 0, 1]
    assert all(r["data_versions"] == 1 for r in records)
    assert sum(r["stale_groups"] for r in records) == 0


def test_a_verifier_that_raises_or_hangs_is_counted_and_the_run_goes_on(tmp_path):
    cfg = tiny_config(
        tmp_path / "flaky", "reward.verifier=_verifiers:flaky", "reward.timeout_s=0.5", steps=3
    )
    result = trainer.run(cfg, fit=False)
    records = train_records(result.workdir)
    assert result.step == 3 and len(records) == 3
    assert sum(r["reward_errors"] for r in records) > 0
    assert sum(r["reward_timeouts"] for r in records) > 0
    assert all(np.isfinite(r["loss"]) for r in records)


def test_a_run_that_keeps_producing_non_finite_steps_stops_with_an_error(tmp_path):
    # A learning rate of 1e30 makes the first update blow the weights up; every later loss is
    # non-finite and skipped, and after max_skipped_steps of them the run stops.
    cfg = tiny_config(
        tmp_path / "nan",
        "optim.learning_rate=1e30",
        "optim.warmup_steps=0",
        "max_skipped_steps=3",
        steps=12,
    )
    with pytest.raises(FloatingPointError, match=r"3 consecutive steps .* non-finite"):
        trainer.run(cfg, fit=False)
    records = train_records(str(tmp_path / "nan"))
    assert [r["skipped"] for r in records][-3:] == [1.0, 1.0, 1.0]
    assert len(records) < 12
