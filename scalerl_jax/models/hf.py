"""Hugging Face interop: `config.json` -> ModelConfig, safetensors -> sharded params, and back.

Loading reads each tensor lazily (memory-mapped safetensors) and builds every parameter with
`jax.make_array_from_callback` in its target sharding: each device's callback reads exactly the
slice that device holds, so no full host copy of the model (nor of a tensor, per device) is made.
Export gathers one parameter at a time and streams it into the safetensors file, whose header is
computed up front from shapes alone.

Layouts: HF linear weights are [out, in]; ours are [in, ..., out] with heads split out, e.g.
`q_proj.weight` [H*hd, D] <-> `q` [D, H, hd]. HF Llama/Qwen checkpoints already use the
half-split (`rotate_half`) RoPE convention that `layers.apply_rope` implements, so no row
permutation is needed.

Qwen3-MoE experts: the hub stores one tensor per expert (`mlp.experts.{e}.gate_proj.weight`
[F, D], ...), which is also what transformers 5's `save_pretrained` writes; in memory
transformers 5 fuses them (`mlp.experts.gate_up_proj` [E, 2F, D], `mlp.experts.down_proj`
[E, D, F]), and checkpoints saved from that layout are read too. Either way each device reads
only its experts' slices into our stacked [E, D, F] / [E, F, D] params. Export writes the
per-expert hub layout.

Llama-4 (`Llama4ForCausalLM`, or the language model of a `Llama4ForConditionalGeneration`
checkpoint, whose vision tower is skipped): NoPE layers, chunked local attention, L2 qk-norm and
temperature tuning map to ModelConfig fields. Its routed experts are stored stacked and fused
(`feed_forward.experts.gate_up_proj` [E, D, 2F] with gate then up on the last axis,
`down_proj` [E, F, D]), already our [in, out] layout, so gate and up are column halves of one
tensor. Llama-4 applies RoPE to interleaved pairs (dims 2i, 2i+1), our `apply_rope` to
half-split pairs (i, i + hd/2): q_proj / k_proj rows are permuted within each head at load
(and back at export) so the half-split code computes exactly Llama-4's attention: q.k is
unchanged because q and k are permuted alike, and the L2 norm and temperature scale are
permutation-invariant. A load-time permutation rather than a config flag keeps one RoPE code
path (training forward, decode, attention kernels all see half-split q/k) and adds nothing per
step (an interleaved rotation needs a trailing size-2 axis, which TPU layouts pad; on CPU it
measured about as fast, so the gain is mostly simplicity).
"""
from __future__ import annotations

import contextlib
import dataclasses
import glob
import json
import logging
import math
import os
import struct
from typing import Any, Optional, Union

import jax
import ml_dtypes  # noqa: F401 - registers bfloat16 with numpy: safetensors' numpy reader needs it
import numpy as np
from flax import nnx

from scalerl_jax.config import DTYPES, ModelConfig, RopeScaling
from scalerl_jax.models.transformer import Transformer

log = logging.getLogger(__name__)

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM",
                           "Qwen3MoeForCausalLM", "Llama4ForCausalLM",
                           "Llama4ForConditionalGeneration")
_MODEL_TYPES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                "qwen3": "Qwen3ForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM",
                "llama4_text": "Llama4ForCausalLM", "llama4": "Llama4ForConditionalGeneration"}
# A Llama4ForConditionalGeneration checkpoint's language-model tensors carry this prefix.
_LLAMA4_TEXT_PREFIX = "language_model."
_ST_DTYPES = {"float32": "F32", "bfloat16": "BF16", "float16": "F16", "float64": "F64"}


class HFError(ValueError):
    """An HF checkpoint does not fit: unknown architecture, missing/unexpected tensor, bad shape."""


# -- config -------------------------------------------------------------------------------------
def read_hf_config(path_or_dict: Union[str, os.PathLike, dict]) -> dict:
    if isinstance(path_or_dict, dict):
        return dict(path_or_dict)
    path = os.fspath(path_or_dict)
    if os.path.isdir(path):
        path = os.path.join(path, "config.json")
    if not os.path.exists(path):
        raise HFError(f"no HF config at {path}")
    with open(path) as f:
        return json.load(f)


def _required(hf: dict, key: str):
    if hf.get(key) is None:
        raise HFError(f"config.json has no {key!r} (keys: {sorted(hf)})")
    return hf[key]


def _dir_name(path_or_dict) -> Optional[str]:
    if isinstance(path_or_dict, dict):
        return None
    path = os.path.abspath(os.fspath(path_or_dict))
    return os.path.basename(path if os.path.isdir(path) else os.path.dirname(path))


def _architecture(hf: dict) -> str:
    archs = hf.get("architectures") or []
    arch = archs[0] if archs else _MODEL_TYPES.get(hf.get("model_type"), hf.get("model_type"))
    if arch not in SUPPORTED_ARCHITECTURES:
        raise HFError(f"unsupported architecture {arch!r} (config.json architectures={archs}, "
                      f"model_type={hf.get('model_type')!r}); supported: {SUPPORTED_ARCHITECTURES}")
    return arch


