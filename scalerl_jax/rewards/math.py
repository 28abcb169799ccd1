"""Math answer verification: extract the final answer of a completion, decide equivalence.

Pipeline:

1. **Limits, before any parsing.** A completion over `MAX_COMPLETION_CHARS`, or an answer (or
   reference) over `MAX_ANSWER_CHARS`, nested deeper than `MAX_NESTING`, with more than
   `MAX_ELEMENTS` separators, more than `MAX_POWERS` powers, a numeric power tower, a numeric
   exponent above `MAX_EXPONENT` (`MAX_POLY_EXPONENT` on a bracketed base with variables), or a
   factorial / binomial / sum / product / integral / limit with a power of anything but a
   variable or an integer literal above `MAX_HEAVY_LITERAL` is refused as incorrect
   (`within_limits`, a linear scan). These are the inputs that make SymPy or math-verify's
   parser compute for minutes (`9^{9^{9^{9}}}`, `\\binom{10^9}{5 \\cdot 10^8}`, `(x+1)^{99999}`,
   12 nested braces); a real final answer is far inside them. The reward pool's per-item
   wall-clock limit (child processes, killed on timeout) is the backstop for whatever passes.
2. **Extract** (`extract_answer`): strip the thinking block; the last \\boxed / \\fbox; else the
   last "answer is ..." / "Answer: ..."; else the last math span of the last line; else the last
   number, only when it stands alone (not part of an expression, interval or set: the digit of
   `\\frac{1+\\sqrt5}{2}` or of `-[0,1)` is not an answer).
3. **Normalise** the LaTeX text (\\dfrac, \\left, \\text, units, degrees, %, thousands
   separators, mixed numbers, repeating decimals, relation macros).
4. **Compare** with our own rules first: equal text; multiple-choice letters; matrices;
   inequalities (operators must match: `x<2` is not `x \\le 2`); unions of intervals; named
   values (`a_3 = 2, a_{37} = 19`, any order, names must agree); sets (any order), tuples and
   intervals (in order, bracket types must match; a set is never a tuple); scalars numerically /
   symbolically through `sympy_safe.parse_math`, which never executes model text. These rules
   give a definite verdict where they can; what they cannot decide (expressions outside the
   whitelist grammar, interval vs inequality forms) goes to math-verify's LaTeX extraction and
   verifier (its plain-expression mode, ExprExtractionConfig, calls `parse_expr`, i.e. `eval`,
   and is never used; its LaTeX path turns the numerals of its grammar into `sympy.Number(text)`,
   which parses a string of digits). Structural mismatches are decided here and never reach
   math-verify, which accepts e.g. `\\{1,2\\}` for `(1,2)`.

Conventions: a percentage matches its number and its fraction (`12\\%` = 12 = 0.12, as in the
MATH data where both forms occur); degrees and units are dropped (`90^\\circ` = 90); a decimal is
an approximation (1e-6 relative; a reference rounded to k >= 2 decimals accepts an exact form
that rounds to it), exact numbers are compared exactly.

Hand-written parts: the extraction and structural rules (math-verify's are too lenient for a
reward: set vs tuple, last number of any expression) and the size screen (no library bounds
SymPy's work).
"""
from __future__ import annotations

import logging
import random
import re
from typing import Optional

import math_verify
import sympy

from scalerl_jax.rewards.sympy_safe import evaluate_complex, parse_math

MAX_COMPLETION_CHARS = 400_000  # ~100k tokens: longer than any generation we sample
MAX_ANSWER_CHARS = 400  # real final answers are rarely over 200; 1,000 cost math-verify ~1 s
MAX_NESTING = 8  # brackets of any kind: math-verify's LaTeX parser is exponential in the depth
MAX_ELEMENTS = 64  # separators: , ; & \\
MAX_POWERS = 12
MAX_EXPONENT = 10_000  # product of the integer literals of a numeric exponent
MAX_POLY_EXPONENT = 12  # ... of a bracketed base with variables: (a+b+c)^n expands to O(n^2) terms
MAX_HEAVY_LITERAL = 1_000  # integer literals in an answer with factorial / binomial / sum / ...

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


# ----------------------------------------------------------------------------------- limits
_HEAVY_RE = re.compile(r"\\(?:binom|dbinom|tbinom|choose|sum|prod|int|iint|lim|Gamma)(?![a-zA-Z])"
                       r"|(?<!\\)!(?!=)")
