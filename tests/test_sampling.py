"""Inverse-CDF sampling: exact target distribution (chi-square), log-probs under the distribution
sampled, truncated tokens never drawn even at the extremes of the uniform, forced tokens."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from scalerl_jax.sampler import sampling

# 37 tokens: not a multiple of the block size (8), so the padded tail is exercised too.
VOCAB = 37
LOGITS = np.random.default_rng(0).normal(0.0, 1.5, VOCAB).astype(np.float32)


def target_probs(temperature, top_k, top_p):
    """The distribution the sampler must draw from, computed independently in float64 numpy:
    temperature, then top-k, then top-p over the renormalised top-k set."""
    z = LOGITS.astype(np.float64) / temperature
    order = np.argsort(-z, kind="stable")
    keep = np.zeros(VOCAB, bool)
    k = top_k if top_k else VOCAB
    keep[order[:k]] = True
    p = np.where(keep, np.exp(z - z.max()), 0.0)
    p /= p.sum()
    if top_p < 1.0:
        sorted_p = p[order]
        before = np.cumsum(sorted_p) - sorted_p
        nucleus = np.zeros(VOCAB, bool)
        nucleus[order[before < top_p]] = True
        p = np.where(nucleus, p, 0.0)
        p /= p.sum()
    return p


@pytest.mark.parametrize(
    "temperature,top_k,top_p", [(1.0, 0, 1.0), (0.7, 12, 1.0), (1.3, 0, 0.8), (1.0, 20, 0.9)]
)
def test_empirical_distribution_matches_target(temperature, top_k, top_p):
    n = 40_000
    logits = jnp.broadcast_to(jnp.asarray(LOGITS), (n, VOCAB))
    keys = jax.random.split(jax.random.PRNGKey(1234), n)
    tokens, lp = jax.jit(
        lambda lg, k: sampling.sample(lg, k, temperature=temperature, top_p=top_p, top_k=top_k)
    )(logits, keys)
    tokens, lp = np.asarray(tokens), np.asarray(lp)
    p = target_probs(temperature, top_k, top_p)
    counts = np.bincount(tokens, minlength=VOCAB)
    assert counts[p == 0].sum() == 0, "drew a token outside the top-k / top-p set"
    support = p > 0
    chi2, pval = stats.chisquare(counts[support], n * p[support])
    assert pval > 1e-3, f"chi2={chi2:.1f} over {support.sum()} tokens, p={pval:.2e}"
    # log-probs: log softmax of the processed (tempered, truncated, renormalised) logits
    np.testing.assert_allclose(lp, np.log(p[tokens]), atol=2e-6)


def test_logprobs_equal_log_softmax_of_processed_logits_at_sampled_ids():
    rng = np.random.default_rng(3)
    logits = jnp.asarray(rng.normal(0, 4, (64, 8192)), jnp.float32)  # the benchmark's vocab
    keys = jax.random.split(jax.random.PRNGKey(7), 64)
    for kw in (dict(temperature=1.0), dict(temperature=0.6, top_k=50, top_p=0.95)):
        tokens, lp = sampling.sample(logits, keys, **kw)
        processed = sampling._truncate(
            logits / kw["temperature"], kw.get("top_p", 1.0), kw.get("top_k", 0)
        )
        want = jnp.take_along_axis(jax.nn.log_softmax(processed, -1), tokens[:, None], -1)[:, 0]
        assert np.isfinite(np.asarray(lp)).all()
        np.testing.assert_allclose(lp, want, atol=1e-5)


def test_extreme_uniforms_never_pick_zero_probability_tokens():
    # Mass only in the middle of the vocabulary, across a block edge (block size 8 for 37 ids):
    # u = 0 must give the first allowed token, u = largest fp32 below 1 the last one.
    masked = np.full((2, VOCAB), -np.inf, np.float32)
    masked[:, 5:11] = np.log(np.array([1e-3, 0.2, 0.3, 0.2, 0.1, 0.05], np.float32))
    u = jnp.array([0.0, np.nextafter(np.float32(1), np.float32(0))], jnp.float32)
    tokens, log_norm = sampling._inverse_cdf(jnp.asarray(masked), u)
    assert np.asarray(tokens).tolist() == [5, 10]
    np.testing.assert_allclose(log_norm, np.log(0.851), rtol=1e-6)


@pytest.mark.fast
def test_search_is_clamped_to_nonzero_weights_when_rounding_overshoots():
    # fp32 rounding between the two levels can put the target just outside [0, total): the pick
    # must still be a token of non-zero weight, the nearest one.
    w = jnp.array([[0.0, 0.0, 0.5, 0.25, 0.0, 0.0]] * 3, jnp.float32)
    cum = jnp.cumsum(w, axis=-1)
    target = jnp.array([-1e-7, 0.6, 0.75 + 1e-7], jnp.float32)
    assert np.asarray(sampling._first_exceeding(cum, w, target)).tolist() == [2, 3, 3]


def test_sample_or_force_matches_sample_and_token_logprob():
    rng = np.random.default_rng(5)
    logits = jnp.asarray(rng.normal(0, 2, (6, 100)), jnp.float32)
    keys = jax.random.split(jax.random.PRNGKey(0), 6)
    head = jnp.array([3, 99, 0, 7, 50, 1], jnp.int32)
    is_forced = jnp.array([True, False, True, False, False, True])
    for kw in (
        dict(temperature=1.0),
        dict(temperature=1.7),
        dict(temperature=1.0, top_p=0.5),
        dict(temperature=0.0),
    ):
        out, lp = sampling.sample_or_force(logits, keys, head, is_forced, **kw)
        s_tok, s_lp = sampling.sample(logits, keys, **kw)
        f_lp = sampling.token_logprob(logits, head, temperature=kw["temperature"])
        f = np.asarray(is_forced)
        np.testing.assert_array_equal(np.asarray(out), np.where(f, head, s_tok))
        np.testing.assert_allclose(lp, np.where(f, f_lp, s_lp), atol=1e-5)


def test_same_key_same_token_whatever_the_batch():
    # A sample's token depends only on its own key and logits (continuous batching reproducibility).
    rng = np.random.default_rng(9)
    logits = jnp.asarray(rng.normal(0, 2, (8, 300)), jnp.float32)
    keys = jax.random.split(jax.random.PRNGKey(2), 8)
    full, _ = sampling.sample(logits, keys, temperature=1.0)
    part, _ = sampling.sample(logits[3:5], keys[3:5], temperature=1.0)
    np.testing.assert_array_equal(np.asarray(full)[3:5], np.asarray(part))
