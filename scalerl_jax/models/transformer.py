"""The decoder policy: Llama-3.x, Qwen2.5 and Qwen3 models, dense or mixture-of-experts (Qwen3-MoE,
Llama-4 routed + shared experts; models/moe.py), in one Flax NNX module. Llama-4's attention
(NoPE layers, chunked local attention, L2 qk-norm, temperature tuning) is config fields: the
masks are built here, the rest is in layers.Attention.

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
from scalerl_jax.models.layers import ATTN_OUT, MLP, Attention, RMSNorm, dense, param
from scalerl_jax.models.moe import MoE, RouterStats


class KVCache(NamedTuple):
    """Keys [L, B, KV, head_dim, S] and values [L, B, KV, S, head_dim], stacked over the layers
    (logical axes KEY_AXES, VALUE_AXES) so the decode scan carries them. Per layer each is
    stored the way the decode step's dots read it, per slot and KV head: the scores are
    [G, hd] x [hd, S] and the weighted sum [G, S] x [S, hd], both with the contracted axis
    second-minor. Keys stored [S, hd] made XLA:CPU repack every key window on every step (the
    scores took ~4x the time of the weighted sum), and the sequence axis anywhere but next to
    head_dim made XLA transpose the whole cache each step."""

    k: jax.Array
    v: jax.Array


KEY_AXES = ("layers", "cache_batch", "kv_heads", "head_dim", "cache_seq")
VALUE_AXES = ("layers", "cache_batch", "kv_heads", "cache_seq", "head_dim")
KEY_SEQ_AXIS, VALUE_SEQ_AXIS = KEY_AXES.index("cache_seq"), VALUE_AXES.index("cache_seq")


def cache_shapes(cfg: ModelConfig, batch: int, length: int) -> tuple[tuple, tuple]:
    """(key shape, value shape) of the stacked cache."""
    n, kv, hd = cfg.num_layers, cfg.num_kv_heads, cfg.dim_per_head
    return (n, batch, kv, hd, length), (n, batch, kv, length, hd)


def init_cache(cfg: ModelConfig, batch: int, length: int, dtype=None) -> KVCache:
    dtype = jnp.dtype(dtype or cfg.compute_dtype)
    kshape, vshape = cache_shapes(cfg, batch, length)
    return KVCache(jnp.zeros(kshape, dtype), jnp.zeros(vshape, dtype))


def layer_kind(cfg: ModelConfig, i: int) -> tuple[bool, bool, bool]:
    """What makes layer i's program differ from another's: (MoE FFN, RoPE, chunked local)."""
    return cfg.is_moe_layer(i), cfg.uses_rope(i), cfg.is_local_attention_layer(i)


def layer_period(cfg: ModelConfig) -> int:
    """The smallest P dividing num_layers with layer_kind(i) == layer_kind(i % P) for all i:
    the layers are scanned in num_layers / P groups of P (1 for a dense Llama/Qwen; num_layers,
    a single unrolled group, when no period repeats)."""
    n = cfg.num_layers
    kinds = [layer_kind(cfg, i) for i in range(n)]
    return next(
        p for p in range(1, n + 1) if n % p == 0 and all(kinds[i] == kinds[i % p] for i in range(n))
    )


def layer_position(cfg: ModelConfig, i: int) -> tuple[int, int]:
    """Layer i's place in the stacked params: (j, g), its weights are ("layers", j, ...)[g]."""
    p = layer_period(cfg)
    return i % p, i // p


class Block(nnx.Module):
    """Pre-norm decoder layer; its FFN is the dense MLP or, on MoE layers
    (`cfg.is_moe_layer(index)`), the routed experts."""

    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs, index: int = 0):
        pd = jnp.dtype(cfg.param_dtype)
        self.attn_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, pd, rngs)
        self.attn = Attention(cfg, rngs, index)
        self.local_attention = cfg.is_local_attention_layer(index)  # takes the chunked mask
        self.mlp_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, pd, rngs)
        self.is_moe = cfg.is_moe_layer(index)
        self.mlp = MoE(cfg, rngs) if self.is_moe else MLP(cfg, rngs)

    def __call__(self, x, positions, mask, cache=None, valid=None, segment_ids=None, layer=None):
        """Returns (x, cache, RouterStats or None). `valid` [B, T]: tokens router stats count.
        `segment_ids`, `cache`, `layer`: see Attention.__call__."""
        h, cache = self.attn(
            self.attn_norm(x), positions, mask, cache, segment_ids=segment_ids, layer=layer
        )
        x = x + h
        if self.is_moe:
            out, stats = self.mlp(self.mlp_norm(x), valid)
            return x + out, cache, stats
        return x + self.mlp(self.mlp_norm(x)), cache, None


