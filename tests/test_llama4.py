"""Llama-4 text models: HF `Llama4ForCausalLM` parity (NoPE + temperature-tuned layers, chunked
local attention, L2 qk-norm, interleaved RoPE, routed + shared experts, dense layers) on padded
batches, export -> transformers reload, KV-cache decode across chunk boundaries, the
multimodal checkpoint's language model, config refusals and the Scout preset's counts."""

import json

import jax
import numpy as np
import pytest
from flax import nnx

from scalerl_jax.config import ConfigError
from scalerl_jax.models import hf, presets
from scalerl_jax.models.transformer import forward_logits, init_cache

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

T = 20  # with chunk 8 every full row crosses two chunk boundaries
# Layers 1 and 3 NoPE (global attention, temperature tuning), 0 and 2 RoPE (chunked, L2 qk-norm);
# MoE on 0, 1, 3 (off the interleave-step grid), layer 2 dense and wider. floor_scale 4 makes the
# temperature change every 4 positions; the llama3 RoPE scaling is exercised too.
HF_CFG = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=32,
    intermediate_size_mlp=96,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    num_local_experts=4,
    num_experts_per_tok=2,
    moe_layers=[0, 1, 3],
    interleave_moe_layer_step=1,
    no_rope_layers=[1, 0, 1, 0],
    attention_chunk_size=8,
    use_qk_norm=True,
    attn_temperature_tuning=True,
    floor_scale=4,
    attn_scale=0.5,
    max_position_embeddings=256,
    rms_norm_eps=1e-5,
    tie_word_embeddings=False,
    rope_parameters=dict(
        rope_type="llama3",
        rope_theta=10000.0,
        factor=8.0,
        low_freq_factor=1.0,
        high_freq_factor=4.0,
        original_max_position_embeddings=16,
    ),
)


def _hf_model(seed=0):
    torch.manual_seed(seed)
    config = transformers.Llama4TextConfig(**HF_CFG)
    config._attn_implementation = "eager"
    model = transformers.Llama4ForCausalLM(config).eval()
    with torch.no_grad():  # HF one-inits norms and zero-inits the experts: perturb everything
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return model


def _hf_row_logits(model, row):
    """HF logits of one unpadded sequence: its own positions 0..n-1 (transformers'
    temperature tuning counts cache indices, not position_ids, so padding there would shift it;
    the padded batch is ours to handle)."""
    with torch.no_grad():
        return model(input_ids=torch.tensor([row])).logits[0].numpy()


def _padded_batch(side, vocab=128):
    rng = np.random.RandomState(1)
    tokens = rng.randint(0, vocab, (3, T))
    lengths = np.array([T, 13, 6])
    idx = np.arange(T)[None]
    mask = idx < lengths[:, None] if side == "right" else idx >= T - lengths[:, None]
    positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
    return tokens, mask.astype(np.int32), positions.astype(np.int32)


_forward = jax.jit(forward_logits, static_argnums=0)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    model = _hf_model()
    path = tmp_path_factory.mktemp("llama4")
    model.save_pretrained(path, safe_serialization=True)
    return path, model


def _assert_rows_match(ours, model, tokens, mask):
    for b in range(tokens.shape[0]):
        keep = mask[b] > 0
        want = _hf_row_logits(model, tokens[b][keep].tolist())
        np.testing.assert_allclose(
            np.asarray(ours[b])[keep], want, atol=1e-4, rtol=0, err_msg=f"row {b}"
        )


def test_config_maps_every_llama4_field(checkpoint):
    path, _ = checkpoint
    cfg = hf.config_from_hf(path)
    assert (
        cfg.nope_layers,
        cfg.local_attention_chunk,
        cfg.qk_l2_norm,
        cfg.qk_norm,
        cfg.attn_temperature_tuning,
        cfg.attn_floor_scale,
        cfg.attn_scale,
    ) == ((1, 3), 8, True, False, True, 4, 0.5)
    assert (
        cfg.num_experts,
        cfg.experts_per_token,
        cfg.expert_size,
        cfg.shared_expert_size,
        cfg.intermediate_size,
        cfg.router,
    ) == (4, 2, 32, 32, 96, "sigmoid")
    assert [cfg.is_moe_layer(i) for i in range(4)] == [True, True, False, True]
    assert [cfg.is_local_attention_layer(i) for i in range(4)] == [True, False, True, False]
    assert cfg.rope_scaling.original_max_position_embeddings == 16
    assert hf.config_from_hf(hf.config_to_hf(cfg)) == cfg.replace(name="Llama4ForCausalLM")


