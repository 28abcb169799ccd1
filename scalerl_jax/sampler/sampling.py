"""Token sampling for the decode step: temperature, top-k, top-p, one RNG key per slot.

Which log-prob is reported. RL needs the behaviour policy's probability of each token it actually
sampled, so `sample` returns the fp32 log-prob under the distribution it drew from: logits divided
by the temperature, restricted to the top-k / top-p set and renormalised over that set. With
temperature 1 and no top-k / top-p this is exactly `log_softmax(model.logits(h))`, the trainer's
log-prob of the same token. Two cases have no such distribution and report the untruncated one:
* temperature 0 (greedy) is a point mass (log-prob 0, useless for scoring), so greedy reports
  `log_softmax(logits)` at temperature 1;
* forced tokens (`token_logprob`) were not sampled and may lie outside the top-p set (log-prob
  -inf, which turns into NaN as soon as it is multiplied by a zero mask), so they report the
  tempered log-prob over the full vocabulary. The loss ignores forced tokens either way.

Pure functions of arrays; the static hyper-parameters are Python scalars, so each setting is one
compiled program.
"""
from __future__ import annotations

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


def sample(logits, keys, *, temperature: float, top_p: float = 1.0, top_k: int = 0):
    """Draw one token per row.

    logits: [B, V] (computed in fp32); keys: [B, 2] uint32, one PRNG key per slot.
    Returns (tokens [B] int32, logprobs [B] fp32) -- see the module docstring for which log-prob.
    """
    logits = logits.astype(jnp.float32)
    if temperature == 0:
        tokens = jnp.argmax(logits, axis=-1).astype(jnp.int32)
        return tokens, _pick(jax.nn.log_softmax(logits, axis=-1), tokens)
    scaled = logits if temperature == 1.0 else logits / jnp.float32(temperature)
    masked = _truncate(scaled, top_p, top_k)
    tokens = jax.vmap(jax.random.categorical)(keys, masked).astype(jnp.int32)
    return tokens, _pick(jax.nn.log_softmax(masked, axis=-1), tokens)


def token_logprob(logits, tokens, *, temperature: float):
    """fp32 log-prob of given tokens under the tempered distribution over the full vocabulary
    (temperature 0 counts as 1). Used for forced tokens."""
    logits = logits.astype(jnp.float32)
    if temperature not in (0, 1.0):
        logits = logits / jnp.float32(temperature)
    return _pick(jax.nn.log_softmax(logits, axis=-1), tokens)


def _pick(logprobs, tokens):
    return jnp.take_along_axis(logprobs, tokens[:, None], axis=-1)[:, 0]
