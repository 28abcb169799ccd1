"""The math verifier against a table of (reference, completion, expected verdict) cases shaped
like MATH / NuminaMath / OpenThoughts data: every answer category, and wrong answers that look
right. Zero false positives is asserted; agreement is printed (`pytest -s`) and bounded below.

Conventions the table encodes (docs/rewards.md): a percentage matches its number and its
fraction (`12\\%` = 12 = 0.12); degrees and units are dropped; tuples and intervals are ordered
and their bracket types matter, sets and bare lists of solutions are not ordered, a set is never
a tuple; `x < 2` is not `x \\le 2`; named values must use the same names.

Also here: hypothesis-generated strings through the verifier (no crash, no eval, each call
within its limit) and adversarial answers through the process pool.
"""

import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scalerl_jax.rewards import RewardPool, extract_answer, verify_math
from scalerl_jax.rewards.math import MAX_COMPLETION_CHARS, is_equivalent, within_limits
from test_rewards import _NoEval  # tests/ is on sys.path (rootdir conftest)

COT = (
    "Let me think step by step. We set up the equation and simplify both sides, checking "
    "the arithmetic twice: 3 + 4 = 7 and 2 * 6 = 12.\n\n"
)


def boxed(answer: str) -> str:
    return f"{COT}Therefore the final answer is $\\boxed{{{answer}}}$."


