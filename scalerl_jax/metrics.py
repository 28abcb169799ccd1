"""Run metrics: the `metrics.jsonl` writer/reader and compute accounting.

`RUN_DIR/metrics.jsonl` is the source of truth for scaling-curve fitting: one strict-JSON
object per line (`run`, `train`, `eval`, `forecast` events), appended in order; a resumed run
first drops the records after its checkpoint (`truncate_after`). Only host 0 writes it. The
schema (version 1): docs/metrics.md.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from typing import Any, Iterable, Optional

import numpy as np

SCHEMA_VERSION = 1
FILENAME = "metrics.jsonl"
COMPUTE_KEYS = ("device_hours", "sampler_device_hours", "trainer_device_hours", "flops", "tokens")


def _plain(value: Any) -> Any:
    """JSON-safe copy: numpy/jax scalars to Python, arrays to lists, non-finite floats to None."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (str, bool)) or value is None:
        return value
    if hasattr(value, "tolist") and not isinstance(value, (int, float)):
        return _plain(value.tolist())  # numpy/jax arrays and scalars
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, int):
        return value
    raise TypeError(f"metrics value {value!r} of type {type(value).__name__} is not JSON-able")


def _metrics_path(path_or_run_dir: str | os.PathLike) -> str:
    path = os.fspath(path_or_run_dir)
    return os.path.join(path, FILENAME) if os.path.isdir(path) else path


class MetricsWriter:
    """Appends events to `workdir/metrics.jsonl`, one flushed line each.

    Flushing every line means a killed process loses nothing it already wrote (fsync=True also
    survives a machine crash, at a syscall per line).
    """

    def __init__(self, workdir: str | os.PathLike, *, fsync: bool = False):
        # After a resume call `truncate_after` first: the writer appends to whatever it finds.
        os.makedirs(workdir, exist_ok=True)
        self.path = os.path.join(os.fspath(workdir), FILENAME)
        self._fsync = fsync
        self.resumed = os.path.exists(self.path) and os.path.getsize(self.path) > 0
        self._wall_offset, torn = _resume_state(self.path)
        self._t0 = time.monotonic()
        self._file = open(self.path, "a", encoding="utf-8")
        if torn:  # a killed writer left a partial line: start ours on a fresh one
            self._file.write("\n")

    def wall_s(self) -> float:
        return self._wall_offset + (time.monotonic() - self._t0)

    def write(self, event: str, step: int, **fields: Any) -> dict:
        if not isinstance(event, str) or not event:
            raise ValueError(f"metrics event={event!r}: must be a non-empty string")
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
            raise ValueError(f"metrics step={step!r} (event {event!r}): must be an int >= 0")
        for reserved in ("event", "step", "wall_s"):
            if reserved in fields:
                raise ValueError(f"metrics field {reserved!r} is set by the writer; drop it")
        record = {"event": event, "step": int(step), "wall_s": round(self.wall_s(), 3)}
        record.update(_plain(fields))
        self._file.write(json.dumps(record, allow_nan=False) + "\n")
        self._file.flush()
        if self._fsync:
            os.fsync(self._file.fileno())
        return record

    def run(self, config: dict, step: int = 0, **fields: Any) -> dict:
        return self.write(
            "run",
            step,
            schema=SCHEMA_VERSION,
            time=time.time(),
            resumed=self.resumed,
            config=config,
            **fields,
        )

    def train(self, step: int, **metrics: Any) -> dict:
        return self.write("train", step, **metrics)

    def eval(
        self,
        step: int,
        *,
        pass_rate: float,
        k: int,
        compute: dict,
        per_domain: Optional[dict] = None,
        **extra: Any,
    ) -> dict:
        missing = [key for key in COMPUTE_KEYS if key not in compute]
        if missing:
            raise ValueError(
                f"eval at step {step}: compute lacks {missing} "
                f"(has {sorted(compute)}); use ComputeMeter.compute()"
            )
        fields = dict(pass_rate=pass_rate, k=k, compute=compute, **extra)
        if per_domain is not None:
            fields["per_domain"] = per_domain
        return self.write("eval", step, **fields)

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> "MetricsWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _parse(line: bytes | str) -> Optional[dict]:
    """The record on a line, or None when it is not one (torn, not JSON, no event)."""
    try:
        record = json.loads(line)
    except ValueError:
        return None
    if not isinstance(record, dict) or not isinstance(record.get("event"), str):
        return None
    return record


