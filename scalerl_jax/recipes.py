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
                                OptimConfig, PipelineConfig, RunConfig, SamplerConfig)
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
    """The embedded CPU default: 2-layer model, 1-digit addition, char-level vocabulary."""
    from scalerl_jax.data.synthetic import CharTokenizer

    vocab = CharTokenizer().vocab_size
    model_cfg = ModelConfig(name="testbed", vocab_size=vocab, hidden_size=128,
                            intermediate_size=384, num_layers=2, num_heads=4, num_kv_heads=2,
                            max_position_embeddings=256, tie_embeddings=True)
    cfg = RunConfig(
        model=model_cfg,
        mesh=MeshConfig(colocate=True),
        sampler=SamplerConfig(max_concurrent_decodes=32, max_prefill_length=32,
                              max_target_length=96, max_new_tokens=48, think_min=16,
                              think_max=24, answer_budget=6,
                              interruption_phrase="time is up. </think>"),
        loss=LossConfig(),
        optim=OptimConfig(learning_rate=1e-3, warmup_steps=5, eps=1e-8),
        pipeline=PipelineConfig(mode="pipeline", max_lag=8, prompts_per_step=8,
                                generations_per_prompt=4),
        data=DataConfig(source="synthetic:addition?min_digits=1&max_digits=1&num=100",
                        template="{prompt}",
                        num_validation=20),
        eval=EvalConfig(every_steps=10, k=4, num_prompts=20),
        workdir="runs/testbed",
        steps=30,
        checkpoint_every=10,
    )
    return dataclasses.replace(cfg, **overrides) if overrides else cfg


RECIPES = {"scalerl": scalerl, "testbed": testbed}


def get(name: str, **overrides) -> RunConfig:
    if name not in RECIPES:
        raise KeyError(f"unknown recipe {name!r}; known: {sorted(RECIPES)}")
    return RECIPES[name](**overrides)
