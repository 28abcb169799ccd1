"""Math answer verification: extract the final answer of a completion, decide equivalence.

Deny by default: an answer is compared only when every token of it is understood. `verify_math`
extracts (`math_extract`), screens sizes before any parsing (`math_limits`), normalises the
LaTeX (`math_normalize`) and compares with our own rules (`math_compare`, scalars through
`sympy_safe` and `math_numbers`); anything they cannot decide is wrong. References go through
the same steps (`reference_problem`, `check_reference`). The rules: docs/rewards.md; they are
hand-written because math-verify's are too lenient for a reward (set vs tuple, last number of
any expression, hedges accepted) and no library bounds SymPy's work.
"""

from __future__ import annotations

import re
from typing import Optional

from scalerl_jax.rewards.math_compare import MAX_COMPARE_DEPTH, collection, compare
from scalerl_jax.rewards.math_extract import (
    MAX_COMPLETION_CHARS,
    THINK_CLOSE,
    THINK_OPEN,
    extract_answer,
    final_boxed,
    flatten_boxes,
    last_boxed,
    strip_thinking,
)
from scalerl_jax.rewards.math_limits import MAX_ANSWER_CHARS, within_limits
from scalerl_jax.rewards.math_normalize import TEXT_CMD_RE, normalize_answer
from scalerl_jax.rewards.sympy_safe import parse_math

__all__ = [
    "MAX_ANSWER_CHARS",
    "MAX_COMPARE_DEPTH",
    "MAX_COMPLETION_CHARS",
    "THINK_CLOSE",
    "THINK_OPEN",
    "check_reference",
    "extract_answer",
    "is_equivalent",
    "last_boxed",
    "normalize_answer",
    "parse_math",
    "reference_answer",
    "reference_problem",
    "strip_thinking",
    "to_reward",
    "verify_math",
    "within_limits",
]


_ALTERNATIVES_RE = re.compile(r"(?<![A-Za-z\\])(?:or|and)(?![A-Za-z])")


def reference_answer(gold: str) -> Optional[str]:
    """The answer a reference states: a worked solution's last group of boxes, else the text;
    None when that box is unclosed or empty."""
    if "\\boxed" not in gold and "\\fbox" not in gold:
        return gold
    got = final_boxed(gold)
    return got if isinstance(got, str) else None


def _equivalent(pred: str, gold: str) -> bool:
    if not pred.strip() or not gold.strip():
        return False
    if not (within_limits(pred) and within_limits(gold)):
        return False
    try:
        p, g = normalize_answer(pred), normalize_answer(gold)
        if not p or not g:
            return False
        if _ALTERNATIVES_RE.search(TEXT_CMD_RE.sub(r" \1 ", pred)) and collection(g)[0] == "scalar":
            return False  # "4 (or 3)": alternatives, wherever they stand, for one value
        return compare(p, g) is True
    except Exception:  # deny by default: a failure of our rules is no match, never an error
        return False


def is_equivalent(pred: Optional[str], gold: str) -> bool:
    """Whether an extracted answer equals the reference answer (None: undecided is False).
    Boxes left in `pred` count as their content. Never raises."""
    answer = reference_answer(gold)
    if pred is None or answer is None:
        return False
    return _equivalent(flatten_boxes(pred), answer)


def reference_problem(gold: str) -> Optional[str]:
    """Why `gold` cannot be a reference answer, or None: then its answer equals it
    (`is_equivalent(reference_answer(gold), gold)`; for a gold without boxes, that is
    `is_equivalent(gold, gold)`)."""
    if not isinstance(gold, str) or not gold.strip():
        return "the reference answer is empty"
    answer = reference_answer(gold)
    if answer is None:
        return "the reference's last \\boxed{ is not closed, or is empty"
    if not within_limits(answer):
        return "the reference answer is beyond the size limits (math_limits.within_limits)"
    if not normalize_answer(answer):
        return "nothing is left of the reference answer once normalised"
    if not is_equivalent(answer, gold):
        return "the comparator cannot read the reference answer (it matches nothing)"
    return None


def check_reference(gold: str) -> None:
    """Raise ValueError saying why `gold` cannot be compared (a load-time check of data rows)."""
    problem = reference_problem(gold)
    if problem is not None:
        raise ValueError(problem)


def verify_math(completion: str, reference: str, require_close: bool = False) -> bool:
    """Extract the final answer of `completion` and compare it with `reference`."""
    return is_equivalent(extract_answer(completion, require_close), reference)


def to_reward(correct: bool, reward_correct: float = 1.0, reward_incorrect: float = -1.0) -> float:
    """Paper: +-1 (LossConfig.reward_correct / reward_incorrect); 0/1 is the other common choice."""
    return reward_correct if correct else reward_incorrect
