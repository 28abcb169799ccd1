"""Scalar answers compared as numbers or expressions (`compare_scalars`), through
`sympy_safe`, which never executes model text. An exact reference is matched only by an answer
proved equal to it (`proved_equal`), never for being close; decimals match within 1e-6
relative or by rounding, with no absolute floor. The number rules: docs/rewards.md, "Math
answers".
"""

from __future__ import annotations

import cmath
import random
import re
from fractions import Fraction
from typing import Optional

import sympy

from scalerl_jax.rewards.math_limits import symbolic_ok
from scalerl_jax.rewards.sympy_safe import evaluate_complex, parse_math


def _value(expr, env: Optional[dict] = None) -> Optional[complex]:
    try:
        return evaluate_complex(expr, env)
    except (ArithmeticError, ValueError, TypeError):
        return None


def _relative(a: complex, b: complex, rel: float) -> bool:
    """|a - b| within `rel` of the larger magnitude: no absolute floor, so 0 matches only 0."""
    return abs(a - b) <= rel * max(abs(a), abs(b))


def _near(a: complex, b: complex) -> bool:
    """A filter before a proof, never a verdict: values that may be equal (sin(pi) ~ 1e-16)."""
    return abs(a - b) <= 1e-9 * max(1.0, abs(a), abs(b))


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


MAX_PROOF_NODES = 200
MAX_PROOF_BITS = 4096  # of any rational in a tree that SymPy evaluates symbolically
MAX_PROOF_POWER = 64  # integer exponent (or root degree) of an irrational base


def _provable(expr) -> bool:
    """Whether SymPy may evaluate and simplify `expr` at a bounded cost: a small tree, rationals
    of at most MAX_PROOF_BITS, and powers of irrational bases (sqrt(2)^n, pi^n) of small
    degree. Larger trees are never proved equal to anything (and so never match an exact
    reference)."""
    nodes = 0
    for node in sympy.preorder_traversal(expr):
        nodes += 1
        if nodes > MAX_PROOF_NODES:
            return False
        if node.is_Rational and max(abs(node.p), node.q).bit_length() > MAX_PROOF_BITS:
            return False
        if node.is_Pow and not node.args[0].is_Rational:
            e = node.args[1]
            if not e.is_Rational or max(abs(e.p), e.q) > MAX_PROOF_POWER:
                return False
    return True


def _evaluated(expr):
    """`expr` rebuilt with SymPy's automatic evaluation (the parser keeps trees unevaluated)."""
    if not expr.args:
        return expr
    return expr.func(*(_evaluated(a) for a in expr.args))


def proved_equal(p, g, p_text: str = "", g_text: str = "") -> bool:
    """Whether p - g is exactly 0: SymPy's evaluation, then (algebraic numbers) the minimal
    polynomial, or simplification. A difference that is merely tiny (exp(pi*sqrt(163)) is
    within 1e-12 of an integer) is not 0. Bounded by `_provable` and, for simplification
    with variables, `math_limits.symbolic_ok` on the texts."""
    if not (_provable(p) and _provable(g)):
        return False
    try:
        d = _evaluated(p) - _evaluated(g)
        if d == 0:
            return True
        if d.free_symbols:
            if not (symbolic_ok(p_text) and symbolic_ok(g_text)):
                return False
            return sympy.simplify(d) == 0
        if not d.has(sympy.pi, sympy.E, sympy.Function, sympy.exp, sympy.log):
            x = sympy.Dummy("x")
            return sympy.minimal_polynomial(d, x) == x
        # log(ab) = log a + log b up to 2*pi*i: the caller's numeric check rules that out.
        return sympy.simplify(sympy.expand_log(d, force=True)) == 0
    # SymPy signals what it cannot decide (minimal_polynomial, simplify) with these; undecided
    # is not equal: the reward denies what it cannot prove.
    except (ArithmeticError, ValueError, TypeError, NotImplementedError, RecursionError):
        return False


def _exact_value(g, gv: complex):
    """The rational that exact reference `g` provably equals (2 for sqrt(4)), else None."""
    if not _provable(g):
        return None
    ge = _evaluated(g)
    if ge.is_Rational:
        return ge
    if gv.imag == 0 and abs(gv.real) < 2**53 and abs(gv.real - round(gv.real)) < 1e-9:
        whole = sympy.Integer(round(gv.real))
        if proved_equal(whole, g):
            return whole
    return None


def _numbers_equal(p, g, p_text: str, g_text: str) -> bool:
    """Two numbers (no free symbols) under the number rules (docs/rewards.md)."""
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
        return k >= 2 and longer and abs(pv - gv) <= 0.5 * 10.0**-k
    # An exact reference: an exact answer must be proved equal to it; a decimal is exact too
    # when the reference has a finite decimal form (1000000.0 for 10^6, never 1000000.9).
    # (`_near` only spares the proof for values that differ.)
    if not p_decimal:
        return _near(pv, gv) and proved_equal(p, g)
    exact = _exact_value(g, gv)
    if exact is not None and _finite_decimal(exact):
        return _near(pv, gv) and proved_equal(p, exact)
    return _relative(pv, gv, 1e-6)  # a decimal for 1/3, pi, sqrt(2)


POINT_BITS = 21  # |coordinate| of the random integer points
MAX_EXACT_BITS = 1 << 20  # bound on any value's size while evaluating at a point exactly