def _rope(hf: dict) -> tuple[float, Optional[RopeScaling]]:
    # transformers < 5 writes `rope_theta` + `rope_scaling`; >= 5 writes `rope_parameters`
    # (holding rope_theta too). Either may be absent or null.
    params = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
    theta = float(params.get("rope_theta", hf.get("rope_theta", 10000.0)))
    kind = params.get("rope_type", params.get("type", "default"))
    if kind in (None, "default"):
        return theta, None
    if kind != "llama3":
        raise HFError(f"rope type {kind!r} is not supported (only 'default' and 'llama3'); "
                      f"rope settings: {params}")
    return theta, RopeScaling(
        factor=float(params["factor"]), low_freq_factor=float(params["low_freq_factor"]),
        high_freq_factor=float(params["high_freq_factor"]),
        original_max_position_embeddings=int(params["original_max_position_embeddings"]))


def config_from_hf(path_or_dict, **overrides) -> ModelConfig:
    """ModelConfig from an HF `config.json` (a checkpoint directory, the file, or its dict).

    `overrides` replace fields afterwards (e.g. `param_dtype="bfloat16"`). Features this decoder
    does not implement (output-projection or MLP biases, sliding windows, other activations or
    RoPE types) fail here rather than loading into a silently different model.
    """
    hf = read_hf_config(path_or_dict)
    arch = _architecture(hf)
    name = hf.get("_name_or_path") or _dir_name(path_or_dict) or arch
    if arch.startswith("Llama4"):
        fields = dict(_llama4_fields(_llama4_text_config(hf, arch)), name=name)
        fields.update(overrides)
        return ModelConfig(**fields)
    # Qwen2 always has q/k/v biases and no `attention_bias` key; elsewhere that key also adds
    # an o_proj bias, which this decoder does not have.
    for key, ok in (("hidden_act", "silu"), ("attention_bias", False), ("mlp_bias", False),
                    ("use_sliding_window", False)):
        if hf.get(key, ok) != ok:
            raise HFError(f"config.json {key}={hf[key]!r} is not supported for {arch} "
                          f"(expected {ok!r})")
    theta, scaling = _rope(hf)
    d, heads, head_dim = _attention_dims(hf)
    fields = dict(
        name=name, vocab_size=int(_required(hf, "vocab_size")), hidden_size=d,
        intermediate_size=int(_required(hf, "intermediate_size")),
        num_layers=int(_required(hf, "num_hidden_layers")),
        num_heads=heads, num_kv_heads=int(hf.get("num_key_value_heads") or heads),
        head_dim=None if head_dim is None else int(head_dim), rope_theta=theta,
        rope_scaling=scaling, rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        qkv_bias=arch == "Qwen2ForCausalLM",
        qk_norm=arch in ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM"),
        max_position_embeddings=int(hf.get("max_position_embeddings", 32768)))
    if arch == "Qwen3MoeForCausalLM":
        fields.update(_moe_fields(hf))
    fields.update(overrides)
    return ModelConfig(**fields)


def _attention_dims(hf: dict) -> tuple:
    d, heads = int(_required(hf, "hidden_size")), int(_required(hf, "num_attention_heads"))
    head_dim = hf.get("head_dim")
    if head_dim is not None and int(head_dim) == d // heads and d % heads == 0:
        head_dim = None  # the default; keeps configs equal to the presets
    return d, heads, None if head_dim is None else int(head_dim)


def _llama4_text_config(hf: dict, arch: str) -> dict:
    if arch == "Llama4ForCausalLM":
        return hf
    text = hf.get("text_config")
    if not isinstance(text, dict):
        raise HFError(f"Llama4ForConditionalGeneration config.json has no 'text_config' dict "
                      f"(keys: {sorted(hf)})")
    log.info("Llama4ForConditionalGeneration: loading its language model (text_config, "
             "%s* tensors) only; the vision tower (vision_config, vision_model.*, "
             "multi_modal_projector.*) is ignored", _LLAMA4_TEXT_PREFIX)
    return text


