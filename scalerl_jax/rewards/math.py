"""Math answer verification: extract the final answer of a completion, decide equivalence.

Pipeline (`verify_math`):

1. **Extract** the final answer (`math_extract.extract_answer`): thinking stripped; the last
   \\boxed (with the boxes joined to it by "and" / commas: several boxes that state one answer);
   else an "answer is" phrase; else the last math span of the last line; else a stand-alone
   final number. Linear scans only.
2. **Limits** before any parsing (`math_limits.within_limits`): length, nesting, element count,
   power towers, huge exponents and factorials are refused as incorrect.
3. **Normalise** the LaTeX text (`math_normalize.normalize_answer`: \\dfrac, \\left, \\text,
   units, degrees, %, thousands separators, mixed numbers, repeating decimals, relation macros;
   "and" / "or" between values become list separators; `\\approx` a relation of its own).
4. **Compare** with our own rules (`math_compare.compare`), which give a definite verdict where
   they can:
   * hedges are wrong: an answer listing alternatives ("3 or 4", `\\boxed{3}, \\boxed{4}`) does
     not match one value; a chain `a = b = c` or `a \\approx b` matches only when every value in
     it equals the reference (`2 = 3` is wrong for 3 and for 2); two numbers side by side are
     no product (`2 \\quad 3` is not 6);
   * multiple-choice letters (one letter, no second choice); matrices; inequalities (operators
     must match: `x<2` is not `x \\le 2`); equations (`2x+4y=3` equals `y = -x/2 + 3/4`:
     proportional sides); unions of intervals; named values (`a_3 = 2, a_{37} = 19`, any
     order, names must agree); sets and bare solution lists (any order, repeats ignored),
     tuples and intervals (in order, bracket types must match; a set is never a tuple);
   * scalars numerically / symbolically through `sympy_safe.parse_math`, which never executes
     model text, with the number rules of `math_numbers`.
5. **math-verify** decides only what these rules leave undecided (expressions outside the
   whitelist grammar), and only for answers that pass `math_limits.symbolic_ok` (its
   simplification expands and cancels: `\\frac{a^{9999}-b^{9999}}{a-b}` would take a minute and
   gigabytes). Its plain-expression mode (ExprExtractionConfig) calls `parse_expr`, i.e. `eval`,
   and is never used; its LaTeX path turns the numerals of its grammar into `sympy.Number(text)`,
   which parses a string of digits.

Hand-written parts: the extraction and structural rules (math-verify's are too lenient for a
reward: set vs tuple, last number of any expression, last value of a chain, hedges accepted)
and the size screens (no library bounds SymPy's work).
"""

from __future__ import annotations

import logging
import re
from typing import Optional

import math_verify

from scalerl_jax.rewards.math_compare import MAX_COMPARE_DEPTH, collection, compare
from scalerl_jax.rewards.math_extract import (
    MAX_COMPLETION_CHARS,
    THINK_CLOSE,
    THINK_OPEN,
    extract_answer,
    last_boxed,
    strip_thinking,
)
from scalerl_jax.rewards.math_limits import MAX_ANSWER_CHARS, symbolic_ok, within_limits
from scalerl_jax.rewards.math_normalize import TEXT_CMD_RE, normalize_answer
from scalerl_jax.rewards.sympy_safe import parse_math

__all__ = [
    "MAX_ANSWER_CHARS",
    "MAX_COMPARE_DEPTH",
    "MAX_COMPLETION_CHARS",
    "THINK_CLOSE",
    "THINK_OPEN",
    "extract_answer",
    "is_equivalent",
    "last_boxed",
    "normalize_answer",
    "parse_math",
    "strip_thinking",
    "to_reward",
    "verify_math",
    "within_limits",
]


class _QuietTimeoutWarning(logging.Filter):
    """math-verify warns once per process that its signal-based timeout is off; the reward pool
    enforces the limit (child processes), so the warning is noise in every worker's log."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Timeout is disabled" not in record.getMessage()


for _name in ("math_verify.parser", "math_verify.grader"):
    logging.getLogger(_name).addFilter(_QuietTimeoutWarning())
_MV_CONFIG = (math_verify.LatexExtractionConfig(),)


def _math_verify_equal(pred: str, gold: str) -> bool:
    """math-verify's verdict, LaTeX extraction only (no plain-expression `parse_expr`). Its
    signal-based timeouts are off (they need the main thread); the pool bounds the time."""
    try:
        parsed_gold = math_verify.parse(
            f"${gold}$", extraction_config=_MV_CONFIG, parsing_timeout=None
        )
        parsed_pred = math_verify.parse(
            f"${pred}$", extraction_config=_MV_CONFIG, parsing_timeout=None
        )
        if not parsed_gold or not parsed_pred:
            return False
        return bool(math_verify.verify(parsed_gold, parsed_pred, timeout_seconds=None))
    except Exception:  # a third-party failure must not fail the reward
        return False


_ALTERNATIVES_RE = re.compile(r"(?<![A-Za-z\\])(?:or|and)(?![A-Za-z])")


def is_equivalent(pred: Optional[str], gold: str) -> bool:
    """Whether an extracted answer equals the reference answer. Never raises."""
    if pred is None or not pred.strip() or not gold.strip():
        return False
    if not (within_limits(pred) and within_limits(gold)):
        return False
    try:
        p, g = normalize_answer(pred), normalize_answer(gold)
        if _ALTERNATIVES_RE.search(TEXT_CMD_RE.sub(r" \1 ", pred)) and collection(g)[0] == "scalar":
            return False  # "4 (or 3)": alternatives, wherever they stand, for one value
        verdict = compare(p, g) if p and g else False
    except Exception:  # a bug in our rules: let math-verify decide rather than fail the batch
        verdict = None
    if verdict is not None:
        return verdict
    if not (symbolic_ok(pred) and symbolic_ok(gold)):
        return False  # too large for symbolic algebra, and undecided by evaluation
    return _math_verify_equal(pred, gold)


def verify_math(completion: str, reference: str, require_close: bool = False) -> bool:
    """Extract the final answer of `completion` and compare it with `reference`."""
    return is_equivalent(extract_answer(completion, require_close), reference)


def to_reward(correct: bool, reward_correct: float = 1.0, reward_incorrect: float = -1.0) -> float:
    """Paper: +-1 (LossConfig.reward_correct / reward_incorrect); 0/1 is the other common choice."""
    return reward_correct if correct else reward_incorrect
