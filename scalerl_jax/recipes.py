"""Named recipes: plain functions returning a RunConfig.

`scalerl` is the paper's recipe (REFERENCE.md "Recipe facts"); `testbed` is the embedded CPU
default that `python experiments/run.py` runs: a tiny model on a synthetic task, with every
mechanism of the recipe on (CISPO, prompt aggregation, batch advantage norm, zero-variance
filtering, no-positive-resampling, interruptions, in-flight weight updates), at sizes a laptop
finishes in minutes.
"""
from __future__ import annotations

import dataclasses

from scalerl_jax.config import (DataConfig, EvalConfig, LossConfig, MeshConfig, ModelConfig,
                                OptimConfig, PipelineConfig, RunConfig, SamplerConfig, SFTConfig)
from scalerl_jax.models import presets


def scalerl(model: str = "llama-3.1-8b", **overrides) -> RunConfig:
    """ScaleRL as published: 48 prompts x 16 generations, 12,288 thinking + 2,048 answer tokens,
    interruptions in [10k, 12k], CISPO, PipelineRL-8, AdamW 5e-7 constant after 100 warm-up."""
    model_cfg = presets.get(model, param_dtype="float32", compute_dtype="bfloat16", fp32_head=True)
    cfg = RunConfig(
        model=model_cfg,
        mesh=MeshConfig(),
        sampler=SamplerConfig(max_concurrent_decodes=64, max_prefill_length=2048,
                              max_target_length=2048 + 12288 + 2048 + 64,
                              max_new_tokens=12288 + 2048, think_min=10000, think_max=12000,
                              answer_budget=2048),
        loss=LossConfig(),
        optim=OptimConfig(learning_rate=5e-7, warmup_steps=100, eps=1e-15, weight_decay=0.01),
        pipeline=PipelineConfig(mode="pipeline", max_lag=8, prompts_per_step=48,
                                generations_per_prompt=16),
        data=DataConfig(source="hf:POLARIS-Project/Polaris-Dataset-53K", template="chat",
                        num_validation=1000),
        eval=EvalConfig(every_steps=100, k=16, num_prompts=1000),
        workdir=f"runs/scalerl-{model}",
        steps=10000,
    )
    return dataclasses.replace(cfg, **overrides) if overrides else cfg


def testbed(**overrides) -> RunConfig:
    """The embedded CPU default: a supervised warm-up, then ScaleRL, then the scaling fit.

    Task `countup` (data/synthetic.py): "457+6=", 3-digit plus one digit. The warm-up's
    demonstrations either count on, "<think>458,459,460,461,462,463</think>463", or (60% of them)
    answer from memory, "<think></think>463". A 4-layer, 0.9M-parameter model with a character
    vocabulary (a digit is one token, so a slip is one wrong token; `</think>` is one token the
    sampler can force) copies both styles in 300 steps; counting on is right about 60% of the
    time and memory about 10%, so the base policy passes ~15%. RL then raises it to ~50% within
    a few minutes by learning to count on, and do it right, with every piece of the recipe on:
    CISPO, prompt aggregation, batch advantage normalisation, zero-variance filtering,
    no-positive-resampling, PipelineRL-8 with in-flight weight updates, and interruptions
    (a thinking budget of 40-44 tokens sits above the longest correct thought, 36, so only
    rambling samples are cut, as the paper's 10k-12k of 12k does).

    Learning rate: 5e-5 (Adam moves every weight by ~lr per step; at 1e-4 and above this small
    model's pass rate fell in sync and pipeline mode alike). Validation: 256 held-out prompts x 4
    samples every 20 steps (standard error ~0.02, reported as `pass_rate_se`).
    """
    from scalerl_jax.data.synthetic import CharTokenizer

    problems = "synthetic:countup?max_start=499&num=4000"
    model_cfg = ModelConfig(name="testbed", vocab_size=CharTokenizer().vocab_size,
                            hidden_size=128, intermediate_size=384, num_layers=4, num_heads=4,
                            num_kv_heads=4, max_position_embeddings=256, tie_embeddings=True)
    cfg = RunConfig(
        model=model_cfg,
        mesh=MeshConfig(colocate=True),
        sampler=SamplerConfig(max_concurrent_decodes=64, max_prefill_length=16,
                              max_target_length=96, max_new_tokens=80, think_min=56,
                              think_max=60, answer_budget=4,
                              interruption_phrase="time is up. </think>"),
        loss=LossConfig(),
        optim=OptimConfig(learning_rate=2e-5, warmup_steps=10, eps=1e-8, logprob_chunk=None),
        pipeline=PipelineConfig(mode="pipeline", max_lag=8, prompts_per_step=16,
                                generations_per_prompt=8, seq_bucket=16),
        data=DataConfig(source=problems, template="{prompt}", num_validation=400),
        eval=EvalConfig(every_steps=18, k=4, num_prompts=400),
        sft=SFTConfig(source=problems + "&direct=0.7", steps=300, batch_size=16, max_length=128,
                      optim=OptimConfig(learning_rate=3e-3, warmup_steps=20, eps=1e-8,
                                        weight_decay=0.0, schedule="cosine", total_steps=300,
                                        logprob_chunk=None)),
        workdir="runs/testbed",
        steps=180,
        checkpoint_every=45,
    )
    return dataclasses.replace(cfg, **overrides) if overrides else cfg


RECIPES = {"scalerl": scalerl, "testbed": testbed}


def get(name: str, **overrides) -> RunConfig:
    if name not in RECIPES:
        raise KeyError(f"unknown recipe {name!r}; known: {sorted(RECIPES)}")
    return RECIPES[name](**overrides)
