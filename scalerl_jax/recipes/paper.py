"""The paper's recipes: `scalerl` as published and every recipe
built from it by changing a few fields: the comparison baselines (`grpo`, `dapo`, `magistral`,
`minimax`), the leave-one-out ablations (`loo_*`) and the scaling axes (batch size,
generations per prompt, 32k generation). Each derived recipe's docstring ends with its
"Differs from scalerl:" block (see registry.documented_diff)."""

from __future__ import annotations

import dataclasses
from typing import Callable

from scalerl_jax.config import (
    DataConfig,
    EvalConfig,
    LossConfig,
    MeshConfig,
    OptimConfig,
    PipelineConfig,
    RunConfig,
    SamplerConfig,
)
from scalerl_jax.models import presets

DEFAULT_MODEL = "llama-3.1-8b"
PROMPT_TOKENS = 2048
THINK_TOKENS = 12288
ANSWER_TOKENS = 2048
PHRASE_ROOM = 64  # KV-cache room for the forced interruption phrase


def scalerl(model: str = DEFAULT_MODEL, **overrides) -> RunConfig:
    """ScaleRL as published: 48 prompts x 16 generations = 768,
    prompts up to 2,048 tokens, 12,288 thinking + 2,048 answer tokens, interruption point drawn in
    [10k, 12k] thinking tokens, CISPO, prompt-average aggregation, batch-level advantage
    normalisation, zero-variance filtering, no-positive-resampling (retire at pass rate >= 0.9),
    PipelineRL-8, fp32 LM head, AdamW 5e-7 constant after 100 warm-up steps, eps 1e-15, weight
    decay 0.01, no KL, rewards +-1 (LossConfig's defaults carry the loss-side values)."""
    model_cfg = presets.get(model, param_dtype="float32", compute_dtype="bfloat16", fp32_head=True)
    cfg = RunConfig(
        model=model_cfg,
        mesh=MeshConfig(),
        sampler=SamplerConfig(
            max_concurrent_decodes=64,
            max_prefill_length=PROMPT_TOKENS,
            max_target_length=(PROMPT_TOKENS + THINK_TOKENS + ANSWER_TOKENS + PHRASE_ROOM),
            max_new_tokens=THINK_TOKENS + ANSWER_TOKENS,
            think_min=10000,
            think_max=12000,
            answer_budget=ANSWER_TOKENS,
        ),
        loss=LossConfig(),
        optim=OptimConfig(learning_rate=5e-7, warmup_steps=100, eps=1e-15, weight_decay=0.01),
        pipeline=PipelineConfig(
            mode="pipeline",
            max_lag=8,
            prompts_per_step=48,
            generations_per_prompt=16,
            no_positive_resampling=True,
            retire_pass_rate=0.9,
        ),
        data=DataConfig(
            source="hf:POLARIS-Project/Polaris-Dataset-53K", template="chat", num_validation=1000
        ),
        eval=EvalConfig(every_steps=100, k=16, num_prompts=1000),
        workdir=f"runs/scalerl-{model}",
        steps=10000,
    )
    return dataclasses.replace(cfg, **overrides) if overrides else cfg


def _variant(name: str, model: str, overrides: dict, /, **sections: dict) -> RunConfig:
    """`scalerl(model)` with fields of some sections replaced (`loss={"objective": "dapo"}`),
    its own workdir, then the caller's RunConfig-level overrides."""
    cfg = scalerl(model)
    changed = {
        sec: dataclasses.replace(getattr(cfg, sec), **fields) for sec, fields in sections.items()
    }
    cfg = dataclasses.replace(cfg, workdir=f"runs/{name.replace(':', '-')}-{model}", **changed)
    return dataclasses.replace(cfg, **overrides) if overrides else cfg


