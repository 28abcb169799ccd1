"""ModelConfig.remat / remat_policy: the same loss and gradients as without remat, and each
policy really changes what the backward pass keeps."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from scalerl_jax.config import ModelConfig
from scalerl_jax.models import transformer
from scalerl_jax.train.state import graphdef_of

POLICIES = ("full", "dots", "dots_no_batch", "attn_out")
B, T, LAYERS = 2, 24, 2


def _cfg(**kw):
    # attention_chunk 8 < T: the chunked attention path is the one rematerialised.
    return ModelConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_layers=LAYERS,
        num_heads=4,
        num_kv_heads=2,
        attention_chunk=8,
        **kw,
    )


@pytest.fixture(scope="module")
def setup():
    params = jax.jit(lambda: nnx.state(transformer.create(_cfg(), seed=3)))()
    tokens = jax.random.randint(jax.random.PRNGKey(1), (B, T + 1), 0, 64)
    seg = np.ones((B, T), np.int32)
    seg[1, T // 2 :] = 2  # a packed row
    seg[0, T - 5 :] = 0  # padding
    return params, tokens, jnp.asarray(seg)


def _value_and_grad(cfg, setup):
    params, tokens, seg = setup
    return jax.jit(jax.value_and_grad(_loss(graphdef_of(cfg), tokens, seg)))(params)


@pytest.fixture(scope="module")
def no_remat(setup):
    return _value_and_grad(_cfg(), setup)


def _loss(graphdef, tokens, seg):
    def f(params):
        model = nnx.merge(graphdef, params)
        logits = model.logits(model(tokens[:, :-1], segment_ids=seg))
        logp = jax.nn.log_softmax(logits)
        picked = jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1)[..., 0]
        return -jnp.sum(picked * (seg > 0)) / jnp.sum(seg > 0)

    return f


def _residuals(cfg, setup):
    """Shapes of the arrays the VJP keeps from the forward pass (the parameters included)."""
    params, tokens, seg = setup
    f = _loss(graphdef_of(cfg), tokens, seg)
    return jax.eval_shape(lambda p: jax.tree.leaves(jax.vjp(f, p)[1]), params)


@pytest.mark.parametrize("policy", POLICIES)
def test_policy_gives_the_loss_and_gradients_of_no_remat(policy, setup, no_remat):
    loss0, grads0 = no_remat
    loss1, grads1 = _value_and_grad(_cfg(remat=True, remat_policy=policy), setup)
    np.testing.assert_allclose(float(loss1), float(loss0), rtol=1e-6)
    flat0, flat1 = jax.tree.leaves(grads0), jax.tree.leaves(grads1)
    assert len(flat0) == len(flat1) > 0
    for a, b in zip(flat1, flat0):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("scan", [True, False])
def test_policies_keep_what_they_say(setup, scan):
    count = {
        p: len(_residuals(_cfg(remat=True, remat_policy=p, scan_layers=scan), setup))
        for p in POLICIES
    }
    none = len(_residuals(_cfg(scan_layers=scan), setup))
    # Full remat keeps least; saving all matmuls more than saving the batch-free ones (the
    # weight projections); all keep less than no remat.
    assert count["full"] < count["dots_no_batch"] < count["dots"] < none
    # attn_out adds exactly the attention output of each layer, [B, T, H, hd], stacked over the
    # layers [L, B, T, H, hd] (scan_layers=False unrolls the same scan: still one array).
    full = _residuals(_cfg(remat=True, scan_layers=scan), setup)
    extra = _residuals(_cfg(remat=True, remat_policy="attn_out", scan_layers=scan), setup)
    shapes = [a.shape for a in extra]
    for a in full:
        shapes.remove(a.shape)
    assert shapes == [(LAYERS, B, T, 4, 8)]
