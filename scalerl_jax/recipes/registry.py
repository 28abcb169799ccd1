"""The recipes by name: the RECIPES table (name -> function, one-line description) with
`get` and `describe`, the sizes a recipe takes on an accelerator (ACCELERATOR_SIZES,
`for_accelerator`), and `documented_diff`, which reads a recipe's "Differs from ...:"
docstring block so tests can hold it to the real difference."""

from __future__ import annotations

import ast
import inspect
import textwrap
from typing import Any, Callable, Optional

from scalerl_jax.config import ConfigError, RunConfig, apply_overrides
from scalerl_jax.recipes.paper import (
    dapo,
    grpo,
    loo_advantage_norm,
    loo_aggregation,
    loo_fp32_head,
    loo_interruptions,
    loo_loss,
    loo_no_positive_resampling,
    loo_off_policy,
    loo_zero_variance,
    magistral,
    minimax,
    scalerl,
    scalerl_32k,
    scalerl_batch512,
    scalerl_batch2048,
    scalerl_gen8,
    scalerl_gen24,
    scalerl_gen32,
)
from scalerl_jax.recipes.testbeds import gsm8k, gsm8k_laptop, testbed, testbed_mix

# What a recipe changes when it runs on an accelerator (a GPU, or a TPU slice with --tpu)
# instead of this CPU: groups of KEY=VALUE overrides. experiments/run.py applies them through
# `for_accelerator` before the memory plan, which then picks the decode slots, micro-batches
# and remat that fit the device; a group is left out whole when the command line sets any of
# its keys, so the values that belong together (a length and its KV cache) stay together.
ACCELERATOR_SIZES: dict[str, tuple[tuple[str, ...], ...]] = {
    "gsm8k": (
        # 512 samples a step, 16 per prompt as the paper; every slot of a step's batch at once.
        ("pipeline.prompts_per_step=32",),
        ("pipeline.generations_per_prompt=16",),
        ("sampler.max_concurrent_decodes=512",),
        # Remat only where the plan needs it (it is on for the CPU's shared host RAM).
        ("model.remat=false",),
        # Room for longer reasoning than the SFT solutions' (99th percentile 229 tokens).
        ("sampler.max_new_tokens=512", "sampler.max_target_length=768"),
        # All 1,319 test problems x 4 samples (standard error ~0.01) every 20 steps.
        ("eval.num_prompts=1319", "eval.k=4", "eval.every_steps=20"),
        # About 3 epochs of the 7,473 solutions (32 rows of ~2.5 packed solutions a step).
        (
            "sft.steps=250",
            "sft.batch_size=32",
            "sft.optim.total_steps=250",
            "sft.optim.warmup_steps=10",
        ),
        ("checkpoint_every=50",),
    ),
}


def for_accelerator(name: str, cfg: RunConfig, pinned=frozenset()) -> tuple[RunConfig, list]:
    """(`cfg` with recipe `name`'s ACCELERATOR_SIZES, the KEY=VALUE settings applied). `cfg` is
    the recipe as the command line built it; a group with a key in `pinned` (the keys the
    command line set) is skipped. A recipe without accelerator sizes comes back unchanged."""
    applied = [
        item
        for group in ACCELERATOR_SIZES.get(name, ())
        if not any(item.partition("=")[0] in pinned for item in group)
        for item in group
    ]
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
    LOO_PREFIX + "no-positive-resampling": (
        loo_no_positive_resampling,
        "LOO: no no-positive-resampling",
    ),
    LOO_PREFIX + "off-policy": (loo_off_policy, "LOO: PPO-off-policy-8 instead of PipelineRL-8"),
    LOO_PREFIX + "interruptions": (
        loo_interruptions,
        "LOO: length penalty (14k / 2k) instead of interruptions",
    ),
    "scalerl-batch512": (scalerl_batch512, "ScaleRL at batch 512 = 32 x 16"),
    "scalerl-batch2048": (scalerl_batch2048, "ScaleRL at batch 2048 = 128 x 16"),
    "scalerl-gen8": (scalerl_gen8, "ScaleRL, 8 generations per prompt: 96 x 8 = 768"),
    "scalerl-gen24": (scalerl_gen24, "ScaleRL, 24 generations per prompt: 32 x 24 = 768"),
    "scalerl-gen32": (scalerl_gen32, "ScaleRL, 32 generations per prompt: 24 x 32 = 768"),
    "scalerl-32k": (scalerl_32k, "ScaleRL generating 32k tokens: 30,720 thinking + 2,048 answer"),
    "gsm8k": (gsm8k, "ScaleRL on GSM8K with SmolLM2-135M: chat, \\boxed{} answers, SFT then RL"),
    "gsm8k-laptop": (
        gsm8k_laptop,
        "gsm8k cut down for a laptop CPU: 2 SFT steps, 2 RL steps, 4 test problems",
    ),
}
LOO_PIECES = tuple(n[len(LOO_PREFIX) :] for n in RECIPES if n.startswith(LOO_PREFIX))


def _lookup(name: str) -> Callable[..., RunConfig]:
    if name in RECIPES:
        return RECIPES[name][0]
    if name.startswith(LOO_PREFIX):
        raise KeyError(
            f"unknown leave-one-out piece {name[len(LOO_PREFIX) :]!r} in {name!r}; "
            f"pieces: {list(LOO_PIECES)}"
        )
    raise KeyError(f"unknown recipe {name!r}; known: {list(RECIPES)}")


def get(name: str, **overrides) -> RunConfig:
    """The recipe `name` (a key of RECIPES, e.g. "grpo", "scalerl-loo:loss"). `model=` picks a
    model preset (not for `testbed`); other keywords replace RunConfig fields (`steps=`,
    `workdir=`, ...). KeyError, naming the valid choices, for an unknown name or LOO piece."""
    fn = _lookup(name)
    # testbed takes no preset name: replacing its model by a string would build a RunConfig
    # whose `model` is not a ModelConfig, and fail only deep inside the run.
    if isinstance(overrides.get("model"), str) and "model" not in inspect.signature(fn).parameters:
        raise ConfigError(
            f"recipe {name!r} has its own model; model={overrides['model']!r} "
            "(a preset name) applies to the recipes built from scalerl"
        )
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
            raise ValueError(
                f"recipe {name!r}: not a `key = value` line in its "
                f"{DIFF_HEADER!r} block: {ast.unparse(node)}"
            )
        diff[ast.unparse(node.targets[0])] = ast.literal_eval(node.value)
    return diff
