"""Math answer verification: extract the final answer of a completion, decide equivalence.

Pipeline (`verify_math`):

1. **Extract** the final answer (`math_extract.extract_answer`): thinking stripped; the last
   \\boxed (with the boxes joined to it by "and" / commas: several boxes that state one answer);
   else an "answer is" phrase; else the last math span of the last line; else a stand-alone
   final number. Linear scans only.
2. **Limits** before any parsing (`math_limits.within_limits`): length, nesting, element count,
   power towers, huge exponents and factorials are refused as incorrect.
3. **Normalise** the LaTeX text (\\dfrac, \\left, \\text, units, degrees, %, thousands
   separators, mixed numbers, repeating decimals, relation macros; "and" / "or" between values
   become list separators; `\\approx` a relation of its own).
4. **Compare** with our own rules, which give a definite verdict where they can:
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
     model text, with the number rules below.
5. **math-verify** decides only what these rules leave undecided (expressions outside the
   whitelist grammar), and only for answers that pass `math_limits.symbolic_ok` (its
   simplification expands and cancels: `\\frac{a^{9999}-b^{9999}}{a-b}` would take a minute and
   gigabytes). Its plain-expression mode (ExprExtractionConfig) calls `parse_expr`, i.e. `eval`,
   and is never used; its LaTeX path turns the numerals of its grammar into `sympy.Number(text)`,
   which parses a string of digits.

Number rules: an exact reference (no decimal point) is matched exactly when it has a finite
decimal form (an integer, 1/8, also written as \\sqrt{4}): `1000000.0` matches 1000000;
`1000000.9`, `123456800.0` and `1.8446744e19` (for 2^64) do not. A reference without one (1/3,
\\pi) accepts a decimal within 1e-6 relative. A decimal reference is itself an approximation: a
prediction within 1e-6 relative matches, and a reference rounded to k >= 2 decimals accepts a
value that rounds to it (the exact form or a longer decimal). Tolerances are relative, never an
absolute floor: 0 matches only 0, and 0.0 is not 10^-7. A percentage matches its number and its
fraction (`12\\%` = 12 = 0.12, as in the MATH data where both forms occur); degrees and units are
dropped (`90^\\circ` = 90); a decimal comma matches the decimal point when it is no thousands
group (`1,22` = 1.22).

Hand-written parts: the extraction and structural rules (math-verify's are too lenient for a
reward: set vs tuple, last number of any expression, last value of a chain, hedges accepted)
and the size screens (no library bounds SymPy's work).
"""
from __future__ import annotations

import cmath
import logging
import random
import re
from fractions import Fraction
from typing import Optional

import math_verify
import sympy

from scalerl_jax.rewards.math_extract import (MAX_COMPLETION_CHARS, NO_BOX, THINK_CLOSE,
                                              THINK_OPEN, braced, extract_answer, last_boxed,
                                              strip_thinking)
from scalerl_jax.rewards.math_limits import (MAX_ANSWER_CHARS, symbolic_ok, within_limits)
from scalerl_jax.rewards.sympy_safe import evaluate_complex, parse_math

MAX_COMPARE_DEPTH = 4  # nested structures compared element-wise (a list of tuples of values)

__all__ = ["MAX_ANSWER_CHARS", "MAX_COMPLETION_CHARS", "THINK_CLOSE", "THINK_OPEN",
           "extract_answer", "is_equivalent", "last_boxed", "normalize_answer", "parse_math",
           "strip_thinking", "to_reward", "verify_math", "within_limits"]

# -------------------------------------------------------------------------------- normalisation
_TEXT_CMD_RE = re.compile(r"\\(?:text|textbf|textit|textrm|textnormal|mathrm|mathbf|mathit|mbox"
                          r"|operatorname)\s*\{([^{}]*)\}")
_UNIT_WORDS = (r"(?:sq(?:uare)?\.?\s*|cubic\s*)?(?:cm|mm|km|meters?|metres?|inch(?:es)?|feet|foot"
               r"|ft|yards?|miles?|units?|degrees?|dollars?|cents?|hours?|hrs?|minutes?|mins?"
               r"|seconds?|secs?|days?|weeks?|months?|years?|grams?|kg|mg|pounds?|lbs?|mph|kmh"
               r"|liters?|litres?|ml|people|students|ways|points?|times|m/s|km/h|yuan|euros?)")