_BOUNDS_RE = re.compile(r"\\(?:sum|prod|int|lim)\s*_\s*(?:\{[^{}]*\}|\S)\s*(?:\^\s*(?:\{[^{}]*\}"
                        r"|\S))?")
_INT_RE = re.compile(r"\d+")
_DOUBLE_POWER_RE = re.compile(r"\^\s*(?:\{[^{}]*\}|\\?\w+)\s*\^")  # a^b^c: a tower without braces
_COMMAND_RE = re.compile(r"\\[a-zA-Z]+")


def _exponents(s: str) -> list[tuple[str, str]]:
    """(the character before `^`, the exponent text: `{...}` or one token) of each top-level
    power in `s`."""
    out, i = [], 0
    while True:
        i = s.find("^", i)
        if i < 0:
            return out
        j = i + 1
        while j < len(s) and s[j] == " ":
            j += 1
        if j < len(s) and s[j] == "{":
            depth, k = 0, j
            while k < len(s):
                depth += s[k] == "{"
                depth -= s[k] == "}"
                if depth == 0:
                    break
                k += 1
            out.append((s[:i].rstrip()[-1:], s[j + 1:k]))
            i = k + 1
        else:
            m = re.match(r"\\[a-zA-Z]+|\d+|.", s[j:]) if j < len(s) else None
            out.append((s[:i].rstrip()[-1:], m.group(0) if m else ""))
            i = j + (m.end() if m else 0)


def _tower_depth(s: str) -> int:
    return max((1 + _tower_depth(e) for _, e in _exponents(s)), default=0)


def _numeric(s: str) -> bool:
    """No variables: only digits, operators and commands (\\frac, \\cdot, \\pi is a number)."""
    return re.search(r"[a-zA-Z]", _COMMAND_RE.sub("", s)) is None


def within_limits(s: str) -> bool:
    """Whether an answer is small enough to parse and compare (see the module docstring). Linear
    in len(s) up to MAX_ANSWER_CHARS; nothing is parsed."""
    if len(s) > MAX_ANSWER_CHARS:
        return False
    depth = 0
    for ch in s:
        if ch in "([{":
            depth += 1
            if depth > MAX_NESTING:
                return False
        elif ch in ")]}":
            depth -= 1
    if s.count(",") + s.count(";") + s.count("&") + s.count("\\\\") > MAX_ELEMENTS:
        return False
    if s.count("^") > MAX_POWERS or _DOUBLE_POWER_RE.search(s):
        return False
    if _HEAVY_RE.search(s):  # factorials, binomials, sums: small literals, no powers inside
        if any(int(x) > MAX_HEAVY_LITERAL for x in _INT_RE.findall(s)):
            return False
        # Powers only of a variable (k^2 in a sum): 10^9 or (n+1)^3 inside a binomial or a
        # factorial is a huge number.
        if any(not before.isalpha() for before, _ in _exponents(_BOUNDS_RE.sub("", s))):
            return False
        if len(re.findall(r"(?<!\\)!(?!=)", s)) > 2:
            return False
    variables = not _numeric(s)
    for before, exponent in _exponents(s):
        inner = _tower_depth(exponent)
        if inner >= 2 or (inner == 1 and _numeric(exponent)):
            return False  # 9^{9^{9}}: a tower of numbers (x^{y^z} with variables is fine)
        if _numeric(exponent):
            limit = MAX_POLY_EXPONENT if variables and before in ")]}" else MAX_EXPONENT
            product = 1
            for x in _INT_RE.findall(exponent):
                product *= int(x)
                if product > limit:
                    return False
    return True


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
    r"|\d*\.?\d+(?:/\d+)?)(?:\s*\\?%)?")
# Text allowed right after a stand-alone final number: units, degrees, closing math delimiters.
_NUMBER_TAIL_RE = re.compile(r"(?:\^\s*\{?\\circ\}?|\\(?:text|mathrm|mbox|,|;|quad|\)|\]|\$)"
                             r"(?![a-zA-Z]))")
_MATH_SPAN_RE = re.compile(r"\$\$(.+?)\$\$|\$(.+?)\$|\\\((.+?)\\\)|\\\[(.+?)\\\]", re.DOTALL)
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