# (reference, completion, expected)
CASES = [
    # ---- plain numbers, boxed
    ("12", boxed("12"), True),
    ("12", boxed("13"), False),
    ("-3", boxed("-3"), True),
    ("-3", boxed("3"), False),
    ("0", boxed("0"), True),
    ("\\frac{3}{4}", boxed("\\dfrac{3}{4}"), True),
    ("\\frac{3}{4}", boxed("\\frac34"), True),
    ("\\frac{3}{4}", boxed("0.75"), True),
    ("\\frac{3}{4}", boxed("\\frac{4}{3}"), False),
    ("\\frac{3}{4}", boxed("3/4"), True),
    ("-\\frac{1}{2}", boxed("\\frac{-1}{2}"), True),
    ("-\\frac{1}{2}", boxed("\\frac{1}{2}"), False),
    ("2\\sqrt{3}", boxed("\\sqrt{12}"), True),
    ("2\\sqrt{3}", boxed("3\\sqrt{2}"), False),
    ("\\frac{\\sqrt{2}}{2}", boxed("\\frac{1}{\\sqrt{2}}"), True),
    ("\\pi", boxed("\\pi"), True),
    ("2\\pi", boxed("\\pi"), False),
    ("\\frac{\\pi}{3}", boxed("\\pi/3"), True),
    ("1024", boxed("2^{10}"), True),
    ("1023", boxed("2^{10}"), False),
    ("\\sqrt[3]{27}", boxed("3"), True),
    ("3+4i", boxed("4i+3"), True),
    ("3+4i", boxed("3-4i"), False),
    ("\\log_2 8", boxed("3"), True),
    ("120", boxed("\\binom{10}{3}"), True),
    ("3628800", boxed("10!"), True),
    ("123456789012", boxed("123456789013"), False),
    # ---- decimals, percent, scientific notation
    ("0.5", boxed("\\frac{1}{2}"), True),
    ("0.33", boxed("\\frac{1}{3}"), True),  # rounded decimal reference
    ("0.33", boxed("0.3"), False),
    ("2.5", boxed("2.54"), False),
    ("3.14", boxed("\\pi"), True),
    ("1.5", boxed("1.50"), True),
    ("12\\%", boxed("12\\%"), True),
    ("12\\%", boxed("0.12"), True),  # convention: a percentage matches its fraction
    ("12\\%", boxed("12"), True),
    ("12\\%", boxed("0.13"), False),
    ("12\\%", boxed("21\\%"), False),
    ("0.12", boxed("12\\%"), True),
    ("25", boxed("25 percent"), True),
    ("1500", boxed("1.5 \\times 10^{3}"), True),
    ("1500", boxed("1.5 \\cdot 10^3"), True),
    ("1500", boxed("1.5 \\times 10^{4}"), False),
    ("6.02 \\times 10^{23}", boxed("6.02e23"), True),
    ("100000", boxed("1e5"), True),
    # ---- thousands separators
    ("1000000", boxed("1,000,000"), True),
    ("1000", boxed("1{,}000"), True),
    ("1000", boxed("1\\,000"), True),
    ("10000", boxed("10 000"), True),
    # deny by default: words after a final number that are no unit may qualify it
    ("1250", "we get 10 apples and then 1,250 pears", False),
    ("1250", "we get 10 apples and then 1,250 in total.", True),
    ("1250", boxed("1,205"), False),
    # ---- units and degrees
    ("90", boxed("90^\\circ"), True),
    ("90", boxed("90^{\\circ}"), True),
    ("90^\\circ", boxed("90"), True),
    ("90", boxed("45^\\circ"), False),
    ("5", boxed("5\\text{ cm}"), True),
    ("12", boxed("12 \\text{ cm}^2"), True),
    ("12", boxed("12\\text{ m}"), True),
    ("30", "The answer is 30 dollars.", True),
    ("42", boxed("\\$42"), True),
    ("60", boxed("60 \\text{ mph}"), True),
    ("60", boxed("61 \\text{ mph}"), False),
    ("7", boxed("7."), True),
    # ---- text answers
    ("\\text{Evelyn}", boxed("\\text{Evelyn}"), True),
    ("\\text{Evelyn}", boxed("\\text{evelyn}"), True),
    ("\\text{Evelyn}", boxed("\\text{Emily}"), False),
    ("\\text{Yes}", boxed("\\text{yes}"), True),
    ("\\text{Yes}", boxed("\\text{No}"), False),
    ("\\text{no solution}", boxed("\\text{No solution}"), True),
    ("\\text{Monday}", "So the meeting falls on a **Monday**.\n\nAnswer: Monday", True),
    ("\\text{odd}", boxed("\\text{even}"), False),
    # ---- multiple choice
    ("B", boxed("B"), True),
    ("B", boxed("(B)"), True),
    ("B", boxed("\\text{(B)}"), True),
    ("B", boxed("\\textbf{(B)}"), True),
    ("B", "Comparing the options, the answer is (B).", True),
    ("B", "The correct choice is therefore\n\nAnswer: B", True),
    ("B", boxed("(B) 12"), True),
    ("B", boxed("C"), False),
    ("B", boxed("(C)"), False),
    ("\\text{(D)}", boxed("D"), True),
    ("\\text{(D)}", boxed("\\text{(A)}"), False),
    ("C", boxed("12"), False),
    # ---- unboxed final answers
    ("5", "Adding them up gives 5", True),
    ("5", "so the total is $5$.", True),
    ("5", "Putting it together, $2 + 3 = 5$.", True),
    ("-7", "the balance ends at -7", True),
    ("2.5", "5-3 gives 2.5", True),
    ("\\frac{3}{4}", "so the ratio is 3/4", True),
    ("\\{1, 2\\}", "Hence the solution set is $\\{1, 2\\}$.", True),
    ("\\frac{1}{2}", "The probability is $\\frac{1}{2}$.", True),
    ("\\frac{1}{2}", "The probability is $\\frac{1}{3}$.", False),
    ("x = 3", "Answer: x = 3\nbecause the line crosses there", True),
    ("5", "<think>maybe 5</think>The answer is 6", False),
    ("5", "<think>the answer is 5", False),  # thought never closed: no answer
    ("1", "We find the interval -[0,1)", False),
    ("2", "The ratio is \\frac{1+\\sqrt{5}}{2}", False),
    ("2", "so x equals $\\frac{1+\\sqrt{5}}{2}$", False),
    ("5", "We compute 2*5", False),
    ("10", "which is 2^{10}", False),
    ("3", "the roots are 1, 2, 3", False),
    ("2", "and the value is x2", False),
    ("4", "so f(4)", False),
    ("1", "the set is {0, 1}", False),
    ("6", "so the answer is 3!", True),  # 3! = 6, from the "answer is" phrase
    ("3", "so we get 3!", False),  # the number of an expression is no fallback answer
    # ---- equations and named values
    ("3", boxed("x = 3"), True),
    ("x = 3", boxed("3"), True),
    ("x = 3", boxed("x=4"), False),
    ("x = 3", boxed("y = 3"), False),
    ("2x+1", boxed("y = 2x + 1"), True),
    ("a_3 = 2, a_{37} = 19", boxed("a_3 = 2, a_{37} = 19"), True),
    ("a_3 = 2, a_{37} = 19", boxed("a_{37} = 19, a_{3} = 2"), True),
    ("a_3 = 2, a_{37} = 19", boxed("a_3 = 19, a_{37} = 2"), False),
    ("a_3 = 2, a_{37} = 19", boxed("a_3 = 2, a_{38} = 19"), False),
    ("x = 1, y = 2", boxed("y = 2, x = 1"), True),
    ("x = 1, y = 2", boxed("x = 2, y = 1"), False),
    ("1, 2", boxed("x = 1, y = 2"), True),
    ("(1, 2)", boxed("(x, y) = (1, 2)"), True),
    ("3", boxed("x^2 = 9"), False),
    ("\\pm 1", boxed("1, -1"), True),
    ("1+\\sqrt{2}, 1-\\sqrt{2}", boxed("1 \\pm \\sqrt{2}"), True),
    # ---- sets (order-free) and bare solution lists
    ("\\{1, 2, 3\\}", boxed("\\{3, 1, 2\\}"), True),
    ("\\{1, 2, 3\\}", boxed("\\{1, 2\\}"), False),
    ("\\{1, 2, 3\\}", boxed("\\{1, 2, 4\\}"), False),
    ("\\{1, 2\\}", boxed("2, 1"), True),
    ("1, 2", boxed("2, 1"), True),
    ("1, 2", boxed("\\{2, 1\\}"), True),
    ("\\{1, 2\\}", boxed("(1, 2)"), False),  # a set is not a tuple
    ("(1, 2)", boxed("\\{1, 2\\}"), False),
    ("\\{-1, \\frac{1}{2}\\}", boxed("\\{0.5, -1\\}"), True),
    ("\\{\\sqrt{2}, -\\sqrt{2}\\}", boxed("\\pm\\sqrt{2}"), True),
    ("\\emptyset", boxed("\\emptyset"), True),
    # ---- tuples (ordered)
    ("(1, 2)", boxed("(1, 2)"), True),
    ("(1, 2)", boxed("\\left( 1, 2 \\right)"), True),
    ("(1, 2)", boxed("(2, 1)"), False),
    ("(1, 2)", boxed("[1, 2]"), False),  # bracket types matter
    ("(1, 2)", boxed("1, 2"), True),  # a bare list reads as the tuple, in order
    ("(1, 2)", boxed("2, 1"), False),
    ("(1, 2, 3)", boxed("(1, 2)"), False),
    ("(\\frac{1}{2}, -3)", boxed("(0.5, -3)"), True),
    ("(\\frac{1}{2}, -3)", boxed("(0.5, 3)"), False),
    ("(3, 4, 5)", boxed("(3; 4; 5)"), True),  # another separator
    ("(3, 4, 5)", boxed("(3; 5; 4)"), False),
    # ---- intervals and unions
    ("[1, 2)", boxed("[1, 2)"), True),
    ("[1, 2)", boxed("[1, 2]"), False),
    ("[1, 2)", boxed("(1, 2)"), False),
    ("(-\\infty, 3]", boxed("(-\\infty, 3]"), True),
    ("(-\\infty, 3]", boxed("(-\\infty, 3)"), False),
    ("(-\\infty, 1) \\cup (2, \\infty)", boxed("(-\\infty,1)\\cup(2,\\infty)"), True),
    ("(-\\infty, 1) \\cup (2, \\infty)", boxed("(2, \\infty) \\cup (-\\infty, 1)"), True),
    ("(-\\infty, 1) \\cup (2, \\infty)", boxed("(-\\infty, 1] \\cup (2, \\infty)"), False),
    ("(-\\infty, 1) \\cup (2, \\infty)", boxed("(-\\infty, 2)"), False),
    ("[1, 2]", boxed("x \\in [1, 2]"), True),
    ("1", boxed("-[0,1)"), False),
    ("(-\\infty, 2)", boxed("(-\\infty, 2.5)"), False),
    # ---- inequalities and relations
    ("x < 2", boxed("x < 2"), True),
    ("x < 2", boxed("2 > x"), True),
    ("x < 2", boxed("x \\le 2"), False),
    ("x \\le 2", boxed("x \\leq 2"), True),
    ("x \\le 2", boxed("x \\leqslant 2"), True),
    ("x \\ge 1", boxed("x > 1"), False),
    ("x \\ge 1", boxed("1 \\le x"), True),
    ("1 < x \\le 3", boxed("1 < x \\leq 3"), True),
    ("1 < x \\le 3", boxed("1 \\le x < 3"), False),
    ("x < 2", boxed("x < 3"), False),
    ("x \\neq 0", boxed("x \\ne 0"), True),
    ("x < 2", boxed("(-\\infty, 2)"), True),
    # ---- matrices and vectors
    (
        "\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}",
        boxed("\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}"),
        True,
    ),
    (
        "\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}",
        boxed("\\begin{bmatrix} 1 & 2 \\\\ 3 & 4 \\end{bmatrix}"),
        True,
    ),
    (
        "\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}",
        boxed("\\begin{pmatrix} 1 & 3 \\\\ 2 & 4 \\end{pmatrix}"),
        False,
    ),
    (
        "\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}",
        boxed("\\begin{pmatrix} 1 & 2 & 3 & 4 \\end{pmatrix}"),
        False,
    ),
    (
        "\\begin{pmatrix} \\frac{1}{2} \\\\ -1 \\end{pmatrix}",
        boxed("\\begin{pmatrix} 0.5 \\\\ -1 \\end{pmatrix}"),
        True,
    ),
    (
        "\\begin{pmatrix} \\frac{1}{2} \\\\ -1 \\end{pmatrix}",
        boxed("\\begin{pmatrix} -1 \\\\ 0.5 \\end{pmatrix}"),
        False,
    ),
    # ---- expressions with variables
    ("x^2+2x+1", boxed("(x+1)^2"), True),
    ("x+1", boxed("\\frac{x^2-1}{x-1}"), True),
    ("1+2x", boxed("2x+2"), False),
    ("2x", boxed("x \\cdot 2"), True),
    ("\\frac{a}{b}", boxed("a/b"), True),
    ("\\frac{a}{b}", boxed("b/a"), False),
    ("e^{x^2}", boxed("e^{x^2}"), True),
    ("\\sin^2 x + \\cos^2 x", boxed("1"), True),
    # ---- look right, are wrong (same digits, wrong structure)
    ("2", boxed("\\frac{1+\\sqrt{5}}{2}"), False),
    ("1", boxed("-1"), False),
    ("12", boxed("1, 2"), False),
    ("1, 2", boxed("12"), False),
    ("21", boxed("12"), False),
    ("\\frac{1}{2}", boxed("\\frac{2}{1}"), False),
    ("0.5", boxed("5"), False),
    ("\\sqrt{2}", boxed("2"), False),
    ("2^{10}", boxed("210"), False),
    ("x = 2", boxed("x = 2, y = 3"), False),
    # ---- adversarial: refused by the limits, fast
    ("1", boxed("9^{9^{9^{9}}}"), False),
    ("1", boxed("9^9^9"), False),
    ("1", boxed("\\binom{10^9}{5*10^8}"), False),
    ("1", boxed("\\sum_{k=1}^{20000} k"), False),
    ("1", boxed("(" * 3000 + "1" + ")" * 3000), False),
    ("1", boxed("\\{" + ", ".join(map(str, range(5000))) + "\\}"), False),
    ("1", boxed("(10^{6})!"), False),
    ("1", boxed("2^{10000000}"), False),
    ("1", boxed("2^{1000 \\cdot 1000 \\cdot 1000}"), False),
    ("1", "9" * 1_000_000, False),
    ("1", boxed("1" + "+1" * 20000), False),
]


