"""Verifiers for the CPU testbed's synthetic tasks (data/synthetic_tasks.py): exact match of the
text after the thinking block. Completions look like "<think>...</think>46"."""

from __future__ import annotations

from typing import Optional

from scalerl_jax.rewards.math_extract import strip_thinking  # no SymPy for exact match


def extract_final(completion: str, require_close: bool = False) -> Optional[str]:
    """The answer after the last </think>, whitespace-stripped; None for an unclosed thought.
    `require_close=True` also makes a completion without any thinking block answerless."""
    text = strip_thinking(completion, require_close)
    return None if text is None else text.strip()


def verify_exact(completion: str, reference: str, require_close: bool = False) -> bool:
    """Exact match after extraction: the synthetic tasks have a single canonical answer string."""
    answer = extract_final(completion, require_close)
    return answer is not None and answer != "" and answer == reference.strip()