def _last_line_math(text: str) -> Optional[str]:
    """The last math span of the last non-empty line when nothing but punctuation follows it:
    "... so the solution set is $\\{1, 2\\}$." For "$2 + 3 = 5$" the right-hand side."""
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    if not lines:
        return None
    line = lines[-1]
    spans = list(_MATH_SPAN_RE.finditer(line))
    if not spans or line[spans[-1].end():].strip(" .!*") != "":
        return None
    span = next(g for g in spans[-1].groups() if g is not None).strip()
    lhs, eq, rhs = span.rpartition("=")
    if eq and _numeric(lhs.split("=")[0]):  # "2 + 3 = 5": the result
        span = rhs.strip()
    return span or None


def _strip_markup(s: str, end: bool) -> str:
    """`s` without spaces, `$` and markdown bold at its end (`end`) or start; a single `*` is
    multiplication and stays."""
    for _ in range(3):
        s = s.rstrip(" $") if end else s.lstrip(" $")
        if s.endswith("**") if end else s.startswith("**"):
            s = s[:-2] if end else s[2:]
    return s


def _standalone_number(text: str) -> Optional[str]:
    """The last number of `text` when it is a whole answer, not a piece of an expression."""
    matches = list(_LAST_NUMBER_RE.finditer(text))
    if not matches:
        return None
    m = matches[-1]
    before, after = text[:m.start()], text[m.end():]
    if before and (before[-1].isalpha() or before[-1] == "\\"):
        return None  # x2, \sqrt5
    prev = _strip_markup(before, end=True)
    if prev and prev[-1] in "^_{([,+-*/\\|<>!&":
        return None
    if after[:1].isalpha():
        return None  # 5x
    rest = _strip_markup(after, end=False)
    tail = _NUMBER_TAIL_RE.match(rest)
    if rest and not tail and rest[0] in "^_}])(+-*/,=<>!&\\|[{":
        return None
    return m.group(0).strip()


def extract_answer(completion: str, require_close: bool = False) -> Optional[str]:
    """The final answer of a completion, or None. Order: strip thinking, last \\boxed/\\fbox,
    the last "answer is ..." / "Answer: ...", the last math span of the last line, the last
    number when it stands alone (or a/b, \\frac{a}{b}, n%)."""
    if len(completion) > MAX_COMPLETION_CHARS:
        return None
    text = strip_thinking(completion, require_close)
    if text is None:
        return None
    boxed = last_boxed(text)
    if boxed is not _NO_BOX:
        return boxed.strip() if boxed is not None and boxed.strip() else None
    phrase = _after_answer_phrase(text)
    if phrase:
        return phrase
    return _last_line_math(text) or _standalone_number(text)


# -------------------------------------------------------------------------------- normalisation
_TEXT_CMD_RE = re.compile(r"\\(?:text|textbf|textit|textrm|textnormal|mathrm|mathbf|mathit|mbox"
                          r"|operatorname)\s*\{([^{}]*)\}")
_UNIT_WORDS = (r"(?:sq(?:uare)?\.?\s*|cubic\s*)?(?:cm|mm|km|meters?|metres?|inch(?:es)?|feet|foot"
               r"|ft|yards?|miles?|units?|degrees?|dollars?|cents?|hours?|hrs?|minutes?|mins?"
               r"|seconds?|secs?|days?|weeks?|months?|years?|grams?|kg|mg|pounds?|lbs?|mph|kmh"
               r"|liters?|litres?|ml|people|students|ways|points?|times|m/s|km/h)")
_UNIT_RE = re.compile(r"(?<=[\d}).])\s*(?:" + _UNIT_WORDS + r"|\s(?:m|g|s|in|l))"
                      r"(?:\^\{?[23]\}?|[23])?\s*$")
_NAME = r"[a-zA-Z](?:_\{?\w+\}?)?"
_NAME_EQ_RE = re.compile(r"^\s*(" + _NAME + r")\s*=(?!=)\s*")
_TUPLE_NAMES_RE = re.compile(r"^\s*\(\s*" + _NAME + r"(?:\s*,\s*" + _NAME + r")+\s*\)\s*=(?!=)\s*")
_IN_RE = re.compile(r"^\s*" + _NAME + r"\s*\\in\s+")
_THOUSANDS_RE = re.compile(r"^-?\d{1,3}(?:,\d{3})+(?:\.\d+)?$|^-?\d{1,3}(?: \d{3})+$")
_MIXED_RE = re.compile(r"(-?)(\d{1,6})\s*\\frac\{(\d{1,6})\}\{(\d{1,6})\}")
_REPEATING_RE = re.compile(r"(-?\d{0,12})\.(\d{0,12})\\overline\{(\d{1,12})\}")


