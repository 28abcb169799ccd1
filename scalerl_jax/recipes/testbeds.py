"""The recipes sized for this CPU: `testbed` (the embedded default of `make run`: a tiny model
learning a synthetic task), `testbed_mix` (the testbed on a math + code mixture) and `gsm8k`
(ScaleRL on GSM8K with a small instruct model)."""

from __future__ import annotations

import dataclasses

from scalerl_jax.config import (
    DataConfig,
    DomainConfig,
    EvalConfig,
    LossConfig,
    MeshConfig,
    ModelConfig,
    OptimConfig,
    PipelineConfig,
    RunConfig,
    SamplerConfig,
    SFTConfig,
)
from scalerl_jax.recipes.paper import scalerl


def testbed(**overrides) -> RunConfig:
    """The embedded CPU default: a supervised warm-up, then ScaleRL, then the scaling fit.

    Task `countup` with a 0.9M-parameter character model; every piece of the recipe is on.
    docs/recipes.md ("The testbed") says what it learns and why the learning rate is 6e-6.
    """
    from scalerl_jax.data.synthetic_tasks import CharTokenizer

    problems = "synthetic:countup?max_start=499&num=4000"
    model_cfg = ModelConfig(
        name="testbed",
        vocab_size=CharTokenizer().vocab_size,
        hidden_size=128,
        intermediate_size=384,
        num_layers=4,
        num_heads=4,
        num_kv_heads=4,
        max_position_embeddings=256,
        tie_embeddings=True,
    )
    cfg = RunConfig(
        model=model_cfg,
        mesh=MeshConfig(colocate=True),
        sampler=SamplerConfig(
            max_concurrent_decodes=64,
            max_prefill_length=16,
            max_target_length=96,
            max_new_tokens=80,
            think_min=56,
            think_max=60,
            answer_budget=4,
            interruption_phrase="time is up. </think>",
        ),
        loss=LossConfig(),
        optim=OptimConfig(learning_rate=6e-6, warmup_steps=10, eps=1e-8, logprob_chunk=None),
        pipeline=PipelineConfig(
            mode="pipeline", max_lag=8, prompts_per_step=16, generations_per_prompt=8, seq_bucket=16
        ),
        data=DataConfig(source=problems, template="{prompt}", num_validation=400),
        eval=EvalConfig(every_steps=18, k=4, num_prompts=400),
        sft=SFTConfig(
            source=problems + "&direct=0.7",
            steps=300,
            batch_size=16,
            max_length=128,
            optim=OptimConfig(
                learning_rate=3e-3,
                warmup_steps=20,
                eps=1e-8,
                weight_decay=0.0,
                schedule="cosine",
                total_steps=300,
                logprob_chunk=None,
            ),
        ),
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
    base_sft = base.sft
    assert base_sft is not None  # testbed() has an SFT stage
    cfg = dataclasses.replace(
        base,
        data=dataclasses.replace(
            base.data,
            source="mixture",
            num_validation=200,
            domains=(
                DomainConfig("math", MIX_MATH, verifier="exact"),
                DomainConfig("code", MIX_CODE, verifier="code"),
            ),
        ),
        sft=dataclasses.replace(
            base_sft,
            source=f"{MIX_MATH}&direct=0.7|{MIX_CODE[len('synthetic:') :]}&direct=0.7",
            steps=400,
            optim=dataclasses.replace(base_sft.optim, total_steps=400),
        ),
        workdir="runs/testbed-mix",
    )
    return dataclasses.replace(cfg, **overrides) if overrides else cfg


# ------------------------------------------------------------------------- a real model and data
GSM8K_MODEL = "smollm2-135m"
BOXED_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."


def gsm8k(model: str = GSM8K_MODEL, **overrides) -> RunConfig:
    r"""ScaleRL on GSM8K with SmolLM2-135M-Instruct (`make fetch-model`), sized for a 2-core
    CPU: an SFT warm-up on the worked solutions, then RL with \boxed{} answers scored against
    the test split. docs/recipes.md ("gsm8k on a CPU") explains the sizes and what they gave.

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
        data.source = "data/gsm8k/train.jsonl"  # GSM8K as JSONL: docs/real-models.md
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
        sampler=dataclasses.replace(
            cfg.sampler,
            max_concurrent_decodes=16,
            max_prefill_length=256,
            max_target_length=512,
            max_new_tokens=256,
            interruptions=False,
        ),
        optim=dataclasses.replace(cfg.optim, learning_rate=2e-6, warmup_steps=10, micro_batches=4),
        pipeline=dataclasses.replace(cfg.pipeline, prompts_per_step=4, generations_per_prompt=4),
        data=dataclasses.replace(
            cfg.data,
            source="data/gsm8k/train.jsonl",
            prompt_field="question",
            answer_field="answer",
            answer_format="gsm8k",
            system_prompt=BOXED_INSTRUCTION,
            validation_source="{data_dir}/test.jsonl",
            num_validation=1319,
        ),
        eval=EvalConfig(every_steps=10, k=1, num_prompts=64),
        sft=SFTConfig(
            source="{data_source}",
            prompt_field="question",
            completion_field="answer",
            completion_format="gsm8k",
            steps=16,
            batch_size=4,
            max_length=512,
            log_every=2,
            optim=OptimConfig(
                learning_rate=5e-5,
                warmup_steps=2,
                schedule="cosine",
                total_steps=16,
                eps=1e-8,
                weight_decay=0.0,
            ),
        ),
        workdir=f"runs/gsm8k-{model}",
        steps=200,
        checkpoint_every=10,
    )
    return dataclasses.replace(cfg, **overrides) if overrides else cfg


def gsm8k_laptop(model: str = GSM8K_MODEL, **overrides) -> RunConfig:
    """`gsm8k` cut down to show the whole pipeline on a laptop CPU in minutes: a 2-step SFT
    warm-up, two RL steps of 2 prompts x 4 samples (the sampler at most one step ahead), an
    evaluation of 4 test problems before and after them, completions of at most 64 tokens.
    Too short to learn anything (most completions are cut off before their answer); it is the
    real model and data going through every stage, and compilation is most of its time:
    7 min 37 s in all on a 2-core CPU shared with other jobs (load 7-11), 6.1 GiB at most.
    The block below is the override set that turns `gsm8k` into this recipe.

    Differs from gsm8k:
        sampler.max_concurrent_decodes = 8
        sampler.max_target_length = 320
        sampler.max_new_tokens = 64
        pipeline.prompts_per_step = 2
        pipeline.max_lag = 1
        optim.micro_batches = 2
        eval.every_steps = 2
        eval.num_prompts = 4
        sft.steps = 2
        sft.batch_size = 2
        sft.max_length = 384
        sft.optim.total_steps = 2
        sft.optim.warmup_steps = 1
        steps = 2
        checkpoint_every = 2
    """
    base = gsm8k(model)
    base_sft = base.sft
    assert base_sft is not None  # gsm8k() has an SFT stage
    cfg = dataclasses.replace(
        base,
        sampler=dataclasses.replace(
            base.sampler, max_concurrent_decodes=8, max_target_length=320, max_new_tokens=64
        ),
        pipeline=dataclasses.replace(base.pipeline, prompts_per_step=2, max_lag=1),
        optim=dataclasses.replace(base.optim, micro_batches=2),
        eval=dataclasses.replace(base.eval, every_steps=2, num_prompts=4),
        sft=dataclasses.replace(
            base_sft,
            steps=2,
            batch_size=2,
            max_length=384,
            optim=dataclasses.replace(base_sft.optim, total_steps=2, warmup_steps=1),
        ),
        steps=2,
        checkpoint_every=2,
        workdir=f"runs/gsm8k-laptop-{model}",
    )
    return dataclasses.replace(cfg, **overrides) if overrides else cfg
