"""Device split, mesh shapes, logical-axis rules, distributed init from the environment."""

from types import SimpleNamespace

import jax
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from scalerl_jax import mesh as mesh_lib
from scalerl_jax.config import ConfigError, MeshConfig
from scalerl_jax.models import presets, transformer


def _fake_hosts(hosts, per_host):
    """Stand-ins for devices of a multi-host job (only .id and .process_index are read)."""
    return [
        SimpleNamespace(id=h * per_host + i, process_index=h)
        for h in range(hosts)
        for i in range(per_host)
    ]


@pytest.mark.fast
def test_split_devices_on_eight_local_devices():
    devices = jax.devices()
    split = mesh_lib.split_devices(MeshConfig(), devices)
    assert len(split.trainer) == 4 and len(split.sampler) == 4 and not split.colocated
    assert not set(split.trainer) & set(split.sampler)
    split = mesh_lib.split_devices(MeshConfig(trainer_devices_per_host=3), devices)
    assert [d.id for d in split.trainer] == [0, 1, 2]
    assert [d.id for d in split.sampler] == [3, 4, 5, 6, 7]
    split = mesh_lib.split_devices(MeshConfig(colocate=True), devices)
    assert split.colocated and split.trainer == split.sampler == tuple(devices)


def test_split_devices_across_two_fake_hosts():
    devices = _fake_hosts(2, 4)[::-1]  # order of the input must not matter
    split = mesh_lib.split_devices(MeshConfig(trainer_devices_per_host=1), devices)
    # the same number of trainer devices from every host; the sampler is this host's rest
    assert [(d.process_index, d.id) for d in split.trainer] == [(0, 0), (1, 4)]
    assert [d.id for d in split.sampler] == [1, 2, 3]
    split = mesh_lib.split_devices(MeshConfig(colocate=True), devices)
    assert len(split.trainer) == 8 and [d.id for d in split.sampler] == [0, 1, 2, 3]
    uneven = _fake_hosts(2, 4)[:-1]
    with pytest.raises(mesh_lib.MeshError, match=r"different device counts \{0: 4, 1: 3\}"):
        mesh_lib.split_devices(MeshConfig(), uneven)


def test_split_devices_errors_name_the_numbers():
    with pytest.raises(
        mesh_lib.MeshError,
        match=r"trainer_devices_per_host=8 must be in \[1, 7\] "
        r"with 8 local devices",
    ):
        mesh_lib.split_devices(MeshConfig(trainer_devices_per_host=8), jax.devices())
    with pytest.raises(mesh_lib.MeshError, match=r"1 local device\(s\).*colocate=True"):
        mesh_lib.split_devices(MeshConfig(), jax.devices()[:1])


def test_trainer_and_sampler_meshes():
    trainer, sampler = mesh_lib.build_meshes(MeshConfig(trainer_devices_per_host=4, tensor=2))
    assert dict(trainer.shape) == {"data": 1, "fsdp": 2, "tensor": 2}
    assert dict(sampler.shape) == {"data": 1, "tensor": 4}
    assert not set(trainer.devices.flat) & set(sampler.devices.flat)
    mesh = mesh_lib.sampler_mesh(MeshConfig(sampler_tensor=2), jax.devices()[:6])
    assert dict(mesh.shape) == {"data": 3, "tensor": 2}
    mesh = mesh_lib.trainer_mesh(MeshConfig(data=2, fsdp=-1, tensor=2), jax.devices())
    assert dict(mesh.shape) == {"data": 2, "fsdp": 2, "tensor": 2}


