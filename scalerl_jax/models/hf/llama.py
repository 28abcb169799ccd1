"""The Llama / Qwen2 / Qwen3 family: dense decoders whose differences are config flags (Qwen2's
q/k/v biases, Qwen3's q/k RMSNorm). Their checkpoints already use the half-split (`rotate_half`)
RoPE convention that `layers.apply_rope` implements, so no row permutation is needed.

Qwen3-MoE (`qwen3_moe.py`) builds on this family's config and decoder layout.
"""

from __future__ import annotations

from scalerl_jax.config import ModelConfig
from scalerl_jax.models.hf.config_json import (
    HFError,
    attention_dims,
    required,
    rope,
    rope_scaling_to_hf,
)
from scalerl_jax.models.hf.entries import Entry, decoder_entries

MODEL_TYPES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}


def claims(cfg: ModelConfig) -> bool:
    """Every config is at least a dense decoder: the families after this one refine it."""
    return True


def config_fields(hf: dict, arch: str) -> dict:
    """ModelConfig fields (all but `name`) of a Llama/Qwen `config.json` dict."""
    # Qwen2 always has q/k/v biases and no `attention_bias` key; elsewhere that key also adds
    # an o_proj bias, which this decoder does not have.
    for key, ok in (
        ("hidden_act", "silu"),
        ("attention_bias", False),
        ("mlp_bias", False),
        ("use_sliding_window", False),
    ):
        if hf.get(key, ok) != ok:
            raise HFError(
                f"config.json {key}={hf[key]!r} is not supported for {arch} (expected {ok!r})"
            )
    theta, scaling = rope(hf)
    d, heads, head_dim = attention_dims(hf)
    return dict(
        vocab_size=int(required(hf, "vocab_size")),
        hidden_size=d,
        intermediate_size=int(required(hf, "intermediate_size")),
        num_layers=int(required(hf, "num_hidden_layers")),
        num_heads=heads,
        num_kv_heads=int(hf.get("num_key_value_heads") or heads),
        head_dim=None if head_dim is None else int(head_dim),
        rope_theta=theta,
        rope_scaling=scaling,
        rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        qkv_bias=arch == "Qwen2ForCausalLM",
        qk_norm=arch in ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM"),
        max_position_embeddings=int(hf.get("max_position_embeddings", 32768)),
    )


def architecture(cfg: ModelConfig) -> str:
    if cfg.qk_norm and cfg.qkv_bias:
        raise HFError(
            "ModelConfig with both qk_norm and qkv_bias has no HF equivalent "
            "(Qwen3's attention_bias also adds an o_proj bias)"
        )
    if cfg.qk_norm:
        return "Qwen3ForCausalLM"
    return "Qwen2ForCausalLM" if cfg.qkv_bias else "LlamaForCausalLM"


def config_to_hf(cfg: ModelConfig, arch: str) -> dict:
    return decoder_config_to_hf(cfg, arch, {v: k for k, v in MODEL_TYPES.items()}[arch], {})


def decoder_config_to_hf(cfg: ModelConfig, arch: str, model_type: str, family_keys: dict) -> dict:
    """`config.json` of a Llama/Qwen-style decoder; a refining family's own keys
    (`family_keys`) come after the shared ones."""
    out = dict(
        architectures=[arch],
        model_type=model_type,
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        head_dim=cfg.dim_per_head,
        hidden_act="silu",
        max_position_embeddings=cfg.max_position_embeddings,
        rms_norm_eps=cfg.rms_norm_eps,
        tie_word_embeddings=cfg.tie_embeddings,
        torch_dtype=cfg.param_dtype,
        # The transformers < 5 spelling; transformers >= 5 converts it on load.
        rope_theta=cfg.rope_theta,
        rope_scaling=rope_scaling_to_hf(cfg),
    )
    out.update(family_keys)
    if arch != "Qwen2ForCausalLM":
        out["attention_bias"] = False
    if arch == "LlamaForCausalLM":
        out["mlp_bias"] = False
    else:
        out["use_sliding_window"] = False
    return out


def tensor_map(cfg: ModelConfig) -> list[Entry]:
    return decoder_entries(cfg, "mlp.", None)
