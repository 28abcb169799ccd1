"""Loss aggregation: how per-token losses of a batch become one scalar.

Every mode is expressed as per-token weights W [N, T] with loss = sum(W * per_token_loss). The
weights are data (no gradient flows through them), so the gradient of any objective is simply
W times its per-token gradient, and the KL and entropy terms are aggregated the same way.

Which tokens count. A token counts when its mask is non-zero and, when `prompt_index` is given,
its row's prompt index lies in [0, num_prompts) (so -1 is a valid marker for padding rows). A
row with no counted token is *absent*: it gets weight 0 and is not counted in any denominator.
A prompt none of whose rows has a counted token is absent too. Consequently padding tokens,
padding rows and dropped prompts change neither the loss nor its gradient, in every mode, and
a batch with no counted token at all gives loss 0.0 (never NaN) and zero gradient.

Modes (n_i = counted tokens of row i, P_p = counted tokens of prompt p over all its rows):

* ``token``    (DAPO): sum over all counted tokens / total counted tokens.
* ``sequence`` (GRPO "sample average"): per row sum / n_i, then the mean over non-empty rows.
  TRL's ``grpo`` loss_type averages over all rows (an empty row adds a 0 to the mean); the two
  agree whenever every row has a counted token.
* ``prompt``   (ScaleRL "prompt average"): per prompt, the sum over its rows' tokens / P_p, then
  the mean over prompts with P_p > 0. Rows of one prompt need not be adjacent.
* ``constant`` (Dr.GRPO): sum over all counted tokens / (non-empty rows x max_length), with
  max_length defaulting to T. TRL's ``dr_grpo`` divides by (all rows x max_completion_length);
  the two agree whenever every row has a counted token. We count non-empty rows so that padding
  rows cannot rescale the loss.
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
