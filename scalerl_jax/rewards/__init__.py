"""Rewards: answer verifiers (math, synthetic testbed tasks) and the host scoring pool."""
from scalerl_jax.rewards.math import (extract_answer, is_equivalent, normalize_answer, parse_math,
                                      strip_thinking, to_reward, verify_math)
from scalerl_jax.rewards.pool import RewardPool, ScoreResult, Verifier
from scalerl_jax.rewards.synthetic import extract_final, verify_exact


def verifier_for_source(source: str) -> Verifier:
    """The verifier for a DataConfig.source: exact match for `synthetic:` tasks, else math."""
    return verify_exact if source.startswith("synthetic:") else verify_math


__all__ = ["extract_answer", "extract_final", "is_equivalent", "normalize_answer", "parse_math",
           "strip_thinking", "to_reward", "verify_exact", "verify_math", "verifier_for_source",
           "RewardPool", "ScoreResult", "Verifier"]
