"""Decoder building blocks: RMSNorm, RoPE (with Llama-3 scaling), GQA attention, SwiGLU MLP
(the decoder block that joins them, dense or MoE, is in transformer.py).

Weights are stored in the layout the einsums use ([in, ..., out]) and every parameter carries
`logical_axes` metadata that `mesh.RULES` maps to mesh axes. Parameters live in `param_dtype`
and are cast to `compute_dtype` at use, so bf16 compute over fp32 master weights works.
"""
from __future__ import annotations

import math
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from scalerl_jax.config import ModelConfig, RopeScaling

# Finite rather than -inf: a query with no visible key (padding) then attends uniformly
# instead of producing NaN, and its output is masked out downstream anyway.
_MASK_VALUE = -1e30


def param(rngs: nnx.Rngs, shape, axes, dtype, init: str = "normal", std: float = 0.02):
    if init == "normal":
        value = std * jax.random.normal(rngs.params(), shape, jnp.float32)
    elif init == "ones":
        value = jnp.ones(shape, jnp.float32)
    else:
        value = jnp.zeros(shape, jnp.float32)
    return nnx.Param(value.astype(dtype), logical_axes=tuple(axes))


class RMSNorm(nnx.Module):
    def __init__(self, dim: int, eps: float, dtype, rngs: nnx.Rngs, axis_name: str = "norm"):
        self.scale = param(rngs, (dim,), (axis_name,), dtype, init="ones")
        self.eps = eps

    def __call__(self, x):
        # Normalise in fp32 (as HF does) and cast back: bf16 variance loses too much.
        xf = x.astype(jnp.float32)
        xf = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + self.eps)
        return (xf * self.scale.get_value().astype(jnp.float32)).astype(x.dtype)


def rope_inv_freq(head_dim: int, theta: float, scaling: Optional[RopeScaling]) -> np.ndarray:
    inv = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    if scaling is None:
        return inv.astype(np.float32)
    # Llama-3: long wavelengths are slowed by `factor`, short ones kept, and the band between
    # the two thresholds interpolates smoothly between the two.
    wavelen = 2 * math.pi / inv
    ctx = scaling.original_max_position_embeddings
    long_wl = ctx / scaling.low_freq_factor
    short_wl = ctx / scaling.high_freq_factor
    smooth = (ctx / wavelen - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor)
    blended = (1 - smooth) * inv / scaling.factor + smooth * inv
    out = np.where(wavelen > long_wl, inv / scaling.factor, inv)
    out = np.where((wavelen >= short_wl) & (wavelen <= long_wl), blended, out)
    return out.astype(np.float32)


def apply_rope(x, positions, inv_freq):
    """x: [B, T, H, D]; positions: [B, T]. Half-split rotation (HF `rotate_half` convention)."""
    angles = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq)  # [B, T, D/2]
    cos = jnp.cos(angles)[:, :, None, :]
    sin = jnp.sin(angles)[:, :, None, :]
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return out.astype(x.dtype)


