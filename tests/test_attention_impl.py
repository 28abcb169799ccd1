"""ModelConfig.attention_impl: the fused kernels' argument mapping against our XLA attention.

On CPU the fused kernels cannot run natively, so each is checked as far as CPU allows:
* cuDNN: `layers.dot_product_attention` passes our mask as `jax.nn.dot_product_attention`'s own
  arguments (is_causal + segment mask; key lengths for decode); the same call with
  implementation="xla" runs here and must equal `attend`. Lowering it for CUDA needs jax's CUDA
  plugin and cuDNN installed (jax checks the cuDNN version while tracing): tested where present.
* splash: the Pallas kernel runs in Pallas' interpreter (forward and gradients) and the real
  kernel is exported for TPU from this machine (Mosaic custom calls in the module).
* dispatch: which kernel each platform / shape / dtype resolves to, and the errors.
"""

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from scalerl_jax.config import ConfigError, ModelConfig
from scalerl_jax.models import layers, transformer
from scalerl_jax.models.layers import attend, resolve_attention_impl
from scalerl_jax.train.state import graphdef_of

B, H, KV, HD = 2, 4, 2, 32


def _qkv(t, s=None, dtype=jnp.float32, seed=0):
    ks = jax.random.split(jax.random.PRNGKey(seed), 3)
    s = t if s is None else s
    return (
        jax.random.normal(ks[0], (B, t, H, HD)).astype(dtype),
        jax.random.normal(ks[1], (B, s, KV, HD)).astype(dtype),
        jax.random.normal(ks[2], (B, s, KV, HD)).astype(dtype),
    )


