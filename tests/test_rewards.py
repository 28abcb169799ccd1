"""Reward verifiers: answer extraction, equivalence, safety, and the scoring pool."""

import builtins
import ctypes
import operator
import os
import re
import threading
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from scalerl_jax.config import ConfigError, DataConfig, DomainConfig, RewardConfig
from scalerl_jax.rewards import (
    RewardPool,
    extract_answer,
    extract_final,
    is_equivalent,
    parse_math,
    strip_thinking,
    to_reward,
    use_processes,
    verifier_for_source,
    verify_exact,
    verify_math,
)
from scalerl_jax.rewards.math import check_reference, reference_answer, reference_problem

# (completion, expected extracted answer)
EXTRACTION = [
    ("<think>2+2 is 4? no</think>So \\boxed{5}.", "5"),
    ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
    ("\\boxed{\\boxed{7}}", "7"),
    ("first \\boxed{3}, finally \\boxed{4}", "4"),
    ("\\fbox{12}", "12"),
    ("$\\boxed 9$", "9"),
    ("The final answer is $\\dfrac{3}{4}$.", "\\dfrac{3}{4}"),
    ("**Answer:** 42", "42"),
    ("Answer: x = 3\nbecause reasons", "x = 3"),
    ("we get 10 apples and then 1,250 pears", None),  # words after it: no answer
    ("we get 10 apples and then 1,250 in total.", "1,250"),
    ("so x is $\\frac{1+\\sqrt{5}}{2}$.", "\\frac{1+\\sqrt{5}}{2}"),  # last line's math
    ("the ratio is \\frac{1+\\sqrt{5}}{2}", None),  # not the 2 of an expression
    ("the interval is -[0,1)", None),
    ("the roots are 1, 2", None),  # a list is no single number
    ("we get 2^{10}", None),
    ("Putting it together, $2 + 3 = 5$.", "2 + 3 = 5"),  # the comparison checks every value
    ("it is **17**", "17"),
    ("which gives 45%", "45%"),
    ("so the ratio is 3/4", "3/4"),
    ("total -7", "-7"),
    ("5-3 gives 2.5", "2.5"),
    ("<think>the answer is 5", None),  # thinking never closed: no answer
    ("<think>a</think><think>b</think>Answer: 8", "8"),
    ("\\boxed{12", None),  # truncated inside the box
    ("", None),
    ("no digits here", None),
]


@pytest.mark.parametrize("completion,expected", EXTRACTION)
def test_extract_answer(completion, expected):
    assert extract_answer(completion) == expected


def test_strip_thinking_require_close():
    assert strip_thinking("just 5") == "just 5"
    assert strip_thinking("just 5", require_close=True) is None  # prompt opened the thought
    assert strip_thinking("x</think> 5", require_close=True) == " 5"
    assert not verify_math("I reason and reason 5", "5", require_close=True)
    assert verify_math("I reason</think>\\boxed{5}", "5", require_close=True)


