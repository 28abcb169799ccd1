"""The prompt stream between the data source and the sampler: tickets and exact resume.

Every prompt the sampler takes gets a ticket, its admission number on this host; step s trains
on tickets [(s - 1) B, s B) (train/pipeline.py). The feed remembers every prompt issued but not
yet consumed, so a checkpoint stores them with the cursor and a resumed feed re-issues them
first under the same tickets. A prompt's domain (data/mixture.py) travels with it in
`metadata["domain"]` to the scorer.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

from scalerl_jax.data.mixture import MixtureSource
from scalerl_jax.data.prompts import Prompt, PromptSource
from scalerl_jax.sampler.driver import Prompt as SamplerPrompt


class PromptFeed:
    def __init__(self, source: PromptSource | MixtureSource, tokenizer: Any):
        self._source, self._tokenizer = source, tokenizer
        self._lock = threading.Lock()
        self._next_ticket = 0
        self._inflight: dict[int, Prompt] = {}  # ticket -> prompt, in ticket order
        self._replay: list[Prompt] = []

    @property
    def issued(self) -> int:
        """Tickets issued so far (the next prompt's ticket)."""
        return self._next_ticket

    def __iter__(self):
        return self

    def __next__(self) -> SamplerPrompt:
        """Called from the sampler thread."""
        with self._lock:
            prompt = self._replay.pop(0) if self._replay else next(self._source)
            ticket, self._next_ticket = self._next_ticket, self._next_ticket + 1
            self._inflight[ticket] = prompt
        ids = self._tokenizer.encode(prompt.text)
        return SamplerPrompt(
            prompt.prompt_id,
            ids,
            {"answer": prompt.answer, "problem": prompt.problem, "domain": prompt.domain},
            ticket,
        )

    def consumed(self, ticket: int) -> None:
        """The group of `ticket` reached the trainer (trained on, filtered or dropped)."""
        with self._lock:
            self._inflight.pop(ticket, None)

    def state_dict(self) -> dict:
        with self._lock:
            pending = self._replay + list(self._inflight.values())
            first = self._next_ticket - len(pending)
            return {
                "cursor": self._source.state_dict(),
                "next_ticket": first,
                "inflight": [dataclasses.asdict(p) for p in pending],
            }

    def load_state_dict(self, state: dict) -> None:
        with self._lock:
            self._source.load_state_dict(state["cursor"])
            self._replay = [Prompt(**p) for p in state["inflight"]]
            self._next_ticket = int(state.get("next_ticket", 0))
            self._inflight.clear()
