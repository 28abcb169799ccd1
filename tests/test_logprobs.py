"""Chunked log-probs and entropy: equal to the all-at-once computation, values and gradients,
and the chunked peak memory does not grow with T x V."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from scalerl_jax.train.logprobs import token_logprobs


def _inputs(b=2, t=37, d=16, v=50, seed=0, dtype=jnp.float32):
    k1, k2, k3 = jax.random.split(jax.random.PRNGKey(seed), 3)
    hidden = jax.random.normal(k1, (b, t, d), jnp.float32).astype(dtype)
    kernel = jax.random.normal(k2, (d, v), jnp.float32) * 0.5
    targets = jax.random.randint(k3, (b, t), 0, v)
    return hidden, kernel, targets


def _reference(hidden, kernel, targets):
    """Plain log_softmax over full fp32 logits: an independent formulation."""
    logits = hidden.astype(jnp.float32) @ kernel.astype(jnp.float32)
    logsm = jax.nn.log_softmax(logits, axis=-1)
    logp = jnp.take_along_axis(logsm, targets[..., None], axis=-1)[..., 0]
    entropy = -jnp.sum(jnp.exp(logsm) * logsm, axis=-1)
    return logp, entropy


@pytest.mark.fast
def test_unchunked_matches_log_softmax():
    hidden, kernel, targets = _inputs()
    logp, ent = token_logprobs(hidden, kernel, targets, chunk_size=None)
    ref_logp, ref_ent = _reference(hidden, kernel, targets)
    np.testing.assert_allclose(logp, ref_logp, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ent, ref_ent, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("chunk", [1, 8, 16, 37])  # 8, 16: T=37 is not a multiple (padding)
def test_chunked_equals_unchunked_values_and_gradients(chunk):
    hidden, kernel, targets = _inputs()
    w_lp = jax.random.normal(jax.random.PRNGKey(5), targets.shape)
    w_ent = jax.random.normal(jax.random.PRNGKey(6), targets.shape)

    def objective(h, k, chunk_size):
        lp, ent = token_logprobs(h, k, targets, chunk_size=chunk_size)
        return jnp.sum(w_lp * lp) + jnp.sum(w_ent * ent), (lp, ent)

    grad = jax.jit(jax.grad(objective, argnums=(0, 1), has_aux=True), static_argnums=2)
    (gh, gk), (lp, ent) = grad(hidden, kernel, chunk)
    (gh0, gk0), (lp0, ent0) = grad(hidden, kernel, None)
    np.testing.assert_allclose(lp, lp0, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ent, ent0, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(gh, gh0, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(gk, gk0, rtol=1e-5, atol=1e-5)
    assert float(jnp.abs(gk0).max()) > 0  # the comparison is not between two zero arrays


@pytest.mark.parametrize("chunk", [None, 8])
@pytest.mark.parametrize("with_entropy", [True, False])
def test_hand_written_backward_equals_autodiff_of_log_softmax(chunk, with_entropy):
    """The custom VJP (both the kept-logits and the recomputing path) against jax.grad of the
    independent log_softmax formulation, with large logits (scale 4) so that softmax is peaked."""
    hidden, kernel, targets = _inputs(t=21)
    kernel = kernel * 8.0
    w_lp = jax.random.normal(jax.random.PRNGKey(7), targets.shape)
    w_ent = jax.random.normal(jax.random.PRNGKey(8), targets.shape) if with_entropy else 0.0

    def ours(h, k):
        lp, ent = token_logprobs(h, k, targets, chunk_size=chunk, with_entropy=with_entropy)
        return jnp.sum(w_lp * lp) + (jnp.sum(w_ent * ent) if with_entropy else 0.0)

    def ref(h, k):
        lp, ent = _reference(h, k, targets)
        return jnp.sum(w_lp * lp) + jnp.sum(w_ent * ent)

    got = jax.grad(ours, argnums=(0, 1))(hidden, kernel)
    want = jax.grad(ref, argnums=(0, 1))(hidden, kernel)
    for g, w in zip(got, want):
        assert float(jnp.abs(w).max()) > 1e-2
        np.testing.assert_allclose(g, w, rtol=2e-4, atol=2e-4)


@pytest.mark.parametrize("chunk", [None, 8])
def test_temperature_is_softmax_of_scaled_logits_values_and_gradients(chunk):
    """At temperature tau: log_softmax(logits / tau) and its entropy, and the custom backward's
    gradients equal autodiff of that formulation (the 1 / tau in the cotangent)."""
    hidden, kernel, targets = _inputs(t=21)
    tau = 0.6
    w_lp = jax.random.normal(jax.random.PRNGKey(9), targets.shape)
    w_ent = jax.random.normal(jax.random.PRNGKey(10), targets.shape)

    def ours(h, k):
        lp, ent = token_logprobs(h, k, targets, chunk_size=chunk, temperature=tau)
        return jnp.sum(w_lp * lp) + jnp.sum(w_ent * ent), (lp, ent)

    def ref(h, k):
        lp, ent = _reference(h, k / tau, targets)
        return jnp.sum(w_lp * lp) + jnp.sum(w_ent * ent), (lp, ent)

    got, (lp, ent) = jax.grad(ours, argnums=(0, 1), has_aux=True)(hidden, kernel)
    want, (ref_lp, ref_ent) = jax.grad(ref, argnums=(0, 1), has_aux=True)(hidden, kernel)
    np.testing.assert_allclose(lp, ref_lp, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ent, ref_ent, rtol=1e-5, atol=1e-5)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=2e-4, atol=2e-4)
    untempered, _ = token_logprobs(hidden, kernel, targets, chunk_size=chunk)
    assert float(jnp.abs(lp - untempered).max()) > 0.1  # the temperature changed something


def test_temperature_matches_the_samplers_behaviour_logprob():
    """The sampler's log-prob of the token it drew at temperature tau (no top-k / top-p) is the
    trainer's log-prob of that token at tau: the ratio of a fresh sample is 1."""
    from scalerl_jax.sampler.sampling import sample

    hidden, kernel, _ = _inputs(b=1, t=64)
    logits = (hidden[0] @ kernel).astype(jnp.float32)  # 64 rows, one per decode slot
    keys = jax.random.split(jax.random.PRNGKey(3), 64)
    for tau in (0.7, 1.3):
        tokens, sampler_lp = sample(logits, keys, temperature=tau)
        trainer_lp, _ = token_logprobs(hidden, kernel, tokens[None], temperature=tau)
        np.testing.assert_allclose(trainer_lp[0], sampler_lp, rtol=1e-5, atol=1e-5)
        at_one, _ = token_logprobs(hidden, kernel, tokens[None])
        assert float(jnp.abs(at_one[0] - sampler_lp).max()) > 0.05


