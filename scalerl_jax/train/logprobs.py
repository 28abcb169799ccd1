"""Per-token log-probs and entropy from final hidden states and the LM head, in sequence chunks.

A `lax.scan` over chunks of `chunk_size` positions, each with a hand-written backward pass
(`_chunk_stats`) that saves only [B, chunk] normalisers and entropies and recomputes the chunk's
logits, so only one chunk's [B, chunk, V] fp32 logits exist at a time (at a 152k vocabulary a
4k-token row's logits alone are 2.5 GB) and the backward does less than autodiff through a
checkpoint would. Chunks cut the sequence axis, never the batch axis, so a sharded batch stays
evenly spread. Figures: docs/training.md, "Step".
"""

from __future__ import annotations

import functools
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from scalerl_jax.models.layers import dense


def _logits(hidden, kernel, fp32: bool, logits_sharding, temperature: float = 1.0):
    """[B, C, D] x [D, V] -> fp32 logits [B, C, V], divided by the temperature."""
    # Mirrors Transformer.logits: an fp32 head multiplies fp32 operands (the ScaleRL fix for
    # sampler/trainer mismatch); a bf16 head (the ablation) rounds its logits to bf16.
    dt = jnp.float32 if fp32 else hidden.dtype
    logits = dense(
        hidden.astype(dt), kernel.astype(dt), preferred_element_type=jnp.float32 if fp32 else None
    )
    logits = logits.astype(jnp.float32)
    if temperature != 1.0:  # after the fp32 cast, the same op as the sampler's
        logits = logits / jnp.float32(temperature)
    if logits_sharding is not None:
        logits = jax.lax.with_sharding_constraint(logits, logits_sharding)
    return logits


def _stats_from_logits(logits, targets, with_entropy: bool):
    """(logp, entropy or None, lse), fp32, each [B, C].

    One exponential per logit: the entropy reuses the normaliser's exp(l - max), as
    lse - E_p[l] = lse - sum(e * l) / sum(e) (XLA fuses the sibling reductions into one pass).
    """
    m = jax.lax.stop_gradient(jnp.max(logits, axis=-1, keepdims=True))
    e = jnp.exp(logits - m)
    s0 = jnp.sum(e, axis=-1)
    lse = m[..., 0] + jnp.log(s0)
    # A select-and-sum instead of a gather: it shards like any elementwise op when V is split
    # over the tensor axis, where a gather along a sharded axis would all-gather the logits.
    vocab = jax.lax.broadcasted_iota(jnp.int32, logits.shape, 2)
    picked = jnp.sum(jnp.where(vocab == targets[..., None], logits, 0.0), axis=-1)
    logp = picked - lse
    if not with_entropy:
        return logp, None, lse
    entropy = lse - jnp.sum(e * logits, axis=-1) / s0
    return logp, entropy, lse


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5, 6, 7))
def _chunk_stats(
    kernel, hidden, targets, fp32, with_entropy, logits_sharding, keep_logits, temperature
):
    """hidden [B, C, D], targets [B, C] -> (logp [B, C], entropy [B, C] or None), fp32.

    Hand-written backward: with logits l, p = softmax(l), lse its normaliser and H the entropy,
    d logp_t / d l = onehot(t) - p and d H / d l = -p * (l - lse + H), so the cotangent of the
    logits is one elementwise pass over exp(l - lse) given the saved [B, C] lse and H. The
    [B, C, V] logits are recomputed by one matmul (`keep_logits=False`, the chunked path: only
    [B, C]-sized residuals) or kept from the forward pass (`keep_logits=True`, one chunk).
    With a temperature tau the logits are l = hW / tau, so the matmul's cotangent is that of l
    divided by tau."""
    logits = _logits(hidden, kernel, fp32, logits_sharding, temperature)
    logp, entropy, _ = _stats_from_logits(logits, targets, with_entropy)
    return logp, entropy


def _chunk_stats_fwd(
    kernel, hidden, targets, fp32, with_entropy, logits_sharding, keep_logits, temperature
):
    logits = _logits(hidden, kernel, fp32, logits_sharding, temperature)
    logp, entropy, lse = _stats_from_logits(logits, targets, with_entropy)
    res = (kernel, hidden, targets, lse, entropy, logits if keep_logits else None)
    return (logp, entropy), res


