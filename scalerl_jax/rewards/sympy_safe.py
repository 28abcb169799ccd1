"""A safe string -> SymPy parser for answers: a whitelist tokenizer and a recursive-descent parser.

Model text is never executed (`sympify` and `parse_expr` go through Python `eval`, so they are
not used). Numbers, single-letter symbols, + - * / ^, brackets, implicit multiplication with a
non-number on its right, \\frac, \\sqrt, pi, the usual functions, n! and \\binom of small
integers; anything else is refused and scores as wrong. Sizes are bounded and values are
computed by `evaluate_complex` in double precision. The grammar: docs/rewards.md.
"""

from __future__ import annotations

import cmath
import functools
import math
import re
from fractions import Fraction
from typing import Optional

import sympy

MAX_ANSWER_CHARS = 200  # longer answers are declined
MAX_TOKENS = 120
MAX_DEPTH = 40
MAX_POWER_BITS = 100_000  # integer powers whose result would exceed this many bits are refused

_TOKEN_RE = re.compile(
    r"\s*(?:((?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d{1,3}(?!\d))?)"  # number
    r"|(\\[a-zA-Z]+|[a-zA-Z]+)|([-+*/^(){}\[\]!_]))"
)  # command or word | op
_CONSTANTS = {
    "pi": sympy.pi,
    "\\pi": sympy.pi,
    "e": sympy.E,
    "i": sympy.I,
    "\\infty": sympy.oo,
    "infty": sympy.oo,
}
_FUNCTIONS = {
    "ln": sympy.log,
    "log": sympy.log,
    "exp": sympy.exp,
    "sin": sympy.sin,
    "cos": sympy.cos,
    "tan": sympy.tan,
    "sec": sympy.sec,
    "csc": sympy.csc,
    "cot": sympy.cot,
    "arcsin": sympy.asin,
    "arccos": sympy.acos,
    "arctan": sympy.atan,
}
MAX_FACTORIAL = 1000  # n! and binomials are computed exactly for integers up to this
_GREEK = ("alpha", "beta", "gamma", "theta", "phi", "lambda", "mu", "omega")


class _Reject(Exception):
    """The string is outside the whitelist grammar or its size limits."""


def _tokenize(s: str) -> list[tuple[str, str]]:
    tokens, i = [], 0
    while i < len(s):
        m = _TOKEN_RE.match(s, i)
        if m is None:
            if s[i:].strip():
                raise _Reject(f"character {s[i]!r}")
            break
        num, word, op = m.groups()
        if num is not None:
            if len(num) > 40:
                raise _Reject("number too long")
            tokens.append(("num", num))
        elif word is not None:
            name = word[1:] if word.startswith("\\") else word
            if (
                word in _CONSTANTS
                or name in _FUNCTIONS
                or name == "sqrt"
                or word in ("\\frac", "\\binom")
            ):
                tokens.append(("name", "\\" + name if word.startswith("\\") else word))
            elif name in _GREEK and word.startswith("\\"):
                tokens.append(("sym", name))
            elif len(word) == 1:
                tokens.append(("sym", word))
            else:
                raise _Reject(f"word {word!r}")
        else:
            tokens.append(("op", op))
        i = m.end()
        if len(tokens) > MAX_TOKENS:
            raise _Reject("too many tokens")
    return tokens


