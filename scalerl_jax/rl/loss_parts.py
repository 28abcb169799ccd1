"""What every objective of `rl.objectives` shares: the token frame around its per-token term.

* `prepare`: shape checks, the aggregation weights, and inputs sanitised to fp32 with zeros at
  tokens that do not count (so NaN/inf there reach neither the loss nor its gradient);
* `log_ratio`: log-ratios clamped to [-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP] before ``exp``;
* `check_tis` / `tis_weight`: the truncated-importance-sampling denominator and capped weight;
* `kl_penalty` and `finish`: the KL and entropy terms and the aggregated
  ``pg_loss + kl_coef * kl - entropy_coef * entropy`` with its metrics.

The objectives themselves (their ratios, clips and caps) live in `rl.objectives`, whose docstring
states the inputs and the TIS convention these functions implement.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from scalerl_jax.rl.aggregation import (
    counted_mask,
    masked_max,
    masked_mean,
    token_weights,
    weighted_sum,
)

KL_ESTIMATORS = ("k1", "k3")
LOG_RATIO_CLAMP = 20.0

sg = jax.lax.stop_gradient


class Batch(NamedTuple):
    logp: jax.Array  # fp32, 0 where not counted
    behaviour_logp: jax.Array
    advantages: jax.Array  # fp32 [N, T], 0 where not counted
    counted: jax.Array  # bool [N, T]
    weights: jax.Array  # aggregation weights [N, T]
    metrics: dict


def f32(x, counted):
    return jnp.where(counted, jnp.asarray(x).astype(jnp.float32), 0.0)


def prepare(
    logp,
    behaviour_logp,
    advantages,
    mask,
    prompt_index,
    num_prompts,
    aggregation,
    max_length,
    weights,
    **optional,
) -> Batch:
    shape = tuple(jnp.shape(logp))
    if len(shape) != 2:
        raise ValueError(f"logp must be [N, T], got shape {shape}")
    for name, x in (
        ("behaviour_logp", behaviour_logp),
        ("mask", mask),
        ("weights", weights),
        *optional.items(),
    ):
        if x is not None and tuple(jnp.shape(x)) != shape:
            raise ValueError(f"{name} must have logp's shape {shape}, got {tuple(jnp.shape(x))}")
    adv_shape = tuple(jnp.shape(advantages))
    if adv_shape not in (shape, shape[:1]):
        raise ValueError(f"advantages must be [N]=({shape[0]},) or [N, T]={shape}, got {adv_shape}")
    agg_weights, metrics = token_weights(
        mask, prompt_index, aggregation=aggregation, num_prompts=num_prompts, max_length=max_length
    )
    counted = counted_mask(mask, prompt_index, num_prompts)
    if weights is None:
        weights = agg_weights
    else:
        # Weights computed over the whole batch and sliced per micro-batch: this call's own
        # normaliser would be the micro-batch's, so it is not reported.
        weights = sg(jnp.where(counted, jnp.asarray(weights).astype(jnp.float32), 0.0))
        del metrics["normaliser"]
    adv = jnp.asarray(advantages).astype(jnp.float32)
    adv = jnp.broadcast_to(adv[:, None] if adv.ndim == 1 else adv, shape)
    # Sanitising every input at uncounted positions keeps NaN out of the backward pass too
    # (0 * inf in a product rule would otherwise leak through the weights).
    return Batch(
        f32(logp, counted),
        f32(behaviour_logp, counted),
        f32(adv, counted),
        counted,
        weights,
        metrics,
    )


def log_ratio(numerator, denominator):
    return jnp.clip(numerator - denominator, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


def kl_penalty(logp: jax.Array, ref_logp: jax.Array, estimator: str = "k3") -> jax.Array:
    """Per-token KL(pi_theta || pi_ref) estimate from samples of pi_theta, in fp32.

    k1 = log pi - log pi_ref; k3 = exp(log pi_ref - log pi) - (log pi_ref - log pi) - 1 (>= 0,
    Schulman's low-variance estimator; GRPO's choice). The difference is clamped like ratios.
    """
    if estimator not in KL_ESTIMATORS:
        raise ValueError(f"kl_estimator={estimator!r}: must be one of {KL_ESTIMATORS}")
    logp = jnp.asarray(logp).astype(jnp.float32)
    ref_logp = jnp.asarray(ref_logp).astype(jnp.float32)
    if estimator == "k1":
        return logp - ref_logp
    d = log_ratio(ref_logp, logp)
    return jnp.exp(d) - d - 1.0


def finish(b: Batch, pg_tok, metrics, *, ref_logp, kl_coef, kl_estimator, entropy, entropy_coef):
    if kl_coef < 0 or entropy_coef < 0:
        raise ValueError(f"kl_coef={kl_coef}, entropy_coef={entropy_coef}: must be >= 0")
    if kl_estimator not in KL_ESTIMATORS:
        raise ValueError(f"kl_estimator={kl_estimator!r}: must be one of {KL_ESTIMATORS}")
    pg_loss = weighted_sum(pg_tok, b.weights)
    loss = pg_loss
    out = dict(b.metrics)
    out.update(metrics)
    out["pg_loss"] = pg_loss
    if ref_logp is not None:
        kl = weighted_sum(kl_penalty(b.logp, f32(ref_logp, b.counted), kl_estimator), b.weights)
        out["kl"] = kl
        if kl_coef:
            loss = loss + kl_coef * kl
    elif kl_coef:
        raise ValueError(f"kl_coef={kl_coef} needs ref_logp [N, T]")
    if entropy is not None:
        ent = weighted_sum(f32(entropy, b.counted), b.weights)
        out["entropy"] = ent
        if entropy_coef:
            loss = loss - entropy_coef * ent
    elif entropy_coef:
        raise ValueError(f"entropy_coef={entropy_coef} needs entropy [N, T]")
    out["loss"] = loss
    return loss, {k: jnp.asarray(v, jnp.float32) for k, v in out.items()}


def ratio_metrics(ratio, counted):
    return {"ratio_mean": masked_mean(ratio, counted), "ratio_max": masked_max(ratio, counted)}


def check_tis(tis_cap, old_logp, who: str):
    if tis_cap is None:
        if old_logp is not None:
            raise ValueError(
                f"old_logp is only used with tis_cap: without it {who} takes its "
                "ratio against behaviour_logp (pass tis_cap to correct the "
                "sampler/trainer mismatch with old_logp)"
            )
    elif not tis_cap > 0:
        raise ValueError(f"tis_cap={tis_cap}: must be > 0")


def tis_weight(b: Batch, old_logp, tis_cap):
    """(denominator of the objective's ratio, TIS weight or None, TIS metrics).

    Without tis_cap the ratio is against the sampler, as in ScaleRL. With it, the ratio is
    against pi_old (old_logp, else the current policy as data) and the mismatch between the
    trainer's pi_old and the sampler moves into a separate capped weight, as verl and MiniMax
    do; the weight is data (stop-gradient), like the log-probs it is made of.
    """
    if tis_cap is None:
        return b.behaviour_logp, None, {}
    old = sg(b.logp if old_logp is None else f32(old_logp, b.counted))
    ratio = jnp.exp(log_ratio(old, b.behaviour_logp))
    metrics = {
        "tis_frac": masked_mean(ratio > tis_cap, b.counted),
        "tis_ratio_mean": masked_mean(ratio, b.counted),
        "tis_ratio_max": masked_max(ratio, b.counted),
    }
    return old, sg(jnp.minimum(ratio, tis_cap)), metrics


def weighted(pg_tok, tis_weight):
    return pg_tok if tis_weight is None else tis_weight * pg_tok