@pytest.mark.parametrize("side", ["right", "left"])
def test_logits_match_transformers(checkpoint, side):
    path, model = checkpoint
    _, graphdef, params = hf.load_params(path)
    tokens, mask, positions = _padded_batch(side)
    _assert_rows_match(_forward(graphdef, params, tokens, positions, mask), model, tokens, mask)


def test_packed_segments_equal_separate_sequences(checkpoint):
    """Two sequences packed in one row (positions restart, segment ids differ) give the same
    logits as each alone: the chunks and the temperature follow positions, not indices."""
    path, _ = checkpoint
    _, graphdef, params = hf.load_params(path)
    rng = np.random.RandomState(3)
    a, b = rng.randint(0, 128, 11), rng.randint(0, 128, 9)
    tokens = np.zeros((3, T), np.int64)
    tokens[0], tokens[1, :11], tokens[2, :9] = np.concatenate([a, b]), a, b
    segments = np.array([[1] * 11 + [2] * 9, [1] * 11 + [0] * 9, [1] * 9 + [0] * 11])
    positions = np.array(
        [list(range(11)) + list(range(9)), list(range(11)) + [0] * 9, list(range(9)) + [0] * 11]
    )
    out = np.asarray(_forward(graphdef, params, tokens, positions, segments))
    np.testing.assert_allclose(out[0, :11], out[1, :11], atol=1e-5)
    np.testing.assert_allclose(out[0, 11:], out[2, :9], atol=1e-5)


def test_each_feature_changes_the_logits(checkpoint):
    """Switching off any one Llama-4 attention feature in transformers moves the logits far
    beyond the parity tolerance, so the parity tests would catch our lacking it."""
    _, model = checkpoint
    row = np.random.RandomState(4).randint(0, 128, T).tolist()
    base = _hf_row_logits(model, row)
    for change in (
        dict(layer_types=["full_attention"] * 4),
        dict(no_rope_layers=[1] * 4),
        dict(use_qk_norm=False),
        dict(attn_temperature_tuning=False),
    ):
        config = transformers.Llama4TextConfig(**{**HF_CFG, **change})
        config._attn_implementation = "eager"
        other = transformers.Llama4ForCausalLM(config).eval()
        other.load_state_dict(model.state_dict())
        assert np.abs(_hf_row_logits(other, row) - base).max() > 1e-2, change


def test_sharded_load_equals_unsharded(checkpoint):
    """Each device reads its own block: the fused gate_up_proj halves at their column offsets
    and q/k head_dim permuted, under an expert x fsdp x tensor mesh."""
    from scalerl_jax import mesh as mesh_lib
    from scalerl_jax.config import MeshConfig

    path, _ = checkpoint
    mesh = mesh_lib.trainer_mesh(MeshConfig(expert=2, fsdp=2, tensor=2), jax.devices())
    _, _, sharded = hf.load_params(path, mesh=mesh)
    _, _, single = hf.load_params(path)
    up = sharded["layers"][0]["mlp"]["up"].get_value()
    assert up.sharding.spec == jax.sharding.PartitionSpec(None, "expert", "fsdp", "tensor")
    for (k, a), (_, b) in zip(nnx.to_flat_state(sharded), nnx.to_flat_state(single)):
        np.testing.assert_array_equal(
            np.asarray(a.get_value()), np.asarray(b.get_value()), err_msg=str(k)
        )


def test_export_reloads_in_transformers(checkpoint, tmp_path):
    path, model = checkpoint
    cfg, graphdef, params = hf.load_params(path)
    hf.export(params, cfg, tmp_path / "out", max_shard_bytes=100_000)  # several files
    back = transformers.Llama4ForCausalLM.from_pretrained(
        tmp_path / "out", attn_implementation="eager"
    ).eval()
    want = model.state_dict()
    for name, value in back.state_dict().items():
        assert torch.equal(value, want[name]), name
    tokens, mask, _ = _padded_batch("right")
    row = tokens[0].tolist()
    np.testing.assert_array_equal(_hf_row_logits(back, row), _hf_row_logits(model, row))


