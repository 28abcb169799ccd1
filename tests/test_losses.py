"""Objectives x aggregations against hand values and an independent float64 numpy reference.

The reference below is written from the formulas (loops over rows and prompts), not from the
implementation, so agreement checks the maths, not the code path.
"""

import functools
import pathlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scalerl_jax import losses

OBJECTIVES = losses.OBJECTIVES
AGGREGATIONS = losses.AGGREGATIONS
HP = dict(
    ratio_cap=4.0,
    ratio_floor=None,
    clip_eps_low=0.2,
    clip_eps_high=0.28,
    dual_clip=None,
    gspo_eps_low=3e-3,
    gspo_eps_high=4e-3,
    tis_cap=2.0,
)
REG = dict(kl_coef=0.1, ent_coef=0.01)  # KL and entropy coefficients used across tests
SHARED = ("aggregation", "kl_coef", "kl_estimator", "entropy_coef")


def hp_for(objective, **overrides):
    hp = dict(HP, **overrides)
    if objective == "grpo":  # symmetric clip
        hp["clip_eps_high"] = hp["clip_eps_low"]
    return hp


def loss_kwargs(objective, hp, tis=False):
    """The settings of `hp` that `objective` reads (policy_loss refuses the others); `tis_cap`
    only for 'tis' unless tis=True (on the other objectives it turns the TIS weight on)."""
    uses = losses.OBJECTIVE_HPARAMS[objective]
    return {
        k: v
        for k, v in hp.items()
        if k in SHARED or (k in uses and (k != "tis_cap" or tis or objective == "tis"))
    }


# ----------------------------------------------------------------------------- numpy reference
def np_aggregate(x, mask, pidx, num_prompts, mode, max_length=None):
    n_rows, t = mask.shape
    counted = (mask != 0) & ((pidx >= 0) & (pidx < num_prompts))[:, None]
    rows = [i for i in range(n_rows) if counted[i].any()]
    if not rows:
        return 0.0
    if mode == "token":
        return sum(x[i][counted[i]].sum() for i in rows) / counted.sum()
    if mode == "sequence":
        return np.mean([x[i][counted[i]].mean() for i in rows])
    if mode == "prompt":
        per_prompt = []
        for p in range(num_prompts):
            members = [i for i in rows if pidx[i] == p]
            if members:
                per_prompt.append(
                    sum(x[i][counted[i]].sum() for i in members)
                    / sum(counted[i].sum() for i in members)
                )
        return np.mean(per_prompt)
    length = t if max_length is None else max_length
    return sum(x[i][counted[i]].sum() for i in rows) / (len(rows) * length)


def np_weights(mask, pidx, num_prompts, mode, max_length=None):
    """d(aggregate)/d(x[i, t]), by aggregating unit matrices."""
    w = np.zeros(mask.shape)
    for i, t in np.ndindex(*mask.shape):
        e = np.zeros(mask.shape)
        e[i, t] = 1.0
        w[i, t] = np_aggregate(e, mask, pidx, num_prompts, mode, max_length)
    return w


def np_clip_surrogate(rho, adv, lo, hi, dual=None):
    """Per-token PPO loss and its derivative w.r.t. log rho."""
    unclipped, clipped = -adv * rho, -adv * np.clip(rho, 1 - lo, 1 + hi)
    loss = np.maximum(unclipped, clipped)
    dloss = np.where((rho < 1 - lo) & (adv < 0) | (rho > 1 + hi) & (adv > 0), 0.0, -adv * rho)
    if dual is not None:
        bound = (adv < 0) & (-adv * dual < loss)
        loss = np.where(bound, -adv * dual, loss)
        dloss = np.where(bound, 0.0, dloss)
    return loss, dloss


def np_per_token(objective, lp, blp, adv, mask, hp, old_lp=None):
    """(per-token loss, d loss / d logp) in float64 from the published formulas."""
    adv = np.broadcast_to(adv[:, None] if adv.ndim == 1 else adv, lp.shape)
    rho = np.exp(lp - blp)
    if objective == "cispo":
        w = np.minimum(rho, hp["ratio_cap"])
        if hp["ratio_floor"] is not None:
            w = np.maximum(w, hp["ratio_floor"])
        return -w * adv * lp, -w * adv
    if objective in ("grpo", "dapo"):
        hi = hp["clip_eps_low"] if objective == "grpo" else hp["clip_eps_high"]
        return np_clip_surrogate(rho, adv, hp["clip_eps_low"], hi, hp["dual_clip"])
    if objective == "gspo":  # token form: d loss_it / d logp_it = d loss_it / d log s_it
        m = mask != 0
        s = np.array(
            [
                np.exp((lp[i] - blp[i])[m[i]].mean()) if m[i].any() else 1.0
                for i in range(lp.shape[0])
            ]
        )
        return np_clip_surrogate(
            np.broadcast_to(s[:, None], lp.shape), adv, hp["gspo_eps_low"], hp["gspo_eps_high"]
        )
    ratio = np.exp((lp if old_lp is None else old_lp) - blp)
    w = np.minimum(ratio, hp["tis_cap"])
    return -w * adv * lp, -w * adv


