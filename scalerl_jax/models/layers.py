"""Decoder building blocks: RMSNorm, RoPE (with Llama-3 scaling), GQA attention, SwiGLU MLP
(the decoder block that joins them, dense or MoE, is in transformer.py).

Weights are stored in the layout the einsums use ([in, ..., out]) and every parameter carries
`logical_axes` metadata that `mesh.RULES` maps to mesh axes. Parameters live in `param_dtype`
and are cast to `compute_dtype` at use, so bf16 compute over fp32 master weights works.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import math
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.ad_checkpoint import checkpoint_name
from jax.sharding import PartitionSpec

from scalerl_jax import mesh as mesh_lib
from scalerl_jax.config import ConfigError, ModelConfig, RopeScaling

# Finite rather than -inf: a query with no visible key (padding) then attends uniformly
# instead of producing NaN, and its output is masked out downstream anyway.
_MASK_VALUE = -1e30


def param(rngs: nnx.Rngs, shape, axes, dtype, init: str = "normal", std: float = 0.02):
    if init == "normal":
        value = std * jax.random.normal(rngs.params(), shape, jnp.float32)
    elif init == "ones":
        value = jnp.ones(shape, jnp.float32)
    else:
        value = jnp.zeros(shape, jnp.float32)
    return nnx.Param(value.astype(dtype), logical_axes=tuple(axes))


_AXES = "abcdefgh"  # einsum letters for dense's contracted and output weight axes


def dense(x, w, contract: int = 1, preferred_element_type=None):
    """x [..., *in] times w [*in, *out] (the last `contract` axes of x against the first ones
    of w), with x's leading axes merged into one row axis. Kept as [B, T, ...] einsums, XLA:CPU
    lays the weight gradient's big operand out transposed and writes it with a strided copy
    (a [F, B*T] copy per MLP projection per step); over [B*T] rows the weight gradient is a
    plain [D, B*T] x [B*T, F] dot (SwiGLU fwd+bwd at 32 x 320 tokens, 256 -> 1024: 676 ->
    364 ms). Merging an activation's leading axes is a bitcast and keeps the batch sharding of
    the major one; the weight keeps its own shape, so no layout change of a weight is asked for
    (on TPU merging tiled weight axes would copy the weight). bf16 operands on CPU take
    `_dense_rows`, whose backward XLA:CPU runs at its bf16 rate."""
    ins_shape = x.shape[x.ndim - contract :]
    if (
        preferred_element_type is None
        and x.dtype == w.dtype == jnp.bfloat16
        and _platform() == "cpu"
    ):
        k = math.prod(ins_shape)
        y = _dense_rows(x.reshape(-1, k), w.reshape(k, -1))
    else:
        ins, outs = _AXES[:contract], _AXES[contract : w.ndim]
        y = jnp.einsum(
            f"z{ins},{ins}{outs}->z{outs}",
            x.reshape(-1, *ins_shape),
            w,
            preferred_element_type=preferred_element_type,
        )
    return y.reshape(*x.shape[: x.ndim - contract], *w.shape[contract:])


@jax.custom_vjp
def _dense_rows(x, w):
    """x [R, I] @ w [I, O] in bf16, accumulated in fp32, for XLA:CPU.

    XLA:CPU (jax 0.10) runs a bf16 dot at its bf16 rate (2x the fp32 rate on AVX2, 3.3x with
    AMX) only when the result is fp32 and both operands are row-major with the contracted axis
    last in the left one and first in the right one; any other bf16 dot it runs in fp32.
    Autodiff's backward dots are of the other kinds (the weight gradient contracts the row axis
    of both operands, the input gradient the output axis of both), so this backward contracts
    physical transposes instead (`_transposed_copy`): a bf16 train step at bench/train_step.py's
    shape ran x1.29 faster. Same products as autodiff's, accumulated in fp32 and rounded once to
    bf16. Other platforms keep autodiff's dots: their matmul units read transposed operands as
    they are."""
    return jnp.dot(x, w, preferred_element_type=jnp.float32).astype(x.dtype)


def _dense_rows_fwd(x, w):
    return _dense_rows(x, w), (x, w)


def _dense_rows_bwd(res, g):
    x, w = res
    dx = jnp.dot(g, _transposed_copy(w), preferred_element_type=jnp.float32)
    dw = jnp.dot(_transposed_copy(x), g, preferred_element_type=jnp.float32)
    return dx.astype(x.dtype), dw.astype(w.dtype)


_dense_rows.defvjp(_dense_rows_fwd, _dense_rows_bwd)


def _transposed_copy(a):
    """a.T [C, R] of a [R, C], materialised. XLA folds a plain transpose into the dot that
    reads it (which makes the dot one of the slow kinds again); a concatenation of the
    transposes of a's two column halves is the same array and is not folded."""
    c = a.shape[1] // 2
    return jnp.concatenate([a[:, :c].T, a[:, c:].T], axis=0)