# ------------------------------------------------------------- the paper's comparison baselines
# The baselines as the paper ran them. All keep what the table does not change:
# Polaris data, AdamW 5e-7, no KL, +-1 rewards and the 12,288 + 2,048 budget enforced by
# interruptions (the paper's common set-up enforces the thinking budget that way for every run;
# the table lists no length penalty for any baseline). Pieces that are ScaleRL's own additions
# and that the table does not give a baseline (no-positive-resampling; the fp32 head except for
# MiniMax) are off. Where the table is silent on advantage normalisation, the baseline's own
# paper decides. The 1280 batches are 80 prompts x 16 generations: 16 is what every ScaleRL run
# uses, so group statistics stay comparable, and the paper found the total batch, not its split,
# to matter.
#
# DAPO's clip-higher is 0.26 here, not DAPO's own 0.28: the value of the paper's DAPO runs.


def grpo(model: str = DEFAULT_MODEL, **overrides) -> RunConfig:
    """DeepSeek (GRPO) baseline: symmetric PPO-clip eps 0.2, sample average (1/G sum 1/|y|),
    PPO-off-policy-8, batch 768 = 48 x 16, advantages normalised by each group's std, no
    zero-variance filtering (DeepSeek keeps such groups: their advantages are 0 but they count in
    the average), bf16 LM head, no no-positive-resampling, no KL (the paper ran all recipes
    without KL).

    Differs from scalerl:
        loss.objective = "grpo"  # clip_eps_low = clip_eps_high = 0.2 (LossConfig's default)
        loss.aggregation = "sequence"
        loss.advantage_norm = "group"
        loss.zero_variance_filter = False
        pipeline.mode = "ppo_off_policy"  # max_lag 8 = updates per generation round
        pipeline.no_positive_resampling = False
        model.fp32_head = False
    """
    return _variant(
        "grpo",
        model,
        overrides,
        loss=dict(
            objective="grpo",
            aggregation="sequence",
            advantage_norm="group",
            zero_variance_filter=False,
        ),
        pipeline=dict(mode="ppo_off_policy", no_positive_resampling=False),
        model=dict(fp32_head=False),
    )


def dapo(model: str = DEFAULT_MODEL, **overrides) -> RunConfig:
    """Qwen2.5 (DAPO) baseline: PPO-clip 0.2 / 0.26 (clip-higher), prompt average,
    PPO-off-policy-8, batch 1280 = 80 x 16, zero-variance groups dropped. Advantages: each
    group's std (DAPO's GRPO-style estimate). bf16 head, no no-positive-resampling.

    Differs from scalerl:
        loss.objective = "dapo"
        loss.clip_eps_high = 0.26
        loss.advantage_norm = "group"
        pipeline.mode = "ppo_off_policy"
        pipeline.prompts_per_step = 80
        pipeline.no_positive_resampling = False
        model.fp32_head = False
    """
    return _variant(
        "dapo",
        model,
        overrides,
        loss=dict(objective="dapo", clip_eps_high=0.26, advantage_norm="group"),
        pipeline=dict(mode="ppo_off_policy", prompts_per_step=80, no_positive_resampling=False),
        model=dict(fp32_head=False),
    )


def magistral(model: str = DEFAULT_MODEL, **overrides) -> RunConfig:
    """Magistral baseline: PPO-clip 0.2 / 0.26, prompt average, PipelineRL (k not given: 8, as
    ScaleRL), batch 1280 = 80 x 16, zero-variance groups dropped. Advantages stay batch-level:
    Magistral centres per group and then normalises over the (mini)batch, which is ScaleRL's
    choice. bf16 head, no no-positive-resampling.

    Differs from scalerl:
        loss.objective = "dapo"
        loss.clip_eps_high = 0.26
        pipeline.prompts_per_step = 80
        pipeline.no_positive_resampling = False
        model.fp32_head = False
    """
    return _variant(
        "magistral",
        model,
        overrides,
        loss=dict(objective="dapo", clip_eps_high=0.26),
        pipeline=dict(prompts_per_step=80, no_positive_resampling=False),
        model=dict(fp32_head=False),
    )