def make_batch(seed, n=7, t=5, num_prompts=4, per_token_adv=False, spread=1.0):
    """Random batch with an empty row, a padding row (prompt -1) with tokens, a dropped prompt."""
    rng = np.random.default_rng(seed)
    lp = rng.uniform(-3.0, -0.05, (n, t))
    # Per-row offsets around 0 put GSPO's sequence ratios on both sides of its tiny clip range.
    blp = lp - rng.normal(0.0, spread, (n, t)) - rng.uniform(-0.01, 0.01, (n, 1))
    blp[0, 0] = lp[0, 0] - 2.0  # rho = e^2 > ratio_cap: the cap must bind somewhere
    mask = (rng.random((n, t)) < 0.7).astype(np.float32)
    mask[:, 0] = 1.0
    pidx = rng.integers(0, num_prompts - 1, n)  # prompt num_prompts-1: dropped (no rows)
    mask[1] = 0.0  # empty row of a kept prompt
    pidx[2] = -1  # padding row that has mask tokens: must not count
    adv = np.abs(rng.normal(0.0, 1.0, (n, t) if per_token_adv else (n,)))
    adv[3::2] *= -1.0  # both signs on counted rows
    return lp, blp, adv, mask, pidx


def gspo_batch(seed, n=7, t=5, num_prompts=4, per_token_adv=False):
    lp, _, adv, mask, pidx = make_batch(seed, n, t, num_prompts, per_token_adv)
    rng = np.random.default_rng(seed + 1)
    blp = lp - rng.uniform(-0.008, 0.008, (n, 1)) - rng.normal(0, 1e-3, (n, t))
    return lp, blp, adv, mask, pidx


@functools.lru_cache(maxsize=None)
def _value_and_grad(objective, aggregation, num_prompts, kl_coef, ent_coef, with_ent, hp_items):
    def f(lp, ent, blp, adv, mask, pidx, old_lp, ref_lp):
        return losses.policy_loss(
            objective,
            lp,
            blp,
            adv,
            mask,
            pidx,
            num_prompts=num_prompts,
            aggregation=aggregation,
            old_logp=old_lp,
            ref_logp=ref_lp,
            entropy=ent,
            kl_coef=kl_coef,
            entropy_coef=ent_coef,
            **dict(hp_items),
        )

    # Eager on purpose: each variant is called a few times, and compiling each costs more than
    # dispatching its ops (test_dispatcher_jits_with_static_hparams covers jit).
    return jax.value_and_grad(f, argnums=(0, 1) if with_ent else 0, has_aux=True)


def run(
    objective,
    aggregation,
    lp,
    blp,
    adv,
    mask,
    pidx,
    num_prompts,
    hp=HP,
    old_lp=None,
    ref_lp=None,
    ent=None,
    kl_coef=0.0,
    ent_coef=0.0,
    dtype=jnp.float32,
    tis=False,
):
    """(loss, metrics, (d/dlogp, d/dentropy or None)) of the dispatcher, given the settings of
    `hp` that the objective reads (see loss_kwargs)."""
    f = _value_and_grad(
        objective,
        aggregation,
        num_prompts,
        kl_coef,
        ent_coef,
        ent is not None,
        tuple(sorted(loss_kwargs(objective, hp, tis).items())),
    )
    cast = lambda x: None if x is None else jnp.asarray(x, dtype)  # noqa: E731
    (loss, metrics), grads = f(
        cast(lp),
        cast(ent),
        cast(blp),
        cast(adv),
        jnp.asarray(mask),
        jnp.asarray(pidx, jnp.int32),
        cast(old_lp),
        cast(ref_lp),
    )
    return loss, metrics, (grads if ent is not None else (grads, None))


# ----------------------------------------------------------------------------- hand values
def _hand_batch():
    # rho by construction: row0 [2, 8], row1 [0.5], row2 [1, 1]; row3 belongs to dropped prompt 2.
    lp = np.array([[-1.0, -2.0, -7.0], [-0.5, -9.0, -9.0], [-1.0, -1.0, -9.0], [-1.0] * 3])
    rho = np.array([[2.0, 8.0, 1.0], [0.5, 1.0, 1.0], [1.0, 1.0, 1.0], [1.0] * 3])
    mask = np.array([[1, 1, 0], [1, 0, 0], [1, 1, 0], [0, 0, 0]], np.float32)
    adv = np.array([1.0, -1.0, 2.0, 5.0])
    pidx = np.array([0, 0, 1, 2])
    return lp, lp - np.log(rho), adv, mask, pidx


# CISPO (cap 4) token terms: row0 [2, 8], row1 [-0.25], row2 [2, 2].
# PPO (0.2/0.28) token terms: row0 [-1.28, -1.28], row1 [0.8], row2 [-2, -2].
HAND = {
    ("cispo", "token"): 13.75 / 5,
    ("cispo", "sequence"): (5.0 - 0.25 + 2.0) / 3,
    ("cispo", "prompt"): (9.75 / 3 + 4.0 / 2) / 2,
    ("cispo", "constant"): 13.75 / (3 * 3),
    ("dapo", "token"): (-2.56 + 0.8 - 4.0) / 5,
    ("dapo", "sequence"): (-1.28 + 0.8 - 2.0) / 3,
    ("dapo", "prompt"): ((-2.56 + 0.8) / 3 + -4.0 / 2) / 2,
    ("dapo", "constant"): (-2.56 + 0.8 - 4.0) / 9,
}


@pytest.mark.parametrize("objective,aggregation", sorted(HAND))
@pytest.mark.fast
def test_hand_values(objective, aggregation):
    lp, blp, adv, mask, pidx = _hand_batch()
    loss, metrics, _ = run(objective, aggregation, lp, blp, adv, mask, pidx, 3)
    np.testing.assert_allclose(float(loss), HAND[objective, aggregation], rtol=1e-6)
    assert float(metrics["tokens"]) == 5 and float(metrics["sequences"]) == 3
    assert float(metrics["prompts"]) == 2
    np.testing.assert_allclose(float(metrics["ratio_mean"]), 12.5 / 5, rtol=1e-6)
    np.testing.assert_allclose(float(metrics["ratio_max"]), 8.0, rtol=1e-6)
    if objective == "cispo":
        np.testing.assert_allclose(float(metrics["cap_frac"]), 0.2)
    else:
        np.testing.assert_allclose(float(metrics["clip_frac_high"]), 0.4)
        np.testing.assert_allclose(float(metrics["clip_frac_low"]), 0.2)
    expected_norm = {"token": 5, "sequence": 3, "prompt": 2, "constant": 9}[aggregation]
    assert float(metrics["normaliser"]) == expected_norm


