"""Mixture-of-experts policies: HF Qwen3-MoE parity (both checkpoint layouts, padded batches),
export round trip, expert x fsdp x tensor sharding, KV-cache decode, the train step's router
metrics and aux loss, parameter counts of the real presets, and the plan's MoE accounting."""

import dataclasses
import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from scalerl_jax import mesh as mesh_lib
from scalerl_jax import plan
from scalerl_jax.config import ConfigError, LossConfig, MeshConfig, ModelConfig, OptimConfig
from scalerl_jax.models import hf, moe, presets
from scalerl_jax.models.transformer import (
    Transformer,
    create,
    forward_logits,
    init_cache,
    matmul_params,
    num_flops_per_token,
)
from scalerl_jax.train import state as state_lib
from scalerl_jax.train.step import make_train_step

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

# Layer 0 MoE, layer 1 dense (mlp_only_layers), layer 2 MoE: the interleaving is exercised.
HF_MOE = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=96,
    moe_intermediate_size=32,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    num_experts=8,
    num_experts_per_tok=2,
    norm_topk_prob=True,
    mlp_only_layers=[1],
    max_position_embeddings=256,
)


def _hf_model(seed=0, **kw):
    torch.manual_seed(seed)
    model = transformers.Qwen3MoeForCausalLM(transformers.Qwen3MoeConfig(**{**HF_MOE, **kw})).eval()
    with torch.no_grad():  # HF zero-inits the router and one-inits norms: perturb everything
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return model


def _padded_batch(side):
    rng = np.random.RandomState(1)
    tokens = rng.randint(0, HF_MOE["vocab_size"], (3, 24))
    lengths = np.array([24, 15, 5])
    idx = np.arange(24)[None]
    mask = idx < lengths[:, None] if side == "right" else idx >= 24 - lengths[:, None]
    positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
    return tokens, mask.astype(np.int32), positions.astype(np.int32)


def _hf_logits(model, tokens, mask, positions):
    with torch.no_grad():
        return model(
            input_ids=torch.tensor(tokens),
            attention_mask=torch.tensor(mask),
            position_ids=torch.tensor(positions, dtype=torch.long),
        ).logits.numpy()


# One compiled forward per shape: eager op-by-op execution is several times slower here.
_forward = jax.jit(forward_logits, static_argnums=0)


def _max_diff(a, b, mask):
    return float(np.abs(np.asarray(a, np.float32) - np.asarray(b, np.float32))[mask > 0].max())


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    model = _hf_model()
    path = tmp_path_factory.mktemp("qwen3moe")
    model.save_pretrained(path, safe_serialization=True)
    return path, model


@pytest.mark.parametrize("side", ["right", "left"])
def test_logits_match_transformers(checkpoint, side):
    path, model = checkpoint
    cfg, graphdef, params = hf.load_params(path)
    assert (
        cfg.num_experts,
        cfg.experts_per_token,
        cfg.expert_size,
        cfg.dense_layers,
        cfg.norm_topk_prob,
        cfg.num_moe_layers,
    ) == (8, 2, 32, (1,), True, 2)
    tokens, mask, positions = _padded_batch(side)
    ours = _forward(graphdef, params, tokens, positions, mask)
    assert _max_diff(ours, _hf_logits(model, tokens, mask, positions), mask) < 1e-4


