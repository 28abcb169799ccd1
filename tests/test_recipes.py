"""Recipes: every name resolves to a valid RunConfig, and each one's documented difference from
`scalerl` (its docstring's "Differs from scalerl:" block) is exactly the real one."""

import dataclasses

import pytest

from scalerl_jax import recipes
from scalerl_jax.config import (
    ConfigError,
    RunConfig,
    SFTConfig,
    apply_overrides,
    from_dict,
    resolve_source,
)

# everything built from scalerl (testbed-mix is built from testbed: tests/test_multitask.py)
# gsm8k-laptop documents its difference from gsm8k (test_gsm8k_laptop_is_gsm8k_cut_down).
DERIVED = [n for n in recipes.RECIPES if not n.startswith("testbed") and n != "gsm8k-laptop"]


def flatten(tree, prefix=""):
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[prefix + key] = value
    return out


def actual_diff(name, model):
    """{dotted key: value} where `name` differs from scalerl with the same model, but workdir.
    Values carry their type, so 1 vs 1.0 or True vs 1 is a difference. A section scalerl
    leaves off (sft) counts from its defaults, as `key.path=value` overrides build it."""
    base = recipes.scalerl(model=model)
    recipe = recipes.get(name, model=model)
    if recipe.sft is not None and base.sft is None:
        base = dataclasses.replace(base, sft=SFTConfig())
    base = flatten(base.to_dict())
    cfg = flatten(recipe.to_dict())
    assert cfg.keys() == base.keys()
    return {
        k: v for k, v in cfg.items() if k != "workdir" and (type(v), v) != (type(base[k]), base[k])
    }


def typed(d):
    return {k: (type(v).__name__, v) for k, v in d.items()}


@pytest.mark.parametrize("model", [recipes.DEFAULT_MODEL, "tiny-qwen3"])
@pytest.mark.parametrize("name", DERIVED)
def test_documented_diff_is_the_real_diff(name, model):
    documented = recipes.documented_diff(name)
    assert typed(actual_diff(name, model)) == typed(documented)
    assert (documented == {}) == (name == "scalerl")
    cfg = recipes.get(name, model=model)
    assert cfg.model.name == model and cfg.workdir == f"runs/{name.replace(':', '-')}-{model}"


def test_testbed_is_not_a_scalerl_variant():
    assert recipes.documented_diff("testbed") is None
    assert recipes.documented_diff("scalerl") == {}


@pytest.mark.parametrize("name", list(recipes.RECIPES))
def test_every_recipe_is_a_valid_consistent_run_config(name):
    cfg = recipes.get(name)
    assert isinstance(cfg, RunConfig)
    assert from_dict(RunConfig, cfg.to_dict()) == cfg  # rebuilt: every section re-validated
    s, loss = cfg.sampler, cfg.loss
    assert s.max_prefill_length + s.max_new_tokens <= s.max_target_length
    if s.interruptions and not name.startswith("testbed"):  # phrase (<= 1 token per
        # character) + answer fit after the latest interruption point, before truncation
        assert s.think_max + len(s.interruption_phrase) + s.answer_budget <= s.max_new_tokens
    if loss.objective == "grpo":  # policy_loss rejects an asymmetric clip for 'grpo'
        assert loss.clip_eps_low == loss.clip_eps_high


BATCHES = {
    "scalerl": (48, 16),
    "grpo": (48, 16),
    "dapo": (80, 16),
    "magistral": (80, 16),
    "minimax": (80, 16),
    "scalerl-batch512": (32, 16),
    "scalerl-batch2048": (128, 16),
    "scalerl-gen8": (96, 8),
    "scalerl-gen24": (32, 24),
    "scalerl-gen32": (24, 32),
}


@pytest.mark.parametrize("name", list(BATCHES))
def test_batch_shapes(name):
    p = recipes.get(name).pipeline
    assert (p.prompts_per_step, p.generations_per_prompt) == BATCHES[name]


