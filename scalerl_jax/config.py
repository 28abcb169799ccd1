"""Run configuration: frozen dataclasses, validated on construction.

Every config error names the field and the offending value, so a typo in an experiment file fails
at start-up with a sentence, not deep inside a jitted function. Configs are plain data: the RL
math never receives them (it takes static scalars), which keeps the losses importable on their own.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import typing
from typing import Any, Optional, Sequence

# The objective -> settings table is shared with rl.losses; that module is free of JAX.
from scalerl_jax.rl.hparams import OBJECTIVE_HPARAMS, OBJECTIVES, SPECIFIC_HPARAMS


class ConfigError(ValueError):
    """A configuration value is invalid. The message names the field and the value."""


def _check(cond: bool, cls: str, field: str, value: Any, why: str) -> None:
    if not cond:
        raise ConfigError(f"{cls}.{field}={value!r}: {why}")


def _positive(cls: str, **fields: Any) -> None:
    for name, value in fields.items():
        _check(value is not None and value > 0, cls, name, value, "must be > 0")


def _choice(cls: str, field: str, value: Any, options: tuple) -> None:
    _check(value in options, cls, field, value, f"must be one of {options}")


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
        _positive("RopeScaling", factor=self.factor, low_freq_factor=self.low_freq_factor,
                  high_freq_factor=self.high_freq_factor,
                  original_max_position_embeddings=self.original_max_position_embeddings)
        _check(self.high_freq_factor > self.low_freq_factor, "RopeScaling", "high_freq_factor",
               self.high_freq_factor, f"must exceed low_freq_factor={self.low_freq_factor}")


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
    # Training path: causal attention in query chunks of this size, each seeing only the keys
    # up to its end (skips ~half the score FLOPs, keeps score blocks cache-sized). 0: one block.
    attention_chunk: int = 128
    # Attention kernel of the training forward (layers.attend): "xla" (einsum + softmax, every
    # platform), "cudnn" (cuDNN flash attention, CUDA GPUs, bf16/fp16), "splash" (the Pallas
    # splash-attention kernel, TPUs), "auto" (the platform's fused kernel where it supports the
    # shapes and dtype, else xla). The decode path always uses xla (see layers.attend).
    attention_impl: str = "xla"
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
        c = "ModelConfig"
        _positive(c, vocab_size=self.vocab_size, hidden_size=self.hidden_size,
                  intermediate_size=self.intermediate_size, num_layers=self.num_layers,
                  num_heads=self.num_heads, num_kv_heads=self.num_kv_heads,
                  rope_theta=self.rope_theta, rms_norm_eps=self.rms_norm_eps,
                  max_position_embeddings=self.max_position_embeddings)
        _check(self.num_heads % self.num_kv_heads == 0, c, "num_kv_heads", self.num_kv_heads,
               f"must divide num_heads={self.num_heads} (grouped-query attention)")
        if self.head_dim is None:
            _check(self.hidden_size % self.num_heads == 0, c, "hidden_size", self.hidden_size,
                   f"must be divisible by num_heads={self.num_heads} when head_dim is not set")
        else:
            _positive(c, head_dim=self.head_dim)
        _check(self.dim_per_head % 2 == 0, c, "head_dim", self.dim_per_head, "must be even (RoPE)")
        _choice(c, "param_dtype", self.param_dtype, DTYPES)
        _choice(c, "compute_dtype", self.compute_dtype, DTYPES)
        _check(self.attention_chunk >= 0, c, "attention_chunk", self.attention_chunk,
               "must be >= 0 (0: no chunking)")
        _choice(c, "attention_impl", self.attention_impl, ATTENTION_IMPLS)
        _choice(c, "remat_policy", self.remat_policy, REMAT_POLICIES)
        _check(self.remat or self.remat_policy == "full", c, "remat_policy", self.remat_policy,
               "needs remat=True (without remat every activation is kept)")
        object.__setattr__(self, "dense_layers", tuple(self.dense_layers))  # JSON lists
        object.__setattr__(self, "nope_layers", tuple(self.nope_layers))
        _check(all(0 <= i < self.num_layers for i in self.nope_layers), c, "nope_layers",
               self.nope_layers, f"must be layer indices in [0, {self.num_layers})")
        _check(self.local_attention_chunk >= 0, c, "local_attention_chunk",
               self.local_attention_chunk, "must be >= 0 (0: global attention)")
        _check(not (self.qk_l2_norm and self.qk_norm), c, "qk_l2_norm", self.qk_l2_norm,
               "excludes qk_norm=True (weightless L2 norm or Qwen3's RMSNorm, not both)")
        _positive(c, attn_floor_scale=self.attn_floor_scale)
        _check(self.attn_scale >= 0, c, "attn_scale", self.attn_scale, "must be >= 0")
        _check(self.num_experts >= 0, c, "num_experts", self.num_experts, "must be >= 0 (0: dense)")
        if self.num_experts:
            _check(0 < self.experts_per_token <= self.num_experts, c, "experts_per_token",
                   self.experts_per_token, f"must be in [1, num_experts={self.num_experts}]")
            if self.moe_intermediate_size is not None:
                _positive(c, moe_intermediate_size=self.moe_intermediate_size)
            _check(self.shared_expert_size >= 0, c, "shared_expert_size",
                   self.shared_expert_size, "must be >= 0 (0: no shared expert)")
            _positive(c, moe_layer_step=self.moe_layer_step)
            _check(all(0 <= i < self.num_layers for i in self.dense_layers), c, "dense_layers",
                   self.dense_layers, f"must be layer indices in [0, {self.num_layers})")
            _choice(c, "router", self.router, ("softmax", "sigmoid"))
            _check(not (self.norm_topk_prob and self.router != "softmax"), c, "norm_topk_prob",
                   self.norm_topk_prob, "only applies to router='softmax'")
            _check(self.router_aux_loss_coef >= 0, c, "router_aux_loss_coef",
                   self.router_aux_loss_coef, "must be >= 0 (0: no load-balancing loss)")
        else:
            _check(self.experts_per_token == 0 and self.shared_expert_size == 0 and
                   self.router_aux_loss_coef == 0, c, "num_experts", 0,
                   "experts_per_token, shared_expert_size and router_aux_loss_coef need "
                   f"num_experts > 0 (got {self.experts_per_token}, {self.shared_expert_size}, "
                   f"{self.router_aux_loss_coef})")

    @property
    def dim_per_head(self) -> int:
        return self.head_dim if self.head_dim is not None else self.hidden_size // self.num_heads

    @property
    def expert_size(self) -> int:
        """FFN width of one routed expert."""
        return self.moe_intermediate_size or self.intermediate_size

    def is_moe_layer(self, i: int) -> bool:
        return (self.num_experts > 0 and (i + 1) % self.moe_layer_step == 0 and
                i not in self.dense_layers)

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
        d, f, h, kv, hd = (self.hidden_size, self.intermediate_size, self.num_heads,
                           self.num_kv_heads, self.dim_per_head)
        attn = d * h * hd + 2 * d * kv * hd + h * hd * d
        if self.qkv_bias:
            attn += h * hd + 2 * kv * hd
        if self.qk_norm:
            attn += 2 * hd
        experts = self.experts_per_token if active else self.num_experts
        moe_ffn = (d * self.num_experts + 3 * d * self.expert_size * experts +
                   3 * d * self.shared_expert_size)
        moe = self.num_moe_layers
        blocks = self.num_layers * (attn + 2 * d) + (self.num_layers - moe) * 3 * d * f + \
            moe * moe_ffn
        emb = self.vocab_size * d * (1 if self.tie_embeddings else 2)
        return blocks + emb + d

    def replace(self, **kw) -> "ModelConfig":
        return dataclasses.replace(self, **kw)


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
        _check(sum(v == -1 for v in sizes.values()) <= 1, c, "data/fsdp/tensor", sizes,
               "at most one axis may be -1")
        _check(self.sampler_tensor == -1 or self.sampler_tensor > 0, c, "sampler_tensor",
               self.sampler_tensor, "must be a positive size or -1 (all sampler devices)")


@dataclasses.dataclass(frozen=True)
class SamplerConfig:
    """Generation: slots, lengths, sampling, interruptions (see DESIGN.md)."""

    max_concurrent_decodes: int = 64  # decode slots per sampler replica
    max_prefill_length: int = 2048
    max_target_length: int = 14336  # KV-cache length: prompt + generation
    max_new_tokens: int = 14336  # hard cap on generated tokens (truncation)
    truncate_long_prompts: bool = False  # else a prompt over max_prefill_length is an error
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0: off
    interruptions: bool = True
    think_min: int = 10000
    think_max: int = 12000
    answer_budget: int = 2048
    think_close: str = "</think>"
    interruption_phrase: str = (
        "Okay, time is up. Let me stop thinking and formulate a final answer now. </think>")
    decode_steps_per_call: int = 1  # generate() steps fused per host round trip
    # When many slots refill at once (a run's first fill, a synchronous round), the driver
    # prefills prompts of one length bucket together, in passes of at most this many padded
    # prompt tokens (bounds the pass's activation memory); 0: one prompt per pass.
    prefill_batch_tokens: int = 8192
    # Sampler weights: "compute" stores each weight in the dtype the forward casts it to
    # (compute dtype; fp32 for norms, the router and an fp32 LM head): the same log-probs
    # bit for bit as "param" (the trainer's param_dtype), in half the HBM with fp32 masters.
    weight_dtype: str = "compute"
    # Weight sync moves the params in groups of at most this many MiB (in the sampler's dtype;
    # a larger single array is its own group): a trainer chip's extra memory is one group.
    weight_sync_group_mib: int = 1024

    def __post_init__(self):
        c = "SamplerConfig"
        _positive(c, max_concurrent_decodes=self.max_concurrent_decodes,
                  max_prefill_length=self.max_prefill_length,
                  max_target_length=self.max_target_length, max_new_tokens=self.max_new_tokens,
                  decode_steps_per_call=self.decode_steps_per_call,
                  weight_sync_group_mib=self.weight_sync_group_mib)
        _choice(c, "weight_dtype", self.weight_dtype, ("compute", "param"))
        _check(self.prefill_batch_tokens >= 0, c, "prefill_batch_tokens",
               self.prefill_batch_tokens, "must be >= 0 (0: one prompt per prefill pass)")
        _check(self.max_prefill_length < self.max_target_length, c, "max_prefill_length",
               self.max_prefill_length, f"must be < max_target_length={self.max_target_length}")
        _check(self.temperature >= 0, c, "temperature", self.temperature,
               "must be >= 0 (0: greedy)")
        _check(0 < self.top_p <= 1, c, "top_p", self.top_p, "must be in (0, 1]")
        _check(self.top_k >= 0, c, "top_k", self.top_k, "must be >= 0 (0: off)")
        if self.interruptions:
            _check(0 < self.think_min <= self.think_max, c, "think_min", self.think_min,
                   f"must be in (0, think_max={self.think_max}]")
            _check(self.answer_budget >= 0, c, "answer_budget", self.answer_budget, "must be >= 0")
            _check(bool(self.interruption_phrase), c, "interruption_phrase",
                   self.interruption_phrase, "must be non-empty when interruptions are on")


LOSS_OBJECTIVES = OBJECTIVES
AGGREGATIONS = ("token", "sequence", "prompt", "constant")
ADVANTAGE_NORMS = ("batch", "group", "none")


@dataclasses.dataclass(frozen=True)
class LossConfig:
    """Objective and its static hyper-parameters. Defaults are ScaleRL's.

    The fields are `rl.losses.policy_loss`'s keywords, one name per setting. The defaults are
    valid for every objective; a setting the chosen objective does not read
    (`rl.hparams.OBJECTIVE_HPARAMS`) must keep its default, else construction fails naming the
    setting and the objective (e.g. objective='cispo' with clip_eps_high=0.28).
    """

    objective: str = "cispo"
    ratio_cap: float = 4.0  # CISPO: absolute cap on rho = pi_theta / pi_behaviour (not 1 + eps)
    ratio_floor: Optional[float] = None  # CISPO optional lower cap (paper: none)
    clip_eps_low: float = 0.2  # grpo / dapo (PPO-clip): clip(rho, 1 - low, 1 + high)
    # 0.2 keeps the default valid for 'grpo' (symmetric); 'dapo' wants clip-higher, set it
    # (DAPO: 0.28, the paper's DAPO baseline: 0.26; dapo_loss's own default is 0.28).
    clip_eps_high: float = 0.2
    dual_clip: Optional[float] = None  # grpo / dapo: dual clip constant c > 1 for A < 0
    gspo_eps_low: float = 3e-3  # GSPO's clip range on the sequence ratio
    gspo_eps_high: float = 4e-3
    # Truncated importance sampling cap on pi_old / pi_behaviour: the 'tis' objective's weight
    # (None: 5.0, PipelineRL's); for the other objectives an optional correction on top (None:
    # off). The train step has no separate pi_old (pi_old = pi_theta), so there any objective
    # with tis_cap=C updates as 'tis' with C does (see train/step.py).
    tis_cap: Optional[float] = None
    aggregation: str = "prompt"
    advantage_norm: str = "batch"
    zero_variance_filter: bool = True
    kl_coef: float = 0.0
    kl_estimator: str = "k3"
    entropy_coef: float = 0.0
    reward_correct: float = 1.0  # paper: +-1 rewards
    reward_incorrect: float = -1.0
    length_penalty: bool = False  # LOO "length penalty instead of interruptions"
    length_penalty_max: int = 14336  # L_max
    length_penalty_cache: int = 2048  # L_cache

    def __post_init__(self):
        c = "LossConfig"
        _choice(c, "objective", self.objective, LOSS_OBJECTIVES)
        _choice(c, "aggregation", self.aggregation, AGGREGATIONS)
        _choice(c, "advantage_norm", self.advantage_norm, ADVANTAGE_NORMS)
        _choice(c, "kl_estimator", self.kl_estimator, ("k1", "k3"))
        uses = OBJECTIVE_HPARAMS[self.objective]
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        for name in SPECIFIC_HPARAMS:
            value = getattr(self, name)
            _check(name in uses or value == defaults[name], c, name, value,
                   f"not used by objective={self.objective!r} (it reads {', '.join(uses)}); "
                   f"leave it at its default {defaults[name]!r}")
        _positive(c, ratio_cap=self.ratio_cap, gspo_eps_low=self.gspo_eps_low,
                  gspo_eps_high=self.gspo_eps_high)
        if self.tis_cap is not None:
            _positive(c, tis_cap=self.tis_cap)
        _check(0 <= self.clip_eps_low < 1, c, "clip_eps_low", self.clip_eps_low,
               "must be in [0, 1)")
        _check(self.clip_eps_high >= 0, c, "clip_eps_high", self.clip_eps_high, "must be >= 0")
        if self.objective == "grpo":
            _check(self.clip_eps_high == self.clip_eps_low, c, "clip_eps_high",
                   self.clip_eps_high, f"objective='grpo' clips symmetrically: must equal "
                   f"clip_eps_low={self.clip_eps_low} (clip-higher is 'dapo')")
        if self.ratio_floor is not None:
            _check(0 <= self.ratio_floor < self.ratio_cap, c, "ratio_floor", self.ratio_floor,
                   f"must be in [0, ratio_cap={self.ratio_cap})")
        if self.dual_clip is not None:
            _check(self.dual_clip > 1, c, "dual_clip", self.dual_clip, "must be > 1")
        _check(self.kl_coef >= 0, c, "kl_coef", self.kl_coef, "must be >= 0")
        _check(self.reward_correct > self.reward_incorrect, c, "reward_correct",
               self.reward_correct, f"must exceed reward_incorrect={self.reward_incorrect}")

    def objective_hparams(self) -> dict:
        """The settings its objective reads, as `policy_loss` keywords (the shared ones
        aggregation / kl_coef / kl_estimator / entropy_coef not included)."""
        return {name: getattr(self, name) for name in OBJECTIVE_HPARAMS[self.objective]}


@dataclasses.dataclass(frozen=True)
class OptimConfig:
    """AdamW. Paper: constant 5e-7 after 100 warm-up steps, eps 1e-15, weight decay 0.01, no KL.
    Betas and clipping are not stated by the paper; these are common choices."""

    learning_rate: float = 5e-7
    warmup_steps: int = 100
    schedule: str = "constant"  # after warm-up: constant | cosine
    total_steps: int = 0  # needed by cosine
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-15
    weight_decay: float = 0.01
    max_grad_norm: Optional[float] = 1.0  # None: no clipping
    micro_batches: int = 1  # gradient accumulation
    logprob_chunk: Optional[int] = 512  # sequence positions per fp32 log-prob chunk (None: all)

    def __post_init__(self):
        c = "OptimConfig"
        _positive(c, learning_rate=self.learning_rate, eps=self.eps,
                  micro_batches=self.micro_batches)
        if self.logprob_chunk is not None:
            _positive(c, logprob_chunk=self.logprob_chunk)
        _check(self.warmup_steps >= 0, c, "warmup_steps", self.warmup_steps, "must be >= 0")
        _choice(c, "schedule", self.schedule, ("constant", "cosine"))
        if self.schedule == "cosine":
            _check(self.total_steps > self.warmup_steps, c, "total_steps", self.total_steps,
                   f"cosine needs total_steps > warmup_steps={self.warmup_steps}")
        for name in ("b1", "b2"):
            v = getattr(self, name)
            _check(0 <= v < 1, c, name, v, "must be in [0, 1)")
        _check(self.weight_decay >= 0, c, "weight_decay", self.weight_decay, "must be >= 0")
        if self.max_grad_norm is not None:
            _positive(c, max_grad_norm=self.max_grad_norm)


@dataclasses.dataclass(frozen=True)
class PipelineConfig:
    """Off-policy mode and batch shape. Paper: PipelineRL-8, 48 prompts x 16 generations."""

    mode: str = "pipeline"  # pipeline | ppo_off_policy | sync
    max_lag: int = 8  # k: trainer waits when this many versions ahead of its oldest data
    prompts_per_step: int = 48
    generations_per_prompt: int = 16
    seq_bucket: int = 128  # train batches pad T to a multiple of this, so the step compiles once
    no_positive_resampling: bool = True
    retire_pass_rate: float = 0.9

    def __post_init__(self):
        c = "PipelineConfig"
        _choice(c, "mode", self.mode, ("pipeline", "ppo_off_policy", "sync"))
        _positive(c, max_lag=self.max_lag, prompts_per_step=self.prompts_per_step,
                  seq_bucket=self.seq_bucket)
        _check(self.generations_per_prompt >= 2, c, "generations_per_prompt",
               self.generations_per_prompt, "must be >= 2 (group-relative advantages)")
        _check(0 < self.retire_pass_rate <= 1, c, "retire_pass_rate", self.retire_pass_rate,
               "must be in (0, 1]")


VERIFIER_NAMES = ("math", "code", "exact")  # or "package.module:function"
MIXTURE = "mixture"  # DataConfig.source of a multi-domain run
# How a row's reference answer is read from its answer field (data/answers.py).
ANSWER_FORMATS = ("raw", "gsm8k", "boxed")
# How an SFT demonstration's completion field becomes its target text (data/answers.py).
COMPLETION_FORMATS = ("raw", "gsm8k")
# Placeholders of a source that follows the RL data (DataConfig.validation_source,
# SFTConfig.source): data.source itself, and the directory holding it.
SOURCE_PLACEHOLDERS = ("{data_source}", "{data_dir}")


def _check_placeholders(cls: str, field: str, value: str) -> None:
    unknown = sorted(set(re.findall(r"\{[A-Za-z_]+\}", value)) - set(SOURCE_PLACEHOLDERS))
    _check(not unknown, cls, field, value, f"unknown placeholder(s) {unknown}; known: "
           f"{list(SOURCE_PLACEHOLDERS)}")


def resolve_source(value: str, data_source: str, field: str) -> str:
    """`value` with {data_source} (the RL data's DataConfig.source) and {data_dir} (the
    directory holding it; the directory itself when it is one) filled in."""
    if "{data_dir}" in value:
        if data_source == MIXTURE or data_source.startswith(("hf:", "tfds:", "synthetic:")):
            raise ConfigError(f"{field}={value!r}: {{data_dir}} needs a local data.source (a "
                              f"file or directory), not {data_source!r}; give the path itself")
        folder = data_source if os.path.isdir(data_source) else os.path.dirname(data_source)
        value = value.replace("{data_dir}", folder or ".")
    return value.replace("{data_source}", data_source)


@dataclasses.dataclass(frozen=True)
class DomainConfig:
    """One domain of a data mixture (DataConfig.domains): its own source, field mapping, share
    of the training prompts (`weight`, relative to the other domains'), verifier and number of
    held-out validation prompts. `num_validation` / `template` / `system_prompt` of None use
    DataConfig's; `answer_format` and `validation_source` mean what DataConfig's do (there they
    stay at their defaults in a mixture), {data_dir} being this domain's source's directory.
    `verifier`: "math", "code", "exact" or "package.module:function"; None picks one by source
    (synthetic tasks: their own, else math)."""

    name: str
    source: str = ""
    weight: float = 1.0
    verifier: Optional[str] = None
    split: str = "train"
    prompt_field: str = "problem"
    answer_field: str = "answer"
    id_field: Optional[str] = "id"
    num_validation: Optional[int] = None
    template: Optional[str] = None
    system_prompt: Optional[str] = None
    answer_format: str = "raw"
    validation_source: Optional[str] = None

    def __post_init__(self):
        c = f"DomainConfig[{self.name!r}]"
        # The name keys metrics ("per_domain.NAME") and overrides (data.domains.NAME.weight=2).
        _check(bool(re.fullmatch(r"[A-Za-z0-9_-]+", str(self.name))), "DomainConfig", "name",
               self.name, "must be a non-empty word of letters, digits, '_' or '-'")
        _check(bool(self.source), c, "source", self.source,
               f"must be non-empty (set data.domains.{self.name}.source=...)")
        _check(isinstance(self.weight, (int, float)) and math.isfinite(self.weight)
               and self.weight > 0, c, "weight", self.weight, "must be a finite number > 0")
        if self.verifier is not None:
            _check(self.verifier in VERIFIER_NAMES or ":" in self.verifier, c, "verifier",
                   self.verifier, f"must be one of {VERIFIER_NAMES} or 'package.module:function'")
        if self.num_validation is not None:
            _check(self.num_validation >= 0, c, "num_validation", self.num_validation,
                   "must be >= 0")
        if self.template is not None:
            _check(self.template == "chat" or "{prompt}" in self.template, c, "template",
                   self.template, "must be 'chat' or contain '{prompt}'")
        _choice(c, "answer_format", self.answer_format, ANSWER_FORMATS)
        if self.validation_source is not None:
            _check(bool(self.validation_source), c, "validation_source",
                   self.validation_source, "must be a source or none")
            _check_placeholders(c, "validation_source", self.validation_source)


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """Prompt source. `source` is a local .jsonl/.parquet path, `hf:NAME_OR_DIR`, `tfds:NAME`,
    or `synthetic:TASK` for the CPU testbed; or "mixture" with `domains` set: several sources
    drawn by weight (data/mixture.py). In a mixture each domain has its own source and field
    mapping, so the single-source fields (split, prompt_field, answer_field, id_field,
    answer_format, validation_source) must keep their defaults; num_validation (each domain's
    default), template, system_prompt, max_bad_fraction, validation_split and seed are shared.

    Validation: `num_validation` rows of `source` are held out (ranked by a hash of their id),
    or, with `validation_source` set (e.g. "{data_dir}/test.jsonl": GSM8K's test file beside
    its train.jsonl), the held-out prompts come from that source instead (the first
    `num_validation` of its rows in the same hash order; all of them when it has fewer) and
    every row of `source` trains, except rows whose problem is also a validation prompt."""

    source: str = "synthetic:arithmetic"
    split: str = "train"
    prompt_field: str = "problem"
    answer_field: str = "answer"
    id_field: Optional[str] = "id"  # stable prompt ids (curriculum); absent: hash of the prompt
    template: str = "{prompt}"  # or "chat": the tokenizer's chat template
    system_prompt: Optional[str] = None
    num_validation: int = 1000
    max_bad_fraction: float = 0.01
    seed: int = 0
    domains: tuple[DomainConfig, ...] = ()  # a mixture (source="mixture"); () for one source
    # How the reference answer is read from `answer_field` (data/answers.py): "raw" the text as
    # it is; "gsm8k" the number after the last "####" (GSM8K's worked solutions), thousands
    # separators removed; "boxed" the content of the last \boxed{} (MATH-style solutions). A
    # row whose answer cannot be read so is skipped and counted like any malformed row.
    answer_format: str = "raw"
    # Held-out prompts from their own source (see the docstring); "{data_dir}" / "{data_source}"
    # stand for the directory of `source` / `source` itself. Read as its `validation_split`
    # (the split of an hf: / tfds: source, or the files of a directory whose names hold it).
    validation_source: Optional[str] = None
    validation_split: str = "test"

    def __post_init__(self):
        c = "DataConfig"
        _check(bool(self.source), c, "source", self.source, "must be non-empty")
        _choice(c, "answer_format", self.answer_format, ANSWER_FORMATS)
        if self.validation_source is not None:
            _check(bool(self.validation_source), c, "validation_source", self.validation_source,
                   "must be a source or none (hold num_validation rows out of `source`)")
            _check_placeholders(c, "validation_source", self.validation_source)
        _check(bool(self.validation_split), c, "validation_split", self.validation_split,
               "must be non-empty")
        _check(self.num_validation >= 0, c, "num_validation", self.num_validation, "must be >= 0")
        _check(0 <= self.max_bad_fraction < 1, c, "max_bad_fraction", self.max_bad_fraction,
               "must be in [0, 1)")
        _check(self.template == "chat" or "{prompt}" in self.template, c, "template",
               self.template, "must be 'chat' or contain '{prompt}'")
        domains = tuple(self.domains)  # a list (JSON, hand-written) becomes the hashable tuple
        object.__setattr__(self, "domains", domains)
        for d in domains:
            _check(isinstance(d, DomainConfig), c, "domains", d, "items must be DomainConfig")
        names = [d.name for d in domains]
        repeated = sorted({n for n in names if names.count(n) > 1})
        _check(not repeated, c, "domains", names, f"domain names must be unique; repeated: "
               f"{repeated}")
        if not domains:
            _check(self.source != MIXTURE, c, "source", self.source,
                   "a mixture needs DataConfig.domains (e.g. data.domains.math.source=...)")
            return
        _check(self.source == MIXTURE, c, "source", self.source,
               f"must be {MIXTURE!r} when domains are set (each domain has its own source: "
               f"{dict(zip(names, (d.source for d in domains)))})")
        for f in dataclasses.fields(self):
            if f.name in _PER_DOMAIN:
                _check(getattr(self, f.name) == f.default, c, f.name, getattr(self, f.name),
                       f"a mixture sets this per domain (data.domains.NAME.{f.name}); leave "
                       f"it at its default {f.default!r}")

    @property
    def is_mixture(self) -> bool:
        return bool(self.domains)

    def sources(self) -> tuple[str, ...]:
        """Every source the run reads: the domains' in a mixture, else (source,)."""
        return tuple(d.source for d in self.domains) if self.domains else (self.source,)

    def validation_path(self) -> Optional[str]:
        """`validation_source` with its placeholders filled in; None when unset."""
        if self.validation_source is None:
            return None
        return resolve_source(self.validation_source, self.source, "DataConfig.validation_source")

    def domain_data(self, name: str) -> "DataConfig":
        """Domain `name` as a single-source DataConfig (its fields, the shared ones from here)."""
        d = next((d for d in self.domains if d.name == name), None)
        if d is None:
            raise ConfigError(f"DataConfig.domains has no domain {name!r}; domains: "
                              f"{[d.name for d in self.domains]}")
        return DataConfig(
            source=d.source, split=d.split, prompt_field=d.prompt_field,
            answer_field=d.answer_field, id_field=d.id_field,
            template=self.template if d.template is None else d.template,
            system_prompt=self.system_prompt if d.system_prompt is None else d.system_prompt,
            num_validation=self.num_validation if d.num_validation is None else
            d.num_validation, max_bad_fraction=self.max_bad_fraction,
            seed=self.seed, answer_format=d.answer_format,
            validation_source=d.validation_source, validation_split=self.validation_split)


_PER_DOMAIN = ("split", "prompt_field", "answer_field", "id_field", "answer_format",
               "validation_source")


@dataclasses.dataclass(frozen=True)
class RewardConfig:
    """Verifier execution. Rewards run on a host pool; a crash or timeout scores as failure."""

    workers: int = 8
    timeout_s: float = 10.0
    # Spawned child-process workers, killed and replaced when an item runs past timeout_s (a
    # thread stuck in SymPy cannot be stopped). None: automatic (rewards.use_processes), i.e.
    # processes for every verifier except the exact-match one of synthetic tasks.
    processes: Optional[bool] = None
    require_think_close: bool = False  # no `</think>` -> no answer (templates that open <think>)
    verifier: Optional[str] = None  # "math" / "code" / "exact" / "package.module:function";
    # None: by data source (one source; a mixture sets DomainConfig.verifier)
    # Code rewards' sandbox (rewards/sandbox.py): "strong" needs bubblewrap and refuses to run
    # code without it; "best" accepts the weak mode where bubblewrap is missing; "weak" always.
    code_isolation: str = "strong"

    def __post_init__(self):
        _positive("RewardConfig", workers=self.workers, timeout_s=self.timeout_s)
        _check(self.code_isolation in ("strong", "best", "weak"), "RewardConfig",
               "code_isolation", self.code_isolation, "must be 'strong', 'best' or 'weak'")
        _check(self.processes is None or isinstance(self.processes, bool), "RewardConfig",
               "processes", self.processes, "must be true, false or none (automatic)")
        if self.verifier is not None:
            _check(self.verifier in VERIFIER_NAMES or ":" in self.verifier, "RewardConfig",
                   "verifier", self.verifier,
                   f"must be one of {VERIFIER_NAMES} or 'package.module:function'")


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    """Held-out validation: mean@k pass rate every N steps (paper: 1,000 prompts, k=16, N=100),
    sampled like training (SamplerConfig's temperature / top-p / top-k)."""

    every_steps: int = 100
    k: int = 16
    num_prompts: int = 1000

    def __post_init__(self):
        _positive("EvalConfig", every_steps=self.every_steps, k=self.k,
                  num_prompts=self.num_prompts)


@dataclasses.dataclass(frozen=True)
class ForecastConfig:
    """Online forecast (scaling/forecast.py): at each evaluation the sigmoid is refitted on the
    validation points so far, in a background child process, and a `forecast` record is written.

    budget: the compute (in `x_key` units) to predict the pass rate at; None: the compute the
    run will have spent at its last step, extrapolated from the compute per step so far.
    target: a pass rate whose required compute is forecast; None: not forecast.
    n_boot: bootstrap resamples for the intervals (0: point estimates only).
    """

    enabled: bool = True
    budget: Optional[float] = None
    target: Optional[float] = None
    n_boot: int = 100
    x_key: str = "compute.device_hours"

    def __post_init__(self):
        c = "ForecastConfig"
        if self.budget is not None:
            _check(math.isfinite(self.budget) and self.budget > 0, c, "budget", self.budget,
                   "must be a compute > 0 (in x_key units) or none (the run's projected end)")
        if self.target is not None:
            _check(math.isfinite(self.target) and 0 < self.target < 1, c, "target",
                   self.target, "must be a pass rate in (0, 1) or none")
        _check(self.n_boot == 0 or self.n_boot >= 10, c, "n_boot", self.n_boot,
               "must be 0 (no intervals) or >= 10 resamples")
        _check(bool(self.x_key), c, "x_key", self.x_key, "must be an eval-record key path")


@dataclasses.dataclass(frozen=True)
class SFTConfig:
    """Supervised warm-up that makes the RL stage's base policy (the paper RL-trains an SFT model).

    `source`: demonstrations, `synthetic:TASK[?knobs]` (each problem with its worked thought) or
    a local .jsonl/.parquet file whose rows hold `prompt_field` (the problem, formatted with the
    RL data's template so the policy sees the same prompts in both stages) and
    `completion_field` (the full target text, e.g. "<think>...</think>answer"); "{data_source}"
    is the RL data's source (DataConfig.source), "{data_dir}" its directory.
    `completion_format`: "raw" takes the completion as it is; "gsm8k" rewrites a GSM8K worked
    solution into the reasoning lines without their <<...>> calculator annotations, ending in
    "The final answer is \\boxed{N}." (data/answers.py); a row that cannot be rewritten is
    skipped and counted. The RL validation prompts are removed from the demonstrations. The
    loss is the mean token cross-entropy of the completions (eos appended); demonstrations are
    packed into rows.
    """

    source: str = "synthetic:chain"
    prompt_field: str = "prompt"
    completion_field: str = "completion"
    steps: int = 200
    batch_size: int = 16  # rows per step, each packed with whole demonstrations
    max_length: int = 256  # row length in tokens; longer demonstrations are skipped
    optim: OptimConfig = OptimConfig(learning_rate=1e-3, warmup_steps=10, eps=1e-8,
                                     weight_decay=0.0)
    log_every: int = 10
    completion_format: str = "raw"

    def __post_init__(self):
        c = "SFTConfig"
        _check(bool(self.source), c, "source", self.source, "must be non-empty")
        _check_placeholders(c, "source", self.source)
        _positive(c, steps=self.steps, batch_size=self.batch_size, max_length=self.max_length,
                  log_every=self.log_every)
        _choice(c, "completion_format", self.completion_format, COMPLETION_FORMATS)

    def source_for(self, data: "DataConfig") -> str:
        """`source` with its placeholders filled in from the RL data config."""
        return resolve_source(self.source, data.source, "SFTConfig.source")


@dataclasses.dataclass(frozen=True)
class RunConfig:
    model: ModelConfig
    mesh: MeshConfig = MeshConfig()
    sampler: SamplerConfig = SamplerConfig()
    loss: LossConfig = LossConfig()
    optim: OptimConfig = OptimConfig()
    pipeline: PipelineConfig = PipelineConfig()
    data: DataConfig = DataConfig()
    reward: RewardConfig = RewardConfig()
    eval: EvalConfig = EvalConfig()
    workdir: str = "runs/default"
    seed: int = 0
    steps: int = 1000
    checkpoint_every: int = 50
    keep_checkpoints: int = 3
    keep_every: Optional[int] = None  # also keep every M-th step permanently
    hf_checkpoint: Optional[str] = None  # initial weights (HF directory); None: random init
    sft: Optional[SFTConfig] = None  # supervised warm-up before RL (from hf_checkpoint or init)
    forecast: ForecastConfig = ForecastConfig()  # online sigmoid forecast at each evaluation
    max_skipped_steps: int = 5  # stop after this many consecutive non-finite steps

    def __post_init__(self):
        c = "RunConfig"
        _positive(c, steps=self.steps, checkpoint_every=self.checkpoint_every,
                  keep_checkpoints=self.keep_checkpoints, max_skipped_steps=self.max_skipped_steps)
        if self.keep_every is not None:
            _positive(c, keep_every=self.keep_every)

    def to_dict(self) -> dict:
        """Plain JSON types (tuples as lists), equal to what config.json reads back."""
        out = json.loads(json.dumps(dataclasses.asdict(self)))
        if not self.data.domains:  # one source: the dict of before mixtures
            del out["data"]["domains"]
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)