def minimax(model: str = DEFAULT_MODEL, **overrides) -> RunConfig:
    """MiniMax-M1 baseline: CISPO (ScaleRL's ratio cap), prompt average, PPO-off-policy (k not
    given: 8), batch 1280 = 80 x 16, fp32 LM head, zero-variance groups dropped. Advantages:
    each group's std (M1 uses GRPO's group-relative advantage). No no-positive-resampling.

    Differs from scalerl:
        loss.advantage_norm = "group"
        pipeline.mode = "ppo_off_policy"
        pipeline.prompts_per_step = 80
        pipeline.no_positive_resampling = False
    """
    return _variant(
        "minimax",
        model,
        overrides,
        loss=dict(advantage_norm="group"),
        pipeline=dict(mode="ppo_off_policy", prompts_per_step=80, no_positive_resampling=False),
    )


# ----------------------------------------------------------------- leave-one-out ablations (LOO)
# Each reverts exactly one ScaleRL piece, as the paper's leave-one-out list.


def loo_loss(model: str = DEFAULT_MODEL, **overrides) -> RunConfig:
    """ScaleRL with the DAPO loss instead of CISPO: PPO-clip 0.2 / 0.26 (the paper's DAPO
    clip-higher; its LOO value is not stated).

    Differs from scalerl:
        loss.objective = "dapo"
        loss.clip_eps_high = 0.26
    """
    return _variant(
        "scalerl-loo:loss", model, overrides, loss=dict(objective="dapo", clip_eps_high=0.26)
    )


def loo_fp32_head(model: str = DEFAULT_MODEL, **overrides) -> RunConfig:
    """ScaleRL with the LM head (and log-softmax) in the compute dtype, bf16, on sampler and
    trainer.

    Differs from scalerl:
        model.fp32_head = False
    """
    return _variant("scalerl-loo:fp32-head", model, overrides, model=dict(fp32_head=False))


def loo_aggregation(model: str = DEFAULT_MODEL, **overrides) -> RunConfig:
    """ScaleRL with the sample average (each sequence's token mean, then the mean over
    sequences) instead of the prompt average.

    Differs from scalerl:
        loss.aggregation = "sequence"
    """
    return _variant("scalerl-loo:aggregation", model, overrides, loss=dict(aggregation="sequence"))


def loo_advantage_norm(model: str = DEFAULT_MODEL, **overrides) -> RunConfig:
    """ScaleRL with advantages divided by each group's std instead of the batch's.

    Differs from scalerl:
        loss.advantage_norm = "group"
    """
    return _variant(
        "scalerl-loo:advantage-norm", model, overrides, loss=dict(advantage_norm="group")
    )


def loo_zero_variance(model: str = DEFAULT_MODEL, **overrides) -> RunConfig:
    """ScaleRL keeping all-pass / all-fail groups in the batch (zero advantage, but they count in
    the aggregation's denominators).

    Differs from scalerl:
        loss.zero_variance_filter = False
    """
    return _variant(
        "scalerl-loo:zero-variance", model, overrides, loss=dict(zero_variance_filter=False)
    )


def loo_no_positive_resampling(model: str = DEFAULT_MODEL, **overrides) -> RunConfig:
    """ScaleRL that keeps sampling prompts whose pass rate reached 0.9 in later epochs.

    Differs from scalerl:
        pipeline.no_positive_resampling = False
    """
    return _variant(
        "scalerl-loo:no-positive-resampling",
        model,
        overrides,
        pipeline=dict(no_positive_resampling=False),
    )


def loo_off_policy(model: str = DEFAULT_MODEL, **overrides) -> RunConfig:
    """ScaleRL with PPO-off-policy-8 (a round of 8 batches generated with frozen weights, then 8
    updates) instead of PipelineRL-8.

    Differs from scalerl:
        pipeline.mode = "ppo_off_policy"
    """
    return _variant(
        "scalerl-loo:off-policy", model, overrides, pipeline=dict(mode="ppo_off_policy")
    )


