"""Weight sync: trainer mesh -> sampler mesh, single process and 2 processes x 4 CPU devices."""

import dataclasses
import math
import os
import pathlib
import socket
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from scalerl_jax import mesh as mesh_lib
from scalerl_jax.config import MeshConfig, SamplerConfig
from scalerl_jax.models import presets
from scalerl_jax.sampler import Engine, WeightSync, count_compilations
from scalerl_jax.sampler.weight_sync import Piece, split

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.fast
def test_single_process_trainer_fsdp4_to_sampler_mesh_without_recompiling():
    split = mesh_lib.split_devices(MeshConfig(trainer_devices_per_host=4))
    trainer = mesh_lib.trainer_mesh(MeshConfig(fsdp=-1), split.trainer)
    sampler = mesh_lib.sampler_mesh(MeshConfig(sampler_tensor=2), split.sampler)
    assert not set(trainer.devices.flat) & set(sampler.devices.flat)
    engine = Engine(
        presets.get("tiny-llama"),
        sampler,
        SamplerConfig(
            max_concurrent_decodes=2,
            max_prefill_length=8,
            max_target_length=16,
            interruptions=False,
        ),
    )
    rng = np.random.default_rng(0)
    host = jax.tree.map(
        lambda a: rng.normal(0, 0.05, a.shape).astype(a.dtype), engine.abstract_params
    )
    v1 = jax.device_put(host, mesh_lib.state_shardings(engine.abstract_params, trainer))
    v2 = jax.tree.map(lambda x: x * 1.5, v1)
    assert any(x.sharding.spec != () for x in jax.tree.leaves(v1))  # really fsdp-sharded

    sync = WeightSync(trainer, engine.param_shardings)
    p1 = sync(v1)
    for got, want, target in zip(
        jax.tree.leaves(p1), jax.tree.leaves(host), jax.tree.leaves(engine.param_shardings)
    ):
        assert got.sharding == target
        np.testing.assert_array_equal(np.asarray(got), want)

    prefix = engine.prefill(p1, np.array([1, 2, 3, 4, 0, 0, 0, 0], np.int32), 4)
    state = engine.bulk_insert(prefix, engine.init_decode_state(), [0, 1])
    state, r1 = engine.generate(p1, state)
    with count_compilations() as compiles:
        p2 = sync(v2)
        state, r2 = engine.generate(p2, state)
        r2 = jax.device_get(r2)
    assert compiles == [] and engine.traces["generate"] == 1
    np.testing.assert_allclose(
        np.asarray(jax.tree.leaves(p2)[0]), 1.5 * jax.tree.leaves(host)[0], rtol=1e-6
    )
    assert r2.valid.all()


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _read(f):
    f.seek(0)
    text = f.read()
    f.close()
    return text