class _Parser:
    """expr := term (+|- term)*; term := unary (*|/|juxtaposition unary)*; unary := -unary |
    power; power := atom (^ signed-power)?; atom := number | symbol | constant | (expr) | {expr}
    | \\frac{}{} | \\sqrt[n]{} | function(arg)."""

    def __init__(self, tokens):
        self.tokens, self.i, self.depth = tokens, 0, 0

    def peek(self):
        return self.tokens[self.i] if self.i < len(self.tokens) else ("end", "")

    def take(self, value: Optional[str] = None):
        tok = self.peek()
        if tok[0] == "end" or (value is not None and tok[1] != value):
            raise _Reject(f"expected {value!r}, got {tok[1]!r}")
        self.i += 1
        return tok

    def parse(self):
        node = self.expr()
        if self.peek()[0] != "end":
            raise _Reject(f"trailing {self.peek()[1]!r}")
        return node

    def expr(self):
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise _Reject("nesting too deep")
        node = self.term()
        while self.peek()[1] in ("+", "-"):
            op = self.take()[1]
            rhs = self.term()
            node = _add(node, rhs if op == "+" else _neg(rhs))
        self.depth -= 1
        return node

    def _starts_atom(self) -> bool:
        kind, value = self.peek()
        return kind in ("num", "sym", "name") or value in ("(", "{")

    def term(self):
        node = self.unary()
        while True:
            value = self.peek()[1]
            if value in ("*", "/"):
                self.take()
                rhs = self.unary()
                node = _mul(node, rhs if value == "*" else _pow(rhs, sympy.S.NegativeOne))
            elif self._starts_atom():
                if self.peek()[0] == "num":
                    raise _Reject("two numbers side by side")  # "2 3" is no product
                if self.peek()[1] == "\\frac" and self.tokens[self.i - 1][0] == "num":
                    raise _Reject("a number before a fraction")  # 3\frac{1}{2}: 3.5 or 1.5?
                node = _mul(node, self.power())
            else:
                return node

    def unary(self):
        if self.peek()[1] in ("-", "+"):
            sign = self.take()[1]
            self.depth += 1
            if self.depth > MAX_DEPTH:
                raise _Reject("nesting too deep")
            node = self.unary()
            self.depth -= 1
            return _neg(node) if sign == "-" else node
        return self.power()

    def power(self):
        base = self.atom()
        while self.peek()[1] == "!":
            self.take()
            base = _factorial(base)
        if self.peek()[1] != "^":
            return base
        self.take()
        negative = False
        while self.peek()[1] in ("-", "+"):
            negative ^= self.take()[1] == "-"
        exponent = self.power()
        return _pow(base, _neg(exponent) if negative else exponent)

    def group(self):
        if self.peek()[1] == "{":
            self.take("{")
            node = self.expr()
            self.take("}")
            return node
        return self.atom()

    def atom(self):
        kind, value = self.take()
        if kind == "num":
            return sympy.Rational(Fraction(value))
        if kind == "sym":
            return sympy.Symbol(value)
        if value in ("(", "{"):
            node = self.expr()
            self.take(")" if value == "(" else "}")
            return node
        if kind != "name":
            raise _Reject(f"unexpected {value!r}")
        if value in _CONSTANTS:
            return _CONSTANTS[value]
        if value == "\\frac":
            numerator = self.group()
            return _mul(numerator, _pow(self.group(), sympy.S.NegativeOne))
        if value in ("\\sqrt", "sqrt"):
            if value == "\\sqrt" and self.peek()[1] == "[":
                self.take("[")
                index = self.expr()
                self.take("]")
                return _pow(self.group(), _pow(index, sympy.S.NegativeOne))
            return _pow(self.group(), sympy.S.Half)
        if value == "\\binom":
            return _binomial(self.group(), self.group())
        name = value.lstrip("\\")
        base = None
        if name == "log" and self.peek()[1] == "_":  # \log_2 8, \log_{b} x
            self.take()
            base = self.group()
        exponent = None
        if self.peek()[1] == "^":  # \sin^2 x is (sin x)^2
            self.take()
            exponent = self.group()
        node = _FUNCTIONS[name](self.group(), evaluate=False)
        if base is not None:
            node = _mul(node, _pow(sympy.log(base, evaluate=False), sympy.S.NegativeOne))
        return node if exponent is None else _pow(node, exponent)


def _small_integer(x) -> int:
    if not (x.is_Integer and 0 <= x <= MAX_FACTORIAL):
        raise _Reject(f"factorials and binomials need integers in [0, {MAX_FACTORIAL}]")
    return int(x)


def _factorial(x):
    return sympy.Integer(math.factorial(_small_integer(x)))


def _binomial(n, k):
    return sympy.Integer(math.comb(_small_integer(n), _small_integer(k)))


