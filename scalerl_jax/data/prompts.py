"""Prompt datasets: rows, templates, a held-out validation split, per-host shards, epochs, cursor.

`DataConfig.source` is a local file or directory (JSON lines, JSON, Parquet), `hf:NAME`,
`tfds:NAME` or `synthetic:TASK` (synthetic_tasks.py). Rows are read and mapped, given stable
ids, ranked by hash(seed, id) into validation and train, sharded train[p::P] over hosts and
visited per epoch in a permutation of (seed, epoch, p), so the cursor (epoch, position) is the
whole RNG state; resume refuses a different seed, host layout or training set. All of it:
docs/datasets.md, "Prompt data".
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import random
import urllib.parse
from collections import Counter
from typing import Any, Callable, Iterator, NamedTuple, Optional

from scalerl_jax.config import DataConfig
from scalerl_jax.data import synthetic_tasks
from scalerl_jax.data.answers import answer_reader
from scalerl_jax.data.records import DataError, Invalid, read_records

log = logging.getLogger(__name__)


class Row(NamedTuple):
    prompt_id: str
    problem: str
    answer: str


@dataclasses.dataclass(frozen=True)
class Prompt:
    prompt_id: str
    problem: str  # the question as stored in the data
    answer: str  # the reference answer given to the verifier
    text: str  # what the sampler sees: the template (or chat template) applied to `problem`
    domain: str = ""  # the mixture domain it came from (data/mixture.py); "" for one source


@dataclasses.dataclass(frozen=True)
class LoadStats:
    records: int  # records read, bad ones included
    kept: int
    duplicates: int
    bad: dict  # reason -> count
    bad_examples: tuple  # (where, reason) of the first few bad records

    @property
    def num_bad(self) -> int:
        return sum(self.bad.values())


# ----------------------------------------------------------------------------------- parsing
_MISSING = object()


def get_field(record: Any, path: str) -> Any:
    """record["a"]["b"] for path "a.b"; integer parts index lists ("messages.0.content")."""
    value = record
    for key in path.split("."):
        if isinstance(value, dict) and key in value:
            value = value[key]
        elif (
            isinstance(value, (list, tuple))
            and key.lstrip("-").isdigit()
            and -len(value) <= int(key) < len(value)
        ):
            value = value[int(key)]
        else:
            return _MISSING
    return value


def _as_text(value: Any, field: str, numbers_ok: bool) -> tuple[str, Optional[str]]:
    """(text, None) or ("", reason)."""
    if value is _MISSING or value is None:
        return "", f"missing {field!r}"
    if isinstance(value, str):
        return (value, None) if value.strip() else ("", f"empty {field!r}")
    if (
        numbers_ok
        and isinstance(value, (int, float))
        and not isinstance(value, bool)
        and value == value
    ):
        return str(value), None
    return "", f"wrong type of {field!r} ({type(value).__name__})"


def _prompt_id(record: Any, id_field: Optional[str], problem: str) -> str:
    if id_field:
        value = get_field(record, id_field)
        if isinstance(value, (str, int)) and not isinstance(value, bool) and str(value):
            return str(value)
    return "h" + hashlib.sha256(problem.encode("utf-8")).hexdigest()[:20]


def parse_records(
    records: Iterator[tuple[str, Any]],
    prompt_field: str,
    answer_field: str,
    id_field: Optional[str] = "id",
    check_answer: Optional[Callable[[str], None]] = None,
    read_answer: Optional[Callable[[str], str]] = None,
) -> tuple[list[Row], LoadStats]:
    """Rows from records; bad records are counted, not raised (see `check_bad_fraction`).
    `read_answer(field text)` gives the row's answer (an answer format, data/answers.py; None:
    the text itself); it or `check_answer(answer)` raising ValueError marks a row bad (e.g. no
    "#### N" in a GSM8K solution, a code domain's malformed test spec)."""
    rows: list[Row] = []
    seen: set[str] = set()
    bad: Counter[str] = Counter()
    examples: list[tuple[str, str]] = []
    n = duplicates = 0
    for where, record in records:
        n += 1
        reason = record.reason if isinstance(record, Invalid) else None
        if reason is None and not isinstance(record, dict):
            reason = f"not an object ({type(record).__name__})"
        if reason is None:
            problem, reason = _as_text(get_field(record, prompt_field), prompt_field, False)
        if reason is None:
            answer, reason = _as_text(get_field(record, answer_field), answer_field, True)
        if reason is None and read_answer is not None:
            try:
                answer = read_answer(answer)
            except ValueError as e:
                reason = f"bad {answer_field!r} ({str(e)[:80]})"
        if reason is None and check_answer is not None:
            try:
                check_answer(answer)
            except ValueError as e:
                reason = f"bad {answer_field!r} ({str(e)[:80]})"
        if reason is not None:
            bad[reason] += 1
            if len(examples) < 3:
                examples.append((where, reason))
            continue
        pid = _prompt_id(record, id_field, problem)
        if pid in seen:
            duplicates += 1
            continue
        seen.add(pid)
        rows.append(Row(pid, problem, answer.strip()))
    return rows, LoadStats(n, len(rows), duplicates, dict(bad), tuple(examples))


def check_bad_fraction(stats: LoadStats, source: str, max_bad_fraction: float) -> None:
    if stats.records == 0 or stats.kept == 0:
        raise DataError(
            f"DataConfig.source={source!r}: no usable rows ({stats.records} records "
            f"read, {stats.num_bad} malformed: {stats.bad})"
        )
    fraction = stats.num_bad / stats.records
    if fraction > max_bad_fraction:
        reasons = ", ".join(f"{k}: {v}" for k, v in sorted(stats.bad.items()))
        first = "; ".join(f"{w} ({r})" for w, r in stats.bad_examples)
        raise DataError(
            f"DataConfig.source={source!r}: {stats.num_bad} of {stats.records} rows "
            f"are malformed ({fraction:.2%} > max_bad_fraction="
            f"{max_bad_fraction:.2%}): {reasons}. First: {first}"
        )


def log_skipped(stats: LoadStats, source: str) -> None:
    """One console line for the malformed rows a load skipped (within max_bad_fraction)."""
    if stats.num_bad:
        reasons = ", ".join(f"{k}: {v}" for k, v in sorted(stats.bad.items()))
        where, why = stats.bad_examples[0]
        log.warning(
            "%s: %d of %d rows skipped as malformed (%s); the first at %s (%s)",
            source,
            stats.num_bad,
            stats.records,
            reasons,
            where,
            why,
        )


def _number_or_text(value: str) -> Any:
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            pass
    return value


def synthetic_rows(spec: str, seed: int) -> list[synthetic_tasks.SyntheticRow]:
    """The rows of `TASK[?knob=value&...]` (the part after `synthetic:`); `num` defaults to
    10,000. Several specs joined by `|` give all their rows, task after task (an SFT warm-up
    for a mixture: `synthetic:countup?num=4000|pycode?num=2000`)."""
    if "|" in spec:
        return [row for part in spec.split("|") for row in synthetic_rows(part, seed)]
    task, _, query = spec.partition("?")
    knobs: dict[str, Any] = {
        k: _number_or_text(v) for k, v in urllib.parse.parse_qsl(query, strict_parsing=bool(query))
    }
    num = knobs.pop("num", 10_000)
    return synthetic_tasks.generate(task, num, seed, **knobs)


def load_rows(
    config: DataConfig,
    id_field: Optional[str] = "id",
    check_answer: Optional[Callable[[str], None]] = None,
) -> tuple[list[Row], LoadStats]:
    """All usable rows of `config.source`, in file order, and the load statistics; answers
    read by `config.answer_format`. `check_answer`: see `parse_records` (synthetic rows are
    valid by construction)."""
    if config.source.startswith("synthetic:"):
        if config.answer_format != "raw":
            raise DataError(
                f"DataConfig.answer_format={config.answer_format!r} with "
                f"{config.source!r}: synthetic tasks give their answers as they "
                "are; use answer_format='raw'"
            )
        try:
            rows = [
                Row(r.prompt_id, r.prompt, r.answer)
                for r in synthetic_rows(config.source[len("synthetic:") :], config.seed)
            ]
        except (ValueError, TypeError) as e:
            raise DataError(f"DataConfig.source={config.source!r}: {e}") from None
        return rows, LoadStats(len(rows), len(rows), 0, {}, ())
    rows, stats = parse_records(
        read_records(config.source, config.split),
        config.prompt_field,
        config.answer_field,
        id_field,
        check_answer,
        answer_reader(config.answer_format),
    )
    check_bad_fraction(stats, config.source, config.max_bad_fraction)
    return rows, stats


def format_prompt(problem: str, config: DataConfig, tokenizer: Any = None) -> str:
    """The sampler's prompt text. Non-chat templates substitute `{prompt}` (and `{system}` when
    present; otherwise a system prompt is put first, followed by a blank line)."""
    system = config.system_prompt
    if config.template == "chat":
        messages = [{"role": "system", "content": system}] if system else []
        messages.append({"role": "user", "content": problem})
        return tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    text = config.template.replace("{prompt}", problem)
    if "{system}" in text:
        return text.replace("{system}", system or "")
    return f"{system}\n\n{text}" if system else text


# ------------------------------------------------------------------------------------ source
def _rank(seed: int, prompt_id: str) -> bytes:
    return hashlib.sha256(f"{seed}\x00{prompt_id}".encode("utf-8")).digest()


def _validation_rows(config: DataConfig, id_field, check_answer):
    """The rows of `config.validation_source` (ids prefixed by the split) and their load
    stats; ([], None) when validation is held out of `source` instead."""
    val_path = config.validation_path()
    if val_path is None:
        return [], None
    val_config = dataclasses.replace(
        config, source=val_path, split=config.validation_split, validation_source=None
    )
    val_rows, stats = load_rows(val_config, id_field, check_answer)
    log_skipped(stats, val_path)
    prefix = config.validation_split
    return [r._replace(prompt_id=f"{prefix}:{r.prompt_id}") for r in val_rows], stats


def _split_by_problem(config: DataConfig, ranked: list, val_rows: list, val_path: str):
    """(validation prompts, training rows): the first `num_validation` validation rows by
    rank, and the training rows whose problem none of them has."""
    ranked_val = sorted(val_rows, key=lambda r: _rank(config.seed, r.prompt_id))
    validation = ranked_val[: config.num_validation]
    held_out = {r.problem for r in validation}
    train = [r for r in ranked if r.problem not in held_out]
    if not train:
        raise DataError(
            f"every one of the {len(ranked)} usable rows of "
            f"{config.source!r} is also a validation prompt of "
            f"DataConfig.validation_source={val_path!r}"
        )
    log.info(
        "validation: %d prompts from %s (%d usable rows); %d of %d training rows "
        "dropped as validation problems",
        len(validation),
        val_path,
        len(val_rows),
        len(ranked) - len(train),
        len(ranked),
    )
    return validation, train


class PromptSource:
    """An endless, checkpointable stream of this host's training prompts, plus the validation
    split. Iterate it (`next(source)`) or call `take(n)`; one consumer thread."""

    def __init__(
        self,
        config: DataConfig,
        tokenizer: Any = None,
        *,
        process_index: int = 0,
        process_count: int = 1,
        skip: Optional[Callable[[str], bool]] = None,
        id_field: Optional[str] = "id",
        domain: str = "",
        check_answer: Optional[Callable[[str], None]] = None,
    ):
        if config.template == "chat" and tokenizer is None:
            raise DataError("DataConfig.template='chat' needs a tokenizer with apply_chat_template")
        if not 0 <= process_index < process_count:
            raise DataError(
                f"process_index={process_index} must be in [0, process_count={process_count})"
            )
        self.config, self.tokenizer, self.skip = config, tokenizer, skip
        self.process_index, self.process_count = process_index, process_count
        self.domain = domain
        rows, self.stats = load_rows(config, id_field, check_answer)
        log_skipped(self.stats, config.source)
        self.num_overlap = 0  # training rows dropped: their problem is a validation prompt's
        val_path = config.validation_path()
        val_rows, self.validation_stats = _validation_rows(config, id_field, check_answer)
        if domain:  # ids unique across a mixture's domains (both may have an id "17")
            rows = [row._replace(prompt_id=f"{domain}/{row.prompt_id}") for row in rows]
            if val_path is not None:
                val_rows = [r._replace(prompt_id=f"{domain}/{r.prompt_id}") for r in val_rows]
        ranked = sorted(rows, key=lambda r: _rank(config.seed, r.prompt_id))
        n_val = config.num_validation
        if val_path is None:
            if n_val >= len(ranked):
                raise DataError(
                    f"DataConfig.num_validation={n_val} leaves no training prompts: "
                    f"{config.source!r} has {len(ranked)} usable rows"
                )
            self._validation, train = ranked[:n_val], ranked[n_val:]
        else:
            self._validation, train = _split_by_problem(config, ranked, val_rows, val_path)
            self.num_overlap = len(ranked) - len(train)
        if len(train) < process_count:
            raise DataError(
                f"{len(train)} training prompts cannot give each of process_count="
                f"{process_count} hosts one"
            )
        self.num_train = len(train)
        self._shard = train[process_index::process_count]
        self._fingerprint = hashlib.sha256(
            "\n".join(r.prompt_id for r in train).encode("utf-8")
        ).hexdigest()[:16]
        self.epoch, self.position, self.num_skipped = 0, 0, 0
        self._order = self._permutation(0)

    @property
    def shard_size(self) -> int:
        return len(self._shard)

    def shard_ids(self) -> list[str]:
        """Prompt ids of this host's training shard (in base order)."""
        return [r.prompt_id for r in self._shard]

    def validation(self, shard: bool = False) -> list[Prompt]:
        """The held-out prompts; `shard=True` gives this host's part (v[p::P])."""
        rows = (
            self._validation[self.process_index :: self.process_count]
            if shard
            else self._validation
        )
        return [self._prompt(r) for r in rows]

    def _permutation(self, epoch: int) -> list[int]:
        order = list(range(len(self._shard)))
        random.Random(f"{self.config.seed}:{epoch}:{self.process_index}").shuffle(order)
        return order

    def _prompt(self, row: Row) -> Prompt:
        return Prompt(
            row.prompt_id,
            row.problem,
            row.answer,
            format_prompt(row.problem, self.config, self.tokenizer),
            self.domain,
        )

    def __iter__(self) -> "PromptSource":
        return self

    def __next__(self) -> Prompt:
        skipped = 0
        while True:
            if self.position >= len(self._order):
                self.epoch, self.position = self.epoch + 1, 0
                self._order = self._permutation(self.epoch)
            row = self._shard[self._order[self.position]]
            self.position += 1
            if self.skip is None or not self.skip(row.prompt_id):
                return self._prompt(row)
            skipped += 1
            self.num_skipped += 1
            if skipped >= len(self._shard):
                raise DataError(
                    f"all {len(self._shard)} prompts of host {self.process_index}'s "
                    "shard are retired by the skip predicate (no-positive-resampling)"
                )

    def take(self, n: int) -> list[Prompt]:
        return [next(self) for _ in range(n)]

    # ------------------------------------------------------------------------------- cursor
    def state_dict(self) -> dict:
        return {
            "epoch": self.epoch,
            "position": self.position,
            "num_skipped": self.num_skipped,
            "seed": self.config.seed,
            "process_index": self.process_index,
            "process_count": self.process_count,
            "num_train": self.num_train,
            "fingerprint": self._fingerprint,
        }

    def load_state_dict(self, state: dict) -> None:
        expected = {
            "seed": self.config.seed,
            "process_index": self.process_index,
            "process_count": self.process_count,
            "num_train": self.num_train,
            "fingerprint": self._fingerprint,
        }
        for key, value in expected.items():
            if state.get(key) != value:
                raise DataError(
                    f"data cursor does not fit this run: saved {key}="
                    f"{state.get(key)!r}, now {value!r} (same data, seed and host "
                    "layout are needed to resume exactly)"
                )
        epoch, position = int(state["epoch"]), int(state["position"])
        if epoch < 0 or not 0 <= position <= len(self._shard):
            raise DataError(
                f"data cursor epoch={epoch}, position={position} out of range for a "
                f"shard of {len(self._shard)} prompts"
            )
        self.epoch, self.position = epoch, position
        self.num_skipped = int(state.get("num_skipped", 0))
        self._order = self._permutation(epoch)