def test_fused_layout_and_expert_count_spellings(checkpoint, tmp_path):
    """A checkpoint in transformers 5's in-memory layout (gate_up_proj [E, 2F, D], down_proj
    [E, D, F]) loads to the same params; `num_experts` and `num_local_experts` both parse."""
    from safetensors.torch import save_file

    path, model = checkpoint
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    assert "model.layers.0.mlp.experts.gate_up_proj" in state  # the fused in-memory names
    save_file(state, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    written = json.loads((path / "config.json").read_text())
    assert "num_local_experts" in written  # what transformers 5 writes
    written["num_experts"] = written.pop("num_local_experts")  # the hub's spelling
    (tmp_path / "config.json").write_text(json.dumps(written))
    _, _, fused = hf.load_params(tmp_path)
    _, _, split = hf.load_params(path)
    for (k, a), (_, b) in zip(nnx.to_flat_state(fused), nnx.to_flat_state(split)):
        np.testing.assert_array_equal(
            np.asarray(a.get_value()), np.asarray(b.get_value()), err_msg=str(k)
        )
    with pytest.raises(hf.HFError, match="neither 'num_experts' nor 'num_local_experts'"):
        hf.config_from_hf({k: v for k, v in written.items() if k != "num_experts"})


def test_export_reloads_in_transformers(checkpoint, tmp_path):
    path, model = checkpoint
    cfg, graphdef, params = hf.load_params(path)
    hf.export(params, cfg, tmp_path / "out", max_shard_bytes=200_000)  # several files
    assert (tmp_path / "out" / "model.safetensors.index.json").exists()
    back = transformers.Qwen3MoeForCausalLM.from_pretrained(tmp_path / "out").eval()
    want = model.state_dict()
    for name, value in back.state_dict().items():
        assert torch.equal(value, want[name]), name
    tokens, mask, positions = _padded_batch("right")
    np.testing.assert_array_equal(
        _hf_logits(back, tokens, mask, positions), _hf_logits(model, tokens, mask, positions)
    )


@pytest.mark.fast
def test_missing_expert_tensor_is_named(checkpoint, tmp_path):
    from safetensors.numpy import load_file, save_file

    path, _ = checkpoint
    tensors = load_file(str(path / "model.safetensors"))
    del tensors["model.layers.2.mlp.experts.0.up_proj.weight"]
    save_file(tensors, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text((path / "config.json").read_text())
    with pytest.raises(hf.HFError, match=r"experts\.0\.up_proj"):
        hf.load_params(tmp_path)


def test_sharded_over_expert_fsdp_tensor_equals_unsharded(checkpoint):
    path, _ = checkpoint
    mesh = mesh_lib.trainer_mesh(MeshConfig(expert=2, fsdp=2, tensor=2), jax.devices())
    assert dict(mesh.shape) == {"data": 1, "expert": 2, "fsdp": 2, "tensor": 2}
    cfg, graphdef, params = hf.load_params(path, mesh=mesh)
    gate = params["layers"][0]["mlp"]["gate"].get_value()  # [layers, E, D, F]
    assert gate.sharding.spec == jax.sharding.PartitionSpec(None, "expert", "fsdp", "tensor")
    assert gate.addressable_shards[0].data.shape == (1, 4, 32, 16)
    _, _, single = hf.load_params(path)
    tokens, mask, positions = _padded_batch("right")
    batch_sh = mesh_lib.named(mesh, "batch", None)
    assert batch_sh.spec == jax.sharding.PartitionSpec(("expert", "fsdp"), None)
    args = [
        jax.device_put(np.pad(x, ((0, 1), (0, 0))), batch_sh)  # rows: 4 = expert x fsdp
        for x in (tokens, positions, mask)
    ]
    sharded = _forward(graphdef, params, *args)
    ref = _forward(graphdef, single, tokens, positions, mask)
    assert _max_diff(sharded[:3], ref, mask) < 1e-5


def test_sampler_engine_logprobs_equal_training_forward():
    """The sampler's KV-cache decode path (Engine on a data x tensor sampler mesh) gives the
    training forward's log-probs for a sampled MoE continuation."""
    from _sampler_params import engine_and_forward_logprobs

    _, lps, ref = engine_and_forward_logprobs(presets.get("tiny-qwen3-moe"), calls=3)
    np.testing.assert_allclose(lps, ref, atol=1e-5, rtol=0)


def test_kv_cache_decode_equals_full_forward():
    cfg = _tiny_scout()
    graphdef, params = nnx.split(create(cfg, seed=3))
    tokens = jnp.asarray(np.random.RandomState(2).randint(0, cfg.vocab_size, (2, 14)))
    full = _forward(graphdef, params, tokens)

    @jax.jit
    def decode(params, tokens, positions, cache):
        model = nnx.merge(graphdef, params)
        hidden, cache = model.decode(tokens, positions, cache)
        return model.logits(hidden), cache

    logits, cache = decode(
        params, tokens[:, :9], jnp.broadcast_to(jnp.arange(9), (2, 9)), init_cache(cfg, 2, 20)
    )
    steps = [logits]
    for t in range(9, 14):  # one token per row per step, as the sampler decodes
        logits, cache = decode(params, tokens[:, t : t + 1], jnp.full((2, 1), t), cache)
        steps.append(logits)
    np.testing.assert_allclose(np.asarray(jnp.concatenate(steps, 1)), np.asarray(full), atol=1e-5)


def _tiny_scout():
    """Llama-4-style: sigmoid top-1 router scaling the expert input, plus a shared expert,
    MoE on every second layer (interleave step 2)."""
    return presets.get(
        "tiny-llama",
        num_layers=4,
        num_experts=4,
        experts_per_token=1,
        moe_intermediate_size=48,
        shared_expert_size=48,
        router="sigmoid",
        moe_layer_step=2,
    )


def test_routing_matches_a_dense_reference():
    """The sorted ragged_dot dispatch equals running every expert on every token and mixing
    by the routing weights (softmax + renormalised top-k, and sigmoid input scaling)."""
    for cfg in (presets.get("tiny-qwen3-moe"), _tiny_scout()):
        layer = moe.MoE(cfg, nnx.Rngs(params=0))
        x = jax.random.normal(jax.random.PRNGKey(1), (2, 7, cfg.hidden_size))
        out, stats = layer(x)
        flat = x.reshape(-1, cfg.hidden_size)
        weights, ids, _ = moe.route(flat @ layer.router.get_value(), cfg)
        g, u, d = (layer.gate.get_value(), layer.up.get_value(), layer.down.get_value())
        ref = jnp.zeros_like(flat)
        for j in range(cfg.experts_per_token):
            w = weights[:, j, None]
            inp = flat * w if cfg.router == "sigmoid" else flat
            h = jnp.einsum("nd,ndf->nf", inp, g[ids[:, j]])
            h = jax.nn.silu(h) * jnp.einsum("nd,ndf->nf", inp, u[ids[:, j]])
            y = jnp.einsum("nf,nfd->nd", h, d[ids[:, j]])
            ref = ref + (y if cfg.router == "sigmoid" else y * w)
        if cfg.shared_expert_size:
            ref = ref + layer.shared(flat)
        np.testing.assert_allclose(np.asarray(out.reshape(ref.shape)), np.asarray(ref), atol=1e-5)
        if cfg.norm_topk_prob:
            np.testing.assert_allclose(np.asarray(weights.sum(-1)), 1.0, rtol=1e-6)
        assert float(stats.load.sum()) == pytest.approx(1.0)


@pytest.mark.parametrize(
    "sizes,block", [((10, 0, 30, 24), 8), ((0, 0, 0, 64), 8), ((1, 2, 3, 57, 1), 16)]
)
def test_blocked_grouped_matmul_equals_ragged_dot(sizes, block):
    """The CPU grouped matmul (rows padded to blocks, a scan over blocks) equals
    jax.lax.ragged_dot in value and gradients, empty and uneven groups included."""
    sizes = jnp.asarray(sizes, jnp.int32)
    m, e = int(sizes.sum()), len(sizes)
    x = jax.random.normal(jax.random.PRNGKey(0), (m, 16))
    w = jax.random.normal(jax.random.PRNGKey(1), (e, 16, 8))
    cot = jax.random.normal(jax.random.PRNGKey(2), (m, 8))

    def loss(f):
        return lambda x, w: jnp.sum(f(x, w) * cot)

    ours = functools.partial(moe._blocked_matmul, group_sizes=sizes, block=block)
    ref = functools.partial(jax.lax.ragged_dot, group_sizes=sizes)
    np.testing.assert_allclose(ours(x, w), ref(x, w), atol=1e-5)
    for a, b in zip(jax.grad(loss(ours), (0, 1))(x, w), jax.grad(loss(ref), (0, 1))(x, w)):
        np.testing.assert_allclose(a, b, atol=1e-4)


@pytest.mark.fast
def test_aux_loss_matches_transformers():
    from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func

    logits = jax.random.normal(jax.random.PRNGKey(0), (30, 8)) * 2
    valid = np.arange(30) < 21
    cfg = presets.get("tiny-qwen3-moe")
    _, ids, probs = moe.route(logits, cfg)
    ours = moe.router_stats(probs, ids, jnp.asarray(valid), 8).aux_loss
    ref = load_balancing_loss_func(
        (torch.tensor(np.asarray(logits)),), 8, 2, torch.tensor(valid.astype(np.int64))
    )
    assert float(ours) == pytest.approx(float(ref), rel=1e-5)


def test_train_step_lowers_loss_and_logs_router_metrics():
    from test_train_step import _target_logp, make_batch

    cfg = presets.get("tiny-qwen3-moe", router_aux_loss_coef=0.1)
    mesh = mesh_lib.trainer_mesh(MeshConfig(expert=2, fsdp=2), jax.devices()[:4])
    # No weight decay: a parameter without gradient then stays exactly where it is.
    ocfg = OptimConfig(
        learning_rate=3e-3, warmup_steps=0, micro_batches=2, logprob_chunk=8, weight_decay=0.0
    )
    _, graphdef, state = state_lib.create_train_state(cfg, ocfg, mesh, seed=0)
    _, abstract = state_lib.abstract_train_state(cfg, ocfg, mesh)
    step = make_train_step(
        graphdef,
        abstract,
        mesh,
        model_cfg=cfg,
        loss_cfg=LossConfig(zero_variance_filter=False),
        optim_cfg=ocfg,
        num_prompts=4,
    )
    batch, _ = make_batch(micro_batches=2)

    # Zero advantages: the policy loss has no gradient, so only the aux loss moves anything:
    # the router does, the LM head (which the aux loss does not reach) does not.
    def params_of(st, *path):
        return np.asarray(functools.reduce(lambda x, k: x[k], path, st.params).get_value())

    _, _, fresh = state_lib.create_train_state(cfg, ocfg, mesh, seed=0)
    router0, head0 = params_of(fresh, "layers", 0, "mlp", "router"), params_of(fresh, "lm_head")
    fresh, m = step(fresh, batch.replace(advantages=np.zeros_like(batch.advantages)))
    assert np.abs(params_of(fresh, "layers", 0, "mlp", "router") - router0).max() > 1e-4
    np.testing.assert_array_equal(params_of(fresh, "lm_head"), head0)
    assert float(m["moe_aux_loss"]) >= 1.0 - 1e-4  # E sum f P >= 1 (k-normalised), = 1 balanced

    # Every advantage positive: the steps must lower the batch's own negative log-likelihood
    # (CISPO's loss value itself is not a surrogate that must fall: test_train_step.py).
    batch = batch.replace(advantages=np.abs(batch.advantages) + 0.5)
    mask = batch.loss_mask[0]
    nll0 = -_target_logp(graphdef, state.params, batch)[mask].mean()
    for _ in range(3):
        state, m = step(state, batch)
    nll1 = -_target_logp(graphdef, state.params, batch)[mask].mean()
    assert nll1 < nll0 - 0.05, (nll0, nll1)
    loads = [float(m[f"moe_load_e{i}"]) for i in range(cfg.num_experts)]
    assert sum(loads) == pytest.approx(1.0, rel=1e-4)
    assert float(m["moe_load_max"]) >= 1.0 >= float(m["moe_load_min"]) >= 0.0
    assert np.isfinite(float(m["grad_norm"])) and float(m["skipped"]) == 0.0
    assert 0.0 <= float(m["moe_load_entropy"]) <= 1.0 + 1e-6 and float(m["moe_load_cv"]) >= 0.0


@pytest.mark.parametrize("experts", [8, 128])
def test_router_metrics_summarise_many_experts(experts):
    """Per-expert keys up to 16 experts; above that only summary statistics (Qwen3-MoE's 128
    experts would otherwise log 128 keys per step). Hand-computed on a skewed load."""
    from scalerl_jax.train.step import router_metrics

    load = np.full((2, experts), 1.0 / experts, np.float32)
    load[:, 0] += 0.5 / experts  # expert 0 takes a share from expert 1, which starves
    load[:, 1] -= 0.5 / experts
    load[1, 1] = 0.0  # layer 1: expert 1 gets nothing; its layer mean is 0.25 / E
    load[1, 0] += 0.5 / experts
    m = jax.device_get(router_metrics(moe.RouterStats(jnp.asarray(load), jnp.ones((2,)))))
    mean = load.mean(0)
    per_expert = sorted(k for k in m if k[len("moe_load_e") :].isdigit())
    assert per_expert == ([] if experts > 16 else sorted(f"moe_load_e{i}" for i in range(experts)))
    assert float(m["moe_load_max"]) == pytest.approx(2.0) and float(m["moe_load_min"]) == 0.0
    assert float(m["moe_load_cv"]) == pytest.approx(mean.std() / mean.mean(), rel=1e-5)
    p = mean / mean.sum()
    assert float(m["moe_load_entropy"]) == pytest.approx(
        -(p * np.log(p)).sum() / np.log(experts), rel=1e-5
    )
    assert float(m["moe_starved_frac"]) == 0.0  # expert 1's mean load 0.25 / E >= 0.1 / E
    load[:, 1] = 0.0
    m = jax.device_get(router_metrics(moe.RouterStats(jnp.asarray(load), jnp.ones((2,)))))
    assert float(m["moe_starved_frac"]) == pytest.approx(1.0 / experts)


# -------------------------------------------------------------------------------- accounting
def test_real_preset_parameter_counts():
    """Published totals: Qwen3-30B-A3B 30.5B total / 3.3B active; Llama-4 Scout 17B active and
    109B total with its vision encoder (the text model here: 107.77B)."""
    q = presets.get("qwen3-30b-a3b")
    assert 30.5e9 <= q.num_params() < 30.6e9  # 30,532,122,624
    assert 3.3e9 <= q.num_params(active=True) < 3.4e9  # 3,353,032,704
    s = presets.get("llama-4-scout-17b-16e")
    assert 17e9 <= s.num_params(active=True) < 17.3e9  # 17,172,894,720
    assert 107.7e9 <= s.num_params() < 107.8e9  # 107,769,861,120
    # By hand for Qwen3-30B-A3B: 48 layers of attention (q, k, v, o, qk-norms), 2 norms, a
    # router and 128 (or 8 active) experts of 3 x 2048 x 768, plus untied embeddings.
    attn = 2048 * 32 * 128 * 2 + 2048 * 4 * 128 * 2 + 2 * 128
    layer = attn + 2 * 2048 + 2048 * 128
    emb = 2 * 151936 * 2048 + 2048
    assert q.num_params() == 48 * (layer + 128 * 3 * 2048 * 768) + emb
    assert q.num_params(active=True) == 48 * (layer + 8 * 3 * 2048 * 768) + emb
    assert matmul_params(q) == q.num_params(active=True) - 151936 * 2048
    dense = presets.get("qwen3-8b")
    assert num_flops_per_token(q, 1024) < num_flops_per_token(dense, 1024) / 2


@pytest.mark.parametrize("name", ["tiny-qwen3-moe", "tiny-scout"])
def test_counts_and_plan_inventory_match_the_module(name):
    cfg = presets.get(name) if name != "tiny-scout" else _tiny_scout()
    abstract = nnx.eval_shape(lambda: Transformer(cfg, nnx.Rngs(params=0)))
    leaves = jax.tree.leaves(nnx.state(abstract), is_leaf=lambda x: isinstance(x, nnx.Variable))
    real = sum(int(np.prod(v.get_value().shape)) for v in leaves)
    assert cfg.num_params() == real
    assert sum(int(np.prod(s)) * k for s, _, k in plan.param_inventory(cfg)) == real
    # Per-device bytes under expert x fsdp x tensor equal the real shardings'.
    mesh = mesh_lib.trainer_mesh(MeshConfig(expert=2, fsdp=2, tensor=2), jax.devices())
    shardings = jax.tree.leaves(mesh_lib.state_shardings(nnx.state(abstract), mesh))
    per_device = sum(
        4 * int(np.prod(sh.shard_shape(v.get_value().shape))) for v, sh in zip(leaves, shardings)
    )
    assert plan.param_bytes(cfg, dict(mesh.shape)) == per_device


def test_scout_plan_counts_all_experts_in_memory_and_active_in_flops():
    from scalerl_jax import recipes

    cfg = recipes.get("scalerl", model="llama-4-scout-17b-16e")
    cfg = dataclasses.replace(cfg, model=cfg.model.replace(param_dtype="bfloat16"))
    p = plan.resolve(cfg, plan.topology("v5p-256"))
    m = cfg.model
    # Weight sync gathers one group at a time: the largest is the bf16 LM head (1.9 GiB, over
    # the 1 GiB group budget; an expert tensor is 1.25 GiB), not the model. FLOPs at 6 x active.
    assert p.trainer.weight_sync * p.layout.trainer_per_host == 2 * m.vocab_size * m.hidden_size
    prompt, completion = p.assumptions.lengths(cfg)
    per_token = p.time.trainer_flops / (48 * 16 * (prompt + completion))
    assert per_token == pytest.approx(num_flops_per_token(m, prompt + completion))
    assert 6 * matmul_params(m) < per_token < 6 * matmul_params(m) * 1.5


@pytest.mark.fast
def test_config_validation_names_field_and_value():
    base = presets.get("tiny-qwen3-moe")
    with pytest.raises(ConfigError, match=r"experts_per_token=9: must be in \[1, num_experts=8\]"):
        base.replace(experts_per_token=9)
    with pytest.raises(ConfigError, match=r"router='topk'"):
        base.replace(router="topk")
    with pytest.raises(ConfigError, match=r"router_aux_loss_coef=-0.1"):
        base.replace(router_aux_loss_coef=-0.1)
    with pytest.raises(ConfigError, match=r"dense_layers=\(5,\)"):
        base.replace(dense_layers=(5,))
    with pytest.raises(ConfigError, match=r"num_experts=0: experts_per_token"):
        ModelConfig(
            vocab_size=8,
            hidden_size=8,
            intermediate_size=8,
            num_layers=1,
            num_heads=2,
            num_kv_heads=2,
            experts_per_token=2,
        )
    with pytest.raises(ConfigError, match=r"MeshConfig.expert=0"):
        MeshConfig(expert=0)
    with pytest.raises(hf.HFError, match="no HF equivalent"):  # Llama-4 needs a shared expert
        hf.config_to_hf(_tiny_scout().replace(shared_expert_size=0))