def _exact_bits(expr) -> float:
    """An upper bound on the bits of any value met while evaluating `expr` exactly at a point,
    from the tree alone (nested powers multiply: (x^100)^100 is 10^4 * POINT_BITS); inf when
    `expr` is no rational function (a function, a constant, a non-integer exponent)."""
    if expr.is_Symbol:
        return POINT_BITS
    if expr.is_Rational:
        return max(abs(expr.p).bit_length(), expr.q.bit_length(), 1)
    if expr.is_Pow and expr.args[1].is_Integer:
        return _exact_bits(expr.args[0]) * max(abs(int(expr.args[1])), 1)
    if expr.is_Add or expr.is_Mul:  # over rationals a sum's denominators multiply, too
        return sum(_exact_bits(a) for a in expr.args) + len(expr.args)
    return float("inf")


def _rational_function(expr) -> bool:
    """Rationals and symbols under + * and integer powers, small enough to evaluate exactly at
    integer points (`_exact_bits` <= MAX_EXACT_BITS, bounded before anything is computed)."""
    return _exact_bits(expr) <= MAX_EXACT_BITS


def _exact_at(expr, point: dict):
    """`expr` at a rational point, exactly; None where it is undefined."""
    value = _evaluated(expr.xreplace(point))
    return value if value.is_Rational else None


def _rational_points(symbols, rng: random.Random):
    """Random integer points (fresh randomness: a wrong identity cannot be built to vanish
    at them; a true one holds at every point)."""
    for _ in range(8):
        yield {s: sympy.Integer(rng.randint(-(2**POINT_BITS), 2**POINT_BITS)) for s in symbols}


def _points(symbols, complex_plane: bool, rng: random.Random) -> dict:
    if complex_plane:  # on the unit circle x^9999 stays finite
        return {s: cmath.exp(1j * rng.uniform(0.1, 3.0)) for s in symbols}
    return {s: rng.uniform(0.5, 3.5) for s in symbols}


def _identity(p, g, p_text: str, g_text: str) -> Optional[bool]:
    """Expressions with the same variables. Rational functions: exact values at 3 random integer
    points (True when equal at all, False when different at one). Others: False when they differ
    at a point (real points, then the complex unit circle, where x^9999 stays finite); when they
    agree at 3, True only if `proved_equal`. None when undecided."""
    symbols = sorted(p.free_symbols, key=str)
    if _rational_function(p) and _rational_function(g):
        agreed = 0
        for point in _rational_points(symbols, random.SystemRandom()):
            pv, gv = _exact_at(p, point), _exact_at(g, point)
            if pv is None or gv is None:
                continue
            if pv != gv:
                return False
            agreed += 1
            if agreed == 3:
                return True
        return None
    rng = random.Random(20251013)  # deterministic, bounded work
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
            if agreed == 3:  # agreeing values are no proof (x + 10^{-10} is not x)
                return proved_equal(p, g, p_text, g_text)
    return None


def _values_equal(p, g, p_text: str, g_text: str) -> Optional[bool]:
    """Numbers: True / False. Expressions: `_identity`; None with different variables."""
    if p.free_symbols != g.free_symbols:  # 1 for sin^2 x + cos^2 x: only a proof decides
        return True if proved_equal(p, g, p_text, g_text) else None
    if not p.free_symbols:
        return _numbers_equal(p, g, p_text, g_text)
    return _identity(p, g, p_text, g_text)


def proportional(dp, dg) -> Optional[bool]:
    """Whether two expressions (the sides of two equations, subtracted) are nonzero multiples
    of each other: `2x + 4y - 3` and `y + x/2 - 3/4`."""
    if dp.free_symbols != dg.free_symbols or not dp.free_symbols:
        return None
    symbols = sorted(dp.free_symbols, key=str)
    if _rational_function(dp) and _rational_function(dg):
        ratios = set()
        for point in _rational_points(symbols, random.SystemRandom()):
            pv, gv = _exact_at(dp, point), _exact_at(dg, point)
            if pv is not None and gv is not None and pv != 0 and gv != 0:
                ratios.add(pv / gv)
        return len(ratios) == 1 if ratios else None
    rng = random.Random(20251013)
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


def decimal_comma(p: str, g: str) -> bool:
    """`1,22` for 1.22 (and the reverse): a comma with two or more digits after it that is no
    thousands group, against a decimal with the same value."""
    for a, b in ((p, g), (g, p)):
        if _DECIMAL_COMMA_RE.fullmatch(a) and re.fullmatch(r"-?\d*\.\d+", b):
            return Fraction(a.replace(",", ".")) == Fraction(b)
    return False


_BASE_RE = re.compile(r"([0-9A-Za-z]{1,64})_\{?(\d{1,2})\}?")


def _base_numeral(s: str) -> Optional[tuple[int, int]]:
    """(base, value) of `1010_2` (plain digits: base 10); None for anything else, and for a
    digit the base does not have (`12_2`)."""
    m = _BASE_RE.fullmatch(s)
    text, base = (m.group(1), int(m.group(2))) if m else (s, 10)
    if not 2 <= base <= 36 or (m is None and not s.isdigit()):
        return None
    try:
        return base, int(text, base)
    except ValueError:
        return None


def compare_scalars(p: str, g: str) -> Optional[bool]:
    """True / False when decided, None when the parser cannot read one side."""
    if p == g or p.replace(" ", "") == g.replace(" ", ""):
        return True
    if "_" in p + g and (_BASE_RE.fullmatch(p) or _BASE_RE.fullmatch(g)):
        # Numbers in a base: same base, same value (`1010` is not `1010_2`, nor is `10`).
        pb = _base_numeral(p)
        return pb is not None and pb == _base_numeral(g)
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
