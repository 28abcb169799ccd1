"""Per-chip memory and per-step time of a layout: pure arithmetic on the config.

The memory figures are estimates of what XLA keeps live, not measurements; each formula is
explained next to its code. Nothing here touches devices or data.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import NamedTuple, Optional

from scalerl_jax.config import ModelConfig, RunConfig
from scalerl_jax.plan.topology import PlanError, Topology

GIB = 1 << 30
_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


# ------------------------------------------------------------------------------ parameters
def param_inventory(m: ModelConfig) -> list[tuple[tuple, tuple, int]]:
    """(shape, logical axes, how many) of the parameters, as models/layers.py and
    transformer.py create them (tests/test_plan.py checks this against the real module).
    Identical arrays are counted, not listed: every layer has the same ones. MoE layers hold
    all E experts (memory counts every expert; FLOPs count only the active ones)."""
    return list(_inventory(m))


@functools.lru_cache(maxsize=64)  # pure; a plan search asks for it thousands of times
def _inventory(m: ModelConfig) -> tuple:
    d, f, h, kv, hd, n = (
        m.hidden_size,
        m.intermediate_size,
        m.num_heads,
        m.num_kv_heads,
        m.dim_per_head,
        m.num_layers,
    )
    moe = m.num_moe_layers
    out = [
        ((m.vocab_size, d), ("vocab", "embed"), 1),
        ((d,), ("norm",), 2 * n + 1),  # attn_norm, mlp_norm per layer; final_norm
        ((d, h, hd), ("embed", "heads", "head_dim"), n),  # q
        ((d, kv, hd), ("embed", "kv_heads", "head_dim"), 2 * n),  # k, v
        ((h, hd, d), ("heads", "head_dim", "embed"), n),  # o
        ((d, f), ("embed", "mlp"), 2 * (n - moe)),  # gate, up (dense layers)
        ((f, d), ("mlp", "embed"), n - moe),
    ]  # down
    if moe:
        e, fe, fs = m.num_experts, m.expert_size, m.shared_expert_size
        out += [
            ((d, e), ("embed", "router"), moe),
            ((e, d, fe), ("expert", "embed", "mlp"), 2 * moe),  # expert gate, up
            ((e, fe, d), ("expert", "mlp", "embed"), moe),
        ]  # expert down
        if fs:
            out += [((d, fs), ("embed", "mlp"), 2 * moe), ((fs, d), ("mlp", "embed"), moe)]
    out = [x for x in out if x[2]]
    if m.qkv_bias:
        out += [((h, hd), ("heads", "head_dim"), n), ((kv, hd), ("kv_heads", "head_dim"), 2 * n)]
    if m.qk_norm:
        out.append(((hd,), ("head_dim",), 2 * n))
    if not m.tie_embeddings:
        out.append(((d, m.vocab_size), ("embed", "vocab"), 1))
    return tuple(out)


class _MeshShape(NamedTuple):
    """Stands in for a jax Mesh: mesh.logical_to_spec reads only `mesh.shape`, and a plan has
    axis sizes, not devices."""

    shape: dict


def shard_elements(shape: tuple, axes: tuple, mesh_shape: dict) -> int:
    """Elements of one array held per device: the logical axes map to mesh axes through the one
    rules table (mesh.RULES via mesh.logical_to_spec); a dimension the mesh axes do not divide
    is replicated, as mesh.logical_to_spec does when given shapes."""
    return _shard_elements(tuple(shape), tuple(axes), tuple(sorted(mesh_shape.items())))


@functools.lru_cache(maxsize=4096)  # pure; resolve() evaluates hundreds of layouts
def _shard_elements(shape: tuple, axes: tuple, mesh_items: tuple) -> int:
    from scalerl_jax.mesh import logical_to_spec

    mesh_shape = dict(mesh_items)
    # Duck-typed: logical_to_spec reads only the mesh's shape.
    spec = logical_to_spec(axes, _MeshShape(mesh_shape))  # type: ignore[arg-type]
    n = math.prod(shape)
    for dim, entry in zip(shape, spec):
        names = () if entry is None else ((entry,) if isinstance(entry, str) else tuple(entry))
        size = math.prod(mesh_shape[a] for a in names)
        if dim % size == 0:
            n //= size
    return n


def param_bytes(m: ModelConfig, mesh_shape: dict, dtype: Optional[str] = None) -> int:
    """Bytes of one copy of the params on one device of a mesh with these axis sizes."""
    size = _BYTES[dtype or m.param_dtype]
    return sum(k * shard_elements(s, a, mesh_shape) for s, a, k in param_inventory(m)) * size


# Inventory entry (by its logical axes) -> the parameter names sampler/weight_sync.use_dtype
# decides on: norm scales, the router, the untied LM head, the embedding; the rest is a matrix.
_NAMES = {
    ("norm",): ("scale",),
    ("head_dim",): ("scale",),
    ("embed", "router"): ("router",),
    ("embed", "vocab"): ("lm_head",),
    ("vocab", "embed"): ("embed",),
}


def sampler_item_bytes(m: ModelConfig, axes: tuple, weight_dtype: str) -> int:
    """Bytes per element the sampler stores a parameter in (SamplerConfig.weight_dtype,
    sampler/weight_sync.sampler_dtypes): "param": param_dtype; "compute": the narrower of
    param_dtype and the dtype the forward casts it to."""
    from scalerl_jax.sampler.weight_sync import use_dtype

    param = _BYTES[m.param_dtype]
    if weight_dtype == "param":
        return param
    return min(param, use_dtype(_NAMES.get(tuple(axes), ("kernel",)), m).itemsize)


def sampler_param_bytes(m: ModelConfig, mesh_shape: dict, weight_dtype: str) -> int:
    """Bytes of the sampler's copy of the params on one device of its mesh."""
    return sum(
        k * shard_elements(s, a, mesh_shape) * sampler_item_bytes(m, a, weight_dtype)
        for s, a, k in param_inventory(m)
    )


