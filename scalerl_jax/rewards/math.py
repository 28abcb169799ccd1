"""Math answer verification: extract the final answer of a completion, decide equivalence.

Pipeline: strip the thinking block -> extract (last \\boxed / "answer is" / last number) ->
normalise the LaTeX text (\\dfrac, \\left, units, degrees, %, "x = ", thousands separators) ->
compare: equal strings, else comma lists element-wise (ordered for tuples and intervals,
unordered for sets and bare lists), each element numerically / symbolically through
`sympy_safe.parse_math`, which never executes model text (no `eval`, `sympify`, `parse_expr`).

When the optional `math-verify` package is installed, an answer the built-in checker rejects is
given to it as well (LaTeX extraction only; its plain-expression mode uses `parse_expr`).
"""
from __future__ import annotations

import functools
import random
import re
from typing import Optional

import sympy

from scalerl_jax.rewards.sympy_safe import evaluate_complex, parse_math

MAX_ELEMENTS = 32  # comma lists longer than this are compared as strings only

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


# ----------------------------------------------------------------------------------- extraction
def strip_thinking(text: str, require_close: bool = False, open_tag: str = THINK_OPEN,
                   close_tag: str = THINK_CLOSE) -> Optional[str]:
    """The text after the last `close_tag`; None when thinking was opened but never closed (an
    unfinished thought has no final answer); the whole text when there is no thinking.
    `require_close=True` is for templates whose prompt already opens the thinking block."""
    end = text.rfind(close_tag)
    if end >= 0:
        return text[end + len(close_tag):]
    return None if require_close or open_tag in text else text


_BOX_RE = re.compile(r"\\(?:boxed|fbox)(?![a-zA-Z])\s*")
_ANSWER_RE = re.compile(r"(?:final\s+)?answer\s*(?:is|:)\s*:?", re.IGNORECASE)
_LAST_NUMBER_RE = re.compile(
    r"(?:(?<![\w)\]}])-)?(?:\\[dt]?frac\{\d+\}\{\d+\}|\d{1,3}(?:,\d{3})+(?:\.\d+)?"
    r"|\d*\.?\d+(?:/\d+)?)")
_NO_BOX = object()


