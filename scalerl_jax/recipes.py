"""Named recipes: plain functions returning a RunConfig.

`scalerl` is the paper's recipe (REFERENCE.md "Recipe facts"); `testbed` is the embedded CPU
default that `python experiments/run.py` runs: a tiny model on a synthetic task, with every
mechanism of the recipe on (CISPO, prompt aggregation, batch advantage norm, zero-variance
filtering, no-positive-resampling, interruptions, in-flight weight updates), at sizes a laptop
finishes in minutes.

Every other recipe is `scalerl` with a few fields changed: the paper's comparison baselines
(`grpo`, `dapo`, `magistral`, `minimax`), its leave-one-out ablations (`scalerl-loo:<piece>`)
and its scaling axes (`scalerl-batch512`, `-gen8`, `-32k`, ...). Each one's docstring ends with
a "Differs from scalerl:" block of `section.field = value` lines (Python syntax, comments
allowed) naming exactly the fields it changes; `documented_diff(name)` reads that block and
tests/test_recipes.py checks it against the real difference of `to_dict()`, so the
documentation cannot drift from the code. `workdir` differs for every recipe and is not listed.

    get(name, **overrides)   a recipe by name; `model=` picks a preset (models/presets.py), any
                             other keyword replaces a RunConfig field
    describe()               [(name, one-line description)] for `--recipe list`
"""
from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap
from typing import Any, Callable, Optional

from scalerl_jax.config import (ConfigError, DataConfig, DomainConfig, EvalConfig, LossConfig,
                                MeshConfig, ModelConfig, OptimConfig, PipelineConfig, RunConfig,
                                SamplerConfig, SFTConfig, apply_overrides)
from scalerl_jax.models import presets

DEFAULT_MODEL = "llama-3.1-8b"
PROMPT_TOKENS = 2048
THINK_TOKENS = 12288
ANSWER_TOKENS = 2048
PHRASE_ROOM = 64  # KV-cache room for the forced interruption phrase