def sync_group_bytes(cfg: RunConfig) -> int:
    """Bytes of the largest group weight sync gathers at once, in the sampler's dtypes: at
    most `sampler.weight_sync_group_mib`, never more than the whole model, and not less than
    the largest piece it cannot cut (sampler/weight_sync.split): one layer's slice of a stacked
    weight (the inventory's shapes are per layer) or a whole unstacked array."""
    m, wd = cfg.model, cfg.sampler.weight_dtype
    arrays = [math.prod(s) * sampler_item_bytes(m, a, wd) for s, a, _ in param_inventory(m)]
    whole = sampler_param_bytes(m, {}, wd)
    return max(min(cfg.sampler.weight_sync_group_mib << 20, whole), max(arrays))


def per_shard(n: int, t: int) -> int:
    """n heads / units over t tensor shards; replicated when t does not divide n."""
    return n // t if n % t == 0 else n


# --------------------------------------------------------------------------------- memory
@dataclasses.dataclass(frozen=True)
class TrainerMemory:
    """Bytes per trainer chip. Peak = params + optimizer + max(gradients + activations,
    weight-sync copy): the step's gradients and activations are freed before the weights are
    gathered for the sampler (sampler/weight_sync.py)."""

    params: int
    optimizer: int
    gradients: int
    activations: int  # the chosen variant (remat or not)
    activations_no_remat: int
    activations_remat: int
    weight_sync: int

    @property
    def peak(self) -> int:
        return (
            self.params + self.optimizer + max(self.gradients + self.activations, self.weight_sync)
        )


@dataclasses.dataclass(frozen=True)
class SamplerMemory:
    """Bytes per sampler chip. The weight sync builds the next weights whole beside the ones
    decoding (the driver swaps them in after the sync), so the peak holds both."""

    params: int
    kv_cache: int
    working: int  # fp32 scores of the largest prefill pass
    decode: int  # a decode step's: fp32 scores and logits of the slots, the cache's relayout

    @property
    def incoming(self) -> int:
        """The next weights, arriving by the weight sync while these decode."""
        return self.params

    @property
    def work(self) -> int:
        """The larger working set: prefill and decode do not run at once."""
        return max(self.working, self.decode)

    @property
    def peak(self) -> int:
        return self.params + self.incoming + self.kv_cache + self.work


