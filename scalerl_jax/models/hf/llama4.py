"""Llama-4 (`Llama4ForCausalLM`, or the language model of a `Llama4ForConditionalGeneration`
checkpoint, whose vision tower is skipped): NoPE layers, chunked local attention, L2 qk-norm and
temperature tuning map to ModelConfig fields. Its routed experts are stored stacked and fused
(`feed_forward.experts.gate_up_proj` [E, D, 2F], gate then up; `down_proj` [E, F, D]), already
our [in, out] layout. q_proj / k_proj rows are permuted within each head at load (and back at
export) so that our half-split RoPE computes Llama-4's interleaved one (docs/real-models.md).
"""

from __future__ import annotations

import dataclasses
import logging

from scalerl_jax.config import ModelConfig
from scalerl_jax.models.hf.config_json import (
    HFError,
    attention_dims,
    required,
    rope,
    rope_scaling_to_hf,
)
from scalerl_jax.models.hf.entries import Entry, decoder_entries, mlp_entries

log = logging.getLogger(__name__)

MODEL_TYPES = {"llama4_text": "Llama4ForCausalLM", "llama4": "Llama4ForConditionalGeneration"}
# A Llama4ForConditionalGeneration checkpoint's language-model tensors carry this prefix.
TEXT_PREFIX = "language_model."


def claims(cfg: ModelConfig) -> bool:
    return bool(
        cfg.router == "sigmoid"
        or cfg.nope_layers
        or cfg.local_attention_chunk
        or cfg.qk_l2_norm
        or cfg.attn_temperature_tuning
    )


def config_fields(hf: dict, arch: str) -> dict:
    return _llama4_fields(_llama4_text_config(hf, arch))


def _llama4_text_config(hf: dict, arch: str) -> dict:
    if arch == "Llama4ForCausalLM":
        return hf
    text = hf.get("text_config")
    if not isinstance(text, dict):
        raise HFError(
            f"Llama4ForConditionalGeneration config.json has no 'text_config' dict "
            f"(keys: {sorted(hf)})"
        )
    log.info(
        "Llama4ForConditionalGeneration: loading its language model (text_config, "
        "%s* tensors) only; the vision tower (vision_config, vision_model.*, "
        "multi_modal_projector.*) is ignored",
        TEXT_PREFIX,
    )
    return text


def _attention_layers(hf: dict, layers: int) -> tuple[list, int]:
    """(whether each layer uses RoPE, the local attention chunk of the RoPE layers; 0: none)."""
    # no_rope_layers[i] == 1: layer i uses RoPE; 0: NoPE. Absent: NoPE every `interval` layers.
    interval = int(hf.get("no_rope_layer_interval", 4))
    no_rope = list(
        hf.get("no_rope_layers") or [int((i + 1) % interval != 0) for i in range(layers)]
    )
    if len(no_rope) < layers or any(v not in (0, 1) for v in no_rope):
        raise HFError(
            f"Llama-4 config.json no_rope_layers={no_rope} must hold a 0 (NoPE) or 1 "
            f"(RoPE) for each of the {layers} layers"
        )
    rope_layer = [bool(no_rope[i]) for i in range(layers)]
    chunk = hf.get("attention_chunk_size")
    types = list(
        hf.get("layer_types")
        or ["chunked_attention" if r else "full_attention" for r in rope_layer]
    )
    if types == ["chunked_attention" if r else "full_attention" for r in rope_layer]:
        if not chunk or int(chunk) <= 0:
            raise HFError(
                f"Llama-4 config.json attention_chunk_size={chunk!r} must be > 0 "
                f"with chunked_attention layers (layer_types={types})"
            )
        local = int(chunk)
    elif types == ["full_attention"] * layers:
        local = 0
    else:
        raise HFError(
            f"Llama-4 config.json layer_types={types} is not supported: chunked "
            "attention must be on exactly the RoPE layers (no_rope_layers == 1) or on "
            "none"
        )
    return rope_layer, local


