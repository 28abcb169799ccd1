"""Held-out validation: mean@k pass rate, the y-axis of the scaling curve."""
from __future__ import annotations

import time
from typing import Any, Sequence

import numpy as np

from scalerl_jax.data.prompts import Prompt
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
             verifier: Verifier, pool: RewardPool, driver_kwargs: dict, version: int) -> dict:
    """Generate k samples per held-out prompt with `params` and score them.

    Runs a second driver on the same engine in the caller's thread (the training sampler keeps
    running); it shares the engine's compiled programs, so evaluation compiles nothing new.
    """
    start = time.monotonic()
    groups = []
    stream = [SamplerPrompt(p.prompt_id, tokenizer.encode(p.text), {"answer": p.answer})
              for p in prompts]
    driver = Driver(engine, params, stream, group_size=k, version=version,
                    on_group=groups.append, **driver_kwargs)
    driver.run()
    scored = score_groups(groups, tokenizer=tokenizer, verifier=verifier, pool=pool)
    correct = np.asarray(scored.correct, np.float32)
    return {"pass_rate": float(correct.mean()) if len(correct) else 0.0,
            "k": k, "num_prompts": len(groups), "eval_seconds": time.monotonic() - start,
            "eval_tokens": int(driver.stats["tokens"]),
            "eval_truncation_rate": driver.stats["finish_truncated"] / max(len(correct), 1)}
