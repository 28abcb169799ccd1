"""The decoder: KV-cache decode == full forward, sharded == unsharded, masks, dtypes, config."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from scalerl_jax import mesh as mesh_lib
from scalerl_jax.config import ConfigError, MeshConfig, ModelConfig
from scalerl_jax.models import layers, presets, transformer

TINY = ["tiny-llama", "tiny-qwen2", "tiny-qwen3"]
# Jitted throughout: eager mode compiles every primitive separately, which is slower here.
fwd = jax.jit(transformer.forward_logits, static_argnums=0)


def _random_model(name, seed=0, **overrides):
    """(cfg, graphdef, params) for a tiny preset, with random norms and biases too (the init
    gives ones / zeros, which would hide layout mistakes). Drawn with numpy: compiling jax's
    threefry costs ~1 s per parameter shape on this CPU."""
    cfg = presets.get(name, **overrides)
    graphdef, params = nnx.split(
        nnx.eval_shape(lambda: transformer.Transformer(cfg, nnx.Rngs(params=0)))
    )
    rng = np.random.RandomState(seed)
    for path, v in nnx.to_flat_state(params):
        shape, dtype = v.get_value().shape, v.get_value().dtype
        x = (1.0 if path[-1] == "scale" else 0.0) + 0.1 * rng.standard_normal(shape)
        v.set_value(jnp.asarray(x, dtype))
    return cfg, graphdef, params


@pytest.mark.parametrize("name", TINY)
def test_decode_reproduces_full_forward_position_by_position(name):
    cfg, graphdef, params = _random_model(name)
    lengths, steps, prompt_len, cache_len = np.array([8, 5, 2]), 6, 8, 24
    rng = np.random.RandomState(0)
    seqs = rng.randint(0, cfg.vocab_size, (3, prompt_len + steps))
    total = lengths + steps
    seg = (np.arange(seqs.shape[1])[None] < total[:, None]).astype(np.int32)
    ref = np.asarray(fwd(graphdef, params, jnp.asarray(seqs), None, jnp.asarray(seg)))

    @jax.jit
    def decode(params, tokens, positions, cache):
        model = nnx.merge(graphdef, params)
        hidden, cache = model.decode(tokens, positions, cache)
        return model.logits(hidden), cache

    cache = transformer.init_cache(cfg, 3, cache_len)
    prompt = np.where(np.arange(prompt_len)[None] < lengths[:, None], seqs[:, :prompt_len], 0)
    positions = np.broadcast_to(np.arange(prompt_len), (3, prompt_len))
    got, cache = decode(params, jnp.asarray(prompt), jnp.asarray(positions), cache)
    got = np.asarray(got)
    for i, n in enumerate(lengths):
        np.testing.assert_allclose(got[i, :n], ref[i, :n], atol=2e-5, rtol=0)
    for s in range(steps):  # one token per row; rows sit at different positions
        pos = lengths + s
        tok = seqs[np.arange(3), pos]
        got, cache = decode(params, jnp.asarray(tok[:, None]), jnp.asarray(pos[:, None]), cache)
        got = np.asarray(got)[:, 0]
        np.testing.assert_allclose(got, ref[np.arange(3), pos], atol=2e-5, rtol=0)


def test_sharded_equals_unsharded_and_params_are_sharded():
    cfg = presets.get("tiny-qwen3")
    mesh = mesh_lib.trainer_mesh(MeshConfig(fsdp=4, tensor=2), jax.devices())
    graphdef, sharded = transformer.create_sharded(cfg, mesh, seed=3)
    gate = sharded["layers"][0]["mlp"]["gate"].get_value()  # stacked: [layers, D, F]
    assert gate.sharding.spec == jax.sharding.PartitionSpec(None, "fsdp", "tensor")
    # [L, 64, 128] over fsdp=4, tensor=2; the layer axis is replicated
    assert gate.addressable_shards[0].data.shape == (cfg.num_layers, 16, 64)
    assert len(gate.sharding.device_set) == 8
    one = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    plain = jax.tree.map(lambda x: jax.device_put(np.asarray(x), one), sharded)
    assert plain["layers"][0]["mlp"]["gate"].get_value().sharding == one

    tokens = np.random.RandomState(1).randint(0, cfg.vocab_size, (4, 16))
    seg = jnp.asarray((np.arange(16)[None] < np.array([16, 9, 4, 12])[:, None]).astype(np.int32))
    tokens_sh = jax.device_put(tokens, mesh_lib.named(mesh, "batch", "seq"))
    assert tokens_sh.sharding.spec == jax.sharding.PartitionSpec("fsdp", None)
    out_sharded = fwd(graphdef, sharded, tokens_sh, None, seg)
    out_plain = fwd(graphdef, plain, jnp.asarray(tokens), None, seg)
    assert len(out_sharded.sharding.device_set) == 8
    np.testing.assert_allclose(np.asarray(out_sharded), np.asarray(out_plain), atol=1e-5, rtol=0)


def test_padding_and_packing_do_not_leak_between_sequences():
    cfg, graphdef, params = _random_model("tiny-llama")
    rng = np.random.RandomState(2)
    a, b = rng.randint(0, cfg.vocab_size, 7), rng.randint(0, cfg.vocab_size, 5)
    # b alone; b right-padded with junk; a and b packed in one row (positions restart)
    tokens = np.stack(
        [
            np.concatenate([b, np.zeros(7, int)]),
            np.concatenate([b, rng.randint(0, cfg.vocab_size, 7)]),
            np.concatenate([a, b]),
        ]
    )
    seg = np.array([[1] * 5 + [0] * 7, [1] * 5 + [0] * 7, [1] * 7 + [2] * 5])
    pos = np.stack([np.arange(12), np.arange(12), np.r_[np.arange(7), np.arange(5)]])
    got = np.asarray(fwd(graphdef, params, jnp.asarray(tokens), jnp.asarray(pos), jnp.asarray(seg)))
    alone_a = np.asarray(fwd(graphdef, params, jnp.asarray(a[None]), None, None))[0]
    np.testing.assert_allclose(got[1, :5], got[0, :5], atol=2e-5, rtol=0)
    np.testing.assert_allclose(got[2, 7:], got[0, :5], atol=2e-5, rtol=0)
    np.testing.assert_allclose(got[2, :7], alone_a, atol=2e-5, rtol=0)


def test_chunked_causal_attention_equals_one_block():
    cfg, graphdef, params = _random_model("tiny-qwen3", attention_chunk=0)
    rng = np.random.RandomState(5)
    tokens = jnp.asarray(rng.randint(0, cfg.vocab_size, (2, 40)))
    seg = np.ones((2, 40), np.int32)
    seg[0, 31:] = 0  # padding
    seg[1, 17:] = 2  # two packed sequences
    pos = jnp.asarray(np.where(seg == 2, np.arange(40) - 17, np.arange(40)))
    ref = np.asarray(fwd(graphdef, params, tokens, pos, jnp.asarray(seg)))
    for chunk in (1, 16):  # 1: capped to ceil(40 / 16) = 3 per chunk, ragged last chunk
        chunked = _random_model("tiny-qwen3", attention_chunk=chunk)[1]
        got = np.asarray(fwd(chunked, params, tokens, pos, jnp.asarray(seg)))
        np.testing.assert_allclose(got[seg > 0], ref[seg > 0], atol=2e-5, rtol=0)


def test_bf16_compute_is_close_to_fp32_and_head_stays_fp32():
    cfg, graphdef, params = _random_model("tiny-qwen2")
    tokens = jnp.asarray(np.random.RandomState(3).randint(0, cfg.vocab_size, (2, 24)))
    ref = fwd(graphdef, params, tokens, None, None)
    for overrides in (
        dict(compute_dtype="bfloat16"),
        dict(compute_dtype="bfloat16", param_dtype="bfloat16", fp32_head=False),
    ):
        bcfg, bgraph, bstate = _random_model("tiny-qwen2", **overrides)
        bparams = jax.tree.map(lambda x, y: x.astype(y.dtype), params, bstate)
        out = fwd(bgraph, bparams, tokens, None, None)
        assert out.dtype == (jnp.float32 if bcfg.fp32_head else jnp.bfloat16)
        err = float(jnp.abs(out.astype(jnp.float32) - ref).max() / jnp.abs(ref).max())
        assert 0 < err < 0.05, (overrides, err)


@pytest.mark.parametrize("contract", [1, 2])
def test_bf16_dense_on_cpu_is_one_rounding_of_exact_products_with_row_major_dots(contract):
    """bf16 `layers.dense` on CPU (its `_dense_rows` path): the output and both gradients
    are the exact products rounded once to bf16, and every dot of the backward contracts the
    last axis of a row-major left operand with the first of the right one into fp32, never a
    transpose fed straight to a dot (XLA would fold it back into a slow kind of dot)."""
    assert jax.default_backend() == "cpu"
    rng = np.random.default_rng(contract)
    ins = (6, 4) if contract == 2 else (24,)
    x = jnp.asarray(rng.normal(size=(2, 5, *ins)), jnp.bfloat16)
    w = jnp.asarray(rng.normal(size=(*ins, 7)), jnp.bfloat16)
    g = jnp.asarray(rng.normal(size=(2, 5, 7)), jnp.bfloat16)

    def vjp(x, w, g):
        y, pullback = jax.vjp(lambda a, b: layers.dense(a, b, contract), x, w)
        return (y, *pullback(g))

    got = jax.jit(vjp)(x, w, g)
    x2, w2, g2 = (np.asarray(a, np.float64) for a in (x, w, g))
    x2, w2, g2 = x2.reshape(10, 24), w2.reshape(24, 7), g2.reshape(10, 7)
    for name, a, ref in zip(("out", "dx", "dw"), got, (x2 @ w2, g2 @ w2.T, x2.T @ g2)):
        assert a.dtype == jnp.bfloat16, name
        np.testing.assert_allclose(
            np.asarray(a, np.float64).reshape(ref.shape), ref, rtol=2.0**-8, atol=1e-5, err_msg=name
        )

    dots, fed_by_transpose = [], []

    def walk(jaxpr):
        made_by = {}
        for eqn in jaxpr.eqns:
            if eqn.primitive.name == "dot_general":
                dots.append(
                    (
                        eqn.params["dimension_numbers"],
                        eqn.params["preferred_element_type"],
                        eqn.invars[0].aval.ndim,
                    )
                )
                fed_by_transpose.extend(made_by.get(v) == "transpose" for v in eqn.invars)
            for v in eqn.outvars:
                made_by[v] = eqn.primitive.name
            for p in eqn.params.values():
                for sub in p if isinstance(p, (tuple, list)) else (p,):
                    if hasattr(sub, "eqns") or hasattr(sub, "jaxpr"):
                        walk(getattr(sub, "jaxpr", sub))

    walk(jax.make_jaxpr(vjp)(x, w, g).jaxpr)
    assert len(dots) == 3, dots
    for (contracting, batch), out_dtype, lhs_ndim in dots:
        assert contracting == ((lhs_ndim - 1,), (0,)) and batch == ((), ()), contracting
        assert out_dtype == jnp.float32
    assert not any(fed_by_transpose)


def test_remat_gives_the_same_gradients():
    cfg, graphdef, params = _random_model("tiny-qwen3", num_layers=1)
    remat_graph = _random_model("tiny-qwen3", num_layers=1, remat=True)[1]
    tokens = jnp.asarray(np.random.RandomState(4).randint(0, cfg.vocab_size, (2, 16)))

    @functools.partial(jax.jit, static_argnums=1)
    @functools.partial(jax.grad)
    def grad(p, g):
        return jnp.mean(transformer.forward_logits(g, p, tokens) ** 2)

    g1, g2 = grad(params, graphdef), grad(params, remat_graph)
    for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g2)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6, rtol=1e-5)


def test_tied_head_is_the_embedding():
    cfg, graphdef, params = _random_model("tiny-qwen2")
    model = nnx.merge(graphdef, params)
    assert "lm_head" not in params
    np.testing.assert_array_equal(
        np.asarray(model.head_kernel()), np.asarray(params["embed"].get_value()).T
    )


def test_flops_per_token_matches_xla_count():
    cfg, graphdef, params = _random_model(
        # Unrolled: XLA's cost analysis counts a scanned loop's body once.
        "tiny-llama",
        vocab_size=512,
        hidden_size=128,
        intermediate_size=384,
        scan_layers=False,
    )
    b, t = 2, 64
    tokens = jnp.zeros((b, t), jnp.int32)
    compiled = (
        jax.jit(lambda p: transformer.forward_logits(graphdef, p, tokens)).lower(params).compile()
    )
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    # XLA computes the full T x T scores; the model count takes the causal half.
    full_attn = 2 * cfg.num_layers * cfg.num_heads * cfg.dim_per_head * t
    want = transformer.num_flops_per_token(cfg, t, training=False) + full_attn
    got = cost["flops"] / (b * t)
    assert want <= got <= 1.15 * want, (got, want)  # XLA also counts norms, softmax, rope
    assert transformer.num_flops_per_token(cfg, t) == 3 * transformer.num_flops_per_token(
        cfg, t, training=False
    )


def test_presets_have_published_parameter_counts():
    assert presets.get("qwen2.5-0.5b").num_params() == 494_032_768
    assert presets.get("llama-3.1-8b").num_params() == 8_030_261_248
    assert presets.get("qwen3-8b").num_params() == 8_190_735_360
    with pytest.raises(KeyError, match="unknown model preset 'gpt-5'"):
        presets.get("gpt-5")


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(num_kv_heads=3), r"ModelConfig.num_kv_heads=3: must divide num_heads=4"),
        (dict(hidden_size=66), r"ModelConfig.hidden_size=66: must be divisible by num_heads=4"),
        (dict(head_dim=15), r"ModelConfig.head_dim=15: must be even"),
        (dict(param_dtype="fp8"), r"ModelConfig.param_dtype='fp8': must be one of"),
        (dict(vocab_size=0), r"ModelConfig.vocab_size=0: must be > 0"),
        (dict(attention_chunk=-1), r"ModelConfig.attention_chunk=-1: must be >= 0"),
    ],
)
@pytest.mark.fast
def test_model_config_errors_name_the_field(kw, match):
    base = dict(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
    )
    with pytest.raises(ConfigError, match=match):
        ModelConfig(**{**base, **kw})