def _local_mask(cfg: ModelConfig, mask, q_positions, k_positions):
    """`mask` [B, T, S] narrowed to Llama-4's chunked local attention: a query sees only keys
    whose position lies in its own chunk of `local_attention_chunk` positions (None when no
    layer is local). Positions, not indices, so packed segments and left padding chunk from
    each sequence's start, as transformers does."""
    c = cfg.local_attention_chunk
    if not any(cfg.is_local_attention_layer(i) for i in range(cfg.num_layers)):
        return None
    return mask & (q_positions[:, :, None] // c == k_positions[:, None, :] // c)


def remat_policy(name: str):
    """ModelConfig.remat_policy -> a jax.checkpoint policy (None: save nothing but the block's
    input, jax's default)."""
    policies = jax.checkpoint_policies
    return {
        "full": None,
        "dots": policies.checkpoint_dots,
        "dots_no_batch": policies.dots_with_no_batch_dims_saveable,
        "attn_out": policies.save_only_these_names(ATTN_OUT),
    }[name]


def _stacked_blocks(cfg: ModelConfig, rngs: nnx.Rngs, j: int, n: int) -> Block:
    """The n blocks at position j of every period (layers j, j + P, ...) as one Block whose
    params carry a leading "layers" axis. One block's init is vmapped over n keys, so an
    init program's size does not grow with depth."""
    keys = jax.random.split(rngs.params(), n)
    graphdef = nnx.graphdef(nnx.eval_shape(lambda: Block(cfg, nnx.Rngs(params=0), j)))
    state = jax.vmap(lambda key: nnx.state(Block(cfg, nnx.Rngs(params=key), j)))(keys)
    for var in jax.tree.leaves(state, is_leaf=lambda x: isinstance(x, nnx.Variable)):
        var.set_metadata("logical_axes", ("layers", *var.get_metadata()["logical_axes"]))
    return nnx.merge(graphdef, state)


def _in_layer_order(stats: list) -> Optional[RouterStats]:
    """RouterStats of the scan ([groups, ...] per position j of a period, None: dense) -> one
    RouterStats over the MoE layers in layer order (None: no MoE layer)."""
    moe = [s for s in stats if s is not None]
    if not moe:
        return None
    return RouterStats(*(jnp.stack(x, axis=1).reshape(-1, *x[0].shape[1:]) for x in zip(*moe)))


class Transformer(nnx.Module):
    """The decoder. Layer i's weights are row i // P of the stacked Block `layers[i % P]`
    (P = layer_period(cfg)); both paths scan over the num_layers / P groups."""

    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
        pd = jnp.dtype(cfg.param_dtype)
        self.cfg = cfg
        self.embed = param(rngs, (cfg.vocab_size, cfg.hidden_size), ("vocab", "embed"), pd)
        p = layer_period(cfg)
        self.period = p
        self.layers = nnx.List(
            [_stacked_blocks(cfg, rngs, j, cfg.num_layers // p) for j in range(p)]
        )
        self.final_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, pd, rngs)
        if not cfg.tie_embeddings:
            self.lm_head = param(rngs, (cfg.hidden_size, cfg.vocab_size), ("embed", "vocab"), pd)

    def _scan(self, apply, carry):
        """Run the layers: `apply(graphdef, state, layer, carry) -> (carry, out)` for each layer
        in order (nnx.merge(graphdef, state) is its Block, `layer` its index, a traced int) in a
        scan over the groups. Returns (carry, [per position j: outs stacked over the groups])."""
        split = [nnx.split(blk) for blk in self.layers]
        p = self.period

        def group(carry, xs):
            g, states = xs
            outs = []
            for j, ((graphdef, _), st) in enumerate(zip(split, states)):
                carry, out = apply(graphdef, st, g * p + j, carry)
                outs.append(out)
            return carry, outs

        n = self.cfg.num_layers // p
        xs = (jnp.arange(n, dtype=jnp.int32), [st for _, st in split])
        return jax.lax.scan(group, carry, xs, unroll=1 if self.cfg.scan_layers else max(n, 1))

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
        return dense(
            hidden.astype(dt),
            self.head_kernel().astype(dt),
            preferred_element_type=jnp.float32 if self.cfg.fp32_head else None,
        )

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
        local = _local_mask(self.cfg, mask, positions, positions)
        valid = segment_ids > 0
        x = self._embed(tokens)
        policy = remat_policy(self.cfg.remat_policy)

        def apply(graphdef, state, layer, x):
            blk = nnx.merge(graphdef, state)
            m = local if blk.local_attention else mask
            # Fused attention kernels rebuild the causal-within-segment mask from the ids; the
            # chunked local mask is not that one, so local layers keep the dense mask (XLA).
            seg = None if blk.local_attention else segment_ids

            def run(state, x):
                out, _, st = nnx.merge(graphdef, state)(
                    x, positions, m, valid=valid, segment_ids=seg
                )
                return out, st

            if self.cfg.remat:
                run = jax.checkpoint(run, policy=policy)
            return run(state, x)

        x, stats = self._scan(apply, x)
        return self.final_norm(x), _in_layer_order(stats)

    # -- sampling path -------------------------------------------------------------------------
    def decode(self, tokens, positions, cache: KVCache, window: Optional[int] = None):
        """tokens, positions: [B, T]; each row's positions are contiguous and its new keys are
        written there. A row attends to cache entries at positions <= its own, so stale entries
        beyond a row's length are never read (prefill padding is overwritten by later steps).
        window: attend over only the first `window` cache entries (the caller promises every row's
        positions are below it): the cost of a step then follows the filled length, not S."""
        length = cache.v.shape[VALUE_SEQ_AXIS]
        s = length if window is None else min(int(window), length)
        slots = jnp.arange(s, dtype=positions.dtype)[None]  # cache slot j holds position j
        mask = slots[:, None, :] <= positions[:, :, None]
        local = _local_mask(self.cfg, mask, positions, slots)

        def apply(graphdef, state, layer, carry):
            x, kv = carry
            blk = nnx.merge(graphdef, state)
            m = local if blk.local_attention else mask
            x, kv, _ = blk(x, positions, m, kv, layer=layer)
            return (x, kv), None

        (x, (k, v)), _ = self._scan(apply, (self._embed(tokens), (cache.k, cache.v)))
        return self.final_norm(x), KVCache(k, v)


def layer_params(params, cfg: ModelConfig, i: int):
    """Layer i's params (a State of one layer's arrays) cut out of the stacked ones."""
    j, g = layer_position(cfg, i)
    return jax.tree.map(lambda x: x[g], params["layers"][j])


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
