"""Named recipes: plain functions returning a RunConfig.

`scalerl` is the paper's recipe, `testbed` the CPU default of `python experiments/run.py`;
every other recipe is `scalerl` with a few fields changed, listed in its docstring's
"Differs from scalerl:" block, which tests/test_recipes.py checks against the real difference
(docs/recipes.md).

    get(name, **overrides)   a recipe by name; `model=` picks a preset (models/presets.py), any
                             other keyword replaces a RunConfig field
    describe()               [(name, one-line description)] for `--recipe list`

  paper.py      scalerl, the baselines, the leave-one-out ablations, the scaling axes
  testbeds.py   the recipes sized for this CPU: testbed, testbed_mix, gsm8k
  registry.py   the RECIPES table, get / describe, ACCELERATOR_SIZES, documented_diff
"""

from scalerl_jax.recipes.paper import (
    ANSWER_TOKENS,
    DEFAULT_MODEL,
    LONG_THINK_TOKENS,
    PHRASE_ROOM,
    PROMPT_TOKENS,
    THINK_TOKENS,
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
from scalerl_jax.recipes.registry import (
    ACCELERATOR_SIZES,
    DIFF_HEADER,
    LOO_PIECES,
    LOO_PREFIX,
    RECIPES,
    describe,
    documented_diff,
    for_accelerator,
    get,
)
from scalerl_jax.recipes.testbeds import (
    BOXED_INSTRUCTION,
    GSM8K_MODEL,
    MIX_CODE,
    MIX_MATH,
    gsm8k,
    testbed,
    testbed_mix,
)

__all__ = [
    "ACCELERATOR_SIZES",
    "ANSWER_TOKENS",
    "BOXED_INSTRUCTION",
    "DEFAULT_MODEL",
    "DIFF_HEADER",
    "GSM8K_MODEL",
    "LONG_THINK_TOKENS",
    "LOO_PIECES",
    "LOO_PREFIX",
    "MIX_CODE",
    "MIX_MATH",
    "PHRASE_ROOM",
    "PROMPT_TOKENS",
    "RECIPES",
    "THINK_TOKENS",
    "dapo",
    "describe",
    "documented_diff",
    "for_accelerator",
    "get",
    "grpo",
    "gsm8k",
    "loo_advantage_norm",
    "loo_aggregation",
    "loo_fp32_head",
    "loo_interruptions",
    "loo_loss",
    "loo_no_positive_resampling",
    "loo_off_policy",
    "loo_zero_variance",
    "magistral",
    "minimax",
    "scalerl",
    "scalerl_32k",
    "scalerl_batch512",
    "scalerl_batch2048",
    "scalerl_gen8",
    "scalerl_gen24",
    "scalerl_gen32",
    "testbed",
    "testbed_mix",
]