# ----------------------------------------------------------------------------- reference sweep
CASES = [(o, a) for o in OBJECTIVES for a in AGGREGATIONS]


@pytest.mark.parametrize("objective,aggregation", CASES)
def test_matches_reference_value_and_grad(objective, aggregation):
    for seed, per_token in ((0, False), (1, True)):
        batch = (gspo_batch if objective == "gspo" else make_batch)(seed, per_token_adv=per_token)
        lp, blp, adv, mask, pidx = batch
        hp = hp_for(objective, dual_clip=1.5 if seed else None)
        loss, _, (glp, _) = run(objective, aggregation, *batch, 4, hp=hp)
        tok, dtok = np_per_token(objective, lp, blp, adv, mask, hp)
        w = np_weights(mask, pidx, 4, aggregation)
        np.testing.assert_allclose(
            float(loss), np_aggregate(tok, mask, pidx, 4, aggregation), rtol=2e-5, atol=1e-7
        )
        np.testing.assert_allclose(np.asarray(glp), w * dtok, rtol=2e-5, atol=1e-7)


def test_reference_batch_exercises_every_branch():
    # Guard for the sweep above: its batches must actually hit the caps and both clip sides.
    for seed, per_token in ((0, False), (1, True)):
        lp, blp, adv, mask, pidx = make_batch(seed, per_token_adv=per_token)
        _, m, _ = run("cispo", "token", lp, blp, adv, mask, pidx, 4)
        assert 0 < float(m["cap_frac"]) < 1
        _, m, _ = run("dapo", "token", lp, blp, adv, mask, pidx, 4, hp=dict(HP, dual_clip=1.5))
        assert float(m["clip_frac_low"]) > 0 and float(m["clip_frac_high"]) > 0
        assert float(m["dual_clip_frac"]) > 0
        _, m, _ = run("gspo", "token", *gspo_batch(seed, per_token_adv=per_token), 4)
        assert 0 < float(m["clip_frac"]) < 1


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_cispo_gradient_is_capped_weight_times_advantage_over_normaliser(aggregation):
    lp, blp, adv, mask, pidx = make_batch(3)
    _, metrics, (glp, _) = run("cispo", aggregation, lp, blp, adv, mask, pidx, 4)
    counted = (mask != 0) & (pidx >= 0)[:, None]
    w = np.minimum(np.exp(lp - blp), 4.0)
    n_i = counted.sum(1)
    if aggregation == "token":
        scale = np.full(n_i.shape, 1.0 / counted.sum())
    elif aggregation == "sequence":
        scale = 1.0 / (np.maximum(n_i, 1) * (n_i > 0).sum())
    elif aggregation == "constant":
        scale = np.full(n_i.shape, 1.0 / ((n_i > 0).sum() * mask.shape[1]))
    else:
        prompt_tokens = {p: n_i[pidx == p].sum() for p in set(pidx[pidx >= 0])}
        n_prompts = sum(v > 0 for v in prompt_tokens.values())
        scale = np.array(
            [
                1.0 / (prompt_tokens[p] * n_prompts) if p >= 0 and prompt_tokens[p] else 0.0
                for p in pidx
            ]
        )
        assert float(metrics["normaliser"]) == n_prompts
    expected = -w * adv[:, None] * counted * scale[:, None]
    np.testing.assert_allclose(np.asarray(glp), expected, rtol=1e-5, atol=1e-8)


def test_tis_equals_cispo_when_old_is_current_and_uses_old_logp_otherwise():
    lp, blp, adv, mask, pidx = make_batch(4)
    hp = dict(HP, ratio_cap=2.0, tis_cap=2.0)
    l_c, _, (g_c, _) = run("cispo", "prompt", lp, blp, adv, mask, pidx, 4, hp=hp)
    l_t, _, (g_t, _) = run("tis", "prompt", lp, blp, adv, mask, pidx, 4, hp=hp)
    np.testing.assert_allclose(float(l_t), float(l_c), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(g_t), np.asarray(g_c), rtol=1e-6)
    old = lp + np.random.default_rng(5).normal(0, 0.5, lp.shape)
    loss, m, (glp, _) = run("tis", "token", lp, blp, adv, mask, pidx, 4, hp=hp, old_lp=old)
    tok, dtok = np_per_token("tis", lp, blp, adv, mask, hp, old_lp=old)
    np.testing.assert_allclose(float(loss), np_aggregate(tok, mask, pidx, 4, "token"), rtol=2e-5)
    np.testing.assert_allclose(
        np.asarray(glp), np_weights(mask, pidx, 4, "token") * dtok, rtol=2e-5, atol=1e-8
    )
    assert 0 < float(m["tis_frac"]) < 1


