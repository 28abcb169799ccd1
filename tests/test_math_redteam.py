"""Red team for the math verifier (issue 23, item 3): each class of attack found against it,
asserting that the answer is not accepted, or that the input returns within its limit.

Classes: hedges (`=` chains with different values, `\\approx` between different values,
alternatives joined by "or"), numbers side by side read as a product, inexact decimals for an
exact integer reference, zero (or any absolute-tolerance neighbour) for a small nonzero
reference, inputs that made SymPy / math-verify compute for a minute or fill gigabytes, and
completions that made an extraction pattern quadratic. The pool tests run reward children with a
memory cap and show both that real answers fit in it and that a verifier exceeding it is scored
as an error while the pool goes on. Nothing here is destructive: the memory test asks a child
for 3 GiB that its cap refuses before anything is allocated.
"""

import operator
import time

import pytest

from scalerl_jax.rewards import RewardPool, verify_math
from scalerl_jax.rewards.math import extract_answer, is_equivalent
from scalerl_jax.rewards.math_extract import MAX_COMPLETION_CHARS
from scalerl_jax.rewards.math_limits import symbolic_ok, within_limits


def boxed(answer: str) -> str:
    return f"We work it out step by step.\n\nThe final answer is $\\boxed{{{answer}}}$."


# (reference, answer): each answer states something besides the reference value.
HEDGES = [
    ("3", "2 = 3"),
    ("2", "2 = 3"),
    ("11", "x = 5+5+1 = 7 = 11"),
    ("5", "2+2 = 5"),
    ("3", "2 \\approx 3"),
    ("2", "2 \\approx 3"),
    ("\\frac{1}{3}", "x = \\frac{1}{3} \\approx 1.3"),
    ("4", "4 \\approx 4.0001"),
    ("3", "2 \\simeq 3"),
    ("B", "(B) \\text{ or } (C)"),
    ("B", "\\textbf{(B)} \\text{ or } \\textbf{(C)}"),
    ("B", "B \\text{ or } C"),
    ("B", "\\text{B or C}"),
    ("B", "(B) (C)"),
    ("B", "B, C"),
    ("4", "3 or 4"),
    ("4", "4 \\text{ or } 3"),
    ("4", "4 \\text{ (or 3)}"),
    ("4", "x = 3 \\text{ or } x = 4"),
    ("4", "3, 4"),
    ("4", "\\{3, 4\\}"),
    ("4", "3 \\pm 1"),
]


@pytest.mark.parametrize("reference,answer", HEDGES)
def test_hedges_are_not_accepted(reference, answer):
    assert not verify_math(boxed(answer), reference)


@pytest.mark.fast
def test_hedges_across_boxes_and_sentences_are_not_accepted():
    assert not verify_math("So $x = \\boxed{3}$ or $x = \\boxed{4}$.", "4")
    assert not verify_math("Either \\boxed{3}, \\boxed{4}", "4")
    assert not verify_math("\\boxed{4}\n\nFinal answer: the answer is 3 or 4.", "4")
    assert not verify_math("Final Answer: it is approximately 4, maybe 5.", "5")


def test_answers_that_only_look_like_hedges_are_accepted():
    # Controls: one value stated, or every stated value equal to the reference.
    assert verify_math(boxed("x = 4"), "4")
    assert verify_math(boxed("2 + 2 = 4"), "4")
    assert verify_math(boxed("x \\approx 11"), "11")
    assert verify_math(boxed("(B) 12"), "B")
    assert verify_math(boxed("x = 4 \\text{ or } x = -4"), "\\pm 4")
    assert verify_math("\\boxed{1} and \\boxed{2}", "1, 2")


