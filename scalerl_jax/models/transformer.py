"""The decoder policy: Llama-3.x, Qwen2.5 and Qwen3 models, dense or mixture-of-experts (Qwen3-MoE,
Llama-4-style routed + shared experts; models/moe.py), in one Flax NNX module.

Two paths share the weights:
* `model(tokens, positions, segment_ids)` -> final hidden states [B, T, D], for training. The LM
  head is applied separately (`logits`, or chunked in the train step) so that [B, T, V] fp32
  logits never need to exist at once. `model.forward(...)` also returns the MoE layers' router
  statistics (None for a dense model), which the train step logs and turns into the aux loss.
* `model.decode(tokens, positions, cache)` -> (hidden, cache), the KV-cache path for the sampler:
  prefill writes a whole prompt, decode steps write one token per row.
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
from flax import nnx

from scalerl_jax.config import ModelConfig
from scalerl_jax.models.layers import MLP, Attention, RMSNorm, param
from scalerl_jax.models.moe import MoE, RouterStats


class KVCache(NamedTuple):
    """Per-layer keys and values, each [B, S, KV, head_dim]. Logical axes:
    (cache_batch, cache_seq, kv_heads, head_dim)."""

    k: tuple
    v: tuple


CACHE_AXES = ("cache_batch", "cache_seq", "kv_heads", "head_dim")


def init_cache(cfg: ModelConfig, batch: int, length: int, dtype=None) -> KVCache:
    dtype = jnp.dtype(dtype or cfg.compute_dtype)
    shape = (batch, length, cfg.num_kv_heads, cfg.dim_per_head)
    zeros = tuple(jnp.zeros(shape, dtype) for _ in range(cfg.num_layers))
    return KVCache(zeros, tuple(jnp.zeros(shape, dtype) for _ in range(cfg.num_layers)))


class Block(nnx.Module):
    """Pre-norm decoder layer; its FFN is the dense MLP or, on MoE layers
    (`cfg.is_moe_layer(index)`), the routed experts."""

    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs, index: int = 0):
        pd = jnp.dtype(cfg.param_dtype)
        self.attn_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, pd, rngs)
        self.attn = Attention(cfg, rngs)
        self.mlp_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, pd, rngs)
        self.is_moe = cfg.is_moe_layer(index)
        self.mlp = MoE(cfg, rngs) if self.is_moe else MLP(cfg, rngs)

    def __call__(self, x, positions, mask, cache=None, valid=None):
        """Returns (x, cache, RouterStats or None). `valid` [B, T]: tokens router stats count."""
        h, cache = self.attn(self.attn_norm(x), positions, mask, cache)
        x = x + h
        if self.is_moe:
            out, stats = self.mlp(self.mlp_norm(x), valid)
            return x + out, cache, stats
        return x + self.mlp(self.mlp_norm(x)), cache, None


def _stack_stats(stats: list) -> Optional[RouterStats]:
    """Per-MoE-layer RouterStats -> one RouterStats with a leading layer axis (None: dense)."""
    stats = [s for s in stats if s is not None]
    if not stats:
        return None
    return RouterStats(*(jnp.stack(x) for x in zip(*stats)))


class Transformer(nnx.Module):
    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
        pd = jnp.dtype(cfg.param_dtype)
        self.cfg = cfg
        self.embed = param(rngs, (cfg.vocab_size, cfg.hidden_size), ("vocab", "embed"), pd)
        self.layers = nnx.List([Block(cfg, rngs, i) for i in range(cfg.num_layers)])
        self.final_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, pd, rngs)
        if not cfg.tie_embeddings:
            self.lm_head = param(rngs, (cfg.hidden_size, cfg.vocab_size), ("embed", "vocab"), pd)

    # -- shared pieces -------------------------------------------------------------------------
    def _embed(self, tokens):
        return jnp.take(self.embed.get_value(), tokens, axis=0).astype(self.cfg.compute_dtype)

    def head_kernel(self):
        """The LM head as a [D, V] matrix (the transposed embedding when tied)."""
        if self.cfg.tie_embeddings:
            return self.embed.get_value().T
        return self.lm_head.get_value()

    def logits(self, hidden):
        """Logits for hidden states [..., D]: fp32 when `fp32_head` (ScaleRL), else compute
        dtype."""
        dt = jnp.float32 if self.cfg.fp32_head else jnp.dtype(self.cfg.compute_dtype)
        return jnp.einsum("...d,dv->...v", hidden.astype(dt), self.head_kernel().astype(dt),
                          preferred_element_type=jnp.float32 if self.cfg.fp32_head else None)

    # -- training path -------------------------------------------------------------------------
    def __call__(self, tokens, positions=None, segment_ids=None):
        """tokens, positions, segment_ids: [B, T] int. segment_ids == 0 marks padding; tokens
        attend causally (by index) within their own segment, so packed sequences work too."""
        return self.forward(tokens, positions, segment_ids)[0]

    def forward(self, tokens, positions=None, segment_ids=None):
        """(final hidden [B, T, D], RouterStats stacked over MoE layers or None when dense).
        Router statistics count the non-padding tokens (segment_ids > 0)."""
        b, t = tokens.shape
        if positions is None:
            positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
        if segment_ids is None:
            segment_ids = jnp.ones((b, t), jnp.int32)
        idx = jnp.arange(t)
        causal = idx[:, None] >= idx[None, :]
        same = segment_ids[:, :, None] == segment_ids[:, None, :]
        mask = causal[None] & same & (segment_ids[:, None, :] > 0)
        valid = segment_ids > 0
        x = self._embed(tokens)
        stats = []
        for block in self.layers:
            if self.cfg.remat:
                x, st = nnx.remat(lambda blk, h: blk(h, positions, mask, valid=valid)[::2])(
                    block, x)
            else:
                x, _, st = block(x, positions, mask, valid=valid)
            stats.append(st)
        return self.final_norm(x), _stack_stats(stats)

    # -- sampling path -------------------------------------------------------------------------
    def decode(self, tokens, positions, cache: KVCache):
        """tokens, positions: [B, T]; each row's positions are contiguous and its new keys are
        written there. A row attends to cache entries at positions <= its own, so stale entries
        beyond a row's length are never read (prefill padding is overwritten by later steps)."""
        s = cache.k[0].shape[1]
        mask = jnp.arange(s)[None, None, :] <= positions[:, :, None]
        x = self._embed(tokens)
        ks, vs = [], []
        for block, ck, cv in zip(self.layers, cache.k, cache.v):
            x, (ck, cv), _ = block(x, positions, mask, (ck, cv))
            ks.append(ck)
            vs.append(cv)
        return self.final_norm(x), KVCache(tuple(ks), tuple(vs))


