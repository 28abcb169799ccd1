"""Advantages, zero-variance groups and length shaping against loop-based numpy references."""

import functools

import jax
import numpy as np
import pytest

from scalerl_jax import losses


def np_advantages(r, pidx, num_prompts, valid, norm, filt, eps=1e-6, ddof=1):
    """Loops over groups, float64; written from the formulas in the module docstring."""
    n = len(r)
    ok = valid & (pidx >= 0) & (pidx < num_prompts)
    adv, keep = np.zeros(n), np.zeros(n, bool)
    centred, group_std = {}, {}
    for p in range(num_prompts):
        rows = [i for i in range(n) if ok[i] and pidx[i] == p]
        if not rows:
            continue
        vals = r[rows]
        if filt and vals.max() == vals.min():
            continue
        sd = np.std(vals, ddof=ddof) if len(vals) > ddof else 0.0
        for i in rows:
            keep[i], centred[i], group_std[i] = True, r[i] - vals.mean(), sd
    kept = sorted(centred)
    batch_sd = np.std([centred[i] for i in kept], ddof=ddof) if len(kept) > ddof else 0.0
    for i in kept:
        adv[i] = {
            "batch": centred[i] / (batch_sd + eps),
            "group": centred[i] / (group_std[i] + eps),
            "none": centred[i],
        }[norm]
    return adv, keep, batch_sd


def batch(seed=0, n=12, num_prompts=5):
    rng = np.random.default_rng(seed)
    pidx = rng.integers(0, num_prompts - 1, n)  # last prompt is absent
    r = rng.choice([-1.0, 1.0], n) + rng.choice([0.0, 0.0, -0.3], n)  # some non-binary
    pidx[:3] = 0
    r[:3] = 1.0  # prompt 0 rows ...
    pidx[3] = 1
    r[np.flatnonzero(pidx == 0)] = 1.0  # ... prompt 0 is all-correct: zero variance
    valid = np.ones(n, bool)
    valid[-1] = False
    r[-1] = np.nan  # invalid rows may hold garbage
    pidx[-2] = -1  # out of range: invalid too
    return r, pidx, valid


@functools.lru_cache(maxsize=None)
def _jitted(norm, filt, ddof, num_prompts):
    return jax.jit(
        functools.partial(
            losses.group_advantages,
            num_prompts=num_prompts,
            norm=norm,
            filter_zero_variance=filt,
            ddof=ddof,
        )
    )