# (completion, reference, correct)
EQUIVALENCE = [
    ("\\boxed{\\frac{1}{2}}", "0.5", True),
    ("\\boxed{\\dfrac{1}{2}}", "\\frac12", True),
    ("\\boxed{\\tfrac{3}{6}}", "1/2", True),
    ("\\boxed{0.5}", "\\frac{1}{3}", False),
    ("\\boxed{\\frac{1}{3}}", "0.33", True),  # rounded decimal gold accepts the exact form
    ("\\boxed{0.3}", "0.33", False),
    ("\\boxed{2.54}", "2.5", False),
    ("\\boxed{123456789013}", "123456789012", False),  # exact numbers: no tolerance
    ("\\boxed{1e5}", "100000", True),
    ("\\boxed{e^{e^{e^{e^{5}}}}}", "1", False),  # would take evalf hours; refused fast
    ("\\boxed{0.333333}", "\\frac13", True),
    ("\\boxed{10^{20}+\\sqrt{2}}", "10^{20}", False),
    ("\\boxed{\\log{8}/\\log{2}}", "3", True),
    ("\\boxed{(-\\infty, 1) \\cup (2, \\infty)}", "(-\\infty,1)\\cup(2,\\infty)", True),
    ("\\boxed{\\sqrt{2}/2}", "\\frac{1}{\\sqrt{2}}", True),
    ("\\boxed{\\sqrt{8}}", "2\\sqrt{2}", True),
    ("\\boxed{\\sqrt{8}}", "3\\sqrt{2}", False),
    ("\\boxed{\\left( 1, 2 \\right)}", "(1,2)", True),
    ("\\boxed{(2, 1)}", "(1,2)", False),  # tuples are ordered
    ("\\boxed{2, 1}", "1, 2", True),  # bare lists of solutions are not
    ("\\boxed{\\{3, 1, 2\\}}", "\\{1,2,3\\}", True),
    ("\\boxed{[1, 2)}", "[1,2)", True),
    ("\\boxed{[1, 2]}", "[1,2)", False),  # interval ends matter
    ("\\boxed{x=1, y=2}", "1, 2", True),
    ("\\boxed{1 \\pm \\sqrt{2}}", "1+\\sqrt{2}, 1-\\sqrt{2}", True),
    ("\\boxed{2 \\cdot 3}", "6", True),
    ("\\boxed{2 \\times 3}", "6", True),
    ("\\boxed{90^\\circ}", "90", True),
    ("\\boxed{90^{\\circ}}", "\\frac{180}{2}", True),
    ("\\boxed{50\\%}", "0.5", True),
    ("Answer: 50%", "50", True),
    ("\\boxed{25\\%}", "0.5", False),
    ("\\boxed{5\\text{ cm}}", "5", True),
    ("\\boxed{12 \\text{ cm}^2}", "12", True),
    ("The answer is 30 dollars.", "30", True),
    ("\\boxed{\\$42}", "42", True),
    ("\\boxed{1,000,000}", "1000000", True),
    ("\\boxed{1\\,000}", "1000", True),
    ("\\boxed{7.}", "7", True),
    ("\\boxed{x = 3}", "3", True),
    ("\\boxed{y = 2x + 1}", "1+2x", True),
    ("\\boxed{2x+2}", "1+2x", False),
    ("\\boxed{(x+1)^2}", "x^2+2x+1", True),
    ("\\boxed{\\frac{x^2-1}{x-1}}", "x+1", True),
    ("\\boxed{3+4i}", "4i+3", True),
    ("\\boxed{\\pi/2}", "\\frac{\\pi}{2}", True),
    ("\\boxed{\\pi}", "3.14", True),
    ("\\boxed{e^{2}}", "e^2", True),
    ("\\boxed{\\sqrt[3]{8}}", "2", True),
    ("\\boxed{\\text{(B)}}", "B", True),
    ("\\boxed{(B)}", "C", False),
    ("\\boxed{\\text{Yes}}", "yes", True),
    ("\\boxed{-\\frac{1}{2}}", "-0.5", True),
    ("\\boxed{\\frac{-1}{2}}", "-\\frac12", True),
    ("<think>it is \\boxed{5}</think>The answer is 6", "5", False),  # thinking is ignored
    ("<think>still thinking \\boxed{5}", "5", False),
    ("\\boxed{}", "0", False),
    ("\\boxed{__import__('os').system('true')}", "0", False),
    ("\\boxed{().__class__.__bases__[0]}", "0", False),
    ("\\boxed{2^{2^{2^{2^{2}}}}}", "2", False),  # refused: the power is too large
    ("\\boxed{(x+1)^{1000}^{1000}}", "1", False),
    ("garbage }{ \\frac{", "1", False),
    ("", "1", False),
]


@pytest.mark.parametrize("completion,reference,correct", EQUIVALENCE)
@pytest.mark.fast
def test_verify_math_table(completion, reference, correct):
    t0 = time.perf_counter()
    assert verify_math(completion, reference) is correct
    assert time.perf_counter() - t0 < 2.0  # the size limits keep every case cheap


def test_is_equivalent_edges():
    assert not is_equivalent(None, "1")
    assert not is_equivalent("1", "")
    assert is_equivalent("1/2", "\\frac{1}{2}")
    assert parse_math("x" * 500) is None  # over the length limit
    assert parse_math("sqrt(2)") is not None
    assert parse_math("import os") is None  # multi-letter words are not symbols


def test_to_reward():
    assert to_reward(True) == 1.0 and to_reward(False) == -1.0
    assert to_reward(True, 1.0, 0.0) == 1.0 and to_reward(False, 1.0, 0.0) == 0.0


# What math-verify's LaTeX path evaluates: latex2sympy2 turns a NUMBER token of its grammar
# (digits, '.', an exponent) into `sympy.Number(text)`, which goes through `parse_expr`; SymPy's
# unit prefixes build constant Symbols the same way on first use (and `E`), and its polynomial
# code compiles monomial functions from its own templates. Nothing else may run.
_LIBRARY_EVALS = re.compile(
    r"Integer \(\d+ \)|Float \('[0-9.eE+-]+' \)|Symbol \('[A-Za-z]+' \)"
    r"|from sympy import \*|E |def monomial_[a-z]+\([ABk, ]+\):\n.*",
    re.DOTALL,
)


