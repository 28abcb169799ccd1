"""AdamW from `OptimConfig`: the learning-rate schedule, the weight-decay mask and clipping.

Paper (ScaleRL): constant 5e-7 after 100 warm-up steps, eps 1e-15, weight decay 0.01; betas
and clipping are not stated (OptimConfig's defaults are common choices).

Weight decay applies to matrices only: the embedding table, LM head, attention q/k/v/o kernels
and MLP kernels. RMSNorm scales and q/k/v biases are not decayed (HF Trainer's default too).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from scalerl_jax.config import OptimConfig


def learning_rate(cfg: OptimConfig):
    """Schedule `count -> lr` (count = optimizer updates applied so far, starting at 0).

    Linear warm-up that reaches the peak on update `warmup_steps - 1` (the first update already
    moves: lr/warmup, not 0), then constant or cosine decay to 0 at `total_steps`.
    """
    peak, warm = cfg.learning_rate, cfg.warmup_steps

    def schedule(count):
        count = jnp.asarray(count, jnp.float32)
        lr = jnp.float32(peak)
        if warm > 0:
            lr = lr * jnp.minimum(1.0, (count + 1.0) / warm)
        if cfg.schedule == "cosine":
            span = max(cfg.total_steps - warm, 1)
            frac = jnp.clip((count - warm) / span, 0.0, 1.0)
            lr = jnp.where(count < warm, lr, peak * 0.5 * (1.0 + jnp.cos(jnp.pi * frac)))
        return lr

    return schedule


def decay_mask(params):
    """True for parameters that get weight decay.

    A leaf is a matrix when it has >= 2 dims (not counting the leading axis of the stacked
    `layers`) and is not a bias: biases are the q/k/v_bias parameters ([heads, head_dim], 2-D
    because of the head axis), recognised by a path entry whose name ends in "bias".
    """

    def is_matrix(path, x):
        names = [getattr(k, "key", getattr(k, "name", None)) for k in path]
        is_bias = any(isinstance(n, str) and n.endswith("bias") for n in names)
        return jnp.ndim(x) - ("layers" in names) >= 2 and not is_bias

    return jax.tree_util.tree_map_with_path(is_matrix, params)


def make_optimizer(cfg: OptimConfig) -> optax.GradientTransformation:
    """AdamW (+ global-norm clipping when `max_grad_norm` is set) with `learning_rate(cfg)`."""
    adamw = optax.adamw(
        learning_rate(cfg),
        b1=cfg.b1,
        b2=cfg.b2,
        eps=cfg.eps,
        weight_decay=cfg.weight_decay,
        mask=decay_mask,
    )
    if cfg.max_grad_norm is None:
        return adamw
    return optax.chain(optax.clip_by_global_norm(cfg.max_grad_norm), adamw)