def _moe_layers(hf: dict, layers: int) -> tuple[int, set, set]:
    """(moe_layer_step, the layers that step makes MoE, the layers that are MoE)."""
    step = int(hf.get("interleave_moe_layer_step", 1))
    moe = hf.get("moe_layers")
    moe = set(range(step - 1, layers, step)) if moe is None else {int(i) for i in moe}
    by_step = {i for i in range(layers) if (i + 1) % step == 0}
    if not moe <= by_step:  # an explicit list off the step grid: every other layer dense
        step, by_step = 1, set(range(layers))
    return step, by_step, moe


def _llama4_fields(hf: dict) -> dict:
    """ModelConfig fields of a Llama4TextConfig dict. Absent keys take that class's defaults."""
    for key, ok in (
        ("hidden_act", "silu"),
        ("attention_bias", False),
        ("router_jitter_noise", 0.0),
    ):
        if hf.get(key, ok) != ok:
            raise HFError(
                f"Llama-4 config.json {key}={hf[key]!r} is not supported (expected {ok!r})"
            )
    layers = int(required(hf, "num_hidden_layers"))
    rope_layer, local = _attention_layers(hf, layers)
    step, by_step, moe = _moe_layers(hf, layers)
    expert_f = int(hf.get("intermediate_size", 8192))
    d, heads, head_dim = attention_dims(hf)
    theta, scaling = rope(hf)
    coef = float(hf.get("router_aux_loss_coef", 0.0)) if hf.get("output_router_logits") else 0.0
    return dict(
        vocab_size=int(required(hf, "vocab_size")),
        hidden_size=d,
        intermediate_size=int(hf.get("intermediate_size_mlp", 16384)),
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=int(hf.get("num_key_value_heads") or heads),
        head_dim=head_dim,
        rope_theta=theta,
        rope_scaling=scaling,
        rms_norm_eps=float(hf.get("rms_norm_eps", 1e-5)),
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        max_position_embeddings=int(hf.get("max_position_embeddings", 131072)),
        num_experts=int(hf.get("num_local_experts", 16)),
        experts_per_token=int(hf.get("num_experts_per_tok", 1)),
        moe_intermediate_size=expert_f,
        shared_expert_size=expert_f,
        moe_layer_step=step,
        dense_layers=tuple(sorted(by_step - moe)),
        router="sigmoid",
        router_aux_loss_coef=coef,
        nope_layers=tuple(i for i in range(layers) if not rope_layer[i]),
        local_attention_chunk=local,
        qk_l2_norm=bool(hf.get("use_qk_norm", True)),
        # Scout's config.json says attn_temperature_tuning: 4; transformers only tests truth.
        attn_temperature_tuning=bool(hf.get("attn_temperature_tuning", True)),
        attn_floor_scale=int(hf.get("floor_scale", 8192)),
        attn_scale=float(hf.get("attn_scale", 0.1)),
    )


def architecture(cfg: ModelConfig) -> str:
    if (
        not cfg.num_experts
        or cfg.router != "sigmoid"
        or cfg.qk_norm
        or cfg.qkv_bias
        or cfg.shared_expert_size != cfg.expert_size
    ):
        raise HFError(
            f"ModelConfig {cfg.name!r} has no HF equivalent: it mixes Llama-4 features "
            f"(router={cfg.router!r}, nope_layers={cfg.nope_layers}, local_attention_chunk="
            f"{cfg.local_attention_chunk}, qk_l2_norm={cfg.qk_l2_norm}, "
            f"attn_temperature_tuning={cfg.attn_temperature_tuning}) with others "
            f"(num_experts={cfg.num_experts}, qk_norm={cfg.qk_norm}, qkv_bias={cfg.qkv_bias}, "
            f"shared_expert_size={cfg.shared_expert_size} vs expert width "
            f"{cfg.expert_size}): Llama4ForCausalLM needs num_experts > 0, the sigmoid "
            "router, a shared expert as wide as the routed ones, no qk_norm, no qkv_bias"
        )
    return "Llama4ForCausalLM"