class Attention(nnx.Module):
    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
        d, h, kv, hd = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.dim_per_head
        pd = jnp.dtype(cfg.param_dtype)
        self.q = param(rngs, (d, h, hd), ("embed", "heads", "head_dim"), pd)
        self.k = param(rngs, (d, kv, hd), ("embed", "kv_heads", "head_dim"), pd)
        self.v = param(rngs, (d, kv, hd), ("embed", "kv_heads", "head_dim"), pd)
        self.o = param(rngs, (h, hd, d), ("heads", "head_dim", "embed"), pd)
        if cfg.qkv_bias:
            self.q_bias = param(rngs, (h, hd), ("heads", "head_dim"), pd, init="zeros")
            self.k_bias = param(rngs, (kv, hd), ("kv_heads", "head_dim"), pd, init="zeros")
            self.v_bias = param(rngs, (kv, hd), ("kv_heads", "head_dim"), pd, init="zeros")
        if cfg.qk_norm:
            self.q_norm = RMSNorm(hd, cfg.rms_norm_eps, pd, rngs, axis_name="head_dim")
            self.k_norm = RMSNorm(hd, cfg.rms_norm_eps, pd, rngs, axis_name="head_dim")
        self.cfg = cfg

    def _project(self, x, positions):
        cfg, dt = self.cfg, x.dtype
        q = jnp.einsum("btd,dhk->bthk", x, self.q.get_value().astype(dt))
        k = jnp.einsum("btd,dhk->bthk", x, self.k.get_value().astype(dt))
        v = jnp.einsum("btd,dhk->bthk", x, self.v.get_value().astype(dt))
        if cfg.qkv_bias:
            q = q + self.q_bias.get_value().astype(dt)
            k = k + self.k_bias.get_value().astype(dt)
            v = v + self.v_bias.get_value().astype(dt)
        if cfg.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        # A trace-time constant; kept off the module so it never becomes model state.
        inv_freq = rope_inv_freq(cfg.dim_per_head, cfg.rope_theta, cfg.rope_scaling)
        return apply_rope(q, positions, inv_freq), apply_rope(k, positions, inv_freq), v

    def __call__(self, x, positions, mask, cache=None):
        """x: [B, T, D]; mask: [B, T, S] bool (True = may attend).

        Without a cache S == T. With a cache (k, v: [B, S, KV, hd]) the new keys/values are
        written at `positions[:, 0]` onwards (contiguous per row) and attention runs over all S
        cache entries; entries past a row's current position are hidden by `mask`.
        Returns (out [B, T, D], updated cache or None).
        """
        q, k, v = self._project(x, positions)
        if cache is not None:
            ck, cv = cache
            start = positions[:, 0]
            write = jax.vmap(lambda c, new, s: jax.lax.dynamic_update_slice_in_dim(c, new, s, 0))
            ck = write(ck, k.astype(ck.dtype), start)
            cv = write(cv, v.astype(cv.dtype), start)
            k, v, cache = ck.astype(x.dtype), cv.astype(x.dtype), (ck, cv)
        # Without a cache the mask is causal by index (Transformer.__call__), so chunking holds.
        out = attend(q, k, v, mask, self.cfg.attention_chunk if cache is None else 0)
        out = jnp.einsum("bthk,hkd->btd", out, self.o.get_value().astype(x.dtype))
        return out, cache


# Query chunks per sequence at most: the chunk loop is unrolled into the graph, so very long
# sequences get bigger chunks rather than a huge program.
_MAX_QUERY_CHUNKS = 16


def attend(q, k, v, mask, query_chunk: int = 0):
    """Grouped-query attention. q: [B, T, H, hd]; k, v: [B, S, KV, hd]; mask: [B, T, S].

    `query_chunk > 0` requires S == T and a mask that is causal by index (the training path):
    queries are then processed in chunks that read only the keys up to the chunk's end.
    """
    t = q.shape[1]
    if query_chunk <= 0 or t <= query_chunk or k.shape[1] != t:
        return _attend_block(q, k, v, mask)
    chunk = max(query_chunk, -(-t // _MAX_QUERY_CHUNKS))
    outs = []
    for c0 in range(0, t, chunk):
        c1 = min(t, c0 + chunk)
        outs.append(_attend_block(q[:, c0:c1], k[:, :c1], v[:, :c1], mask[:, c0:c1, :c1]))
    return jnp.concatenate(outs, axis=1)


def _attend_block(q, k, v, mask):
    b, t, h, hd = q.shape
    kv = k.shape[2]
    # Heads before time in q (small) gives XLA's CPU dots their batch-major layout (measured
    # ~1.5x faster fwd+bwd than contracting the [B, T, KV, G, hd] layout directly); k and v
    # stay as stored, so the decode path does not copy the cache.
    q = q.reshape(b, t, kv, h // kv, hd).transpose(0, 2, 3, 1, 4)
    scores = jnp.einsum("bkgtd,bskd->bkgts", q, k, preferred_element_type=jnp.float32)
    scores = scores * (1.0 / math.sqrt(hd))
    scores = jnp.where(mask[:, None, None, :, :], scores, _MASK_VALUE)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    out = jnp.einsum("bkgts,bskd->bkgtd", probs, v)
    return out.transpose(0, 3, 1, 2, 4).reshape(b, t, h, hd)


class MLP(nnx.Module):
    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs, intermediate_size: Optional[int] = None):
        d, pd = cfg.hidden_size, jnp.dtype(cfg.param_dtype)
        f = intermediate_size or cfg.intermediate_size
        self.gate = param(rngs, (d, f), ("embed", "mlp"), pd)
        self.up = param(rngs, (d, f), ("embed", "mlp"), pd)
        self.down = param(rngs, (f, d), ("mlp", "embed"), pd)

    def __call__(self, x):
        dt = x.dtype
        g = x @ self.gate.get_value().astype(dt)
        u = x @ self.up.get_value().astype(dt)
        return (jax.nn.silu(g) * u) @ self.down.get_value().astype(dt)