class RMSNorm(nnx.Module):
    def __init__(self, dim: int, eps: float, dtype, rngs: nnx.Rngs, axis_name: str = "norm"):
        self.scale = param(rngs, (dim,), (axis_name,), dtype, init="ones")
        self.eps = eps

    def __call__(self, x):
        scale = self.scale.get_value().astype(jnp.float32)
        return (_rms_normalize(x, self.eps) * scale).astype(x.dtype)


def _rms_normalize(x, eps: float):
    """x / rms(x) over the last axis, in fp32 (as HF does): a bf16 variance loses too much."""
    xf = x.astype(jnp.float32)
    return xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)


def rope_inv_freq(head_dim: int, theta: float, scaling: Optional[RopeScaling]) -> np.ndarray:
    inv = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    if scaling is None:
        return inv.astype(np.float32)
    # Llama-3: long wavelengths are slowed by `factor`, short ones kept, and the band between
    # the two thresholds interpolates smoothly between the two.
    wavelen = 2 * math.pi / inv
    ctx = scaling.original_max_position_embeddings
    long_wl = ctx / scaling.low_freq_factor
    short_wl = ctx / scaling.high_freq_factor
    smooth = (ctx / wavelen - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor
    )
    blended = (1 - smooth) * inv / scaling.factor + smooth * inv
    out = np.where(wavelen > long_wl, inv / scaling.factor, inv)
    out = np.where((wavelen >= short_wl) & (wavelen <= long_wl), blended, out)
    return out.astype(np.float32)


def apply_rope(x, positions, inv_freq):
    """x: [B, T, H, D]; positions: [B, T]. Half-split rotation (HF `rotate_half` convention)."""
    angles = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq)  # [B, T, D/2]
    cos = jnp.cos(angles)[:, :, None, :]
    sin = jnp.sin(angles)[:, :, None, :]
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return out.astype(x.dtype)


def l2_norm(x, eps: float):
    """Weightless RMS normalisation over the last axis in fp32 (Llama-4's q/k `L2Norm`)."""
    return _rms_normalize(x, eps).astype(x.dtype)


def attn_temperature(positions, floor_scale: int, scale: float):
    """Llama-4 NoPE-layer query scale [B, T]: 1 + scale * log1p(floor((pos + 1) / floor_scale)),
    so attention sharpens slowly with distance from the start (arXiv 2501.19399)."""
    pos = positions.astype(jnp.float32)
    return 1.0 + scale * jnp.log1p(jnp.floor((pos + 1.0) / floor_scale))


# The sequence axis of the stacked keys / values (transformer.KEY_AXES, VALUE_AXES).
_KEY_SEQ, _VALUE_SEQ = 4, 3


