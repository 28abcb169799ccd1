"""Our verdict on two normalised answers (`compare`): the structural rules of step 4 in
`math.py`'s pipeline (hedges, multiple choice, matrices, inequalities, equations, unions,
named values, sets, tuples and intervals), down to scalars (`math_numbers`). None: undecided,
which the caller scores as wrong (deny by default)."""

from __future__ import annotations

import re
from typing import Optional

import sympy

from scalerl_jax.rewards.math_normalize import NAME, NAME_EQ_RE, split_top_level
from scalerl_jax.rewards.math_numbers import (
    compare_scalars,
    decimal_comma,
    proportional,
    proved_equal,
)
from scalerl_jax.rewards.sympy_safe import parse_math

MAX_COMPARE_DEPTH = 4  # nested structures compared element-wise (a list of tuples of values)


def _balanced(s: str) -> bool:
    depth = 0
    for ch in s:
        depth += ch in "([{"
        depth -= ch in ")]}"
        if depth < 0:
            return False
    return depth == 0


def collection(s: str) -> tuple[str, list[str]]:
    """('set' | 'bare' | opening+closing bracket, elements); 'scalar' when not a list."""
    if s.startswith("\\{") and s.endswith("\\}") and _balanced(s[2:-2]):
        return "set", split_top_level(s[2:-2])
    if len(s) >= 2 and s[0] in "([" and s[-1] in ")]":
        inner = s[1:-1]
        if "," in inner and _balanced(inner) and all(split_top_level(inner)):
            return s[0] + s[-1], split_top_level(inner)
    if s.count("\\pm") == 1 and "," not in s:
        return "set", [s.replace("\\pm", "+"), s.replace("\\pm", "-")]
    parts = [x for x in split_top_level(s) if x]
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
    m = NAME_EQ_RE.match(item)
    if m is None or "=" in item[m.end() :] or "≈" in item[m.end() :]:
        return None, item
    return _name_key(m.group(1)), item[m.end() :].strip()


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
            verdict = compare(a, b, depth + 1)
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
        return _all_true(compare(p_map[k], g_map[k], depth + 1) for k in g_map)
    p_values, g_values = [v for _, v in p_named], [v for _, v in g_named]
    if not ordered:
        return _unordered(p_values, g_values, depth)
    if len(p_values) != len(g_values):
        return False
    return _all_true(compare(a, b, depth + 1) for a, b in zip(p_values, g_values))


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
    if any(re.fullmatch(r"-\s*" + NAME, x) for x in operands) and "\\ne " not in ops:
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


_MATRIX_RE = re.compile(
    r"^\\begin\{([pbBvV]?matrix|array)\}(?:\{[^{}]*\})?(.*)\\end\{\1\}$", re.DOTALL
)


def _matrix(s: str) -> Optional[list[list[str]]]:
    m = _MATRIX_RE.match(s) if s.count("\\begin") == 1 else None
    if m is None:
        return None
    rows = [r for r in split_top_level(m.group(2), "\\\\") if r]
    return [[c.strip() for c in r.split("&")] for r in rows]


_MATRIX_TERM_RE = re.compile(r"\\begin\{([pbBvV]?matrix)\}(.*?)\\end\{\1\}", re.DOTALL)


def _matrix_expression(s: str):
    """The value (a SymPy Matrix) of matrices joined by +, - and products (`A + B`, `A B`,
    `A * B`); None when `s` is anything else."""
    pos, result = 0, None
    for m in _MATRIX_TERM_RE.finditer(s):
        op = s[pos : m.start()].strip()
        if (result is None and op) or op not in ("", "+", "-", "*"):
            return None
        rows = _matrix(m.group(0)) or []
        cells = [[parse_math(c) for c in row] for row in rows]
        if not cells or any(c is None for row in cells for c in row):
            return None
        if len({len(row) for row in cells}) != 1:
            return None
        value = sympy.Matrix(cells)
        if result is None:
            result = value
        else:
            result = (
                result + value if op == "+" else result - value if op == "-" else result * value
            )
        pos = m.end()
    return None if result is None or s[pos:].strip() else result


def _choice(s: str, whole: bool) -> Optional[str]:
    """The letter of a multiple-choice answer: "B", "(B)", and unless `whole`, "(B) 12" (but
    not "(B) (C)": two choices are a hedge)."""
    m = re.fullmatch(r"\(?([A-J])\)?", s)
    if m:
        return m.group(1)
    m = None if whole else re.fullmatch(r"(?:\(([A-J])\)|([A-J])[.:)])\s(.*)", s)
    rest = m.group(3).strip() if m else ""
    if (
        m is None
        or parse_math(rest) is None
        or re.search(r"[A-Za-z]", re.sub(r"\\[a-z]+", "", rest))
    ):
        return None  # the option's text must be a value: "(B) is wrong", "(B) (C)" are not
    return m.group(1) or m.group(2)


def _chain_parts(s: str) -> list[str]:
    """The sides of `a = b \\approx c` (s itself when it has no top-level relation or is a
    list)."""
    if len(split_top_level(s)) > 1:
        return [s]
    parts = [x for part in split_top_level(s, "=") for x in split_top_level(part, "≈")]
    return parts if len(parts) > 1 else [s]


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
    return proportional(
        sympy.Add(pl, sympy.Mul(-1, pr, evaluate=False), evaluate=False),
        sympy.Add(gl, sympy.Mul(-1, gr, evaluate=False), evaluate=False),
    )


