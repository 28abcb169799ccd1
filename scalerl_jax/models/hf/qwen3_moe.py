"""Qwen3-MoE: Qwen3 (see `llama.py`) with routed experts (softmax router, no shared expert).

The hub stores one tensor per expert (`mlp.experts.{e}.gate_proj.weight` [F, D], ...), which
is also what transformers 5's `save_pretrained` writes; in memory transformers 5 fuses them
(`mlp.experts.gate_up_proj` [E, 2F, D], `mlp.experts.down_proj` [E, D, F]), and checkpoints
saved from that layout are read too. Either way each device reads only its experts' slices into
our stacked [E, D, F] / [E, F, D] params. Export writes the per-expert hub layout.
"""

from __future__ import annotations

from scalerl_jax.config import ModelConfig
from scalerl_jax.models.hf import llama
from scalerl_jax.models.hf.config_json import HFError, required
from scalerl_jax.models.hf.entries import Entry, decoder_entries

MODEL_TYPES = {"qwen3_moe": "Qwen3MoeForCausalLM"}


def claims(cfg: ModelConfig) -> bool:
    return bool(cfg.num_experts)


def config_fields(hf: dict, arch: str) -> dict:
    return dict(llama.config_fields(hf, arch), **_moe_fields(hf))


def _moe_fields(hf: dict) -> dict:
    # transformers 5 writes `num_local_experts`; the hub's Qwen3-MoE configs say `num_experts`.
    experts = hf.get("num_experts", hf.get("num_local_experts"))
    if not experts:
        raise HFError(
            f"Qwen3-MoE config.json has neither 'num_experts' nor 'num_local_experts' "
            f"(keys: {sorted(hf)})"
        )
    # The aux-loss coefficient is kept only when HF would train with it (output_router_logits).
    coef = float(hf.get("router_aux_loss_coef", 0.0)) if hf.get("output_router_logits") else 0.0
    return dict(
        num_experts=int(experts),
        experts_per_token=int(required(hf, "num_experts_per_tok")),
        moe_intermediate_size=int(required(hf, "moe_intermediate_size")),
        moe_layer_step=int(hf.get("decoder_sparse_step", 1)),
        dense_layers=tuple(int(i) for i in hf.get("mlp_only_layers") or ()),
        norm_topk_prob=bool(hf.get("norm_topk_prob", False)),
        router="softmax",
        router_aux_loss_coef=coef,
    )


def architecture(cfg: ModelConfig) -> str:
    if not cfg.qk_norm or cfg.qkv_bias or cfg.router != "softmax" or cfg.shared_expert_size:
        raise HFError(
            f"MoE ModelConfig {cfg.name!r} (qk_norm={cfg.qk_norm}, qkv_bias={cfg.qkv_bias}, "
            f"router={cfg.router!r}, shared_expert_size={cfg.shared_expert_size}) has no HF "
            "equivalent here: only Qwen3-MoE (qk_norm, softmax router, no shared expert) "
            "is exported"
        )
    return "Qwen3MoeForCausalLM"


def config_to_hf(cfg: ModelConfig, arch: str) -> dict:
    return llama.decoder_config_to_hf(
        cfg,
        arch,
        "qwen3_moe",
        dict(
            num_experts=cfg.num_experts,
            num_experts_per_tok=cfg.experts_per_token,
            moe_intermediate_size=cfg.expert_size,
            decoder_sparse_step=cfg.moe_layer_step,
            mlp_only_layers=list(cfg.dense_layers),
            norm_topk_prob=cfg.norm_topk_prob,
            router_aux_loss_coef=cfg.router_aux_loss_coef,
            output_router_logits=cfg.router_aux_loss_coef > 0,
        ),
    )


def tensor_map(cfg: ModelConfig) -> list[Entry]:
    return decoder_entries(cfg, "mlp.", _moe_entries)


def _moe_entries(cfg: ModelConfig, p: str, us: tuple) -> list[Entry]:
    d, e, f = cfg.hidden_size, cfg.num_experts, cfg.expert_size
    x = p + "experts."
    return [
        Entry(p + "gate.weight", us + ("router",), ((e,), (d,)), (1, 0)),
        Entry(
            x + "{e}.gate_proj.weight",
            us + ("gate",),
            ((f,), (d,)),
            (1, 0),
            e,
            (x + "gate_up_proj", 0, 2),
        ),
        Entry(
            x + "{e}.up_proj.weight",
            us + ("up",),
            ((f,), (d,)),
            (1, 0),
            e,
            (x + "gate_up_proj", 1, 2),
        ),
        Entry(
            x + "{e}.down_proj.weight",
            us + ("down",),
            ((d,), (f,)),
            (1, 0),
            e,
            (x + "down_proj", 0, 1),
        ),
    ]
