"""Forwards the records written to metrics.jsonl to TensorBoard and, if asked, Weights & Biases.

`Tracker.write(record)` takes the dict `MetricsWriter` returns, so metrics.jsonl stays the
single source of truth: every finite numeric leaf becomes a scalar `<event>/<dotted/path>` at
the record's step, in one TensorBoard run per stage plus `vs_compute/` (pass rate against
compute). Only process 0 writes (`enabled=False` elsewhere). Tags, layout and resume:
docs/metrics.md, "TensorBoard and Weights & Biases".
"""

from __future__ import annotations

import json
import math
import numbers
import os
import time
import uuid
from typing import Any, Optional

RL_EVENTS = ("run", "train", "eval", "forecast")
COMPUTE_RUN = "vs_compute"
_NOT_SCALARS = ("event", "step", "wall_s", "_line", "time", "schema", "resumed", "config")
WANDB_MISSING = (
    "Weights & Biases logging was asked for (project {project!r}) but the `wandb` "
    "package is not installed; run `pip install wandb` (or "
    "`pip install 'scalerl_jax[wandb]'`), or drop the W&B project setting"
)


def scalars(tree: dict, prefix: str) -> dict[str, float]:
    """{`prefix/a/b`: float} for each finite numeric leaf of a nested dict."""
    out: dict[str, float] = {}
    for key, value in tree.items():
        tag = f"{prefix}/{key}"
        if isinstance(value, dict):
            out.update(scalars(value, tag))
            continue
        if getattr(value, "ndim", None) == 0 and hasattr(value, "item"):
            value = value.item()  # numpy / jax 0-d arrays
        if isinstance(value, numbers.Real) and math.isfinite(value):
            out[tag] = float(value)
    return out


def _record_scalars(record: dict) -> dict[str, float]:
    fields = {k: v for k, v in record.items() if k not in _NOT_SCALARS}
    return scalars(fields, str(record["event"]))


class Tracker:
    """TensorBoard (always) and W&B (when `wandb_project` is given) sink for metric records."""

    def __init__(
        self,
        workdir: str | os.PathLike,
        *,
        enabled: bool = True,
        wandb_project: Optional[str] = None,
        wandb_name: Optional[str] = None,
        wandb_kwargs: Optional[dict] = None,
        flush_secs: int = 30,
    ):
        self.enabled = enabled
        self.workdir = os.fspath(workdir)
        self.logdir = os.path.join(self.workdir, "tensorboard")
        self.flush_secs = flush_secs
        self._writers: dict[str, Any] = {}
        self._purge: dict[str, int] = {}
        self._wandb_axes: set[str] = set()
        self.wandb: Any = None  # a wandb Run when asked for
        if enabled and wandb_project:
            self.wandb = _init_wandb(self.workdir, wandb_project, wandb_name, wandb_kwargs or {})

    def write(self, record: dict) -> None:
        if not self.enabled:
            return
        event, step = str(record["event"]), int(record["step"])
        if event == "run":
            if record.get("resumed"):
                self.purge("rl", step + 1)
            if self.wandb is not None and isinstance(record.get("config"), dict):
                self.wandb.config.update(record["config"], allow_val_change=True)
            return
        values = _record_scalars(record)
        writer = self._writer("rl" if event in RL_EVENTS else event)
        for tag, value in values.items():
            writer.add_scalar(tag, value, step)
        if event == "eval":
            self._write_vs_compute(record)
        if event in ("eval", "forecast"):
            self.flush()  # rare, and what a researcher is waiting for
        if self.wandb is not None and values:
            self._wandb_log(event, step, values)

    def purge(self, event_run: str, from_step: int) -> None:
        """Hides points at steps >= `from_step` already written to this run (`rl`, `sft`, ...)."""
        if not self.enabled:
            return
        self._purge[event_run] = int(from_step)
        if event_run in self._writers:  # purge_step is only written when a writer opens
            self._writers.pop(event_run).close()

    def _write_vs_compute(self, record: dict) -> None:
        compute = record.get("compute") or {}
        rates = scalars(
            {"pass_rate": record.get("pass_rate"), "per_domain": record.get("per_domain") or {}},
            "eval",
        )
        for suffix, value, scale in (
            ("device_seconds", compute.get("device_hours"), 3600.0),
            ("gflops", compute.get("flops"), 1e-9),
        ):
            if not isinstance(value, numbers.Real) or not math.isfinite(value):
                continue
            writer = self._writer(COMPUTE_RUN)
            for tag, rate in rates.items():
                writer.add_scalar(f"{tag}_vs_{suffix}", rate, int(round(float(value) * scale)))

    def _writer(self, run: str):
        if run not in self._writers:
            from tensorboardX import SummaryWriter

            # tensorboardX names files by the second and opens them with "wb": a writer
            # reopened within the same second (a purge) would overwrite the last file. The
            # nanosecond suffix keeps names unique and in creation order.
            self._writers[run] = SummaryWriter(
                os.path.join(self.logdir, run),
                purge_step=self._purge.get(run),
                flush_secs=self.flush_secs,
                filename_suffix=f".{time.time_ns() % 10**9:09d}",
            )
        return self._writers[run]

    def _wandb_log(self, event: str, step: int, values: dict[str, float]) -> None:
        axis = f"{event}/step"
        if axis not in self._wandb_axes:
            self.wandb.define_metric(axis)
            self.wandb.define_metric(f"{event}/*", step_metric=axis)
            self._wandb_axes.add(axis)
        self.wandb.log({**values, axis: step})

    def flush(self) -> None:
        for writer in self._writers.values():
            writer.flush()

    def close(self) -> None:
        for writer in self._writers.values():
            writer.close()
        self._writers.clear()
        if self.wandb is not None:
            self.wandb.finish()
            self.wandb = None

    def __enter__(self) -> "Tracker":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _init_wandb(workdir: str, project: str, name: Optional[str], kwargs: dict):
    try:
        import wandb
    except ImportError as err:
        raise ImportError(WANDB_MISSING.format(project=project)) from err
    id_dir = os.path.join(workdir, "wandb")
    id_path = os.path.join(id_dir, "run_id")
    if os.path.exists(id_path):
        with open(id_path, encoding="utf-8") as f:
            run_id = f.read().strip()
    else:
        run_id = uuid.uuid4().hex[:12]
        os.makedirs(id_dir, exist_ok=True)
        with open(id_path, "w", encoding="utf-8") as f:
            f.write(run_id + "\n")
    return wandb.init(project=project, name=name, id=run_id, resume="allow", dir=workdir, **kwargs)


def replay(workdir: str | os.PathLike, **tracker_kwargs: Any) -> int:
    """Writes WORKDIR/tensorboard from WORKDIR/sft/metrics.jsonl (the SFT warm-up's, if any)
    and WORKDIR/metrics.jsonl, e.g. for a run from before tracking; into an empty directory,
    since points already there would be doubled. Returns the number of records forwarded."""
    from scalerl_jax.metrics import FILENAME, read_metrics

    workdir = os.fspath(workdir)
    paths = [os.path.join(workdir, "sft", FILENAME), os.path.join(workdir, FILENAME)]
    events = [e for path in paths if os.path.exists(path) for e in read_metrics(path).events]
    with Tracker(workdir, **tracker_kwargs) as tracker:
        for record in events:
            tracker.write(record)
    return len(events)


if __name__ == "__main__":
    import sys

    for run_dir in sys.argv[1:] or ["."]:
        print(json.dumps({"workdir": run_dir, "records": replay(run_dir)}))