def _step_of(record: dict) -> Optional[int]:
    step = record.get("step")
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def _resume_state(path: str) -> tuple[float, bool]:
    """(largest wall_s over the records in an existing file, whether it ends in a torn line)."""
    if not os.path.exists(path) or os.path.getsize(path) == 0:
        return 0.0, False
    with open(path, "rb") as f:
        data = f.read()
    wall = 0.0
    for line in data.splitlines():
        record = _parse(line)
        if record is not None and isinstance(record.get("wall_s"), (int, float)):
            wall = max(wall, float(record["wall_s"]))
    return wall, not data.endswith(b"\n")


def truncate_after(path_or_run_dir: str | os.PathLike, step: int) -> int:
    """Keep only the records with step <= `step` (the restored checkpoint's step); returns how
    many non-blank lines were dropped, torn and malformed ones included.

    The rewrite is atomic (temp file in the same directory, fsync, rename): a kill during it
    leaves the old file or the new one. Call it before opening a MetricsWriter on the file,
    which would otherwise keep appending to the replaced one. A missing file is left missing.
    """
    if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
        raise ValueError(f"truncate_after step={step!r}: must be an int >= 0")
    path = _metrics_path(path_or_run_dir)
    if not os.path.exists(path):
        return 0
    with open(path, "rb") as f:
        data = f.read()
    kept, dropped = [], 0
    for line in data.splitlines():
        if not line.strip():
            continue
        record = _parse(line)
        record_step = None if record is None else _step_of(record)
        if record_step is None or record_step > step:
            dropped += 1
        else:
            kept.append(line + b"\n")
    if dropped or (data and not data.endswith(b"\n")):
        from scalerl_jax.rundir import atomic_write  # lazy: keeps metrics import-light

        atomic_write(path, b"".join(kept))
    return dropped


@dataclasses.dataclass(frozen=True)
class MetricsLog:
    """Parsed `metrics.jsonl`: the events in file order and the malformed lines skipped."""

    path: str
    events: tuple
    malformed_lines: tuple  # 1-based line numbers

    @property
    def malformed(self) -> int:
        return len(self.malformed_lines)

    def of(self, event: str) -> list:
        return [e for e in self.events if e["event"] == event]


def read_metrics(path_or_run_dir: str | os.PathLike) -> MetricsLog:
    """Reads a metrics file (or RUN_DIR/metrics.jsonl), skipping and counting malformed lines.

    Each event dict gets `_line`, its 1-based line number, for error messages.
    """
    path = _metrics_path(path_or_run_dir)
    if not os.path.exists(path):
        raise FileNotFoundError(f"no metrics file at {path}")
    events, bad = [], []
    with open(path, encoding="utf-8", errors="replace") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            record = _parse(line)
            if record is None:
                bad.append(lineno)
                continue
            record["_line"] = lineno
            events.append(record)
    return MetricsLog(path=path, events=tuple(events), malformed_lines=tuple(bad))


def get_path(record: dict, key_path: str) -> Any:
    """record['a']['b'] for key_path 'a.b'; KeyError naming the missing part and what is there."""
    node: Any = record
    walked: list[str] = []
    for part in key_path.split("."):
        if not isinstance(node, dict) or part not in node:
            where = ".".join(walked) or "<top level>"
            have = (
                sorted(k for k in node if not k.startswith("_")) if isinstance(node, dict) else []
            )
            raise KeyError(f"no {part!r} under {where} (keys there: {have})")
        node = node[part]
        walked.append(part)
    return node


def eval_xy(
    log: MetricsLog | Iterable[dict],
    x_key: str = "compute.device_hours",
    y_key: str = "pass_rate",
    event: str = "eval",
) -> tuple[np.ndarray, np.ndarray]:
    """(x, y) float arrays from `event` records by dotted key path, sorted by step.

    Keeps the last record of each step (a resumed run may repeat one); null values become NaN.
    """
    events = log.events if isinstance(log, MetricsLog) else tuple(log)
    where = f" in {log.path}" if isinstance(log, MetricsLog) else ""
    by_step: dict[int, tuple[float, float]] = {}
    for record in events:
        if record.get("event") != event:
            continue
        values = []
        for key in (x_key, y_key):
            try:
                values.append(get_path(record, key))
            except KeyError as err:
                raise KeyError(
                    f"{event} record at step {record.get('step')} (line "
                    f"{record.get('_line', '?')}){where} lacks {key!r}: {err.args[0]}"
                ) from None
        x, y = (np.nan if v is None else float(v) for v in values)
        by_step[int(record["step"])] = (x, y)
    if not by_step:
        raise ValueError(f"no {event!r} records{where}")
    steps = sorted(by_step)
    xy = np.array([by_step[s] for s in steps], dtype=np.float64)
    return xy[:, 0], xy[:, 1]


