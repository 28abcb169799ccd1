"""The sampler driver's units of work, apart from the loop that drives them: what it is fed
(`Prompt`, the token ids `driver_token_ids` reads from a tokenizer, and `check_driver_args`,
which holds a driver's arguments against its engine), the records it keeps per prompt
(`GroupWork`) and per sample (`Sample`) and the counters it reports (`DRIVER_COUNTS`), and the
pure functions that bucket a prompt (`prefill_buckets`) and seed a sample (`sample_seed`)."""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple, Optional, Sequence

import numpy as np

from scalerl_jax.config import SamplerConfig
from scalerl_jax.sampler.engine import COMPILED_FIELDS

# Driver.stats: these counts, then the seconds spent in generate / prefill / host work / idle.
DRIVER_COUNTS = (
    "prompts",
    "groups",
    "completions",
    "finish_eos",
    "finish_interrupted",
    "finish_truncated",
    "interrupted",
    "truncated_prompts",
    "prefills",
    "prefill_calls",
    "generate_calls",
    "decode_steps",
    "slot_steps",
    "tokens",
    "forced_tokens",
    "weight_updates",
)


class Prompt(NamedTuple):
    prompt_id: str
    tokens: Sequence[int]
    metadata: dict = {}
    ticket: Optional[int] = None  # admission number: seeds its samples; None: the Driver counts


def check_driver_args(engine, cfg: SamplerConfig, group_size: int, think_close_ids, phrase_ids):
    """ValueError naming the argument when a Driver's would not work with its `engine`: a
    group size below 1, a `cfg` that differs from the engine's in a field compiled into it, or
    interruption token ids that do not match `cfg.interruptions` / the engine's forced-token
    queue."""
    if group_size < 1:
        raise ValueError(f"group_size={group_size} must be >= 1")
    differ = [
        f"{name}={getattr(cfg, name)!r} (engine: {getattr(engine.cfg, name)!r})"
        for name in COMPILED_FIELDS
        if getattr(cfg, name) != getattr(engine.cfg, name)
    ]
    if differ:
        raise ValueError(
            f"Driver cfg differs from its Engine's SamplerConfig in fields compiled into the "
            f"engine: {', '.join(differ)}; the engine would sample with its own. Build an "
            f"Engine with this SamplerConfig, or take these fields from engine.cfg "
            f"(dataclasses.replace(engine.cfg, <driver-side fields>))"
        )
    if not cfg.interruptions:
        unread = [
            name
            for name, ids in (("think_close_ids", think_close_ids), ("phrase_ids", phrase_ids))
            if len(ids)
        ]
        if unread:
            raise ValueError(
                f"{' and '.join(unread)} given but SamplerConfig.interruptions "
                "is False: the driver reads them only to interrupt"
            )
        return
    if not len(phrase_ids):
        raise ValueError(
            "SamplerConfig.interruptions is on but phrase_ids is empty: "
            "pass the encoded interruption_phrase"
        )
    if len(phrase_ids) > engine.max_forced_tokens:
        raise ValueError(
            f"phrase_ids has {len(phrase_ids)} tokens > engine "
            f"max_forced_tokens={engine.max_forced_tokens}"
        )


def driver_token_ids(cfg: SamplerConfig, tokenizer, *, max_forced_tokens: int) -> dict:
    """`eos_ids`, `think_close_ids` and `phrase_ids` for a `Driver`, from `tokenizer.eos_ids`
    and `cfg`'s think_close / interruption_phrase strings, encoded without special tokens.

    With interruptions off both id lists are empty: the driver reads them only to interrupt.
    Raises ValueError naming the field when the phrase encodes to no token or to more than
    `max_forced_tokens` (the engine's forced-token queue), or a non-empty think_close to none.
    """
    eos_ids = tuple(int(t) for t in tokenizer.eos_ids)
    if not cfg.interruptions:
        return dict(eos_ids=eos_ids, think_close_ids=(), phrase_ids=())
    close = (
        tuple(int(t) for t in tokenizer.encode(cfg.think_close, add_special_tokens=False))
        if cfg.think_close
        else ()
    )
    if cfg.think_close and not close:
        raise ValueError(
            f"SamplerConfig.think_close={cfg.think_close!r} encodes to no token: "
            "the driver could never see thinking end"
        )
    phrase = tuple(
        int(t) for t in tokenizer.encode(cfg.interruption_phrase, add_special_tokens=False)
    )
    if not phrase:
        raise ValueError(
            f"SamplerConfig.interruption_phrase={cfg.interruption_phrase!r} "
            "encodes to no token, with interruptions on"
        )
    if len(phrase) > max_forced_tokens:
        raise ValueError(
            f"SamplerConfig.interruption_phrase={cfg.interruption_phrase!r} "
            f"encodes to {len(phrase)} tokens > the engine's max_forced_tokens="
            f"{max_forced_tokens} (Engine(..., max_forced_tokens=...))"
        )
    return dict(eos_ids=eos_ids, think_close_ids=close, phrase_ids=phrase)


def prefill_buckets(max_prefill_length: int, min_bucket: int = 16) -> list[int]:
    """Padded prefill lengths: powers of two from min_bucket, capped by max_prefill_length."""
    out, b = [], min_bucket
    while b < max_prefill_length:
        out.append(b)
        b *= 2
    return out + [max_prefill_length]


def sample_seed(seed: int, ticket: int, index: int) -> np.ndarray:
    """Two uint32 words, a function of (seed, ticket, sample index) only: the PRNG key of one
    sample (and the seed of its thinking budget)."""
    return np.random.SeedSequence([seed & 0xFFFFFFFF, ticket, index]).generate_state(2, np.uint32)


@dataclasses.dataclass
class GroupWork:
    prompt_id: str
    tokens: np.ndarray
    metadata: dict
    truncated: bool
    completions: list
    ticket: int
    version: int  # params version of the prefill
    prefix: Any = None  # device prefix, held until all G samples are inserted
    row: int = 0  # this prompt's row of `prefix` (a batched prefill holds several)
    inserted: int = 0
    done: int = 0


@dataclasses.dataclass
class Sample:
    group: GroupWork
    index: int
    cap: int  # hard cap on generated tokens
    budget: Optional[int]  # thinking budget; None: no interruption
    tokens: list = dataclasses.field(default_factory=list)
    logprobs: list = dataclasses.field(default_factory=list)
    forced: list = dataclasses.field(default_factory=list)
    versions: list = dataclasses.field(default_factory=list)
    think_open: bool = True
    interrupted: bool = False
    first_call: int = 0  # the first generate call whose tokens are this sample's (dispatch ahead)
