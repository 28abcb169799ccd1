"""Trainer mesh -> this host's sampler mesh, in multi-controller JAX.

A `device_put` from the trainer mesh (devices of every host) to a host-local sampler mesh raises
in multi-controller JAX: the two shardings do not have the same device set, and no process can
address the other hosts' shards. So the sync runs in two steps:

1. a jitted identity over the trainer devices re-lays the params out so that every host holds a
   complete copy: replicated across hosts, sharded over that host's own trainer devices (a
   `("hosts", "local")` view of the trainer mesh, same devices in the same order, which jit
   requires). The cross-host all-gathers happen here, inside one compiled program;
2. each host assembles its addressable shards into a host-local array and `device_put`s it onto
   its sampler mesh with exactly the sampler's shardings, so `Engine.generate` sees identical
   shapes, dtypes and shardings and does not recompile.

If the trainer mesh's device order interleaves hosts in a way no `(hosts, local)` reshape
captures, step 1 falls back to full replication on every trainer device (correct, more memory).
"""
from __future__ import annotations

import logging
from typing import Optional

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

log = logging.getLogger(__name__)


def host_view(trainer_mesh: Mesh) -> tuple[Mesh, Optional[Mesh]]:
    """(mesh over the trainer devices with axes ("hosts", "local") or ("local", "hosts") in the
    trainer mesh's own device order, this host's ("local",) mesh); the second is None when the
    order admits no such view (then sync replicates fully)."""
    devices = np.asarray(trainer_mesh.devices).reshape(-1)
    procs = np.array([d.process_index for d in devices])
    hosts = len(set(procs.tolist()))
    if len(devices) % hosts:
        raise ValueError(f"trainer mesh: {len(devices)} devices over {hosts} hosts is uneven")
    local = len(devices) // hosts
    me = jax.process_index()
    for shape, names, host_axis in (((hosts, local), ("hosts", "local"), 0),
                                    ((local, hosts), ("local", "hosts"), 1)):
        grid = procs.reshape(shape)
        lines = grid if host_axis == 0 else grid.T  # one line per host
        if all(len(set(line.tolist())) == 1 for line in lines) and \
                len({int(line[0]) for line in lines}) == hosts:
            dev_grid = devices.reshape(shape)
            mine = [i for i, line in enumerate(lines) if line[0] == me]
            if not mine:  # this process has no trainer devices
                return Mesh(dev_grid, names), None
            row = dev_grid[mine[0]] if host_axis == 0 else dev_grid[:, mine[0]]
            return Mesh(dev_grid, names), Mesh(np.asarray(row), ("local",))
    log.warning("trainer mesh device order interleaves hosts; weight sync will replicate the "
                "params on every trainer device")
    return Mesh(devices.reshape(1, -1), ("hosts", "local")), None


def _local_spec(x, local: int) -> PartitionSpec:
    """Shard one dimension over the host's trainer devices: preferably one the trainer already
    shards (less data moves), else the largest that `local` divides; else replicate."""
    if local <= 1:
        return PartitionSpec()
    spec = getattr(getattr(x, "sharding", None), "spec", ())
    sharded = [i for i, s in enumerate(spec) if s is not None]
    for i in sharded + sorted(range(x.ndim), key=lambda i: -x.shape[i]):
        if x.shape[i] % local == 0:
            return PartitionSpec(*([None] * i), "local")
    return PartitionSpec()


class WeightSync:
    """Callable: trainer-mesh params -> params on this host's sampler mesh.

    sampler_shardings: a tree matching params (e.g. `Engine.param_shardings`: one NamedSharding
    per nnx Variable) on this host's sampler mesh.
    """

    def __init__(self, trainer_mesh: Mesh, sampler_shardings):
        self.host_mesh, self.local_mesh = host_view(trainer_mesh)
        self._sampler_leaves = jax.tree.leaves(sampler_shardings)
        self._gather = None
        self._specs = None
        self._shapes = None

    def _build(self, leaves):
        local = self.local_mesh.size if self.local_mesh is not None else 1
        self._specs = [_local_spec(x, local) for x in leaves]
        out = [NamedSharding(self.host_mesh, s) for s in self._specs]
        self._gather = jax.jit(lambda xs: xs, out_shardings=out)

    def __call__(self, params):
        leaves, treedef = jax.tree.flatten(params)
        if len(leaves) != len(self._sampler_leaves):
            raise ValueError(f"params have {len(leaves)} arrays, sampler_shardings "
                             f"{len(self._sampler_leaves)}")
        if self._gather is None:
            self._build(leaves)
            self._shapes = [(x.shape, x.dtype) for x in leaves]
        elif [(x.shape, x.dtype) for x in leaves] != self._shapes:
            raise ValueError("params changed shape or dtype since the first sync: the sampler "
                             "would recompile; build a new WeightSync for a new model")
        gathered = self._gather(leaves)
        out = []
        for x, spec, target in zip(gathered, self._specs, self._sampler_leaves):
            shards = x.addressable_shards
            if self.local_mesh is not None:
                host_copy = jax.make_array_from_single_device_arrays(
                    x.shape, NamedSharding(self.local_mesh, spec), [s.data for s in shards])
            else:  # fully replicated fallback: any one local copy is complete
                host_copy = shards[0].data
            out.append(jax.device_put(host_copy, target))
        return jax.tree.unflatten(treedef, out)