def create(cfg: ModelConfig, seed: int = 0) -> Transformer:
    """An unsharded model with random weights (tests, small runs)."""
    return Transformer(cfg, nnx.Rngs(params=seed))


def create_sharded(cfg: ModelConfig, mesh, seed: int = 0):
    """(graphdef, params) with every parameter created directly in its mesh sharding.

    Nothing is materialised unsharded: shapes come from `eval_shape`, then a jitted init with
    `out_shardings` writes each shard on its own device.
    """
    from scalerl_jax import mesh as mesh_lib

    abstract = nnx.eval_shape(lambda: Transformer(cfg, nnx.Rngs(params=seed)))
    graphdef, abstract_state = nnx.split(abstract)
    shardings = mesh_lib.state_shardings(abstract_state, mesh)

    def init():
        return nnx.state(Transformer(cfg, nnx.Rngs(params=seed)))

    return graphdef, jax.jit(init, out_shardings=shardings)()


def forward_logits(graphdef, params, tokens, positions=None, segment_ids=None):
    """Full [B, T, V] logits. For tests and small models; training uses chunked log-probs."""
    model = nnx.merge(graphdef, params)
    return model.logits(model(tokens, positions, segment_ids))


def matmul_params(cfg: ModelConfig) -> int:
    """Parameters used in matmuls per token: all but the embedding gather (a tied table still
    counts once, as the LM head). MoE: only the active ones (router, top-k routed experts,
    shared expert), so FLOPs and MFU count what a token really computes."""
    n = cfg.num_params(active=True)
    return n if cfg.tie_embeddings else n - cfg.vocab_size * cfg.hidden_size


def num_flops_per_token(cfg: ModelConfig, seq_len: int, training: bool = True) -> float:
    """Model FLOPs per token: 2·N (forward) or 6·N (forward+backward) for the matmul weights,
    plus causal attention (scores and weighted sum: 2·2·T·hd·H per token forward, halved by
    causality). Embedding lookups are not matmuls and are excluded."""
    n = matmul_params(cfg)
    attn = 2 * cfg.num_layers * cfg.num_heads * cfg.dim_per_head * seq_len  # causal: half of 4·T
    fwd = 2 * n + attn
    return 3 * fwd if training else fwd
