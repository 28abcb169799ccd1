"""Rewards: answer verifiers (math, synthetic testbed tasks) and the host scoring pool."""
import importlib
from typing import Optional

from scalerl_jax.config import ConfigError
from scalerl_jax.rewards.math import (extract_answer, is_equivalent, normalize_answer, parse_math,
                                      strip_thinking, to_reward, verify_math)
from scalerl_jax.rewards.pool import RewardPool, ScoreResult, Verifier
from scalerl_jax.rewards.synthetic import extract_final, verify_exact


def verifier_for_source(source: str, custom: Optional[str] = None) -> Verifier:
    """The verifier for a DataConfig.source: exact match for `synthetic:` tasks, else math; or
    `custom`, a "package.module:function" taking (completion text, reference answer) and
    returning a bool (RewardConfig.verifier)."""
    if custom is None:
        return verify_exact if source.startswith("synthetic:") else verify_math
    module_name, _, name = custom.partition(":")
    try:
        fn = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError) as e:
        raise ConfigError(f"RewardConfig.verifier={custom!r}: cannot import it ({e})") from None
    if not callable(fn):
        raise ConfigError(f"RewardConfig.verifier={custom!r} is not callable")
    return fn


__all__ = ["extract_answer", "extract_final", "is_equivalent", "normalize_answer", "parse_math",
           "strip_thinking", "to_reward", "verify_exact", "verify_math", "verifier_for_source",
           "RewardPool", "ScoreResult", "Verifier"]