def _repeating(whole: str, fixed: str, period: str) -> str:
    """The fraction of a repeating decimal: 0.1\\overline{6} -> \\frac{15}{90}."""
    sign, whole = ("-", whole[1:]) if whole.startswith("-") else ("", whole)
    den = (10 ** len(period) - 1) * 10 ** len(fixed)
    num = int(whole or 0) * den + int(fixed + period) - int(fixed or 0)
    return f"{sign}\\frac{{{num}}}{{{den}}}"


_RELATIONS = (("\\leqslant", "\\le"), ("\\geqslant", "\\ge"), ("\\leq", "\\le"), ("\\geq", "\\ge"),
              ("\\neq", "\\ne"), ("<=", "\\le"), (">=", "\\ge"), ("!=", "\\ne"), ("≤", "\\le"),
              ("≥", "\\ge"), ("≠", "\\ne"), ("\\lt", "<"), ("\\gt", ">"))


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
    s = re.sub(r"(?<!\\)\\[,;:! ]|~|\\q?quad(?![a-zA-Z])", " ", s).replace("{,}", ",")
    s = re.sub(r"\\[dt]frac(?![a-zA-Z])", r"\\frac", s)
    s = re.sub(r"\\frac(\d)(\d)", r"\\frac{\1}{\2}", s)
    s = re.sub(r"\\sqrt(\d)", r"\\sqrt{\1}", s)
    s = re.sub(r"\\(?:cdot|times)(?![a-zA-Z])", "*", s)
    s = re.sub(r"\\div(?![a-zA-Z])", "/", s)
    s = re.sub(r"\^\s*\{?\s*\\circ\s*\}?|\\circ(?![a-zA-Z])|°", "", s)
    s = re.sub(r"\s*(?:\\%|percent\b)", "%", s)
    s = s.replace("\\$", "").replace("$", "")
    for old, new in _RELATIONS:
        s = s.replace(old, new)
    s = re.sub(r"\\(le|ge|ne)(?![a-zA-Z])\s*", r"\\\1 ", s)
    s = s.strip().rstrip(".").strip()
    s = _UNIT_RE.sub("", s).strip()
    m = _MIXED_RE.fullmatch(s)
    if m:  # "3\frac{1}{2}" is three and a half
        whole, num, den = (int(x) for x in m.group(2, 3, 4))
        s = f"{m.group(1)}\\frac{{{whole * den + num}}}{{{den}}}"
    m = _REPEATING_RE.fullmatch(s)
    if m:  # 0.1\overline{6} = 1/6
        s = _repeating(*m.groups())
    if ";" in s and "," not in s:  # "(3; 4; 5)": semicolons separate like commas
        s = s.replace(";", ",")
    s = _TUPLE_NAMES_RE.sub("", s, count=1)
    s = _IN_RE.sub("", s, count=1)
    if _THOUSANDS_RE.match(s):
        s = s.replace(",", "").replace(" ", "")
    while s.startswith("{") and s.endswith("}") and _braced(s, 0) == (s[1:-1], len(s)):
        s = s[1:-1].strip()
    return re.sub(r"\s+", " ", s).strip()


# --------------------------------------------------------------------------------- equivalence
def _value(expr, env: Optional[dict] = None) -> Optional[complex]:
    try:
        return evaluate_complex(expr, env)
    except (ArithmeticError, ValueError, TypeError):
        return None


def _close(a: complex, b: complex, rel: float) -> bool:
    return abs(a - b) <= rel * max(1.0, abs(a), abs(b))


def _decimals(s: str) -> int:
    m = re.fullmatch(r"-?\d*\.(\d+)", s)
    return len(m.group(1)) if m else 0


