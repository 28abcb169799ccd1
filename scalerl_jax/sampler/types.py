"""What the sampler hands to the rest of the system: completed groups of generations.

Host-side numpy, so groups can cross threads and queues without touching devices.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

FINISH_REASONS = ("eos", "interrupted", "truncated")
# eos:         the policy ended the sequence itself.
# interrupted: thinking was cut by the forced phrase, then the answer ended with eos.
# truncated:   the hard cap (max_new_tokens / cache length / answer budget) stopped it.


@dataclasses.dataclass
class Completion:
    tokens: np.ndarray  # [L] int32: generated tokens, forced ones included, eos included
    logprobs: np.ndarray  # [L] float32: log-prob under the distribution actually sampled from
    forced: np.ndarray  # [L] bool: injected by the driver (interruption phrase); not policy samples
    versions: np.ndarray  # [L] int32: policy version that produced each token
    finish_reason: str
    interrupted: bool = False  # the phrase was forced (also True when later truncated)

    def __post_init__(self):
        n = len(self.tokens)
        for name in ("logprobs", "forced", "versions"):
            if len(getattr(self, name)) != n:
                raise ValueError(
                    f"Completion.{name} has length {len(getattr(self, name))}, tokens has {n}"
                )
        if self.finish_reason not in FINISH_REASONS:
            raise ValueError(
                f"Completion.finish_reason={self.finish_reason!r} not in {FINISH_REASONS}"
            )

    @property
    def min_version(self) -> int:
        return int(self.versions.min()) if len(self.versions) else -1


@dataclasses.dataclass
class Group:
    """The G generations of one prompt."""

    prompt_id: str
    prompt_tokens: np.ndarray  # [P] int32 (after any truncation)
    completions: list[Completion]
    metadata: dict[str, Any] = dataclasses.field(default_factory=dict)  # e.g. reference answer
    prompt_truncated: bool = False
    ticket: int = -1  # admission number (the trainer consumes groups in ticket order)
    prefill_version: int = -1  # params version of the prompt's prefill (its oldest KV entries)

    @property
    def min_version(self) -> int:
        """The oldest policy this group's data depends on: its prompt's KV cache or a token."""
        tokens = min(c.min_version for c in self.completions)
        return tokens if self.prefill_version < 0 else min(tokens, self.prefill_version)