_UNIT_RE = re.compile(r"(?<=[\d}).])\s*(?:" + _UNIT_WORDS + r"|\s(?:m|g|s|in|l)|m²|€|£)"
                      r"(?:\^\{?[23]\}?|[23])?\s*$")
_NAME = r"[a-zA-Z](?:_\{?\w+\}?)?"
_NAME_EQ_RE = re.compile(r"^\s*(" + _NAME + r")\s*=(?!=)\s*")
_TUPLE_NAMES_RE = re.compile(r"^\s*\(\s*" + _NAME + r"(?:\s*,\s*" + _NAME + r")+\s*\)\s*=(?!=)\s*")
_IN_RE = re.compile(r"^\s*" + _NAME + r"\s*\\in\s+")
_THOUSANDS_RE = re.compile(r"^-?[1-9]\d{0,2}(?:,\d{3})+(?:\.\d+)?$")
_SPACE_THOUSANDS_RE = re.compile(r"(?<![\d.,])([1-9]\d{0,2})((?: \d{3})+)(?![\d.,])")
_MIXED_RE = re.compile(r"(-?)(\d{1,6})\s*\\frac\{(\d{1,6})\}\{(\d{1,6})\}")
_REPEATING_RE = re.compile(r"(-?\d{0,12})\.(\d{0,12})\\overline\{(\d{1,12})\}")
_WIDE_SPACE = "\u2003"  # \quad, \;, ~: spacing that never groups digits (collapsed at the end)
_WRAPPED_MATRIX_RE = re.compile(r"^[(\[]\s*(\\begin\{([pbBvV]?matrix|array)\}.*\\end\{\2\})"
                                r"\s*[)\]]$", re.DOTALL)
_RELATIONS = (("\\leqslant", "\\le"), ("\\geqslant", "\\ge"), ("\\leq", "\\le"), ("\\geq", "\\ge"),
              ("\\neq", "\\ne"), ("<=", "\\le"), (">=", "\\ge"), ("!=", "\\ne"), ("≤", "\\le"),
              ("≥", "\\ge"), ("≠", "\\ne"), ("\\lt", "<"), ("\\gt", ">"), ("==", "="),
              ("\\approx", "≈"), ("\\simeq", "≈"), ("\\doteq", "≈"))


def _repeating(whole: str, fixed: str, period: str) -> str:
    """The fraction of a repeating decimal: 0.1\\overline{6} -> \\frac{15}{90}."""
    sign, whole = ("-", whole[1:]) if whole.startswith("-") else ("", whole)
    den = (10 ** len(period) - 1) * 10 ** len(fixed)
    num = int(whole or 0) * den + int(fixed + period) - int(fixed or 0)
    return f"{sign}\\frac{{{num}}}{{{den}}}"


def _semicolons(s: str) -> str:
    """Semicolons separate like commas: "(3; 4; 5)", "-12;-11". Between groups that contain
    commas they separate tuples: "p=5,q=2;p=7,q=2" is (p=5,q=2), (p=7,q=2)."""
    parts = _split_top_level(s, ";")
    if len(parts) > 1 and any(len(_split_top_level(x)) > 1 for x in parts):
        return ", ".join(f"({x})" for x in parts)
    if "," not in s:
        return s.replace(";", ",")
    return re.sub(r"\(([^(),]*;[^(),]*)\)", lambda m: "(" + m.group(1).replace(";", ",") + ")", s)