def test_mesh_divisibility_errors_name_the_numbers():
    with pytest.raises(
        mesh_lib.MeshError,
        match=r"8 devices are not divisible by the fixed axes "
        r".*'tensor': 3.*product 3",
    ):
        mesh_lib.trainer_mesh(MeshConfig(tensor=3), jax.devices())
    with pytest.raises(mesh_lib.MeshError, match=r"needs 4 devices but 8 are available"):
        mesh_lib.trainer_mesh(MeshConfig(data=2, fsdp=2, tensor=1), jax.devices())
    with pytest.raises(mesh_lib.MeshError, match=r"sampler mesh: 6 devices are not divisible.*4"):
        mesh_lib.sampler_mesh(MeshConfig(sampler_tensor=4), jax.devices()[:6])
    with pytest.raises(ConfigError, match=r"MeshConfig.data/fsdp/tensor=.*at most one axis"):
        MeshConfig(data=-1, fsdp=-1)
    with pytest.raises(ConfigError, match=r"MeshConfig.tensor=0"):
        MeshConfig(tensor=0)


@pytest.mark.fast
def test_logical_to_spec_follows_the_rules_and_replicates_what_does_not_divide():
    mesh = mesh_lib.trainer_mesh(MeshConfig(fsdp=2, tensor=4), jax.devices())
    assert mesh_lib.logical_to_spec(("embed", "mlp"), mesh) == P("fsdp", "tensor")
    assert mesh_lib.logical_to_spec(("batch", "seq"), mesh) == P("fsdp", None)  # data has size 1
    assert mesh_lib.logical_to_spec(
        ("embed", "kv_heads", "head_dim"), mesh, shape=(64, 2, 16)
    ) == P("fsdp", None, None)  # 2 % 4 != 0
    assert mesh_lib.logical_to_spec(
        ("embed", "kv_heads", "head_dim"), mesh, shape=(64, 8, 16)
    ) == P("fsdp", "tensor", None)
    # a mesh axis is used once: the second "tensor" dim stays replicated
    assert mesh_lib.logical_to_spec(("heads", "mlp"), mesh) == P("tensor", None)
    full = mesh_lib.trainer_mesh(MeshConfig(data=2, fsdp=2, tensor=2), jax.devices())
    assert mesh_lib.logical_to_spec(("batch", None), full) == P(("data", "fsdp"), None)
    with pytest.raises(KeyError, match=r"logical axis 'experts' has no entry"):
        mesh_lib.logical_to_spec(("experts",), mesh)
    sampler = mesh_lib.sampler_mesh(MeshConfig(), jax.devices()[:4])
    assert mesh_lib.logical_to_spec(("embed", "mlp"), sampler) == P(None, "tensor")  # no fsdp


def test_state_shardings_cover_every_param():
    cfg = presets.get("tiny-qwen2")
    mesh = mesh_lib.trainer_mesh(MeshConfig(fsdp=4, tensor=2), jax.devices())
    _, state = nnx.split(nnx.eval_shape(lambda: transformer.Transformer(cfg, nnx.Rngs(0))))
    specs = dict(nnx.to_flat_state(mesh_lib.state_specs(state, mesh)))
    assert specs[("embed",)] == P("tensor", "fsdp")
    # The layers are stacked along a leading, replicated "layers" axis.
    assert specs[("layers", 0, "attn", "o")] == P(None, "tensor", None, "fsdp")
    assert specs[("layers", 0, "attn", "q_bias")] == P(None, "tensor", None)
    assert specs[("final_norm", "scale")] == P(None)
    shardings = dict(nnx.to_flat_state(mesh_lib.state_shardings(state, mesh)))
    assert set(shardings) == set(specs) == {p for p, _ in nnx.to_flat_state(state)}
    assert mesh_lib.named(mesh, "batch", "seq").spec == P("fsdp", None)


def test_maybe_initialize_distributed_reads_the_environment():
    assert mesh_lib.maybe_initialize_distributed({}) is False
    with pytest.raises(mesh_lib.MeshError, match=r"SCALERL_NUM_PROCESSES.*SCALERL_PROCESS_ID"):
        mesh_lib.maybe_initialize_distributed({"SCALERL_COORDINATOR": "127.0.0.1:1234"})
