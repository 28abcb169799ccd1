"""One process of the 2-process weight-sync test (run by tests/test_weight_sync.py).

argv: coordinator port, process id. Each process has 4 CPU devices: 2 trainer + 2 sampler. The
trainer mesh (fsdp=4) spans both processes; each process's sampler mesh is its own 2 devices.
bf16 compute: fp32 masters arrive as bf16 (norms and the LM head fp32), in groups of at most
16 KiB, every process running the same groups in the same order.
Prints "OK <process id>" when every check passed.
"""

import sys

import jax
import numpy as np

jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(
    coordinator_address=f"127.0.0.1:{sys.argv[1]}", num_processes=2, process_id=int(sys.argv[2])
)

from scalerl_jax import mesh as mesh_lib  # noqa: E402
from scalerl_jax.config import MeshConfig, SamplerConfig  # noqa: E402
from scalerl_jax.models import presets  # noqa: E402
from scalerl_jax.sampler import Engine, WeightSync, count_compilations  # noqa: E402


def main():
    assert jax.process_count() == 2 and jax.local_device_count() == 4, jax.devices()
    split = mesh_lib.split_devices(MeshConfig(trainer_devices_per_host=2))
    trainer = mesh_lib.trainer_mesh(MeshConfig(fsdp=-1), split.trainer)
    sampler = mesh_lib.sampler_mesh(MeshConfig(), split.sampler)
    assert trainer.shape["fsdp"] == 4 and {d.process_index for d in trainer.devices.flat} == {0, 1}
    assert {d.process_index for d in sampler.devices.flat} == {jax.process_index()}

    cfg = presets.get("tiny-llama", compute_dtype="bfloat16")
    engine = Engine(
        cfg,
        sampler,
        SamplerConfig(
            max_concurrent_decodes=2,
            max_prefill_length=8,
            max_target_length=16,
            interruptions=False,
            weight_sync_group_mib=1,
        ),
    )
    rng = np.random.default_rng(0)  # same values in both processes: the "trainer's" weights
    host = jax.tree.map(
        lambda a: rng.normal(size=a.shape).astype(np.float32), engine.abstract_params
    )
    shardings = mesh_lib.state_shardings(engine.abstract_params, trainer)
    sharded_over_hosts = 0

    def to_trainer(x, sh):
        nonlocal sharded_over_hosts
        arr = jax.make_array_from_callback(x.shape, sh, lambda idx: x[idx])
        sharded_over_hosts += not arr.is_fully_addressable and not arr.is_fully_replicated
        return arr

    leaves, treedef = jax.tree.flatten(host)
    params = treedef.unflatten(map(to_trainer, leaves, jax.tree.leaves(shardings)))
    assert sharded_over_hosts > 0  # no process holds these params whole before the sync

    sync = WeightSync.for_engine(trainer, engine)
    sync.group_bytes = 16 << 10  # tiny-llama's arrays are 16-64 KiB in bf16: many groups
    checksum = jax.jit(lambda p: sum(x.sum() for x in jax.tree.leaves(p)))
    doubled = jax.tree.map(lambda x: x * 2, params)  # the trainer's next version
    out = sync(params)
    first = float(checksum(out))
    with count_compilations() as compiles:  # a second sync reuses every compiled program
        second = float(checksum(sync(doubled)))
    assert compiles == [], compiles
    assert np.isclose(second, 2 * first, rtol=1e-5), (first, second)
    assert len(sync.groups) > 4 and sync.largest_group_bytes <= 64 << 10, sync.groups
    for got, want, target, dt in zip(
        jax.tree.leaves(out),
        jax.tree.leaves(host),
        jax.tree.leaves(engine.param_shardings),
        jax.tree.leaves(engine.param_dtypes),
    ):
        assert got.is_fully_addressable and got.sharding == target, (got.sharding, target)
        assert got.dtype == dt
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want.astype(dt)))
    print("OK", jax.process_index(), flush=True)


if __name__ == "__main__":
    main()
