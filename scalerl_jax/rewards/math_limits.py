"""Size screens for math answers, applied to the text before anything parses it.

No library bounds SymPy's work, and a few dozen characters can make it compute for minutes
(`9^{9^{9^{9}}}`, `\\binom{10^9}{5 \\cdot 10^8}`). Two linear scans: `within_limits` (may the
answer be compared at all; refused answers score as incorrect) and `symbolic_ok` (is it small
enough for SymPy simplification; unevaluated calculus never is). The reward pool's time and
memory limits are the backstop. The limits: docs/rewards.md, "Math answers".
"""

from __future__ import annotations

import math
import re

MAX_ANSWER_CHARS = 400  # real final answers are rarely over 200
MAX_NESTING = 8  # brackets of any kind
MAX_ELEMENTS = 64  # separators: , ; & \\
MAX_POWERS = 12
MAX_EXPONENT = 10_000  # product of the integer literals of a numeric exponent
MAX_POLY_EXPONENT = 12  # ... of a bracketed base with variables: (a+b+c)^n expands to O(n^2) terms
MAX_HEAVY_LITERAL = 1_000  # integer literals in an answer with factorial / binomial / sum / ...
# Symbolic fallback only (`symbolic_ok`):
MAX_SYMBOLIC_DEGREE = 16  # sum of numeric exponents on bases with variables (a^n - b^n cancels
# to n terms, and products of such quotients multiply out)
MAX_EXPANDED_TERMS = 50  # estimated monomials once every group is multiplied out

_HEAVY_RE = re.compile(
    r"\\(?:binom|dbinom|tbinom|choose|sum|prod|int|iint|lim|Gamma)(?![a-zA-Z])"
    r"|(?<!\\)!(?!=)"
)
_BOUNDS_RE = re.compile(
    r"\\(?:sum|prod|int|lim)\s*_\s*(?:\{[^{}]*\}|\S)\s*(?:\^\s*(?:\{[^{}]*\}"
    r"|\S))?"
)
_STRUCTURE_RE = re.compile(r"\\(?:[dtc]?frac|cdot|times|div|left|right)(?![a-zA-Z])")
_FUNCTION_RE = re.compile(
    r"\\(?:arc)?(?:sin|cos|tan|cot|sec|csc)h?(?![a-zA-Z])"
    r"|\\(?:log|ln|exp|lfloor|lceil|Gamma)(?![a-zA-Z])"
)
_CALCULUS_RE = re.compile(r"\\(?:int|iint|iiint|oint|sum|prod|lim)(?![a-zA-Z])")
_INT_RE = re.compile(r"\d+")
_DOUBLE_POWER_RE = re.compile(r"\^\s*(?:\{[^{}]*\}|\\?\w+)\s*\^")  # a^b^c: a tower without braces
_COMMAND_RE = re.compile(r"\\[a-zA-Z]+")


def exponents(s: str) -> list[tuple[int, str]]:
    """(index of `^`, exponent text: `{...}` or one token) of each power in `s` outside
    exponents."""
    out: list[tuple[int, str]] = []
    i = 0
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
            out.append((i, s[j + 1 : k]))
            i = k + 1
        else:
            m = re.match(r"\\[a-zA-Z]+|\d+|.", s[j:]) if j < len(s) else None
            out.append((i, m.group(0) if m else ""))
            i = j + (m.end() if m else 0)


def _before(s: str, i: int) -> str:
    """The last non-space character before index `i`."""
    return s[:i].rstrip()[-1:]


def _tower_depth(s: str) -> int:
    return max((1 + _tower_depth(e) for _, e in exponents(s)), default=0)


def numeric(s: str) -> bool:
    """No variables: only digits, operators and commands (\\frac, \\cdot, \\pi is a number)."""
    return re.search(r"[a-zA-Z]", _COMMAND_RE.sub("", s)) is None


def _int_product(text: str, limit: int) -> int:
    """Product of the integer literals of `text`, stopping once it exceeds `limit`."""
    product = 1
    for x in _INT_RE.findall(text):
        product *= int(x)
        if product > limit:
            break
    return product


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
        bounded = _BOUNDS_RE.sub("", s)
        if any(not _before(bounded, i).isalpha() for i, _ in exponents(bounded)):
            return False
        if len(re.findall(r"(?<!\\)!(?!=)", s)) > 2:
            return False
    variables = not numeric(s)
    for i, exponent in exponents(s):
        inner = _tower_depth(exponent)
        if inner >= 2 or (inner == 1 and numeric(exponent)):
            return False  # 9^{9^{9}}: a tower of numbers (x^{y^z} with variables is fine)
        if numeric(exponent):
            limit = MAX_POLY_EXPONENT if variables and _before(s, i) in ")]}" else MAX_EXPONENT
            if _int_product(exponent, limit) > limit:
                return False
    return True


def _base_start(s: str, i: int) -> int:
    """Start index of the base of the power whose `^` is at `i`: a bracket group, a command
    with its braced argument, or one token."""
    j = i - 1
    while j >= 0 and s[j] == " ":
        j -= 1
    if j >= 0 and s[j] in ")]}":
        depth = 0
        while j >= 0:
            depth += s[j] in ")]}"
            depth -= s[j] in "([{"
            if depth == 0:
                break
            j -= 1
        return max(j, 0)
    while j > 0 and (s[j - 1].isalnum() or s[j - 1] in "\\_"):
        j -= 1
    return max(j, 0)


