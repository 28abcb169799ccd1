"""Held-out validation: mean@k pass rate, the y-axis of the scaling curve."""
from __future__ import annotations

import time
from typing import Any, Sequence

import numpy as np

from scalerl_jax.data.prompts import Prompt
from scalerl_jax.multihost import allgather_objects
from scalerl_jax.rewards.pool import RewardPool, ScoreResult, Verifier
from scalerl_jax.sampler.driver import Driver, Prompt as SamplerPrompt
from scalerl_jax.sampler.types import Group


def score_groups(groups: Sequence[Group], *, tokenizer: Any, verifier: Verifier,
                 pool: RewardPool) -> ScoreResult:
    """Verify every completion of `groups` against its group's reference answer, in order."""
    items = [(tokenizer.decode(c.tokens, skip_special_tokens=True), g.metadata["answer"])
             for g in groups for c in g.completions]
    return pool.score(verifier, items)


def evaluate(engine, params, prompts: Sequence[Prompt], *, tokenizer: Any, k: int,
             verifier: Verifier, pool: RewardPool, driver_kwargs: dict, version: int,
             seed: int = 0) -> dict:
    """Generate k samples per held-out prompt with `params` and score them.

    Runs a second driver on the same engine in the caller's thread (the training sampler keeps
    running); it shares the engine's compiled programs, so evaluation compiles nothing new.
    Sample j of prompt i is seeded by (seed, i, j): every evaluation of a run draws the same
    random numbers, so the differences between its points come from the policy, not the dice.

    Multi-process: each process passes its own share of the prompts (e.g.
    `PromptSource.validation(shard=True)`); the counts are summed over processes, so every
    process returns the same figures for the whole validation set.
    """
    start = time.monotonic()
    groups: list[Group] = []
    stream = [SamplerPrompt(p.prompt_id, tokenizer.encode(p.text), {"answer": p.answer}, i)
              for i, p in enumerate(prompts)]
    driver = Driver(engine, params, stream, group_size=k, version=version, seed=seed,
                    on_group=groups.append, **driver_kwargs)
    driver.run()
    scored = score_groups(groups, tokenizer=tokenizer, verifier=verifier, pool=pool)
    per_prompt = np.asarray(scored.correct, np.float64).reshape(len(groups), k).mean(axis=1)
    local = (per_prompt, int(driver.stats["tokens"]), int(driver.stats["finish_truncated"]),
             int(driver.stats["interrupted"]))
    shared = allgather_objects(local)
    per_prompt = np.concatenate([part[0] for part in shared])
    tokens, truncated, interrupted = (sum(part[i] for part in shared) for i in (1, 2, 3))
    samples = max(per_prompt.size * k, 1)
    # Prompts are the independent units (a prompt's k samples share its difficulty), so the
    # standard error comes from the spread of the per-prompt pass rates.
    se = float(per_prompt.std(ddof=1) / np.sqrt(per_prompt.size)) if per_prompt.size > 1 else None
    return {"pass_rate": float(per_prompt.mean()) if per_prompt.size else 0.0,
            "pass_rate_se": se, "k": k, "num_prompts": int(per_prompt.size),
            "eval_seconds": time.monotonic() - start, "eval_tokens": tokens,
            "eval_truncation_rate": truncated / samples,
            "eval_interruption_rate": interrupted / samples}