def scalerl(model: str = DEFAULT_MODEL, **overrides) -> RunConfig:
    """ScaleRL as published (REFERENCE.md "Recipe facts"): 48 prompts x 16 generations = 768,
    prompts up to 2,048 tokens, 12,288 thinking + 2,048 answer tokens, interruption point drawn in
    [10k, 12k] thinking tokens, CISPO, prompt-average aggregation, batch-level advantage
    normalisation, zero-variance filtering, no-positive-resampling (retire at pass rate >= 0.9),
    PipelineRL-8, fp32 LM head, AdamW 5e-7 constant after 100 warm-up steps, eps 1e-15, weight
    decay 0.01, no KL, rewards +-1 (LossConfig's defaults carry the loss-side values)."""
    model_cfg = presets.get(model, param_dtype="float32", compute_dtype="bfloat16", fp32_head=True)
    cfg = RunConfig(
        model=model_cfg,
        mesh=MeshConfig(),
        sampler=SamplerConfig(max_concurrent_decodes=64, max_prefill_length=PROMPT_TOKENS,
                              max_target_length=(PROMPT_TOKENS + THINK_TOKENS + ANSWER_TOKENS
                                                 + PHRASE_ROOM),
                              max_new_tokens=THINK_TOKENS + ANSWER_TOKENS, think_min=10000,
                              think_max=12000, answer_budget=ANSWER_TOKENS),
        loss=LossConfig(),
        optim=OptimConfig(learning_rate=5e-7, warmup_steps=100, eps=1e-15, weight_decay=0.01),
        pipeline=PipelineConfig(mode="pipeline", max_lag=8, prompts_per_step=48,
                                generations_per_prompt=16, no_positive_resampling=True,
                                retire_pass_rate=0.9),
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


MIX_MATH = "synthetic:countup?max_start=499&num=4000"
MIX_CODE = "synthetic:pycode?num=4000"


def testbed_mix(**overrides) -> RunConfig:
    """The testbed on a math + code mixture: half of each step's prompts are `countup`
    additions checked by exact match, half `pycode` programs ("code n*3+47=" -> a program
    reading n from stdin and printing n*3+47) checked by running them on test inputs
    (rewards/code.verify_code). The warm-up learns both from demonstrations (70% answer from
    memory, as in testbed); validation holds 200 prompts of each domain, and metrics.jsonl gets
    a curve per domain (`per_domain`), which the end-of-run fit fits one by one, as the paper
    fits its math+code run's math and code curves. The block below is the override set that
    turns `testbed` into this recipe (`python experiments/run.py KEY=VALUE ...` takes it too).

    Differs from testbed:
        data.source = "mixture"
        data.num_validation = 200  # each domain's
        data.domains.math.source = "synthetic:countup?max_start=499&num=4000"
        data.domains.math.verifier = "exact"
        data.domains.code.source = "synthetic:pycode?num=4000"
        data.domains.code.verifier = "code"
        sft.source = ("synthetic:countup?max_start=499&num=4000&direct=0.7"
                      "|pycode?num=4000&direct=0.7")
        sft.steps = 400
        sft.optim.total_steps = 400
    """
    base = testbed()
    cfg = dataclasses.replace(
        base,
        data=dataclasses.replace(base.data, source="mixture", num_validation=200, domains=(
            DomainConfig("math", MIX_MATH, verifier="exact"),
            DomainConfig("code", MIX_CODE, verifier="code"))),
        sft=dataclasses.replace(
            base.sft, source=f"{MIX_MATH}&direct=0.7|{MIX_CODE[len('synthetic:'):]}&direct=0.7",
            steps=400, optim=dataclasses.replace(base.sft.optim, total_steps=400)),
        workdir="runs/testbed-mix")
    return dataclasses.replace(cfg, **overrides) if overrides else cfg


def _variant(name: str, model: str, overrides: dict, /, **sections: dict) -> RunConfig:
    """`scalerl(model)` with fields of some sections replaced (`loss={"objective": "dapo"}`),
    its own workdir, then the caller's RunConfig-level overrides."""
    cfg = scalerl(model)
    changed = {sec: dataclasses.replace(getattr(cfg, sec), **fields)
               for sec, fields in sections.items()}
    cfg = dataclasses.replace(cfg, workdir=f"runs/{name.replace(':', '-')}-{model}", **changed)
    return dataclasses.replace(cfg, **overrides) if overrides else cfg


# ------------------------------------------------------------- the paper's comparison baselines
# REFERENCE.md "Baselines as the paper ran them". All keep what the table does not change:
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
    return _variant("grpo", model, overrides,
                    loss=dict(objective="grpo", aggregation="sequence", advantage_norm="group",
                              zero_variance_filter=False),
                    pipeline=dict(mode="ppo_off_policy", no_positive_resampling=False),
                    model=dict(fp32_head=False))


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
    return _variant("dapo", model, overrides,
                    loss=dict(objective="dapo", clip_eps_high=0.26, advantage_norm="group"),
                    pipeline=dict(mode="ppo_off_policy", prompts_per_step=80,
                                  no_positive_resampling=False),
                    model=dict(fp32_head=False))


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
    return _variant("magistral", model, overrides,
                    loss=dict(objective="dapo", clip_eps_high=0.26),
                    pipeline=dict(prompts_per_step=80, no_positive_resampling=False),
                    model=dict(fp32_head=False))


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
    return _variant("minimax", model, overrides, loss=dict(advantage_norm="group"),
                    pipeline=dict(mode="ppo_off_policy", prompts_per_step=80,
                                  no_positive_resampling=False))


# ----------------------------------------------------------------- leave-one-out ablations (LOO)
# Each reverts exactly one ScaleRL piece, as REFERENCE.md's leave-one-out list.

def loo_loss(model: str = DEFAULT_MODEL, **overrides) -> RunConfig:
    """ScaleRL with the DAPO loss instead of CISPO: PPO-clip 0.2 / 0.26 (the paper's DAPO
    clip-higher; its LOO value is not stated).

    Differs from scalerl:
        loss.objective = "dapo"
        loss.clip_eps_high = 0.26
    """
    return _variant("scalerl-loo:loss", model, overrides,
                    loss=dict(objective="dapo", clip_eps_high=0.26))


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
    return _variant("scalerl-loo:aggregation", model, overrides,
                    loss=dict(aggregation="sequence"))


def loo_advantage_norm(model: str = DEFAULT_MODEL, **overrides) -> RunConfig:
    """ScaleRL with advantages divided by each group's std instead of the batch's.

    Differs from scalerl:
        loss.advantage_norm = "group"
    """
    return _variant("scalerl-loo:advantage-norm", model, overrides,
                    loss=dict(advantage_norm="group"))


def loo_zero_variance(model: str = DEFAULT_MODEL, **overrides) -> RunConfig:
    """ScaleRL keeping all-pass / all-fail groups in the batch (zero advantage, but they count in
    the aggregation's denominators).

    Differs from scalerl:
        loss.zero_variance_filter = False
    """
    return _variant("scalerl-loo:zero-variance", model, overrides,
                    loss=dict(zero_variance_filter=False))


def loo_no_positive_resampling(model: str = DEFAULT_MODEL, **overrides) -> RunConfig:
    """ScaleRL that keeps sampling prompts whose pass rate reached 0.9 in later epochs.

    Differs from scalerl:
        pipeline.no_positive_resampling = False
    """
    return _variant("scalerl-loo:no-positive-resampling", model, overrides,
                    pipeline=dict(no_positive_resampling=False))


def loo_off_policy(model: str = DEFAULT_MODEL, **overrides) -> RunConfig:
    """ScaleRL with PPO-off-policy-8 (a round of 8 batches generated with frozen weights, then 8
    updates) instead of PipelineRL-8.

    Differs from scalerl:
        pipeline.mode = "ppo_off_policy"
    """
    return _variant("scalerl-loo:off-policy", model, overrides,
                    pipeline=dict(mode="ppo_off_policy"))


def loo_interruptions(model: str = DEFAULT_MODEL, **overrides) -> RunConfig:
    """ScaleRL with the length penalty instead of interruptions: no forced phrase, generation
    truncated at 14,336 tokens, and correct traces get clip((L_max - |y|) / L_cache - 1, -1, 0)
    with L_max 14,336 and L_cache 2,048 (LossConfig's defaults, so not listed): free up to
    12,288 tokens, -1 at the truncation point.

    Differs from scalerl:
        sampler.interruptions = False
        loss.length_penalty = True
    """
    return _variant("scalerl-loo:interruptions", model, overrides,
                    sampler=dict(interruptions=False), loss=dict(length_penalty=True))


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
        return _variant(f"scalerl-gen{g}", model, overrides,
                        pipeline=dict(prompts_per_step=768 // g, generations_per_prompt=g))
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
    return _variant("scalerl-32k", model, overrides, sampler=dict(
        max_target_length=PROMPT_TOKENS + think + ANSWER_TOKENS + PHRASE_ROOM,
        max_new_tokens=think + ANSWER_TOKENS, think_min=think * 10000 // THINK_TOKENS,
        think_max=think * 12000 // THINK_TOKENS))


# ------------------------------------------------------------------------- a real model and data
GSM8K_MODEL = "smollm2-135m"
BOXED_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."


def gsm8k(model: str = GSM8K_MODEL, **overrides) -> RunConfig:
    r"""ScaleRL on GSM8K with a small instruct model: SmolLM2-135M-Instruct as `make
    fetch-model` provides it (`--hf-checkpoint DIR` gives the weights, tokenizer and chat
    template; any other HF model works the same way), sized to run on a 2-core CPU:

        python experiments/run.py --recipe gsm8k --hf-checkpoint DIR \
            --data ../shared/data/gsm8k/train.jsonl

    Prompts: the chat template with a system prompt asking for step-by-step reasoning and a
    \boxed{} answer; reference answers read from GSM8K's worked solutions by the "gsm8k"
    answer format (the number after "####", thousands separators removed). Validation: GSM8K's
    test split, the test.jsonl beside the train file (`data.validation_source`), so no
    training problem is held out; `eval.num_prompts` of its 1,319 problems are scored.

    SFT first: the model as it comes almost never ends in a boxed answer, so RL would start
    without signal. The warm-up trains on the train split's worked solutions rewritten as chat
    answers (calculator annotations dropped, ending in "The final answer is \boxed{N}.",
    `sft.completion_format = "gsm8k"`); the RL stage starts from its checkpoint.

    Sizes for a 2-core CPU (a step takes minutes): 4 prompts x 4 samples, 16 decode slots,
    prompts up to 256 tokens (GSM8K's longest is 254 with this template), 256 new tokens (the
    rewritten solutions: mean 101, 99th percentile 229), 64 test problems x 1 sample every 10
    steps; the SFT stage 16 steps of 4 packed rows of 512 tokens (~170 solutions: enough to
    learn the answer's form, not to teach arithmetic). The trainer takes one prompt's samples
    at a time with remat: 4.4 GiB planned in all (6.9 without remat), since host RAM is shared
    with everything else on the machine. On an accelerator `experiments/run.py` applies
    ACCELERATOR_SIZES["gsm8k"] on top (see `for_accelerator`), and the plan then fits
    micro-batches, remat and slots to the device (with --tpu the slice planner; else, on a
    GPU or TPU VM, the local plan's first fitting settings: preflight.size_for_platform).

    No interruptions: this model does not think in a <think> block, so there is no thinking
    to interrupt; a completion that reaches the cap is truncated and earns no reward. The
    learning rate is raised from the paper's 5e-7 (an 8B model) to 2e-6 for a model 60 times
    smaller.

    Measured on a 2-core CPU shared with other jobs (load 8-10): SFT 50-90 s a step, 20 min in
    all; greedy on the first 48 test problems, boxed answers 0 before it and 26 after, right
    answers 1 and 0; validation after it 1 of 64 (sampled); the first RL steps took 4.7 min
    (compiling), 1.9 and 1.4 min, every 4-sample group all wrong (zero variance: nothing to
    train on). A learning curve needs the accelerator sizes.

    Differs from scalerl:
        mesh.colocate = True  # one CPU device (or GPU) trains and samples
        sampler.max_concurrent_decodes = 16
        sampler.max_prefill_length = 256
        sampler.max_target_length = 512
        sampler.max_new_tokens = 256
        sampler.interruptions = False
        optim.learning_rate = 2e-06
        optim.warmup_steps = 10
        optim.micro_batches = 4  # one prompt's rows at a time
        model.remat = True
        pipeline.prompts_per_step = 4
        pipeline.generations_per_prompt = 4
        data.source = "../shared/data/gsm8k/train.jsonl"
        data.prompt_field = "question"
        data.answer_format = "gsm8k"
        data.system_prompt = ("Please reason step by step, and put your final answer within "
                              "\\boxed{}.")
        data.validation_source = "{data_dir}/test.jsonl"
        data.num_validation = 1319  # all of GSM8K test
        eval.every_steps = 10
        eval.k = 1
        eval.num_prompts = 64
        sft.source = "{data_source}"  # the RL training file
        sft.prompt_field = "question"
        sft.completion_field = "answer"
        sft.completion_format = "gsm8k"
        sft.steps = 16
        sft.batch_size = 4
        sft.max_length = 512
        sft.log_every = 2
        sft.optim.learning_rate = 5e-05
        sft.optim.warmup_steps = 2
        sft.optim.schedule = "cosine"
        sft.optim.total_steps = 16
        steps = 200
        checkpoint_every = 10
    """
    cfg = scalerl(model)
    cfg = dataclasses.replace(
        cfg,
        model=cfg.model.replace(remat=True),
        mesh=dataclasses.replace(cfg.mesh, colocate=True),
        sampler=dataclasses.replace(cfg.sampler, max_concurrent_decodes=16,
                                    max_prefill_length=256, max_target_length=512,
                                    max_new_tokens=256, interruptions=False),
        optim=dataclasses.replace(cfg.optim, learning_rate=2e-6, warmup_steps=10,
                                  micro_batches=4),
        pipeline=dataclasses.replace(cfg.pipeline, prompts_per_step=4, generations_per_prompt=4),
        data=dataclasses.replace(cfg.data, source="../shared/data/gsm8k/train.jsonl",
                                 prompt_field="question", answer_field="answer",
                                 answer_format="gsm8k", system_prompt=BOXED_INSTRUCTION,
                                 validation_source="{data_dir}/test.jsonl", num_validation=1319),
        eval=EvalConfig(every_steps=10, k=1, num_prompts=64),
        sft=SFTConfig(source="{data_source}", prompt_field="question", completion_field="answer",
                      completion_format="gsm8k", steps=16, batch_size=4, max_length=512,
                      log_every=2,
                      optim=OptimConfig(learning_rate=5e-5, warmup_steps=2, schedule="cosine",
                                        total_steps=16, eps=1e-8, weight_decay=0.0)),
        workdir=f"runs/gsm8k-{model}",
        steps=200,
        checkpoint_every=10,
    )
    return dataclasses.replace(cfg, **overrides) if overrides else cfg


# What a recipe changes when it runs on an accelerator (a GPU, or a TPU slice with --tpu)
# instead of this CPU: groups of KEY=VALUE overrides. experiments/run.py applies them through
# `for_accelerator` before the memory plan, which then picks the decode slots, micro-batches
# and remat that fit the device; a group is left out whole when the command line sets any of
# its keys, so the values that belong together (a length and its KV cache) stay together.
ACCELERATOR_SIZES: dict[str, tuple[tuple[str, ...], ...]] = {
    "gsm8k": (
        # 512 samples a step, 16 per prompt as the paper; every slot of a step's batch at once.
        ("pipeline.prompts_per_step=32",), ("pipeline.generations_per_prompt=16",),
        ("sampler.max_concurrent_decodes=512",),
        # Remat only where the plan needs it (it is on for the CPU's shared host RAM).
        ("model.remat=false",),
        # Room for longer reasoning than the SFT solutions' (99th percentile 229 tokens).
        ("sampler.max_new_tokens=512", "sampler.max_target_length=768"),
        # All 1,319 test problems x 4 samples (standard error ~0.01) every 20 steps.
        ("eval.num_prompts=1319", "eval.k=4", "eval.every_steps=20"),
        # About 3 epochs of the 7,473 solutions (32 rows of ~2.5 packed solutions a step).
        ("sft.steps=250", "sft.batch_size=32", "sft.optim.total_steps=250",
         "sft.optim.warmup_steps=10"),
        ("checkpoint_every=50",),
    ),
}


def for_accelerator(name: str, cfg: RunConfig, pinned=frozenset()) -> tuple[RunConfig, list]:
    """(`cfg` with recipe `name`'s ACCELERATOR_SIZES, the KEY=VALUE settings applied). `cfg` is
    the recipe as the command line built it; a group with a key in `pinned` (the keys the
    command line set) is skipped. A recipe without accelerator sizes comes back unchanged."""
    applied = [item for group in ACCELERATOR_SIZES.get(name, ())
               if not any(item.partition("=")[0] in pinned for item in group)
               for item in group]
    return (apply_overrides(cfg, applied) if applied else cfg), applied


# ------------------------------------------------------------------------------------ the table
LOO_PREFIX = "scalerl-loo:"
RECIPES: dict[str, tuple[Callable[..., RunConfig], str]] = {
    "scalerl": (scalerl, "ScaleRL as published: 48x16, CISPO, PipelineRL-8, 14k generation"),
    "testbed": (testbed, "CPU default: tiny model, synthetic countup task, SFT warm-up then RL"),
    "testbed-mix": (testbed_mix, "testbed on math + code: countup and pycode, a curve per domain"),
    "grpo": (grpo, "DeepSeek GRPO baseline: PPO-clip 0.2, sample average, PPO-off-policy-8, 768"),
    "dapo": (dapo, "Qwen2.5 DAPO baseline: clip 0.2/0.26, prompt avg, PPO-off-policy-8, 1280"),
    "magistral": (magistral, "Magistral baseline: clip 0.2/0.26, prompt avg, PipelineRL-8, 1280"),
    "minimax": (minimax, "MiniMax-M1 baseline: CISPO, fp32 head, PPO-off-policy-8, 1280"),
    LOO_PREFIX + "loss": (loo_loss, "LOO: DAPO loss (clip 0.2/0.26) instead of CISPO"),
    LOO_PREFIX + "fp32-head": (loo_fp32_head, "LOO: bf16 LM head instead of fp32"),
    LOO_PREFIX + "aggregation": (loo_aggregation, "LOO: sample average instead of prompt"),
    LOO_PREFIX + "advantage-norm": (loo_advantage_norm, "LOO: group std instead of batch std"),
    LOO_PREFIX + "zero-variance": (loo_zero_variance, "LOO: no zero-variance filtering"),
    LOO_PREFIX + "no-positive-resampling": (loo_no_positive_resampling,
                                            "LOO: no no-positive-resampling"),
    LOO_PREFIX + "off-policy": (loo_off_policy, "LOO: PPO-off-policy-8 instead of PipelineRL-8"),
    LOO_PREFIX + "interruptions": (loo_interruptions,
                                   "LOO: length penalty (14k / 2k) instead of interruptions"),
    "scalerl-batch512": (scalerl_batch512, "ScaleRL at batch 512 = 32 x 16"),
    "scalerl-batch2048": (scalerl_batch2048, "ScaleRL at batch 2048 = 128 x 16"),
    "scalerl-gen8": (scalerl_gen8, "ScaleRL, 8 generations per prompt: 96 x 8 = 768"),
    "scalerl-gen24": (scalerl_gen24, "ScaleRL, 24 generations per prompt: 32 x 24 = 768"),
    "scalerl-gen32": (scalerl_gen32, "ScaleRL, 32 generations per prompt: 24 x 32 = 768"),
    "scalerl-32k": (scalerl_32k, "ScaleRL generating 32k tokens: 30,720 thinking + 2,048 answer"),
    "gsm8k": (gsm8k, "ScaleRL on GSM8K with SmolLM2-135M: chat, \\boxed{} answers, SFT then RL"),
}
LOO_PIECES = tuple(n[len(LOO_PREFIX):] for n in RECIPES if n.startswith(LOO_PREFIX))


def _lookup(name: str) -> Callable[..., RunConfig]:
    if name in RECIPES:
        return RECIPES[name][0]
    if name.startswith(LOO_PREFIX):
        raise KeyError(f"unknown leave-one-out piece {name[len(LOO_PREFIX):]!r} in {name!r}; "
                       f"pieces: {list(LOO_PIECES)}")
    raise KeyError(f"unknown recipe {name!r}; known: {list(RECIPES)}")


def get(name: str, **overrides) -> RunConfig:
    """The recipe `name` (a key of RECIPES, e.g. "grpo", "scalerl-loo:loss"). `model=` picks a
    model preset (not for `testbed`); other keywords replace RunConfig fields (`steps=`,
    `workdir=`, ...). KeyError, naming the valid choices, for an unknown name or LOO piece."""
    fn = _lookup(name)
    # testbed takes no preset name: replacing its model by a string would build a RunConfig
    # whose `model` is not a ModelConfig, and fail only deep inside the run.
    if isinstance(overrides.get("model"), str) and "model" not in inspect.signature(fn).parameters:
        raise ConfigError(f"recipe {name!r} has its own model; model={overrides['model']!r} "
                          "(a preset name) applies to the recipes built from scalerl")
    return fn(**overrides)


def describe() -> list[tuple[str, str]]:
    """[(name, one-line description)] in table order: for `--recipe list`."""
    return [(name, desc) for name, (_, desc) in RECIPES.items()]


DIFF_HEADER = "Differs from scalerl:"


def documented_diff(name: str, base: str = "scalerl") -> Optional[dict[str, Any]]:
    """{dotted field: value} that the recipe's docstring says differ from `base` (same
    model), read from its "Differs from BASE:" block; `workdir` is never listed. {} for
    `base` itself; None for a recipe not built from `base` (`testbed` from scalerl).
    `testbed-mix` documents its difference from `testbed` as override keys
    (`data.domains.code.verifier`), the form `apply_overrides` takes."""
    fn = _lookup(name)
    if fn is _lookup(base):
        return {}
    doc = inspect.getdoc(fn) or ""
    header = DIFF_HEADER.replace("scalerl", base)
    if header not in doc:
        return None
    block = doc.split(header, 1)[1].split("\n\n", 1)[0]
    diff = {}
    for node in ast.parse(textwrap.dedent(block).strip()).body:
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1):
            raise ValueError(f"recipe {name!r}: not a `key = value` line in its "
                             f"{DIFF_HEADER!r} block: {ast.unparse(node)}")
        diff[ast.unparse(node.targets[0])] = ast.literal_eval(node.value)
    return diff