@pytest.mark.parametrize(
    "answer,product",
    [
        ("2 \\quad 3", "6"),
        ("12 \\; 5", "60"),
        ("2~3", "6"),
        ("2\\,3", "6"),
        ("2\\ 3", "6"),
        ("2 3", "6"),
        ("2 \\qquad 3", "6"),
        ("2\\:3", "6"),
        ("12 \\; 500", "12500"),
        ("2 \\quad 300", "2300"),
        ("\\frac{1}{2} 3", "\\frac{3}{2}"),
    ],
)
def test_numbers_side_by_side_are_no_product(answer, product):
    assert not verify_math(boxed(answer), product)


def test_thousands_separators_still_group_digits():
    for answer, value in [
        ("1\\,000", "1000"),
        ("10 000", "10000"),
        ("1,000,000", "1000000"),
        ("1{,}000", "1000"),
        ("10,\\!000", "10000"),
        ("12 500", "12500"),
    ]:
        assert verify_math(boxed(answer), value), answer


@pytest.mark.parametrize(
    "answer,reference",
    [
        ("1000000.9", "1000000"),
        ("123456800.0", "123456789"),
        ("1.8446744e19", "2^{64}"),
        ("4.0000001", "4"),
        ("3.9999999", "4"),
        ("0.1251", "\\frac{1}{8}"),
        ("2.0000001", "\\sqrt{4}"),
    ],
)
def test_inexact_decimals_for_exact_references_are_wrong(answer, reference):
    assert not verify_math(boxed(answer), reference)


@pytest.mark.parametrize(
    "answer,reference",
    [
        ("1000000.0", "1000000"),
        ("1.8446744073709551616e19", "2^{64}"),
        ("0.125", "\\frac{1}{8}"),
        ("0.333333", "\\frac{1}{3}"),
        ("3.14159265", "\\pi"),
        ("\\frac{1}{3}", "0.33"),
        ("0.334", "0.33"),
    ],
)
def test_exact_and_within_tolerance_decimals_are_right(answer, reference):
    assert verify_math(boxed(answer), reference)


@pytest.mark.parametrize(
    "answer,reference",
    [
        ("0.0", "\\frac{1}{10^7}"),
        ("0", "0.000001"),
        ("0", "10^{-9}"),
        ("1e-9", "0"),
        ("0.000000001", "0"),
        ("0", "10^{-20}\\sqrt{2}"),
        ("10^{-30}\\sqrt{2}", "0"),
        ("0.0000001", "0.0000002"),
    ],
)
def test_zero_and_absolute_neighbours_are_wrong(answer, reference):
    assert not verify_math(boxed(answer), reference)


def test_small_references_match_relatively():
    assert verify_math(boxed("1e-7"), "\\frac{1}{10^7}")
    assert verify_math(boxed("0.0000001"), "\\frac{1}{10^7}")
    assert verify_math(boxed("\\sin(\\pi)"), "0")  # exact zero: the 30-digit evaluation is ~1e-150


# Inputs that took from 10 s to over a minute (and, the first, gigabytes) before the size screens.
SLOW = {
    "cancellation": (boxed("\\frac{a^{9999}-b^{9999}}{a-b}"), "1"),
    "cancellation, other reference": (boxed("\\frac{a^{9999}-b^{9999}}{a-b}"), "a+b"),
    "expansion": (
        boxed("(" + "+".join("abcdefghijklmnopqr") + ")^{12} + \\lfloor 1 \\rfloor"),
        "1",
    ),
    "integral": (boxed("\\int_0^1 x^{12} \\sin(x) dx"), "1"),
    "product of cancellations": (
        boxed("\\frac{x^{16}-y^{16}}{x-y}\\cdot\\frac{z^{16}-w^{16}}{z-w} + \\lfloor 1 \\rfloor"),
        "1",
    ),
    "nested binomial": (boxed("\\binom{\\binom{z}{8} k}{9} + \\lfloor 1 \\rfloor"), "1"),
    "spans": ("We compute.\n" + "\\(" * 40_000, "1"),
}


@pytest.mark.parametrize("name", list(SLOW))
def test_slow_inputs_return_fast(name):
    completion, reference = SLOW[name]
    t0 = time.perf_counter()
    assert not verify_math(completion, reference)
    assert time.perf_counter() - t0 < 1.0, name