def test_fp32_head_from_bf16_hidden_and_bf16_head_ablation():
    hidden, kernel, targets = _inputs(dtype=jnp.bfloat16)
    logp, _ = token_logprobs(hidden, kernel, targets, chunk_size=8, fp32=True)
    ref, _ = _reference(hidden.astype(jnp.float32), kernel, targets)
    np.testing.assert_allclose(logp, ref, rtol=1e-5, atol=1e-5)
    # The bf16 head rounds operands and logits to bf16: close, but measurably different.
    logp16, _ = token_logprobs(hidden, kernel, targets, chunk_size=8, fp32=False)
    diff = float(jnp.abs(logp16 - ref).max())
    assert 1e-4 < diff < 0.5


def test_bad_shapes_are_named():
    hidden, kernel, targets = _inputs()
    with pytest.raises(ValueError, match="hidden size 16 != kernel rows 8"):
        token_logprobs(hidden, kernel[:8], targets)
    with pytest.raises(ValueError, match="targets"):
        token_logprobs(hidden, kernel, targets[:, :5])
    with pytest.raises(ValueError, match="temperature=0"):
        token_logprobs(hidden, kernel, targets, temperature=0)


def _temp_bytes(t, chunk, b=2, d=64, v=4096):
    def f(h, w, tg):
        lp, ent = token_logprobs(h, w, tg, chunk_size=chunk)
        return jnp.sum(lp) + 0.1 * jnp.sum(ent)

    args = (
        jax.ShapeDtypeStruct((b, t, d), jnp.float32),
        jax.ShapeDtypeStruct((d, v), jnp.float32),
        jax.ShapeDtypeStruct((b, t), jnp.int32),
    )
    compiled = jax.jit(jax.grad(f, argnums=(0, 1))).lower(*args).compile()
    return compiled.memory_analysis().temp_size_in_bytes


def test_chunked_peak_memory_does_not_grow_with_t_times_v():
    b, v = 2, 4096
    logits_growth = b * (1024 - 256) * v * 4  # one fp32 [B, T, V] buffer, T 256 -> 1024
    full_small, full_big = _temp_bytes(256, None), _temp_bytes(1024, None)
    chunk_small, chunk_big = _temp_bytes(256, 64), _temp_bytes(1024, 64)
    assert full_big - full_small >= logits_growth  # the unchunked path does hold [B, T, V]
    assert chunk_big - chunk_small < 0.1 * logits_growth
    assert chunk_big < full_big / 4
