"""Named answer formats: how a dataset row's answer field becomes the reference answer the
verifier compares with (`raw`, `gsm8k` for "#### N", `boxed` for a MATH-style solution), and
how a worked solution becomes an SFT target (`raw`, `gsm8k`). Each reader raises ValueError
saying why a row cannot be read; the loaders count such rows as malformed and skip them. The
formats: docs/datasets.md, "Answer formats".
"""

from __future__ import annotations

import re
from typing import Callable

from scalerl_jax.config import ANSWER_FORMATS, COMPLETION_FORMATS, ConfigError
from scalerl_jax.rewards.math_extract import final_boxed  # plain text: no SymPy

GSM8K_MARK = "####"
# An integer or decimal, optionally negative, with or without comma thousands separators
# (GSM8K writes "1,080" in some rows and "1080" in most).
_NUMBER = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")
_CALCULATOR = re.compile(r"<<[^<>]*>>")  # GSM8K's "<<48/2=24>>" annotations
FINAL_SENTENCE = "The final answer is \\boxed{{{}}}."


def raw_answer(text: str) -> str:
    return text.strip()


def gsm8k_answer(text: str) -> str:
    """The final number of a GSM8K solution: "... #### -1,234" -> "-1234"."""
    _, mark, tail = text.rpartition(GSM8K_MARK)
    if not mark:
        raise ValueError(f"no {GSM8K_MARK!r} line with the final answer")
    value = tail.strip()
    if not _NUMBER.fullmatch(value):
        raise ValueError(f"the text after {GSM8K_MARK!r} is not a number")
    return value.replace(",", "")


def boxed_answer(text: str) -> str:
    """The content of the last \\boxed{...} (with the boxes joined to it)."""
    got = final_boxed(text)
    if got is None:
        raise ValueError("the last \\boxed{ is not closed, or is empty")
    if not isinstance(got, str):  # the reader's "no box at all" marker
        raise ValueError("no \\boxed{...} in the solution")
    return got.strip()


def gsm8k_solution(text: str) -> str:
    """A GSM8K worked solution as an answer that reasons and ends in a boxed final number:
    calculator annotations removed, blank lines dropped, the "#### N" line replaced by
    "The final answer is \\boxed{N}." (N without thousands separators)."""
    final = gsm8k_answer(text)
    body = text.rpartition(GSM8K_MARK)[0]
    lines = [_CALCULATOR.sub("", line).rstrip() for line in body.splitlines()]
    lines = [line for line in lines if line.strip()]
    if not lines:
        raise ValueError(f"no reasoning before {GSM8K_MARK}")
    if any("<<" in line or ">>" in line for line in lines):
        raise ValueError("an unbalanced <<...>> calculator annotation")
    return "\n".join(lines + [FINAL_SENTENCE.format(final)])


_ANSWERS: dict[str, Callable[[str], str]] = {
    "raw": raw_answer,
    "gsm8k": gsm8k_answer,
    "boxed": boxed_answer,
}
_COMPLETIONS: dict[str, Callable[[str], str]] = {"raw": raw_answer, "gsm8k": gsm8k_solution}
assert tuple(_ANSWERS) == ANSWER_FORMATS and tuple(_COMPLETIONS) == COMPLETION_FORMATS


def answer_reader(name: str) -> Callable[[str], str]:
    """The function of answer format `name` (text -> reference answer, ValueError if none)."""
    if name not in _ANSWERS:
        raise ConfigError(f"DataConfig.answer_format={name!r}: must be one of {ANSWER_FORMATS}")
    return _ANSWERS[name]


def completion_writer(name: str) -> Callable[[str], str]:
    """The function of completion format `name` (field text -> SFT target text)."""
    if name not in _COMPLETIONS:
        raise ConfigError(
            f"SFTConfig.completion_format={name!r}: must be one of {COMPLETION_FORMATS}"
        )
    return _COMPLETIONS[name]