def _llama4_fields(hf: dict) -> dict:
    """ModelConfig fields of a Llama4TextConfig dict. Absent keys take that class's defaults."""
    for key, ok in (("hidden_act", "silu"), ("attention_bias", False),
                    ("router_jitter_noise", 0.0)):
        if hf.get(key, ok) != ok:
            raise HFError(f"Llama-4 config.json {key}={hf[key]!r} is not supported "
                          f"(expected {ok!r})")
    layers = int(_required(hf, "num_hidden_layers"))
    # no_rope_layers[i] == 1: layer i uses RoPE; 0: NoPE. Absent: NoPE every `interval` layers.
    interval = int(hf.get("no_rope_layer_interval", 4))
    no_rope = list(hf.get("no_rope_layers") or
                   [int((i + 1) % interval != 0) for i in range(layers)])
    if len(no_rope) < layers or any(v not in (0, 1) for v in no_rope):
        raise HFError(f"Llama-4 config.json no_rope_layers={no_rope} must hold a 0 (NoPE) or 1 "
                      f"(RoPE) for each of the {layers} layers")
    rope_layer = [bool(no_rope[i]) for i in range(layers)]
    chunk = hf.get("attention_chunk_size")
    types = list(hf.get("layer_types") or
                 ["chunked_attention" if r else "full_attention" for r in rope_layer])
    if types == ["chunked_attention" if r else "full_attention" for r in rope_layer]:
        if not chunk or int(chunk) <= 0:
            raise HFError(f"Llama-4 config.json attention_chunk_size={chunk!r} must be > 0 "
                          f"with chunked_attention layers (layer_types={types})")
        local = int(chunk)
    elif types == ["full_attention"] * layers:
        local = 0
    else:
        raise HFError(f"Llama-4 config.json layer_types={types} is not supported: chunked "
                      "attention must be on exactly the RoPE layers (no_rope_layers == 1) or on "
                      "none")
    step = int(hf.get("interleave_moe_layer_step", 1))
    moe = hf.get("moe_layers")
    moe = set(range(step - 1, layers, step)) if moe is None else {int(i) for i in moe}
    by_step = {i for i in range(layers) if (i + 1) % step == 0}
    if not moe <= by_step:  # an explicit list off the step grid: every other layer dense
        step, by_step = 1, set(range(layers))
    expert_f = int(hf.get("intermediate_size", 8192))
    d, heads, head_dim = _attention_dims(hf)
    theta, scaling = _rope(hf)
    coef = float(hf.get("router_aux_loss_coef", 0.0)) if hf.get("output_router_logits") else 0.0
    return dict(
        vocab_size=int(_required(hf, "vocab_size")), hidden_size=d,
        intermediate_size=int(hf.get("intermediate_size_mlp", 16384)), num_layers=layers,
        num_heads=heads, num_kv_heads=int(hf.get("num_key_value_heads") or heads),
        head_dim=head_dim, rope_theta=theta, rope_scaling=scaling,
        rms_norm_eps=float(hf.get("rms_norm_eps", 1e-5)),
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        max_position_embeddings=int(hf.get("max_position_embeddings", 131072)),
        num_experts=int(hf.get("num_local_experts", 16)),
        experts_per_token=int(hf.get("num_experts_per_tok", 1)),
        moe_intermediate_size=expert_f, shared_expert_size=expert_f, moe_layer_step=step,
        dense_layers=tuple(sorted(by_step - moe)), router="sigmoid", router_aux_loss_coef=coef,
        nope_layers=tuple(i for i in range(layers) if not rope_layer[i]),
        local_attention_chunk=local, qk_l2_norm=bool(hf.get("use_qk_norm", True)),
        # Scout's config.json says attn_temperature_tuning: 4; transformers only tests truth.
        attn_temperature_tuning=bool(hf.get("attn_temperature_tuning", True)),
        attn_floor_scale=int(hf.get("floor_scale", 8192)),
        attn_scale=float(hf.get("attn_scale", 0.1)))


def _moe_fields(hf: dict) -> dict:
    # transformers 5 writes `num_local_experts`; the hub's Qwen3-MoE configs say `num_experts`.
    experts = hf.get("num_experts", hf.get("num_local_experts"))
    if not experts:
        raise HFError(f"Qwen3-MoE config.json has neither 'num_experts' nor 'num_local_experts' "
                      f"(keys: {sorted(hf)})")
    # The aux-loss coefficient is kept only when HF would train with it (output_router_logits).
    coef = float(hf.get("router_aux_loss_coef", 0.0)) if hf.get("output_router_logits") else 0.0
    return dict(num_experts=int(experts),
                experts_per_token=int(_required(hf, "num_experts_per_tok")),
                moe_intermediate_size=int(_required(hf, "moe_intermediate_size")),
                moe_layer_step=int(hf.get("decoder_sparse_step", 1)),
                dense_layers=tuple(int(i) for i in hf.get("mlp_only_layers") or ()),
                norm_topk_prob=bool(hf.get("norm_topk_prob", False)), router="softmax",
                router_aux_loss_coef=coef)


def _is_llama4(cfg: ModelConfig) -> bool:
    return bool(cfg.router == "sigmoid" or cfg.nope_layers or cfg.local_attention_chunk or
                cfg.qk_l2_norm or cfg.attn_temperature_tuning)


