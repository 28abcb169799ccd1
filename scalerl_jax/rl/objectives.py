"""Policy-gradient objectives for LLMs: CISPO (ScaleRL), PPO-clip (GRPO, DAPO), GSPO, REINFORCE+TIS.

Pure functions of arrays with static Python hyper-parameters, returning ``(loss, metrics)``:
``loss`` an fp32 scalar to minimise, ``metrics`` a dict of fp32 scalars. Inputs are [N rows, T
positions]: ``logp`` (differentiable), ``behaviour_logp`` (the sampler's), ``advantages`` ([N]
or [N, T]), ``mask`` (policy-sampled tokens), ``prompt_index`` with a static ``num_prompts``.
Each objective is a per-token term registered with ``@objective(name)`` (``rl/registry.py``);
the PPO-clip family is ``rl/ppo_clip.py``. Semantics, TIS and metrics: docs/losses.md.
"""

from __future__ import annotations

import inspect
from typing import Optional

import jax.numpy as jnp

from scalerl_jax.rl.aggregation import masked_mean
from scalerl_jax.rl.hparams import (
    HPARAM_NAMES,
    OBJECTIVE_HPARAMS,
    OBJECTIVES,
    SPECIFIC_HPARAMS,
    check_objective,
    describe_unused,
    unused_hparams,
)
from scalerl_jax.rl.loss_parts import (
    KL_ESTIMATORS,
    kl_penalty,
    log_ratio,
    ratio_metrics,
    sg,
    tis_weight,
    weighted,
)
from scalerl_jax.rl.registry import LOSSES, objective
from scalerl_jax.rl.ppo_clip import (
    check_clip,
    clipped_surrogate,
    dapo_loss,
    grpo_loss,
    ppo_clip_loss,
)

__all__ = [
    "HPARAM_NAMES",
    "KL_ESTIMATORS",
    "OBJECTIVES",
    "OBJECTIVE_HPARAMS",
    "cispo_loss",
    "dapo_loss",
    "grpo_loss",
    "gspo_loss",
    "kl_penalty",
    "policy_loss",
    "ppo_clip_loss",
    "tis_loss",
]


@objective("cispo")
def cispo_loss(
    b, old_logp, *, ratio_cap: float = 4.0, ratio_floor: Optional[float] = None, tis_cap=None
):
    """CISPO (MiniMax-M1; ScaleRL's loss), per token ``-sg(w) * A * logp``.

    ``w = min(rho, ratio_cap)``, or ``clip(rho, ratio_floor, ratio_cap)`` with a floor, and
    ``rho = pi_theta / pi_behaviour`` in fp32; ``ratio_cap`` is an ABSOLUTE cap on rho (ScaleRL's
    eps_max, TRL's ``epsilon_high`` for cispo), not an offset from 1 as in verl/slime's
    ``clip(rho, 1 - lo, 1 + hi)``. ``ratio_floor`` (default none, as in the paper) is absolute too.
    The gradient w.r.t. logp is ``-sg(w) * A * W`` with W the aggregation weights: every token
    keeps its gradient, only its weight is capped. With ``tis_cap`` (docs/losses.md)
    rho is ``pi_theta / pi_old`` and the term is multiplied by the TIS weight.

    Metrics: ``cap_frac`` (rho > ratio_cap), ``floor_frac`` (rho < ratio_floor; 0 without floor).
    """
    if not ratio_cap > 0:
        raise ValueError(f"ratio_cap={ratio_cap}: must be > 0 (absolute cap on rho)")
    if ratio_floor is not None and not 0 <= ratio_floor < ratio_cap:
        raise ValueError(f"ratio_floor={ratio_floor}: must be in [0, ratio_cap={ratio_cap})")
    denominator, tis_w, metrics = tis_weight(b, old_logp, tis_cap)
    rho = jnp.exp(log_ratio(sg(b.logp), denominator))
    w = jnp.minimum(rho, ratio_cap)
    metrics.update(ratio_metrics(rho, b.counted))
    metrics["cap_frac"] = masked_mean(rho > ratio_cap, b.counted)
    if ratio_floor is not None:
        w = jnp.maximum(w, ratio_floor)
        metrics["floor_frac"] = masked_mean(rho < ratio_floor, b.counted)
    else:
        metrics["floor_frac"] = jnp.float32(0.0)
    return weighted(-sg(w) * b.advantages * b.logp, tis_w), metrics


@objective("gspo")
def gspo_loss(
    b, old_logp, *, gspo_eps_low: float = 3e-3, gspo_eps_high: float = 4e-3, tis_cap=None
):
    """GSPO: PPO-clip on the sequence ratio ``s_i = exp(mean_t(logp - behaviour_logp))``.

    Implemented in the GSPO paper's token form (GSPO-token): per token
    ``s_it = sg(s_i) * pi_theta(y_it) / sg(pi_theta(y_it))`` (value s_i, gradient
    s_i * grad logp_it) and the per-token loss
    ``max(-s_it*A_it, -clip(s_it, 1 - gspo_eps_low, 1 + gspo_eps_high)*A_it)``.
    With per-row advantages this has the same value and gradient as the sequence form (the loss
    min(s_i A_i, clip(s_i) A_i) broadcast to every token of row i, as TRL's
    importance_sampling_level='sequence' does) under every aggregation mode, because each mode
    weights all tokens of a row equally; with aggregation='sequence' it is the GSPO paper's
    objective (mean over sequences). Per-token advantages are allowed (GSPO-token proper).
    The sequence mean is over counted tokens; its log is clamped to [-20, 20]. The clip range
    has its own names (``gspo_eps_*``, not ``clip_eps_*``): sequence ratios live within ~1e-3 of
    1, token ratios do not, so one setting cannot serve both. With ``tis_cap`` (docs/losses.md)
    s_i is taken against pi_old and each token's term gets its TIS weight.

    Metrics: ``ratio_mean``/``ratio_max`` are of s_i over counted tokens; clip fractions as PPO's.
    """
    check_clip("gspo_eps_low", gspo_eps_low, "gspo_eps_high", gspo_eps_high, None)
    denominator, tis_w, metrics = tis_weight(b, old_logp, tis_cap)
    n = jnp.maximum(b.counted.sum(axis=1), 1).astype(jnp.float32)
    seq_log_ratio = log_ratio(jnp.sum(b.logp - denominator, axis=1) / n, 0.0)
    s = jnp.exp(sg(seq_log_ratio)[:, None] + b.logp - sg(b.logp))
    pg_tok, clip_metrics = clipped_surrogate(
        s, b.advantages, b.counted, gspo_eps_low, gspo_eps_high, None
    )
    del clip_metrics["dual_clip_frac"]
    metrics.update(clip_metrics)
    metrics.update(ratio_metrics(s, b.counted))
    return weighted(pg_tok, tis_w), metrics