def config_to_hf(cfg: ModelConfig, arch: str) -> dict:
    """`arch` is always Llama4ForCausalLM: an export holds the language model only."""
    layers = range(cfg.num_layers)
    return dict(
        architectures=["Llama4ForCausalLM"],
        model_type="llama4_text",
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.expert_size,
        intermediate_size_mlp=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        head_dim=cfg.dim_per_head,
        hidden_act="silu",
        max_position_embeddings=cfg.max_position_embeddings,
        rms_norm_eps=cfg.rms_norm_eps,
        tie_word_embeddings=cfg.tie_embeddings,
        torch_dtype=cfg.param_dtype,
        rope_theta=cfg.rope_theta,
        rope_scaling=rope_scaling_to_hf(cfg),
        num_local_experts=cfg.num_experts,
        num_experts_per_tok=cfg.experts_per_token,
        interleave_moe_layer_step=cfg.moe_layer_step,
        moe_layers=[i for i in layers if cfg.is_moe_layer(i)],
        no_rope_layers=[int(cfg.uses_rope(i)) for i in layers],
        layer_types=[
            "chunked_attention" if cfg.is_local_attention_layer(i) else "full_attention"
            for i in layers
        ],
        # transformers builds a chunked mask even when no layer uses it, so it needs a size.
        attention_chunk_size=cfg.local_attention_chunk or cfg.max_position_embeddings,
        use_qk_norm=cfg.qk_l2_norm,
        attn_temperature_tuning=cfg.attn_temperature_tuning,
        floor_scale=cfg.attn_floor_scale,
        attn_scale=cfg.attn_scale,
        attention_bias=False,
        router_aux_loss_coef=cfg.router_aux_loss_coef,
        output_router_logits=cfg.router_aux_loss_coef > 0,
        router_jitter_noise=0.0,
    )


def tensor_map(cfg: ModelConfig) -> list[Entry]:
    return decoder_entries(cfg, "feed_forward.", _moe_entries, rope_axis=1)


def _moe_entries(cfg: ModelConfig, p: str, us: tuple) -> list[Entry]:
    d, e, f = cfg.hidden_size, cfg.num_experts, cfg.expert_size
    x = p + "experts."
    return [
        Entry(p + "router.weight", us + ("router",), ((e,), (d,)), (1, 0)),
        Entry(x + "gate_up_proj", us + ("gate",), ((e,), (d,), (f,)), (0, 1, 2), part=(0, 2)),
        Entry(x + "gate_up_proj", us + ("up",), ((e,), (d,), (f,)), (0, 1, 2), part=(1, 2)),
        Entry(x + "down_proj", us + ("down",), ((e,), (f,), (d,)), (0, 1, 2)),
    ] + mlp_entries(p + "shared_expert.", us + ("shared",), d, cfg.shared_expert_size)


def language_model_only(files: dict, entries: list, path: str, cfg: ModelConfig) -> tuple:
    """A Llama4ForConditionalGeneration checkpoint: keep its `language_model.` tensors (our
    names, prefixed) and drop the vision tower's."""
    if not claims(cfg):
        raise HFError(
            f"{path} holds {TEXT_PREFIX}* tensors (a multimodal checkpoint), "
            "which only Llama-4 configs load"
        )
    kept = {n: f for n, f in files.items() if n.startswith(TEXT_PREFIX)}
    log.info(
        "%s: loading the language model's %d tensors (%s*); ignoring %d vision-tower "
        "tensors (vision_model.*, multi_modal_projector.*)",
        path,
        len(kept),
        TEXT_PREFIX,
        len(files) - len(kept),
    )
    return kept, [dataclasses.replace(e, hf_name=TEXT_PREFIX + e.hf_name) for e in entries]
