"""Canonical text of a math answer (`normalize_answer`): LaTeX decoration, units, degrees, %,
thousands separators, mixed numbers, repeating decimals and relation macros rewritten so that
the comparison (`math_compare`) sees one spelling; plus the name pattern and the top-level
splitter that the comparison shares."""

from __future__ import annotations

import re

from scalerl_jax.rewards.math_extract import UNIT_WORDS, braced

TEXT_CMD_RE = re.compile(
    r"\\(?:text|textbf|textit|textrm|textnormal|mathrm|mathbf|mathit|mbox"
    r"|operatorname)\s*\{([^{}]*)\}"
)
_UNIT_RE = re.compile(
    r"(?<=[\d}).])\s*(?:" + UNIT_WORDS + r"|\s(?:m|g|s|in|l)|m²|€|£)"
    r"(?:\^\{?[23]\}?|[23])?\s*$"
)
NAME = r"[a-zA-Z](?:_\{?\w+\}?)?"
NAME_EQ_RE = re.compile(r"^\s*(" + NAME + r")\s*=(?!=)\s*")
_TUPLE_NAMES_RE = re.compile(r"^\s*\(\s*" + NAME + r"(?:\s*,\s*" + NAME + r")+\s*\)\s*=(?!=)\s*")
_IN_RE = re.compile(r"^\s*" + NAME + r"\s*\\in\s+")
_THOUSANDS_RE = re.compile(r"^-?[1-9]\d{0,2}(?:,\d{3})+(?:\.\d+)?$")
_SPACE_THOUSANDS_RE = re.compile(r"(?<![\d.,])([1-9]\d{0,2})((?: \d{3})+)(?![\d.,])")
_MIXED_RE = re.compile(r"(-?)(\d{1,6})\s*\\frac\{(\d{1,6})\}\{(\d{1,6})\}")
_REPEATING_RE = re.compile(r"(-?\d{0,12})\.(\d{0,12})\\overline\{(\d{1,12})\}")
_WIDE_SPACE = "\u2003"  # \quad, \;, ~: spacing that never groups digits (collapsed at the end)
_WRAPPED_MATRIX_RE = re.compile(
    r"^[(\[]\s*(\\begin\{([pbBvV]?matrix|array)\}.*\\end\{\2\})"
    r"\s*[)\]]$",
    re.DOTALL,
)
_RELATIONS = (
    ("\\leqslant", "\\le"),
    ("\\geqslant", "\\ge"),
    ("\\leq", "\\le"),
    ("\\geq", "\\ge"),
    ("\\neq", "\\ne"),
    ("<=", "\\le"),
    (">=", "\\ge"),
    ("!=", "\\ne"),
    ("≤", "\\le"),
    ("≥", "\\ge"),
    ("≠", "\\ne"),
    ("\\lt", "<"),
    ("\\gt", ">"),
    ("==", "="),
    ("\\approx", "≈"),
    ("\\simeq", "≈"),
    ("\\doteq", "≈"),
)


def split_top_level(s: str, sep: str = ",") -> list[str]:
    parts, depth, start = [], 0, 0
    for j, ch in enumerate(s):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif depth == 0 and s.startswith(sep, j) and not (sep == "," and s[j - 1 : j] == "\\"):
            parts.append(s[start:j])
            start = j + len(sep)
    parts.append(s[start:])
    return [x.strip() for x in parts]


def _repeating(whole: str, fixed: str, period: str) -> str:
    """The fraction of a repeating decimal: 0.1\\overline{6} -> \\frac{15}{90}."""
    sign, whole = ("-", whole[1:]) if whole.startswith("-") else ("", whole)
    den = (10 ** len(period) - 1) * 10 ** len(fixed)
    num = int(whole or 0) * den + int(fixed + period) - int(fixed or 0)
    return f"{sign}\\frac{{{num}}}{{{den}}}"


def _semicolons(s: str) -> str:
    """Semicolons separate like commas: "(3; 4; 5)", "-12;-11". Between groups that contain
    commas they separate tuples: "p=5,q=2;p=7,q=2" is (p=5,q=2), (p=7,q=2)."""
    parts = split_top_level(s, ";")
    if len(parts) > 1 and any(len(split_top_level(x)) > 1 for x in parts):
        return ", ".join(f"({x})" for x in parts)
    if "," not in s:
        return s.replace(";", ",")
    return re.sub(r"\(([^(),]*;[^(),]*)\)", lambda m: "(" + m.group(1).replace(";", ",") + ")", s)


def normalize_answer(s: str) -> str:
    """Canonical text form of an answer: LaTeX decoration, units, '$', trailing '.' removed."""
    s = s.strip()
    for left, right in (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
        if s.startswith(left) and s.endswith(right) and len(s) > len(left) + len(right):
            s = s[len(left) : -len(right)].strip()
    if "\\begin" not in s:  # "\\le": a line break glued to a command is that command
        s = re.sub(r"\\\\(?=[a-zA-Z])", r"\\", s)
    for _ in range(3):
        s = TEXT_CMD_RE.sub(r"\1", s)
    s = re.sub(r"\\(?:left|right|bigl|bigr|Bigl|Bigr|big|Big|displaystyle)(?![a-zA-Z])", "", s)
    s = re.sub(r"(?<=\d)\\,(?=\d{3})", "", s)  # "1\,000"
    s = re.sub(r"\s*\{\s*,\s*\}\s*", ",", s)  # 14{,}916
    s = re.sub(r",\s*\\!\s*", ",", s).replace("\\!", "")  # 10,\!000
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