def architecture_of(cfg: ModelConfig) -> str:
    """The HF class that has exactly this config's features."""
    if _is_llama4(cfg):
        if (not cfg.num_experts or cfg.router != "sigmoid" or cfg.qk_norm or cfg.qkv_bias or
                cfg.shared_expert_size != cfg.expert_size):
            raise HFError(
                f"ModelConfig {cfg.name!r} has no HF equivalent: it mixes Llama-4 features "
                f"(router={cfg.router!r}, nope_layers={cfg.nope_layers}, local_attention_chunk="
                f"{cfg.local_attention_chunk}, qk_l2_norm={cfg.qk_l2_norm}, "
                f"attn_temperature_tuning={cfg.attn_temperature_tuning}) with others "
                f"(num_experts={cfg.num_experts}, qk_norm={cfg.qk_norm}, qkv_bias={cfg.qkv_bias}, "
                f"shared_expert_size={cfg.shared_expert_size} vs expert width "
                f"{cfg.expert_size}): Llama4ForCausalLM needs num_experts > 0, the sigmoid "
                "router, a shared expert as wide as the routed ones, no qk_norm, no qkv_bias")
        return "Llama4ForCausalLM"
    if cfg.num_experts:
        if not cfg.qk_norm or cfg.qkv_bias or cfg.router != "softmax" or cfg.shared_expert_size:
            raise HFError(
                f"MoE ModelConfig {cfg.name!r} (qk_norm={cfg.qk_norm}, qkv_bias={cfg.qkv_bias}, "
                f"router={cfg.router!r}, shared_expert_size={cfg.shared_expert_size}) has no HF "
                "equivalent here: only Qwen3-MoE (qk_norm, softmax router, no shared expert) "
                "is exported")
        return "Qwen3MoeForCausalLM"
    if cfg.qk_norm and cfg.qkv_bias:
        raise HFError("ModelConfig with both qk_norm and qkv_bias has no HF equivalent "
                      "(Qwen3's attention_bias also adds an o_proj bias)")
    if cfg.qk_norm:
        return "Qwen3ForCausalLM"
    return "Qwen2ForCausalLM" if cfg.qkv_bias else "LlamaForCausalLM"


def _rope_scaling_to_hf(cfg: ModelConfig) -> Optional[dict]:
    if cfg.rope_scaling is None:
        return None
    return dict(rope_type="llama3", **dataclasses.asdict(cfg.rope_scaling))


def _llama4_config_to_hf(cfg: ModelConfig) -> dict:
    layers = range(cfg.num_layers)
    return dict(
        architectures=["Llama4ForCausalLM"], model_type="llama4_text",
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
        intermediate_size=cfg.expert_size, intermediate_size_mlp=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads, head_dim=cfg.dim_per_head, hidden_act="silu",
        max_position_embeddings=cfg.max_position_embeddings, rms_norm_eps=cfg.rms_norm_eps,
        tie_word_embeddings=cfg.tie_embeddings, torch_dtype=cfg.param_dtype,
        rope_theta=cfg.rope_theta, rope_scaling=_rope_scaling_to_hf(cfg),
        num_local_experts=cfg.num_experts, num_experts_per_tok=cfg.experts_per_token,
        interleave_moe_layer_step=cfg.moe_layer_step,
        moe_layers=[i for i in layers if cfg.is_moe_layer(i)],
        no_rope_layers=[int(cfg.uses_rope(i)) for i in layers],
        layer_types=["chunked_attention" if cfg.is_local_attention_layer(i) else
                     "full_attention" for i in layers],
        # transformers builds a chunked mask even when no layer uses it, so it needs a size.
        attention_chunk_size=cfg.local_attention_chunk or cfg.max_position_embeddings,
        use_qk_norm=cfg.qk_l2_norm, attn_temperature_tuning=cfg.attn_temperature_tuning,
        floor_scale=cfg.attn_floor_scale, attn_scale=cfg.attn_scale, attention_bias=False,
        router_aux_loss_coef=cfg.router_aux_loss_coef,
        output_router_logits=cfg.router_aux_loss_coef > 0, router_jitter_noise=0.0)


def config_to_hf(cfg: ModelConfig) -> dict:
    arch = architecture_of(cfg)
    if arch == "Llama4ForCausalLM":
        return _llama4_config_to_hf(cfg)
    out = dict(
        architectures=[arch], model_type={v: k for k, v in _MODEL_TYPES.items()}[arch],
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size, num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_kv_heads,
        head_dim=cfg.dim_per_head, hidden_act="silu",
        max_position_embeddings=cfg.max_position_embeddings, rms_norm_eps=cfg.rms_norm_eps,
        tie_word_embeddings=cfg.tie_embeddings, torch_dtype=cfg.param_dtype,
        # The transformers < 5 spelling; transformers >= 5 converts it on load.
        rope_theta=cfg.rope_theta, rope_scaling=_rope_scaling_to_hf(cfg))
    if arch == "Qwen3MoeForCausalLM":
        out.update(num_experts=cfg.num_experts, num_experts_per_tok=cfg.experts_per_token,
                   moe_intermediate_size=cfg.expert_size, decoder_sparse_step=cfg.moe_layer_step,
                   mlp_only_layers=list(cfg.dense_layers), norm_topk_prob=cfg.norm_topk_prob,
                   router_aux_loss_coef=cfg.router_aux_loss_coef,
                   output_router_logits=cfg.router_aux_loss_coef > 0)
    if arch != "Qwen2ForCausalLM":
        out["attention_bias"] = False
    if arch == "LlamaForCausalLM":
        out["mlp_bias"] = False
    else:
        out["use_sliding_window"] = False
    return out


