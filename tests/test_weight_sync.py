"""Weight sync: trainer mesh -> sampler mesh, single process and 2 processes x 4 CPU devices."""
import os
import pathlib
import socket
import subprocess
import sys
import time

import jax
import numpy as np

from scalerl_jax import mesh as mesh_lib
from scalerl_jax.config import MeshConfig, SamplerConfig
from scalerl_jax.models import presets
from scalerl_jax.sampler import Engine, WeightSync, count_compilations

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_single_process_trainer_fsdp4_to_sampler_mesh_without_recompiling():
    split = mesh_lib.split_devices(MeshConfig(trainer_devices_per_host=4))
    trainer = mesh_lib.trainer_mesh(MeshConfig(fsdp=-1), split.trainer)
    sampler = mesh_lib.sampler_mesh(MeshConfig(sampler_tensor=2), split.sampler)
    assert not set(trainer.devices.flat) & set(sampler.devices.flat)
    engine = Engine(presets.get("tiny-llama"), sampler,
                    SamplerConfig(max_concurrent_decodes=2, max_prefill_length=8,
                                  max_target_length=16, interruptions=False))
    rng = np.random.default_rng(0)
    host = jax.tree.map(lambda a: rng.normal(0, 0.05, a.shape).astype(a.dtype),
                        engine.abstract_params)
    v1 = jax.device_put(host, mesh_lib.state_shardings(engine.abstract_params, trainer))
    v2 = jax.tree.map(lambda x: x * 1.5, v1)
    assert any(x.sharding.spec != () for x in jax.tree.leaves(v1))  # really fsdp-sharded

    sync = WeightSync(trainer, engine.param_shardings)
    p1 = sync(v1)
    for got, want, target in zip(jax.tree.leaves(p1), jax.tree.leaves(host),
                                 jax.tree.leaves(engine.param_shardings)):
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
    np.testing.assert_allclose(np.asarray(jax.tree.leaves(p2)[0]), 1.5 * jax.tree.leaves(host)[0],
                               rtol=1e-6)
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
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4",
               JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT))
    port = str(_free_port())
    logs = [open(tmp_path / f"worker{i}.log", "w+") for i in range(2)]  # pipes could fill up
    procs = [subprocess.Popen([sys.executable, str(ROOT / "tests" / "_weight_sync_worker.py"),
                               port, str(i)], env=env, cwd=ROOT, stdout=logs[i],
                              stderr=subprocess.STDOUT, text=True) for i in range(2)]
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