def test_two_processes_four_cpu_devices_each(tmp_path):
    env = dict(
        os.environ,
        XLA_FLAGS="--xla_force_host_platform_device_count=4",
        JAX_PLATFORMS="cpu",
        PYTHONPATH=str(ROOT),
    )
    port = str(_free_port())
    logs = [open(tmp_path / f"worker{i}.log", "w+") for i in range(2)]  # pipes could fill up
    procs = [
        subprocess.Popen(
            [sys.executable, str(ROOT / "tests" / "_weight_sync_worker.py"), port, str(i)],
            env=env,
            cwd=ROOT,
            stdout=logs[i],
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(2)
    ]
    # One deadline for both; a process that fails makes its peer hang in a collective, so stop
    # waiting as soon as either exits non-zero.
    deadline = time.monotonic() + 150
    try:
        while time.monotonic() < deadline and any(p.poll() is None for p in procs):
            if any(p.poll() not in (None, 0) for p in procs):
                break
            time.sleep(0.2)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        outputs = [_read(f) for f in logs]
    for i, (p, out) in enumerate(zip(procs, outputs)):
        assert p.returncode == 0 and f"OK {i}" in out, f"process {i} failed:\n{out[-4000:]}"


# ------------------------------------------------------ sampler dtypes and bounded groups
def _trainer_params(cfg, trainer, seed=0):
    """fp32 master weights as the trainer holds them, fsdp-sharded on `trainer`; norm scales
    near 1 so the forward is well-conditioned."""
    engine = Engine(
        cfg,
        trainer,
        SamplerConfig(
            max_concurrent_decodes=2,
            max_prefill_length=8,
            max_target_length=16,
            interruptions=False,
            weight_dtype="param",
        ),
    )
    rng = np.random.default_rng(seed)
    host = jax.tree.map_with_path(
        lambda p, a: rng.normal(
            1.0 if "scale" in jax.tree_util.keystr(p) else 0.0, 0.1, a.shape
        ).astype(a.dtype),
        engine.abstract_params,
    )
    return host, jax.device_put(host, mesh_lib.state_shardings(engine.abstract_params, trainer))


def _sample(engine, params, steps=6):
    prefix = engine.prefill(params, np.array([3, 1, 4, 1, 5, 9, 0, 0], np.int32), 6)
    state = engine.bulk_insert(
        prefix, engine.init_decode_state(), [0, 1], keys=np.array([[0, 1], [0, 2]], np.uint32)
    )
    out = []
    for _ in range(steps):
        state, res = engine.generate(params, state)
        out.append(jax.device_get(res))
    return (np.concatenate([r.tokens for r in out]), np.concatenate([r.logprobs for r in out]))


@pytest.mark.parametrize("name", ["tiny-qwen3-moe", "tiny-qwen2"])
def test_compute_weight_dtype_samples_bit_identically_in_half_the_memory(name):
    """Weights stored in the dtype the bf16 forward casts them to: the same tokens and log-probs
    bit for bit as fp32 storage; norms, the router and the fp32 LM head (tied: the embedding)
    stay fp32, everything else is bf16."""
    cfg = presets.get(name, compute_dtype="bfloat16")
    devices = jax.devices()
    sampler = mesh_lib.sampler_mesh(MeshConfig(sampler_tensor=2), devices[:2])
    trainer = mesh_lib.trainer_mesh(MeshConfig(fsdp=-1), devices[4:8])
    sc = SamplerConfig(
        max_concurrent_decodes=2,
        max_prefill_length=8,
        max_target_length=16,
        interruptions=False,
        temperature=1.0,
    )
    _, master = _trainer_params(cfg, trainer)
    by_param = Engine(cfg, sampler, dataclasses.replace(sc, weight_dtype="param"))
    by_compute = Engine(cfg, sampler, sc)  # the default
    p_param, p_compute = by_param.load_params(master), by_compute.load_params(master)
    tokens_a, lp_a = _sample(by_param, p_param)
    tokens_b, lp_b = _sample(by_compute, p_compute)
    np.testing.assert_array_equal(tokens_a, tokens_b)
    np.testing.assert_array_equal(lp_a, lp_b)  # bit-equal, not close

    kept = {"scale", "router", "lm_head"} | ({"embed"} if cfg.tie_embeddings else set())
    fp32 = bf16 = 0
    for path, x in jax.tree.leaves_with_path(p_compute):
        names = {getattr(k, "key", None) for k in path}
        want = np.float32 if names & kept else jnp.bfloat16
        assert x.dtype == want, (jax.tree_util.keystr(path), x.dtype)
        fp32, bf16 = (
            fp32 + (x.nbytes if want == np.float32 else 0),
            bf16 + (x.nbytes if want != np.float32 else 0),
        )
    total = sum(x.nbytes for x in jax.tree.leaves(p_param))
    assert fp32 + 2 * bf16 == total and fp32 + bf16 < 0.6 * total


def _fsdp4_trainer_and_small_engine(cfg):
    """A trainer mesh (fsdp 4) on devices 0-3 and a small engine (tensor 2) on devices 4-7."""
    devices = jax.devices()
    trainer = mesh_lib.trainer_mesh(MeshConfig(fsdp=-1), devices[:4])
    sampler = mesh_lib.sampler_mesh(MeshConfig(sampler_tensor=2), devices[4:8])
    config = SamplerConfig(
        max_concurrent_decodes=2, max_prefill_length=8, max_target_length=16, interruptions=False
    )
    return trainer, Engine(cfg, sampler, config)


def test_grouped_sync_equals_one_group_and_bounds_a_trainer_chips_copy():
    """Groups of at most `group_bytes` (in the sampler's bf16): the same sampler params as one
    whole-model gather, while a trainer chip never holds more than one group; the whole-model
    gather holds the model / 4 on each of the 4 trainer chips."""
    cfg = presets.get("tiny-qwen3-moe", compute_dtype="bfloat16")
    trainer, engine = _fsdp4_trainer_and_small_engine(cfg)
    host, master = _trainer_params(cfg, trainer)
    sizes = [
        x.size * np.dtype(d).itemsize
        for x, d in zip(jax.tree.leaves(host), jax.tree.leaves(engine.param_dtypes))
    ]
    budget = max(sizes)  # every group is then at most the largest array
    whole = WeightSync(trainer, engine.param_shardings, engine.param_dtypes)
    grouped = WeightSync(trainer, engine.param_shardings, engine.param_dtypes, budget)
    a, b = whole(master), grouped(master)
    for x, y, target in zip(
        jax.tree.leaves(a), jax.tree.leaves(b), jax.tree.leaves(engine.param_shardings)
    ):
        assert y.sharding == target and y.dtype == x.dtype
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    assert len(whole.groups) == 1 and len(grouped.groups) > 4
    assert all(n <= budget for n in grouped.group_sizes)  # no array exceeds it: none is cut
    assert grouped.write_programs(master) == [] and whole.write_programs(master) == []
    assert sum(grouped.group_sizes) == sum(sizes)
    # Measured on the trainer devices: a group's shards, not the model's.
    assert grouped.largest_group_bytes <= budget
    assert whole.largest_group_bytes >= sum(sizes) // 4 > budget
    # The cast precedes the gather: fp32 transfers would be twice the bytes.
    fp32 = WeightSync(trainer, engine.param_shardings, None, None)
    fp32(master)
    assert whole.largest_group_bytes < 0.6 * fp32.largest_group_bytes
    with pytest.raises(ValueError, match="group_bytes=0"):
        WeightSync(trainer, engine.param_shardings, group_bytes=0)


def test_split_cuts_only_what_exceeds_the_bound_along_a_free_leading_axis():
    # 100 bytes over 10 rows with a 25-byte bound: slices of 2 rows; 30 bytes that may not be
    # cut (length 0) stay whole; 70 over 7 rows with a 40-byte bound: 4 rows at 0 and at 3.
    pieces, sizes = split([100, 30, 8], [10, 0, 4], 25)
    assert [(p.leaf, p.start, p.rows) for p in pieces] == [
        *[(0, s, 2) for s in (0, 2, 4, 6, 8)],
        (1, 0, None),
        (2, 0, None),
    ]
    assert sizes == [20] * 5 + [30, 8]
    pieces, sizes = split([70], [7], 40)
    assert [(p.start, p.rows) for p in pieces] == [(0, 4), (3, 4)] and sizes == [40, 40]
    assert split([70], [7], None)[0] == [Piece(0)]


def test_a_stacked_weight_larger_than_the_bound_arrives_exactly_in_bounded_slices():
    """A weight stacked over 7 layers (the MLP's, 112 KiB in bf16) with a 64 KiB bound: cut
    along its layer axis into slices of 4 layers (the second overlapping the first by one),
    every group within the bound on the wire and on a trainer chip, and the sampler's copy
    bit-equal to the trainer's weights in the sampler's dtypes; a second sync compiles
    nothing. The slice writes compiled ahead of time from abstract params (one per cut
    weight's shape, the sampler's copy donated: aliased) are the very programs the sync runs:
    it compiles no other."""
    cfg = presets.get("tiny-llama", compute_dtype="bfloat16", num_layers=7)
    trainer, engine = _fsdp4_trainer_and_small_engine(cfg)
    host, master = _trainer_params(cfg, trainer)
    dtypes = jax.tree.leaves(engine.param_dtypes)
    sizes = [x.size * np.dtype(d).itemsize for x, d in zip(jax.tree.leaves(host), dtypes)]
    budget = 64 << 10
    stacked = [i for i, x in enumerate(jax.tree.leaves(host)) if x.shape[:1] == (7,)]
    assert max(sizes) > budget and sizes.index(max(sizes)) in stacked
    sync = WeightSync(trainer, engine.param_shardings, engine.param_dtypes, budget)
    abstract = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), master
    )
    writes = sync.write_programs(abstract)
    cut_shapes = {x.shape for x, n in zip(jax.tree.leaves(host), sizes) if n > budget}
    assert sorted(args[0].shape for _, args in writes) == sorted(cut_shapes)
    for fn, (buf, piece, start) in writes:
        assert piece.shape == (4, *buf.shape[1:]) and buf.sharding == piece.sharding
        mem = fn.lower(buf, piece, start).compile().memory_analysis()
        copy = math.prod(buf.sharding.shard_shape(buf.shape)) * buf.dtype.itemsize
        assert mem.alias_size_in_bytes == mem.output_size_in_bytes == copy > 0
        assert mem.argument_size_in_bytes > copy and mem.temp_size_in_bytes <= copy
    with count_compilations() as compiles:
        out = sync(master)
    assert "jit(cast)" in compiles and "jit(write_slice)" not in compiles
    for got, want, target, dt in zip(
        jax.tree.leaves(out), jax.tree.leaves(host), jax.tree.leaves(engine.param_shardings), dtypes
    ):
        assert got.sharding == target and got.dtype == dt
        np.testing.assert_array_equal(np.asarray(got), want.astype(dt))
    cut = [p for g in sync.groups for p in g if p.rows is not None]
    assert {p.leaf for p in cut} == {i for i in stacked if sizes[i] > budget}
    assert {(p.start, p.rows) for p in cut} == {(0, 4), (3, 4)}
    assert max(sync.group_sizes) <= budget and sync.largest_group_bytes <= budget
    doubled = jax.tree.map(lambda x: x * 2, master)
    with count_compilations() as compiles:
        again = sync(doubled)
    assert compiles == []
    for got, want, dt in zip(jax.tree.leaves(again), jax.tree.leaves(host), dtypes):
        np.testing.assert_array_equal(np.asarray(got), (2 * want).astype(dt))


@pytest.mark.fast
def test_sampler_weight_fields_are_validated():
    from scalerl_jax.config import ConfigError

    with pytest.raises(ConfigError, match=r"SamplerConfig.weight_dtype='fp8': must be one of"):
        SamplerConfig(weight_dtype="fp8")
    with pytest.raises(ConfigError, match=r"SamplerConfig.weight_sync_group_mib=0: must be > 0"):
        SamplerConfig(weight_sync_group_mib=0)
