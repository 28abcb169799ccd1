"""Policy-gradient objectives for LLMs: CISPO (ScaleRL), PPO-clip (GRPO, DAPO), GSPO, REINFORCE+TIS.

All are pure functions of arrays with static Python hyper-parameters. They return
``(loss, metrics)``: ``loss`` is an fp32 scalar to MINIMISE, ``metrics`` a dict of fp32 scalars.

Inputs (N rows = sequences, T positions):

* ``logp`` [N, T]: trainer log-probs of the taken tokens (differentiable; any float dtype).
* ``behaviour_logp`` [N, T]: log-probs under the policy that sampled the tokens (the sampler), as
  data. Without ``tis_cap`` every ratio here is ``rho = exp(logp - behaviour_logp)``, computed in
  fp32. This is ScaleRL's pi_gen; for a classic PPO ratio against a recomputed pi_old (and no
  mismatch correction), pass those log-probs here.
* ``advantages`` [N] (one per row, broadcast over T) or [N, T] (per token).
* ``mask`` [N, T]: non-zero for policy-sampled completion tokens; 0 for prompt, padding and
  forced (interruption) tokens. Treated as boolean.
* ``prompt_index`` [N] int (optional except for aggregation='prompt'), with static
  ``num_prompts``: rows outside [0, num_prompts) never count (so -1 can mark padding rows).
* Optional ``ref_logp`` [N, T] (KL to a reference) and ``entropy`` [N, T] (per-token entropy of
  the trainer policy, differentiable).
* Optional ``old_logp`` [N, T], with ``tis_cap`` only (see below).

Truncated importance sampling (TIS) for sampler/trainer mismatch, on any objective (MiniMax-M1,
verl's rollout IS, Yao et al. 2025). Three log-probs of the same tokens are involved:

* ``logp``: the trainer's current policy pi_theta (differentiable);
* ``old_logp``: the TRAINER's log-probs under the parameters version that sampled the batch
  (pi_old; recomputed by the trainer before updating, used as data: stop-gradient). ``None``
  means pi_old is pi_theta, i.e. ``sg(logp)``: exact whenever a batch gets one optimiser step
  from the parameters that sampled it; with a lagging sampler the weight then also covers the
  lag (the train step's case, see ``train/step.py``);
* ``behaviour_logp``: the SAMPLER's log-probs of the same version (its kernels, dtype, ...).

With ``tis_cap=C`` the objective's own ratio is taken against pi_old, ``exp(logp - old_logp)``,
and every token's loss is multiplied by ``sg(min(exp(old_logp - behaviour_logp), C))``. Without
``tis_cap`` no such weight exists and ``old_logp`` is refused. With ``old_logp=None`` the
objective's ratio is 1 in value (gradient that of logp), so no clip or cap can bind and every
objective has the gradient of `tis_loss` with the same cap (CISPO when ratio_floor <= 1 <=
ratio_cap, and then its value too; the PPO-style values are surrogates, -w*A per token).
Metrics with TIS: ``tis_frac`` (tokens whose pi_old/pi_behaviour exceeds the cap),
``tis_ratio_mean`` / ``tis_ratio_max`` (of that ratio).

Settings an objective does not read are refused, not ignored: `policy_loss` raises for any
objective-specific keyword given (not None) that its objective does not use
(``rl.hparams.OBJECTIVE_HPARAMS``), and each objective's function takes only its own keywords.

The objective's per-token term is aggregated with `aggregation` (see ``rl/aggregation.py``:
token / sequence / prompt / constant). With gradient accumulation, compute
``token_weights(...)`` once over the WHOLE batch and pass each micro-batch its slice as
``weights=`` (the aggregation arguments are then only used for the count metrics, and
``normaliser`` is not reported): the micro-batch losses then sum to the full-batch loss, whereas
per-micro-batch normalisers would not (prompt and token modes normalise across rows).

Tokens that do not count never influence the loss or its gradient, even when their inputs are
NaN or inf; an all-masked batch gives loss 0.0.
``total = pg_loss + kl_coef * kl - entropy_coef * entropy``, all three aggregated the same way.

Log-ratios are clamped to [-20, 20] before ``exp`` (as verl does) so that ratios stay finite; this
only matters for ``|log rho|`` > 20, where the clamped ratio has zero gradient.

Common metrics: ``tokens``, ``sequences``, ``prompts`` (when prompt_index is given),
``normaliser`` (aggregation divisor), ``pg_loss``, ``ratio_mean`` / ``ratio_max`` (token mean /
max over counted tokens of the ratio the objective uses), ``kl`` / ``entropy`` when given
(aggregated like the loss), plus the objective's clip/cap fractions (token fractions).

This module holds CISPO, GSPO, REINFORCE+TIS and the `policy_loss` dispatch; the PPO-clip family
(PPO-clip, GRPO, DAPO, and the clipped surrogate GSPO reuses) is ``rl/ppo_clip.py``, re-exported
here. Each objective is its per-token term registered with ``@objective(name)``
(``rl/registry.py``), which wraps it once in the frame every objective shares (input checks and
sanitising, KL/entropy terms, aggregation: ``rl/loss_parts.py``). A new objective is one such
function plus its row of ``rl.hparams.OBJECTIVE_HPARAMS`` (and LossConfig fields for new names).
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
    keeps its gradient, only its weight is capped. With ``tis_cap`` (see the module docstring)
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
    1, token ratios do not, so one setting cannot serve both. With ``tis_cap`` (see the module
    docstring) s_i is taken against pi_old and each token's term gets its TIS weight.

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
