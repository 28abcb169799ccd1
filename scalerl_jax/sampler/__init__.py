"""Sampler: the JetStream-API engine, the continuous-batching driver, and weight sync."""

from scalerl_jax.sampler.driver import (
    Driver,
    DriverError,
    Prompt,
    PromptTooLongError,
    driver_token_ids,
    prefill_buckets,
)
from scalerl_jax.sampler.engine import (
    COMPILED_FIELDS,
    DecodeState,
    Engine,
    EngineError,
    Prefix,
    ResultTokens,
    count_compilations,
)
from scalerl_jax.sampler.sampling import sample, token_logprob
from scalerl_jax.sampler.types import FINISH_REASONS, Completion, Group
from scalerl_jax.sampler.weight_sync import WeightSync, host_view

__all__ = [
    "COMPILED_FIELDS",
    "Completion",
    "DecodeState",
    "Driver",
    "DriverError",
    "Engine",
    "EngineError",
    "FINISH_REASONS",
    "Group",
    "Prefix",
    "Prompt",
    "PromptTooLongError",
    "ResultTokens",
    "WeightSync",
    "count_compilations",
    "driver_token_ids",
    "host_view",
    "prefill_buckets",
    "sample",
    "token_logprob",
]