def loo_interruptions(model: str = DEFAULT_MODEL, **overrides) -> RunConfig:
    """ScaleRL with the length penalty instead of interruptions: no forced phrase, generation
    truncated at 14,336 tokens, and correct traces get clip((L_max - |y|) / L_cache - 1, -1, 0)
    with L_max 14,336 and L_cache 2,048 (LossConfig's defaults, so not listed): free up to
    12,288 tokens, -1 at the truncation point.

    Differs from scalerl:
        sampler.interruptions = False
        loss.length_penalty = True
    """
    return _variant(
        "scalerl-loo:interruptions",
        model,
        overrides,
        sampler=dict(interruptions=False),
        loss=dict(length_penalty=True),
    )


# --------------------------------------------------------------------------------- scaling axes
# Batch size: the paper varies the number of prompts and keeps 16 generations per prompt (the
# 768 recipe is 48 x 16; the 2048 run is 128 x 16). Generations per prompt: the batch stays 768,
# so prompts = 768 / G.


def scalerl_batch512(model: str = DEFAULT_MODEL, **overrides) -> RunConfig:
    """ScaleRL at batch 512 = 32 prompts x 16 generations.

    Differs from scalerl:
        pipeline.prompts_per_step = 32
    """
    return _variant("scalerl-batch512", model, overrides, pipeline=dict(prompts_per_step=32))


def scalerl_batch2048(model: str = DEFAULT_MODEL, **overrides) -> RunConfig:
    """ScaleRL at batch 2048 = 128 prompts x 16 generations (the paper's 100k GPU-hour run).

    Differs from scalerl:
        pipeline.prompts_per_step = 128
    """
    return _variant("scalerl-batch2048", model, overrides, pipeline=dict(prompts_per_step=128))


def _generations(g: int) -> Callable[..., RunConfig]:
    def recipe(model: str = DEFAULT_MODEL, **overrides) -> RunConfig:
        return _variant(
            f"scalerl-gen{g}",
            model,
            overrides,
            pipeline=dict(prompts_per_step=768 // g, generations_per_prompt=g),
        )

    recipe.__name__ = recipe.__qualname__ = f"scalerl_gen{g}"
    recipe.__doc__ = f"""ScaleRL with {g} generations per prompt at batch 768 = {768 // g} x {g}.

    Differs from scalerl:
        pipeline.prompts_per_step = {768 // g}
        pipeline.generations_per_prompt = {g}
    """
    return recipe


scalerl_gen8, scalerl_gen24, scalerl_gen32 = (_generations(g) for g in (8, 24, 32))

# 32k generation: the paper gives the total (32,768 generated tokens) but not its split. Assumed:
# the answer budget stays 2,048, thinking gets the rest (30,720 = 2.5 x 12,288), and the
# interruption window scales with the thinking budget, [10k, 12k] x 2.5 = [25k, 30k].
LONG_THINK_TOKENS = 32768 - ANSWER_TOKENS


def scalerl_32k(model: str = DEFAULT_MODEL, **overrides) -> RunConfig:
    """ScaleRL generating up to 32,768 tokens: 30,720 thinking + 2,048 answer, interruption point
    in [25,000, 30,000] (assumed split, see the comment above). The length-penalty fields stay
    at their 14k values: they only act in the interruptions LOO.

    Differs from scalerl:
        sampler.max_target_length = 34880  # 2,048 prompt + 32,768 generated + 64 phrase room
        sampler.max_new_tokens = 32768
        sampler.think_min = 25000
        sampler.think_max = 30000
    """
    think = LONG_THINK_TOKENS
    return _variant(
        "scalerl-32k",
        model,
        overrides,
        sampler=dict(
            max_target_length=PROMPT_TOKENS + think + ANSWER_TOKENS + PHRASE_ROOM,
            max_new_tokens=think + ANSWER_TOKENS,
            think_min=think * 10000 // THINK_TOKENS,
            think_max=think * 12000 // THINK_TOKENS,
        ),
    )