def test_gspo_token_form_equals_sequence_form_gradient():
    # TRL-style sequence form written directly: loss l_i broadcast to every token of row i.
    lp, blp, adv, mask, pidx = gspo_batch(6)
    m = jnp.asarray(mask) * (jnp.asarray(pidx) >= 0)[:, None]

    def sequence_form(lp_):
        n = jnp.maximum(m.sum(1), 1)
        s = jnp.exp(((lp_ - blp) * m).sum(1) / n)
        a = jnp.asarray(adv, jnp.float32)
        per_row = jnp.maximum(-s * a, -jnp.clip(s, 1 - 3e-3, 1 + 4e-3) * a)
        tok = jnp.broadcast_to(per_row[:, None], lp_.shape) * m
        return (tok.sum(1) / n).sum() / (m.sum(1) > 0).sum()  # sequence aggregation

    expected = jax.grad(sequence_form)(jnp.asarray(lp, jnp.float32))
    loss, _, (glp, _) = run("gspo", "sequence", lp, blp, adv, mask, pidx, 4)
    np.testing.assert_allclose(
        float(loss), float(sequence_form(jnp.asarray(lp, jnp.float32))), rtol=1e-5
    )
    np.testing.assert_allclose(np.asarray(glp), np.asarray(expected), rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("estimator", ["k1", "k3"])
def test_kl_and_entropy_terms(estimator):
    lp, blp, adv, mask, pidx = make_batch(7)
    rng = np.random.default_rng(8)
    ref, ent = lp + rng.normal(0, 0.3, lp.shape), rng.uniform(0, 2, lp.shape)
    hp = dict(HP, kl_estimator=estimator)
    base, _, (g0, _) = run("cispo", "prompt", lp, blp, adv, mask, pidx, 4, hp=hp)
    loss, m, (glp, gent) = run(
        "cispo", "prompt", lp, blp, adv, mask, pidx, 4, hp=hp, ref_lp=ref, ent=ent, **REG
    )
    d = ref - lp
    kl_tok, dkl = (
        (lp - ref, np.ones_like(lp)) if estimator == "k1" else (np.exp(d) - d - 1, 1 - np.exp(d))
    )
    w = np_weights(mask, pidx, 4, "prompt")
    kl, entropy = (w * kl_tok).sum(), (w * ent).sum()
    np.testing.assert_allclose(float(m["kl"]), kl, rtol=1e-5)
    np.testing.assert_allclose(float(m["entropy"]), entropy, rtol=1e-5)
    kc, ec = REG["kl_coef"], REG["ent_coef"]
    np.testing.assert_allclose(float(loss), float(base) + kc * kl - ec * entropy, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(glp), np.asarray(g0) + kc * w * dkl, rtol=1e-5, atol=1e-8)
    np.testing.assert_allclose(np.asarray(gent), -ec * w, rtol=1e-5, atol=1e-9)


# ----------------------------------------------------------------------------- invariances
@pytest.mark.parametrize("objective", OBJECTIVES)
def test_padding_and_dropped_prompts_change_nothing(objective):
    lp, blp, adv, mask, pidx = make_batch(9)
    n, t = lp.shape
    for aggregation in AGGREGATIONS:
        hp = hp_for(objective)
        loss, metrics, (glp, _) = run(objective, aggregation, lp, blp, adv, mask, pidx, 4, hp=hp)
        # Pad T with garbage tokens (NaN/inf under mask 0), add rows of a dropped prompt, add
        # padding rows (prompt -1) with mask 1, and raise num_prompts: nothing may change.
        garbage = np.full((n, 3), np.nan)
        lp2 = np.concatenate([lp, garbage], 1)
        blp2 = np.concatenate([blp, np.full((n, 3), -np.inf)], 1)
        mask2 = np.concatenate([mask, np.zeros((n, 3))], 1)
        extra_lp = np.full((3, t + 3), np.inf)
        lp2, blp2 = np.concatenate([lp2, extra_lp]), np.concatenate([blp2, -extra_lp])
        mask2 = np.concatenate([mask2, np.zeros((2, t + 3)), np.ones((1, t + 3))])
        pidx2 = np.concatenate([pidx, [5, 5, -1]])
        adv2 = np.concatenate([adv, [np.nan, 3.0, 1.0]])
        # constant's divisor is max_length (defaults to T), so pin it to the original T.
        f = jax.value_and_grad(
            lambda x: losses.policy_loss(
                objective,
                x,
                blp2,
                adv2,
                mask2,
                pidx2,
                num_prompts=7,
                aggregation=aggregation,
                max_length=t,
                **loss_kwargs(objective, hp),
            ),
            has_aux=True,
        )
        (loss2, m2), g2 = f(jnp.asarray(lp2, jnp.float32))
        assert float(m2["normaliser"]) == float(metrics["normaliser"])
        np.testing.assert_allclose(float(loss2), float(loss), rtol=1e-6)
        np.testing.assert_allclose(np.asarray(g2)[:n, :t], np.asarray(glp), rtol=1e-6)
        assert np.all(np.asarray(g2)[:, t:] == 0) and np.all(np.asarray(g2)[n:] == 0)
        for k in ("tokens", "sequences", "ratio_mean", "ratio_max"):
            assert float(m2[k]) == pytest.approx(float(metrics[k]), rel=1e-6), k


@pytest.mark.parametrize("objective", OBJECTIVES)
def test_permuting_rows_and_prompts_changes_nothing(objective):
    lp, blp, adv, mask, pidx = make_batch(10)
    rng = np.random.default_rng(11)
    rows = rng.permutation(len(pidx))
    relabel = np.array([2, 0, 3, 1])  # a permutation of prompt ids (3 is the dropped one)
    pidx2 = np.where(pidx >= 0, relabel[np.maximum(pidx, 0)], -1)[rows]
    hp = hp_for(objective)
    for aggregation in AGGREGATIONS:
        loss, _, (g, _) = run(objective, aggregation, lp, blp, adv, mask, pidx, 4, hp=hp)
        loss2, _, (g2, _) = run(
            objective, aggregation, lp[rows], blp[rows], adv[rows], mask[rows], pidx2, 4, hp=hp
        )
        # Equal up to fp32 summation order.
        np.testing.assert_allclose(float(loss2), float(loss), rtol=1e-5)
        np.testing.assert_allclose(np.asarray(g2), np.asarray(g)[rows], rtol=1e-5)


@pytest.mark.parametrize("objective", OBJECTIVES)
def test_bf16_inputs_give_fp32_answer(objective):
    lp, blp, adv, mask, pidx = (gspo_batch if objective == "gspo" else make_batch)(12)
    hp = hp_for(objective)
    to_bf16 = lambda x: np.asarray(jnp.asarray(x, jnp.bfloat16).astype(jnp.float32))  # noqa
    for aggregation in ("token", "prompt"):
        loss16, _, (g16, _) = run(
            objective, aggregation, lp, blp, adv, mask, pidx, 4, hp=hp, dtype=jnp.bfloat16
        )
        # Inside, the maths is fp32: bf16 inputs give exactly the fp32 answer on those values.
        loss_r, _, (g_r, _) = run(
            objective, aggregation, to_bf16(lp), to_bf16(blp), to_bf16(adv), mask, pidx, 4, hp=hp
        )
        assert g16.dtype == jnp.bfloat16
        np.testing.assert_allclose(float(loss16), float(loss_r), rtol=1e-6)
        np.testing.assert_allclose(
            np.asarray(g16.astype(jnp.float32)), np.asarray(g_r), rtol=2**-8, atol=1e-6
        )
        if objective != "gspo":  # GSPO's 3e-3 clip range is finer than bf16's log-prob grid
            loss32, _, _ = run(objective, aggregation, lp, blp, adv, mask, pidx, 4, hp=hp)
            # and the fp32 answer on the original values within bf16 rounding of the inputs
            # (|log rho| errors of ~2^-8 * |logp| move rho by ~2%).
            np.testing.assert_allclose(float(loss16), float(loss32), rtol=0.05, atol=1e-3)


# ----------------------------------------------------------------------------- edge cases
@pytest.mark.parametrize("objective", OBJECTIVES)
def test_all_masked_batch_is_zero_not_nan(objective):
    lp, blp, adv, mask, pidx = make_batch(13)
    hp = hp_for(objective)
    for aggregation in AGGREGATIONS:
        loss, metrics, (g, _) = run(
            objective, aggregation, lp, blp, adv, 0 * mask, pidx, 4, hp=hp, ref_lp=lp, ent=lp, **REG
        )
        assert float(loss) == 0.0 and not np.any(np.asarray(g))
        assert all(np.isfinite(float(v)) for v in metrics.values())
        assert float(metrics["tokens"]) == 0 and float(metrics["normaliser"]) == 0


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    case=st.sampled_from(CASES),
    seed=st.integers(0, 2**31 - 1),
    density=st.sampled_from([0.0, 0.1, 0.5, 1.0]),
    empty_rows=st.integers(0, 7),
    scale=st.sampled_from([0.1, 3.0, 40.0]),
    tis=st.booleans(),
)
def test_property_finite_everywhere(case, seed, density, empty_rows, scale, tis):
    objective, aggregation = case
    rng = np.random.default_rng(seed)
    n, t = 7, 5
    lp = -np.abs(rng.normal(0, scale, (n, t)))
    blp = -np.abs(rng.normal(0, scale, (n, t)))
    mask = (rng.random((n, t)) < density).astype(np.float32)
    mask[:empty_rows] = 0
    lp[mask == 0] = np.nan  # garbage where nothing counts
    adv = rng.normal(0, 2, n)
    pidx = rng.integers(-1, 4, n)
    ref, ent = lp + rng.normal(0, 1, lp.shape), rng.uniform(0, 3, lp.shape)
    old = lp + rng.normal(0, scale, lp.shape) if tis else None  # NaN where lp is
    loss, metrics, (g, ge) = run(
        objective,
        aggregation,
        lp,
        blp,
        adv,
        mask,
        pidx,
        4,
        hp=hp_for(objective, dual_clip=3.0),
        ref_lp=ref,
        ent=ent,
        old_lp=old,
        tis=tis,
        **REG,
    )
    assert np.isfinite(float(loss))
    assert np.all(np.isfinite(np.asarray(g))) and np.all(np.isfinite(np.asarray(ge)))
    assert all(np.isfinite(float(v)) for v in metrics.values()), metrics


