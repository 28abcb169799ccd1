"""The scanned decoder layers (models/transformer.py): the period grouping, the scan against an
unrolled Python loop over the same stacked weights (dense, MoE interleave, Llama-4 NoPE and
chunked local layers), program size flat in depth, an old per-layer checkpoint refused
with a clear error, and the sampler's generate program updating the stacked cache in place."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from scalerl_jax import checkpoint as ckpt
from scalerl_jax.models import presets, transformer
from scalerl_jax.models.transformer import (
    KVCache,
    init_cache,
    layer_kind,
    layer_params,
    layer_period,
    layer_position,
)


# Llama-4 Scout's pattern: MoE every 2nd layer, NoPE (global) every 4th, the rest chunked local.
LLAMA4 = dict(num_layers=8, moe_layer_step=2, dense_layers=(), nope_layers=(3, 7))


@pytest.mark.parametrize(
    "name, overrides, period",
    [
        ("tiny-qwen2", dict(num_layers=6), 1),  # dense: every layer alike
        ("tiny-qwen3-moe", dict(num_layers=6, moe_layer_step=2, dense_layers=()), 2),
        ("tiny-llama4", LLAMA4, 4),
        ("tiny-qwen3-moe", dict(num_layers=6, moe_layer_step=1, dense_layers=(0,)), 6),
        # MoE every 2nd layer, but 2 does not divide 5: one unrolled group
        ("tiny-qwen3-moe", dict(num_layers=5, moe_layer_step=2, dense_layers=()), 5),
    ],
)
def test_layer_period(name, overrides, period):
    cfg = presets.get(name, **overrides)
    assert layer_period(cfg) == period
    for i in range(cfg.num_layers):
        j, g = layer_position(cfg, i)
        assert i == g * period + j and layer_kind(cfg, i) == layer_kind(cfg, j)


def _model(name, **overrides):
    cfg = presets.get(name, **overrides)
    model = transformer.create(cfg, seed=1)
    graphdef, params = nnx.split(model)
    return cfg, graphdef, params


def _reference(cfg, graphdef, params, tokens, positions, cache=None):
    """The decoder as a Python loop over layers, each Block rebuilt from its row of the
    stacked params (no scan): hidden states, the MoE stats in layer order, the cache."""
    model = nnx.merge(graphdef, params)
    if cache is None:
        t = tokens.shape[1]
        seg = jnp.ones(tokens.shape, jnp.int32)
        mask = jnp.broadcast_to(jnp.tril(jnp.ones((t, t), bool)), (tokens.shape[0], t, t))
        local = transformer._local_mask(cfg, mask, positions, positions)
    else:
        slots = jnp.arange(cache.v.shape[transformer.VALUE_SEQ_AXIS])[None]
        mask = slots[:, None, :] <= positions[:, :, None]
        local = transformer._local_mask(cfg, mask, positions, slots)
        kv = (cache.k, cache.v)
    x = model._embed(tokens)
    stats = []
    for i in range(cfg.num_layers):
        j, _ = layer_position(cfg, i)
        block = nnx.merge(nnx.graphdef(model.layers[j]), layer_params(params, cfg, i))
        m = local if block.local_attention else mask
        if cache is None:
            x, _, st = block(x, positions, m, valid=seg > 0)
            stats.append(st)
        else:
            x, kv, _ = block(x, positions, m, kv, layer=i)
    out = model.final_norm(x)
    if cache is not None:
        return out, KVCache(*kv)
    stats = [s for s in stats if s is not None]
    return out, (transformer.RouterStats(*map(jnp.stack, zip(*stats))) if stats else None)


@pytest.mark.parametrize(
    "name, overrides",
    [
        ("tiny-qwen2", dict(num_layers=3)),
        # dense / MoE interleave, P = 2
        ("tiny-qwen3-moe", dict(num_layers=4, moe_layer_step=2, dense_layers=())),
        ("tiny-qwen3-moe", dict(num_layers=3)),  # MoE, dense, MoE: no period, P = 3
        ("tiny-llama4", dict(LLAMA4, local_attention_chunk=4)),
    ],
)
def test_scan_equals_an_unrolled_loop_over_the_same_weights(name, overrides):
    cfg, graphdef, params = _model(name, **overrides)
    b, t = 2, 11
    tokens = jax.random.randint(jax.random.key(0), (b, t), 0, cfg.vocab_size)
    positions = jnp.broadcast_to(jnp.arange(t), (b, t))
    model = nnx.merge(graphdef, params)
    want, want_stats = _reference(cfg, graphdef, params, tokens, positions)
    for c in (cfg, cfg.replace(remat=True, remat_policy="dots")):
        remat_graphdef = nnx.graphdef(nnx.eval_shape(lambda c=c: transformer.create(c)))
        got, stats = nnx.merge(remat_graphdef, params).forward(tokens, positions)
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=2e-5, rtol=1e-5)
        if want_stats is None:
            assert stats is None
        else:  # the router statistics in layer order
            for a, w in zip(stats, want_stats):
                np.testing.assert_allclose(np.asarray(a), np.asarray(w), atol=1e-6)
    # Prefill 7 tokens, then one decode step: the stacked cache as the loop leaves it.
    cache = init_cache(cfg, b, 16)
    h1, c1 = model.decode(tokens[:, :7], positions[:, :7], cache)
    r1, rc1 = _reference(cfg, graphdef, params, tokens[:, :7], positions[:, :7], cache)
    h2, c2 = model.decode(tokens[:, 7:8], positions[:, 7:8], c1)
    r2, rc2 = _reference(cfg, graphdef, params, tokens[:, 7:8], positions[:, 7:8], rc1)
    for got, want in ((h1, r1), (h2, r2), (c2.k, rc2.k), (c2.v, rc2.v)):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=2e-5, rtol=1e-5)
    assert c2.k.shape == (cfg.num_layers, b, cfg.num_kv_heads, cfg.dim_per_head, 16)


def test_stacked_params_carry_the_layer_axis():
    cfg, _, params = _model("tiny-qwen3-moe", num_layers=4, moe_layer_step=2, dense_layers=())
    q = params["layers"][1]["attn"]["q"]
    assert q.get_value().shape == (2, cfg.hidden_size, cfg.num_heads, cfg.dim_per_head)
    assert q.get_metadata()["logical_axes"] == ("layers", "embed", "heads", "head_dim")
    # layer 3 is row 1 of position 1
    np.testing.assert_array_equal(
        np.asarray(layer_params(params, cfg, 3)["attn"]["q"].get_value()),
        np.asarray(q.get_value()[1]),
    )


def _lowered_chars(cfg) -> tuple[int, int]:
    """Text sizes of the lowered random init and of a forward+backward."""
    init = jax.jit(lambda k: nnx.state(transformer.Transformer(cfg, nnx.Rngs(params=k))))
    graphdef, params = nnx.split(nnx.eval_shape(lambda: transformer.create(cfg)))
    tokens = jax.ShapeDtypeStruct((2, 16), jnp.int32)

    def loss(p, tok):
        return jnp.sum(nnx.merge(graphdef, p)(tok))

    step = jax.jit(jax.grad(loss))
    return (
        len(init.lower(jax.random.key(0)).as_text()),
        len(step.lower(params, tokens).as_text()),
    )


@pytest.mark.parametrize("name, period", [("tiny-qwen2", 1), ("tiny-llama4", 4)])
def test_program_size_is_flat_in_depth(name, period):
    """2 vs 8 periods of layers: the scanned programs keep their size; unrolled they grow
    (which is what the check would catch if the layers unrolled)."""

    def cfg(groups, **kw):
        n = groups * period
        nope = dict(nope_layers=tuple(range(3, n, 4)), moe_layer_step=2, dense_layers=())
        return presets.get(name, remat=True, num_layers=n, **(nope if period > 1 else {}), **kw)

    shallow, deep = _lowered_chars(cfg(2)), _lowered_chars(cfg(8))
    for a, b in zip(shallow, deep):
        assert b <= 1.05 * a, (a, b)
    unrolled = _lowered_chars(cfg(8, scan_layers=False))[1]
    # What 6 periods more add to the train program: unrolled, each layer's ops; scanned, a
    # tenth of that at most.
    assert deep[1] - shallow[1] < (unrolled - shallow[1]) / 10, (shallow[1], deep[1], unrolled)


def test_per_layer_checkpoint_is_refused_with_a_clear_error(tmp_path):
    """A checkpoint of the per-layer layout (params/layers/<i>/..., unstacked) is refused
    before Orbax reads it, naming the layout, and nothing is moved aside."""
    cfg = presets.get("tiny-qwen2")
    _, params = nnx.split(transformer.create(cfg))
    old = {
        "params": {
            "layers": {
                str(i): jax.tree.map(lambda x, i=i: np.asarray(x[i]), params["layers"][0])
                for i in range(cfg.num_layers)
            }
        }
    }
    c = ckpt.Checkpointer(str(tmp_path), save_every=1, keep=2, async_save=False)
    c.save(1, old, {"step": 1})
    c.wait()
    new = {"params": {"layers": {"0": params["layers"][0]}}}
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), new)
    with pytest.raises(ckpt.CheckpointError, match="stacked along a leading layer axis"):
        c.restore(abstract)
    assert c.all_steps() == [1]


@pytest.mark.parametrize("scan", [True, False])
def test_generate_updates_the_stacked_cache_in_place(scan):
    """The sampler's generate program (decode steps over the layer scan) writes each new token
    into the carried stacked cache in place: XLA's temporaries stay below a fraction of the KV
    cache. A cache write whose layout XLA would rather change (a vmap of dynamic_update_slice
    over rows) copies the whole stacked cache: temporaries > 1x the cache bytes."""
    from jax.sharding import Mesh

    from scalerl_jax.config import SamplerConfig
    from scalerl_jax.sampler.engine import Engine

    cfg = presets.get("tiny-qwen3", num_layers=8, scan_layers=scan)
    mesh = Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("data", "tensor"))
    sampler = SamplerConfig(
        max_concurrent_decodes=8,
        max_prefill_length=16,
        max_target_length=512,
        max_new_tokens=64,
        interruptions=False,
        decode_steps_per_call=4,
    )
    eng = Engine(cfg, mesh, sampler)
    leaves = [
        jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s)
        for a, s in zip(jax.tree.leaves(eng.abstract_params), jax.tree.leaves(eng.param_shardings))
    ]
    state = jax.tree.map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
        jax.eval_shape(eng._init),
        eng.state_shardings,
    )
    compiled = eng._generate.lower(leaves, state, eng.max_target_length).compile()
    temp = compiled.memory_analysis().temp_size_in_bytes
    cache = sum(x.size * x.dtype.itemsize for x in state.cache)
    # In place: about one layer's keys and values (1/8 of the cache) plus the step's small
    # tensors; a copy of the stacked cache alone is 1x.
    assert temp < 0.4 * cache, (temp, cache)