class _NoEval:
    """Replaces builtins.eval/exec/compile while active and records any call on text (SymPy's
    parse_expr evals a string) other than `_LIBRARY_EVALS`."""

    def __init__(self):
        self.calls = []

    def __enter__(self):
        self.saved = builtins.eval, builtins.exec, builtins.compile

        saved = dict(zip(("eval", "exec", "compile"), self.saved))

        def refuse(name):
            def fn(*args, **kwargs):
                # exec of a compiled module is the import system loading a library lazily
                # (antlr4's modules on math-verify's first parse); text is what must not run.
                if name == "exec" and args and not isinstance(args[0], (str, bytes)):
                    return saved[name](*args, **kwargs)
                if args and isinstance(args[0], str) and _LIBRARY_EVALS.fullmatch(args[0]):
                    return saved[name](*args, **kwargs)
                self.calls.append((name, args[:1]))
                raise AssertionError(f"{name} called")

            return fn

        builtins.eval, builtins.exec, builtins.compile = (
            refuse("eval"),
            refuse("exec"),
            refuse("compile"),
        )
        return self

    def __exit__(self, *exc):
        builtins.eval, builtins.exec, builtins.compile = self.saved


_MATHY = st.text(
    alphabet=list("0123456789+-*/^()[]{},.=% xyzei\\abcdefrqstpmo_'\"$<>:"), max_size=80
)
_SNIPPETS = st.sampled_from(
    [
        "\\boxed{",
        "\\frac{",
        "\\sqrt",
        "}",
        "{",
        "</think>",
        "<think>",
        "__import__('os')",
        "lambda: 0",
        "\\text{",
        "^",
        "9^9^9",
        "1,000",
        "\\left(",
        "\\right)",
        "\\pm",
        "%",
        "answer is ",
        "Answer:",
        "\\pi",
    ]
)
_COMPOSED = st.lists(st.one_of(_SNIPPETS, _MATHY), max_size=8).map("".join)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    completion=st.one_of(st.text(max_size=200), _COMPOSED),
    reference=st.one_of(_COMPOSED, st.sampled_from(["5", "\\frac{1}{2}", "(1,2)", "x+1"])),
)
@example(completion="", reference="\\boxed{or")  # found by hypothesis (issue 35)
def test_verify_never_raises_never_evaluates(completion, reference):
    with _NoEval() as guard:
        result = verify_math(completion, reference)
        answer = reference_answer(reference)  # the reference itself, or its last boxes
        equal_self = answer is not None and is_equivalent(answer, reference)
        problem = reference_problem(reference)
        parse_math(completion)
    assert isinstance(result, bool)
    # The verifier's invariant: a reference equals itself unless it is refused, with a reason.
    assert equal_self == (problem is None), problem
    assert problem is None or (isinstance(problem, str) and problem)
    assert guard.calls == []


@pytest.mark.parametrize(
    "reference,reason",
    [
        (
            "\\boxed{or",
            "not closed",
        ),  # hypothesis's find (issue 35): its text normalised to "\\boxed{"
        ("\\boxed{", "not closed"),
        ("\\boxed{}", "not closed, or is empty"),
        ("", "empty"),
        ("   ", "empty"),
        ("1" * 500, "size limits"),
        ("9^{9^{9^{9}}}", "size limits"),
        ("$$", "normalised"),
        ("5 \\text{ or } \\boxed{", "not closed"),
    ],
)
def test_malformed_references_are_refused_with_their_reason(reference, reason):
    assert reason in reference_problem(reference)
    with pytest.raises(ValueError, match=re.escape(reason)):
        check_reference(reference)
    assert not is_equivalent(reference, reference) and not verify_math(reference, reference)


@pytest.mark.parametrize(
    "reference", ["5", "\\frac{1}{2}", "(1, 2)", "x+1", "\\text{Evelyn}", "3 or 4", "B", "1010_2"]
)
def test_wellformed_references_equal_themselves(reference):
    assert reference_problem(reference) is None
    check_reference(reference)
    assert is_equivalent(reference, reference)


