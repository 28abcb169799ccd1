"""Named model shapes: real checkpoints' architectures and tiny sizes for tests and the testbed.

Real presets match the published HF `config.json` of each family, so a random-init run has the
same shapes (and cost) as fine-tuning the real model; loading real weights goes through `hf/`.
"""

from __future__ import annotations

from scalerl_jax.config import ModelConfig, RopeScaling

_LLAMA31_ROPE = RopeScaling(
    factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8192
)
_LLAMA32_ROPE = RopeScaling(
    factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8192
)


def _qwen2(name, d, f, layers, heads, kv, vocab=151936, tied=False):
    return ModelConfig(
        name=name,
        vocab_size=vocab,
        hidden_size=d,
        intermediate_size=f,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv,
        rope_theta=1e6,
        rms_norm_eps=1e-6,
        tie_embeddings=tied,
        qkv_bias=True,
        max_position_embeddings=32768,
    )


def _qwen3(name, d, f, layers, heads, kv, tied=False):
    return ModelConfig(
        name=name,
        vocab_size=151936,
        hidden_size=d,
        intermediate_size=f,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv,
        head_dim=128,
        rope_theta=1e6,
        rms_norm_eps=1e-6,
        tie_embeddings=tied,
        qk_norm=True,
        max_position_embeddings=40960,
    )


def _llama(name, d, f, layers, heads, kv, rope, tied=False):
    return ModelConfig(
        name=name,
        vocab_size=128256,
        hidden_size=d,
        intermediate_size=f,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv,
        rope_theta=500000.0,
        rope_scaling=rope,
        rms_norm_eps=1e-5,
        tie_embeddings=tied,
        max_position_embeddings=131072,
    )


def _qwen3_moe(name, d, layers, heads, kv, experts, top_k, expert_f, dense_f):
    return _qwen3(name, d, dense_f, layers, heads, kv).replace(
        num_experts=experts,
        experts_per_token=top_k,
        moe_intermediate_size=expert_f,
        norm_topk_prob=True,
    )


# Llama-4 Scout's text model (the text_config of meta-llama/Llama-4-Scout-17B-16E): every layer
# MoE with 16 routed experts (top-1, sigmoid router scaling the expert input) plus a shared
# expert, both 8192 wide; every 4th layer NoPE with temperature tuning, the others RoPE with
# chunked local attention over 8192 positions and weightless L2 qk-norm. Loads from and exports
# to HF `Llama4ForCausalLM` (hf/llama4.py). 107,769,861,120 parameters, 17,172,894,720 active.
_SCOUT = ModelConfig(
    name="llama-4-scout-17b-16e",
    vocab_size=202048,
    hidden_size=5120,
    intermediate_size=16384,
    num_layers=48,
    num_heads=40,
    num_kv_heads=8,
    rope_theta=500000.0,  # head_dim 5120 / 40
    rope_scaling=_LLAMA31_ROPE,
    rms_norm_eps=1e-5,
    max_position_embeddings=262144,
    num_experts=16,
    experts_per_token=1,
    moe_intermediate_size=8192,
    shared_expert_size=8192,
    router="sigmoid",
    nope_layers=tuple(range(3, 48, 4)),
    local_attention_chunk=8192,
    qk_l2_norm=True,
    attn_temperature_tuning=True,
    attn_floor_scale=8192,
    attn_scale=0.1,
)


def _tiny(name, **kw):
    base = dict(
        name=name,
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        rope_theta=10000.0,
        rms_norm_eps=1e-6,
        max_position_embeddings=2048,
    )
    base.update(kw)
    return ModelConfig(**base)


PRESETS: dict[str, ModelConfig] = {
    # HuggingFaceTB/SmolLM2-135M(-Instruct): the `gsm8k` recipe's model (make fetch-model).
    "smollm2-135m": ModelConfig(
        name="smollm2-135m",
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_layers=30,
        num_heads=9,
        num_kv_heads=3,
        rope_theta=1e5,
        rms_norm_eps=1e-5,
        tie_embeddings=True,
        max_position_embeddings=8192,
    ),
    "qwen2.5-0.5b": _qwen2("qwen2.5-0.5b", 896, 4864, 24, 14, 2, tied=True),
    "qwen2.5-1.5b": _qwen2("qwen2.5-1.5b", 1536, 8960, 28, 12, 2, tied=True),
    "qwen2.5-7b": _qwen2("qwen2.5-7b", 3584, 18944, 28, 28, 4, vocab=152064),
    "qwen3-0.6b": _qwen3("qwen3-0.6b", 1024, 3072, 28, 16, 8, tied=True),
    "qwen3-1.7b": _qwen3("qwen3-1.7b", 2048, 6144, 28, 16, 8, tied=True),
    "qwen3-8b": _qwen3("qwen3-8b", 4096, 12288, 36, 32, 8),
    "llama-3.2-1b": _llama("llama-3.2-1b", 2048, 8192, 16, 32, 8, _LLAMA32_ROPE, tied=True),
    "llama-3.1-8b": _llama("llama-3.1-8b", 4096, 14336, 32, 32, 8, _LLAMA31_ROPE),
    "llama-3.1-70b": _llama("llama-3.1-70b", 8192, 28672, 80, 64, 8, _LLAMA31_ROPE),
    "qwen3-30b-a3b": _qwen3_moe("qwen3-30b-a3b", 2048, 48, 32, 4, 128, 8, 768, 6144),
    "llama-4-scout-17b-16e": _SCOUT,
    # Tiny shapes: unit tests and the CPU testbed.
    "tiny-llama": _tiny(
        "tiny-llama",
        rope_scaling=RopeScaling(
            factor=8.0,
            low_freq_factor=1.0,
            high_freq_factor=4.0,
            original_max_position_embeddings=64,
        ),
    ),
    "tiny-qwen2": _tiny("tiny-qwen2", qkv_bias=True, tie_embeddings=True),
    "tiny-qwen3": _tiny("tiny-qwen3", qk_norm=True, head_dim=32),
    # 8 experts of width 32, top-2, layer 1 dense: a Qwen3-MoE in miniature.
    "tiny-qwen3-moe": _tiny(
        "tiny-qwen3-moe",
        qk_norm=True,
        head_dim=32,
        num_experts=8,
        experts_per_token=2,
        moe_intermediate_size=32,
        norm_topk_prob=True,
        dense_layers=(1,),
    ),
    # A Llama-4 in miniature: 4 layers (layer 3 NoPE with temperature tuning, the others RoPE
    # with 8-position chunked attention and L2 qk-norm), layer 2 dense, the rest MoE with 4
    # experts (top-1) and a shared expert. A small floor scale makes the temperature vary
    # within short test sequences.
    "tiny-llama4": _tiny(
        "tiny-llama4",
        num_layers=4,
        num_experts=4,
        experts_per_token=1,
        moe_intermediate_size=32,
        shared_expert_size=32,
        router="sigmoid",
        dense_layers=(2,),
        nope_layers=(3,),
        local_attention_chunk=8,
        qk_l2_norm=True,
        attn_temperature_tuning=True,
        attn_floor_scale=4,
        rms_norm_eps=1e-5,
    ),
}


def get(name: str, **overrides) -> ModelConfig:
    if name not in PRESETS:
        raise KeyError(f"unknown model preset {name!r}; known: {sorted(PRESETS)}")
    cfg = PRESETS[name]
    return cfg.replace(**overrides) if overrides else cfg
