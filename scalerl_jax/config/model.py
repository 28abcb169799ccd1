"""The model and mesh sections: ModelConfig (one decoder family, dense or mixture-of-experts,
with its RoPE scaling) and MeshConfig (how devices split into trainer and sampler, and the
trainer mesh shape)."""

from __future__ import annotations

import dataclasses
from typing import Optional

from scalerl_jax.config.checks import _check, _choice, _positive

DTYPES = ("float32", "bfloat16", "float16")
ATTENTION_IMPLS = ("xla", "cudnn", "splash", "auto")
REMAT_POLICIES = ("full", "dots", "dots_no_batch", "attn_out")


@dataclasses.dataclass(frozen=True)
class RopeScaling:
    """Llama-3 style frequency-dependent RoPE scaling (HF `rope_type: llama3`)."""

    factor: float = 8.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192

    def __post_init__(self):
        _positive(
            "RopeScaling",
            factor=self.factor,
            low_freq_factor=self.low_freq_factor,
            high_freq_factor=self.high_freq_factor,
            original_max_position_embeddings=self.original_max_position_embeddings,
        )
        _check(
            self.high_freq_factor > self.low_freq_factor,
            "RopeScaling",
            "high_freq_factor",
            self.high_freq_factor,
            f"must exceed low_freq_factor={self.low_freq_factor}",
        )


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """One decoder family: Llama-3.x, Qwen2.5 (qkv_bias), Qwen3 (qk_norm), and their
    mixture-of-experts variants (num_experts > 0: Qwen3-MoE, Llama-4 with its NoPE / chunked
    attention fields)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: Optional[int] = None  # None: hidden_size // num_heads
    rope_theta: float = 10000.0
    rope_scaling: Optional[RopeScaling] = None
    rms_norm_eps: float = 1e-6
    tie_embeddings: bool = False
    qkv_bias: bool = False
    qk_norm: bool = False
    max_position_embeddings: int = 32768
    param_dtype: str = "float32"
    compute_dtype: str = "float32"
    fp32_head: bool = True  # ScaleRL: LM head (and log-softmax) in fp32 on sampler and trainer
    remat: bool = False  # rematerialise each block in the backward pass (memory for compute)
    # Apply the stacked layers with a lax.scan: one layer's program, so compiles stay flat in
    # depth. False unrolls the same scan (longer compiles; XLA's cost analysis, which counts a
    # loop body once, then counts every layer).
    scan_layers: bool = True
    # Training path: causal attention in query chunks of this size, each seeing only the keys
    # up to its end (skips ~half the score FLOPs, keeps score blocks cache-sized). 0: one block.
    attention_chunk: int = 128
    # Attention kernel of the training forward (layers.attend): "xla" (einsum + softmax, every
    # platform), "cudnn" (cuDNN flash attention, CUDA GPUs, bf16/fp16), "splash" (the Pallas
    # splash-attention kernel, TPUs), "auto" (the platform's fused kernel where it supports the
    # shapes and dtype, else xla: so xla on CPUs). The decode path always uses xla (see
    # layers.attend). The fused kernels keep no [T, T] scores, and on a TPU splash compiles
    # one kernel where xla's query chunks compile one program each.
    attention_impl: str = "auto"
    # With `remat`, what each block keeps for the backward pass (the rest is recomputed):
    # "full" (only the block input), "dots" (every matmul output), "dots_no_batch" (matmuls
    # without batch dimensions: the weight projections, not attention), "attn_out" (the
    # attention output, so the backward never re-runs attention).
    remat_policy: str = "full"
    # Llama-4 attention (defaults: off). RoPE is skipped on `nope_layers` (HF no_rope_layers == 0);
    # the other (RoPE) layers attend only to keys in their own chunk of `local_attention_chunk`
    # positions (0: globally) and, with `qk_l2_norm`, L2-normalise q and k (no weights). With
    # `attn_temperature_tuning`, NoPE layers scale each query by
    # 1 + attn_scale * log1p(floor((position + 1) / attn_floor_scale)).
    nope_layers: tuple = ()
    local_attention_chunk: int = 0
    qk_l2_norm: bool = False
    attn_temperature_tuning: bool = False
    attn_floor_scale: int = 8192
    attn_scale: float = 0.1
    # Mixture of experts (models/moe.py). 0 experts: every layer has the dense MLP.
    num_experts: int = 0
    experts_per_token: int = 0  # top-k
    moe_intermediate_size: Optional[int] = None  # each expert's FFN width; None: intermediate_size
    shared_expert_size: int = 0  # an always-on expert of this width (Llama-4); 0: none
    moe_layer_step: int = 1  # layer i is MoE when (i + 1) % step == 0 (HF decoder_sparse_step)
    dense_layers: tuple = ()  # layers kept dense regardless (HF mlp_only_layers)
    # "softmax": top-k of softmax probabilities weight the expert outputs (Qwen3-MoE);
    # "sigmoid": sigmoid of the top-k logits scales the expert inputs (Llama-4).
    router: str = "softmax"
    norm_topk_prob: bool = False  # renormalise the top-k softmax probabilities to sum to 1
    router_aux_loss_coef: float = 0.0  # Switch-style load-balancing loss weight in the train step
    name: str = "custom"

    def __post_init__(self):
        _check_dims(self)
        _check_numerics(self)
        object.__setattr__(self, "dense_layers", tuple(self.dense_layers))  # JSON lists
        object.__setattr__(self, "nope_layers", tuple(self.nope_layers))
        _check_llama4_attention(self)
        _check_experts(self)

    @property
    def dim_per_head(self) -> int:
        return self.head_dim if self.head_dim is not None else self.hidden_size // self.num_heads

    @property
    def expert_size(self) -> int:
        """FFN width of one routed expert."""
        return self.moe_intermediate_size or self.intermediate_size

    def is_moe_layer(self, i: int) -> bool:
        return (
            self.num_experts > 0
            and (i + 1) % self.moe_layer_step == 0
            and i not in self.dense_layers
        )

    def uses_rope(self, i: int) -> bool:
        return i not in self.nope_layers

    def is_local_attention_layer(self, i: int) -> bool:
        """Chunked local attention (Llama-4): the RoPE layers, when local_attention_chunk > 0."""
        return self.local_attention_chunk > 0 and self.uses_rope(i)

    @property
    def num_moe_layers(self) -> int:
        return sum(self.is_moe_layer(i) for i in range(self.num_layers))

    def num_params(self, active: bool = False) -> int:
        """Parameter count (embeddings included once when tied). `active`: only what one token
        uses: top-k of the routed experts (the router and shared expert always run)."""
        d, f, h, kv, hd = (
            self.hidden_size,
            self.intermediate_size,
            self.num_heads,
            self.num_kv_heads,
            self.dim_per_head,
        )
        attn = d * h * hd + 2 * d * kv * hd + h * hd * d
        if self.qkv_bias:
            attn += h * hd + 2 * kv * hd
        if self.qk_norm:
            attn += 2 * hd
        experts = self.experts_per_token if active else self.num_experts
        moe_ffn = (
            d * self.num_experts
            + 3 * d * self.expert_size * experts
            + 3 * d * self.shared_expert_size
        )
        moe = self.num_moe_layers
        blocks = (
            self.num_layers * (attn + 2 * d) + (self.num_layers - moe) * 3 * d * f + moe * moe_ffn
        )
        emb = self.vocab_size * d * (1 if self.tie_embeddings else 2)
        return blocks + emb + d

    def replace(self, **kw) -> "ModelConfig":
        return dataclasses.replace(self, **kw)


def _check_dims(cfg: ModelConfig) -> None:
    """Sizes, heads and head_dim."""
    c = "ModelConfig"
    _positive(
        c,
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_layers=cfg.num_layers,
        num_heads=cfg.num_heads,
        num_kv_heads=cfg.num_kv_heads,
        rope_theta=cfg.rope_theta,
        rms_norm_eps=cfg.rms_norm_eps,
        max_position_embeddings=cfg.max_position_embeddings,
    )
    _check(
        cfg.num_heads % cfg.num_kv_heads == 0,
        c,
        "num_kv_heads",
        cfg.num_kv_heads,
        f"must divide num_heads={cfg.num_heads} (grouped-query attention)",
    )
    if cfg.head_dim is None:
        _check(
            cfg.hidden_size % cfg.num_heads == 0,
            c,
            "hidden_size",
            cfg.hidden_size,
            f"must be divisible by num_heads={cfg.num_heads} when head_dim is not set",
        )
    else:
        _positive(c, head_dim=cfg.head_dim)
    _check(cfg.dim_per_head % 2 == 0, c, "head_dim", cfg.dim_per_head, "must be even (RoPE)")


def _check_numerics(cfg: ModelConfig) -> None:
    """Dtypes, the attention kernel and chunking, rematerialisation."""
    c = "ModelConfig"
    _choice(c, "param_dtype", cfg.param_dtype, DTYPES)
    _choice(c, "compute_dtype", cfg.compute_dtype, DTYPES)
    _check(
        cfg.attention_chunk >= 0,
        c,
        "attention_chunk",
        cfg.attention_chunk,
        "must be >= 0 (0: no chunking)",
    )
    _choice(c, "attention_impl", cfg.attention_impl, ATTENTION_IMPLS)
    _choice(c, "remat_policy", cfg.remat_policy, REMAT_POLICIES)
    _check(
        cfg.remat or cfg.remat_policy == "full",
        c,
        "remat_policy",
        cfg.remat_policy,
        "needs remat=True (without remat every activation is kept)",
    )


def _check_llama4_attention(cfg: ModelConfig) -> None:
    """NoPE layers, local attention chunks, the L2 q/k norm, temperature tuning."""
    c = "ModelConfig"
    _check(
        all(0 <= i < cfg.num_layers for i in cfg.nope_layers),
        c,
        "nope_layers",
        cfg.nope_layers,
        f"must be layer indices in [0, {cfg.num_layers})",
    )
    _check(
        cfg.local_attention_chunk >= 0,
        c,
        "local_attention_chunk",
        cfg.local_attention_chunk,
        "must be >= 0 (0: global attention)",
    )
    _check(
        not (cfg.qk_l2_norm and cfg.qk_norm),
        c,
        "qk_l2_norm",
        cfg.qk_l2_norm,
        "excludes qk_norm=True (weightless L2 norm or Qwen3's RMSNorm, not both)",
    )
    _positive(c, attn_floor_scale=cfg.attn_floor_scale)
    _check(cfg.attn_scale >= 0, c, "attn_scale", cfg.attn_scale, "must be >= 0")


def _check_experts(cfg: ModelConfig) -> None:
    """The mixture-of-experts fields (all zero for a dense model)."""
    c = "ModelConfig"
    _check(cfg.num_experts >= 0, c, "num_experts", cfg.num_experts, "must be >= 0 (0: dense)")
    if cfg.num_experts:
        _check(
            0 < cfg.experts_per_token <= cfg.num_experts,
            c,
            "experts_per_token",
            cfg.experts_per_token,
            f"must be in [1, num_experts={cfg.num_experts}]",
        )
        if cfg.moe_intermediate_size is not None:
            _positive(c, moe_intermediate_size=cfg.moe_intermediate_size)
        _check(
            cfg.shared_expert_size >= 0,
            c,
            "shared_expert_size",
            cfg.shared_expert_size,
            "must be >= 0 (0: no shared expert)",
        )
        _positive(c, moe_layer_step=cfg.moe_layer_step)
        _check(
            all(0 <= i < cfg.num_layers for i in cfg.dense_layers),
            c,
            "dense_layers",
            cfg.dense_layers,
            f"must be layer indices in [0, {cfg.num_layers})",
        )
        _choice(c, "router", cfg.router, ("softmax", "sigmoid"))
        _check(
            not (cfg.norm_topk_prob and cfg.router != "softmax"),
            c,
            "norm_topk_prob",
            cfg.norm_topk_prob,
            "only applies to router='softmax'",
        )
        _check(
            cfg.router_aux_loss_coef >= 0,
            c,
            "router_aux_loss_coef",
            cfg.router_aux_loss_coef,
            "must be >= 0 (0: no load-balancing loss)",
        )
    else:
        _check(
            cfg.experts_per_token == 0
            and cfg.shared_expert_size == 0
            and cfg.router_aux_loss_coef == 0,
            c,
            "num_experts",
            0,
            "experts_per_token, shared_expert_size and router_aux_loss_coef need "
            f"num_experts > 0 (got {cfg.experts_per_token}, {cfg.shared_expert_size}, "
            f"{cfg.router_aux_loss_coef})",
        )


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    """How each host's devices split into trainer and sampler devices, and the trainer mesh shape.

    `trainer_devices_per_host=None` with `colocate=False` gives half the local devices (rounded
    up) to the trainer. With `colocate=True` trainer and sampler share all local devices.
    Mesh axis sizes of -1 absorb the remaining trainer devices (at most one axis may be -1).
    """

    trainer_devices_per_host: Optional[int] = None
    colocate: bool = False
    data: int = 1
    expert: int = 1  # expert parallelism: MoE experts split over it; a data axis for the rest
    fsdp: int = -1
    tensor: int = 1
    sampler_tensor: int = -1  # tensor parallelism of each host-local sampler replica (-1: all)

    def __post_init__(self):
        c = "MeshConfig"
        if self.trainer_devices_per_host is not None:
            _positive(c, trainer_devices_per_host=self.trainer_devices_per_host)
        _positive(c, expert=self.expert)  # a real size: it must divide the expert count
        sizes = {"data": self.data, "fsdp": self.fsdp, "tensor": self.tensor}
        for name, v in sizes.items():
            _check(v == -1 or v > 0, c, name, v, "must be a positive size or -1 (fill)")
        _check(
            sum(v == -1 for v in sizes.values()) <= 1,
            c,
            "data/fsdp/tensor",
            sizes,
            "at most one axis may be -1",
        )
        _check(
            self.sampler_tensor == -1 or self.sampler_tensor > 0,
            c,
            "sampler_tensor",
            self.sampler_tensor,
            "must be a positive size or -1 (all sampler devices)",
        )
