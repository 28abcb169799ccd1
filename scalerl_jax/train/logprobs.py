"""Per-token log-probs and entropy from final hidden states and the LM head, in sequence chunks.

At Qwen's vocabulary (152k) fp32 logits are 600 KB per token: 2.5 GB for one 4k-token row, and
the softmax and the backward pass need several such buffers. Here the sequence is cut into chunks
of `chunk_size` positions; a `lax.scan` runs over them and each chunk's body is wrapped in
`jax.checkpoint`, so the backward pass recomputes the chunk's logits instead of keeping them.
At any moment only one chunk's [B, chunk, V] logits (and their cotangent) exist, so the peak
memory of this part is set by B * chunk * V, whatever the sequence length T.

The rows are kept whole (chunks cut the sequence axis, not the batch axis) so that a batch
sharded over devices stays evenly spread in every chunk.
"""
from __future__ import annotations

import functools
from typing import Optional

import jax
import jax.numpy as jnp


def _chunk_stats(kernel, hidden, targets, *, fp32: bool, with_entropy: bool, logits_sharding):
    """hidden [B, C, D], targets [B, C] -> (logp [B, C], entropy [B, C] or None), fp32."""
    # Mirrors Transformer.logits: an fp32 head multiplies fp32 operands (the ScaleRL fix for
    # sampler/trainer mismatch); a bf16 head (the ablation) rounds its logits to bf16.
    dt = jnp.float32 if fp32 else hidden.dtype
    logits = jnp.einsum("bcd,dv->bcv", hidden.astype(dt), kernel.astype(dt),
                        preferred_element_type=jnp.float32 if fp32 else None)
    logits = logits.astype(jnp.float32)
    if logits_sharding is not None:
        logits = jax.lax.with_sharding_constraint(logits, logits_sharding)
    lse = jax.nn.logsumexp(logits, axis=-1)
    # A select-and-sum instead of a gather: it shards like any elementwise op when V is split
    # over the tensor axis, where a gather along a sharded axis would all-gather the logits.
    vocab = jax.lax.broadcasted_iota(jnp.int32, logits.shape, 2)
    picked = jnp.sum(jnp.where(vocab == targets[..., None], logits, 0.0), axis=-1)
    logp = picked - lse
    if not with_entropy:
        return logp, None
    probs = jnp.exp(logits - lse[..., None])
    entropy = lse - jnp.sum(probs * logits, axis=-1)
    return logp, entropy


def token_logprobs(hidden: jax.Array, kernel: jax.Array, targets: jax.Array, *,
                   chunk_size: Optional[int] = 512, fp32: bool = True,
                   with_entropy: bool = True,
                   logits_sharding=None) -> tuple[jax.Array, Optional[jax.Array]]:
    """log pi(targets) and the policy entropy at every position.

    hidden [B, T, D] (any float dtype), kernel [D, V], targets [B, T] int (the next token of
    each position). Returns (logp [B, T] fp32, entropy [B, T] fp32 or None). Differentiable in
    hidden and kernel. `chunk_size=None` computes all logits at once (reference path for tests
    and small models). T need not be a multiple of chunk_size: the tail is zero-padded and the
    padded positions are dropped from the result. `logits_sharding` (optional, for use under
    jit on a mesh): the sharding of each [B, chunk, V] logits block, e.g. rows over the batch
    axes and V over `tensor`, so the partitioner never replicates a block.
    """
    if hidden.ndim != 3 or kernel.ndim != 2 or targets.shape != hidden.shape[:2]:
        raise ValueError(f"token_logprobs: need hidden [B, T, D], kernel [D, V], targets [B, T];"
                         f" got {hidden.shape}, {kernel.shape}, {targets.shape}")
    if hidden.shape[2] != kernel.shape[0]:
        raise ValueError(f"token_logprobs: hidden size {hidden.shape[2]} != kernel rows "
                         f"{kernel.shape[0]}")
    stats = functools.partial(_chunk_stats, fp32=fp32, with_entropy=with_entropy,
                              logits_sharding=logits_sharding)
    b, t, d = hidden.shape
    if chunk_size is None or chunk_size >= t:
        return stats(kernel, hidden, targets)
    if chunk_size <= 0:
        raise ValueError(f"token_logprobs: chunk_size={chunk_size} must be > 0 or None")
    n = -(-t // chunk_size)
    pad = n * chunk_size - t
    if pad:
        hidden = jnp.pad(hidden, ((0, 0), (0, pad), (0, 0)))
        targets = jnp.pad(targets, ((0, 0), (0, pad)))
    hs = hidden.reshape(b, n, chunk_size, d).swapaxes(0, 1)  # [n, B, C, D]
    ts = targets.reshape(b, n, chunk_size).swapaxes(0, 1)
    # prevent_cse=False is the documented setting inside scan (the loop already stops CSE).
    body = jax.checkpoint(stats, prevent_cse=False)

    def step(carry, xs):
        return carry, body(kernel, *xs)

    _, (logp, entropy) = jax.lax.scan(step, None, (hs, ts))

    def unchunk(x):
        return x.swapaxes(0, 1).reshape(b, n * chunk_size)[:, :t]

    return unchunk(logp), (unchunk(entropy) if with_entropy else None)
