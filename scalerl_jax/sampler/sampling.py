"""Token sampling for the decode step: temperature, top-k, top-p, one RNG key per slot.

`sample` returns each token with its fp32 log-prob under the distribution it was drawn from
(greedy and forced tokens report the untruncated one: docs/sampler.md, "Which log-prob"). A
token is drawn by inverse-CDF sampling with one uniform per row, in two levels of blocks,
instead of `jax.random.categorical`'s B x V Gumbel draws (~35% of a CPU decode step); why and
how: docs/sampler.md, "How a token is drawn". Pure functions of arrays with static Python
hyper-parameters: each setting is one compiled program.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp


def _truncate(scaled, top_p: float, top_k: int):
    """Mask (to -inf) every logit outside the top-k set and then outside the top-p nucleus of the
    renormalised top-k distribution (the order HF's warpers apply them). Works on a threshold
    value rather than a scatter of sorted indices: tokens tied with the last kept one are kept
    too, identically for sampling and for the log-prob."""
    vocab = scaled.shape[-1]
    if top_k and top_k < vocab:
        vals = jax.lax.top_k(scaled, top_k)[0]  # [B, k], descending
    elif top_p < 1.0:
        vals = -jnp.sort(-scaled, axis=-1)
    else:
        return scaled
    if top_p < 1.0:
        probs = jax.nn.softmax(vals, axis=-1)
        mass_before = jnp.cumsum(probs, axis=-1) - probs  # exclusive: the top token always stays
        n_keep = jnp.sum(mass_before < top_p, axis=-1, keepdims=True)
        threshold = jnp.take_along_axis(vals, n_keep - 1, axis=-1)
    else:
        threshold = vals[..., -1:]
    return jnp.where(scaled >= threshold, scaled, -jnp.inf)


def _block_size(vocab: int) -> int:
    """Power of two near sqrt(V): both levels of the search then cost ~sqrt(V) per row."""
    return 1 << max(0, math.ceil(math.log2(math.sqrt(vocab))))


def _first_exceeding(cum, weights, target):
    """Index of the first entry of `cum` (inclusive cumulative sums of `weights`, [B, N]) that is
    > target [B], clamped to the entries with weight > 0 (docs/sampler.md)."""
    n = cum.shape[-1]
    idx = jnp.sum(cum <= target[:, None], axis=-1)  # cum is non-decreasing: a count is a search
    pos = jnp.arange(n)
    nonzero = weights > 0
    first = jnp.min(jnp.where(nonzero, pos, n - 1), axis=-1)
    last = jnp.max(jnp.where(nonzero, pos, 0), axis=-1)
    return jnp.clip(idx, first, last)


def _inverse_cdf(masked, uniforms):
    """Draw one token per row of `masked` ([B, V] fp32 logits, -inf = excluded) given one
    U[0, 1) per row. Returns (tokens [B] int32, log normaliser [B] fp32: logsumexp(masked))."""
    b, v = masked.shape
    bs = _block_size(v)
    nb = -(-v // bs)
    top = jnp.max(masked, axis=-1)
    weights = jnp.exp(masked - top[:, None])  # unnormalised probabilities, max entry 1
    if nb * bs != v:
        weights = jnp.pad(weights, ((0, 0), (0, nb * bs - v)))  # padding has weight 0
    blocks = weights.reshape(b, nb, bs)
    block_mass = jnp.sum(blocks, axis=-1)  # [B, nb]
    block_cum = jnp.cumsum(block_mass, axis=-1)
    total = block_cum[:, -1]
    target = uniforms * total
    blk = _first_exceeding(block_cum, block_mass, target)
    inner = jnp.take_along_axis(blocks, blk[:, None, None], axis=1)[:, 0]  # [B, bs]
    before = jnp.take_along_axis(block_cum - block_mass, blk[:, None], axis=-1)[:, 0]
    idx = _first_exceeding(jnp.cumsum(inner, axis=-1), inner, target - before)
    return (blk * bs + idx).astype(jnp.int32), top + jnp.log(total)


def sample(logits, keys, *, temperature: float, top_p: float = 1.0, top_k: int = 0):
    """Draw one token per row.

    logits: [B, V] (computed in fp32); keys: [B, 2] uint32, one PRNG key per slot.
    Returns (tokens [B] int32, logprobs [B] fp32) -- see the module docstring for which log-prob.
    """
    logits = logits.astype(jnp.float32)
    if temperature == 0:
        tokens = jnp.argmax(logits, axis=-1).astype(jnp.int32)
        return tokens, _pick(jax.nn.log_softmax(logits, axis=-1), tokens)
    tokens, lp, _ = _draw(logits, keys, temperature, top_p, top_k)
    return tokens, lp


def _draw(logits, keys, temperature, top_p, top_k):
    """(tokens, log-probs, (tempered logits [B, V], their log normaliser under the truncation))
    for temperature > 0; logits are fp32."""
    scaled = logits if temperature == 1.0 else logits / jnp.float32(temperature)
    masked = _truncate(scaled, top_p, top_k)
    uniforms = jax.vmap(lambda k: jax.random.uniform(k, (), jnp.float32))(keys)
    tokens, log_norm = _inverse_cdf(masked, uniforms)
    return tokens, _pick(masked, tokens) - log_norm, (scaled, log_norm)


def sample_or_force(
    logits,
    keys,
    forced_tokens,
    is_forced,
    *,
    temperature: float,
    top_p: float = 1.0,
    top_k: int = 0,
):
    """One decode step's tokens: `forced_tokens` where `is_forced` ([B] bool), samples elsewhere.
    Log-probs as `sample` gives for sampled rows and as `token_logprob` for forced ones. When
    nothing truncates the distribution the two share one softmax instead of computing two."""
    logits = logits.astype(jnp.float32)
    if temperature != 0 and not (top_k and top_k < logits.shape[-1]) and top_p >= 1.0:
        # Untruncated: the sampled distribution IS the full tempered one, so a forced token's
        # log-prob is its tempered logit minus the same normaliser.
        tokens, lp, (scaled, log_norm) = _draw(logits, keys, temperature, top_p, top_k)
        forced_lp = _pick(scaled, forced_tokens) - log_norm
    else:
        tokens, lp = sample(logits, keys, temperature=temperature, top_p=top_p, top_k=top_k)
        forced_lp = token_logprob(logits, forced_tokens, temperature=temperature)
    return (
        jnp.where(is_forced, forced_tokens, tokens).astype(jnp.int32),
        jnp.where(is_forced, forced_lp, lp),
    )


def token_logprob(logits, tokens, *, temperature: float):
    """fp32 log-prob of given tokens under the tempered distribution over the full vocabulary
    (temperature 0 counts as 1). Used for forced tokens."""
    logits = logits.astype(jnp.float32)
    if temperature not in (0, 1.0):
        logits = logits / jnp.float32(temperature)
    return _pick(jax.nn.log_softmax(logits, axis=-1), tokens)


def _pick(logprobs, tokens):
    return jnp.take_along_axis(logprobs, tokens[:, None], axis=-1)[:, 0]