def test_paper_values():
    s = recipes.scalerl()
    assert (s.sampler.max_new_tokens, s.sampler.answer_budget) == (12288 + 2048, 2048)
    assert (s.sampler.think_min, s.sampler.think_max, s.sampler.interruptions) == (
        10000,
        12000,
        True,
    )
    assert (s.loss.objective, s.loss.aggregation, s.loss.advantage_norm) == (
        "cispo",
        "prompt",
        "batch",
    )
    assert s.loss.zero_variance_filter and s.model.fp32_head and s.loss.kl_coef == 0
    assert (s.loss.reward_correct, s.loss.reward_incorrect) == (1.0, -1.0)
    assert s.pipeline.no_positive_resampling and s.pipeline.retire_pass_rate == 0.9
    assert (s.pipeline.mode, s.pipeline.max_lag) == ("pipeline", 8)
    o = s.optim
    assert (o.learning_rate, o.warmup_steps, o.schedule, o.eps, o.weight_decay) == (
        5e-7,
        100,
        "constant",
        1e-15,
        0.01,
    )
    long = recipes.get("scalerl-32k").sampler
    assert (long.max_new_tokens, long.think_min, long.think_max) == (32768, 25000, 30000)
    lp = recipes.get("scalerl-loo:interruptions").loss
    assert (lp.length_penalty_max, lp.length_penalty_cache) == (14336, 2048)


def test_loo_covers_the_eight_pieces():
    assert recipes.LOO_PIECES == (
        "loss",
        "fp32-head",
        "aggregation",
        "advantage-norm",
        "zero-variance",
        "no-positive-resampling",
        "off-policy",
        "interruptions",
    )
    for piece in recipes.LOO_PIECES:  # one piece each: a LOO changes one thing (two keys at most)
        assert 1 <= len(recipes.documented_diff(recipes.LOO_PREFIX + piece)) <= 2


@pytest.mark.fast
def test_unknown_names_list_the_valid_choices():
    with pytest.raises(KeyError) as err:
        recipes.get("scalerl-xl")
    assert "grpo" in str(err.value) and "scalerl-loo:loss" in str(err.value)
    for bad in ("scalerl-loo:kl", "scalerl-loo:"):
        with pytest.raises(KeyError) as err:
            recipes.get(bad)
        assert "off-policy" in str(err.value) and "interruptions" in str(err.value)
    with pytest.raises(KeyError, match="grpo"):
        recipes.documented_diff("nope")
    with pytest.raises(ConfigError, match="own model"):  # not a str where a ModelConfig goes
        recipes.get("testbed", model="tiny-llama")


def test_describe_and_overrides():
    listing = recipes.describe()
    assert [n for n, _ in listing] == list(recipes.RECIPES)
    assert all(d and "\n" not in d and len(n) + len(d) < 100 for n, d in listing)
    cfg = recipes.get("dapo", model="tiny-llama", steps=7, workdir="/tmp/x")
    assert (cfg.steps, cfg.workdir, cfg.model.name, cfg.loss.objective) == (
        7,
        "/tmp/x",
        "tiny-llama",
        "dapo",
    )
    # experiments/run.py's key.path=value overrides apply to a variant like to scalerl.
    cfg = apply_overrides(recipes.get("scalerl-loo:off-policy"), ["pipeline.max_lag=4"])
    assert (cfg.pipeline.mode, cfg.pipeline.max_lag) == ("ppo_off_policy", 4)


# ------------------------------------------------------------------------------------- gsm8k
def test_gsm8k_block_is_the_override_set_from_scalerl():
    """The documented block, as command-line overrides on scalerl, builds the recipe."""
    items = [f"{k}={v}" for k, v in recipes.documented_diff("gsm8k").items()]
    built = apply_overrides(recipes.scalerl(model=recipes.GSM8K_MODEL), items)
    assert dataclasses.replace(built, workdir="w") == dataclasses.replace(
        recipes.get("gsm8k"), workdir="w"
    )