def test_size_screens():
    assert within_limits("\\frac{a^{9999}-b^{9999}}{a-b}")  # compared, by evaluation only
    eighteen = "+".join("abcdefghijklmnopqr")
    for answer in [
        "\\frac{a^{9999}-b^{9999}}{a-b}",
        f"({eighteen})^{{12}}",
        "\\int_0^1 x^2 dx",
        "\\sum_{k=1}^{n} k",
        "\\binom{\\binom{z}{8}}{9}",
        "(\\pi+3+\\pi)^{11}",
    ]:
        assert not symbolic_ok(answer), answer
    for answer in [
        "x^2 + 2x + 1",
        "(a+b)^{12}",
        "\\binom{n}{2}",
        "\\frac{x^4-1}{x-1}",
        "\\sin^2 x + \\cos^2 x",
        "2^{10000}",
        "\\lfloor x \\rfloor + 1",
    ]:
        assert symbolic_ok(answer), answer


def test_high_degree_identities_are_still_decided():
    # No symbolic algebra: evaluation at points on the unit circle, where a^9999 stays finite.
    t0 = time.perf_counter()
    assert is_equivalent("\\frac{a^{9999}-b^{9999}}{a-b}", "\\frac{b^{9999}-a^{9999}}{b-a}")
    assert is_equivalent("x^{9999}", "x \\cdot x^{9998}")
    assert not is_equivalent("x^{9999}", "x^{9998}")
    assert time.perf_counter() - t0 < 1.0


# Completions that repeat one piece up to the length limit: every extraction scan is linear.
PIECES = [
    "\\(",
    "$",
    "$$",
    "\\[",
    "\\boxed{",
    "\\boxed{1}",
    "\\boxed{1} and ",
    "answer is ",
    "Answer: ",
    "1,",
    "1 ",
    "{",
    "\\text{",
    "$1$ and ",
    "final ",
    "<think>",
    "x=",
    " ",
    "\\frac{1}{2}",
    ",\\!",
    "\\quad",
    "answer is $",
    "$x$ is ",
]