def test_bad_arguments_name_the_field():
    lp, blp, adv, mask, pidx = make_batch(14)
    with pytest.raises(ValueError, match="aggregation='mean'"):
        losses.policy_loss("cispo", lp, blp, adv, mask, pidx, num_prompts=4, aggregation="mean")
    with pytest.raises(ValueError, match="objective='ppo'"):
        losses.policy_loss("ppo", lp, blp, adv, mask, pidx, num_prompts=4, aggregation="token")
    with pytest.raises(ValueError, match="num_prompts"):
        losses.cispo_loss(lp, blp, adv, mask, pidx, aggregation="prompt")
    with pytest.raises(ValueError, match=r"advantages must be \[N\]"):
        losses.cispo_loss(lp, blp, adv[:3], mask, aggregation="token")
    with pytest.raises(ValueError, match="clip_eps_high=0.28; use 'dapo'"):
        losses.policy_loss("grpo", lp, blp, adv, mask, aggregation="token", clip_eps_high=0.28)
    with pytest.raises(ValueError, match="ratio_floor=5"):
        losses.cispo_loss(lp, blp, adv, mask, aggregation="token", ratio_floor=5)
    with pytest.raises(ValueError, match="kl_coef=0.1 needs ref_logp"):
        losses.tis_loss(lp, blp, adv, mask, aggregation="token", kl_coef=0.1)
    with pytest.raises(TypeError):
        losses.policy_loss("cispo", lp, blp, adv, mask, aggregation="token", epsilon=0.2)