# Only rational arithmetic is evaluated (exact and cheap once powers are bounded: 2^10 is 1024,
# 4/2 is 2). Everything else stays an unevaluated tree: SymPy's automatic simplification of
# powers and functions can take seconds (integer root extraction, assumption queries), and
# equivalence is decided numerically with evalf, which handles such trees directly.
def _exact(*args) -> bool:
    return all(a.is_Rational for a in args)


def _add(a, b):
    return sympy.Add(a, b, evaluate=_exact(a, b))


def _mul(a, b):
    return sympy.Mul(a, b, evaluate=_exact(a, b))


def _neg(a):
    return _mul(sympy.S.NegativeOne, a)


def _pow(base, exponent):
    """base**exponent, refused when an exact result, or an evaluation of the tree, would be an
    enormous number (each bit of a Rational base multiplies the cost of the exponent)."""
    if not exponent.free_symbols:
        try:
            e = evaluate_complex(exponent)
        except (ArithmeticError, ValueError, TypeError):
            raise _Reject("exponent has no finite value") from None
        # A base with variables is never raised exactly (values are taken in double precision at
        # points), so only numeric bases count.
        size = (
            max(abs(base.p).bit_length(), base.q.bit_length(), 1)
            if base.is_Rational
            else 0
            if base.free_symbols
            else 64
        )
        if abs(e) * size > MAX_POWER_BITS:
            raise _Reject("power too large")
    return sympy.Pow(base, exponent, evaluate=_exact(base) and exponent.is_Integer)


_CMATH = {
    sympy.exp: cmath.exp,
    sympy.log: cmath.log,
    sympy.sin: cmath.sin,
    sympy.cos: cmath.cos,
    sympy.tan: cmath.tan,
    sympy.sec: lambda z: 1 / cmath.cos(z),
    sympy.csc: lambda z: 1 / cmath.sin(z),
    sympy.cot: lambda z: 1 / cmath.tan(z),
    sympy.asin: cmath.asin,
    sympy.acos: cmath.acos,
    sympy.atan: cmath.atan,
}
_CONSTANT_VALUES = {sympy.pi: cmath.pi, sympy.E: cmath.e, sympy.I: 1j}


def evaluate_complex(expr, env: Optional[dict] = None) -> complex:
    """The value of a parsed expression in double-precision complex arithmetic, symbols taken
    from `env`. Every step costs O(1), unlike SymPy's evalf, which needs precision proportional to
    the size of exp's argument (exp(exp(10^11)) would run for hours). Raises ArithmeticError
    (overflow, underflow of a power to 0, division by zero) or ValueError (undefined, unknown
    node)."""
    if expr.is_Symbol:
        if env is None or expr not in env:
            raise ValueError(f"no value for {expr}")
        return complex(env[expr])
    if expr.is_Rational:
        return complex(expr.p / expr.q)
    if expr.is_Float:
        return complex(float(expr))
    if expr in _CONSTANT_VALUES:
        return _CONSTANT_VALUES[expr]
    args = [evaluate_complex(a, env) for a in expr.args]
    if expr.is_Add:
        value = sum(args)
    elif expr.is_Mul:
        value = math.prod(args)
    elif expr.is_Pow:
        value = args[0] ** args[1]
        if value == 0 and args[0] != 0:  # 0.6^9999: underflow, no digit of the value is left
            raise ArithmeticError("underflow")
    elif expr.func in _CMATH:
        value = _CMATH[expr.func](args[0])
        if value == 0 and expr.func is sympy.exp:
            raise ArithmeticError("underflow")
    else:
        raise ValueError(f"cannot evaluate {expr.func}")
    if not (math.isfinite(value.real) and math.isfinite(value.imag)):
        raise OverflowError("non-finite value")
    return value


@functools.lru_cache(maxsize=4096)
def parse_math(s: str):
    """A SymPy expression for a whitelisted math string, or None when it is not accepted.
    Cached: list comparisons parse each element against every element of the other side, and
    SymPy expressions are immutable."""
    if not s or len(s) > MAX_ANSWER_CHARS:
        return None
    try:
        return _Parser(_tokenize(s)).parse()
    except (_Reject, ZeroDivisionError, ValueError, TypeError, OverflowError, RecursionError):
        return None