def from_dict(cls, data: dict):
    """Rebuild a (nested) config dataclass from `to_dict()` output; unknown keys are an error."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = set(data) - set(fields)
    if unknown:
        raise ConfigError(f"{cls.__name__}: unknown field(s) {sorted(unknown)}")
    kwargs = {}
    for name, value in data.items():
        sub = _NESTED.get((cls, name))
        if sub is None or value is None:
            kwargs[name] = value
        elif isinstance(value, (list, tuple)):  # a tuple of sections, e.g. DataConfig.domains
            kwargs[name] = tuple(from_dict(sub, v) for v in value)
        else:
            kwargs[name] = from_dict(sub, value)
    return cls(**kwargs)


_NESTED = {
    (ModelConfig, "rope_scaling"): RopeScaling,
    (RunConfig, "model"): ModelConfig,
    (RunConfig, "mesh"): MeshConfig,
    (RunConfig, "sampler"): SamplerConfig,
    (RunConfig, "loss"): LossConfig,
    (RunConfig, "optim"): OptimConfig,
    (RunConfig, "pipeline"): PipelineConfig,
    (RunConfig, "data"): DataConfig,
    (DataConfig, "domains"): DomainConfig,
    (RunConfig, "reward"): RewardConfig,
    (RunConfig, "eval"): EvalConfig,
    (RunConfig, "sft"): SFTConfig,
    (RunConfig, "forecast"): ForecastConfig,
    (SFTConfig, "optim"): OptimConfig,
}


def field_defaults(cls=None, prefix: str = "") -> dict:
    """{dotted path: default, as JSON} of every field with a default, sections walked. A run
    directory started before a field existed resumes when the field keeps its default
    (rundir.check_config)."""
    cls = RunConfig if cls is None else cls
    out = {}
    for f in dataclasses.fields(cls):
        path = f"{prefix}{f.name}"
        sub = _NESTED.get((cls, f.name))
        if sub is not None and f.default is dataclasses.MISSING and \
                f.default_factory is dataclasses.MISSING:
            out.update(field_defaults(sub, path + "."))
            continue
        if f.default is not dataclasses.MISSING:
            value = f.default
        elif f.default_factory is not dataclasses.MISSING:
            value = f.default_factory()
        else:
            continue
        if dataclasses.is_dataclass(value):
            out.update(field_defaults(type(value), path + "."))
            value = dataclasses.asdict(value)
        out[path] = json.loads(json.dumps(value))
    return out


# ------------------------------------------------------------------------ command-line overrides
def _parse_value(text: str) -> Any:
    low = text.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("none", "null"):
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _coerce(value: Any, hint: Any, key: str) -> Any:
    """`value` as the field type `hint` (int, float, bool, str, Optional[...]), else an error."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) is typing.Union:  # Optional[X]
        if value is None and type(None) in args:
            return None
        hint = next(a for a in args if a is not type(None))
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint is str and not isinstance(value, str):
        return str(value)  # e.g. a numeric-looking string such as a run name "42"
    if isinstance(hint, type) and isinstance(value, hint) and \
            not (hint is int and isinstance(value, bool)):
        return value
    raise ConfigError(f"override {key}: expected {getattr(hint, '__name__', hint)}, got "
                      f"{type(value).__name__}")