def _braced(text: str, start: int) -> Optional[tuple[str, int]]:
    """Content of the balanced `{...}` opening at `start`, and the index after it."""
    depth = 0
    for j in range(start, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[start + 1:j], j + 1
    return None


def last_boxed(text: str):
    """Content of the last \\boxed{...} / \\fbox{...} (inner box of nested boxes); None when the
    last box is unbalanced; `_NO_BOX` when there is none."""
    matches = list(_BOX_RE.finditer(text))
    if not matches:
        return _NO_BOX
    i = matches[-1].end()
    if i < len(text) and text[i] == "{":
        got = _braced(text, i)
        if got is None:
            return None
        content = got[0]
    else:  # "\boxed 5"
        m = re.match(r"[^\s$]+", text[i:])
        if m is None:
            return None
        content = m.group(0)
    inner = last_boxed(content)
    return content if inner is _NO_BOX else inner


def _after_answer_phrase(text: str) -> Optional[str]:
    matches = list(_ANSWER_RE.finditer(text))
    if not matches:
        return None
    rest = text[matches[-1].end():].strip().lstrip("*").strip()
    dollars = re.match(r"\$+([^$]+)\$+", rest)
    if dollars:
        return dollars.group(1).strip()
    rest = rest.split("\n", 1)[0]
    rest = re.split(r"\.(?:\s|$)", rest, maxsplit=1)[0]
    return rest.strip().strip("*").strip() or None


def extract_answer(completion: str, require_close: bool = False) -> Optional[str]:
    """The final answer of a completion, or None. Order: strip thinking, last \\boxed/\\fbox,
    the last "answer is ..." / "Answer: ...", the last number (or a/b, \\frac{a}{b})."""
    text = strip_thinking(completion, require_close)
    if text is None:
        return None
    boxed = last_boxed(text)
    if boxed is not _NO_BOX:
        return boxed.strip() if boxed is not None and boxed.strip() else None
    phrase = _after_answer_phrase(text)
    if phrase:
        return phrase
    numbers = _LAST_NUMBER_RE.findall(text)
    return numbers[-1] if numbers else None


# -------------------------------------------------------------------------------- normalisation
_TEXT_CMD_RE = re.compile(r"\\(?:text|textbf|textit|textrm|mathrm|mathbf|mbox|operatorname)"
                          r"\s*\{([^{}]*)\}")
_UNIT_WORDS = (r"(?:sq(?:uare)?\.?\s*|cubic\s*)?(?:cm|mm|km|meters?|metres?|inch(?:es)?|feet|foot"
               r"|ft|yards?|miles?|units?|degrees?|dollars?|cents?|hours?|hrs?|minutes?|mins?"
               r"|seconds?|secs?|days?|weeks?|months?|years?|grams?|kg|mg|pounds?|lbs?|mph|kmh"
               r"|liters?|litres?|ml|people|students|ways|points?|times)")
_UNIT_RE = re.compile(r"(?<=[\d}).])\s*(?:" + _UNIT_WORDS + r"|\s(?:m|g|s|in|l))"
                      r"(?:\^\{?[23]\}?|[23])?\s*$")
_VAR_EQ_RE = re.compile(r"^\s*[a-zA-Z](?:_\{?\w+\}?)?\s*=(?!=)\s*")
_THOUSANDS_RE = re.compile(r"^-?\d{1,3}(?:,\d{3})+(?:\.\d+)?$")


def normalize_answer(s: str) -> str:
    """Canonical text form of an answer: LaTeX decoration, units, '$', trailing '.' removed."""
    s = s.strip()
    boxed = last_boxed(s)
    if boxed is not _NO_BOX and boxed is not None and s.startswith("\\"):
        s = boxed
    for left, right in (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
        if s.startswith(left) and s.endswith(right) and len(s) > len(left) + len(right):
            s = s[len(left):-len(right)].strip()
    for _ in range(3):
        s = _TEXT_CMD_RE.sub(r"\1", s)
    s = re.sub(r"\\(?:left|right|bigl|bigr|Bigl|Bigr|big|Big|displaystyle)(?![a-zA-Z])", "", s)
    s = re.sub(r"(?<=\d)\\,(?=\d{3})", "", s)  # "1\,000"
    s = re.sub(r"\\[,;:! ]|~", " ", s).replace("{,}", ",")
    s = re.sub(r"\\[dt]frac(?![a-zA-Z])", r"\\frac", s)
    s = re.sub(r"\\frac(\d)(\d)", r"\\frac{\1}{\2}", s)
    s = re.sub(r"\\sqrt(\d)", r"\\sqrt{\1}", s)
    s = re.sub(r"\\(?:cdot|times)(?![a-zA-Z])", "*", s)
    s = re.sub(r"\\div(?![a-zA-Z])", "/", s)
    s = re.sub(r"\^\s*\{?\s*\\circ\s*\}?|\\circ(?![a-zA-Z])|°", "", s)
    s = s.replace("\\%", "%").replace("\\$", "").replace("$", "")
    s = s.strip().rstrip(".").strip()
    s = _UNIT_RE.sub("", s).strip()
    s = _VAR_EQ_RE.sub("", s, count=1) if s.count("=") == 1 else s
    if _THOUSANDS_RE.match(s):
        s = s.replace(",", "")
    m = re.fullmatch(r"\(\s*([A-Za-z])\s*\)", s)  # multiple choice "(B)"
    if m:
        s = m.group(1)
    while s.startswith("{") and s.endswith("}") and _braced(s, 0) == (s[1:-1], len(s)):
        s = s[1:-1].strip()
    return re.sub(r"\s+", " ", s).strip()


# --------------------------------------------------------------------------------- equivalence
def _numeric(expr, env: Optional[dict] = None) -> Optional[complex]:
    try:
        return evaluate_complex(expr, env)
    except (ArithmeticError, ValueError, TypeError):
        return None


def _close(a: complex, b: complex, rel: float) -> bool:
    return abs(a - b) <= rel * max(1.0, abs(a), abs(b))


def _decimals(s: str) -> int:
    m = re.fullmatch(r"-?\d*\.(\d+)", s)
    return len(m.group(1)) if m else 0


def _values_equal(p, g, p_text: str, g_text: str) -> bool:
    if p.free_symbols != g.free_symbols:
        return False
    if not p.free_symbols:
        if p == g:
            return True
        decimal = "." in p_text + g_text
        if p.is_Rational and g.is_Rational and not decimal:
            return False  # exact numbers: no tolerance (10^12 and 10^12 + 1 differ)
        pv, gv = _numeric(p), _numeric(g)
        if pv is None or gv is None:
            return False
        if decimal:  # a decimal literal is an approximation
            if _close(pv, gv, 1e-6):
                return True
            # A gold answer given as a rounded decimal accepts an exact form that rounds to it.
            k = _decimals(g_text)
            return k >= 2 and "." not in p_text and abs(pv - gv) <= 0.5 * 10.0 ** -k
        if not _close(pv, gv, 1e-12):
            return False
        # Exact forms (radicals, pi, logs) that agree to double precision: confirm with evalf,
        # which handles cancellation (10^20 + sqrt(2) vs 10^20). Safe now: the double-precision
        # pass bounded every intermediate value.
        try:
            # Unevaluated: an evaluated p - g would re-run SymPy's power simplification.
            diff = complex(sympy.Add(p, sympy.Mul(-1, g, evaluate=False), evaluate=False)
                           .evalf(30))
        except (ArithmeticError, ValueError, TypeError):
            return False
        return abs(diff) <= 1e-25 * max(1.0, abs(pv), abs(gv))
    # Identity testing at random points: deterministic seed, bounded work.
    rng = random.Random(20251013)
    symbols = sorted(p.free_symbols, key=str)
    agreed = 0
    for _ in range(8):
        point = {s: rng.uniform(0.5, 3.5) for s in symbols}
        pv, gv = _numeric(p, point), _numeric(g, point)
        if pv is None or gv is None:
            continue
        if not _close(pv, gv, 1e-9):
            return False
        agreed += 1
        if agreed == 3:
            return True
    return False


def _percent(expr):
    return sympy.Mul(expr, sympy.Rational(1, 100), evaluate=expr.is_Rational)


def _scalar_equal(p: str, g: str) -> bool:
    if p == g:
        return True
    if re.fullmatch(r"[A-Za-z ]{2,}", p) and re.fullmatch(r"[A-Za-z ]{2,}", g):
        return p.casefold() == g.casefold()
    p_pct, g_pct = p.endswith("%"), g.endswith("%")
    p, g = p.rstrip("%").strip(), g.rstrip("%").strip()
    pe, ge = parse_math(p), parse_math(g)
    if pe is None or ge is None:
        return p == g
    # "50%" matches both 50 and 0.5 on the other side.
    p_options = [pe] + ([_percent(pe)] if p_pct else [])
    g_options = [ge] + ([_percent(ge)] if g_pct else [])
    return any(_values_equal(a, b, p, g) for a in p_options for b in g_options)


def _split_top_level(s: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for j, ch in enumerate(s):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(s[start:j])
            start = j + 1
    parts.append(s[start:])
    return [_VAR_EQ_RE.sub("", x.strip(), count=1).strip() for x in parts]


def _collection(s: str) -> tuple[str, list[str]]:
    """('set' | 'bare' | opening+closing bracket, elements); 'scalar' when not a list."""
    if s.startswith("\\{") and s.endswith("\\}"):
        return "set", _split_top_level(s[2:-2])
    if len(s) >= 2 and s[0] in "([" and s[-1] in ")]":
        inner = s[1:-1]
        if "," in inner and all(x for x in _split_top_level(inner)) and _balanced(inner):
            return s[0] + s[-1], _split_top_level(inner)
    if "\\pm" in s and s.count("\\pm") == 1:
        return "set", [s.replace("\\pm", "+"), s.replace("\\pm", "-")]
    parts = _split_top_level(s)
    return ("bare", parts) if len(parts) > 1 else ("scalar", [s])


def _balanced(s: str) -> bool:
    depth = 0
    for ch in s:
        depth += ch in "([{"
        depth -= ch in ")]}"
        if depth < 0:
            return False
    return depth == 0


def _math_verify_equal(pred: str, gold: str) -> bool:
    mv = _math_verify_module()
    if mv is None:
        return False
    try:
        config = [mv.LatexExtractionConfig()]
        parsed_gold = mv.parse(f"${gold}$", extraction_config=config, parsing_timeout=None)
        parsed_pred = mv.parse(f"${pred}$", extraction_config=config, parsing_timeout=None)
        return bool(mv.verify(parsed_gold, parsed_pred, timeout_seconds=None))
    except Exception:  # a third-party failure must not fail the reward
        return False


@functools.lru_cache(maxsize=1)
def _math_verify_module():
    try:
        import math_verify  # optional: pip install math-verify
    except ImportError:
        return None
    return math_verify


def is_equivalent(pred: Optional[str], gold: str) -> bool:
    """Whether an extracted answer equals the reference answer. Never raises."""
    if pred is None or not pred.strip() or not gold.strip():
        return False
    try:
        p, g = normalize_answer(pred), normalize_answer(gold)
        if p and (p == g or p.replace(" ", "") == g.replace(" ", "")):
            return True
        p_kind, p_items = _collection(p)
        g_kind, g_items = _collection(g)
        if max(len(p_items), len(g_items)) <= MAX_ELEMENTS and len(p_items) == len(g_items):
            if {p_kind, g_kind} <= {"set", "bare"}:
                remaining = list(g_items)
                for item in p_items:
                    hit = next((j for j, x in enumerate(remaining) if _scalar_equal(item, x)), None)
                    if hit is None:
                        break
                    remaining.pop(hit)
                else:
                    return True
            elif p_kind == g_kind and all(_scalar_equal(a, b) for a, b in zip(p_items, g_items)):
                return True
    except Exception:  # a verifier bug scores as incorrect rather than crashing the batch
        pass
    return _math_verify_equal(pred, gold)


def verify_math(completion: str, reference: str, require_close: bool = False) -> bool:
    """Extract the final answer of `completion` and compare it with `reference`."""
    return is_equivalent(extract_answer(completion, require_close), reference)


def to_reward(correct: bool, reward_correct: float = 1.0, reward_incorrect: float = -1.0) -> float:
    """Paper: +-1 (LossConfig.reward_correct / reward_incorrect); 0/1 is the other common choice."""
    return reward_correct if correct else reward_incorrect
