"""HF interop: tiny random transformers models -> our loader -> same logits, and export back."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from scalerl_jax import mesh as mesh_lib
from scalerl_jax.config import MeshConfig
from scalerl_jax.models import hf, presets
from scalerl_jax.models.transformer import forward_logits, layer_params

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

COMMON = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
)
# original_max_position_embeddings=16 spreads the 8 RoPE frequencies of head_dim 16 over the
# Llama-3 bands (blended / divided by `factor`), so a 40-token batch sees the scaling.
LLAMA3_ROPE = dict(
    rope_type="llama3",
    factor=8.0,
    low_freq_factor=1.0,
    high_freq_factor=4.0,
    original_max_position_embeddings=16,
)


def _hf_config(arch):
    if arch == "llama":
        return transformers.LlamaConfig(**COMMON, rope_scaling=LLAMA3_ROPE, rope_theta=10000.0)
    if arch == "qwen2":
        return transformers.Qwen2Config(**COMMON, tie_word_embeddings=True)
    return transformers.Qwen3Config(**COMMON, head_dim=32)  # head_dim != hidden / heads


def _hf_model(arch, seed=0):
    cls = {
        "llama": transformers.LlamaForCausalLM,
        "qwen2": transformers.Qwen2ForCausalLM,
        "qwen3": transformers.Qwen3ForCausalLM,
    }[arch]
    torch.manual_seed(seed)
    model = cls(_hf_config(arch)).eval()
    with torch.no_grad():  # HF zero-inits biases and one-inits norms: perturb so both are tested
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return model


def _batch():
    rng = np.random.RandomState(0)
    tokens = rng.randint(0, COMMON["vocab_size"], (3, 40))
    lengths = np.array([40, 23, 6])  # right padding
    mask = (np.arange(40)[None] < lengths[:, None]).astype(np.int32)
    return tokens, mask


def _hf_logits(model, tokens, mask):
    with torch.no_grad():
        out = model(input_ids=torch.tensor(tokens), attention_mask=torch.tensor(mask))
    return out.logits.numpy()


def _max_diff(a, b, mask):
    return float(np.abs(np.asarray(a, np.float32) - np.asarray(b, np.float32))[mask > 0].max())


@pytest.fixture(scope="module", params=["llama", "qwen2", "qwen3"])
def checkpoint(request, tmp_path_factory):
    model = _hf_model(request.param)
    path = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(path, safe_serialization=True)
    tokens, mask = _batch()
    return request.param, path, model, _hf_logits(model, tokens, mask)


@pytest.fixture(scope="module")
def mesh():
    return mesh_lib.trainer_mesh(MeshConfig(fsdp=4, tensor=2), jax.devices())


def test_logits_match_transformers(checkpoint):
    arch, path, _, ref = checkpoint
    tokens, mask = _batch()
    cfg, graphdef, params = hf.load_params(path)
    assert (cfg.qkv_bias, cfg.qk_norm, cfg.tie_embeddings) == (
        arch == "qwen2",
        arch == "qwen3",
        arch == "qwen2",
    )
    out = forward_logits(graphdef, params, tokens, segment_ids=mask)
    assert out.dtype == jnp.float32
    assert _max_diff(out, ref, mask) <= 1e-4
    if arch == "llama":  # the comparison can see RoPE scaling: without it logits differ
        plain = forward_logits(
            *hf.load_params(path, cfg=cfg.replace(rope_scaling=None))[1:], tokens, segment_ids=mask
        )
        assert _max_diff(plain, ref, mask) > 1e-3


def test_sharded_load_and_export_round_trip(checkpoint, mesh, tmp_path):
    arch, path, model, ref = checkpoint
    tokens, mask = _batch()
    # chunked causal attention (3 query chunks of 16) on this path, one block on the other
    cfg = hf.config_from_hf(path, attention_chunk=16)
    cfg, graphdef, params = hf.load_params(path, mesh=mesh, cfg=cfg)
    q = params["layers"][0]["attn"]["q"].get_value()  # stacked over the layers
    assert q.sharding.spec == jax.sharding.PartitionSpec(None, "fsdp", "tensor", None)
    assert q.addressable_shards[0].data.shape == (cfg.num_layers, 16, 2, cfg.dim_per_head)
    assert _max_diff(forward_logits(graphdef, params, tokens, segment_ids=mask), ref, mask) <= 1e-4

    files = hf.export(params, cfg, tmp_path, max_shard_bytes=40_000)
    assert len(files) > 1 and (tmp_path / "model.safetensors.index.json").exists()
    back = type(model).from_pretrained(tmp_path).eval()
    assert back.dtype == torch.float32
    assert _max_diff(_hf_logits(back, tokens, mask), ref, mask) <= 1e-5
    exported = json.loads((tmp_path / "config.json").read_text())
    assert hf.config_from_hf(exported, attention_chunk=16) == cfg.replace(
        name=exported["architectures"][0]
    )


def test_sharded_checkpoint_via_index(tmp_path):
    model = _hf_model("qwen3", seed=1)
    model.save_pretrained(tmp_path, safe_serialization=True, max_shard_size="50KB")
    assert (tmp_path / "model.safetensors.index.json").exists()
    tokens, mask = _batch()
    _, graphdef, params = hf.load_params(tmp_path)
    out = forward_logits(graphdef, params, tokens, segment_ids=mask)
    assert _max_diff(out, _hf_logits(model, tokens, mask), mask) <= 1e-4


def test_bf16_checkpoint_loads_exactly(tmp_path):
    model = _hf_model("qwen2", seed=2).to(torch.bfloat16)
    model.save_pretrained(tmp_path, safe_serialization=True)
    want = model.model.layers[1].self_attn.k_proj.weight.detach().float().numpy()  # [KV*hd, D]
    for dtype, np_dtype in ((None, np.float32), ("bfloat16", jnp.bfloat16)):
        cfg, _, params = hf.load_params(tmp_path, dtype=dtype)
        k = np.asarray(layer_params(params, cfg, 1)["attn"]["k"].get_value())
        assert k.dtype == np_dtype
        np.testing.assert_array_equal(k.astype(np.float32), want.T.reshape(64, 2, 16))
    hf.export(params, cfg, tmp_path / "out")  # bf16 params -> a bf16 checkpoint
    back = transformers.Qwen2ForCausalLM.from_pretrained(tmp_path / "out")
    assert json.loads((tmp_path / "out" / "config.json").read_text())["torch_dtype"] == "bfloat16"
    for a, b in zip(back.state_dict().values(), model.state_dict().values()):
        assert torch.equal(a.float(), b.float())  # (transformers 4 upcasts to fp32 on load)


@pytest.mark.fast
def test_read_slice_maps_every_block(checkpoint):
    """A device's block read straight from the file equals slicing the fully loaded array,
    including a block that cuts head_dim (read whole, sliced afterwards)."""
    from safetensors import safe_open

    _, path, _, _ = checkpoint
    cfg, _, params = hf.load_params(path)
    entries = {(e.path, e.layer): e for e in hf.tensor_map(cfg)}
    n = cfg.num_layers  # dense: every layer is a row of ("layers", 0, ...)
    with safe_open(str(path / "model.safetensors"), framework="numpy") as f:
        for layer, key, index in [
            (1, ("attn", "q"), np.s_[8:40, 1:3, 2:7]),
            (0, ("attn", "o"), np.s_[2:4, :, 16:48]),
            (0, ("mlp", "down"), np.s_[48:96, 0:32]),
        ]:
            full = np.asarray(layer_params(params, cfg, layer)[key[0]][key[1]].get_value())
            entry = entries[(("layers", 0, *key), (layer, n))]
            got = hf._read_slice(f, entry, index, np.float32)
            np.testing.assert_array_equal(got, full[index])


@pytest.mark.fast
def test_config_from_hf_reads_both_rope_spellings_and_matches_presets():
    v4 = dict(
        architectures=["LlamaForCausalLM"],
        vocab_size=128256,
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        rms_norm_eps=1e-5,
        max_position_embeddings=131072,
        rope_theta=500000.0,
        tie_word_embeddings=False,
        hidden_act="silu",
        rope_scaling=dict(
            rope_type="llama3",
            factor=8.0,
            low_freq_factor=1.0,
            high_freq_factor=4.0,
            original_max_position_embeddings=8192,
        ),
    )
    v5 = {k: v for k, v in v4.items() if k not in ("rope_theta", "rope_scaling")}
    v5["rope_parameters"] = dict(v4["rope_scaling"], rope_theta=500000.0)
    v5["head_dim"] = 128
    want = presets.get("llama-3.1-8b")
    assert hf.config_from_hf(v4).replace(name=want.name) == want
    assert hf.config_from_hf(v5).replace(name=want.name) == want
    qwen = dict(
        architectures=["Qwen2ForCausalLM"],
        vocab_size=151936,
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        rms_norm_eps=1e-6,
        max_position_embeddings=32768,
        rope_theta=1000000.0,
        tie_word_embeddings=True,
        use_sliding_window=False,
    )
    got = hf.config_from_hf(qwen, param_dtype="bfloat16")
    assert got.param_dtype == "bfloat16"
    assert got.replace(name="qwen2.5-0.5b", param_dtype="float32") == presets.get("qwen2.5-0.5b")


@pytest.mark.parametrize(
    "change, match",
    [
        (
            dict(architectures=["MistralForCausalLM"]),
            r"unsupported architecture 'MistralForCausalLM'.*LlamaForCausalLM.*Qwen3ForCausalLM",
        ),
        (dict(architectures=None, model_type="gemma"), r"unsupported architecture 'gemma'"),
        (dict(rope_scaling=dict(rope_type="yarn", factor=4.0)), r"rope type 'yarn'"),
        (dict(attention_bias=True), r"attention_bias=True is not supported for LlamaForCausalLM"),
        (dict(hidden_act="gelu"), r"hidden_act='gelu'"),
        (dict(intermediate_size=None), r"config.json has no 'intermediate_size'"),
    ],
)
def test_config_from_hf_rejects_what_it_cannot_represent(change, match):
    base = dict(
        architectures=["LlamaForCausalLM"],
        vocab_size=128,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
    )
    with pytest.raises(hf.HFError, match=match):
        hf.config_from_hf({**base, **change})


def _rewrite(src, dst, edit):
    """Copy a single-file checkpoint, editing its tensor dict."""
    from safetensors.numpy import load_file, save_file

    tensors = load_file(str(src / "model.safetensors"))
    edit(tensors)
    dst.mkdir(exist_ok=True)
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    (dst / "config.json").write_text((src / "config.json").read_text())
    return dst


def test_missing_unexpected_and_misshapen_tensors_are_named(tmp_path):
    src = tmp_path / "src"
    _hf_model("llama").save_pretrained(src, safe_serialization=True)
    name = "model.layers.1.self_attn.k_proj.weight"
    bad = _rewrite(src, tmp_path / "missing", lambda t: t.pop(name))
    with pytest.raises(hf.HFError, match=rf"missing tensor '{name}' \(expected shape \(32, 64\)\)"):
        hf.load_params(bad)
    bad = _rewrite(
        src,
        tmp_path / "extra",
        lambda t: t.update({"model.layers.0.mlp.extra.weight": np.zeros((3, 5), np.float32)}),
    )
    with pytest.raises(
        hf.HFError,
        match=r"unexpected tensors.*'model.layers.0.mlp.extra.weight': "
        r"\(3, 5\)",
    ):
        hf.load_params(bad)
    bad = _rewrite(
        src, tmp_path / "shape", lambda t: t.update({name: np.zeros((48, 64), np.float32)})
    )
    with pytest.raises(
        hf.HFError,
        match=rf"'{name}': checkpoint shape \(48, 64\) != expected "
        r"shape \(32, 64\)",
    ):
        hf.load_params(bad)
    cfg = hf.config_from_hf(src).replace(intermediate_size=80)
    with pytest.raises(
        hf.HFError,
        match=r"mlp.gate_proj.weight': checkpoint shape \(96, 64\) "
        r"!= expected shape \(80, 64\)",
    ):
        hf.load_params(src, cfg=cfg)
    ignorable = _rewrite(
        src,
        tmp_path / "inv_freq",
        lambda t: t.update(
            {"model.layers.0.self_attn.rotary_emb.inv_freq": np.zeros(8, np.float32)}
        ),
    )
    hf.load_params(ignorable)  # old checkpoints' RoPE buffers are not weights


def test_readme_checkpoint_example_runs_as_written(checkpoint):
    """docs/real-models.md "Your own code with an HF checkpoint": a transformers-saved
    checkpoint, a right- and a left-padded row with equal logits, and KV-cache greedy decoding
    equal to a full forward. The block is taken from the page itself, so the docs cannot drift."""
    import pathlib
    import re

    readme = (pathlib.Path(__file__).resolve().parents[1] / "docs" / "real-models.md").read_text()
    section = readme.split("## Your own code with an HF checkpoint", 1)[1]
    block = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    _, path, _, _ = checkpoint
    namespace = {"CKPT": str(path)}
    exec(compile(block, "readme_hf_example", "exec"), namespace)  # our own doc text
    assert len(namespace["generated"]) == 5
