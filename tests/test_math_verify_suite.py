"""Agreement of `verify_math` with Math-Verify's own test suite.

tests/data/math_verify_suite.jsonl holds every (gold, prediction, expected verdict) triple that
the parametrized tests of github.com/huggingface/Math-Verify (commit 5d148cf, tests/*.py, MIT
License, Copyright 2024 The HuggingFace Team) assert, read from their source with `ast`: 269
rows, each with the test it came from (`id`: file::function[index]) and the options that test
passed when not the defaults (`match_types`, `precision`, `strict`,
`allow_set_relation_comp`). Tests that assert no triple (parser configuration, timeouts,
string extraction) have no rows.

How a row is run: the prediction is the completion; the reference is the gold as written
(a boxed worked solution included: the verifier reads its last group of boxes), except where
Math-Verify's test gives an unboxed whole solution as the gold (over 200 characters, or several
lines): then the answer extracted from it, as a dataset's reference would hold.

`EXCLUDED` lists the rows whose expected verdict we believe is wrong for a reward (a hedge
accepted, a false equation accepted, an approximation of an exact answer accepted), each with
its reason; they are left out of the denominator. Of the rest, agreement must be >= 98% with no
false positive (an answer Math-Verify's tests call wrong that we accept). `pytest -s` prints
the figure and the disagreements.
"""

import json
import os

from scalerl_jax.rewards.math import extract_answer, verify_math

SUITE = os.path.join(os.path.dirname(__file__), "data", "math_verify_suite.jsonl")

_HEDGE = "hedge: the prediction's chain also states {}, so it is not accepted for {}"
EXCLUDED = {
    "test_all.py::test_latex_notation[5]": (
        "a line break inside $...$ does not change the answer 9; Math-Verify refuses inline "
        "math over several lines as a parsing rule, not because the answer is wrong"
    ),
    "test_all.py::test_latex_notation[6]": "as [5], with \\( ... \\) around the 9",
    "test_all.py::test_relations_math[10]": _HEDGE.format("7 (x = 5+5+1 = 7 = 11)", "11"),
    "test_all.py::test_relations_math[12]": "the same row as [10]",
    "test_all.py::test_relations_math[13]": _HEDGE.format("11 (= 1/3 \\approx 11)", "1/3"),
    "test_all.py::test_relations_math[16]": _HEDGE.format("1.3 (x = 1/3 \\approx 1.3)", "1/3"),
    "test_all.py::test_relations_math[26]": (
        "the prediction z = 3+3 = 2 states a false equation (6 = 2); accepting it would reward "
        "any chain that ends in the right number"
    ),
    "test_all.py::test_relations_math[27]": "the same row as [26]",
    "test_all.py::test_complex_math_expressions[7]": (
        "asserted with float_rounding=2: 0.33 for the exact 1/3 is an approximation, wrong "
        "under the exact-answer rule (Math-Verify's default precision refuses it too)"
    ),
    "test_all.py::test_complex_math_expressions[13]": (
        "asserted with float_rounding=2: 2.6667 for the exact 8/3, as [7]"
    ),
    "test_all.py::test_set_rel_assymetry[3]": (
        "x \\in [-2,7] and -2 \\le x \\le 7 are the same answer; Math-Verify refuses it only "
        "under its default allow_set_relation_comp=False (row [2] accepts it with True)"
    ),
    "test_strict.py::test_strict_variable_comparison[1]": (
        "asserted with strict=False; under the default (row [0]) f(y) is not f(x)"
    ),
    "test_yujianll.py::test_string_extraction[9]": "1 + 1/e is not 1 - 1/e",
    "test_numina_cases.py::test_numina_cases[24]": (
        "a malformed gold (its \\boxed{ is never closed): refused as a reference with that reason "
        "(math.reference_problem), so it matches nothing"
    ),
}


def _rows():
    with open(SUITE, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def _reference(gold: str) -> str:
    # A boxed gold goes as written: the verifier reads a worked solution's last boxes itself.
    if "\\boxed" not in gold and (len(gold) > 200 or "\n" in gold.strip()):
        return extract_answer(gold) or gold
    return gold


def test_suite_table_is_complete():
    rows = _rows()
    ids = [r["id"] for r in rows]
    assert len(rows) == 269 and len(set(ids)) == len(ids)
    assert set(EXCLUDED) <= set(ids)
    assert {type(r["expected"]) for r in rows} == {bool}
    assert sum(not r["expected"] for r in rows) == 38


def test_agreement_with_math_verify_suite():
    rows = [r for r in _rows() if r["id"] not in EXCLUDED]
    false_pos, false_neg = [], []
    for r in rows:
        got = verify_math(r["pred"], _reference(r["gold"]))
        if got != r["expected"]:
            (false_pos if got else false_neg).append(r["id"])
    agreement = 1 - (len(false_pos) + len(false_neg)) / len(rows)
    print(
        f"\nMath-Verify suite: {len(rows)} cases ({len(EXCLUDED)} excluded), agreement "
        f"{agreement:.1%}, false positives {false_pos}, false negatives {false_neg}"
    )
    assert false_pos == []
    assert agreement >= 0.98, false_neg


def test_excluded_rows_are_refused_as_documented():
    # The hedges and the false equation above must stay refused, not merely excluded.
    rows = {r["id"]: r for r in _rows()}
    for key in [
        "test_all.py::test_relations_math[10]",
        "test_all.py::test_relations_math[13]",
        "test_all.py::test_relations_math[16]",
        "test_all.py::test_relations_math[26]",
        "test_yujianll.py::test_string_extraction[9]",
    ]:
        r = rows[key]
        assert r["expected"] and not verify_math(r["pred"], _reference(r["gold"])), key
