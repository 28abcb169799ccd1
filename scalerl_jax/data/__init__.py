"""Prompt data: dataset sources with templates, validation split, host shards and a cursor;
named answer formats (GSM8K's "#### N", MATH's \\boxed{}); mixtures of domains drawn by
weight; synthetic testbed tasks and a character-level tokenizer."""

from scalerl_jax.data.answers import answer_reader, completion_writer, gsm8k_answer, gsm8k_solution
from scalerl_jax.data.mixture import MixtureSource, open_source
from scalerl_jax.data.prompts import (
    DataError,
    LoadStats,
    Prompt,
    PromptSource,
    Row,
    format_prompt,
    load_rows,
    read_records,
)
from scalerl_jax.data.synthetic_tasks import TASKS, CharTokenizer, SyntheticRow, generate

__all__ = [
    "answer_reader",
    "completion_writer",
    "gsm8k_answer",
    "gsm8k_solution",
    "CharTokenizer",
    "DataError",
    "LoadStats",
    "MixtureSource",
    "Prompt",
    "PromptSource",
    "Row",
    "SyntheticRow",
    "TASKS",
    "format_prompt",
    "generate",
    "load_rows",
    "open_source",
    "read_records",
]
