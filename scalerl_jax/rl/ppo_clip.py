"""The PPO-clip family: PPO-clip itself and its two named settings, GRPO (symmetric clip) and DAPO
(clip-higher), plus the clipped surrogate GSPO shares. Same inputs, TIS and aggregation as every
objective (docs/losses.md; the shared frame is `rl/loss_parts.py`); imported from
`scalerl_jax.rl.objectives` like the others."""

from __future__ import annotations

from typing import Optional

import jax.numpy as jnp

from scalerl_jax.rl.aggregation import masked_mean
from scalerl_jax.rl.loss_parts import log_ratio, ratio_metrics, tis_weight, weighted
from scalerl_jax.rl.registry import make_loss, objective


def clipped_surrogate(ratio, adv, counted, eps_low, eps_high, dual_clip):
    """PPO's pessimistic per-token loss max(-rho*A, -clip(rho, 1-lo, 1+hi)*A) (+ dual clip)."""
    unclipped = -adv * ratio
    clipped = -adv * jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high)
    loss = jnp.maximum(unclipped, clipped)
    low = (ratio < 1.0 - eps_low) & (adv < 0)
    high = (ratio > 1.0 + eps_high) & (adv > 0)
    metrics = {
        "clip_frac_low": masked_mean(low, counted),
        "clip_frac_high": masked_mean(high, counted),
        "clip_frac": masked_mean(low | high, counted),
    }
    if dual_clip is not None:
        # Dual clip (Ye et al. 2020; verl's clip_ratio_c): for A < 0 the loss is also bounded by
        # -c*A, so a huge ratio on a bad token cannot blow up the update.
        bound = -adv * dual_clip
        dual = (adv < 0) & (bound < loss)
        loss = jnp.where(dual, bound, loss)
        metrics["dual_clip_frac"] = masked_mean(dual, counted)
    else:
        metrics["dual_clip_frac"] = jnp.float32(0.0)
    return loss, metrics


def check_clip(name_low, low, name_high, high, dual_clip):
    if not 0 <= low < 1:
        raise ValueError(f"{name_low}={low}: must be in [0, 1)")
    if not high >= 0:
        raise ValueError(f"{name_high}={high}: must be >= 0")
    if dual_clip is not None and not dual_clip > 1:
        raise ValueError(f"dual_clip={dual_clip}: must be > 1")


def _ppo_clip(
    b, old_logp, *, clip_eps_low: float, clip_eps_high: float, dual_clip: Optional[float], tis_cap
):
    """PPO-clip per token: ``max(-rho*A, -clip(rho, 1 - clip_eps_low, 1 + clip_eps_high)*A)``.

    The eps are offsets from 1 (verl's clip_ratio_low/high, TRL's epsilon/epsilon_high). With
    ``dual_clip=c`` (> 1) tokens with A < 0 are further bounded: ``min(that, -c*A)`` (verl).
    With ``tis_cap`` (docs/losses.md) rho is ``pi_theta / pi_old`` and the clipped
    term is multiplied by the TIS weight (verl applies it after the dual clip too).
    Metrics: ``clip_frac_low`` (rho < 1-lo and A < 0), ``clip_frac_high`` (rho > 1+hi and A > 0),
    ``clip_frac`` (either: tokens whose gradient clipping zeroed), ``dual_clip_frac``.
    """
    check_clip("clip_eps_low", clip_eps_low, "clip_eps_high", clip_eps_high, dual_clip)
    denominator, tis_w, metrics = tis_weight(b, old_logp, tis_cap)
    rho = jnp.exp(log_ratio(b.logp, denominator))
    pg_tok, clip_metrics = clipped_surrogate(
        rho, b.advantages, b.counted, clip_eps_low, clip_eps_high, dual_clip
    )
    metrics.update(clip_metrics)
    metrics.update(ratio_metrics(rho, b.counted))
    return weighted(pg_tok, tis_w), metrics


def _ppo_clip_term(
    b,
    old_logp,
    *,
    clip_eps_low: float = 0.2,
    clip_eps_high: float = 0.2,
    dual_clip: Optional[float] = None,
    tis_cap: Optional[float] = None,
):
    return _ppo_clip(
        b,
        old_logp,
        clip_eps_low=clip_eps_low,
        clip_eps_high=clip_eps_high,
        dual_clip=dual_clip,
        tis_cap=tis_cap,
    )


_ppo_clip_term.__doc__ = _ppo_clip.__doc__
ppo_clip_loss = make_loss("ppo_clip", _ppo_clip_term)


@objective("grpo")
def grpo_loss(
    b,
    old_logp,
    *,
    clip_eps_low: float = 0.2,
    clip_eps_high: Optional[float] = None,
    dual_clip: Optional[float] = None,
    tis_cap: Optional[float] = None,
):
    """GRPO (DeepSeekMath): symmetric PPO-clip, ``clip(rho, 1 - clip_eps_low, 1 + clip_eps_low)``;
    the paper aggregates by 'sequence' and uses k3 KL. ``clip_eps_high`` is None (symmetric) or
    must equal ``clip_eps_low``; an asymmetric clip is `dapo_loss`. See `ppo_clip_loss`."""
    if clip_eps_high is not None and clip_eps_high != clip_eps_low:
        raise ValueError(
            f"objective='grpo' clips symmetrically but clip_eps_low={clip_eps_low} "
            f"!= clip_eps_high={clip_eps_high}; use 'dapo'"
        )
    return _ppo_clip(
        b,
        old_logp,
        clip_eps_low=clip_eps_low,
        clip_eps_high=clip_eps_low,
        dual_clip=dual_clip,
        tis_cap=tis_cap,
    )


@objective("dapo")
def dapo_loss(
    b,
    old_logp,
    *,
    clip_eps_low: float = 0.2,
    clip_eps_high: float = 0.28,
    dual_clip: Optional[float] = None,
    tis_cap: Optional[float] = None,
):
    """DAPO clip-higher: PPO-clip with eps_low 0.2, eps_high 0.28 (ScaleRL's DAPO baseline: 0.26);
    DAPO aggregates by 'token'. See `ppo_clip_loss`."""
    return _ppo_clip(
        b,
        old_logp,
        clip_eps_low=clip_eps_low,
        clip_eps_high=clip_eps_high,
        dual_clip=dual_clip,
        tis_cap=tis_cap,
    )