@pytest.mark.parametrize("objective", OBJECTIVES)
def test_loss_config_defaults_run_for_every_objective(objective):
    from scalerl_jax.config import LossConfig

    cfg = LossConfig(objective=objective)  # the defaults are valid for every objective
    kwargs = dict(
        cfg.objective_hparams(),
        aggregation=cfg.aggregation,
        kl_coef=cfg.kl_coef,
        kl_estimator=cfg.kl_estimator,
        entropy_coef=cfg.entropy_coef,
    )
    assert set(kwargs) <= set(losses.HPARAM_NAMES)
    lp, blp, adv, mask, pidx = make_batch(15)
    loss, _ = losses.policy_loss(cfg.objective, lp, blp, adv, mask, pidx, num_prompts=4, **kwargs)
    assert np.isfinite(float(loss))


def test_one_name_and_one_default_per_setting():
    """LossConfig's fields, policy_loss's keywords and each objective's function agree: same
    names, and LossConfig's default is the function's (None in policy_loss: 'not set')."""
    import dataclasses
    import inspect
    from scalerl_jax.config import LossConfig

    fields = {f.name: f.default for f in dataclasses.fields(LossConfig)}
    dispatcher = inspect.signature(losses.policy_loss).parameters
    functions = {
        "cispo": losses.cispo_loss,
        "grpo": losses.grpo_loss,
        "dapo": losses.dapo_loss,
        "gspo": losses.gspo_loss,
        "tis": losses.tis_loss,
    }
    assert set(losses.HPARAM_NAMES) <= set(fields) and set(losses.HPARAM_NAMES) <= set(dispatcher)
    for objective, fn in functions.items():
        params = inspect.signature(fn).parameters
        for name in losses.OBJECTIVE_HPARAMS[objective]:
            assert name in params, (objective, name)
            assert dispatcher[name].default is None, name
            # None in a function derives the default (grpo's clip_eps_high: clip_eps_low;
            # tis_cap: off). DAPO's own clip-higher default (0.28) is not LossConfig's: its 0.2
            # keeps the default valid for 'grpo', which clips symmetrically.
            if None not in (fields[name], params[name].default) and (objective, name) != (
                "dapo",
                "clip_eps_high",
            ):
                assert params[name].default == fields[name], (objective, name)
        # and no knob of another objective (each function takes only its own)
        others = set(losses.HPARAM_NAMES) - set(losses.OBJECTIVE_HPARAMS[objective]) - set(SHARED)
        assert not others & set(params), (objective, others & set(params))


UNUSED = [
    (o, k)
    for o in OBJECTIVES
    for k in (
        "ratio_cap",
        "ratio_floor",
        "clip_eps_low",
        "clip_eps_high",
        "dual_clip",
        "gspo_eps_low",
        "gspo_eps_high",
    )
    if k not in losses.OBJECTIVE_HPARAMS[o]
]


@pytest.mark.parametrize("objective,name", UNUSED)
def test_a_setting_the_objective_does_not_read_is_refused(objective, name):
    lp, blp, adv, mask, pidx = make_batch(18)
    value = {"ratio_floor": 0.5, "dual_clip": 3.0}.get(name, 0.123)
    with pytest.raises(
        ValueError,
        match=rf"{name}={value} is not used by "
        rf"objective='{objective}'",
    ):
        losses.policy_loss(
            objective, lp, blp, adv, mask, pidx, num_prompts=4, aggregation="token", **{name: value}
        )
    from scalerl_jax.config import ConfigError, LossConfig

    with pytest.raises(
        ConfigError,
        match=rf"LossConfig.{name}={value}: not used by "
        rf"objective='{objective}'",
    ):
        LossConfig(objective=objective, **{name: value})