@objective("tis")
def tis_loss(b, old_logp, *, tis_cap: float = 5.0):
    """REINFORCE with truncated importance sampling: per token ``-w * A * logp``,
    ``w = sg(min(pi_old / pi_behaviour, tis_cap))`` (Yao et al. 2025; PipelineRL caps at 5).

    pi_old is the trainer's policy at the parameters that sampled the batch (see the module
    docstring for which log-probs go where). ``old_logp=None`` uses the current policy,
    ``sg(logp)``: exact when the batch was sampled by the parameters being updated, and
    otherwise (a sampler that lags, as in PipelineRL and this repository's train step) w
    corrects the lag as well as the mismatch, as PipelineRL uses it. The loss then equals
    `cispo_loss` with ``ratio_cap=tis_cap`` (value and gradient) and has the gradient of any
    objective with ``tis_cap`` and ``old_logp=None``. Pass ``old_logp`` (trainer log-probs
    recomputed before the first of several updates on one batch) to keep w fixed across those
    updates.

    Metrics: ``tis_frac`` (pi_old/pi_behaviour > tis_cap); ratio metrics are of that ratio.
    """
    if tis_cap is None:
        raise ValueError("tis_cap=None: objective='tis' needs a cap (> 0; PipelineRL uses 5)")
    _, w, tis_metrics = tis_weight(b, old_logp, tis_cap)
    metrics = {
        "ratio_mean": tis_metrics["tis_ratio_mean"],
        "ratio_max": tis_metrics["tis_ratio_max"],
        "tis_frac": tis_metrics["tis_frac"],
    }
    return -w * b.advantages * b.logp, metrics


def policy_loss(
    objective: str,
    logp,
    behaviour_logp,
    advantages,
    mask,
    prompt_index=None,
    *,
    aggregation: str,
    num_prompts: Optional[int] = None,
    max_length: Optional[int] = None,
    weights=None,
    old_logp=None,
    ref_logp=None,
    kl_coef: float = 0.0,
    kl_estimator: str = "k3",
    entropy=None,
    entropy_coef: float = 0.0,
    **hparams,
):
    """Dispatch to one registered objective by name; keyword names equal LossConfig's fields and
    the per-objective functions' (`cispo_loss`, ...).

    ``objective`` in `OBJECTIVES`. The objective-specific keywords (`SPECIFIC_HPARAMS`) default
    to None, meaning "not set: the objective's own default" (so ``policy_loss("dapo")``
    is ``dapo_loss()``: clip 0.2 / 0.28). Setting one that the objective does not read
    (``OBJECTIVE_HPARAMS[objective]``) raises ValueError naming the setting and the objective:
    e.g. GSPO's clip range is ``gspo_eps_low/high``, so ``clip_eps_low`` with 'gspo' is an
    error, never a silent default. ``tis_cap`` is read by every objective (see the module
    docstring; for 'tis' None means 5.0), ``old_logp`` only together with it. 'grpo' is the
    symmetric clip and rejects clip_eps_high != clip_eps_low (use 'dapo'). Mark everything
    but the arrays static under jit, e.g.
    ``jax.jit(policy_loss, static_argnums=0, static_argnames=HPARAM_NAMES + ("num_prompts",))``.
    """
    check_objective(objective)
    unknown = sorted(set(hparams) - set(SPECIFIC_HPARAMS))
    if unknown:
        raise TypeError(f"policy_loss() got unexpected keyword(s) {unknown}")
    given = {k: v for k, v in hparams.items() if v is not None}
    unused = unused_hparams(objective, given)
    if unused:
        raise ValueError(
            "policy_loss: " + describe_unused(objective, {k: given[k] for k in unused})
        )
    return LOSSES[objective](
        logp,
        behaviour_logp,
        advantages,
        mask,
        prompt_index,
        aggregation=aggregation,
        num_prompts=num_prompts,
        max_length=max_length,
        weights=weights,
        old_logp=old_logp,
        ref_logp=ref_logp,
        kl_coef=kl_coef,
        kl_estimator=kl_estimator,
        entropy=entropy,
        entropy_coef=entropy_coef,
        **given,
    )


def _list_hparams(fn):
    """Show every objective-specific keyword (default None: not set) in `fn`'s signature."""
    params = [p for p in inspect.signature(fn).parameters.values() if p.kind is not p.VAR_KEYWORD]
    at = [p.name for p in params].index("old_logp")
    specific = [
        inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=None) for n in SPECIFIC_HPARAMS
    ]
    fn.__signature__ = inspect.Signature(params[:at] + specific + params[at:])
    return fn


policy_loss = _list_hparams(policy_loss)