@pytest.mark.parametrize(
    "solution,answer",
    [
        ("So $x = 2$, hence the answer is $\\boxed{\\frac{1}{2}}$.", "\\frac{1}{2}"),
        ("First \\boxed{3}; checking again, \\boxed{5}.", "5"),
        ("The roots are $\\boxed{1}$ and $\\boxed{-2}$.", "1, -2"),
        ("\\boxed{1} papers and \\boxed{2} bins", "1, 2"),
    ],
)
def test_worked_solution_references_are_their_last_boxes(solution, answer):
    assert reference_problem(solution) is None and reference_answer(solution) == answer
    assert is_equivalent(answer, solution) and verify_math(solution, solution)


def test_no_eval_guard_catches_parse_expr():
    import sympy

    with _NoEval() as guard:
        with pytest.raises((AssertionError, sympy.SympifyError)):  # the guard's, or re-raised
            sympy.sympify("__import__('os').getcwd()")
        assert sympy.Number("12") == 12  # a numeral, as math-verify's LaTeX path builds one
    assert len(guard.calls) == 1 and guard.calls[0][0] == "eval"


@pytest.mark.parametrize(
    "text",
    [
        "__import__('os').system('touch /tmp/pwned_scalerl')",
        "eval('1')",
        "exec('x=1')",
        "(lambda: 1)()",
        "[c for c in ().__class__.__base__.__subclasses__()]",
        "\\boxed{__import__('os').system('touch /tmp/pwned_scalerl')}",
    ],
)
def test_malicious_answers_are_inert(text):
    with _NoEval() as guard:
        assert verify_math(text, "0") is False
        assert parse_math(text) is None
    assert guard.calls == []
    assert not os.path.exists("/tmp/pwned_scalerl")


# ------------------------------------------------------------------------- synthetic verifiers
@pytest.mark.fast
def test_verify_exact():
    assert verify_exact("<think>3+4 carry</think>46", "46")
    assert verify_exact("<think></think> 46 ", "46")
    assert verify_exact("46", "46")
    assert not verify_exact("46", "46", require_close=True)
    assert not verify_exact("<think>46", "46")  # unclosed thought
    assert not verify_exact("<think>x</think>47", "46")
    assert not verify_exact("<think>x</think>", "46")
    assert extract_final("<think>a</think>b</think>c") == "c"
    assert verifier_for_source("synthetic:addition") is verify_exact
    assert verifier_for_source("data/train.jsonl") is verify_math


def test_use_processes():
    math, exact = DataConfig(source="data/train.jsonl"), DataConfig(source="synthetic:addition")
    assert use_processes(RewardConfig(), math)  # math: killable children
    assert not use_processes(RewardConfig(), exact)  # exact match: threads
    mixture = DataConfig(
        source="mixture",
        domains=(
            DomainConfig("add", source="synthetic:addition"),
            DomainConfig("m", "data/math.jsonl"),
        ),
    )
    assert use_processes(RewardConfig(), mixture)
    overridden = DataConfig(
        source="mixture",
        domains=(DomainConfig("add", source="synthetic:addition", verifier="math"),),
    )
    assert use_processes(RewardConfig(), overridden)  # a domain's own verifier counts
    assert use_processes(RewardConfig(verifier="mypkg.mod:check"), exact)
    assert not use_processes(RewardConfig(processes=False), math)
    assert use_processes(RewardConfig(processes=True), exact)
    with pytest.raises(ConfigError, match="processes"):
        RewardConfig(processes="yes")


# ----------------------------------------------------------------------------------------- pool
_release = threading.Event()


def _eq_verifier(completion, reference):
    return completion == reference


def _misbehaving_verifier(completion, reference):
    if completion == "hang":
        _release.wait(30)  # released at the end of the test
        return True
    if completion == "raise":
        raise RuntimeError("verifier bug")
    return completion == reference


def test_pool_counts_timeouts_and_errors_on_time():
    items = [("a", "a"), ("hang", "a"), ("raise", "a"), ("b", "a")] * 3
    _release.clear()
    try:
        with RewardPool(
            num_workers=4, timeout_s=0.3, reward_correct=1.0, reward_incorrect=-1.0
        ) as pool:
            t0 = time.monotonic()
            res = pool.score(_misbehaving_verifier, items)
            elapsed = time.monotonic() - t0
            assert elapsed < 2.0, elapsed
            assert res.num_timeouts == 3 and res.num_errors == 3
            assert res.error_example == "RuntimeError: verifier bug"
            assert res.correct.tolist() == [True, False, False, False] * 3
            np.testing.assert_array_equal(res.rewards, np.where(res.correct, 1.0, -1.0))
            assert res.rewards.dtype == np.float32
            assert pool.stuck_threads == 3
            # Stuck threads were replaced: a second batch runs at full width and on time.
            res2 = pool.score(_eq_verifier, [("x", "x")] * 40)
            assert res2.correct.all() and res2.num_timeouts == 0 and res2.num_errors == 0
            assert pool.total_timeouts == 3 and pool.total_errors == 3 and pool.total_items == 52
        _release.set()
        deadline = time.monotonic() + 5
        while pool.stuck_threads and time.monotonic() < deadline:
            time.sleep(0.01)
        assert pool.stuck_threads == 0  # released threads left the pool
    finally:
        _release.set()