def test_gsm8k_laptop_is_gsm8k_cut_down():
    """Its documented block, as command-line overrides on gsm8k, builds it; it reaches two RL
    steps with an evaluation before and after them, and fits the gsm8k recipe's lengths."""
    items = [f"{k}={v}" for k, v in recipes.documented_diff("gsm8k-laptop", base="gsm8k").items()]
    built = apply_overrides(recipes.get("gsm8k"), items)
    laptop = recipes.get("gsm8k-laptop")
    assert dataclasses.replace(built, workdir="w") == dataclasses.replace(laptop, workdir="w")
    assert laptop.steps == 2 and laptop.eval.every_steps == 2 and laptop.checkpoint_every == 2
    s = laptop.sampler
    assert s.max_prefill_length + s.max_new_tokens <= s.max_target_length
    assert laptop.workdir == "runs/gsm8k-laptop-smollm2-135m"


def test_gsm8k_sources_follow_the_data_flag():
    cfg = recipes.get("gsm8k")
    data = dataclasses.replace(cfg.data, source="/data/gsm8k/train.jsonl")
    assert data.validation_path() == "/data/gsm8k/test.jsonl"
    assert cfg.sft.source_for(data) == "/data/gsm8k/train.jsonl"
    assert resolve_source("{data_dir}/x.jsonl", "train.jsonl", "f") == "./x.jsonl"
    # Overridable: another file, or none (held out of the training rows again).
    other = apply_overrides(cfg, ["data.validation_source=/elsewhere/dev.jsonl"])
    assert other.data.validation_path() == "/elsewhere/dev.jsonl"
    assert apply_overrides(cfg, ["data.validation_source=none"]).data.validation_path() is None
    with pytest.raises(ConfigError, match=r"\{data_dir\} needs a local data.source"):
        apply_overrides(cfg, ["data.source=hf:openai/gsm8k"]).data.validation_path()
    with pytest.raises(ConfigError, match=r"unknown placeholder\(s\) \['\{dir\}'\]"):
        apply_overrides(cfg, ["data.validation_source={dir}/test.jsonl"])


def test_gsm8k_cpu_sizes_fit_its_data():
    """The CPU sizes hold every GSM8K prompt and the rewritten solutions' usual length; one
    step's samples decode at once."""
    cfg = recipes.get("gsm8k")
    s, p = cfg.sampler, cfg.pipeline
    assert s.max_prefill_length >= 254  # the longest train prompt with the chat template
    assert s.max_prefill_length + s.max_new_tokens <= s.max_target_length
    assert s.max_new_tokens >= 229  # the rewritten solutions' 99th percentile
    assert s.max_concurrent_decodes == p.prompts_per_step * p.generations_per_prompt
    assert cfg.sft.optim.total_steps == cfg.sft.steps and cfg.mesh.colocate


def test_accelerator_sizes_apply_around_pinned_keys():
    cfg = recipes.get("gsm8k")
    big, applied = recipes.for_accelerator("gsm8k", cfg)
    flat = [item for group in recipes.ACCELERATOR_SIZES["gsm8k"] for item in group]
    assert applied == flat
    assert from_dict(RunConfig, big.to_dict()) == big  # valid
    rows = lambda c: c.pipeline.prompts_per_step * c.pipeline.generations_per_prompt  # noqa
    assert rows(big) > rows(cfg) and big.sampler.max_new_tokens > cfg.sampler.max_new_tokens
    assert (
        big.sampler.max_prefill_length + big.sampler.max_new_tokens <= big.sampler.max_target_length
    )
    assert big.sft.optim.total_steps == big.sft.steps and big.eval.num_prompts == 1319
    # A key the command line set keeps its value, and so does the rest of its group.
    pinned = apply_overrides(cfg, ["sampler.max_new_tokens=300", "sampler.max_target_length=560"])
    got, applied = recipes.for_accelerator("gsm8k", pinned, {"sampler.max_new_tokens"})
    assert (got.sampler.max_new_tokens, got.sampler.max_target_length) == (300, 560)
    assert "sampler.max_target_length=768" not in applied
    assert got.pipeline.prompts_per_step == big.pipeline.prompts_per_step
    # Recipes without accelerator sizes are unchanged.
    tb = recipes.get("testbed")
    assert recipes.for_accelerator("testbed", tb) == (tb, [])
