"""The prompt stream between the data source and the sampler, with exact resume.

The sampler pulls prompts ahead of the trainer, so the data cursor alone would lose the prompts
that were in flight at a checkpoint. The feed remembers every prompt issued but not yet consumed
by a train step; a checkpoint stores them with the cursor, and a resumed feed re-issues them
first (their generations are regenerated), then continues from the cursor.
"""
from __future__ import annotations

import dataclasses
import threading
from typing import Any

from scalerl_jax.data.prompts import Prompt, PromptSource
from scalerl_jax.sampler.driver import Prompt as SamplerPrompt


class PromptFeed:
    def __init__(self, source: PromptSource, tokenizer: Any):
        self._source, self._tokenizer = source, tokenizer
        self._lock = threading.Lock()
        self._seq = 0
        self._inflight: dict[int, Prompt] = {}  # issue number -> prompt, in issue order
        self._replay: list[Prompt] = []

    def __iter__(self):
        return self

    def __next__(self) -> SamplerPrompt:
        """Called from the sampler thread."""
        with self._lock:
            prompt = self._replay.pop(0) if self._replay else next(self._source)
            seq, self._seq = self._seq, self._seq + 1
            self._inflight[seq] = prompt
        ids = self._tokenizer.encode(prompt.text)
        return SamplerPrompt(prompt.prompt_id, ids,
                             {"seq": seq, "answer": prompt.answer, "problem": prompt.problem})

    def consumed(self, seq: int) -> None:
        """The group of issue `seq` reached the trainer (trained on, filtered or dropped)."""
        with self._lock:
            self._inflight.pop(seq, None)

    def state_dict(self) -> dict:
        with self._lock:
            pending = self._replay + list(self._inflight.values())
            return {"cursor": self._source.state_dict(),
                    "inflight": [dataclasses.asdict(p) for p in pending]}

    def load_state_dict(self, state: dict) -> None:
        with self._lock:
            self._source.load_state_dict(state["cursor"])
            self._replay = [Prompt(**p) for p in state["inflight"]]
            self._inflight.clear()
