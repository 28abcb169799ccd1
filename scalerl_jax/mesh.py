"""Device split, mesh construction and the one logical-axis rules table.

Every host runs the same program. Each host splits its local devices into trainer devices and
sampler devices. The trainer mesh spans the trainer devices of all hosts; each host's sampler
devices form a host-local sampler mesh (an independent replica). Parameters carry logical axis
names (`embed`, `mlp`, ...); `RULES` maps them to mesh axes, the same table for both meshes: a mesh
axis that a mesh does not have (the sampler mesh has no `fsdp`) is simply not used there.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Optional, Sequence

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from scalerl_jax.config import MeshConfig
from scalerl_jax.errors import UserError

log = logging.getLogger(__name__)

# `expert` shards the MoE experts (expert parallelism); for every other weight it acts as one
# more data axis (rows split over it, weights replicated), as usual for expert parallelism.
# A trainer mesh has it only when MeshConfig.expert > 1, so dense meshes keep their three axes.
TRAINER_AXES = ("data", "expert", "fsdp", "tensor")
SAMPLER_AXES = ("data", "tensor")

# Logical axis -> mesh axis (or tuple of axes, or None). The single source of truth.
RULES: dict[str, Optional[str | tuple[str, ...]]] = {
    "layers": None,  # the stacked layers' leading axis (models/transformer.py): scanned over
    "batch": ("data", "expert", "fsdp"),
    "vocab": "tensor",
    "embed": "fsdp",
    "mlp": "tensor",
    "heads": "tensor",
    "kv_heads": "tensor",
    "expert": "expert",  # the leading axis of MoE expert weights (models/moe.py)
    "router": None,  # the router's expert-score axis: small, replicated
    "head_dim": None,
    "norm": None,
    "seq": None,
    "cache_seq": None,
    "cache_batch": "data",  # sampler decode slots
}


class MeshError(UserError, ValueError):
    """Device counts or mesh shapes do not fit. The message names the numbers."""


def maybe_initialize_distributed(env=None) -> bool:
    """Initialise multi-controller JAX when the environment describes a multi-process job.

    Recognised: `SCALERL_COORDINATOR` (host:port) with `SCALERL_NUM_PROCESSES` and
    `SCALERL_PROCESS_ID`; or `SCALERL_DISTRIBUTED=auto` on TPU pods, where JAX discovers peers
    itself. Returns True when `jax.distributed.initialize` was called.
    """
    env = os.environ if env is None else env
    if env.get("SCALERL_COORDINATOR"):
        missing = [k for k in ("SCALERL_NUM_PROCESSES", "SCALERL_PROCESS_ID") if k not in env]
        if missing:
            raise MeshError(f"SCALERL_COORDINATOR is set but {missing} are not")
        # Only the CPU backend reads this; on CPU hosts gloo is what runs cross-process
        # collectives (there is no ICI/NCCL), as in local multi-process tests.
        jax.config.update(
            "jax_cpu_collectives_implementation", env.get("SCALERL_CPU_COLLECTIVES", "gloo")
        )
        jax.distributed.initialize(
            coordinator_address=env["SCALERL_COORDINATOR"],
            num_processes=int(env["SCALERL_NUM_PROCESSES"]),
            process_id=int(env["SCALERL_PROCESS_ID"]),
        )
        return True
    if env.get("SCALERL_DISTRIBUTED") == "auto":
        jax.distributed.initialize()
        return True
    return False


@dataclasses.dataclass(frozen=True)
class DeviceSplit:
    trainer: tuple  # trainer devices of ALL hosts, grouped by host
    sampler: tuple  # this host's sampler devices
    colocated: bool


def split_devices(cfg: MeshConfig, devices: Optional[Sequence] = None) -> DeviceSplit:
    """Split each host's local devices into trainer and sampler devices.

    `devices` defaults to `jax.devices()` (all hosts). The same number of trainer devices is
    taken from every host, the lowest device ids first, so the trainer mesh is regular.
    """
    devices = list(jax.devices() if devices is None else devices)
    by_host: dict[int, list] = {}
    for d in sorted(devices, key=lambda d: (d.process_index, d.id)):
        by_host.setdefault(d.process_index, []).append(d)
    counts = {h: len(ds) for h, ds in by_host.items()}
    if len(set(counts.values())) != 1:
        raise MeshError(f"hosts have different device counts {counts}; cannot build a regular mesh")
    n_local = next(iter(counts.values()))
    me = jax.process_index() if jax.process_index() in by_host else min(by_host)
    if cfg.colocate:
        return DeviceSplit(
            tuple(d for h in sorted(by_host) for d in by_host[h]), tuple(by_host[me]), True
        )
    n_train = cfg.trainer_devices_per_host
    if n_train is None:
        n_train = (n_local + 1) // 2
    if n_local < 2:
        raise MeshError(
            f"{n_local} local device(s): a separate sampler needs >= 2 per host; "
            "set MeshConfig.colocate=True to share one device"
        )
    if not 0 < n_train < n_local:
        raise MeshError(
            f"trainer_devices_per_host={n_train} must be in [1, {n_local - 1}] with "
            f"{n_local} local devices (the rest are sampler devices)"
        )
    trainer = tuple(d for h in sorted(by_host) for d in by_host[h][:n_train])
    return DeviceSplit(trainer, tuple(by_host[me][n_train:]), False)


def _resolve_shape(sizes: dict[str, int], n: int, what: str) -> tuple[int, ...]:
    known = int(np.prod([v for v in sizes.values() if v != -1]))
    fill = [k for k, v in sizes.items() if v == -1]
    if fill:
        if n % known:
            raise MeshError(
                f"{what}: {n} devices are not divisible by the fixed axes {sizes} (product {known})"
            )
        sizes = {**sizes, fill[0]: n // known}
    total = int(np.prod(list(sizes.values())))
    if total != n:
        raise MeshError(f"{what}: mesh {sizes} needs {total} devices but {n} are available")
    return tuple(sizes.values())


def _device_array(devices: Sequence, shape: tuple[int, ...]) -> np.ndarray:
    # create_device_mesh knows physical TPU topologies; it refuses some subsets (e.g. a
    # sampler slice of a host), where plain order is as good as any.
    try:
        from jax.experimental import mesh_utils

        return mesh_utils.create_device_mesh(shape, devices=list(devices))
    except Exception:  # noqa: BLE001 - any refusal means "no topology-aware layout"
        return np.array(list(devices), dtype=object).reshape(shape)


def trainer_mesh(cfg: MeshConfig, devices: Sequence) -> Mesh:
    sizes = {"data": cfg.data, "expert": cfg.expert, "fsdp": cfg.fsdp, "tensor": cfg.tensor}
    if cfg.expert == 1:
        del sizes["expert"]
    shape = _resolve_shape(sizes, len(devices), "trainer mesh")
    return Mesh(_device_array(devices, shape), tuple(sizes))


def sampler_mesh(cfg: MeshConfig, devices: Sequence) -> Mesh:
    n = len(devices)
    tensor = n if cfg.sampler_tensor == -1 else cfg.sampler_tensor
    shape = _resolve_shape({"data": -1, "tensor": tensor}, n, "sampler mesh")
    return Mesh(_device_array(devices, shape), SAMPLER_AXES)


def build_meshes(cfg: MeshConfig, devices: Optional[Sequence] = None) -> tuple[Mesh, Mesh]:
    """(trainer mesh over all hosts, this host's sampler mesh)."""
    split = split_devices(cfg, devices)
    return trainer_mesh(cfg, split.trainer), sampler_mesh(cfg, split.sampler)


def logical_to_spec(
    logical_axes: Sequence[Optional[str]], mesh: Mesh, shape: Optional[Sequence[int]] = None
) -> PartitionSpec:
    """PartitionSpec for one array from its logical axis names, through `RULES`.

    Mesh axes the mesh lacks or of size 1 are dropped. When `shape` is given, a dimension that
    the mesh axes do not divide is replicated instead (e.g. 2 KV heads over tensor=4), since
    that is always correct and only costs memory; each mesh axis is used at most once.
    """
    used: set[str] = set()
    spec = []
    for i, name in enumerate(logical_axes):
        target = RULES.get(name) if name is not None else None
        if name is not None and name not in RULES:
            raise KeyError(f"logical axis {name!r} has no entry in mesh.RULES")  # a bug
        axes = (target,) if isinstance(target, str) else tuple(target or ())
        axes = tuple(a for a in axes if a in mesh.shape and mesh.shape[a] > 1 and a not in used)
        if shape is not None and axes:
            size = int(np.prod([mesh.shape[a] for a in axes]))
            if shape[i] % size:
                log.info(
                    "replicating dim %d (%s, size %d): not divisible by %s=%d",
                    i,
                    name,
                    shape[i],
                    axes,
                    size,
                )
                axes = ()
        used.update(axes)
        spec.append(axes[0] if len(axes) == 1 else (axes or None))
    return PartitionSpec(*spec)


def _is_var(x) -> bool:
    return isinstance(x, nnx.Variable)


def state_specs(state, mesh: Mesh):
    """PartitionSpec tree for an nnx.State whose Variables carry `logical_axes` metadata."""

    def spec(v):
        axes = v.get_metadata().get("logical_axes") if _is_var(v) else None
        if axes is None:  # plain leaves and untagged variables are replicated
            return PartitionSpec()
        return logical_to_spec(axes, mesh, getattr(v.get_value(), "shape", None))

    return jax.tree.map(spec, state, is_leaf=_is_var)


def state_shardings(state, mesh: Mesh):
    return jax.tree.map(
        lambda s: NamedSharding(mesh, s),
        state_specs(state, mesh),
        is_leaf=lambda x: isinstance(x, PartitionSpec),
    )


def named(mesh: Mesh, *logical_axes: Optional[str], shape=None) -> NamedSharding:
    """NamedSharding for an activation / batch array from logical names."""
    return NamedSharding(mesh, logical_to_spec(logical_axes, mesh, shape))