def _apply(obj: Any, tree: dict, prefix: str) -> Any:
    """`obj` with the overrides in `tree` ({field: text or subtree}), every field of one section
    replaced at once, so that fields validated together (think_min <= think_max) can move
    together."""
    cls = type(obj)
    fields = {f.name for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    changes = {}
    for name, sub in tree.items():
        key = prefix + name
        if name not in fields:
            raise ConfigError(f"override {key}: {cls.__name__} has no field {name!r}; fields: "
                              f"{sorted(fields)}")
        current = getattr(obj, name)
        item = _named_sections(hints[name])
        if item is not None:  # data.domains.NAME.field=value: sections addressed by name
            changes[name] = _apply_named(current, item, sub, key)
            continue
        if not isinstance(sub, dict):
            if _parse_value(sub) is None and type(None) in typing.get_args(hints[name]):
                changes[name] = None  # e.g. sft=none turns an optional stage off
                continue
            if dataclasses.is_dataclass(current):
                raise ConfigError(f"override {key}: {name!r} is a section; set one of its "
                                  f"fields ({key}.<field>=...)")
            changes[name] = _coerce(_parse_value(sub), hints[name], f"{key}={sub}")
            continue
        if current is None:  # an optional section that is off: start from its defaults
            section = next((a for a in typing.get_args(hints[name])
                            if dataclasses.is_dataclass(a)), None)
            if section is None:
                raise ConfigError(f"override {key}: {name!r} is not a section")
            try:
                current = section()
            except TypeError:
                raise ConfigError(f"override {key}: {name!r} is unset and has no defaults; set "
                                  f"it in a recipe") from None
        elif not dataclasses.is_dataclass(current):
            raise ConfigError(f"override {key}: {name!r} is a value, not a section")
        changes[name] = _apply(current, sub, key + ".")
    return dataclasses.replace(obj, **changes)


def _named_sections(hint: Any) -> Optional[type]:
    """X when `hint` is tuple[X, ...] of a dataclass X with a `name` field, else None."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) is tuple and len(args) == 2 and args[1] is Ellipsis and \
            dataclasses.is_dataclass(args[0]) and \
            "name" in {f.name for f in dataclasses.fields(args[0])}:
        return args[0]
    return None


def _apply_named(items: tuple, cls: type, tree: Any, key: str) -> tuple:
    """`items` (a tuple of `cls` sections) with `tree` = {name: {field: text}} applied: a
    known name is updated, a new one is added (built from its fields), `name=none` removes it
    and `key=none` clears them all."""
    if not isinstance(tree, dict):
        if _parse_value(tree) is None:
            return ()
        raise ConfigError(f"override {key}={tree}: {key} holds named sections; set "
                          f"{key}.NAME.<field>=... (or {key}.NAME=none to drop one)")
    out = list(items)
    for name, sub in tree.items():
        where = next((i for i, it in enumerate(out) if it.name == name), None)
        if not isinstance(sub, dict):
            if _parse_value(sub) is not None:
                raise ConfigError(f"override {key}.{name}={sub}: set {key}.{name}.<field>=... "
                                  f"or {key}.{name}=none")
            if where is None:
                raise ConfigError(f"override {key}.{name}=none: no such entry; have "
                                  f"{[it.name for it in out]}")
            out.pop(where)
            continue
        if "name" in sub:
            raise ConfigError(f"override {key}.{name}.name: the name is the key; rename by "
                              f"dropping {key}.{name}=none and adding the new one")
        if where is not None:
            out[where] = _apply(out[where], sub, f"{key}.{name}.")
            continue
        hints, fields = typing.get_type_hints(cls), {f.name for f in dataclasses.fields(cls)}
        values = {}
        for field, text in sub.items():
            if field not in fields or isinstance(text, dict):
                raise ConfigError(f"override {key}.{name}.{field}: {cls.__name__} has no value "
                                  f"field {field!r}; fields: {sorted(fields)}")
            parsed = _parse_value(text)
            values[field] = None if parsed is None and type(None) in typing.get_args(
                hints[field]) else _coerce(parsed, hints[field], f"{key}.{name}.{field}={text}")
        out.append(cls(name=name, **values))
    return tuple(out)


def apply_overrides(cfg: "RunConfig", overrides: Sequence[str]) -> "RunConfig":
    """`cfg` with `key.path=value` overrides, e.g. `pipeline.mode=sync`,
    `optim.learning_rate=3e-4`, `sft.steps=100`, `sampler.top_k=none`. Values are parsed as
    bool / none / int / float / text and checked against the field's type; each changed section
    is rebuilt once with all its new values and validated by its own dataclass, so a bad value
    fails with the usual ConfigError. A later override of the same key wins. Sections kept in
    a tuple by name (DataConfig.domains) are addressed by that name: `data.domains.code.weight=2`
    changes one, a new name adds one, `data.domains.code=none` drops it."""
    tree: dict = {}
    for item in overrides:
        key, sep, value = item.partition("=")
        path = key.strip().split(".")
        if not sep or not all(path):
            raise ConfigError(f"override {item!r}: expected key.path=value")
        node = tree
        for part in path[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {item!r}: {part!r} was set as a value")
        node[path[-1]] = value
    return _apply(cfg, tree, "") if tree else cfg
