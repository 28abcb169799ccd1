"""A mixture of prompt domains (math + code, ...): each draw picks a domain by weight.

Each domain is an ordinary `PromptSource` whose prompts carry `Prompt.domain`. Draw i of host
p picks by u_i = Random(f"{seed}:mix:{p}:{i}").random(), so the draw counter (with every
domain's cursor) is the whole RNG state and a resumed mixture yields exactly what would have
come next; a domain's count in a step of B is Binomial(B, w). Validation interleaves the
domains in proportion to their sizes (prompt j of n at (j + 0.5) / n). See docs/datasets.md.
"""

from __future__ import annotations

import bisect
import random
from typing import Any, Callable, Optional

from scalerl_jax.config import DataConfig
from scalerl_jax.data.prompts import DataError, Prompt, PromptSource


def open_source(
    config: DataConfig,
    tokenizer: Any = None,
    *,
    process_index: int = 0,
    process_count: int = 1,
    skip: Optional[Callable[[str], bool]] = None,
    check_answers: Optional[dict] = None,
):
    """The run's prompt stream: a `PromptSource` for one source (exactly as before mixtures
    existed), a `MixtureSource` when `config.domains` is set. `check_answers`: {domain:
    check(answer) raising ValueError} validating a domain's reference answers at load time
    (rewards.answer_checks; the domain of a single source is "")."""
    if not config.is_mixture:
        return PromptSource(
            config,
            tokenizer,
            process_index=process_index,
            process_count=process_count,
            skip=skip,
            id_field=config.id_field,
            check_answer=(check_answers or {}).get(""),
        )
    return MixtureSource(
        config,
        tokenizer,
        process_index=process_index,
        process_count=process_count,
        skip=skip,
        check_answers=check_answers,
    )


class MixtureSource:
    """PromptSource's interface (iterate / take / validation / state_dict) over several domains.
    One consumer thread."""

    def __init__(
        self,
        config: DataConfig,
        tokenizer: Any = None,
        *,
        process_index: int = 0,
        process_count: int = 1,
        skip: Optional[Callable[[str], bool]] = None,
        check_answers: Optional[dict] = None,
    ):
        if not config.is_mixture:
            raise DataError(
                "MixtureSource needs DataConfig.domains; use PromptSource for one source"
            )
        self.config, self.process_index = config, process_index
        check_answers = check_answers or {}
        self.sources: dict[str, PromptSource] = {}
        for d in config.domains:
            try:
                self.sources[d.name] = PromptSource(
                    config.domain_data(d.name),
                    tokenizer,
                    process_index=process_index,
                    process_count=process_count,
                    skip=skip,
                    id_field=d.id_field,
                    domain=d.name,
                    check_answer=check_answers.get(d.name),
                )
            except DataError as e:  # say which domain: the message names only its source
                raise DataError(f"data.domains.{d.name}: {e}") from None
        self.names = tuple(self.sources)
        total = sum(d.weight for d in config.domains)
        self.shares = {d.name: d.weight / total for d in config.domains}
        self._bounds, acc = [], 0.0
        for d in config.domains:
            acc += d.weight / total
            self._bounds.append(acc)
        self._bounds[-1] = 1.0  # rounding must not leave a gap above the last bound
        self.draws = 0

    @property
    def domains(self) -> tuple[str, ...]:
        return self.names

    @property
    def num_train(self) -> int:
        return sum(s.num_train for s in self.sources.values())

    @property
    def num_skipped(self) -> int:
        return sum(s.num_skipped for s in self.sources.values())

    def domain_of_draw(self, i: int) -> str:
        """The domain draw `i` of this host picks (a pure function of seed, host and i)."""
        u = random.Random(f"{self.config.seed}:mix:{self.process_index}:{i}").random()
        return self.names[min(bisect.bisect_right(self._bounds, u), len(self.names) - 1)]

    def validation(self, shard: bool = False) -> list[Prompt]:
        """Every domain's held-out prompts, interleaved by share (module docstring)."""
        keyed = []
        for rank, source in enumerate(self.sources.values()):
            prompts = source.validation(shard)
            keyed += [((j + 0.5) / len(prompts), rank, p) for j, p in enumerate(prompts)]
        return [p for *_, p in sorted(keyed, key=lambda t: t[:2])]

    def __iter__(self) -> "MixtureSource":
        return self

    def __next__(self) -> Prompt:
        prompt = next(self.sources[self.domain_of_draw(self.draws)])
        self.draws += 1
        return prompt

    def take(self, n: int) -> list[Prompt]:
        return [next(self) for _ in range(n)]

    # ------------------------------------------------------------------------------- cursor
    def state_dict(self) -> dict:
        return {
            "mixture": {"draws": self.draws, "domains": list(self.names)},
            "domains": {name: s.state_dict() for name, s in self.sources.items()},
        }

    def load_state_dict(self, state: dict) -> None:
        saved = state.get("mixture", {}).get("domains") if isinstance(state, dict) else None
        if saved != list(self.names):
            raise DataError(
                f"data cursor does not fit this run: saved domains {saved!r}, now "
                f"{list(self.names)!r} (a checkpoint of "
                f"{'one source' if saved is None else 'another mixture'})"
            )
        for name, source in self.sources.items():
            source.load_state_dict(state["domains"][name])
        self.draws = int(state["mixture"]["draws"])
