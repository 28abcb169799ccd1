"""Where prompt records come from: local JSON lines / JSON / Parquet files or directories of them,
Hugging Face `datasets` (hf:) and TensorFlow Datasets (tfds:), as (where, record) pairs; and
`DataError`, the error every data problem raises. Parsing the records into prompts is
data/prompts.py.
"""

from __future__ import annotations

import glob
import json
import os
from typing import Any, Iterator, NamedTuple

from scalerl_jax.errors import UserError


class DataError(UserError, ValueError):
    """The data cannot be used as configured. The message names the source and the numbers."""


class Invalid(NamedTuple):
    """A record that could not be decoded: the parser counts it as malformed, like a row with
    a missing field, so one bad line is a statistic rather than an error."""

    reason: str


def read_records(source: str, split: str = "train") -> Iterator[tuple[str, Any]]:
    """(where, record) pairs: `where` locates the record for error messages."""
    if source.startswith("hf:"):
        yield from _read_hf(source[3:], split)
    elif source.startswith("tfds:"):
        yield from _read_tfds(source[5:], split)
    else:
        yield from _read_local(source, split)


def _read_local(path: str, split: str) -> Iterator[tuple[str, Any]]:
    exts = (".jsonl", ".json", ".parquet")
    if os.path.isdir(path):
        files = sorted(
            f for f in glob.glob(os.path.join(path, "**", "*"), recursive=True) if f.endswith(exts)
        )
        # HF-style layouts keep splits side by side (data/train-00000.parquet, test-...).
        in_split = [f for f in files if split in os.path.basename(f)]
        files = in_split or files
        if not files:
            raise DataError(f"DataConfig.source={path!r}: directory holds no {exts} files")
    elif not os.path.exists(path):
        raise DataError(
            f"DataConfig.source={path!r}: no such file; expected a local {exts} "
            "path, or hf:NAME, tfds:NAME, synthetic:TASK"
        )
    elif not path.endswith(exts):
        raise DataError(f"DataConfig.source={path!r}: unsupported file type; use {exts}")
    else:
        files = [path]
    for f in files:
        yield from (_read_parquet(f) if f.endswith(".parquet") else _read_json(f))


def _read_json(path: str) -> Iterator[tuple[str, Any]]:
    with open(path, encoding="utf-8", errors="replace") as fh:
        if path.endswith(".json"):
            head = fh.read(1 << 12).lstrip()
            fh.seek(0)
            if head.startswith("["):  # a JSON array of records, not JSON lines
                try:
                    records = json.load(fh)
                except json.JSONDecodeError as e:
                    raise DataError(f"{path}: not valid JSON ({e})") from None
                for i, record in enumerate(records):
                    yield f"{path}[{i}]", record
                return
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                yield f"{path}:{lineno}", json.loads(line)
            except json.JSONDecodeError:
                yield f"{path}:{lineno}", Invalid("invalid JSON")


def _read_parquet(path: str) -> Iterator[tuple[str, Any]]:
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(path)
    except Exception as e:  # pyarrow raises several types for unreadable files
        raise DataError(f"{path}: not a readable Parquet file ({e})") from None
    n = 0
    for batch in parquet.iter_batches(batch_size=8192):
        for record in batch.to_pylist():
            yield f"{path}:row {n}", record
            n += 1


def _read_hf(spec: str, split: str) -> Iterator[tuple[str, Any]]:
    try:
        import datasets
    except ImportError:
        raise DataError(
            f"DataConfig.source='hf:{spec}' needs the Hugging Face `datasets` "
            "package, which is not installed: pip install datasets"
        ) from None
    if os.path.isdir(spec) and any(
        os.path.exists(os.path.join(spec, f))
        for f in ("dataset_info.json", "dataset_dict.json", "state.json")
    ):
        ds = datasets.load_from_disk(spec)  # a save_to_disk directory
        if isinstance(ds, datasets.DatasetDict):
            ds = ds[split]
    elif os.path.isfile(spec):
        builder = "parquet" if spec.endswith(".parquet") else "json"
        ds = datasets.load_dataset(builder, data_files=spec, split="train")
    else:
        name, _, config = spec.partition(":")
        ds = datasets.load_dataset(name, config or None, split=split)
    for i, record in enumerate(ds):
        yield f"hf:{spec}[{split}][{i}]", record


def _read_tfds(name: str, split: str) -> Iterator[tuple[str, Any]]:
    try:
        import tensorflow_datasets as tfds
    except ImportError:
        raise DataError(
            f"DataConfig.source='tfds:{name}' needs tensorflow-datasets, which is "
            "not installed: pip install 'scalerl_jax[tfds]'"
        ) from None
    for i, record in enumerate(tfds.as_numpy(tfds.load(name, split=split))):
        yield f"tfds:{name}[{split}][{i}]", _from_numpy(record)


def _from_numpy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _from_numpy(v) for k, v in value.items()}
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return value.item() if hasattr(value, "item") and getattr(value, "ndim", 1) == 0 else value