# -- tensor name and layout map -----------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class _Entry:
    """One HF tensor <-> one of our params: ours = hf.reshape(concat(groups)).transpose(perm),
    where HF dim j splits into the sizes `groups[j]` (e.g. H*hd -> (H, hd))."""

    hf_name: str
    path: tuple
    groups: tuple
    perm: tuple
    # MoE expert weights: our param stacks `experts` HF tensors along a leading axis; hf_name
    # holds `{e}` and groups/perm describe one expert's tensor. `fused` = (name, part, parts):
    # the transformers-5 in-memory layout, [E, parts * n, m] with this weight at rows part * n.
    experts: int = 0
    fused: Optional[tuple] = None
    expert: int = -1  # export only: this HF tensor is expert `expert` of our param
    # (i, n): ours is the i-th of n equal pieces of the HF tensor's last axis (Llama-4's fused
    # gate_up_proj); groups describe the piece.
    part: tuple = ()
    # Split-HF axis holding head_dim in Llama-4's interleaved RoPE order (-1: none): permuted
    # to the half-split order at load, back at export.
    rope_axis: int = -1

    @property
    def piece_shape(self) -> tuple:
        return tuple(math.prod(g) for g in self.groups)

    @property
    def hf_shape(self) -> tuple:
        shape = self.piece_shape
        return shape[:-1] + (shape[-1] * self.part[1],) if self.part else shape

    @property
    def shape(self) -> tuple:
        split = [s for g in self.groups for s in g]
        one = tuple(split[p] for p in self.perm)
        return (self.experts,) + one if self.experts else one

    def per_expert(self) -> list["_Entry"]:
        """One plain entry per expert (hub layout)."""
        return [dataclasses.replace(self, hf_name=self.hf_name.format(e=e), experts=0,
                                    fused=None, expert=e) for e in range(self.experts)]


def half_split_order(head_dim: int) -> np.ndarray:
    """Interleaved RoPE dims (2i, 2i+1) -> half-split (i, i + hd/2): ours = hf[..., order]."""
    return np.concatenate([np.arange(0, head_dim, 2), np.arange(1, head_dim, 2)])


def tensor_map(cfg: ModelConfig) -> list[_Entry]:
    d, f, v = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
    h, kv, hd = cfg.num_heads, cfg.num_kv_heads, cfg.dim_per_head
    llama4 = _is_llama4(cfg)
    ffn, rope_axis = ("feed_forward.", 1) if llama4 else ("mlp.", -1)
    entries = [_Entry("model.embed_tokens.weight", ("embed",), ((v,), (d,)), (0, 1)),
               _Entry("model.norm.weight", ("final_norm", "scale"), ((d,),), (0,))]
    if not cfg.tie_embeddings:
        entries.append(_Entry("lm_head.weight", ("lm_head",), ((v,), (d,)), (1, 0)))
    for i in range(cfg.num_layers):
        p, us = f"model.layers.{i}.", ("layers", i)
        entries += [
            _Entry(p + "input_layernorm.weight", us + ("attn_norm", "scale"), ((d,),), (0,)),
            _Entry(p + "post_attention_layernorm.weight", us + ("mlp_norm", "scale"), ((d,),),
                   (0,)),
            _Entry(p + "self_attn.q_proj.weight", us + ("attn", "q"), ((h, hd), (d,)), (2, 0, 1),
                   rope_axis=rope_axis),
            _Entry(p + "self_attn.k_proj.weight", us + ("attn", "k"), ((kv, hd), (d,)), (2, 0, 1),
                   rope_axis=rope_axis),
            _Entry(p + "self_attn.v_proj.weight", us + ("attn", "v"), ((kv, hd), (d,)), (2, 0, 1)),
            _Entry(p + "self_attn.o_proj.weight", us + ("attn", "o"), ((d,), (h, hd)), (1, 2, 0)),
        ]
        if cfg.is_moe_layer(i):
            entries += (_llama4_moe_entries if llama4 else _moe_entries)(cfg, p + ffn,
                                                                         us + ("mlp",))
        else:
            entries += _mlp_entries(p + ffn, us + ("mlp",), d, f)
        if cfg.qkv_bias:
            entries += [
                _Entry(p + "self_attn.q_proj.bias", us + ("attn", "q_bias"), ((h, hd),), (0, 1)),
                _Entry(p + "self_attn.k_proj.bias", us + ("attn", "k_bias"), ((kv, hd),), (0, 1)),
                _Entry(p + "self_attn.v_proj.bias", us + ("attn", "v_bias"), ((kv, hd),), (0, 1)),
            ]
        if cfg.qk_norm:
            entries += [
                _Entry(p + "self_attn.q_norm.weight", us + ("attn", "q_norm", "scale"), ((hd,),),
                       (0,)),
                _Entry(p + "self_attn.k_norm.weight", us + ("attn", "k_norm", "scale"), ((hd,),),
                       (0,)),
            ]
    return entries


def _mlp_entries(p: str, us: tuple, d: int, f: int) -> list[_Entry]:
    return [_Entry(p + "gate_proj.weight", us + ("gate",), ((f,), (d,)), (1, 0)),
            _Entry(p + "up_proj.weight", us + ("up",), ((f,), (d,)), (1, 0)),
            _Entry(p + "down_proj.weight", us + ("down",), ((d,), (f,)), (1, 0))]