def _segments(t):
    """Row 0: one sequence then padding; row 1: three packed sequences then padding."""
    seg = np.zeros((B, t), np.int32)
    seg[0, : t - 37] = 1
    seg[1, : t // 3] = 1
    seg[1, t // 3 : t // 2] = 2
    seg[1, t // 2 : t - 5] = 3
    return jnp.asarray(seg)


def _train_mask(seg):
    """Transformer.forward's training mask."""
    idx = jnp.arange(seg.shape[1])
    return (
        (idx[:, None] >= idx[None, :])[None]
        & (seg[:, :, None] == seg[:, None, :])
        & (seg[:, None, :] > 0)
    )


@pytest.mark.parametrize("chunk", [0, 32])
def test_training_mask_through_dot_product_attention_equals_ours(chunk):
    t = 128
    q, k, v = _qkv(t)
    seg = _segments(t)
    ours = jax.jit(lambda *a: attend(*a, _train_mask(seg), chunk))(q, k, v)
    theirs = jax.jit(lambda *a: layers.dot_product_attention(*a, seg, "xla"))(q, k, v)
    real = np.asarray(seg > 0)
    assert real.sum() < seg.size  # padding present; its outputs are unspecified
    np.testing.assert_allclose(np.asarray(theirs)[real], np.asarray(ours)[real], atol=1e-5)
    # The mask matters: without the segment mask packed rows would differ.
    plain = jax.jit(partial(jax.nn.dot_product_attention, is_causal=True))(q, k, v)
    assert (
        np.abs(
            np.asarray(plain)[1][np.asarray(seg[1] > 1)]
            - np.asarray(ours)[1][np.asarray(seg[1] > 1)]
        ).max()
        > 1e-2
    )


def test_decode_masks_are_key_lengths_and_causal():
    """Decode step (T=1): the mask `slot <= position` is cuDNN's key lengths = position + 1;
    a prefill from position 0 over a longer cache is top-left causal plus key lengths."""
    s = 96
    q, k, v = _qkv(1, s)
    pos = jnp.array([[5], [70]], jnp.int32)
    mask = jnp.arange(s)[None, None, :] <= pos[:, :, None]
    ours = jax.jit(attend)(q, k, v, mask)
    theirs = jax.jit(partial(jax.nn.dot_product_attention, implementation="xla"))(
        q, k, v, key_value_seq_lengths=pos[:, 0] + 1
    )
    np.testing.assert_allclose(np.asarray(theirs), np.asarray(ours), atol=1e-5)

    t = 40
    q, k, v = _qkv(t, s, seed=1)
    pos = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (B, t))
    mask = jnp.arange(s)[None, None, :] <= pos[:, :, None]
    ours = jax.jit(attend)(q, k, v, mask)
    theirs = jax.jit(partial(jax.nn.dot_product_attention, is_causal=True, implementation="xla"))(
        q, k, v, key_value_seq_lengths=jnp.full((B,), t, jnp.int32)
    )
    np.testing.assert_allclose(np.asarray(theirs), np.asarray(ours), atol=1e-5)


def test_splash_kernel_in_interpreter_equals_ours_with_gradients():
    t = 256  # two 128-blocks: the kernel's block skipping above the diagonal is exercised
    q, k, v = (x[1:] for x in _qkv(t))  # the packed row only: the interpreter is slow
    seg = _segments(t)[1:]
    mask = _train_mask(seg)
    real = np.asarray(seg > 0)
    weight = jax.random.normal(jax.random.PRNGKey(7), q.shape) * (seg > 0)[:, :, None, None]
    out = jax.jit(lambda *a: layers.splash_attention(*a, seg, interpret=True))(q, k, v)
    ref = jax.jit(lambda *a: attend(*a, mask, 64))(q, k, v)
    np.testing.assert_allclose(np.asarray(out)[real], np.asarray(ref)[real], atol=1e-5)

    def loss(fn):
        return lambda q, k, v: jnp.sum(fn(q, k, v) * weight)

    ours = jax.jit(jax.grad(loss(lambda q, k, v: attend(q, k, v, mask, 64)), (0, 1, 2)))(q, k, v)
    theirs = jax.jit(
        jax.grad(
            loss(lambda q, k, v: layers.splash_attention(q, k, v, seg, interpret=True)), (0, 1, 2)
        )
    )(q, k, v)
    for a, b in zip(theirs, ours):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-5, rtol=1e-5)


def test_splash_kernel_exports_for_tpu_with_its_backward():
    t = 256
    q, k, v = _qkv(t, dtype=jnp.bfloat16)
    seg = _segments(t)

    def loss(q, k, v):
        return jnp.sum(layers.splash_attention(q, k, v, seg).astype(jnp.float32))

    fwd = jax.export.export(jax.jit(loss), platforms=["tpu"])(q, k, v).mlir_module()
    bwd = jax.export.export(jax.jit(jax.grad(loss, (0, 1, 2))), platforms=["tpu"])(q, k, v)
    bwd = bwd.mlir_module()
    assert fwd.count("tpu_custom_call") == 1
    assert bwd.count("tpu_custom_call") == 3  # forward, dq and dkv kernels
    assert "splash" in fwd


def test_cudnn_path_lowers_for_cuda_where_jax_can_find_cudnn():
    """Cross-lowering from a CPU machine works once `jax-cuda12-plugin` and
    `nvidia-cudnn-cu12` are installed (no GPU needed); jax.export refuses cuDNN's custom calls
    (no compatibility guarantee), so this lowers with `lowering_platforms` instead."""
    from jax._src.lib import cuda_versions

    if cuda_versions is None:
        pytest.skip(
            "jax traces cuDNN attention only with its CUDA plugin and cuDNN installed "
            "(fused_attention_stablehlo.check_cudnn_version)"
        )
    t = 128
    q, k, v = _qkv(t, dtype=jnp.bfloat16)
    seg = _segments(t)

    def loss(q, k, v):
        return jnp.sum(layers.dot_product_attention(q, k, v, seg, "cudnn").astype(jnp.float32))

    fwd = jax.jit(loss).trace(q, k, v).lower(lowering_platforms=("cuda",)).as_text()
    bwd = (
        jax.jit(jax.grad(loss, (0, 1, 2)))
        .trace(q, k, v)
        .lower(lowering_platforms=("cuda",))
        .as_text()
    )
    assert "__cudnn$fmha" in fwd and "__cudnn$fmha" in bwd
    assert "Backward" in bwd  # cuDNN's own backward kernel, not an XLA fallback


@pytest.mark.parametrize(
    "impl,platform,dtype,hd,t,want",
    [
        ("auto", "cuda", "bfloat16", 128, 1024, "cudnn"),
        ("auto", "cuda", "float32", 128, 1024, "xla"),  # cuDNN: bf16/fp16 only
        ("auto", "cuda", "bfloat16", 100, 1024, "xla"),  # head_dim not a multiple of 8
        ("auto", "cuda", "bfloat16", 256, 1024, "xla"),  # > 128 without a Hopper GPU present
        ("auto", "tpu", "float32", 64, 1024, "splash"),
        ("auto", "tpu", "bfloat16", 128, 1000, "xla"),  # not a multiple of the 128 block
        ("auto", "cpu", "bfloat16", 128, 1024, "xla"),
        ("auto", "rocm", "bfloat16", 128, 1024, "xla"),
        ("xla", "tpu", "bfloat16", 128, 1024, "xla"),
        ("cudnn", "cuda", "float16", 64, 512, "cudnn"),
        ("splash", "tpu", "bfloat16", 128, 384, "splash"),
    ],
)
@pytest.mark.fast
def test_dispatch_per_platform(impl, platform, dtype, hd, t, want):
    assert resolve_attention_impl(impl, platform, head_dim=hd, dtype=dtype, seq_len=t) == want


@pytest.mark.parametrize(
    "impl,platform,dtype,hd,t,words",
    [
        ("cudnn", "cpu", "bfloat16", 128, 1024, ["'cudnn'", "'cpu'", "CUDA GPU"]),
        ("cudnn", "cuda", "float32", 128, 1024, ["float32", "bfloat16/float16"]),
        ("cudnn", "cuda", "bfloat16", 100, 1024, ["head_dim=100", "multiple of 8"]),
        ("splash", "cuda", "bfloat16", 128, 1024, ["'splash'", "'cuda'", "TPU"]),
        ("splash", "tpu", "bfloat16", 128, 1000, ["sequence length 1000", "divisible by 128"]),
    ],
)
def test_unrunnable_kernel_is_a_config_error(impl, platform, dtype, hd, t, words):
    with pytest.raises(ConfigError) as err:
        resolve_attention_impl(impl, platform, head_dim=hd, dtype=dtype, seq_len=t)
    for w in ["ModelConfig.attention_impl"] + words:
        assert w in str(err.value)


def _tiny(**kw):
    return ModelConfig(
        vocab_size=64,
        hidden_size=64,
        intermediate_size=128,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        **kw,
    )


def test_model_on_cpu_auto_is_xla_and_named_kernels_refuse():
    tokens = jax.random.randint(jax.random.PRNGKey(0), (B, 16), 0, 64)
    seg = _segments(16)
    params = jax.jit(lambda: nnx.state(transformer.create(_tiny())))()  # eager init is slow
    forward = jax.jit(lambda p, tok, s, g: nnx.merge(g, p)(tok, segment_ids=s), static_argnums=3)

    def run(impl):  # the same weights under each setting (the graphdef carries the config)
        return forward(params, tokens, seg, graphdef_of(_tiny(attention_impl=impl)))

    np.testing.assert_array_equal(np.asarray(run("auto")), np.asarray(run("xla")))
    for impl in ("cudnn", "splash"):
        with pytest.raises(ConfigError, match=f"attention_impl='{impl}' on platform 'cpu'"):
            run(impl)
        model = nnx.merge(graphdef_of(_tiny(attention_impl=impl)), params)
        # Decode always runs the XLA path, so the sampler works with any setting.
        cache = transformer.init_cache(model.cfg, B, 16)
        pos = jnp.zeros((B, 1), jnp.int32)
        jax.eval_shape(lambda tok: model.decode(tok, pos, cache), tokens[:, :1])


@pytest.mark.fast
def test_config_fields_are_validated():
    with pytest.raises(ConfigError, match="ModelConfig.attention_impl='flash'"):
        _tiny(attention_impl="flash")
    with pytest.raises(ConfigError, match="ModelConfig.remat_policy='everything'"):
        _tiny(remat=True, remat_policy="everything")
    with pytest.raises(ConfigError, match="ModelConfig.remat_policy='dots': needs remat=True"):
        _tiny(remat_policy="dots")


@pytest.mark.parametrize("shape", [(2, 2), (2, 4)])
def test_splash_kernel_runs_per_shard_under_a_mesh(shape):
    """Under `kernel_mesh` the kernel runs in a shard_map: rows over `data`, heads over
    `tensor` when both head counts divide (2 x 2), else whole heads per shard (KV=2 over
    tensor=4). Forward and gradients equal our XLA attention on the real tokens."""
    from jax.sharding import Mesh

    t = 256
    q, k, v = _qkv(t)
    seg = _segments(t)
    mask, real = _train_mask(seg), np.asarray(seg > 0)
    weight = jax.random.normal(jax.random.PRNGKey(7), q.shape) * (seg > 0)[:, :, None, None]
    mesh = Mesh(np.array(jax.devices()[: shape[0] * shape[1]]).reshape(shape), ("data", "tensor"))

    def splash(q, k, v):
        with layers.kernel_mesh(mesh):
            return layers.splash_attention(q, k, v, seg, interpret=True)

    jaxpr = str(jax.make_jaxpr(splash)(q, k, v))
    assert "shard_map" in jaxpr
    local_heads = H // shape[1] if KV % shape[1] == 0 else H
    assert f"f32[1,{local_heads},{t},{HD}]" in jaxpr  # one row's heads per shard

    def loss(fn):
        return lambda q, k, v: jnp.sum(fn(q, k, v) * weight)

    out = jax.jit(splash)(q, k, v)
    ref = jax.jit(lambda *a: attend(*a, mask, 64))(q, k, v)
    np.testing.assert_allclose(np.asarray(out)[real], np.asarray(ref)[real], atol=1e-5)
    ours = jax.jit(jax.grad(loss(lambda q, k, v: attend(q, k, v, mask, 64)), (0, 1, 2)))(q, k, v)
    theirs = jax.jit(jax.grad(loss(splash), (0, 1, 2)))(q, k, v)
    for a, b in zip(theirs, ours):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-5, rtol=1e-5)