def _write_cache(cache, new, layer, start, seq_axis: int):
    """`new` [B, KV, ., .] (the cache's per-row layout, T entries on `seq_axis` - 1) written into
    the stacked `cache` [L, B, KV, ., .] at layer `layer`, row b, entries start[b]...: one
    scatter of one window per row and KV head, in place in a donated or carried cache.

    The window spans only the cache's two minor axes, so no layout suits it better than the
    cache's own. A vmap of dynamic_update_slice over rows put the row axis first (XLA:CPU), and
    a window spanning the KV heads too made XLA:TPU carry the cache with the heads minor: either
    way the generate program copied the whole stacked cache in and out of that layout. A window
    out of range (an inactive row past the cache or its window) is dropped, not clamped."""
    b, kv = new.shape[:2]
    grid = (b, kv)
    idx = jnp.stack(
        [
            jnp.full(grid, layer, jnp.int32),
            jnp.broadcast_to(jnp.arange(b, dtype=jnp.int32)[:, None], grid),
            jnp.broadcast_to(jnp.arange(kv, dtype=jnp.int32)[None], grid),
            jnp.broadcast_to(start.astype(jnp.int32)[:, None], grid),
        ],
        axis=-1,
    )
    dims = jax.lax.ScatterDimensionNumbers(
        update_window_dims=(2, 3),
        inserted_window_dims=(0, 1, 2),
        scatter_dims_to_operand_dims=(0, 1, 2, seq_axis),
    )
    return jax.lax.scatter(
        cache,
        idx,
        new.astype(cache.dtype),
        dims,
        indices_are_sorted=True,
        unique_indices=True,
        mode=jax.lax.GatherScatterMode.FILL_OR_DROP,
    )


class Attention(nnx.Module):
    """GQA attention of layer `layer`. Llama-4 layers (cfg.nope_layers etc.): NoPE layers skip
    RoPE and may scale queries by `attn_temperature`; RoPE layers may L2-normalise q and k.
    Which keys a query sees (causal, chunked-local) is entirely the caller's `mask`."""

    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs, layer: int = 0):
        d, h, kv, hd = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.dim_per_head
        pd = jnp.dtype(cfg.param_dtype)
        self.q = param(rngs, (d, h, hd), ("embed", "heads", "head_dim"), pd)
        self.k = param(rngs, (d, kv, hd), ("embed", "kv_heads", "head_dim"), pd)
        self.v = param(rngs, (d, kv, hd), ("embed", "kv_heads", "head_dim"), pd)
        self.o = param(rngs, (h, hd, d), ("heads", "head_dim", "embed"), pd)
        if cfg.qkv_bias:
            self.q_bias = param(rngs, (h, hd), ("heads", "head_dim"), pd, init="zeros")
            self.k_bias = param(rngs, (kv, hd), ("kv_heads", "head_dim"), pd, init="zeros")
            self.v_bias = param(rngs, (kv, hd), ("kv_heads", "head_dim"), pd, init="zeros")
        if cfg.qk_norm:
            self.q_norm = RMSNorm(hd, cfg.rms_norm_eps, pd, rngs, axis_name="head_dim")
            self.k_norm = RMSNorm(hd, cfg.rms_norm_eps, pd, rngs, axis_name="head_dim")
        self.cfg = cfg
        self.rope = cfg.uses_rope(layer)
        self.l2_qk = cfg.qk_l2_norm and self.rope
        self.temperature = cfg.attn_temperature_tuning and not self.rope

    def _project(self, x, positions):
        cfg, dt = self.cfg, x.dtype
        q = dense(x, self.q.get_value().astype(dt))
        k = dense(x, self.k.get_value().astype(dt))
        v = dense(x, self.v.get_value().astype(dt))
        if cfg.qkv_bias:
            q = q + self.q_bias.get_value().astype(dt)
            k = k + self.k_bias.get_value().astype(dt)
            v = v + self.v_bias.get_value().astype(dt)
        if cfg.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        if self.rope:
            # A trace-time constant; kept off the module so it never becomes model state.
            inv_freq = rope_inv_freq(cfg.dim_per_head, cfg.rope_theta, cfg.rope_scaling)
            q, k = apply_rope(q, positions, inv_freq), apply_rope(k, positions, inv_freq)
        if self.l2_qk:  # after RoPE, as transformers' Llama-4 does
            q, k = l2_norm(q, cfg.rms_norm_eps), l2_norm(k, cfg.rms_norm_eps)
        if self.temperature:  # a per-query factor, so it goes on q rather than into attend
            t = attn_temperature(positions, cfg.attn_floor_scale, cfg.attn_scale)
            q = (q.astype(jnp.float32) * t[:, :, None, None]).astype(q.dtype)
        return q, k, v

    def __call__(self, x, positions, mask, cache=None, segment_ids=None, layer=None):
        """x: [B, T, D]; mask: [B, T, S] bool (True = may attend).

        Without a cache S == T. With a cache (transformer.KVCache's stacked arrays: keys
        [L, B, KV, hd, S], values [L, B, KV, S, hd]) the new keys/values are written into row
        `layer` (an int, may be traced) at `positions[:, 0]` onwards (contiguous per row), in
        place, and attention runs over that layer's first S' cache entries, S' =
        mask.shape[-1]; entries past a row's current position are hidden by `mask`.
        `segment_ids` [B, T]: given (training path) only when `mask` is causal within them,
        so `attend` may use a fused kernel (ModelConfig.attention_impl).
        Returns (out [B, T, D], updated cache or None).
        """
        q, k, v = self._project(x, positions)
        if cache is not None:
            ck, cv = cache
            start = positions[:, 0]
            ck = _write_cache(ck, k.transpose(0, 2, 3, 1), layer, start, _KEY_SEQ)
            cv = _write_cache(cv, v.swapaxes(1, 2), layer, start, _VALUE_SEQ)
            w = mask.shape[-1]  # a prefix window of the cache (Transformer.decode's window)
            lk = jax.lax.dynamic_index_in_dim(ck, layer, 0, keepdims=False)
            lv = jax.lax.dynamic_index_in_dim(cv, layer, 0, keepdims=False)
            out = _attend_block(
                q,
                lk[..., :w].astype(x.dtype),
                lv[:, :, :w].astype(x.dtype),
                mask,
                k_spec="bkds",
                v_spec="bksd",
            )
            cache = (ck, cv)
        else:
            out = attend(
                q,
                k,
                v,
                mask,
                self.cfg.attention_chunk,
                impl=self.cfg.attention_impl,
                segment_ids=segment_ids,
            )
        out = dense(out, self.o.get_value().astype(x.dtype), contract=2)
        return out, cache


