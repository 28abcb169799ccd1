"""Math answer verification: extract the final answer of a completion, decide equivalence.

Deny by default: an answer is compared only when every token of it is understood; text, a
relation, a subscript or a decoration that the rules below do not model makes it wrong (there
is no fallback that reads less than was written). Pipeline (`verify_math`):

1. **Extract** the final answer (`math_extract.extract_answer`): thinking stripped; the last
   \\boxed (boxes inside it flattened, so an inner box never hides the text around it; the
   boxes joined to it by "and" / commas: several boxes that state one answer); else an "answer
   is" phrase; else the last math span of the last line; else a stand-alone final number. An
   answer followed in its sentence by anything but punctuation, a unit or "is the answer"
   (`5 or 6`, `5 approximately`, `\\boxed{5} is wrong`) is no answer. Linear scans only.
2. **Limits** before any parsing (`math_limits.within_limits`): length, nesting, element count,
   power towers, huge exponents and factorials are refused as incorrect.
3. **Normalise** the LaTeX text (`math_normalize.normalize_answer`: \\dfrac, \\left, \\text,
   units, degrees, %, thousands separators, mixed numbers, repeating decimals, relation macros;
   "and" / "or" between values become list separators; `\\approx` a relation of its own).
4. **Compare** with our own rules (`math_compare.compare`); anything they cannot decide is
   wrong:
   * hedges are wrong: an answer listing alternatives ("3 or 4", `\\boxed{3}, \\boxed{4}`) does
     not match one value; a chain `a = b = c` or `a \\approx b` matches only when every value in
     it equals the reference (`2 = 3` is wrong for 3 and for 2); a relation with an empty side
     (`\\approx 5`) is wrong; two numbers side by side are no product (`2 \\quad 3` is not 6);
   * multiple-choice letters (one letter, no second choice; text after it must be a value);
     matrices; inequalities (operators must match: `x<2` is not `x \\le 2`); equations
     (`2x+4y=3` equals `y = -x/2 + 3/4`: proportional sides); unions of intervals; named values
     (`a_3 = 2, a_{37} = 19`, any order, names must agree); sets and bare solution lists (any
     order, repeats ignored), tuples and intervals (in order, bracket types must match; a set
     is never a tuple); numbers in a base (`1010_2`: compared as base-2 numerals);
   * scalars through `sympy_safe.parse_math` (a whitelist grammar; it never executes model text)
     with the number rules of `math_numbers`: an exact reference is matched only by an answer
     proved equal to it (exact arithmetic, or SymPy simplification of the difference to 0
     under the size screen `math_limits.symbolic_ok`), never by one that is merely close.

References go through the same steps; a reference that is a worked solution is its last group
of boxes. `reference_problem` says why a reference cannot be compared (and `check_reference`
raises it at load time): for every other reference, its answer (`reference_answer`) equals it.

Hand-written parts: the extraction and structural rules (math-verify's are too lenient for a
reward: set vs tuple, last number of any expression, last value of a chain, hedges accepted)
and the size screens (no library bounds SymPy's work).
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