def _chunk_stats_bwd(fp32, with_entropy, logits_sharding, keep_logits, temperature, res, cts):
    kernel, hidden, targets, lse, entropy, logits = res
    g_logp, g_ent = cts
    if logits is None:
        logits = _logits(hidden, kernel, fp32, logits_sharding, temperature)
    shifted = logits - lse[..., None]  # log p
    probs = jnp.exp(shifted)
    vocab = jax.lax.broadcasted_iota(jnp.int32, logits.shape, 2)
    onehot = (vocab == targets[..., None]).astype(jnp.float32)
    g_logits = g_logp[..., None] * (onehot - probs)
    if with_entropy and g_ent is not None:
        g_logits = g_logits - g_ent[..., None] * probs * (shifted + entropy[..., None])
    if temperature != 1.0:
        g_logits = g_logits / jnp.float32(temperature)
    if logits_sharding is not None:
        g_logits = jax.lax.with_sharding_constraint(g_logits, logits_sharding)
    # Transposes of the forward einsum in its dtype: a bf16 head's backward runs in bf16 too.
    dt = jnp.float32 if fp32 else hidden.dtype
    g_logits = g_logits.astype(dt)
    g_hidden = dense(g_logits, kernel.astype(dt).T, preferred_element_type=jnp.float32)
    g_kernel = jnp.einsum(
        "nd,nv->dv",
        hidden.astype(dt).reshape(-1, hidden.shape[-1]),
        g_logits.reshape(-1, g_logits.shape[-1]),
        preferred_element_type=jnp.float32,
    )
    g_targets = np.zeros(targets.shape, jax.dtypes.float0)
    return g_kernel.astype(kernel.dtype), g_hidden.astype(hidden.dtype), g_targets


_chunk_stats.defvjp(_chunk_stats_fwd, _chunk_stats_bwd)


def token_logprobs(
    hidden: jax.Array,
    kernel: jax.Array,
    targets: jax.Array,
    *,
    chunk_size: Optional[int] = 512,
    fp32: bool = True,
    with_entropy: bool = True,
    logits_sharding=None,
    temperature: float = 1.0,
) -> tuple[jax.Array, Optional[jax.Array]]:
    """log pi(targets) and the policy entropy at every position.

    hidden [B, T, D] (any float dtype), kernel [D, V], targets [B, T] int (the next token of
    each position). Returns (logp [B, T] fp32, entropy [B, T] fp32 or None). Differentiable in
    hidden and kernel. `chunk_size=None` computes all logits at once (reference path for tests
    and small models). T need not be a multiple of chunk_size: the tail is zero-padded and the
    padded positions are dropped from the result. `logits_sharding` (optional, for use under
    jit on a mesh): the sharding of each [B, chunk, V] logits block, e.g. rows over the batch
    axes and V over `tensor`, so the partitioner never replicates a block. `temperature` (> 0):
    the distribution softmax(logits / temperature), the one a sampler at that temperature draws
    from, so that RL's ratio compares the trainer and the sampler on the same distribution.
    """
    if hidden.ndim != 3 or kernel.ndim != 2 or targets.shape != hidden.shape[:2]:
        raise ValueError(
            f"token_logprobs: need hidden [B, T, D], kernel [D, V], targets [B, T];"
            f" got {hidden.shape}, {kernel.shape}, {targets.shape}"
        )
    if hidden.shape[2] != kernel.shape[0]:
        raise ValueError(
            f"token_logprobs: hidden size {hidden.shape[2]} != kernel rows {kernel.shape[0]}"
        )
    if not temperature > 0:
        raise ValueError(f"token_logprobs: temperature={temperature} must be > 0")
    temperature = float(temperature)
    b, t, d = hidden.shape
    if chunk_size is None or chunk_size >= t:
        return _chunk_stats(
            kernel, hidden, targets, fp32, with_entropy, logits_sharding, True, temperature
        )
    if chunk_size <= 0:
        raise ValueError(f"token_logprobs: chunk_size={chunk_size} must be > 0 or None")
    n = -(-t // chunk_size)
    pad = n * chunk_size - t
    if pad:
        hidden = jnp.pad(hidden, ((0, 0), (0, pad), (0, 0)))
        targets = jnp.pad(targets, ((0, 0), (0, pad)))
    hs = hidden.reshape(b, n, chunk_size, d).swapaxes(0, 1)  # [n, B, C, D]
    ts = targets.reshape(b, n, chunk_size).swapaxes(0, 1)

    def step(carry, xs):
        return carry, _chunk_stats(
            kernel, *xs, fp32, with_entropy, logits_sharding, False, temperature
        )

    _, (logp, entropy) = jax.lax.scan(step, None, (hs, ts))

    def unchunk(x):
        return x.swapaxes(0, 1).reshape(b, n * chunk_size)[:, :t]

    return unchunk(logp), (unchunk(entropy) if with_entropy else None)