def _chain(p: str, g: str, depth: int):
    """Verdict for answers with `=` / `\\approx` (NotImplemented when neither has one). A gold
    equation (no side a label) needs an equivalent equation; otherwise every value the
    prediction states must equal the gold's final value: `2 = 3` and `x = 1/3 \\approx 1.3`
    are hedges, wrong whichever side is right."""
    p_parts, g_parts = _chain_parts(p), _chain_parts(g)
    if len(p_parts) == 1 and len(g_parts) == 1:
        return NotImplemented
    if p.startswith("=") and len(p_parts) == 2:
        return compare(p[1:].strip(), g, depth + 1)  # "= \\frac{10}{9}" continues a computation
    if not all(p_parts) or not all(g_parts):
        return False  # "\\approx 5", "x =": a relation with a side missing
    if len(g_parts) == 2 and not any(_name_like(x) for x in g_parts):
        return _equations(p_parts, g_parts) if len(p_parts) == 2 else False
    g_names, g_values = _names_values(g_parts)
    p_names, p_values = _names_values(p_parts)
    if p_names and g_names and not set(p_names) & set(g_names):
        return False  # "y = 2" for "x = 2"
    verdicts = [compare(v, g_values[-1], depth + 1) for v in p_values]
    return verdicts[0] if len(verdicts) == 1 else all(v is True for v in verdicts)


_JUXTAPOSED_RE = re.compile(r"[\d)\]}]\s+\.?\d")  # "2 3", "\frac{1}{2} 3" (not matrices)


def _compare_matrices(p: str, g: str, pm, gm, depth: int) -> Optional[bool]:
    """Answers of which at least one is a matrix: entry by entry, or as matrix expressions."""
    if pm is None or gm is None:
        pe, ge = _matrix_expression(p), _matrix_expression(g)  # "A + B" against a matrix
        if pe is None or ge is None or "." in p + g:
            return None
        return pe.shape == ge.shape and all(proved_equal(a, b) for a, b in zip(pe, ge))
    if [len(r) for r in pm] != [len(r) for r in gm]:
        return False
    return _all_true(compare(a, b, depth + 1) for pr, gr in zip(pm, gm) for a, b in zip(pr, gr))


def _compare_unions(p_union: list, g_union: list, depth: int) -> Optional[bool]:
    """Unions of sets or intervals: equal when each part of one matches a part of the other."""
    if len(p_union) != len(g_union):
        return False if len(p_union) > 1 and len(g_union) > 1 else None
    p_parts, g_parts = [collection(x) for x in p_union], [collection(x) for x in g_union]
    remaining = list(g_parts)
    for kind, items in p_parts:
        hit = next(
            (
                j
                for j, (k, xs) in enumerate(remaining)
                if k == kind and _items(items, xs, True, depth) is True
            ),
            None,
        )
        if hit is None:
            return None
        remaining.pop(hit)
    return True


def compare(p: str, g: str, depth: int = 0) -> Optional[bool]:
    """Our verdict on normalised answers: True / False when decided, None when undecided."""
    if p == g:
        return True
    letter = _choice(g, whole=True)
    if letter is not None:
        return _choice(p, whole=False) == letter
    if "\\begin" not in p and _JUXTAPOSED_RE.search(re.sub(r"_\{[^{}]*\}|_\w", "_", p)):
        return False  # "2 \quad 3", "12 \; 5": two numbers, not their product (nor 125)
    if p.replace(" ", "") == g.replace(" ", ""):
        return True
    if depth > MAX_COMPARE_DEPTH or not p or not g:
        return None if p and g else False
    pm, gm = _matrix(p), _matrix(g)
    if pm is not None or gm is not None:
        return _compare_matrices(p, g, pm, gm, depth)
    if decimal_comma(p, g):
        return True
    pi, gi = _inequality(p), _inequality(g)
    if pi is not None or gi is not None:
        if pi is None or gi is None:
            # "-2 < x \le 3" vs "(-2, 3]": compare as intervals; else undecided
            p_iv, g_iv = (_as_interval(pi) if pi else p), (_as_interval(gi) if gi else g)
            return None if p_iv is None or g_iv is None else compare(p_iv, g_iv, depth + 1)
        if pi[1] != gi[1] or len(pi[0]) != len(gi[0]):
            return False  # "x < 2" is not "x \le 2"
        return _all_true(compare(a, b, depth + 1) for a, b in zip(pi[0], gi[0]))
    verdict = _chain(p, g, depth)
    if verdict is not NotImplemented:
        return verdict
    p_union, g_union = split_top_level(p, "\\cup"), split_top_level(g, "\\cup")
    if len(p_union) > 1 or len(g_union) > 1:
        return _compare_unions(p_union, g_union, depth)
    p_kind, p_items = collection(p)
    g_kind, g_items = collection(g)
    kinds = {p_kind, g_kind}
    if kinds == {"scalar"}:
        return compare_scalars(p, g)
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