def normalize_answer(s: str) -> str:
    """Canonical text form of an answer: LaTeX decoration, units, '$', trailing '.' removed."""
    s = s.strip()
    boxed = last_boxed(s)
    if boxed is not NO_BOX and boxed is not None and s.startswith("\\"):
        s = boxed
    for left, right in (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
        if s.startswith(left) and s.endswith(right) and len(s) > len(left) + len(right):
            s = s[len(left):-len(right)].strip()
    if "\\begin" not in s:  # "\\le": a line break glued to a command is that command
        s = re.sub(r"\\\\(?=[a-zA-Z])", r"\\", s)
    for _ in range(3):
        s = _TEXT_CMD_RE.sub(r"\1", s)
    s = re.sub(r"\\(?:left|right|bigl|bigr|Bigl|Bigr|big|Big|displaystyle)(?![a-zA-Z])", "", s)
    s = re.sub(r"(?<=\d)\\,(?=\d{3})", "", s)  # "1\,000"
    s = re.sub(r",\s*\\!\s*", ",", s).replace("\\!", "").replace("{,}", ",")  # 10,\!000
    s = re.sub(r"\\[;:]|~|\\q?quad|\\enspace(?![a-zA-Z])", _WIDE_SPACE, s)
    s = re.sub(r"(?<!\\)\\[, ]", " ", s)
    s = re.sub(r"\\[dtc]frac(?![a-zA-Z])", r"\\frac", s)
    s = re.sub(r"\\frac(\d)(\d)", r"\\frac{\1}{\2}", s)
    s = re.sub(r"\\sqrt(\d)", r"\\sqrt{\1}", s)
    s = re.sub(r"\\(?:cdot|times)(?![a-zA-Z])", "*", s)
    s = re.sub(r"\\div(?![a-zA-Z])", "/", s)
    s = re.sub(r"\^\s*\{?\s*\\circ\s*\}?|\\circ(?![a-zA-Z])|°", "", s)
    s = re.sub(r"\s*(?:\\%|percent(?:age)?\b|pct\b)", "%", s)
    s = s.replace("\\$", "").replace("$", "")
    for old, new in _RELATIONS:
        s = s.replace(old, new)
    s = re.sub(r"\\(le|ge|ne)(?![a-zA-Z])\s*", r"\\\1 ", s)
    # "1 or 2", "6 and 8", "19, 46, and 82": alternatives and enumerations are lists.
    s = re.sub(r"\s*(?:,\s*)?(?<![A-Za-z\\])(?:and|or)(?![A-Za-z])\s*", ", ", s)
    s = s.strip().strip(",").strip().rstrip(".").strip()
    s = _UNIT_RE.sub("", s).strip()
    m = _WRAPPED_MATRIX_RE.match(s)
    if m:  # "\left[\begin{array}...\end{array}\right]"
        s = m.group(1)
    m = _MIXED_RE.fullmatch(s)
    if m:  # "3\frac{1}{2}" is three and a half
        whole, num, den = (int(x) for x in m.group(2, 3, 4))
        s = f"{m.group(1)}\\frac{{{whole * den + num}}}{{{den}}}"
    m = _REPEATING_RE.fullmatch(s)
    if m:  # 0.1\overline{6} = 1/6
        s = _repeating(*m.groups())
    if ";" in s:
        s = _semicolons(s)
    s = _TUPLE_NAMES_RE.sub("", s, count=1)
    s = _IN_RE.sub("", s, count=1)
    if _THOUSANDS_RE.match(s):
        s = s.replace(",", "")
    s = _SPACE_THOUSANDS_RE.sub(lambda m: m.group(1) + m.group(2).replace(" ", ""), s)
    while s.startswith("{") and s.endswith("}") and braced(s, 0) == (s[1:-1], len(s)):
        s = s[1:-1].strip()
    return re.sub(r"\s+", " ", s).strip()


# ------------------------------------------------------------------------------------- numbers
def _value(expr, env: Optional[dict] = None) -> Optional[complex]:
    try:
        return evaluate_complex(expr, env)
    except (ArithmeticError, ValueError, TypeError):
        return None


def _relative(a: complex, b: complex, rel: float) -> bool:
    """|a - b| within `rel` of the larger magnitude: no absolute floor, so 0 matches only 0."""
    return abs(a - b) <= rel * max(abs(a), abs(b))


def _decimals(s: str) -> int:
    m = re.fullmatch(r"-?\d*\.(\d+)", s)
    return len(m.group(1)) if m else 0


def _finite_decimal(q: sympy.Rational) -> bool:
    """Whether q has a finite decimal expansion (its denominator is 2^a 5^b)."""
    d = int(q.q)
    for f in (2, 5):
        while d % f == 0:
            d //= f
    return d == 1


def _exact_forms_equal(p, g, pv: complex, gv: complex) -> bool:
    """Exact forms (radicals, pi, logs) that agree to double precision, confirmed with evalf at
    30 digits, which handles cancellation (10^20 + sqrt(2) vs 10^20). Safe: the
    double-precision pass bounded every intermediate value."""
    if not (_relative(pv, gv, 1e-12) or max(abs(pv), abs(gv)) < 1e-12):
        return False
    try:
        # Unevaluated: an evaluated p - g would re-run SymPy's power simplification.
        diff = complex(sympy.Add(p, sympy.Mul(-1, g, evaluate=False), evaluate=False).evalf(30))
    except (ArithmeticError, ValueError, TypeError):
        return False
    # An exact zero evaluates to ~1e-150 at this precision; a true difference does not.
    return abs(diff) <= 1e-25 * max(abs(pv), abs(gv)) or abs(diff) < 1e-100


def _numbers_equal(p, g, p_text: str, g_text: str) -> bool:
    """Two numbers (no free symbols) under the number rules of the module docstring."""
    if p == g:
        return True
    p_decimal, g_decimal = "." in p_text, "." in g_text
    pv, gv = _value(p), _value(g)
    if pv is None or gv is None:
        return False
    if g_decimal:  # the reference is an approximation
        if _relative(pv, gv, 1e-6):
            return True
        # Rounded to k >= 2 decimals: an exact form or a longer decimal that rounds to it.
        k = _decimals(g_text)
        longer = not p_decimal or _decimals(p_text) > k
        return k >= 2 and longer and abs(pv - gv) <= 0.5 * 10.0 ** -k
    if p_decimal and not g.is_Rational and gv.imag == 0 and abs(gv.real) < 2 ** 53:
        # An exact form of an integer (\sqrt{4}, \log{8}/\log{2}) is that integer: no tolerance.
        whole = sympy.Integer(round(gv.real))
        if _exact_forms_equal(whole, g, complex(int(whole)), gv):
            g = whole
    if g.is_Rational and _finite_decimal(g) and (p.is_Rational or p_decimal):
        return False  # exact: 10^12 + 1, 1000000.9, 0.0 for 10^-7 are all wrong
    if p_decimal:  # a decimal for 1/3, pi, sqrt(2)
        return _relative(pv, gv, 1e-6)
    if p.is_Rational and g.is_Rational:
        return False
    return _exact_forms_equal(p, g, pv, gv)


def _points(symbols, complex_plane: bool, rng: random.Random) -> dict:
    if complex_plane:  # on the unit circle x^9999 stays finite
        return {s: cmath.exp(1j * rng.uniform(0.1, 3.0)) for s in symbols}
    return {s: rng.uniform(0.5, 3.5) for s in symbols}


def _identity(p, g) -> Optional[bool]:
    """Expressions with the same variables: True when they agree at 3 random points, False when
    they differ at one, None when undecided (undefined or overflowing at most points). Real
    points first; then points on the complex unit circle, where x^9999 stays finite."""
    rng = random.Random(20251013)  # deterministic, bounded work
    symbols = sorted(p.free_symbols, key=str)
    for complex_plane in (False, True):
        agreed = 0
        for _ in range(8):
            point = _points(symbols, complex_plane, rng)
            pv, gv = _value(p, point), _value(g, point)
            if pv is None or gv is None:
                continue
            # Floor 1: values at arbitrary points carry rounding error of the evaluation, not a
            # decimal the answer wrote.
            if abs(pv - gv) > 1e-9 * max(1.0, abs(pv), abs(gv)):
                return False
            agreed += 1
            if agreed == 3:
                return True
    return None


def _values_equal(p, g, p_text: str, g_text: str) -> Optional[bool]:
    """Numbers: True / False. Expressions: `_identity`; None with different variables."""
    if p.free_symbols != g.free_symbols:
        return None
    if not p.free_symbols:
        return _numbers_equal(p, g, p_text, g_text)
    return _identity(p, g)


def _proportional(dp, dg) -> Optional[bool]:
    """Whether two expressions (the sides of two equations, subtracted) are nonzero multiples
    of each other: `2x + 4y - 3` and `y + x/2 - 3/4`."""
    if dp.free_symbols != dg.free_symbols or not dp.free_symbols:
        return None
    rng = random.Random(20251013)
    symbols = sorted(dp.free_symbols, key=str)
    ratio, agreed = None, 0
    for _ in range(8):
        point = _points(symbols, False, rng)
        pv, gv = _value(dp, point), _value(dg, point)
        if pv is None or gv is None or abs(gv) < 1e-9 or abs(pv) < 1e-9:
            continue
        r = pv / gv
        if ratio is None:
            ratio = r
        elif not _relative(r, ratio, 1e-9):
            return False
        agreed += 1
        if agreed == 3:
            return True
    return None


def _percent(expr):
    return sympy.Mul(expr, sympy.Rational(1, 100), evaluate=expr.is_Rational)


_WORDS_RE = re.compile(r"[A-Za-z][A-Za-z '\-]+")
_DECIMAL_COMMA_RE = re.compile(r"-?\d+,\d{2,}")  # not 1,234: thousands are collapsed before


def _decimal_comma(p: str, g: str) -> bool:
    """`1,22` for 1.22 (and the reverse): a comma with two or more digits after it that is no
    thousands group, against a decimal with the same value."""
    for a, b in ((p, g), (g, p)):
        if _DECIMAL_COMMA_RE.fullmatch(a) and re.fullmatch(r"-?\d*\.\d+", b):
            return Fraction(a.replace(",", ".")) == Fraction(b)
    return False


def _scalar(p: str, g: str) -> Optional[bool]:
    """True / False when decided, None when the parser cannot read one side."""
    if p == g or p.replace(" ", "") == g.replace(" ", ""):
        return True
    phrases = bool(_WORDS_RE.fullmatch(p) and _WORDS_RE.fullmatch(g)) and " " in p + g
    words = bool(re.fullmatch(r"[A-Za-z]{2,}", p) and re.fullmatch(r"[A-Za-z]{2,}", g))
    if phrases or words:  # text answers: "Yes", "Monday", "no solution"
        return p.casefold() == g.casefold()
    p_pct, g_pct = p.endswith("%"), g.endswith("%")
    p, g = p.rstrip("%").strip(), g.rstrip("%").strip()
    pe, ge = parse_math(p), parse_math(g)
    if pe is None or ge is None:
        return None
    # "50%" matches both 50 and 0.5 on the other side.
    p_options = [pe] + ([_percent(pe)] if p_pct else [])
    g_options = [ge] + ([_percent(ge)] if g_pct else [])
    verdicts = [_values_equal(a, b, p, g) for a in p_options for b in g_options]
    return True if True in verdicts else None if None in verdicts else False


# ---------------------------------------------------------------------------------- structures
def _split_top_level(s: str, sep: str = ",") -> list[str]:
    parts, depth, start = [], 0, 0
    for j, ch in enumerate(s):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif depth == 0 and s.startswith(sep, j) and not (sep == "," and s[j - 1:j] == "\\"):
            parts.append(s[start:j])
            start = j + len(sep)
    parts.append(s[start:])
    return [x.strip() for x in parts]


def _balanced(s: str) -> bool:
    depth = 0
    for ch in s:
        depth += ch in "([{"
        depth -= ch in ")]}"
        if depth < 0:
            return False
    return depth == 0


def _collection(s: str) -> tuple[str, list[str]]:
    """('set' | 'bare' | opening+closing bracket, elements); 'scalar' when not a list."""
    if s.startswith("\\{") and s.endswith("\\}") and _balanced(s[2:-2]):
        return "set", _split_top_level(s[2:-2])
    if len(s) >= 2 and s[0] in "([" and s[-1] in ")]":
        inner = s[1:-1]
        if "," in inner and _balanced(inner) and all(_split_top_level(inner)):
            return s[0] + s[-1], _split_top_level(inner)
    if s.count("\\pm") == 1 and "," not in s:
        return "set", [s.replace("\\pm", "+"), s.replace("\\pm", "-")]
    parts = [x for x in _split_top_level(s) if x]
    return ("bare", parts) if len(parts) > 1 else ("scalar", [s])


def _name_like(s: str) -> bool:
    """A label rather than a value: `x`, `a_{37}`, `f(x)`, `|AB|`, `V_1:V_2`, `\\angle ABC`
    (a letter; no digit or operator outside subscripts and arguments)."""
    s = s.strip()
    if not s or len(s) > 30 or s[0].isdigit():
        return False
    core = re.sub(r"_\{[^{}]*\}|_\w|\([^()]*\)|\\[a-zA-Z]+", "", s)
    return re.search(r"[\d+\-*/^=<>%.]", core) is None and re.search(r"[a-zA-Z]", s) is not None


def _name_key(name: str) -> str:
    return re.sub(r"[{}\s]", "", name)


def _named(item: str) -> tuple[Optional[str], str]:
    """("a_37", "19") for "a_{37} = 19"; (None, item) without a name."""
    m = _NAME_EQ_RE.match(item)
    if m is None or "=" in item[m.end():] or "≈" in item[m.end():]:
        return None, item
    return _name_key(m.group(1)), item[m.end():].strip()


def _all_true(verdicts) -> Optional[bool]:
    verdicts = list(verdicts)
    if all(v is True for v in verdicts):
        return True
    return False if False in verdicts else None


def _unordered(p_items: list[str], g_items: list[str], depth: int) -> Optional[bool]:
    """Set equality: every element of each side equals one of the other (repeats ignored)."""
    matched, undecided = [False] * len(g_items), False
    for a in p_items:
        hit = False
        for j, b in enumerate(g_items):
            verdict = _compare(a, b, depth + 1)
            if verdict is True:
                matched[j] = hit = True
            undecided |= verdict is None
        if not hit:
            return None if undecided else False
    if all(matched):
        return True
    return None if undecided else False


def _items(p_items: list[str], g_items: list[str], ordered: bool, depth: int) -> Optional[bool]:
    p_named, g_named = [_named(x) for x in p_items], [_named(x) for x in g_items]
    p_names, g_names = [n for n, _ in p_named], [n for n, _ in g_named]
    # "x = 1, x = 2": one variable's solutions, i.e. values.
    one_variable = all(p_names) and len(set(p_names)) == 1 < len(p_names)
    if all(p_names) and all(g_names) and not one_variable:
        p_map, g_map = dict(p_named), dict(g_named)
        if len(p_map) != len(p_named) or set(p_map) != set(g_map):
            return False  # named values: the names must agree (order is free)
        return _all_true(_compare(p_map[k], g_map[k], depth + 1) for k in g_map)
    p_values, g_values = [v for _, v in p_named], [v for _, v in g_named]
    if not ordered:
        return _unordered(p_values, g_values, depth)
    if len(p_values) != len(g_values):
        return False
    return _all_true(_compare(a, b, depth + 1) for a, b in zip(p_values, g_values))


_INEQ_RE = re.compile(r"(\\le |\\ge |\\ne |<|>)")
_FLIP = {"<": ">", ">": "<", "\\le ": "\\ge ", "\\ge ": "\\le ", "\\ne ": "\\ne "}


def _negate(s: str) -> str:
    return s[1:].strip() if s.startswith("-") else f"-({s})"


def _inequality(s: str) -> Optional[tuple[list[str], list[str]]]:
    """(operands, operators) of a chain like "1 < x \\le 3", oriented to read upward, the
    variable positive ("-x > -1" is "x < 1")."""
    parts = _INEQ_RE.split(s)
    if len(parts) < 3:
        return None
    operands, ops = [x.strip() for x in parts[0::2]], parts[1::2]
    if not all(operands):
        return None
    if ops[0] in (">", "\\ge "):
        operands, ops = operands[::-1], [_FLIP[o] for o in ops[::-1]]
    if any(re.fullmatch(r"-\s*" + _NAME, x) for x in operands) and "\\ne " not in ops:
        operands, ops = [_negate(x) for x in operands[::-1]], ops[::-1]  # a < -x < b
    return operands, ops


def _as_interval(chain: tuple[list[str], list[str]]) -> Optional[str]:
    """Interval notation of "a < x \\le b", "x < b", "x \\ge a" (one variable), else None."""
    operands, ops = chain
    if any(op not in ("<", "\\le ") for op in ops):
        return None
    if len(ops) == 2 and _name_like(operands[1]):
        low, high = operands[0], operands[2]
    elif len(ops) == 1 and _name_like(operands[0]):
        low, high = "-\\infty", operands[1]
    elif len(ops) == 1 and _name_like(operands[1]):
        low, high, ops = operands[0], "\\infty", [ops[0], "<"]
    else:
        return None
    left = "(" if ops[0] == "<" or len(ops) == 1 else "["
    right = ")" if ops[-1] == "<" else "]"
    return f"{left}{low}, {high}{right}"


_MATRIX_RE = re.compile(r"^\\begin\{([pbBvV]?matrix|array)\}(?:\{[^{}]*\})?(.*)\\end\{\1\}$",
                        re.DOTALL)


def _matrix(s: str) -> Optional[list[list[str]]]:
    m = _MATRIX_RE.match(s)
    if m is None:
        return None
    rows = [r for r in _split_top_level(m.group(2), "\\\\") if r]
    return [[c.strip() for c in r.split("&")] for r in rows]


def _choice(s: str, whole: bool) -> Optional[str]:
    """The letter of a multiple-choice answer: "B", "(B)", and unless `whole`, "(B) 12" (but
    not "(B) (C)": two choices are a hedge)."""
    m = re.fullmatch(r"\(?([A-J])\)?", s)
    if m:
        return m.group(1)
    m = None if whole else re.fullmatch(r"(?:\(([A-J])\)|([A-J])[.:)])\s(.*)", s)
    if m is None or re.search(r"(?<![A-Za-z\\])[A-J](?![A-Za-z])", m.group(3)):
        return None
    return m.group(1) or m.group(2)


def _chain_parts(s: str) -> list[str]:
    """The sides of `a = b \\approx c` (s itself when it has no top-level relation or is a
    list)."""
    if len(_split_top_level(s)) > 1:
        return [s]
    parts = [x for part in _split_top_level(s, "=") for x in _split_top_level(part, "≈")]
    return parts if len(parts) > 1 and all(parts[1:]) else [s]


def _names_values(parts: list[str]) -> tuple[list[str], list[str]]:
    """Labels at either end of a chain, and the values between: `x = 5+5+1 = 11` has the name
    x and the values 5+5+1 and 11; `3 = x` has the value 3."""
    names, values = [], [p for p in parts if p]
    while len(values) > 1 and _name_like(values[0]):
        names.append(_name_key(values.pop(0)))
    while len(values) > 1 and _name_like(values[-1]):
        names.append(_name_key(values.pop()))
    return names, values


def _equations(p_parts: list[str], g_parts: list[str]) -> Optional[bool]:
    sides = [parse_math(x) for x in p_parts + g_parts]
    if any(x is None for x in sides):
        return None
    pl, pr, gl, gr = sides
    return _proportional(sympy.Add(pl, sympy.Mul(-1, pr, evaluate=False), evaluate=False),
                         sympy.Add(gl, sympy.Mul(-1, gr, evaluate=False), evaluate=False))


def _chain(p: str, g: str, depth: int):
    """Verdict for answers with `=` / `\\approx` (NotImplemented when neither has one). A gold
    equation (no side a label) needs an equivalent equation; otherwise every value the
    prediction states must equal the gold's final value: `2 = 3` and `x = 1/3 \\approx 1.3`
    are hedges, wrong whichever side is right."""
    p_parts, g_parts = _chain_parts(p), _chain_parts(g)
    if len(p_parts) == 1 and len(g_parts) == 1:
        return NotImplemented
    if len(g_parts) == 2 and not any(_name_like(x) for x in g_parts):
        return _equations(p_parts, g_parts) if len(p_parts) == 2 else False
    g_names, g_values = _names_values(g_parts)
    p_names, p_values = _names_values(p_parts)
    if p_names and g_names and not set(p_names) & set(g_names):
        return False  # "y = 2" for "x = 2"
    verdicts = [_compare(v, g_values[-1], depth + 1) for v in p_values]
    return verdicts[0] if len(verdicts) == 1 else all(v is True for v in verdicts)


_JUXTAPOSED_RE = re.compile(r"[\d)\]}]\s+\.?\d")  # "2 3", "\frac{1}{2} 3" (not matrices)


def _compare(p: str, g: str, depth: int = 0) -> Optional[bool]:
    """Our verdict on normalised answers: True / False when decided, None: ask math-verify."""
    if p == g:
        return True
    letter = _choice(g, whole=True)
    if letter is not None:
        return _choice(p, whole=False) == letter
    if "\\begin" not in p and _JUXTAPOSED_RE.search(p):
        return False  # "2 \quad 3", "12 \; 5": two numbers, not their product (nor 125)
    if p.replace(" ", "") == g.replace(" ", ""):
        return True
    if depth > MAX_COMPARE_DEPTH or not p or not g:
        return None if p and g else False
    pm, gm = _matrix(p), _matrix(g)
    if pm is not None or gm is not None:
        if pm is None or gm is None:
            return None
        if [len(r) for r in pm] != [len(r) for r in gm]:
            return False
        return _all_true(_compare(a, b, depth + 1) for pr, gr in zip(pm, gm)
                         for a, b in zip(pr, gr))
    if _decimal_comma(p, g):
        return True
    pi, gi = _inequality(p), _inequality(g)
    if pi is not None or gi is not None:
        if pi is None or gi is None:
            # "-2 < x \le 3" vs "(-2, 3]": compare as intervals; else math-verify decides
            p_iv, g_iv = (_as_interval(pi) if pi else p), (_as_interval(gi) if gi else g)
            return None if p_iv is None or g_iv is None else _compare(p_iv, g_iv, depth + 1)
        if pi[1] != gi[1] or len(pi[0]) != len(gi[0]):
            return False  # "x < 2" is not "x \le 2"
        return _all_true(_compare(a, b, depth + 1) for a, b in zip(pi[0], gi[0]))
    verdict = _chain(p, g, depth)
    if verdict is not NotImplemented:
        return verdict
    p_union, g_union = _split_top_level(p, "\\cup"), _split_top_level(g, "\\cup")
    if len(p_union) > 1 or len(g_union) > 1:
        if len(p_union) != len(g_union):
            return False if len(p_union) > 1 and len(g_union) > 1 else None
        p_parts, g_parts = [_collection(x) for x in p_union], [_collection(x) for x in g_union]
        remaining = list(g_parts)
        for kind, items in p_parts:
            hit = next((j for j, (k, xs) in enumerate(remaining) if k == kind and
                        _items(items, xs, True, depth) is True), None)
            if hit is None:
                return None
            remaining.pop(hit)
        return True
    p_kind, p_items = _collection(p)
    g_kind, g_items = _collection(g)
    kinds = {p_kind, g_kind}
    if kinds == {"scalar"}:
        return _scalar(p, g)
    if "scalar" in kinds:
        return False  # one value against a list: "3 or 4" for 4, "1" for "1, 2"
    if kinds <= {"set", "bare"}:
        return _items(p_items, g_items, False, depth)
    if "set" in kinds:
        return False  # a set is not a tuple or an interval
    if "bare" in kinds:
        # A bare list against a tuple reads as that tuple; against an interval it is wrong.
        return _items(p_items, g_items, True, depth) if kinds == {"bare", "()"} else False
    if p_kind != g_kind:
        return False  # (1, 2) vs [1, 2]: bracket types matter
    return _items(p_items, g_items, True, depth)


# --------------------------------------------------------------------------------- math-verify
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
        parsed_gold = math_verify.parse(f"${gold}$", extraction_config=_MV_CONFIG,
                                        parsing_timeout=None)
        parsed_pred = math_verify.parse(f"${pred}$", extraction_config=_MV_CONFIG,
                                        parsing_timeout=None)
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
        if _ALTERNATIVES_RE.search(_TEXT_CMD_RE.sub(r" \1 ", pred)) and \
                _collection(g)[0] == "scalar":
            return False  # "4 (or 3)": alternatives, wherever they stand, for one value
        verdict = _compare(p, g) if p and g else False
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