def _llama4_moe_entries(cfg: ModelConfig, p: str, us: tuple) -> list[_Entry]:
    d, e, f = cfg.hidden_size, cfg.num_experts, cfg.expert_size
    x = p + "experts."
    return [
        _Entry(p + "router.weight", us + ("router",), ((e,), (d,)), (1, 0)),
        _Entry(x + "gate_up_proj", us + ("gate",), ((e,), (d,), (f,)), (0, 1, 2), part=(0, 2)),
        _Entry(x + "gate_up_proj", us + ("up",), ((e,), (d,), (f,)), (0, 1, 2), part=(1, 2)),
        _Entry(x + "down_proj", us + ("down",), ((e,), (f,), (d,)), (0, 1, 2)),
    ] + _mlp_entries(p + "shared_expert.", us + ("shared",), d, cfg.shared_expert_size)


def _moe_entries(cfg: ModelConfig, p: str, us: tuple) -> list[_Entry]:
    d, e, f = cfg.hidden_size, cfg.num_experts, cfg.expert_size
    x = p + "experts."
    return [
        _Entry(p + "gate.weight", us + ("router",), ((e,), (d,)), (1, 0)),
        _Entry(x + "{e}.gate_proj.weight", us + ("gate",), ((f,), (d,)), (1, 0), e,
               (x + "gate_up_proj", 0, 2)),
        _Entry(x + "{e}.up_proj.weight", us + ("up",), ((f,), (d,)), (1, 0), e,
               (x + "gate_up_proj", 1, 2)),
        _Entry(x + "{e}.down_proj.weight", us + ("down",), ((d,), (f,)), (1, 0), e,
               (x + "down_proj", 0, 1)),
    ]


def _layout(entry: _Entry, files: dict) -> str:
    """'plain', 'split' (one HF tensor per expert) or 'fused' (transformers 5 in-memory)."""
    if not entry.experts:
        return "plain"
    if entry.hf_name.format(e=0) in files:
        return "split"
    if entry.fused[0] in files:
        return "fused"
    return "missing"


def _read_expert_slice(handles, files, entry: _Entry, index: tuple, dtype) -> np.ndarray:
    """Our-layout block `index` ([experts, ...]) of a stacked expert param: only the experts
    in the block's range are read, from either checkpoint layout."""
    lo, hi = index[0].indices(entry.experts)[:2]
    if _layout(entry, files) == "split":
        parts = [_read_slice(handles[files[one.hf_name]], one, index[1:], dtype)
                 for one in entry.per_expert()[lo:hi]]
        return np.stack(parts) if parts else np.zeros((0,) + entry.shape[1:], dtype)
    name, part, _ = entry.fused
    n = entry.hf_shape[0]
    block = np.asarray(handles[files[name]].get_slice(name)[lo:hi, part * n:(part + 1) * n])
    split = [s for g in entry.groups for s in g]
    block = block.reshape((hi - lo, *split)).transpose((0, *(q + 1 for q in entry.perm)))
    return np.ascontiguousarray(block[(slice(None), *index[1:])], dtype=dtype)


def _is_ignorable(name: str, cfg: ModelConfig) -> bool:
    # Old checkpoints store RoPE buffers; tied checkpoints sometimes store the head anyway
    # (transformers ignores it then, and so do we).
    return name.endswith("rotary_emb.inv_freq") or (cfg.tie_embeddings and name == "lm_head.weight")


def _read_slice(handle, entry: _Entry, index: tuple, dtype) -> np.ndarray:
    """Our-layout block `index` of `entry`, read from the checkpoint without reading the rest."""
    ranges = [sl.indices(n)[:2] for sl, n in zip(index, entry.shape)]
    split_ranges = [None] * len(ranges)
    for i, p in enumerate(entry.perm):
        split_ranges[p] = ranges[i]
    hf_index, block_shape, post, k = [], [], [], 0
    for g in entry.groups:
        # Only the leading sub-dim of a split HF dim maps to a contiguous HF range; inner
        # sub-dims (head_dim, never sharded by RULES) are read whole and sliced afterwards.
        (lo, hi), inner = split_ranges[k], math.prod(g[1:])
        hf_index.append(slice(lo * inner, hi * inner))
        block_shape += [hi - lo, *g[1:]]
        post += [slice(None)] + [slice(*split_ranges[k + j]) for j in range(1, len(g))]
        k += len(g)
    if entry.part:  # our piece starts part-index pieces into the HF tensor's last axis
        off = entry.part[0] * entry.piece_shape[-1]
        hf_index[-1] = slice(hf_index[-1].start + off, hf_index[-1].stop + off)
    block = np.asarray(handle.get_slice(entry.hf_name)[tuple(hf_index)]).reshape(block_shape)
    if entry.rope_axis >= 0:  # head_dim is read whole (see above), so it can be permuted
        order = half_split_order(block.shape[entry.rope_axis])
        block = np.take(block, order, axis=entry.rope_axis)
    block = block[tuple(post)].transpose(entry.perm)
    return np.ascontiguousarray(block, dtype=dtype)