def test_multimodal_checkpoint_loads_its_language_model(checkpoint, tmp_path, caplog):
    """A Llama4ForConditionalGeneration directory (nested text_config, language_model.*
    tensors, a vision tower) loads the language model's params and says the rest is skipped."""
    from safetensors.numpy import load_file, save_file

    path, _ = checkpoint
    tensors = {
        "language_model." + k: v for k, v in load_file(str(path / "model.safetensors")).items()
    }
    tensors["vision_model.patch_embedding.linear.weight"] = np.ones((8, 4), np.float32)
    tensors["multi_modal_projector.linear_1.weight"] = np.ones((4, 8), np.float32)
    save_file(tensors, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    text = json.loads((path / "config.json").read_text())
    (tmp_path / "config.json").write_text(
        json.dumps(
            dict(
                architectures=["Llama4ForConditionalGeneration"],
                model_type="llama4",
                text_config=text,
                vision_config=dict(hidden_size=8),
            )
        )
    )
    with caplog.at_level("INFO", logger="scalerl_jax.models.hf"):
        cfg, _, params = hf.load_params(tmp_path)
    assert "vision tower" in caplog.text and "ignoring 2 vision-tower tensors" in caplog.text
    _, _, want = hf.load_params(path)
    assert cfg == hf.config_from_hf(path).replace(name=cfg.name)
    for (k, a), (_, b) in zip(nnx.to_flat_state(params), nnx.to_flat_state(want)):
        np.testing.assert_array_equal(
            np.asarray(a.get_value()), np.asarray(b.get_value()), err_msg=str(k)
        )


def test_kv_cache_decode_equals_full_forward_across_chunks(checkpoint):
    """Prefill then one token per row per step (rows at different positions, as the sampler
    decodes) gives the full forward's logits, including steps whose position starts a new
    chunk (8, 16) and the NoPE layers' global, temperature-scaled attention."""
    path, _ = checkpoint
    cfg, graphdef, params = hf.load_params(path)
    tokens, mask, positions = _padded_batch("right")
    tokens[:] = tokens[0]  # three full rows (the full-forward shape of the parity tests)
    mask[:], positions[:] = 1, np.arange(T)
    full = np.asarray(_forward(graphdef, params, tokens, positions, mask))

    @jax.jit
    def decode(params, tokens, positions, cache):
        model = nnx.merge(graphdef, params)
        hidden, cache = model.decode(tokens, positions, cache)
        return model.logits(hidden), cache

    # Rows really have 3, 5 and 7 prompt tokens; all prefill 7 (the shorter rows' extra slots
    # are overwritten by their decode steps, as with the engine's padded prefill).
    logits, cache = decode(params, tokens[:, :7], positions[:, :7], init_cache(cfg, 3, 24))
    np.testing.assert_allclose(np.asarray(logits), full[:, :7], atol=1e-5)
    pos = np.array([3, 5, 7])
    rows = np.arange(3)
    while pos.min() < T:
        p = np.minimum(pos, T - 1)
        logits, cache = decode(params, tokens[rows, p][:, None], p[:, None], cache)
        for b in rows[pos < T]:
            np.testing.assert_allclose(
                np.asarray(logits)[b, 0],
                full[b, pos[b]],
                atol=1e-5,
                err_msg=f"row {b} position {pos[b]}",
            )
        pos = pos + 1


@pytest.mark.fast
def test_unsupported_settings_are_refused_by_name():
    base = json.loads(json.dumps(transformers.Llama4TextConfig(**HF_CFG).to_dict()))
    base["architectures"] = ["Llama4ForCausalLM"]
    assert hf.config_from_hf(base).nope_layers == (1, 3)
    bad = {
        "layer_types": ["full_attention", "full_attention", "chunked_attention", "full_attention"],
        "hidden_act": "gelu",
        "attention_bias": True,
        "router_jitter_noise": 0.1,
        "no_rope_layers": [1, 0],
    }
    for key, value in bad.items():
        with pytest.raises(hf.HFError, match=rf"{key}={value!r}".replace("[", r"\[")):
            hf.config_from_hf({**base, key: value})
    with pytest.raises(hf.HFError, match="attention_chunk_size=None"):
        hf.config_from_hf({**base, "attention_chunk_size": None})
    with pytest.raises(hf.HFError, match="text_config"):
        hf.config_from_hf({"architectures": ["Llama4ForConditionalGeneration"]})
    tiny = presets.get("tiny-llama4")
    assert hf.config_from_hf(hf.config_to_hf(tiny)) == tiny.replace(name="Llama4ForCausalLM")
    with pytest.raises(hf.HFError, match="no HF equivalent.*qk_norm=True"):
        hf.config_to_hf(tiny.replace(qk_l2_norm=False, qk_norm=True))
    with pytest.raises(ConfigError, match=r"nope_layers=\(4,\)"):
        tiny.replace(nope_layers=(4,))
    with pytest.raises(ConfigError, match="local_attention_chunk=-1"):
        tiny.replace(local_attention_chunk=-1)
    with pytest.raises(ConfigError, match="qk_l2_norm=True: excludes qk_norm"):
        tiny.replace(qk_norm=True)
    with pytest.raises(ConfigError, match="attn_floor_scale=0"):
        tiny.replace(attn_floor_scale=0)


def test_scout_preset_is_the_hf_scout_config():
    """The preset equals what config_from_hf reads from Scout's published text config, and its
    parameter counts equal a transformers Llama4ForCausalLM built on the meta device."""
    scout = presets.get("llama-4-scout-17b-16e")
    published = dict(  # meta-llama/Llama-4-Scout-17B-16E config.json, text_config
        architectures=["Llama4ForCausalLM"],
        attention_bias=False,
        attention_chunk_size=8192,
        attn_scale=0.1,
        attn_temperature_tuning=4,
        floor_scale=8192,
        head_dim=128,
        hidden_act="silu",
        hidden_size=5120,
        interleave_moe_layer_step=1,
        intermediate_size=8192,
        intermediate_size_mlp=16384,
        max_position_embeddings=262144,
        model_type="llama4_text",
        moe_layers=list(range(48)),
        no_rope_layers=[int((i + 1) % 4 != 0) for i in range(48)],
        num_attention_heads=40,
        num_experts_per_tok=1,
        num_hidden_layers=48,
        num_key_value_heads=8,
        num_local_experts=16,
        output_router_logits=False,
        rms_norm_eps=1e-5,
        rope_scaling=dict(
            factor=8.0,
            high_freq_factor=4.0,
            low_freq_factor=1.0,
            original_max_position_embeddings=8192,
            rope_type="llama3",
        ),
        rope_theta=500000.0,
        router_aux_loss_coef=0.001,
        router_jitter_noise=0.0,
        use_qk_norm=True,
        vocab_size=202048,
        tie_word_embeddings=False,
    )
    assert hf.config_from_hf(published) == scout.replace(name="Llama4ForCausalLM")
    kw = {k: v for k, v in published.items() if k not in ("architectures", "model_type")}
    with torch.device("meta"):  # transformers 5's strict config wants a bool for the 4
        model = transformers.Llama4ForCausalLM(
            transformers.Llama4TextConfig(**{**kw, "attn_temperature_tuning": True})
        )
    total = sum(p.numel() for p in model.parameters())
    experts = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)
    assert total == scout.num_params() == 107_769_861_120
    assert total - experts * 15 // 16 == scout.num_params(active=True) == 17_172_894_720


def test_sampler_engine_logprobs_equal_training_forward():
    """The sampler (Engine: padded prefill, multi-step decode on a data x tensor mesh) gives the
    training forward's log-probs for a tiny-llama4 continuation that crosses chunk boundaries
    (positions 8 and 16)."""
    from _sampler_params import engine_and_forward_logprobs

    seq, lps, ref = engine_and_forward_logprobs(presets.get("tiny-llama4"), calls=4)
    assert len(seq) == 21  # the last log-prob is read at position 19, in the third chunk
    np.testing.assert_allclose(lps, ref, atol=1e-5, rtol=0)