def forward_flops_per_token(
    num_params: float, num_layers: int, hidden_size: int, context_len: float
) -> float:
    """2N for the matmuls plus 4*L*d*ctx for QK^T and AV over `context_len` attended positions.

    N: parameters used in matmuls per token (the LM head counts; an embedding lookup does not).
    hidden_size: the attention width (num_heads * head_dim).
    """
    return 2.0 * num_params + 4.0 * num_layers * hidden_size * context_len


class ComputeMeter:
    """Cumulative sampler/trainer device-seconds, FLOPs and tokens; `compute()` is the eval dict.

    context_len is the mean number of positions each token attends to: about T/2 for causal
    training on length-T sequences, about prompt_len + gen_len/2 for decoding.
    Training costs 3x a forward pass (forward + backward), so 6N + attention per token.

    Resume: the trainer stores `state_dict()` in each checkpoint's meta and restores it with
    `load_state_dict`, so the count continues from exactly the restored step whenever the run
    was killed (work after the checkpoint is redone and counted once). `initial` (an eval
    record's `compute`) is the fallback for checkpoints written before meta held the meter; it
    loses the compute between that eval and the checkpoint.
    """

    _FIELDS = (
        "sampler_device_s",
        "trainer_device_s",
        "sampler_flops",
        "trainer_flops",
        "sampler_tokens",
        "trainer_tokens",
    )

    def __init__(
        self, num_params: float, num_layers: int, hidden_size: int, initial: Optional[dict] = None
    ):
        for name, value in (
            ("num_params", num_params),
            ("num_layers", num_layers),
            ("hidden_size", hidden_size),
        ):
            if not value > 0:
                raise ValueError(f"ComputeMeter {name}={value!r}: must be > 0")
        self.num_params, self.num_layers, self.hidden_size = num_params, num_layers, hidden_size
        self.totals = dict.fromkeys(self._FIELDS, 0.0)
        if initial is not None:
            for side in ("sampler", "trainer"):
                self.totals[f"{side}_device_s"] = 3600.0 * float(initial[f"{side}_device_hours"])
                self.totals[f"{side}_flops"] = float(initial.get(f"{side}_flops", 0.0))
                self.totals[f"{side}_tokens"] = float(initial.get(f"{side}_tokens", 0.0))

    def state_dict(self) -> dict:
        """The running totals as a JSON-able dict (floats round-trip exactly through JSON)."""
        return {"version": 1, **{key: float(v) for key, v in self.totals.items()}}

    def load_state_dict(self, state: dict) -> None:
        missing = [key for key in self._FIELDS if key not in state]
        if missing:
            raise ValueError(
                f"ComputeMeter.load_state_dict: missing {missing} (has "
                f"{sorted(state)}); expected the output of state_dict()"
            )
        if state.get("version", 1) != 1:
            raise ValueError(
                f"ComputeMeter.load_state_dict: version={state['version']!r}, "
                "this code reads version 1"
            )
        self.totals = {key: float(state[key]) for key in self._FIELDS}

    def _add(self, side: str, seconds: float, devices: int, tokens: float, flops: float) -> None:
        if seconds < 0 or devices <= 0 or tokens < 0:
            raise ValueError(
                f"ComputeMeter.add_{side}: seconds={seconds}, devices={devices}, "
                f"tokens={tokens}; need seconds >= 0, devices > 0, tokens >= 0"
            )
        self.totals[f"{side}_device_s"] += devices * seconds
        self.totals[f"{side}_tokens"] += tokens
        self.totals[f"{side}_flops"] += flops

    def add_sampler(
        self, *, seconds: float, devices: int, tokens: float, context_len: float
    ) -> None:
        per_token = forward_flops_per_token(
            self.num_params, self.num_layers, self.hidden_size, context_len
        )
        self._add("sampler", seconds, devices, tokens, tokens * per_token)

    def add_trainer(
        self, *, seconds: float, devices: int, tokens: float, context_len: float
    ) -> None:
        per_token = 3.0 * forward_flops_per_token(
            self.num_params, self.num_layers, self.hidden_size, context_len
        )
        self._add("trainer", seconds, devices, tokens, tokens * per_token)

    def compute(self) -> dict:
        t = self.totals
        out = {
            "sampler_device_hours": t["sampler_device_s"] / 3600.0,
            "trainer_device_hours": t["trainer_device_s"] / 3600.0,
            "sampler_flops": t["sampler_flops"],
            "trainer_flops": t["trainer_flops"],
            "sampler_tokens": t["sampler_tokens"],
            "trainer_tokens": t["trainer_tokens"],
        }
        out["device_hours"] = out["sampler_device_hours"] + out["trainer_device_hours"]
        out["flops"] = out["sampler_flops"] + out["trainer_flops"]
        out["tokens"] = out["sampler_tokens"] + out["trainer_tokens"]
        return out
