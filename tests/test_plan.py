"""scalerl_jax.plan: the topology table, the parameter inventory against the real module, memory
per chip against hand-computed values and real shardings, resolution, the hardware check."""

import dataclasses
from types import SimpleNamespace

import jax
import numpy as np
import pytest
from flax import nnx

from scalerl_jax import mesh as mesh_lib
from scalerl_jax import plan, recipes
from scalerl_jax.config import MeshConfig
from scalerl_jax.models import presets
from scalerl_jax.models.transformer import Transformer, num_flops_per_token

GIB = 1 << 30


def _abstract_params(model_cfg):
    abstract = nnx.eval_shape(lambda: Transformer(model_cfg, nnx.Rngs(params=0)))
    return nnx.state(abstract)


# ------------------------------------------------------------------------------------ table
@pytest.mark.parametrize(
    "name,hosts,per_host,gen",
    [
        ("v4-8", 1, 4, "v4"),
        ("v4-32", 4, 4, "v4"),
        ("v5p-8", 1, 4, "v5p"),
        ("v5p-256", 32, 4, "v5p"),
        ("v5p-17920", 2240, 4, "v5p"),
        ("v5e-1", 1, 1, "v5e"),
        ("v5e-8", 1, 8, "v5e"),
        ("v5litepod-16", 4, 4, "v5e"),
        ("v6e-8", 1, 8, "v6e"),
        ("v6e-256", 64, 4, "v6e"),
    ],
)
def test_topology_table(name, hosts, per_host, gen):
    t = plan.topology(name)
    assert (t.hosts, t.chips_per_host, t.chip.generation) == (hosts, per_host, gen)
    assert t.chip.hbm_gib > 0 and t.chip.bf16_tflops > 0 and t.chip.hbm_gbps > 0


def test_unknown_topology_lists_the_known_ones():
    with pytest.raises(plan.PlanError) as err:
        plan.topology("v9-8")
    text = str(err.value)
    assert "unknown TPU topology 'v9-8'" in text
    for name in ("v4-8", "v5e-8", "v5p-8", "v5p-256", "v6e-16"):
        assert name in text


# ------------------------------------------------------------------------ parameter memory
@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen2", "tiny-qwen3"])
def test_param_inventory_matches_the_module(name):
    cfg = presets.get(name)
    got = []
    for v in jax.tree.leaves(_abstract_params(cfg), is_leaf=lambda x: isinstance(x, nnx.Variable)):
        shape, axes = tuple(v.get_value().shape), tuple(v.get_metadata()["logical_axes"])
        # The stacked layers' leading, replicated axis: the planner counts one array per layer.
        rows = shape[0] if axes[:1] == ("layers",) else 1
        got += [(shape[1:], axes[1:]) if axes[:1] == ("layers",) else (shape, axes)] * rows
    got.sort()
    want = sorted((s, a) for s, a, k in plan.param_inventory(cfg) for _ in range(k))
    assert got == want


@pytest.mark.parametrize("name", sorted(presets.PRESETS))
def test_param_inventory_counts_every_preset(name):
    cfg = presets.get(name)
    assert sum(np.prod(s) * k for s, _, k in plan.param_inventory(cfg)) == cfg.num_params()


@pytest.mark.parametrize("shape", [(1, 4, 2), (2, 2, 2), (1, 8, 1), (1, 1, 8)])
@pytest.mark.parametrize("name", ["tiny-qwen2", "tiny-qwen3"])
def test_param_bytes_match_real_shardings(name, shape):
    """The plan's per-device bytes equal what mesh.state_shardings puts on a device of a real
    8-device mesh (including dims replicated because the axis does not divide them)."""
    cfg = presets.get(name, param_dtype="bfloat16")
    mesh = mesh_lib.trainer_mesh(
        MeshConfig(data=shape[0], fsdp=shape[1], tensor=shape[2]), jax.devices()[:8]
    )
    state = _abstract_params(cfg)
    shardings = mesh_lib.state_shardings(state, mesh)
    leaves = jax.tree.leaves(state, is_leaf=lambda x: isinstance(x, nnx.Variable))
    real = sum(
        2 * int(np.prod(sh.shard_shape(v.get_value().shape)))
        for v, sh in zip(leaves, jax.tree.leaves(shardings))
    )
    assert plan.param_bytes(cfg, dict(zip(("data", "fsdp", "tensor"), shape))) == real