def _agreement(cases):
    misses = [(g, c[-80:], e) for g, c, e in cases if verify_math(c, g) is not e]
    return 1 - len(misses) / len(cases), misses


def test_table_covers_every_category():
    assert len(CASES) >= 150
    assert sum(e for *_, e in CASES) >= 60 and sum(not e for *_, e in CASES) >= 60


def test_no_false_positives():
    wrong = [CASES[i][:2] for i, (g, c, e) in enumerate(CASES) if not e and verify_math(c, g)]
    assert wrong == []


def test_agreement():
    agreement, misses = _agreement(CASES)
    print(f"\nmath verifier agreement: {agreement:.3f} on {len(CASES)} cases; misses: {misses}")
    assert agreement >= 0.98, misses


@pytest.mark.parametrize(
    "answer",
    [
        "9^{9^{9^{9}}}",
        "9^9^9",
        "\\binom{10^9}{5*10^8}",
        "\\sum_{k=1}^{20000} k",
        "(" * 3000,
        "\\{" + ",".join(["1"] * 5000) + "\\}",
        "(10^{6})!",
        "((5!)!)!",
        "10^{10^{10}}",
        "2^{2^{2^{2^{2}}}}",
        "x" * 1_000_000,
        "\\int_0^1 x^{1000000} dx",
        "2^{99999999}",
    ],
)
@pytest.mark.fast
def test_limits_refuse_before_parsing(answer):
    t0 = time.perf_counter()
    assert not within_limits(answer)
    assert not is_equivalent(answer, "1")
    assert time.perf_counter() - t0 < 0.1