def _values_equal(p, g, p_text: str, g_text: str) -> Optional[bool]:
    """Numbers: True / False. Expressions: True when they agree at 3 random points, False when
    they differ at one, None when undecided (different variables, undefined at the points)."""
    if p.free_symbols != g.free_symbols:
        return None
    if not p.free_symbols:
        if p == g:
            return True
        decimal = "." in p_text + g_text
        if p.is_Rational and g.is_Rational and not decimal:
            return False  # exact numbers: no tolerance (10^12 and 10^12 + 1 differ)
        pv, gv = _value(p), _value(g)
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
        pv, gv = _value(p, point), _value(g, point)
        if pv is None or gv is None:
            continue
        if not _close(pv, gv, 1e-9):
            return False
        agreed += 1
        if agreed == 3:
            return True
    return None


def _percent(expr):
    return sympy.Mul(expr, sympy.Rational(1, 100), evaluate=expr.is_Rational)


_WORDS_RE = re.compile(r"[A-Za-z][A-Za-z '\-]+")


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
    parts = _split_top_level(s)
    return ("bare", parts) if len(parts) > 1 else ("scalar", [s])


def _named(item: str) -> tuple[Optional[str], str]:
    """("a_37", "19") for "a_{37} = 19"; (None, item) without a name."""
    m = _NAME_EQ_RE.match(item)
    if m is None or "=" in item[m.end():]:
        return None, item
    return re.sub(r"[{}\s]", "", m.group(1)), item[m.end():].strip()


def _all_true(verdicts) -> Optional[bool]:
    verdicts = list(verdicts)
    if all(v is True for v in verdicts):
        return True
    return False if False in verdicts else None


def _unordered(p_items: list[str], g_items: list[str]) -> Optional[bool]:
    """A perfect matching of equal elements (greedy: equality is transitive enough here)."""
    remaining, undecided = list(g_items), False
    for item in p_items:
        verdicts = [_scalar(item, x) for x in remaining]
        if True in verdicts:
            remaining.pop(verdicts.index(True))
        else:
            undecided |= None in verdicts
            return None if undecided else False
    return True


def _items(p_items: list[str], g_items: list[str], ordered: bool) -> Optional[bool]:
    p_named, g_named = [_named(x) for x in p_items], [_named(x) for x in g_items]
    if all(n for n, _ in p_named) and all(n for n, _ in g_named):
        p_map, g_map = dict(p_named), dict(g_named)
        if len(p_map) != len(p_named) or set(p_map) != set(g_map):
            return False  # named values: the names must agree (order is free)
        return _all_true(_scalar(p_map[k], g_map[k]) for k in g_map)
    p_values, g_values = [v for _, v in p_named], [v for _, v in g_named]
    if len(p_values) != len(g_values):
        return False
    if ordered:
        return _all_true(_scalar(a, b) for a, b in zip(p_values, g_values))
    return _unordered(p_values, g_values)


_INEQ_RE = re.compile(r"(\\le |\\ge |\\ne |<|>)")
_FLIP = {"<": ">", ">": "<", "\\le ": "\\ge ", "\\ge ": "\\le ", "\\ne ": "\\ne "}


def _inequality(s: str) -> Optional[tuple[list[str], list[str]]]:
    """(operands, operators) of a chain like "1 < x \\le 3", oriented to read upward."""
    parts = _INEQ_RE.split(s)
    if len(parts) < 3:
        return None
    operands, ops = [x.strip() for x in parts[0::2]], parts[1::2]
    if not all(operands):
        return None
    if ops[0] in (">", "\\ge "):
        operands, ops = operands[::-1], [_FLIP[o] for o in ops[::-1]]
    return operands, ops


def _as_interval(chain: tuple[list[str], list[str]]) -> Optional[str]:
    """Interval notation of "a < x \\le b", "x < b", "x \\ge a" (one variable), else None."""
    operands, ops = chain
    if any(op not in ("<", "\\le ") for op in ops):
        return None
    if len(ops) == 2 and re.fullmatch(_NAME, operands[1]):
        low, high = operands[0], operands[2]
    elif len(ops) == 1 and re.fullmatch(_NAME, operands[0]):
        low, high = "-\\infty", operands[1]
    elif len(ops) == 1 and re.fullmatch(_NAME, operands[1]):
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
    """The letter of a multiple-choice answer: "B", "(B)", and unless `whole`, "(B) 12"."""
    m = re.fullmatch(r"\(?([A-J])\)?", s)
    if m:
        return m.group(1)
    m = None if whole else re.fullmatch(r"(?:\(([A-J])\)|([A-J])[.:)])\s.*", s)
    return next(g for g in m.groups() if g) if m else None