def _checkpoint_files(path: str) -> dict[str, str]:
    """tensor name -> safetensors file."""
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            weight_map = json.load(f)["weight_map"]
        return {name: os.path.join(path, file) for name, file in weight_map.items()}
    files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    if not files:
        raise HFError(f"no *.safetensors files (nor model.safetensors.index.json) in {path}")
    from safetensors import safe_open
    out = {}
    for file in files:
        with safe_open(file, framework="numpy") as h:
            out.update({name: file for name in h.keys()})
    return out


def load_params(path, mesh=None, cfg: Optional[ModelConfig] = None, dtype=None):
    """(cfg, graphdef, params) from an HF checkpoint directory, each param in its mesh sharding.

    `cfg` defaults to `config_from_hf(path)`; `dtype` (e.g. "bfloat16") overrides its
    `param_dtype`. Without a mesh, params go to the first local device. All names and shapes are
    checked before any tensor is read. Host memory peaks at this host's blocks of one tensor
    (blocks replicated across devices are read once and shared).
    """
    from safetensors import safe_open

    from scalerl_jax import mesh as mesh_lib

    path = os.fspath(path)
    cfg = config_from_hf(path) if cfg is None else cfg
    if dtype is not None:
        cfg = cfg.replace(param_dtype=_dtype_name(dtype))
    files = _checkpoint_files(path)
    entries = tensor_map(cfg)
    if any(n.startswith(_LLAMA4_TEXT_PREFIX) for n in files):
        files, entries = _language_model_only(files, entries, path, cfg)
    with contextlib.ExitStack() as stack:
        handles = {f: stack.enter_context(safe_open(f, framework="numpy"))
                   for f in sorted(set(files.values()))}
        _check_names_and_shapes(entries, files, handles, cfg, path)
        abstract = nnx.eval_shape(lambda: Transformer(cfg, nnx.Rngs(params=0)))
        graphdef, state = nnx.split(abstract)
        if mesh is not None:
            shardings = dict(nnx.to_flat_state(mesh_lib.state_shardings(state, mesh)))
        else:
            one = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
        variables = dict(nnx.to_flat_state(state))
        np_dtype = np.dtype(cfg.param_dtype)
        for e in entries:
            sharding = shardings[e.path] if mesh is not None else one
            cache: dict = {}  # replicated shards read once per distinct block

            def block(index, e=e, cache=cache):
                key = tuple(sl.indices(n)[:2] for sl, n in zip(index, e.shape))
                if key not in cache:
                    cache[key] = (_read_expert_slice(handles, files, e, index, np_dtype)
                                  if e.experts else
                                  _read_slice(handles[files[e.hf_name]], e, index, np_dtype))
                return cache[key]

            variables[e.path].set_value(jax.make_array_from_callback(e.shape, sharding, block))
    return cfg, graphdef, state


def _language_model_only(files: dict, entries: list, path: str, cfg: ModelConfig) -> tuple:
    """A Llama4ForConditionalGeneration checkpoint: keep its `language_model.` tensors (our
    names, prefixed) and drop the vision tower's."""
    if not _is_llama4(cfg):
        raise HFError(f"{path} holds {_LLAMA4_TEXT_PREFIX}* tensors (a multimodal checkpoint), "
                      "which only Llama-4 configs load")
    kept = {n: f for n, f in files.items() if n.startswith(_LLAMA4_TEXT_PREFIX)}
    log.info("%s: loading the language model's %d tensors (%s*); ignoring %d vision-tower "
             "tensors (vision_model.*, multi_modal_projector.*)", path, len(kept),
             _LLAMA4_TEXT_PREFIX, len(files) - len(kept))
    return kept, [dataclasses.replace(e, hf_name=_LLAMA4_TEXT_PREFIX + e.hf_name)
                  for e in entries]


def _dtype_name(dtype) -> str:
    name = np.dtype(dtype).name
    if name not in DTYPES:
        raise HFError(f"dtype {name!r} is not one of {DTYPES}")
    return name


def _check_names_and_shapes(entries, files, handles, cfg, path) -> None:
    plain, expected = [], set()
    for e in entries:
        layout = _layout(e, files)
        if layout == "missing":
            raise HFError(f"missing expert tensors for {'.'.join(map(str, e.path))}: neither "
                          f"{e.hf_name.format(e=0)!r} (per-expert) nor {e.fused[0]!r} (fused) "
                          f"is in {path}")
        if layout == "fused":
            name, _, parts = e.fused
            want = (e.experts, parts * e.hf_shape[0], e.hf_shape[1])
            got = tuple(handles[files[name]].get_slice(name).get_shape())
            if got != want:
                raise HFError(f"tensor {name!r}: checkpoint shape {got} != expected shape "
                              f"{want} for config {cfg.name!r}")
            expected.add(name)
        else:
            plain += e.per_expert() if layout == "split" else [e]
    expected.update(e.hf_name for e in plain)
    for e in plain:
        if e.hf_name not in files:
            raise HFError(f"missing tensor {e.hf_name!r} (expected shape {e.hf_shape}) in {path}")
        got = tuple(handles[files[e.hf_name]].get_slice(e.hf_name).get_shape())
        if got != e.hf_shape:
            raise HFError(f"tensor {e.hf_name!r}: checkpoint shape {got} != expected shape "
                          f"{e.hf_shape} for config {cfg.name!r}")
    extra = sorted(n for n in files if n not in expected and not _is_ignorable(n, cfg))
    if extra:
        shapes = {n: tuple(handles[files[n]].get_slice(n).get_shape()) for n in extra[:5]}
        raise HFError(f"unexpected tensors in {path} (not used by this {architecture_of(cfg)} "
                      f"config): {len(extra)} e.g. {shapes}")