def _terms(group: str) -> int:
    """Top-level additive terms of a bracket group's contents."""
    depth, count = 0, 1
    for k, ch in enumerate(group):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif depth == 0 and ch in "+-" and k > 0 and group[:k].strip():
            count += 1
    return count


def _symbolic(s: str) -> bool:
    """Whether SymPy treats `s` as more than a rational number: variables, and also constants
    and functions (pi, sqrt, cos: (2\\pi + 3)^{11} expands like a polynomial)."""
    return re.search(r"[a-zA-Z]", _STRUCTURE_RE.sub("", s)) is not None


def _largest_exponent(s: str) -> int:
    """The largest numeric exponent in `s` (1 without one), capped past MAX_SYMBOLIC_DEGREE."""
    return max(
        (_int_product(e, MAX_SYMBOLIC_DEGREE + 1) for _, e in exponents(s) if numeric(e)), default=1
    )


def _size(group: str) -> int:
    """Terms a group's contents stand for once multiplied out: its additive terms, or its
    largest exponent when that is more (x^8 - y^8 over x - y cancels to 8 terms)."""
    return max(_terms(group), _largest_exponent(group))


def _argument(s: str, j: int) -> tuple[str, int]:
    """The LaTeX argument starting at `j` (after spaces): a balanced `{...}` or one character;
    its text and the index after it."""
    while j < len(s) and s[j] == " ":
        j += 1
    if j >= len(s) or s[j] != "{":
        return s[j : j + 1], j + 1
    depth = 0
    for k in range(j, len(s)):
        depth += s[k] == "{"
        depth -= s[k] == "}"
        if depth == 0:
            return s[j + 1 : k], k + 1
    return s[j + 1 :], len(s)


def _binomials(s: str) -> list[tuple[str, str]]:
    """(top, bottom) of every \\binom / \\dbinom / \\tbinom in `s`."""
    out = []
    for m in re.finditer(r"\\[dt]?binom(?![a-zA-Z])", s):
        top, j = _argument(s, m.end())
        out.append((top, _argument(s, j)[0]))
    return out


def symbolic_ok(s: str) -> bool:
    """Whether symbolic algebra on `s` stays small. Each power of a symbolic base (variables,
    pi, radicals, functions), and each binomial of one (a polynomial of degree k), counts as an
    expansion: a group of
    size t (`_size`) to the k-th power gives C(t+k-1, k) monomials; groups side by side
    multiply; the estimate must stay under MAX_EXPANDED_TERMS. The degrees (k times the largest
    exponent inside the base) add up to at most MAX_SYMBOLIC_DEGREE (a product of two
    cancellations of degree 64 takes 9 s). Both budgets halve for each function (sin, log,
    floor, a binomial of a variable), to an eighth. No integral, sum, product or limit, no
    binomial of a binomial. Assumes `within_limits(s)`."""
    if _CALCULUS_RE.search(s):
        return False
    if not _symbolic(s):
        return True  # rational arithmetic only, bounded by within_limits
    binomials = [(top, bottom) for top, bottom in _binomials(s) if _symbolic(top + bottom)]
    # Functions of expressions multiply the forms SymPy tries (trigonometric identities, the
    # expansion of a binomial): each halves both budgets.
    scale = 2 ** min(len(_FUNCTION_RE.findall(s)) + len(binomials), 3)
    max_degree, max_terms = MAX_SYMBOLIC_DEGREE // scale, MAX_EXPANDED_TERMS // scale
    estimate, degree = 1, 0
    powered = set()
    for top, bottom in binomials:
        if "binom" in top or not bottom.strip().isdigit():
            return False  # nested, or a symbolic lower index: no polynomial degree to bound
        k = int(bottom)
        degree += k * _largest_exponent(top)
        estimate *= math.comb(_size(top) + k - 1, k)
        if degree > max_degree or estimate > max_terms:
            return False
    for i, exponent in exponents(s):
        start = _base_start(s, i)
        base = s[start:i].strip()
        if not _symbolic(base) or not numeric(exponent):
            continue
        k = _int_product(exponent, MAX_SYMBOLIC_DEGREE + 1)
        bracketed = base[:1] in "([{" and base[-1:] in ")]}"
        degree += k * (_largest_exponent(base[1:-1]) if bracketed else 1)
        if degree > max_degree:
            return False
        if bracketed:
            powered.add(start)
            estimate *= math.comb(_size(base[1:-1]) + k - 1, k)
            if estimate > max_terms:
                return False
    # Groups without a power multiply out too: (a+b)(c+d) has the product of the sizes.
    stack = []
    for j, ch in enumerate(s):
        if ch in "([{":
            stack.append(j)
        elif ch in ")]}" and stack:
            start = stack.pop()
            if not stack and start not in powered:
                estimate *= _size(s[start + 1 : j])
                if estimate > max_terms:
                    return False
    return True