def test_pool_concurrent_calls():
    with RewardPool(num_workers=2, timeout_s=1.0) as pool:
        results = [None] * 4

        def run(k):
            items = [(str(i % 3), "0") for i in range(50 + k)]
            results[k] = pool.score(_eq_verifier, items)

        threads = [threading.Thread(target=run, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        for k, res in enumerate(results):
            assert res.correct.tolist() == [i % 3 == 0 for i in range(50 + k)]


def test_pool_with_capacity_exhausted_still_returns_on_time():
    _release.clear()
    try:
        pool = RewardPool(num_workers=1, timeout_s=0.2, max_stuck_threads=0, reward_incorrect=0.0)
        res = pool.score(_misbehaving_verifier, [("hang", "a"), ("a", "a"), ("a", "a")])
        # No replacement for the stuck worker: the queued items time out at the call deadline.
        assert res.num_timeouts == 3 and not res.correct.any()
        assert res.seconds < 0.2 * (3 + 1) + 0.5
        assert res.rewards.tolist() == [0.0, 0.0, 0.0]
        _release.set()
        time.sleep(0.1)
        assert pool.score(_eq_verifier, [("a", "a")]).correct.all()  # the thread came back
        pool.close()
    finally:
        _release.set()


@pytest.mark.fast
def test_process_pool_kills_stuck_verifiers():
    # Standard-library verifiers keep the children light (they import only what they unpickle):
    # re.match with a catastrophic pattern hangs, a bad pattern raises, string_at(8) segfaults.
    items = [("a+", "aaa"), ("(a+)+$", "a" * 40 + "!"), ("(", "x"), ("b", "abc"), ("c", "c")]
    with RewardPool(num_workers=2, timeout_s=0.5, processes=True) as pool:
        t0 = time.monotonic()
        res = pool.score(re.match, items)
        assert time.monotonic() - t0 < 5.0
        assert res.correct.tolist() == [True, False, False, False, True]
        assert res.num_timeouts == 1 and res.num_errors == 1
        assert res.error_example.startswith("error: missing )")  # re.error
        res = pool.score(ctypes.string_at, [(8, 1)])  # reads address 8: the child segfaults
        assert res.num_errors == 1 and "died" in res.error_example
        # The killed children were replaced: the next batch is scored normally.
        res = pool.score(operator.eq, [("d", "d"), ("e", "x"), ("f", "f")])
        assert res.correct.tolist() == [True, False, True] and res.num_errors == 0
        with pytest.raises(TypeError, match="picklable"):
            pool.score(lambda c, r: True, [("a", "a")])


def test_pool_rejects_bad_arguments():
    with pytest.raises(ValueError, match="num_workers=0"):
        RewardPool(num_workers=0)
    with pytest.raises(ValueError, match="timeout_s=0"):
        RewardPool(timeout_s=0)
    pool = RewardPool(num_workers=1)
    pool.close()
    with pytest.raises(RuntimeError, match="after close"):
        pool.score(_eq_verifier, [("a", "a")])


def test_math_references_are_checked_at_load_time():
    # A malformed reference is a bad row (skipped and counted with its reason), not a prompt
    # whose every completion scores as wrong.
    from scalerl_jax.data.prompts import parse_records
    from scalerl_jax.rewards.verifiers import ANSWER_CHECKS

    assert ANSWER_CHECKS["math"] == "scalerl_jax.rewards.math:check_reference"
    records = [("line 1", {"q": "a", "a": "\\boxed{or"}), ("line 2", {"q": "b", "a": "5"})]
    rows, stats = parse_records(
        iter(records), "q", "a", id_field=None, check_answer=check_reference
    )
    assert [r.answer for r in rows] == ["5"]
    assert stats.bad_examples[0][0] == "line 1" and "not closed" in stats.bad_examples[0][1]