def test_limits_accept_real_answers():
    for answer in [
        "2^{10}",
        "e^{x^2}",
        "\\binom{10}{3}",
        "10!",
        "\\sum_{k=1}^{n} k^2",
        "\\frac{1+\\sqrt{5}}{2}",
        "(-\\infty, 1) \\cup (2, \\infty)",
        "\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}",
        "10^{100}",
    ]:
        assert within_limits(answer), answer
    assert extract_answer("x" * (MAX_COMPLETION_CHARS + 1)) is None


_PIECES = st.sampled_from(
    [
        "\\boxed{",
        "\\frac{",
        "\\sqrt",
        "}",
        "{",
        "^",
        "^{",
        "9",
        "10",
        "!",
        "\\binom",
        "\\sum_{k=1}",
        "\\{",
        "\\}",
        "(",
        ")",
        "[",
        ",",
        "\\cup",
        "<",
        "\\le",
        "=",
        "x",
        "\\pi",
        "\\infty",
        "%",
        "\\text{",
        "\\begin{pmatrix}",
        "&",
        "\\\\",
        "\\end{pmatrix}",
        ".5",
        "-",
        "e",
    ]
)
_ANSWERS = st.lists(st.one_of(_PIECES, st.text(max_size=5)), max_size=30).map("".join)


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    answer=_ANSWERS,
    reference=st.one_of(
        _ANSWERS,
        st.sampled_from(["5", "\\frac{1}{2}", "(1,2)", "[1,2)", "x<2", "\\{1,2\\}", "B", "12\\%"]),
    ),
)
def test_generated_answers_return_fast(answer, reference):
    t0 = time.perf_counter()
    with _NoEval() as guard:
        result = verify_math(f"so \\boxed{{{answer}}}", reference)
    assert isinstance(result, bool) and guard.calls == []
    assert time.perf_counter() - t0 < 2.0


def test_adversarial_answers_through_the_process_pool():
    items = [(c, g) for g, c, e in CASES if g == "1" and not e]  # the adversarial block
    items += [(boxed("\\frac{1}{2}"), "0.5"), (boxed("(1, 2)"), "(1,2)")]
    with RewardPool(num_workers=2, timeout_s=5.0, processes=True) as pool:
        pool.score(verify_math, [(boxed("1"), "1")] * 2)  # children import the verifier once
        res = pool.score(verify_math, items)
    assert res.num_timeouts == 0 and res.num_errors == 0, res.error_example
    assert res.correct.tolist() == [False] * (len(items) - 2) + [True, True]
    assert res.seconds < 5.0