# -- export -------------------------------------------------------------------------------------
def _to_host(x) -> np.ndarray:
    if getattr(x, "is_fully_addressable", True):
        return np.asarray(jax.device_get(x))
    from jax.experimental import multihost_utils
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def _write_safetensors(file: str, entries: list, arrays_of) -> None:
    """Stream tensors into one safetensors file: the header is built from shapes, then each
    tensor is fetched (one at a time) and appended."""
    header, offset = {}, 0
    for e, dt in entries:
        nbytes = math.prod(e.hf_shape) * np.dtype(dt).itemsize
        header[e.hf_name] = {"dtype": _ST_DTYPES[np.dtype(dt).name], "shape": list(e.hf_shape),
                             "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    header["__metadata__"] = {"format": "pt"}
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # data must start 8-byte aligned
    with open(file, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        for e, dt in entries:
            f.write(np.ascontiguousarray(arrays_of(e), dtype=dt).tobytes())


def export(params, cfg: ModelConfig, out_dir, max_shard_bytes: int = 5_000_000_000,
           dtype=None, extra_config: Optional[dict[str, Any]] = None) -> list[str]:
    """Write `config.json` + safetensors (+ `model.safetensors.index.json` when sharded) that
    `transformers` loads. `params`: the nnx.State (sharded or not). Each parameter is gathered
    to the host on its own, so peak host memory is one tensor. In multi-process runs every
    process must call this (the gathers are collective); only process 0 writes.
    `extra_config` is merged into config.json (e.g. bos/eos token ids). Returns the files."""
    out_dir = os.fspath(out_dir)
    dt = np.dtype(dtype or cfg.param_dtype)
    entries = tensor_map(cfg)
    flat = dict(nnx.to_flat_state(params))
    missing = [e.path for e in entries if e.path not in flat]
    if missing:
        raise HFError(f"params lack {missing[:5]} required by config {cfg.name!r}")
    full_shapes = {e.path: e.shape for e in entries}
    entries = [one for e in entries for one in (e.per_expert() if e.experts else [e])]
    # Entries that are pieces of one HF tensor (Llama-4 gate_up_proj) are written as one.
    pieces: dict = {}
    for e in entries:
        if e.part:
            pieces.setdefault(e.hf_name, []).append(e)
    entries = [e for e in entries if not e.part or e.part[0] == 0]
    shards, size = [[]], 0
    for e in entries:
        nbytes = math.prod(e.hf_shape) * dt.itemsize
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append((e, dt))
        size += nbytes
    names = (["model.safetensors"] if len(shards) == 1 else
             [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))])
    writer = jax.process_index() == 0
    if writer:
        os.makedirs(out_dir, exist_ok=True)

    gathered: dict = {}  # the last gathered param: its experts are written one after another

    def hf_array(e: _Entry) -> np.ndarray:
        if e.part:
            parts = sorted(pieces[e.hf_name], key=lambda x: x.part[0])
            return np.concatenate([hf_piece(x) for x in parts], axis=-1)
        return hf_piece(e)

    def hf_piece(e: _Entry) -> np.ndarray:
        if e.path not in gathered:
            value = flat[e.path].get_value() if isinstance(flat[e.path], nnx.Variable) \
                else flat[e.path]
            gathered.clear()
            gathered[e.path] = _to_host(value)
        ours = gathered[e.path]
        if ours.shape != full_shapes[e.path]:
            raise HFError(f"param {'.'.join(map(str, e.path))}: shape {ours.shape} != "
                          f"{full_shapes[e.path]} expected by config {cfg.name!r}")
        if e.expert >= 0:
            ours = ours[e.expert]
        split = ours.transpose(np.argsort(e.perm))
        if e.rope_axis >= 0:
            order = np.argsort(half_split_order(split.shape[e.rope_axis]))
            split = np.take(split, order, axis=e.rope_axis)
        return split.reshape(e.piece_shape)

    for name, shard in zip(names, shards):
        if writer:
            _write_safetensors(os.path.join(out_dir, name), shard, hf_array)
        else:  # the gathers are collectives: take part without writing
            for e, _ in shard:
                hf_array(e)
    if writer:
        if len(shards) > 1:
            total = sum(math.prod(e.hf_shape) * dt.itemsize for e in entries)
            index = {"metadata": {"total_size": total},
                     "weight_map": {e.hf_name: n for n, s in zip(names, shards) for e, _ in s}}
            with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
                json.dump(index, f, indent=2)
        hf_cfg = config_to_hf(cfg.replace(param_dtype=dt.name))
        hf_cfg.update(extra_config or {})
        with open(os.path.join(out_dir, "config.json"), "w") as f:
            json.dump(hf_cfg, f, indent=2)
    return [os.path.join(out_dir, n) for n in names]