@pytest.mark.parametrize("piece", PIECES)
def test_extraction_is_linear(piece):
    body = piece * ((MAX_COMPLETION_CHARS - 40) // len(piece))
    t0 = time.perf_counter()
    for completion in ("We compute.\n" + body, body + " so \\boxed{1}"):
        verify_math(completion, "1")
    # A quadratic scan of 400k characters takes minutes (80k repeated "\(" took 10-27 s).
    assert time.perf_counter() - t0 < 2.0, piece


def test_reward_children_have_a_memory_cap():
    items = [SLOW[name] for name in SLOW] + [(boxed("\\frac{1}{2}"), "0.5")]
    with RewardPool(num_workers=1, timeout_s=10.0, processes=True, memory_mb=512) as pool:
        res = pool.score(verify_math, items)
        # Real answers and the slow classes fit in 512 MiB and return well within the limit.
        assert res.num_timeouts == 0 and res.num_errors == 0, res.error_example
        assert res.correct.tolist() == [False] * len(SLOW) + [True]
        assert res.seconds < 10.0
        # A verifier that needs more than the cap: MemoryError, scored as an error; the child
        # is replaced and the pool goes on.
        res = pool.score(operator.mul, [("x", 3 << 30), ("ab", 2)])
        assert res.num_errors == 1 and "MemoryError" in res.error_example
        assert res.correct.tolist() == [False, True]  # "abab" is truthy
        assert pool.score(operator.eq, [("a", "a")]).correct.all()


@pytest.mark.parametrize("memory_mb", [0, 100, -1, 2.5, "2048", True])
def test_memory_cap_is_validated(memory_mb):
    with pytest.raises(ValueError, match=f"memory_mb={memory_mb!r}"):
        RewardPool(num_workers=1, processes=True, memory_mb=memory_mb)


def test_extraction_reads_final_sentences_and_box_groups():
    assert extract_answer("Final Answer: The largest $n$ is 34.") == "34"
    assert extract_answer("Final Answer: Jane started 3 hours ago. I hope it is correct.") == "3"
    assert (
        extract_answer("\\boxed{200} ... Final Answer: The final answer is $10,455$.") == "10,455"
    )
    assert (
        extract_answer("$\\boxed{k = 45} \\quad \\text{and} \\quad \\boxed{n = 2}$")
        == "k = 45, n = 2"
    )
    assert (
        extract_answer("\\( y_1 = \\boxed{2x} \\) and \\( y_2 = \\boxed{3x} \\)")
        == "y_1 = 2x, y_2 = 3x"
    )
    assert extract_answer("first \\boxed{3}, finally \\boxed{4}") == "4"  # a correction
    assert extract_answer("Therefore $x \\geq 5$ is the solution.") == "x \\geq 5"
    assert extract_answer("so x \\geq 5") is None  # not 5


# ---- Issue 34: deny by default. Each class: answers that must be wrong, and honest controls.
# Text after a final number (or box) that changes, hedges or judges it.
TRAILING_TEXT = [
    ("5", "The result: 5 or 6"),
    ("5", "so we get 5 approximately"),
    ("5", "5 is wrong"),
    ("5", "I get 5, not 6"),
    ("5", "the count is 5 (maybe 6)"),
    ("5", "Answer: 5 is a guess"),
    ("5", "Final answer: $5$ approximately."),
    ("5", boxed("5 \\text{ is wrong}")),
    ("5", boxed("5 \\text{ approximately}")),
    ("5", boxed("5 \\text{ at least}")),
    ("5", boxed("5\\text{ (not sure)}")),
    ("5", "So $\\boxed{5}$ or $6$."),
    ("5", "So $\\boxed{5}$ is wrong."),
    ("5", "$\\boxed{5}$ approximately"),
    ("5", "$\\boxed{5} \\pm 1$"),
    ("5", "\\boxed{5} \\text{ (or 6)}"),
    ("5", "\\boxed{5}\\text{?}"),
    ("5", boxed("\\text{5 or 6}")),
    ("5", "Answer: **5** or 6"),
    ("5", "The answer is $5$ or $6$"),
    # ... or before it, in its sentence: alternatives that the last number alone would hide
    ("6", "I think 5 or 6"),
    ("6", "it is between 5 and 6"),
    ("6", "either 5 or\n6"),
    ("6", "maybe 6"),
]


@pytest.mark.parametrize("reference,completion", TRAILING_TEXT)
def test_text_after_an_answer_makes_it_wrong(reference, completion):
    assert not verify_math(completion, reference)


def test_prose_and_units_after_an_answer_stay_right():
    assert verify_math("Thus there are $\\boxed{2}$ distinct possible values for $B$.", "2")
    assert verify_math("So the area is \\(\\boxed{189}\\) square centimeters.", "189")
    assert verify_math("Therefore, $\\boxed{\\text{Evelyn}}$ is our answer.", "\\text{Evelyn}")
    assert verify_math("The total is 18 dollars.", "18")
    assert verify_math("She has 28 percent", "28\\%")
    assert verify_math("Final Answer: Jane started 3 hours ago. I hope it is correct.", "3")
    assert verify_math("the number is not 10, it is 1,000.99", "1000.99")  # a correction


# A box inside a box never hides the text around it.
NESTED_BOXES = [
    ("4", "3 \\text{ or } \\boxed{4}"),
    ("4", "\\boxed{3} \\text{ or } \\boxed{4}"),
    ("4", "3, \\boxed{4}"),
    ("4", "x = 3 \\boxed{4}"),
    ("4", "\\boxed{4} \\ne \\boxed{3}"),
]


@pytest.mark.parametrize("reference,answer", NESTED_BOXES)
def test_nested_boxes_hide_nothing(reference, answer):
    assert not verify_math(boxed(answer), reference)


def test_nested_boxes_that_state_one_answer_stay_right():
    assert verify_math(boxed("\\boxed{7}"), "7")
    assert verify_math(boxed("x = \\boxed{5}"), "5")


# Relations: both sides are read; a side missing or a relation not modelled is wrong.
RELATIONS = [
    ("5", "\\approx 5"),
    ("5", "\\sim 5"),
    ("5", "x \\to 5"),
    ("5", "5 \\implies 6"),
    ("5", "5 < 6"),
    ("5", "x \\ge 5"),
    ("5", "5 = 6"),
    ("6", "5 = 6"),
    ("5", "x = 5 < 6"),
    ("5", "5 \\in S"),
    ("5", "5 \\equiv 2 \\pmod 3"),
    ("x = 5", "x = 5 ="),
    ("B", "(B) \\text{ is wrong}"),
]


@pytest.mark.parametrize("reference,answer", RELATIONS)
def test_relations_are_read_on_both_sides(reference, answer):
    assert not verify_math(boxed(answer), reference)


def test_true_relations_stay_right():
    assert verify_math(boxed("x = 5"), "5")
    assert verify_math(boxed("2 + 3 = 5"), "5")
    assert verify_math(boxed("= \\frac{10}{9}"), "\\frac{10}{9}")
    assert verify_math(boxed("5 > x"), "x < 5")


# Subscripts: a base is compared as a base; any other subscript is not understood.
@pytest.mark.parametrize(
    "reference,answer",
    [
        ("1010_2", "1010"),
        ("1010_2", "10"),
        ("10", "1010_2"),
        ("5", "5_3"),
        ("12_8", "12_{10}"),
        ("5", "x_5"),
        ("101_2", "12_2"),  # not a base-2 numeral
    ],
)
def test_subscripts_are_not_ignored(reference, answer):
    assert not verify_math(boxed(answer), reference)


def test_numbers_in_a_base_compare_as_numbers_in_that_base():
    assert verify_math(boxed("1010_2"), "1010_2")
    assert verify_math(boxed("1010_{2}"), "1010_2")
    assert verify_math(boxed("5_{10}"), "5")


# Juxtapositions: two numbers, or a number and a fraction, are no product and no sum.
@pytest.mark.parametrize(
    "reference,answer",
    [
        ("\\frac{3}{2}", "3\\frac{1}{2}"),  # a mixed number is 7/2, never 3 * 1/2
        ("4", "3\\frac{1}{2} + \\frac{1}{2}"),
        ("5", "2 \\, 3"),
        ("23", "2 3"),
        ("\\frac{7}{2}", "1 + 2\\frac{1}{2}"),
    ],
)
def test_juxtapositions_are_no_sum_or_product(reference, answer):
    assert not verify_math(boxed(answer), reference)


# Small differences: no rounding to a fixed number of decimals, with or without variables.
@pytest.mark.parametrize(
    "reference,answer",
    [
        ("0", "0.0000001"),
        ("0", "10^{-7}"),
        ("x", "x + 10^{-10}"),
        ("x", "1.0000000001x"),
        ("2x+1", "2x + 1.000000000001"),
        ("y = 2x + 1", "y = 2x + 1.0000000001"),
        ("1", "1 + 10^{-30}"),
        ("1", "1 + 10^{-40}\\pi"),
    ],
)
def test_small_differences_are_not_rounded_away(reference, answer):
    assert not verify_math(boxed(answer), reference)


# Exactness: an exact reference is matched only by an answer proved equal to it.
@pytest.mark.parametrize(
    "reference,answer",
    [
        ("262537412640768744", "e^{\\pi\\sqrt{163}}"),  # within 1e-12 of the integer
        ("5", "0\\pi + 5 + 10^{-30}"),
        ("5", "\\frac{5e}{e} + 10^{-25}"),
        ("5", "5.0000001 \\cdot \\frac{\\pi}{\\pi}"),
        ("5", "0 \\cdot \\pi + 5.0000001"),
        ("2", "\\sqrt{4.000000001}"),
        ("3", "\\log_2 8.0000001"),
        ("1", "\\sin^2 x + \\cos^2 x + 10^{-30}"),
    ],
)
def test_exactness_is_proved_not_approximated(reference, answer):
    assert not verify_math(boxed(answer), reference)


def test_exact_forms_proved_equal_stay_right():
    for reference, answer in [
        ("2\\sqrt{3}", "\\sqrt{12}"),
        ("3", "\\log_2 8"),
        ("0", "\\sin(\\pi)"),
        ("\\frac{\\sqrt{6}+\\sqrt{2}}{4}", "\\frac{\\sqrt{2+\\sqrt{3}}}{2}"),
        ("1", "\\sin^2 x + \\cos^2 x"),
        ("5", "0\\pi + 5"),  # exactly 5: the decoration is proved away
        ("\\frac{\\pi}{3}", "\\pi/3"),
        ("x+1", "\\frac{x^2-1}{x-1}"),
    ]:
        assert verify_math(boxed(answer), reference), (reference, answer)


# Towers and nested powers: refused or bounded before anything computes them.
TOWERS = [
    "2^(2^(2^10))",
    "(10^10)^(10^10)",
    "{(10^{10})}^{(10^{10})}",
    "(9^9)^{(9^9)}",
    "((((2^2)^2)^2)^2)^2^2",
    "(2^{64})^{(2^{64})}",
    "\\binom{1000}{500}^{1000}",
    "(x^{10})^{10^{10}}",
    "(x+1)^{(10^{10})}",
    "(1+\\sqrt{2})^{(2^{20})}",
]


@pytest.mark.parametrize("answer", TOWERS)
def test_towers_return_fast(answer):
    t0 = time.perf_counter()
    for reference in ("7", "65536", "x"):
        assert not verify_math(boxed(answer), reference)
    assert time.perf_counter() - t0 < 1.0, answer


def test_towers_pass_through_the_killable_pool():
    items = [(boxed(a), "7") for a in TOWERS] + [(boxed("2^{10}"), "1024")]
    with RewardPool(num_workers=1, timeout_s=5.0, processes=True) as pool:
        res = pool.score(verify_math, items)
    assert res.num_timeouts == 0 and res.num_errors == 0, res.error_example
    assert res.correct.tolist() == [False] * len(TOWERS) + [True]


# References: a worked solution is its last group of boxes; several boxes state one list.
def test_worked_solution_references():
    solution = (
        "First $x = \\boxed{3}$ is not it. Checking again, $2x = 10$, so the answer is "
        "$\\boxed{5}$."
    )
    assert verify_math(boxed("5"), solution) and not verify_math(boxed("3"), solution)
    assert verify_math(boxed("2, 3"), "\\boxed{2} and \\boxed{3}")
    assert verify_math(boxed("3, 2"), "We find \\boxed{2} and \\boxed{3}.")
    assert not verify_math(boxed("3"), "\\boxed{2} and \\boxed{3}")
    assert verify_math("\\boxed{2} and \\boxed{3}", "2, 3")


def test_tree_bounds_hold_without_the_text_screen():
    # Past `within_limits`, the parser and the exact evaluation bound every power from the
    # expression tree before computing it (nested powers multiply their exponents).
    from scalerl_jax.rewards.math_numbers import compare_scalars

    t0 = time.perf_counter()
    for answer, reference in [
        ("((x^{99})^{99})^{99}", "x^{970299}"),
        ("(10^{10})^{10^{10}}", "7"),
        ("(1+\\sqrt{2})^{1000}", "7"),
        ("2^{2^{2^{10}}}", "7"),
    ]:
        assert compare_scalars(answer, reference) is not True, answer
    assert compare_scalars("((2^{10})^{10})^{10}", "2^{1000}") is True  # exact, and small
    assert time.perf_counter() - t0 < 2.0
