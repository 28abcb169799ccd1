"""Scalar answers compared as numbers or expressions (`compare_scalars`), through
`sympy_safe`, which never executes model text.

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
"""

from __future__ import annotations

import cmath
import random
import re
from fractions import Fraction
from typing import Optional

import sympy

from scalerl_jax.rewards.sympy_safe import evaluate_complex, parse_math


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
        return k >= 2 and longer and abs(pv - gv) <= 0.5 * 10.0**-k
    if p_decimal and not g.is_Rational and gv.imag == 0 and abs(gv.real) < 2**53:
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


def proportional(dp, dg) -> Optional[bool]:
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


def decimal_comma(p: str, g: str) -> bool:
    """`1,22` for 1.22 (and the reverse): a comma with two or more digits after it that is no
    thousands group, against a decimal with the same value."""
    for a, b in ((p, g), (g, p)):
        if _DECIMAL_COMMA_RE.fullmatch(a) and re.fullmatch(r"-?\d*\.\d+", b):
            return Fraction(a.replace(",", ".")) == Fraction(b)
    return False


def compare_scalars(p: str, g: str) -> Optional[bool]:
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