# Query chunks per sequence at most: the chunk loop is unrolled into the graph, so very long
# sequences get bigger chunks rather than a huge program.
_MAX_QUERY_CHUNKS = 16

# The remat policy "attn_out" saves the tensors tagged with this name (layers.attend's output,
# and the splash kernel's residuals), so the backward pass never recomputes attention.
ATTN_OUT = "attn_out"


def attend(q, k, v, mask, query_chunk: int = 0, *, impl: str = "xla", segment_ids=None):
    """Grouped-query attention. q: [B, T, H, hd]; k, v: [B, S, KV, hd]; mask: [B, T, S].

    `query_chunk > 0` requires S == T and a mask that is causal by index (the training path):
    queries are then processed in chunks that read only the keys up to the chunk's end.

    `impl` (ModelConfig.attention_impl) picks a fused kernel for the training path, used only
    when `segment_ids` [B, T] is given: the caller promises that `mask` is exactly "causal by
    index within equal segment ids, keys of segment 0 (padding) hidden", which the kernels
    rebuild from their own arguments, so the dense mask is not read (and XLA drops it). Outputs
    at padding queries are then unspecified (the kernels let padding attend to padding; they are
    never read). Without `segment_ids` (decode, chunked-local layers) the XLA path runs: decode
    is bound by reading the KV cache (per cached position KV x hd x 2 values against H fp32
    scores), so a fused kernel would save little there, and the TPU decode kernels need a paged
    cache layout the engine does not have.
    """
    if segment_ids is not None:
        kind = resolve_attention_impl(
            impl, _platform(), head_dim=q.shape[-1], dtype=q.dtype, seq_len=q.shape[1]
        )
        if kind == "cudnn":
            return checkpoint_name(dot_product_attention(q, k, v, segment_ids, "cudnn"), ATTN_OUT)
        if kind == "splash":
            return checkpoint_name(splash_attention(q, k, v, segment_ids), ATTN_OUT)
    t = q.shape[1]
    if query_chunk <= 0 or t <= query_chunk or k.shape[1] != t:
        return checkpoint_name(_attend_block(q, k, v, mask), ATTN_OUT)
    chunk = max(query_chunk, -(-t // _MAX_QUERY_CHUNKS))
    outs = []
    for c0 in range(0, t, chunk):
        c1 = min(t, c0 + chunk)
        outs.append(_attend_block(q[:, c0:c1], k[:, :c1], v[:, :c1], mask[:, c0:c1, :c1]))
    return checkpoint_name(jnp.concatenate(outs, axis=1), ATTN_OUT)


def _attend_block(q, k, v, mask, k_spec="bskd", v_spec="bskd"):
    """Attention of q [B, T, H, hd] over all of k and v, laid out as `k_spec` / `v_spec` say
    (b batch, s keys, k KV heads, d head_dim): [B, S, KV, hd] in training, the KV cache's own
    layouts when decoding, so that no layout change of the cache is materialised."""
    b, t, h, hd = q.shape
    kv = k.shape[k_spec.index("k")]
    # Heads before time in q (small) gives XLA's CPU dots their batch-major layout (measured
    # ~1.5x faster fwd+bwd than contracting the [B, T, KV, G, hd] layout directly); k and v
    # stay as stored, so the decode path does not copy the cache.
    q = q.reshape(b, t, kv, h // kv, hd).transpose(0, 2, 3, 1, 4)
    scores = jnp.einsum(f"bkgtd,{k_spec}->bkgts", q, k, preferred_element_type=jnp.float32)
    scores = scores * (1.0 / math.sqrt(hd))
    scores = jnp.where(mask[:, None, None, :, :], scores, _MASK_VALUE)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    out = jnp.einsum(f"bkgts,{v_spec}->bkgtd", probs, v)
    return out.transpose(0, 3, 1, 2, 4).reshape(b, t, h, hd)


# Set while tracing for other devices than this host's (plan/aot.py compiles TPU programs on a
# CPU host): the kernels chosen must be the target's, not the host's.
_TARGET_PLATFORM: contextvars.ContextVar[Optional[str]] = contextvars.ContextVar(
    "target_platform", default=None
)


@contextlib.contextmanager
def target_platform(platform: Optional[str]):
    """Trace for `platform` ("tpu", "cuda", "rocm", "cpu"; None: this host's backend)."""
    token = _TARGET_PLATFORM.set(platform)
    try:
        yield
    finally:
        _TARGET_PLATFORM.reset(token)


def _platform() -> str:
    """ "cuda", "rocm", "tpu" or "cpu": the target of `target_platform`, else the default
    backend, GPUs told apart by their runtime."""
    target = _TARGET_PLATFORM.get()
    if target is not None:
        return target
    backend = jax.default_backend()
    if backend == "gpu":
        return "cuda" if "cuda" in jax.devices()[0].client.platform_version.lower() else "rocm"
    return backend


# Sequence blocks of the splash kernel (its tiles must divide the sequence): the largest of
# these that divides T. 512 is MaxText's default on v5 chips; 128 is the kernel's minimum.
_SPLASH_BLOCKS = (512, 256, 128)


def _cudnn_head_dim_max() -> int:
    """cuDNN flash attention takes head_dim <= 256 on Hopper (sm_90) and later, else <= 128."""
    try:
        cap = tuple(int(x) for x in jax.devices()[0].compute_capability.split("."))
    except (AttributeError, ValueError):
        return 128
    return 256 if cap >= (9, 0) else 128


def fused_attention_problem(
    kind: str, platform: str, *, head_dim: int, dtype, seq_len: int
) -> Optional[str]:
    """Why kernel `kind` ("cudnn" or "splash") cannot run these shapes here, or None."""
    dtype = jnp.dtype(dtype)
    if kind == "cudnn":
        if platform != "cuda":
            return "cuDNN flash attention needs a CUDA GPU"
        if dtype not in (jnp.bfloat16, jnp.float16):
            return f"cuDNN flash attention takes bfloat16/float16 (compute dtype is {dtype})"
        hmax = _cudnn_head_dim_max()
        if head_dim % 8 or head_dim > hmax:
            return f"cuDNN flash attention needs head_dim a multiple of 8, <= {hmax}"
        if seq_len % 2:  # with a mask (bias) cuDNN's backward needs even lengths
            return "cuDNN flash attention with a mask needs an even sequence length"
        return None
    if platform != "tpu":
        return "the splash attention kernel (Pallas, Mosaic) needs a TPU"
    if seq_len % _SPLASH_BLOCKS[-1]:
        return f"the splash kernel needs a sequence length divisible by {_SPLASH_BLOCKS[-1]}"
    return None


# The fused attention kernel of each platform that has one ("auto" takes it).
FUSED_KERNEL = {"cuda": "cudnn", "tpu": "splash"}


def resolve_attention_impl(impl: str, platform: str, *, head_dim: int, dtype, seq_len: int) -> str:
    """The kernel `attend` runs for ModelConfig.attention_impl=`impl` on `platform`: "xla",
    "cudnn" or "splash". "auto" takes the platform's fused kernel when it supports the shapes,
    else "xla"; a kernel asked for by name that cannot run is a ConfigError."""
    if impl == "xla":
        return "xla"
    if impl == "auto":
        kind = FUSED_KERNEL.get(platform)
        if kind is None or fused_attention_problem(
            kind, platform, head_dim=head_dim, dtype=dtype, seq_len=seq_len
        ):
            return "xla"
        return kind
    if impl not in ("cudnn", "splash"):
        raise ConfigError(
            f"ModelConfig.attention_impl={impl!r}: must be one of "
            "('xla', 'cudnn', 'splash', 'auto')"
        )
    why = fused_attention_problem(impl, platform, head_dim=head_dim, dtype=dtype, seq_len=seq_len)
    if why:
        raise ConfigError(
            f"ModelConfig.attention_impl={impl!r} on platform {platform!r} "
            f"(head_dim={head_dim}, dtype={jnp.dtype(dtype)}, "
            f"sequence length {seq_len}): {why}; use 'auto' or 'xla'"
        )
    return impl


def segment_mask(segment_ids):
    """[B, 1, T, T] bool: same segment and the key is not padding (segment 0); the causal part
    is left to the kernel's own flag."""
    same = segment_ids[:, :, None] == segment_ids[:, None, :]
    return (same & (segment_ids[:, None, :] > 0))[:, None]


def dot_product_attention(q, k, v, segment_ids, implementation: str):
    """The training-path mask through `jax.nn.dot_product_attention` (the cuDNN kernel on GPU;
    implementation="xla" runs the same arguments anywhere, which is how CPU tests check them).
    Causality goes in as `is_causal` (cuDNN then skips the tiles above the diagonal); the
    public API has no segment ids, so packed segments and padding go in as a boolean mask,
    which cuDNN reads as a bias. GQA is native: k, v keep their KV heads."""
    # `implementation` is one of jax's names ("xla", "cudnn"): ModelConfig checks it.
    return jax.nn.dot_product_attention(
        q,
        k,
        v,
        mask=segment_mask(segment_ids),
        is_causal=True,  # type: ignore[call-overload]
        implementation=implementation,
    )


# The mesh the training forward is traced for (train/step.py and train/sft.py set it). XLA
# cannot partition a Mosaic custom call, so the splash kernel runs in a shard_map over it.
_KERNEL_MESH: contextvars.ContextVar = contextvars.ContextVar("kernel_mesh", default=None)


@contextlib.contextmanager
def kernel_mesh(mesh):
    """Trace the training forward for `mesh` (a jax Mesh; None: unsharded)."""
    token = _KERNEL_MESH.set(mesh)
    try:
        yield
    finally:
        _KERNEL_MESH.reset(token)


def splash_attention(q, k, v, segment_ids, interpret: bool = False):
    """The training-path mask through the Pallas splash-attention kernel: a static causal mask
    plus the kernel's own segment ids (queries see keys of their segment; padding, segment 0,
    sees only padding). The kernel handles GQA (H a multiple of KV) itself. `interpret`: run
    the kernel in Pallas' interpreter (CPU tests).

    Under `kernel_mesh(mesh)` the kernel runs per shard in a shard_map: rows split as the
    logical axis `batch` says, heads as `heads`/`kv_heads` say when both head counts divide
    (else every shard takes all heads of its rows). Attention never mixes rows or KV groups,
    so no collective is needed."""
    mesh = _KERNEL_MESH.get()
    local = functools.partial(_splash_local, interpret=interpret)
    if mesh is None or mesh.size == 1:
        return local(q, k, v, segment_ids)
    (rows,) = mesh_lib.logical_to_spec(("batch",), mesh, q.shape[:1])
    (heads,) = mesh_lib.logical_to_spec(("heads",), mesh, q.shape[2:3])
    (kv_heads,) = mesh_lib.logical_to_spec(("kv_heads",), mesh, k.shape[2:3])
    if heads != kv_heads:  # a KV head's queries must stay on its shard
        heads = None
    spec = PartitionSpec(rows, None, heads, None)
    return jax.shard_map(
        local,
        mesh=mesh,
        in_specs=(spec, spec, spec, PartitionSpec(rows, None)),
        out_specs=spec,
        check_vma=False,  # pallas_call has no replication rule
    )(q, k, v, segment_ids)


def _splash_local(q, k, v, segment_ids, *, interpret: bool):
    """`splash_attention` on one shard's arrays (all of them when unsharded): heads-major
    [H, T, hd] per row under vmap."""
    from jax.experimental.pallas.ops.tpu.splash_attention import (
        splash_attention_kernel as splash,
        splash_attention_mask as splash_mask,
    )

    b, t, h, hd = q.shape
    blk = next(x for x in _SPLASH_BLOCKS if t % x == 0)
    sizes = splash.BlockSizes(
        block_q=blk,
        block_kv=blk,
        block_kv_compute=blk,
        block_q_dkv=blk,
        block_kv_dkv=blk,
        block_kv_dkv_compute=blk,
        block_q_dq=blk,
        block_kv_dq=blk,
    )
    mask = splash_mask.MultiHeadMask([splash_mask.CausalMask((t, t))] * h)
    kernel = splash.make_splash_mha(
        mask,
        head_shards=1,
        q_seq_shards=1,
        block_sizes=sizes,
        residual_checkpoint_name=ATTN_OUT,
        interpret=interpret,
    )
    # The kernel does not scale the logits; scaling q first is what the XLA path computes.
    qh = (q * (1.0 / math.sqrt(hd))).astype(q.dtype).transpose(0, 2, 1, 3)
    kh, vh = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)
    seg = segment_ids.astype(jnp.int32)
    out = jax.vmap(lambda a, b_, c, s: kernel(a, b_, c, segment_ids=splash.SegmentIds(s, s)))(
        qh, kh, vh, seg
    )
    return out.transpose(0, 2, 1, 3)


class MLP(nnx.Module):
    def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs, intermediate_size: Optional[int] = None):
        d, pd = cfg.hidden_size, jnp.dtype(cfg.param_dtype)
        f = intermediate_size or cfg.intermediate_size
        self.gate = param(rngs, (d, f), ("embed", "mlp"), pd)
        self.up = param(rngs, (d, f), ("embed", "mlp"), pd)
        self.down = param(rngs, (f, d), ("mlp", "embed"), pd)

    def __call__(self, x):
        dt = x.dtype
        g = dense(x, self.gate.get_value().astype(dt))
        u = dense(x, self.up.get_value().astype(dt))
        return dense(jax.nn.silu(g) * u, self.down.get_value().astype(dt))