def test_measured_cases_take_effect_or_raise():
    lp, blp, adv, mask, pidx = gspo_batch(19)
    # GSPO's clip is gspo_eps_*: clip_eps_* used to be ignored in favour of 3e-3 / 4e-3.
    with pytest.raises(
        ValueError,
        match=r"clip_eps_low=0.0003, clip_eps_high=0.0004 are not "
        r"used by objective='gspo' \(it reads gspo_eps_low",
    ):
        losses.policy_loss(
            "gspo",
            lp,
            blp,
            adv,
            mask,
            pidx,
            num_prompts=4,
            aggregation="token",
            clip_eps_low=3e-4,
            clip_eps_high=4e-4,
        )
    _, m = losses.policy_loss(
        "gspo",
        lp,
        blp,
        adv,
        mask,
        pidx,
        num_prompts=4,
        aggregation="token",
        gspo_eps_low=0.5,
        gspo_eps_high=0.5,
    )
    _, m_default = losses.policy_loss(
        "gspo", lp, blp, adv, mask, pidx, num_prompts=4, aggregation="token"
    )
    # the spelling GSPO reads takes effect: nothing is clipped at 0.5, some tokens at 3e-3
    assert float(m["clip_frac"]) == 0 < float(m_default["clip_frac"])
    # CISPO with tis_cap and old_logp used to be plain CISPO.
    lp, blp, adv, mask, pidx = make_batch(20)
    old = lp + np.random.default_rng(21).normal(0, 0.5, lp.shape)
    plain, _ = losses.policy_loss(
        "cispo", lp, blp, adv, mask, pidx, num_prompts=4, aggregation="token"
    )
    with_tis, m = losses.policy_loss(
        "cispo",
        lp,
        blp,
        adv,
        mask,
        pidx,
        num_prompts=4,
        aggregation="token",
        tis_cap=2.0,
        old_logp=old,
    )
    assert abs(float(with_tis) - float(plain)) > 1e-3 and 0 < float(m["tis_frac"]) < 1
    # old_logp without tis_cap would be ignored: refused
    for objective in ("cispo", "grpo", "dapo", "gspo"):
        with pytest.raises(
            ValueError,
            match=rf"old_logp is only used with tis_cap: without it "
            rf"objective='{objective}'",
        ):
            losses.policy_loss(
                objective,
                lp,
                blp,
                adv,
                mask,
                pidx,
                num_prompts=4,
                aggregation="token",
                old_logp=old,
            )
    from scalerl_jax.config import ConfigError, LossConfig

    with pytest.raises(
        ConfigError,
        match=r"LossConfig.clip_eps_high=0.28: not used by "
        r"objective='cispo'",
    ):
        LossConfig(objective="cispo", clip_eps_high=0.28)
    with pytest.raises(
        ConfigError,
        match=r"LossConfig.clip_eps_high=0.28: objective='grpo' "
        r"clips symmetrically",
    ):
        LossConfig(objective="grpo", clip_eps_high=0.28)
    with pytest.raises(ConfigError, match=r"LossConfig.tis_cap=0.0: must be > 0"):
        LossConfig(objective="cispo", tis_cap=0.0)
    with pytest.raises(ValueError, match=r"tis_cap=0: must be > 0"):
        losses.cispo_loss(lp, blp, adv, mask, aggregation="token", tis_cap=0)
    assert LossConfig(objective="dapo", clip_eps_high=0.28, tis_cap=2.0).tis_cap == 2.0


TIS_OBJECTIVES = ("cispo", "grpo", "dapo", "gspo")


@pytest.mark.parametrize("objective", TIS_OBJECTIVES)
@pytest.mark.parametrize("aggregation", ["token", "prompt"])
def test_tis_weight_on_top_of_each_objective_matches_reference(objective, aggregation):
    """loss = sum W * min(pi_old / pi_behaviour, C) * objective_term(ratio logp - old_logp)."""
    for seed in (0, 1):
        lp, blp, adv, mask, pidx = (gspo_batch if objective == "gspo" else make_batch)(
            seed, per_token_adv=bool(seed)
        )
        rng = np.random.default_rng(seed + 30)
        # pi_old near pi_theta (GSPO's clip range is ~1e-3), the sampler further away
        if objective == "gspo":
            old = blp  # gspo_batch puts it within GSPO's ~1e-3 clip range of lp
            blp = old - rng.normal(0, 0.5, lp.shape)
        else:
            old = lp - rng.normal(0, 0.3, lp.shape)
        hp = hp_for(objective, dual_clip=1.5 if seed else None, tis_cap=1.5)
        loss, m, (glp, _) = run(
            objective, aggregation, lp, blp, adv, mask, pidx, 4, hp=hp, old_lp=old, tis=True
        )
        tok, dtok = np_per_token(objective, lp, old, adv, mask, hp)  # ratio against pi_old
        w_tis = np.minimum(np.exp(old - blp), hp["tis_cap"])
        w = np_weights(mask, pidx, 4, aggregation)
        np.testing.assert_allclose(
            float(loss), np_aggregate(w_tis * tok, mask, pidx, 4, aggregation), rtol=2e-5, atol=1e-7
        )
        np.testing.assert_allclose(np.asarray(glp), w * w_tis * dtok, rtol=2e-5, atol=1e-7)
        counted = (mask != 0) & (pidx >= 0)[:, None]
        ratio = np.exp(old - blp)[counted]
        np.testing.assert_allclose(float(m["tis_frac"]), np.mean(ratio > 1.5), rtol=1e-6)
        np.testing.assert_allclose(float(m["tis_ratio_max"]), ratio.max(), rtol=1e-5)
        assert 0 < float(m["tis_frac"]) < 1


@pytest.mark.parametrize("objective", TIS_OBJECTIVES)
def test_tis_with_current_policy_as_old_equals_tis_objective(objective):
    """old_logp=None (one update per batch: pi_old = pi_theta, the train step's case): the
    objective's own ratio is 1 in value, so no clip or cap binds and its gradient is
    REINFORCE's with the TIS weight: objective 'tis'. CISPO's value is 'tis's too; the
    PPO-style values are surrogates (-w * A * ratio, not -w * A * logp)."""
    lp, blp, adv, mask, pidx = make_batch(22)
    hp = hp_for(objective, tis_cap=2.0)
    for aggregation in ("sequence", "prompt"):
        l_t, m_t, (g_t, _) = run("tis", aggregation, lp, blp, adv, mask, pidx, 4, hp=hp)
        loss, m, (g, _) = run(objective, aggregation, lp, blp, adv, mask, pidx, 4, hp=hp, tis=True)
        if objective == "cispo":
            np.testing.assert_allclose(float(loss), float(l_t), rtol=1e-6)
        np.testing.assert_allclose(np.asarray(g), np.asarray(g_t), rtol=1e-6, atol=1e-9)
        assert float(m["tis_frac"]) == float(m_t["tis_frac"]) > 0
        np.testing.assert_allclose(float(m["ratio_max"]), 1.0, rtol=1e-6)  # pi_theta / pi_old


