"""Mixture-of-experts FFN: an fp32 top-k router, routed SwiGLU experts, an optional shared expert.

Dispatch sorts the (token, expert) assignments by expert and runs a grouped matmul
(`jax.lax.ragged_dot` on TPU/GPU, `_blocked_matmul` on CPU, where ragged_dot falls back to a
dense [E, N*k, D] product): O(N k D) whatever the expert count, no capacity and so no dropped
token, and exactly transformers' per-expert result. Expert weights carry the logical axis
`expert`. Router numerics follow transformers (Qwen3-MoE softmax top-k, Llama-4 sigmoid on the
expert input). Why: docs/real-models.md, "Mixture of experts".
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
from flax import nnx

from scalerl_jax.config import ModelConfig
from scalerl_jax.models.layers import MLP, _platform, param


class RouterStats(NamedTuple):
    """One MoE layer's routing of the counted (non-padding) tokens.

    load: [E] fraction of the token->expert assignments each expert received (sums to 1).
    aux_loss: Switch-Transformer load-balancing loss E * sum_e f_e P_e, with f_e the assigned
    fraction of tokens (summing to k) and P_e the mean router probability, as transformers'
    `load_balancing_loss_func` computes it per layer.
    """

    load: jax.Array
    aux_loss: jax.Array


def route(logits: jax.Array, cfg: ModelConfig):
    """fp32 router logits [N, E] -> (top-k weights [N, k], expert ids [N, k], probs [N, E])."""
    probs = jax.nn.softmax(logits, axis=-1)
    if cfg.router == "softmax":
        weights, ids = jax.lax.top_k(probs, cfg.experts_per_token)
        if cfg.norm_topk_prob:
            weights = weights / jnp.sum(weights, axis=-1, keepdims=True)
    else:  # Llama-4: sigmoid of the chosen logits
        top, ids = jax.lax.top_k(logits, cfg.experts_per_token)
        weights = jax.nn.sigmoid(top)
    return weights, ids, probs


def router_stats(probs, ids, valid, num_experts: int) -> RouterStats:
    """probs [N, E], ids [N, k], valid [N] bool (padding excluded) -> RouterStats."""
    w = valid.astype(jnp.float32)
    counted = jnp.maximum(jnp.sum(w), 1.0)
    assigned = (
        jnp.zeros((num_experts,), jnp.float32).at[ids.reshape(-1)].add(jnp.repeat(w, ids.shape[1]))
    )
    frac_tokens = assigned / counted  # sums to k
    mean_prob = jnp.sum(probs * w[:, None], axis=0) / counted
    aux = num_experts * jnp.sum(frac_tokens * mean_prob)
    return RouterStats(assigned / (counted * ids.shape[1]), aux)


def _blocked_matmul(x, w, group_sizes, block: int):
    """ragged_dot(x [M, D], w [E, D, F], group_sizes [E]) with rows padded per group to whole
    blocks of `block` rows; a scan multiplies each block by its one expert's [D, F] weights."""
    m, e = x.shape[0], w.shape[0]
    nb = -(-(m + e * (block - 1)) // block)  # static bound on the blocks any grouping needs
    ends = jnp.cumsum(group_sizes)
    starts = ends - group_sizes
    padded = -(-group_sizes // block) * block
    pends = jnp.cumsum(padded)
    pstarts = pends - padded
    # Padded row p belongs to group g (the first whose padded end exceeds p).
    p = jnp.arange(nb * block)
    g = jnp.minimum(jnp.searchsorted(pends, p, side="right"), e - 1)
    offset = p - pstarts[g]
    real = offset < group_sizes[g]
    xp = jnp.where(real[:, None], x[jnp.clip(starts[g] + offset, 0, m - 1)], 0)
    block_expert = g[::block]

    def one(_, xs):
        xb, ge = xs
        return None, xb @ jax.lax.dynamic_index_in_dim(w, ge, 0, keepdims=False)

    _, out = jax.lax.scan(one, None, (xp.reshape(nb, block, -1), block_expert))
    # Row r of group h sits at padded row pstarts[h] + (r - starts[h]).
    h = jnp.minimum(jnp.searchsorted(ends, jnp.arange(m), side="right"), e - 1)
    return out.reshape(nb * block, -1)[pstarts[h] + jnp.arange(m) - starts[h]]


def grouped_matmul(x, w, group_sizes):
    """Rows of x [M, D] sorted by group times their group's w [E, D, F] -> [M, F]."""
    if _platform() != "cpu":  # see the module docstring: native on TPU and GPU
        return jax.lax.ragged_dot(x, w, group_sizes)
    block = max(8, min(256, x.shape[0] // w.shape[0]) // 8 * 8)
    return _blocked_matmul(x, w, group_sizes, block)


class MoE(nnx.Module):
    """Routed experts (+ shared expert). Weights: router [D, E] fp32-computed; gate/up [E, D, F],
    down [E, F, D] in the [in, out] layout of layers.MLP with a leading expert axis."""

    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
        d, e, f = cfg.hidden_size, cfg.num_experts, cfg.expert_size
        pd = jnp.dtype(cfg.param_dtype)
        self.router = param(rngs, (d, e), ("embed", "router"), pd)
        self.gate = param(rngs, (e, d, f), ("expert", "embed", "mlp"), pd)
        self.up = param(rngs, (e, d, f), ("expert", "embed", "mlp"), pd)
        self.down = param(rngs, (e, f, d), ("expert", "mlp", "embed"), pd)
        if cfg.shared_expert_size:
            self.shared = MLP(cfg, rngs, intermediate_size=cfg.shared_expert_size)
        self.cfg = cfg

    def __call__(self, x, valid: Optional[jax.Array] = None):
        """x: [B, T, D]; valid: [B, T] bool, the tokens router statistics count (None: all).
        Returns (out [B, T, D], RouterStats)."""
        cfg, dt = self.cfg, x.dtype
        b, t, d = x.shape
        k, e = cfg.experts_per_token, cfg.num_experts
        flat = x.reshape(b * t, d)
        logits = jnp.einsum(
            "nd,de->ne", flat.astype(jnp.float32), self.router.get_value().astype(jnp.float32)
        )
        weights, ids, probs = route(logits, cfg)
        valid = jnp.ones((b * t,), bool) if valid is None else valid.reshape(b * t)
        stats = router_stats(probs, ids, valid, e)

        # Sort the N*k assignments by expert: each expert's rows become one contiguous group.
        expert_of = ids.reshape(-1)
        order = jnp.argsort(expert_of, stable=True)
        rows = flat[order // k]  # [N*k, D]
        w = weights.reshape(-1)[order].astype(dt)
        group_sizes = jnp.bincount(expert_of, length=e).astype(jnp.int32)
        if cfg.router == "sigmoid":
            rows = rows * w[:, None]
        gate = grouped_matmul(rows, self.gate.get_value().astype(dt), group_sizes)
        up = grouped_matmul(rows, self.up.get_value().astype(dt), group_sizes)
        out = grouped_matmul(jax.nn.silu(gate) * up, self.down.get_value().astype(dt), group_sizes)
        if cfg.router == "softmax":
            out = out * w[:, None]
        # Un-sort with the inverse permutation (a gather, whose gradient is a scatter of the
        # same size), then sum each token's k expert outputs.
        out = out[jnp.argsort(order)].reshape(b * t, k, d).sum(axis=1)
        if cfg.shared_expert_size:
            out = out + self.shared(flat)
        return out.reshape(b, t, d).astype(dt), stats