@pytest.mark.parametrize("norm", losses.ADVANTAGE_NORMS)
@pytest.mark.parametrize("filt", [True, False])
@pytest.mark.parametrize("ddof", [0, 1])
def test_matches_reference(norm, filt, ddof):
    for seed in range(3):
        r, pidx, valid = batch(seed)
        adv, keep, metrics = _jitted(norm, filt, ddof, 5)(r, pidx, valid=valid)
        ref, ref_keep, ref_sd = np_advantages(r, pidx, 5, valid, norm, filt, ddof=ddof)
        assert ref_keep.any() and (not filt or float(metrics["zero_variance_groups"]) >= 1)
        np.testing.assert_array_equal(np.asarray(keep), ref_keep)
        np.testing.assert_allclose(np.asarray(adv), ref, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(float(metrics["centred_std"]), ref_sd, rtol=1e-5)
        assert np.all(np.isfinite(np.asarray(adv)))


def test_hand_values_batch_norm_after_filtering():
    # prompt 0: [1, -1, -1, -1] (mean -0.5), prompt 1: [1, 1] (zero variance), prompt 2: [1, -1].
    r = np.array([1.0, -1, -1, -1, 1, 1, 1, -1])
    pidx = np.array([0, 0, 0, 0, 1, 1, 2, 2])
    adv, keep, m = losses.group_advantages(r, pidx, num_prompts=3, norm="batch", ddof=0)
    centred = np.array([1.5, -0.5, -0.5, -0.5, 0, 0, 1, -1])
    kept = np.array([1, 1, 1, 1, 0, 0, 1, 1], bool)
    sd = np.sqrt((1.5**2 + 3 * 0.25 + 1 + 1) / 6)  # over the 6 kept rows (mean 0)
    np.testing.assert_array_equal(np.asarray(keep), kept)
    np.testing.assert_allclose(np.asarray(adv), np.where(kept, centred / (sd + 1e-6), 0), rtol=1e-6)
    assert float(m["zero_variance_groups"]) == 1 and float(m["kept_groups"]) == 2
    assert float(m["zero_variance_frac"]) == pytest.approx(1 / 3)
    # Before filtering (filter off) the two zeros of prompt 1 would enter: a smaller std.
    adv_all, keep_all, _ = losses.group_advantages(
        r, pidx, num_prompts=3, norm="batch", ddof=0, filter_zero_variance=False
    )
    sd_all = np.sqrt((1.5**2 + 3 * 0.25 + 1 + 1) / 8)
    assert bool(np.all(np.asarray(keep_all)))
    np.testing.assert_allclose(np.asarray(adv_all), centred / (sd_all + 1e-6), rtol=1e-6)


def test_batch_norm_is_std_of_centred_advantages_not_raw_rewards():
    # Pins the documented difference from TRL's scale_rewards='batch' (std of raw rewards).
    r = np.array([1.0, 1, 1, -1, -1, -1, -1, 1])
    pidx = np.array([0, 0, 0, 0, 1, 1, 1, 1])
    adv, _, _ = losses.group_advantages(r, pidx, num_prompts=2, norm="batch")
    centred = r - np.repeat([0.5, -0.5], 4)
    np.testing.assert_allclose(
        np.asarray(adv), centred / (np.std(centred, ddof=1) + 1e-6), rtol=1e-6
    )
    trl_style = centred / (np.std(r, ddof=1) + 1e-4)
    assert not np.allclose(np.asarray(adv), trl_style, rtol=1e-2)


@pytest.mark.fast
def test_group_norm_matches_grpo_formula():
    r = np.array([1.0, 0, 0, 1, 1, 1, 0, 1])
    pidx = np.array([0, 0, 0, 0, 1, 1, 1, 1])
    adv, _, _ = losses.group_advantages(r, pidx, num_prompts=2, norm="group", eps=1e-4)
    g = r.reshape(2, 4)
    expected = (g - g.mean(1, keepdims=True)) / (g.std(1, ddof=1, keepdims=True) + 1e-4)
    np.testing.assert_allclose(np.asarray(adv), expected.reshape(-1), rtol=1e-6)


def test_permutation_and_non_adjacent_rows_change_nothing():
    r, pidx, valid = batch(4)
    rng = np.random.default_rng(5)
    rows = rng.permutation(len(r))
    relabel = np.array([3, 1, 4, 0, 2])
    pidx2 = np.where(pidx >= 0, relabel[np.maximum(pidx, 0)], -1)[rows]
    for norm in losses.ADVANTAGE_NORMS:
        adv, keep, m = _jitted(norm, True, 1, 5)(r, pidx, valid=valid)
        adv2, keep2, m2 = _jitted(norm, True, 1, 5)(r[rows], pidx2, valid=valid[rows])
        np.testing.assert_allclose(np.asarray(adv2), np.asarray(adv)[rows], rtol=1e-6, atol=1e-7)
        np.testing.assert_array_equal(np.asarray(keep2), np.asarray(keep)[rows])
        assert float(m2["kept_rows"]) == float(m["kept_rows"])


def test_zero_variance_groups_and_group_mean():
    r = np.array([1.0, 1.0, 0.0, 1.0, 0.5, 0.5, 7.0])
    pidx = np.array([0, 0, 1, 1, 2, 2, 3])
    valid = np.array([1, 1, 1, 1, 1, 1, 0], bool)
    zv = losses.zero_variance_groups(r, pidx, num_prompts=5, valid=valid)
    # prompt 3 only has an invalid row and prompt 4 none: absent, not zero-variance.
    np.testing.assert_array_equal(np.asarray(zv), [True, False, True, False, False])
    np.testing.assert_allclose(
        np.asarray(losses.group_mean(r, pidx, num_prompts=5, valid=valid)),
        [1.0, 0.5, 0.5, 0.0, 0.0],
    )
    np.testing.assert_array_equal(
        np.asarray(losses.group_counts(pidx, num_prompts=5, valid=valid)), [2, 2, 2, 0, 0]
    )


@pytest.mark.fast
def test_all_invalid_is_finite_and_zero():
    r = np.array([1.0, -1.0, 1.0])
    adv, keep, m = losses.group_advantages(
        r, np.array([0, 0, 1]), num_prompts=2, valid=np.zeros(3, bool)
    )
    assert not np.any(np.asarray(adv)) and not np.any(np.asarray(keep))
    assert all(np.isfinite(float(v)) for v in m.values())


def test_overlong_and_length_penalty_hand_values():
    lengths = np.array([0, 6, 7, 8, 10, 11, 20])
    expected = np.array([0, 0, -0.25, -0.5, -1, -1, -1])  # max 10, cache 4: ramp over (6, 10]
    np.testing.assert_allclose(
        np.asarray(losses.overlong_penalty(lengths, max_length=10, cache_length=4)), expected
    )
    correct = np.array([1, 1, 0, 1, 0, 1, 0])
    np.testing.assert_allclose(
        np.asarray(losses.length_penalty(lengths, correct, max_length=10, cache_length=4)),
        expected * correct,
    )
    # The paper's constants: L_max = 14k (14336), L_cache = 2k.
    pen = losses.length_penalty(np.array([12288, 13312, 14336]), np.ones(3))
    np.testing.assert_allclose(np.asarray(pen), [0.0, -0.5, -1.0])


def test_bad_arguments_name_the_field():
    r, pidx = np.ones(4), np.zeros(4, int)
    with pytest.raises(ValueError, match="norm='std'"):
        losses.group_advantages(r, pidx, num_prompts=1, norm="std")
    with pytest.raises(ValueError, match="prompt_index must be"):
        losses.group_advantages(r, pidx[:3], num_prompts=1)
    with pytest.raises(ValueError, match="num_prompts=0"):
        losses.group_advantages(r, pidx, num_prompts=0)
    with pytest.raises(ValueError, match="cache_length=0"):
        losses.overlong_penalty(r, max_length=10, cache_length=0)


def test_advantages_feed_the_loss_with_dropped_groups():
    # End-to-end: dropping a zero-variance group via keep equals never having it in the batch.
    r = np.array([1.0, -1, 1, 1, -1, 1])
    pidx = np.array([0, 0, 1, 1, 2, 2])
    adv, keep, _ = losses.group_advantages(r, pidx, num_prompts=3)
    rng = np.random.default_rng(0)
    lp = rng.uniform(-2, -0.1, (6, 4))
    blp = lp + rng.normal(0, 0.1, (6, 4))
    mask = np.ones((6, 4))
    loss, m = losses.cispo_loss(
        lp, blp, adv, mask * np.asarray(keep)[:, None], pidx, num_prompts=3, aggregation="prompt"
    )
    sub = np.array([0, 1, 4, 5])
    adv_sub, _, _ = losses.group_advantages(r[sub], np.array([0, 0, 1, 1]), num_prompts=2)
    loss_sub, _ = losses.cispo_loss(
        lp[sub],
        blp[sub],
        adv_sub,
        mask[sub],
        np.array([0, 0, 1, 1]),
        num_prompts=2,
        aggregation="prompt",
    )
    np.testing.assert_allclose(float(loss), float(loss_sub), rtol=1e-6)
    assert float(m["prompts"]) == 2
