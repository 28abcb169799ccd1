"""Loss aggregation: how per-token losses of a batch become one scalar.

Every mode is per-token weights W [N, T] (data, no gradient) with loss = sum(W * per_token_loss):
``token`` (DAPO), ``sequence`` (GRPO), ``prompt`` (ScaleRL), ``constant`` (Dr.GRPO). Padding
tokens, padding rows (prompt index outside [0, num_prompts)) and dropped prompts change neither
the loss nor its gradient; an empty batch gives 0.0. The modes' formulas and how they differ
from TRL's: docs/losses.md, "Aggregation modes".
"""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

AGGREGATIONS = ("token", "sequence", "prompt", "constant")


def counted_mask(
    mask: jax.Array, prompt_index: Optional[jax.Array] = None, num_prompts: Optional[int] = None
) -> jax.Array:
    """Boolean [N, T]: tokens that take part in the loss (mask != 0 and a valid prompt row)."""
    m = jnp.asarray(mask) != 0
    if prompt_index is not None:
        if num_prompts is None:
            raise ValueError("num_prompts is required when prompt_index is given")
        p = jnp.asarray(prompt_index)
        m = m & ((p >= 0) & (p < num_prompts))[:, None]
    return m


def check_aggregation_args(
    mask_shape: tuple,
    prompt_index_shape: Optional[tuple],
    *,
    aggregation: str,
    num_prompts: Optional[int],
    max_length: Optional[int],
) -> None:
    """Static argument checks; raise ValueError naming the argument and the numbers."""
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"aggregation={aggregation!r}: must be one of {AGGREGATIONS}")
    if len(mask_shape) != 2:
        raise ValueError(f"mask must be [N, T], got shape {mask_shape}")
    if prompt_index_shape is not None and tuple(prompt_index_shape) != (mask_shape[0],):
        raise ValueError(f"prompt_index must be [N]=({mask_shape[0]},), got {prompt_index_shape}")
    if aggregation == "prompt" and (prompt_index_shape is None or num_prompts is None):
        raise ValueError("aggregation='prompt' needs prompt_index [N] and num_prompts")
    if num_prompts is not None and not _positive_int(num_prompts):
        raise ValueError(f"num_prompts={num_prompts!r}: must be a positive Python int (static)")
    if max_length is not None and not _positive_int(max_length):
        raise ValueError(f"max_length={max_length!r}: must be a positive Python int (static)")


def _positive_int(x) -> bool:
    return bool(isinstance(x, (int, np.integer)) and not isinstance(x, bool) and x > 0)


def token_weights(
    mask: jax.Array,
    prompt_index: Optional[jax.Array] = None,
    *,
    aggregation: str,
    num_prompts: Optional[int] = None,
    max_length: Optional[int] = None,
) -> tuple[jax.Array, dict]:
    """Per-token weights W [N, T] (fp32, data) for `aggregation`, and count metrics.

    Returns (W, metrics) with metrics: ``tokens`` (counted tokens), ``sequences`` (non-empty
    rows), ``prompts`` (non-empty prompts; only when prompt_index is given) and ``normaliser``
    (the outer divisor: tokens, sequences, prompts, or sequences x max_length).
    """
    check_aggregation_args(
        tuple(jnp.shape(mask)),
        None if prompt_index is None else tuple(jnp.shape(prompt_index)),
        aggregation=aggregation,
        num_prompts=num_prompts,
        max_length=max_length,
    )
    m = counted_mask(mask, prompt_index, num_prompts)
    # Counts in int32: fp32 stops counting exactly past 2^24 tokens (2048 x 32k is 67M).
    row_tokens = m.sum(axis=1, dtype=jnp.int32)
    total = row_tokens.sum()
    nonempty = row_tokens > 0
    n_rows = nonempty.sum(dtype=jnp.int32)
    metrics = {"tokens": total, "sequences": n_rows}

    prompt_tokens_of_row = None
    if prompt_index is not None:
        onehot = jnp.asarray(prompt_index)[:, None] == jnp.arange(num_prompts)[None, :]
        prompt_tokens = jnp.sum(jnp.where(onehot, row_tokens[:, None], 0), axis=0)
        n_prompts = (prompt_tokens > 0).sum(dtype=jnp.int32)
        prompt_tokens_of_row = jnp.sum(jnp.where(onehot, prompt_tokens[None, :], 0), axis=1)
        metrics["prompts"] = n_prompts

    one = jnp.int32(1)
    if aggregation == "token":
        normaliser = total
        w_row = jnp.full(row_tokens.shape, 1.0, jnp.float32) / jnp.maximum(total, one)
    elif aggregation == "sequence":
        normaliser = n_rows
        w_row = 1.0 / (
            jnp.maximum(row_tokens, one).astype(jnp.float32)
            * jnp.maximum(n_rows, one).astype(jnp.float32)
        )
    elif aggregation == "prompt":
        normaliser = metrics["prompts"]
        # Set above: aggregation='prompt' is refused without prompt_index.
        w_row = 1.0 / (
            jnp.maximum(prompt_tokens_of_row, one).astype(jnp.float32)  # type: ignore[arg-type]
            * jnp.maximum(normaliser, one).astype(jnp.float32)
        )
    else:  # constant
        length = jnp.shape(mask)[1] if max_length is None else max_length
        normaliser = n_rows * length
        w_row = jnp.full(row_tokens.shape, 1.0, jnp.float32) / (
            jnp.maximum(n_rows, one).astype(jnp.float32) * jnp.float32(length)
        )
    weights = jnp.where(m, w_row.astype(jnp.float32)[:, None], 0.0)
    metrics["normaliser"] = normaliser
    metrics = {k: v.astype(jnp.float32) for k, v in metrics.items()}
    return jax.lax.stop_gradient(weights), metrics


def aggregate(
    per_token: jax.Array,
    mask: jax.Array,
    prompt_index: Optional[jax.Array] = None,
    *,
    aggregation: str,
    num_prompts: Optional[int] = None,
    max_length: Optional[int] = None,
) -> tuple[jax.Array, dict]:
    """Aggregate per-token values [N, T] into one fp32 scalar; returns (value, count metrics).

    Values at tokens that do not count are ignored even when they are NaN or inf.
    """
    weights, metrics = token_weights(
        mask, prompt_index, aggregation=aggregation, num_prompts=num_prompts, max_length=max_length
    )
    return weighted_sum(per_token, weights), metrics


def weighted_sum(per_token: jax.Array, weights: jax.Array) -> jax.Array:
    """sum(W * x) in fp32, ignoring x wherever W == 0 (so masked garbage cannot leak in)."""
    x = jnp.asarray(per_token).astype(jnp.float32)
    return jnp.sum(weights * jnp.where(weights != 0, x, 0.0))


def masked_mean(x: jax.Array, m: jax.Array) -> jax.Array:
    """Mean of x over the boolean mask m (0.0 when m is empty); for metrics."""
    x = jnp.where(m, jnp.asarray(x).astype(jnp.float32), 0.0)
    return jnp.sum(x) / jnp.maximum(jnp.sum(m, dtype=jnp.int32), 1).astype(jnp.float32)


def masked_max(x: jax.Array, m: jax.Array, empty: float = 0.0) -> jax.Array:
    """Max of x over the boolean mask m (`empty` when m is empty); for metrics."""
    x = jnp.asarray(x).astype(jnp.float32)
    best = jnp.max(jnp.where(m, x, -jnp.inf), initial=-jnp.inf)
    return jnp.where(jnp.any(m), best, jnp.float32(empty))
