"""No-positive-resampling (ScaleRL): retire prompts the policy has learned to solve.

A prompt is retired, permanently, as soon as one observed pass rate of its group is >=
``threshold`` (0.9, with a 1e-6 tolerance so that 9 of 10 in fp32 counts); groups already in
flight are still recorded, and the running mean is kept for analysis only. Host-side Python
state, serialised to plain JSON types (`to_dict` / `from_dict`) with prompt ids keeping their
int or str type.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Iterable, Union

import numpy as np

PromptId = Union[int, str]
_TOLERANCE = 1e-6
_FORMAT = 1


def _check_id(pid: Any) -> PromptId:
    if isinstance(pid, np.integer):
        pid = int(pid)
    if isinstance(pid, bool) or not isinstance(pid, (int, str)):
        raise TypeError(f"prompt id {pid!r} ({type(pid).__name__}): must be int or str")
    return pid


class NoPositiveResampling:
    """Per-prompt pass-rate history and the set of retired prompts.

    ``update(ids, rates)`` after scoring; ``is_retired(id)`` / ``filter(ids)`` when drawing the
    next epoch's prompts.
    """

    def __init__(self, threshold: float = 0.9):
        if isinstance(threshold, bool) or not (
            isinstance(threshold, numbers.Real) and 0 < threshold <= 1
        ):
            raise ValueError(f"threshold={threshold!r}: must be in (0, 1]")
        self.threshold: float = float(threshold)
        # id -> [observations, latest pass rate, sum of pass rates, retired]
        self._stats: dict[PromptId, list] = {}

    def update(self, prompt_ids: Iterable[PromptId], pass_rates: Iterable[float]) -> list:
        """Record one pass rate per prompt id (in [0, 1]); return ids retired by this call."""
        ids = [_check_id(p) for p in prompt_ids]
        rates = [float(r) for r in np.asarray(pass_rates, dtype=np.float64).reshape(-1)]
        if len(ids) != len(rates):
            raise ValueError(f"update: {len(ids)} prompt ids but {len(rates)} pass rates")
        for pid, rate in zip(ids, rates):
            if not (math.isfinite(rate) and 0.0 <= rate <= 1.0):
                raise ValueError(f"pass rate of prompt {pid!r} is {rate}: must be in [0, 1]")
        newly = []
        for pid, rate in zip(ids, rates):
            entry = self._stats.setdefault(pid, [0, 0.0, 0.0, False])
            entry[0] += 1
            entry[1] = rate
            entry[2] += rate
            if not entry[3] and rate + _TOLERANCE >= self.threshold:
                entry[3] = True
                newly.append(pid)
        return newly

    def is_retired(self, prompt_id: PromptId) -> bool:
        entry = self._stats.get(_check_id(prompt_id))
        return bool(entry and entry[3])

    def filter(self, prompt_ids: Iterable[PromptId]) -> list:
        """The ids that are not retired, in order."""
        return [p for p in prompt_ids if not self.is_retired(p)]

    def latest_pass_rate(self, prompt_id: PromptId):
        """Latest observed pass rate, or None if never observed."""
        entry = self._stats.get(_check_id(prompt_id))
        return None if entry is None else entry[1]

    def mean_pass_rate(self, prompt_id: PromptId):
        """Mean over all observations, or None if never observed."""
        entry = self._stats.get(_check_id(prompt_id))
        return None if entry is None else entry[2] / entry[0]

    @property
    def num_seen(self) -> int:
        return len(self._stats)

    @property
    def num_retired(self) -> int:
        return sum(1 for e in self._stats.values() if e[3])

    def to_dict(self) -> dict:
        """Plain-JSON state (columns of equal length)."""
        ids = list(self._stats)
        cols = list(zip(*self._stats.values())) if ids else [(), (), (), ()]
        return {
            "format": _FORMAT,
            "threshold": self.threshold,
            "ids": ids,
            "count": list(cols[0]),
            "latest": list(cols[1]),
            "sum": list(cols[2]),
            "retired": list(cols[3]),
        }

    @classmethod
    def from_dict(cls, data: dict) -> "NoPositiveResampling":
        if data.get("format") != _FORMAT:
            raise ValueError(f"curriculum state format={data.get('format')!r}: expected {_FORMAT}")
        out = cls(threshold=data["threshold"])
        columns = ("ids", "count", "latest", "sum", "retired")
        lengths = {c: len(data[c]) for c in columns}
        if len(set(lengths.values())) != 1:
            raise ValueError(f"curriculum state columns differ in length: {lengths}")
        for pid, n, latest, total, retired in zip(*(data[c] for c in columns)):
            pid = _check_id(pid)
            if pid in out._stats:
                raise ValueError(f"curriculum state: prompt id {pid!r} appears twice")
            out._stats[pid] = [int(n), float(latest), float(total), bool(retired)]
        return out

    def __eq__(self, other) -> bool:
        return isinstance(other, NoPositiveResampling) and self.to_dict() == other.to_dict()

    def __repr__(self) -> str:
        return (
            f"NoPositiveResampling(threshold={self.threshold}, seen={self.num_seen}, "
            f"retired={self.num_retired})"
        )