@pytest.mark.parametrize("objective", ["cispo", "gspo"])
def test_micro_batches_with_full_batch_weights_sum_to_full_loss(objective):
    lp, blp, adv, mask, pidx = make_batch(16, n=14)
    for aggregation in ("token", "prompt"):
        w, _ = losses.token_weights(mask, pidx, aggregation=aggregation, num_prompts=4)
        full = jax.value_and_grad(
            lambda x: losses.policy_loss(
                objective, x, blp, adv, mask, pidx, num_prompts=4, aggregation=aggregation
            )[0]
        )
        loss, grad = full(jnp.asarray(lp, jnp.float32))
        total, grads = 0.0, []
        for rows in (slice(0, 7), slice(7, None)):  # splits prompts across micro-batches
            f = jax.value_and_grad(
                lambda x: losses.policy_loss(
                    objective,
                    x,
                    blp[rows],
                    adv[rows],
                    mask[rows],
                    pidx[rows],
                    num_prompts=4,
                    aggregation=aggregation,
                    weights=w[rows],
                )[0]
            )
            part, g = f(jnp.asarray(lp[rows], jnp.float32))
            total, grads = total + float(part), grads + [np.asarray(g)]
        np.testing.assert_allclose(total, float(loss), rtol=1e-5)
        np.testing.assert_allclose(np.concatenate(grads), np.asarray(grad), rtol=1e-5, atol=1e-9)


def test_dispatcher_jits_with_static_hparams():
    lp, blp, adv, mask, pidx = make_batch(17)
    static = ("objective", "num_prompts") + losses.HPARAM_NAMES
    f = jax.jit(losses.policy_loss, static_argnames=static)
    kwargs = dict(
        loss_kwargs("cispo", HP, tis=True),
        kl_estimator="k3",
        aggregation="prompt",
        kl_coef=0.0,
        entropy_coef=0.0,
    )
    loss, metrics = f(
        objective="cispo",
        logp=lp,
        behaviour_logp=blp,
        advantages=adv,
        mask=mask,
        prompt_index=pidx,
        num_prompts=4,
        **kwargs,
    )
    eager, _ = losses.policy_loss("cispo", lp, blp, adv, mask, pidx, num_prompts=4, **kwargs)
    np.testing.assert_allclose(float(loss), float(eager), rtol=1e-6)
    assert set(metrics) >= {
        "tokens",
        "normaliser",
        "ratio_mean",
        "ratio_max",
        "cap_frac",
        "tis_frac",
    }


# ------------------------------------------------------- docs example (docs/losses.md, was README)
README_EXAMPLE = """\
import functools
import jax
import jax.numpy as jnp
from scalerl_jax import losses

# 2 prompts x 2 generations, 4 positions; rows of one prompt need not be adjacent.
rewards = jnp.array([1.0, -1.0, -1.0, 1.0])  # +-1 correctness per generation
prompt_index = jnp.array([0, 1, 0, 1])
mask = jnp.array(
    [
        [1, 1, 1, 0],  # 1 = policy-sampled completion token
        [1, 1, 0, 0],
        [1, 1, 1, 1],
        [1, 0, 0, 0],
    ]
)
behaviour_logp = jnp.log(jnp.full((4, 4), 0.5))  # from the sampler
logp_init = behaviour_logp + 0.1  # stands in for your model's log-probs

advantages, keep, adv_metrics = losses.group_advantages(
    rewards, prompt_index, num_prompts=2, norm="batch", filter_zero_variance=True
)


@functools.partial(jax.jit, static_argnames=("objective", "aggregation"))
def loss_fn(logp, objective="cispo", aggregation="prompt"):
    return losses.policy_loss(
        objective,
        logp,
        behaviour_logp,
        advantages,
        mask * keep[:, None],
        prompt_index,
        num_prompts=2,
        aggregation=aggregation,
        ratio_cap=4.0,
    )


(loss, metrics), grad = jax.value_and_grad(loss_fn, has_aux=True)(logp_init)
print(
    f"loss={float(loss):.4f} tokens={int(metrics['tokens'])} "
    f"cap_frac={float(metrics['cap_frac']):.2f}"
)
"""


def test_readme_example_runs(capsys):
    namespace = {}
    exec(compile(README_EXAMPLE, "readme_example", "exec"), namespace)  # our own doc text
    out = capsys.readouterr().out
    assert out.startswith("loss=") and "tokens=10" in out
    assert np.all(np.isfinite(np.asarray(namespace["grad"])))


def test_readme_text_matches_tested_example():
    readme = (pathlib.Path(__file__).resolve().parents[1] / "docs" / "losses.md").read_text()
    assert "Using the losses in your own code" in readme
    text = readme.split("Using the losses in your own code", 1)[1]
    block = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    assert block == README_EXAMPLE


def test_readme_tis_snippet_runs():
    readme = (pathlib.Path(__file__).resolve().parents[1] / "docs" / "losses.md").read_text()
    text = readme.split("Using the losses in your own code", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    snippet = next(b for b in blocks if "old_logp=old_logp" in b)
    namespace = {}
    exec(compile(README_EXAMPLE, "readme_example", "exec"), namespace)  # our own doc text
    namespace.update(
        logp=namespace["logp_init"], old_logp=namespace["behaviour_logp"] + 0.05
    )  # trainer vs sampler
    exec(compile(snippet, "readme_tis", "exec"), namespace)
    m = namespace["metrics"]
    assert np.isfinite(float(namespace["loss"])) and "tis_frac" in m
    np.testing.assert_allclose(float(m["tis_ratio_max"]), np.exp(0.05), rtol=1e-5)
