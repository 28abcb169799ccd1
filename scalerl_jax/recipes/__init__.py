"""Named recipes: plain functions returning a RunConfig.

`scalerl` is the paper's recipe; `testbed` is the embedded CPU
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