def _compare(p: str, g: str) -> Optional[bool]:
    """Our verdict on normalised answers: True / False when decided, None: ask math-verify."""
    if p == g or p.replace(" ", "") == g.replace(" ", ""):
        return True
    letter = _choice(g, whole=True)
    if letter is not None:
        return _choice(p, whole=False) == letter
    pm, gm = _matrix(p), _matrix(g)
    if pm is not None or gm is not None:
        if pm is None or gm is None:
            return None
        if [len(r) for r in pm] != [len(r) for r in gm]:
            return False
        return _all_true(_scalar(a, b) for pr, gr in zip(pm, gm) for a, b in zip(pr, gr))
    pi, gi = _inequality(p), _inequality(g)
    if pi is not None or gi is not None:
        if pi is None or gi is None:
            # "-2 < x \le 3" vs "(-2, 3]": compare as intervals; else math-verify decides
            p_iv, g_iv = (_as_interval(pi) if pi else p), (_as_interval(gi) if gi else g)
            return None if p_iv is None or g_iv is None else _compare(p_iv, g_iv)
        if pi[1] != gi[1] or len(pi[0]) != len(gi[0]):
            return False  # "x < 2" is not "x \le 2"
        return _all_true(_scalar(a, b) for a, b in zip(pi[0], gi[0]))
    p_union, g_union = _split_top_level(p, "\\cup"), _split_top_level(g, "\\cup")
    if len(p_union) > 1 or len(g_union) > 1:
        if len(p_union) != len(g_union):
            return False if len(p_union) > 1 and len(g_union) > 1 else None
        p_parts, g_parts = [_collection(x) for x in p_union], [_collection(x) for x in g_union]
        remaining = list(g_parts)
        for kind, items in p_parts:
            hit = next((j for j, (k, xs) in enumerate(remaining) if k == kind and
                        _items(items, xs, ordered=True) is True), None)
            if hit is None:
                return None
            remaining.pop(hit)
        return True
    p_kind, p_items = _collection(p)
    g_kind, g_items = _collection(g)
    kinds = {p_kind, g_kind}
    if kinds == {"scalar"}:
        p_name, p_value = _named(p)
        g_name, g_value = _named(g)
        if p_name and g_name and p_name != g_name:
            return False  # "y = 2" for "x = 2"
        return _scalar(p_value, g_value)
    if "scalar" in kinds:
        return None  # one value against a list: math-verify (e.g. "x = 1 or 2")
    if kinds <= {"set", "bare"}:
        return _items(p_items, g_items, ordered=False)
    if "set" in kinds:
        return False  # a set is not a tuple or an interval
    if "bare" in kinds:
        # A bare list against a tuple reads as that tuple; against an interval it is wrong.
        return _items(p_items, g_items, ordered=True) if kinds == {"bare", "()"} else False
    if p_kind != g_kind:
        return False  # (1, 2) vs [1, 2]: bracket types matter
    return _items(p_items, g_items, ordered=True)


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


def is_equivalent(pred: Optional[str], gold: str) -> bool:
    """Whether an extracted answer equals the reference answer. Never raises."""
    if pred is None or not pred.strip() or not gold.strip():
        return False
    if not (within_limits(pred) and within_limits(gold)):
        return False
    try:
        p, g = normalize_answer(pred), normalize_answer(gold)
        verdict = _compare(p, g) if p and g else False
    except Exception:  # a bug in our rules: let math-verify decide rather than fail the batch
        verdict = None
    if verdict is not None:
        return verdict
    return _math_verify_equal(pred, gold)


def verify_math(completion: str, reference: str, require_close: bool = False) -> bool:
    """Extract the final answer of `completion` and compare it with `reference`."""
    return is_equivalent(extract_answer(completion, require_close), reference)


def to_reward(correct: bool, reward_correct: float = 1.0, reward_incorrect: float = -1.0) -> float:
    """Paper: +-1 (LossConfig.reward_correct / reward_incorrect); 0/1 is the other common choice."""
    return reward_correct if correct else reward_incorrect