def seq_len(cfg: RunConfig) -> int:
    """The longest train row: prompt + completion, bounded by the KV cache, padded to the
    bucket (train/batch.py). Memory must fit the longest step, not the average one."""
    s = cfg.sampler
    longest = min(s.max_target_length, s.max_prefill_length + s.max_new_tokens)
    return -(-longest // cfg.pipeline.seq_bucket) * cfg.pipeline.seq_bucket


def rows_per_chip(cfg: RunConfig, shards: int, micro_batches: int) -> int:
    """Rows one trainer chip holds per micro-batch: R = ceil(P*G / M) rounded up to the batch
    shards (data x fsdp), as train/batch.from_groups sizes them; R / shards per chip."""
    rows = cfg.pipeline.prompts_per_step * cfg.pipeline.generations_per_prompt
    r = -(-rows // micro_batches)
    return -(-r // shards)


def _attention_score_elements(t: int, chunk: int) -> int:
    """Score elements of one head over a causal sequence of t tokens: query chunks see only the
    keys up to their end (layers.attend; at most 16 chunks), so sum_c len(c) * end(c)."""
    if chunk <= 0 or t <= chunk:
        return t * t
    chunk = max(chunk, -(-t // 16))
    return sum((min(t, c0 + chunk) - c0) * min(t, c0 + chunk) for c0 in range(0, t, chunk))


def _largest_query_chunk(t: int, chunk: int) -> int:
    """Score elements of one head in the largest query chunk of `_attention_score_elements`."""
    if chunk <= 0 or t <= chunk:
        return t * t
    chunk = max(chunk, -(-t // 16))
    return max((min(t, c0 + chunk) - c0) * min(t, c0 + chunk) for c0 in range(0, t, chunk))


def fused_attention(m: ModelConfig, t: int, platform: str = "tpu") -> bool:
    """Whether the training forward's attention runs a fused kernel on `platform` ("tpu",
    "cuda", "cpu"): splash on a TPU, cuDNN on CUDA, by name or under "auto" with shapes the
    kernel takes (the rule of `layers.resolve_attention_impl`). Either keeps one fp32
    log-sum-exp per query and head instead of the [T, T] scores, and needs no dense mask."""
    from scalerl_jax.models.layers import FUSED_KERNEL, fused_attention_problem

    kind = FUSED_KERNEL.get(platform)
    return (
        kind is not None
        and m.attention_impl in (kind, "auto")
        and fused_attention_problem(
            kind, platform, head_dim=m.dim_per_head, dtype=m.compute_dtype, seq_len=t
        )
        is None
    )


LANES = 128  # a TPU tile's minor dimension: an array's minor axis is padded to a multiple


def lanes(n: int) -> int:
    """`n` rounded up to whole 128-lane tiles: what a minor axis of n elements takes on a TPU
    (real widths are multiples of 128; a toy model's d=64 takes twice its bytes)."""
    return -(-n // LANES) * LANES


def activation_bytes(
    m: ModelConfig,
    rows: int,
    t: int,
    tensor: int,
    logprob_chunk,
    remat: bool,
    platform: str = "tpu",
) -> int:
    """Activations one trainer chip keeps for the backward pass of one micro-batch.

    Per token per layer, what XLA keeps for the backward (the scanned forward's stacked
    residuals in a v5p buffer dump of the 8B step): in compute dtype (b bytes) the block input
    and the residual after attention (2 D, not sharded), q, k, v in and out of RoPE and the
    attention output (3 H hd + 3 KV hd), and the SwiGLU's six [T, F] values (gate, up, the
    sigmoid, silu(gate), their product and its cast for the down projection: 6 F); in fp32
    each RMSNorm's input and normalised value (4 D). Attention
    scores per row per layer: heads x score elements x (4 + b) bytes (fp32 probabilities for the
    softmax gradient, compute-dtype ones for the value product); with the fused kernel
    (`fused_attention`) 4 bytes per query and head instead, except on Llama-4's chunked-local
    layers, which always run the XLA path. Heads and F shard over `tensor` when they divide; D,
    F and head_dim are minor axes, counted in whole lanes (`lanes`).
    The backward runs the LM head first, then the layers (in reverse, a scan): the head's phase
    holds one fp32 [rows, chunk, V] logits buffer (XLA computes the softmax and its gradient in
    place: one buffer, measured on v5p), the layers' phase one layer's set and the gradient of
    its largest query chunk's scores (4 + b bytes per element, unless fused), and the layer's
    own gradients (2 F, H hd and D per token; 1.3x the planner's figure at 8 rows of 16,384
    tokens under remat before they were counted). Without remat
    every layer's set is kept through both. With remat (`remat_policy`) "full" keeps each block's
    input stacked over the layers (D per token), counted twice (XLA's count of the 8B step at 8
    rows of 16,384 tokens grows by 2.1 GiB per layer from 3 to 16 layers, twice the inputs),
    and rebuilds one block's set at a time;
    "attn_out" also keeps each layer's attention output (H hd per token); "dots" and
    "dots_no_batch" keep most matmul outputs, planned as no remat (an upper bound). Both add the
    [rows, T, T] bool mask (unless every layer runs the fused kernel) and the fp32 final hidden
    states, live through both phases.
    """
    b = _BYTES[m.compute_dtype]
    d, f, hd = lanes(m.hidden_size), m.intermediate_size, lanes(m.dim_per_head)
    h, kv = per_shard(m.num_heads, tensor), per_shard(m.num_kv_heads, tensor)
    per_token = b * (2 * d + 3 * h * hd + 3 * kv * hd) + 4 * 4 * d
    # FFN: a dense layer keeps 6 F; an MoE layer the same for each of its k routed rows and the
    # shared expert, plus the gathered rows and the expert outputs (2 k D) and the fp32 router
    # logits and probabilities (2 E).
    k = m.experts_per_token
    dense_f = lanes(per_shard(f, tensor))
    moe_f = k * per_shard(m.expert_size, tensor) + per_shard(m.shared_expert_size, tensor)
    dense_ffn = b * 6 * dense_f
    moe_ffn = b * (6 * moe_f + 2 * k * d) + 4 * 2 * m.num_experts
    fused = fused_attention(m, t, platform)
    scores = h * _attention_score_elements(t, m.attention_chunk) * (4 + b)
    unfused = [not fused or m.is_local_attention_layer(i) for i in range(m.num_layers)]
    sets = [
        rows
        * (
            t * (per_token + (moe_ffn if m.is_moe_layer(i) else dense_ffn))
            + (scores if unfused[i] else h * t * 4)
        )
        for i in range(m.num_layers)
    ]
    # A layer's backward adds its own gradients: gate's and up's (2 F in compute dtype, per
    # routed row for MoE), the fp32 gradients of q and of the residual stream (H hd + D), and
    # its scores' gradient (fp32 and compute dtype), one query chunk at a time (the chunks are
    # separate ops).
    score_grad = rows * h * _largest_query_chunk(t, m.attention_chunk) * (4 + b)
    grads = [
        rows * t * (b * 2 * (moe_f if m.is_moe_layer(i) else dense_f))
        + rows * t * 4 * (h * hd + d)
        + (score_grad if u else 0)
        for i, u in enumerate(unfused)
    ]
    chunk = t if logprob_chunk is None else min(t, logprob_chunk)
    head = rows * chunk * lanes(per_shard(m.vocab_size, tensor)) * 4
    if remat and m.remat_policy in ("full", "attn_out"):
        saved = d + (h * hd if m.remat_policy == "attn_out" else 0)
        layer = max(x + g for x, g in zip(sets, grads))
        kept = 2 * m.num_layers * rows * t * saved * b + max(head, layer)
    else:
        kept = sum(sets) + max(head, max(grads))
    return kept + rows * t * t * any(unfused) + rows * t * d * 4


def trainer_memory(
    cfg: RunConfig,
    mesh_shape: dict,
    micro_batches: int,
    remat: bool,
    trainer_per_host: int,
    platform: str = "tpu",
) -> TrainerMemory:
    """Per trainer chip: params in param_dtype; AdamW's two moments (optax keeps them in the
    params' dtype, so fp32 params are their own master copy and bf16 params have none);
    gradients: the fp32 accumulator plus one micro-batch's gradients in param_dtype
    (train/step.py); activations (`activation_bytes`); the weight-sync copy: every host gathers
    one group of params at a time in the sampler's dtypes (`sync_group_bytes`), sharded over its
    own trainer chips (sampler/weight_sync.py)."""
    m = cfg.model
    params = param_bytes(m, mesh_shape)
    grads = param_bytes(m, mesh_shape, "float32") + params
    rows = rows_per_chip(cfg, mesh_shape["data"] * mesh_shape["fsdp"], micro_batches)
    t, tensor = seq_len(cfg), mesh_shape["tensor"]
    act = {
        r: activation_bytes(m, rows, t, tensor, cfg.optim.logprob_chunk, r, platform)
        for r in (False, True)
    }
    sync = -(-sync_group_bytes(cfg) // trainer_per_host)
    return TrainerMemory(params, 2 * params, grads, act[remat], act[False], act[True], sync)


def kv_cache_bytes(cfg: RunConfig, data: int, tensor: int, slots: int) -> int:
    """KV cache on one sampler chip: slots x max_target_length x layers x 2 (k, v) x kv_heads x
    head_dim x compute-dtype bytes; slots shard over `data` and kv heads over `tensor` when they
    divide (models/transformer.KEY_AXES, VALUE_AXES), else they are replicated."""
    m = cfg.model
    return (
        per_shard(slots, data)
        * cfg.sampler.max_target_length
        * m.num_layers
        * 2
        * per_shard(m.num_kv_heads, tensor)
        * m.dim_per_head
        * _BYTES[m.compute_dtype]
    )


def prefill_score_entries(s, groups: int) -> int:
    """Attention scores per head of the largest prefill pass: one prompt of P =
    max_prefill_length tokens (P^2), or a batched pass of the driver when a replica's slots
    hold `groups` >= 2 groups: rows x T^2 with 2 <= rows <= groups and rows x T <=
    prefill_batch_tokens (so T <= prefill_batch_tokens / 2; bounded here by taking T there)."""
    p, budget = s.max_prefill_length, s.prefill_batch_tokens
    t = min(p, budget // 2)
    return max(p * p, min(groups * t * t, budget * t) if groups >= 2 else 0)


def cache_relayout_bytes(cfg: RunConfig, data: int, tensor: int, slots: int) -> int:
    """Bytes of the copy of the KV cache a TPU decode step makes when head_dim is narrower than
    a lane tile: the layer scan carries keys and values with head_dim as their minor axis,
    padded to 128 lanes (measured on v5p: head_dim 16 -> 8x the cache, 64 -> 2x; at 128 the
    cache stays in place)."""
    hd = cfg.model.dim_per_head
    if hd >= LANES:
        return 0
    return kv_cache_bytes(cfg, data, tensor, slots) * lanes(hd) // hd


def sampler_memory(
    cfg: RunConfig, data: int, tensor: int, slots: int, tpu: bool = True
) -> SamplerMemory:
    """Per sampler chip: params in the sampler's dtypes (`sampler_param_bytes`; `embed` is not
    sharded, the sampler mesh has no fsdp axis), the KV cache, prefill's working set (fp32
    scores of the largest prefill pass: heads x `prefill_score_entries`, twice for softmax) and
    a decode step's (each slot's fp32 scores over the whole cache, the decode path attends to
    all S entries, and its fp32 logits; on a TPU, `cache_relayout_bytes`)."""
    m, s = cfg.model, cfg.sampler
    params = sampler_param_bytes(m, {"data": data, "tensor": tensor}, s.weight_dtype)
    h, per_chip = per_shard(m.num_heads, tensor), per_shard(slots, data)
    # The driver groups slots by the pipeline's G, an evaluation by its k: the smaller gives
    # more groups, so larger batched prefills.
    groups = -(-slots // min(cfg.pipeline.generations_per_prompt, cfg.eval.k))
    prefill = 4 * 2 * h * prefill_score_entries(s, groups)
    decode = 4 * per_chip * (h * s.max_target_length + lanes(per_shard(m.vocab_size, tensor)))
    if tpu:
        decode += cache_relayout_bytes(cfg, data, tensor, slots)
    return SamplerMemory(params, kv_cache_bytes(cfg, data, tensor, slots), prefill, decode)


# --------------------------------------------------------------------------- compute, time
@dataclasses.dataclass(frozen=True)
class Assumptions:
    """What a plan cannot know from the config; printed with every plan."""

    mfu: float = 0.4  # model-FLOPs utilisation of compute-bound work (training, prefill, decode)
    mean_prompt: Optional[int] = None  # tokens; None: a quarter of max_prefill_length
    mean_completion: Optional[int] = None  # tokens; None: half of max_new_tokens
    headroom: float = 0.10  # HBM share left to XLA (its own buffers, fragmentation)

    def __post_init__(self):
        if not 0 < self.mfu <= 1:
            raise PlanError(f"--mfu {self.mfu}: must be in (0, 1], e.g. 0.4")
        for name in ("mean_prompt", "mean_completion"):
            v = getattr(self, name)
            if v is not None and v <= 0:
                raise PlanError(f"{name}={v}: must be > 0 tokens")

    def lengths(self, cfg: RunConfig) -> tuple[int, int]:
        s = cfg.sampler
        return (
            self.mean_prompt or max(1, s.max_prefill_length // 4),
            self.mean_completion or max(1, s.max_new_tokens // 2),
        )


@dataclasses.dataclass(frozen=True)
class StepTime:
    trainer_flops: float  # model FLOPs of one optimiser step (all micro-batches)
    sampler_flops: float  # model FLOPs of generating one step's sequences
    trainer_s: float
    prefill_s: float
    decode_steps: float  # decode steps of one host's replica per RL step
    decode_step_s: float
    decode_bytes: int  # HBM bytes each sampler chip reads per decode step
    decode_bound: str  # "HBM bandwidth" or "compute"
    overlap: bool  # PipelineRL on separate chips: trainer and sampler run at the same time

    @property
    def sampler_s(self) -> float:
        return self.prefill_s + self.decode_steps * self.decode_step_s

    @property
    def step_s(self) -> float:
        both = (self.trainer_s, self.sampler_s)
        return max(both) if self.overlap else sum(both)


@dataclasses.dataclass(frozen=True)
class Layout:
    hosts: int
    chips_per_host: int
    trainer_per_host: int
    colocated: bool
    trainer_mesh: tuple  # (data, fsdp, tensor) over all hosts' trainer chips
    sampler_mesh: tuple[int, int]  # (data, tensor) of each host's replica
    micro_batches: int
    remat: bool
    slots: int  # decode slots per sampler replica

    @property
    def sampler_per_host(self) -> int:
        return (
            self.chips_per_host if self.colocated else self.chips_per_host - self.trainer_per_host
        )

    @property
    def trainer_chips(self) -> int:
        return math.prod(self.trainer_mesh)


def step_time(
    cfg: RunConfig, topo: Topology, layout: Layout, sampler: SamplerMemory, assume: Assumptions
) -> StepTime:
    """Model FLOPs of a step and the time they take at `assume.mfu` of the bf16 peak.

    Trainer: P x G rows of (prompt + completion) tokens at transformer.num_flops_per_token
    (6 N + causal attention per token; remat's extra forward is not model FLOPs).
    Sampler: the same tokens at 2 N + attention. Prefill is compute-bound on the host's sampler
    chips. Decode runs every slot of a replica one token per step; PipelineRL keeps the slots
    full (admission runs up to k steps ahead), so a host's share of a step, rows / hosts
    completions of mean length c, takes rows / hosts x c / slots decode steps. Each decode step
    every sampler chip reads its params and its whole KV cache (the decode path attends over
    all S entries) and computes 2 N / tensor + 4 L H hd S / tensor FLOPs per slot; the step
    takes the longer of the read at HBM bandwidth and the compute at the stated MFU.
    """
    from scalerl_jax.models.transformer import matmul_params, num_flops_per_token

    m, pipe = cfg.model, cfg.pipeline
    p, c = assume.lengths(cfg)
    rows = pipe.prompts_per_step * pipe.generations_per_prompt
    rate = topo.chip.bf16_tflops * 1e12 * assume.mfu  # FLOP/s per chip
    trainer_flops = rows * (p + c) * num_flops_per_token(m, p + c, training=True)
    sampler_flops = rows * (p + c) * num_flops_per_token(m, p + c, training=False)
    rows_host = rows / layout.hosts
    prefill_s = (
        rows_host * p * num_flops_per_token(m, p, training=False) / (layout.sampler_per_host * rate)
    )
    data, tensor = layout.sampler_mesh
    per_chip = per_shard(layout.slots, data)
    flops = (
        per_chip
        * (
            2 * matmul_params(m)
            + 4 * m.num_layers * m.num_heads * m.dim_per_head * cfg.sampler.max_target_length
        )
        / tensor
    )
    read = sampler.params + sampler.kv_cache
    t_read, t_flops = read / (topo.chip.hbm_gbps * 1e9), flops / rate
    return StepTime(
        trainer_flops,
        sampler_flops,
        trainer_flops / (layout.trainer_chips * rate),
        prefill_s,
        rows_host * c / layout.slots,
        max(t_read, t_flops),
        read,
        "HBM bandwidth" if t_read >= t_flops else "compute",
        overlap=not layout.colocated and pipe.mode == "pipeline",
    )
