"""How a program's output is compared with the expected output (rules: docs/rewards.md,
"Code rewards"): linear in what the program wrote, and never raising on it (a number the comparator
cannot hold is wrong, not an error)."""

from __future__ import annotations

import decimal
import math
from decimal import Decimal
from typing import Any, Optional

FLOAT_TOL = Decimal("1e-6")
# Exact decimal arithmetic that never raises: the widest exponents, no trap (an unreadable number
# is a NaN, which compares unequal; a result past the exponent range is infinite, never close).
_DECIMAL = decimal.Context(prec=60, Emax=decimal.MAX_EMAX, Emin=decimal.MIN_EMIN, traps=[])


def _ascii_digits(text: str) -> bool:
    return text.isascii() and text.isdigit()


def _number_kind(token: str) -> Optional[str]:
    """The kind of a token: "int" (digits, an optional sign), "decimal" (a point or an
    exponent) or None (not a number). Linear in the token, with str methods: a backtracking
    regex here was quadratic on one long run of digits."""
    body = token[1:] if token[:1] in ("+", "-") else token
    mantissa, exponent, found = body, "", False
    for sep in "eE":
        if sep in body:
            mantissa, _, exponent = body.partition(sep)
            found = True
            break
    if found and not _ascii_digits(exponent[1:] if exponent[:1] in ("+", "-") else exponent):
        return None
    whole, dot, frac = mantissa.partition(".")
    if not (whole or frac) or not all(_ascii_digits(p) for p in (whole, frac) if p):
        return None
    return "int" if not (dot or found) else "decimal"


def _numbers_close(got: Decimal, expected: Decimal) -> bool:
    """Within FLOAT_TOL relative, or absolute for |expected| < 1; exact decimal arithmetic
    (`_DECIMAL`: no overflow, no exception)."""
    with decimal.localcontext(_DECIMAL):
        diff = abs(got - expected)
        return diff.is_finite() and diff <= FLOAT_TOL * max(abs(expected), Decimal(1))


def _tokens_equal(a: str, b: str) -> bool:
    """`a` written by the program, `b` expected."""
    if a == b:
        return True
    kind = _number_kind(b)
    if kind is None or _number_kind(a) is None:
        return False
    with decimal.localcontext(_DECIMAL):
        x, y = Decimal(a), Decimal(b)  # exact; NaN for an exponent beyond any range
    if kind == "int":  # "007" == "7", "12.0" == "12", but never a tolerance
        return x == y
    return _numbers_close(x, y)


def outputs_match(got: str, expected: str) -> bool:
    """Whitespace-insensitive token comparison (number rules in the module docstring). Linear
    in the two texts; never raises on what the program wrote."""
    a, b = got.split(), expected.split()
    try:
        return len(a) == len(b) and all(_tokens_equal(x, y) for x, y in zip(a, b))
    except (ArithmeticError, ValueError):
        return False


def values_match(got: Any, expected: Any) -> bool:
    """A decoded return value against the expected JSON value: lists and tuples element-wise,
    an integer expected exactly (a float equal to it is accepted), a float within the
    tolerance, bools never numbers. Never raises on what the program returned."""
    try:
        return _values_match(got, expected)
    except (ArithmeticError, ValueError, TypeError, RecursionError):
        return False


def _values_match(got: Any, expected: Any) -> bool:
    if isinstance(got, bool) or isinstance(expected, bool):
        return got is expected
    if isinstance(got, (int, float)) and isinstance(expected, (int, float)):
        if isinstance(expected, int):
            return got == expected  # int vs float in Python compares exactly, never overflows
        if not (math.isfinite(expected) and (isinstance(got, int) or math.isfinite(got))):
            return got == expected
        return _numbers_close(Decimal(got), Decimal(expected))
    if isinstance(got, (list, tuple)) and isinstance(expected, list):
        return len(got) == len(expected) and all(map(_values_match, got, expected))
    if isinstance(got, dict) and isinstance(expected, dict):
        return got.keys() == expected.keys() and all(
            _values_match(got[k], expected[k]) for k in got
        )
    return type(got) is type(expected) and got == expected


def call_match(got: Any, expected: Any) -> bool:
    """APPS stores many call-based outputs wrapped in a one-element list: accept either."""
    return values_match(got, expected) or (
        isinstance(expected, list) and len(expected) == 1 and values_match(got, expected[0])
    )