# --------------------------------------------------------------------------- the flagship
@pytest.mark.fast
def test_scalerl_8b_on_v5p_256_hand_computed():
    cfg = recipes.get("scalerl", model="llama-3.1-8b")
    p = plan.resolve(cfg, plan.topology("v5p-256"))
    m = cfg.model
    # Roles: 1 trainer + 3 sampler chips per host; the trainer mesh is fsdp over the 32
    # trainer chips (one per host).
    assert (p.layout.trainer_per_host, p.layout.sampler_per_host) == (1, 3)
    assert p.layout.trainer_mesh == (1, 32, 1) and p.layout.trainer_chips == 32
    # By hand: every matrix has an `embed` dim (4096, divisible by 32) that fsdp shards; the
    # RMSNorm scales (2 per layer + the final one) are replicated. fp32 params.
    norms = (2 * m.num_layers + 1) * m.hidden_size
    params = 4 * ((m.num_params() - norms) // 32 + norms)
    assert p.trainer.params == params
    assert p.trainer.optimizer == 2 * params  # AdamW mu and nu, in the params' fp32
    assert p.trainer.gradients == 2 * params  # fp32 accumulator + one micro-batch's grads
    # Weight sync gathers one group at a time in the sampler's dtypes: the largest group is the
    # fp32 LM head (2 GiB > the 1 GiB group budget), on the host's one trainer chip.
    assert p.trainer.weight_sync == 4 * m.vocab_size * m.hidden_size
    # Sampler: 3 chips, no tensor parallelism, slots rounded up to 66 = 3 x 22; KV by hand.
    assert p.layout.sampler_mesh == (3, 1) and p.layout.slots == 66
    kv = 22 * cfg.sampler.max_target_length * m.num_layers * 2 * m.num_kv_heads * m.dim_per_head * 2
    # Weights in the dtype of use: fp32 norms and LM head, bf16 the rest (the embedding too).
    head = m.vocab_size * m.hidden_size
    assert p.sampler.kv_cache == kv
    assert p.sampler.params == 4 * (norms + head) + 2 * (m.num_params() - norms - head)
    assert p.fits and max(p.chip_peaks) <= 95 * GIB * 0.9
    assert p.config.mesh == MeshConfig(
        trainer_devices_per_host=1, colocate=False, data=1, fsdp=32, tensor=1, sampler_tensor=1
    )
    # 48 prompts over 32 hosts: 16 hosts sample 2 per step, 16 sample 1; nothing refuses it.
    assert p.ok and not p.problems
    # FLOPs: P x G rows of mean (prompt + completion) tokens at 6N + attention.
    prompt, completion = p.assumptions.lengths(cfg)
    rows = 48 * 16
    assert p.time.trainer_flops == pytest.approx(
        rows * (prompt + completion) * num_flops_per_token(m, prompt + completion)
    )
    assert p.time.step_s == max(p.time.trainer_s, p.time.sampler_s)  # PipelineRL overlaps


@pytest.mark.parametrize(
    "name,shape",
    [
        ("tiny-qwen3-moe", (1, 2)),
        ("tiny-qwen3-moe", (2, 2)),
        ("tiny-qwen2", (1, 4)),
        ("tiny-qwen2", (2, 1)),
    ],
)
def test_sampler_param_bytes_match_the_engine(name, shape):
    """The plan's sampler bytes per chip equal the engine's real dtypes and shardings: bf16
    weights under bf16 compute, fp32 norms / router / LM head (tied: the embedding)."""
    from scalerl_jax.config import SamplerConfig
    from scalerl_jax.sampler import Engine

    cfg = presets.get(name, compute_dtype="bfloat16")
    data, tensor = shape
    mesh = mesh_lib.sampler_mesh(MeshConfig(sampler_tensor=tensor), jax.devices()[: data * tensor])
    for wd in ("compute", "param"):
        engine = Engine(
            cfg,
            mesh,
            SamplerConfig(
                max_concurrent_decodes=2,
                max_prefill_length=8,
                max_target_length=16,
                interruptions=False,
                weight_dtype=wd,
            ),
        )
        real = sum(
            int(np.prod(sh.shard_shape(x.shape))) * np.dtype(dt).itemsize
            for x, sh, dt in zip(
                jax.tree.leaves(engine.abstract_params),
                jax.tree.leaves(engine.param_shardings),
                jax.tree.leaves(engine.param_dtypes),
            )
        )
        assert plan.sampler_param_bytes(cfg, {"data": data, "tensor": tensor}, wd) == real
    assert plan.sampler_param_bytes(
        cfg, {"tensor": tensor}, "compute"
    ) < 0.6 * plan.sampler_param_bytes(cfg, {"tensor": tensor}, "param")


def _prompts(cfg, n):
    return dataclasses.replace(cfg, pipeline=dataclasses.replace(cfg.pipeline, prompts_per_step=n))


def test_scout_on_v5p_colocates_and_fits_no_slice_with_two_weight_copies():
    """Llama-4 Scout (107.8B, fp32 masters, bf16 compute). A host's sampler replica must hold
    the bf16 model (201 GiB): 3 sampler chips cannot split it (no dimension divides by 3) and 2
    would need 101 GiB each, so every chip trains and samples, the replica tensor-parallel over
    a host's 4 chips (heads, KV heads, vocab and every expert's `mlp` dim split 4 ways). The
    weight sync builds the next weights beside the ones decoding, so each chip needs two 50.7
    GiB copies: no v5p slice fits, however many hosts share the batch."""
    cfg = recipes.get("scalerl", model="llama-4-scout-17b-16e")
    m = cfg.model
    p = plan.resolve(cfg, plan.topology("v5p-256"))
    lay = p.layout
    assert lay.colocated and lay.trainer_per_host == 4 and lay.sampler_mesh == (1, 4)
    assert lay.trainer_mesh[2] == 8 and lay.remat  # 5 heads per chip; block inputs only
    assert not p.fits
    text = plan.explain(p)
    assert "each chip trains and samples and needs 152.2 GiB" in text
    assert "sampler: params 50.7, weight-sync copy 50.7, KV cache 12.0" in text
    assert "No slice in the table fits it as configured" in text
    q = plan.resolve(_prompts(cfg, 128), plan.topology("v5p-1024"))
    assert not q.fits and "needs 140.5 GiB" in plan.explain(q)
    # Sampler weights by hand: bf16 split 4 ways, except the replicated fp32 norms and
    # routers and the fp32 LM head (split over its vocab dim).
    norms = (2 * m.num_layers + 1) * m.hidden_size
    router = m.num_moe_layers * m.hidden_size * m.num_experts
    head = m.vocab_size * m.hidden_size
    assert (
        p.sampler.params
        == p.sampler.incoming
        == 2 * (m.num_params() - norms - router - head) // 4 + 4 * (norms + router) + 4 * head // 4
    )
    # Weight sync: the largest group is the fp32 LM head, over a host's 4 trainer chips.
    assert p.trainer.weight_sync == 4 * head // 4


def test_70b_on_v5e_8_does_not_fit_and_says_why():
    cfg = recipes.get("scalerl", model="llama-3.1-70b")
    p = plan.resolve(cfg, plan.topology("v5e-8"))
    assert not p.fits and not p.ok
    text = plan.explain(p)
    assert "llama-3.1-70b does not fit on v5e-8 (14.4 GiB usable of 16 GiB per chip)" in text
    # The closest layout is colocated: fp32 states over all 8 chips, bf16 sampler weights.
    assert "each chip trains and samples and needs 311.6 GiB" in text
    assert "trainer: params 32.9" in text
    assert "sampler: params 16.7, weight-sync copy 16.7" in text
    # A host-local sampler replica holds two bf16 copies of 70B (the weight sync builds the next
    # beside the one decoding): more than a v5p host's four chips hold beside the KV cache.
    assert "No slice in the table fits it as configured" in text


@pytest.mark.fast
def test_pinned_fields_are_kept_and_the_rest_planned():
    cfg = recipes.get("scalerl", model="llama-3.1-8b")
    cfg = dataclasses.replace(
        cfg,
        mesh=MeshConfig(trainer_devices_per_host=2),
        optim=dataclasses.replace(cfg.optim, micro_batches=24),
    )
    p = plan.resolve(
        cfg,
        plan.topology("v5p-64"),
        pinned={"mesh.trainer_devices_per_host", "optim.micro_batches"},
    )
    assert p.layout.trainer_per_host == 2 and p.layout.micro_batches == 24
    assert p.layout.trainer_mesh == (1, 16, 1)
    keys = {k for k, _, _ in p.changes}
    assert "optim.micro_batches" not in keys and "mesh.trainer_devices_per_host" not in keys


def test_one_chip_per_host_colocates_and_sums_memory():
    p = plan.resolve(recipes.get("testbed"), plan.topology("v5e-1"))
    assert p.layout.colocated and p.ok
    assert p.chip_peaks == (p.trainer.peak + p.sampler.peak,) * 2
    assert p.time.step_s == pytest.approx(p.time.trainer_s + p.time.sampler_s)


def test_remat_and_micro_batches_lower_activation_memory():
    m = presets.get("llama-3.1-8b", compute_dtype="bfloat16")
    no_remat = plan.activation_bytes(m, 2, 4096, 1, 512, remat=False)
    remat = plan.activation_bytes(m, 2, 4096, 1, 512, remat=True)
    assert remat < no_remat
    assert plan.activation_bytes(m, 1, 4096, 1, 512, remat=True) < remat


def test_fused_attention_and_remat_policies_in_activation_memory():
    from scalerl_jax.plan.estimate import activation_bytes

    m = presets.get("llama-3.1-8b", compute_dtype="bfloat16")
    rows, t, layers, h, hd, b = 1, 16384, 32, 32, 128, 2

    def act(remat=True, **kw):  # the `remat` argument decides; the model's field allows policies
        return activation_bytes(m.replace(remat=True, **kw), rows, t, 1, 512, remat)

    # The splash kernel keeps an fp32 log-sum-exp per query and head, not the [T, T] scores
    # (nor the dense mask): per layer, 4 + 2 bytes per causal score element less, 4 per query
    # and head more.
    full = act(remat=False, attention_impl="xla")
    splash = act(remat=False, attention_impl="splash")
    assert full - splash > layers * h * t * t / 2 * 6 > 0
    assert act(remat=False, attention_impl="auto") == splash  # T is a multiple of 128
    assert (
        activation_bytes(m.replace(attention_impl="auto"), rows, t - 1, 1, 512, False) > splash
    )  # not a multiple of the kernel's block: the XLA path
    assert act(remat=False, attention_impl="cudnn") == full  # no cuDNN on a TPU
    # attn_out keeps each layer's attention output as well as its input (both counted twice, as
    # the stacked inputs are); dots policies are planned as no remat (an upper bound).
    assert act(remat_policy="attn_out") - act() == 2 * layers * rows * t * h * hd * b
    assert act(remat_policy="dots") == act(remat=False)
    # Llama-4's chunked-local layers always run the XLA path: they keep their scores.
    local = dict(local_attention_chunk=8192, nope_layers=tuple(range(3, layers, 4)))
    assert act(remat=False, attention_impl="splash", **local) > splash


# --------------------------------------------------------------------------- the hardware
def _devices(n, hosts, platform="tpu", kind="TPU v5"):
    return [
        SimpleNamespace(platform=platform, device_kind=kind, process_index=i * hosts // n)
        for i in range(n)
    ]


def test_hardware_check_accepts_the_slice_and_refuses_anything_else():
    topo = plan.topology("v5p-16")
    assert plan.check_hardware(topo, _devices(8, 2), 2) is None
    assert "kind" in plan.check_hardware(topo, _devices(8, 2, kind="TPU v4"), 2)
    with pytest.raises(plan.PlanError) as err:
        plan.check_hardware(topo, _devices(1, 1, platform="cpu", kind="cpu"), 1)
    text = str(err.value)
    assert "--tpu v5p-16 expects 8 TPU v5p chips on 2 host(s) (4 per host)" in text
    assert "found 1 cpu device(s)" in text and "tpu/pod.sh launch" in text and "--dry-run" in text


def test_sampler_working_set_counts_batched_prefill_passes():
    from scalerl_jax.config import SamplerConfig
    from scalerl_jax.plan.estimate import prefill_score_entries

    s = SamplerConfig(max_prefill_length=2048, prefill_batch_tokens=8192)
    assert prefill_score_entries(s, groups=1) == 2048**2  # one group: never batched
    assert prefill_score_entries(s, groups=2) == 2 * 2048**2  # 2 rows at T = 2048
    assert prefill_score_entries(s, groups=64) == 8192 * 2048  # 4 rows at T = 2048
    off = dataclasses.replace(s, prefill_batch_tokens=0)
    assert prefill_score_entries(off, groups=64) == 2048**2
    small = dataclasses.replace(s, prefill_batch_tokens=1024)  # batched only at T <= 512
    assert prefill_score_entries(small, groups=64) == 2048**2
    # The planner's sampler working set follows: more groups per replica, more memory.
    cfg = recipes.get("scalerl")
    unbatched = dataclasses.replace(
        cfg, sampler=dataclasses.replace(cfg.sampler, prefill_batch_tokens=0)
    )
    assert (
        plan.estimate.sampler_memory(cfg, 1, 1, 64).working
        > plan.estimate.sampler_memory(unbatched, 1, 1, 64).working
    )
