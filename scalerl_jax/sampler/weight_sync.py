"""Trainer mesh -> this host's sampler mesh, in multi-controller JAX, one bounded group at a time.

A `device_put` from the trainer mesh (devices of every host) to a host-local sampler mesh raises
in multi-controller JAX: the two shardings do not have the same device set, and no process can
address the other hosts' shards. So the sync runs in two steps, per group of parameters:

1. a jitted cast-and-identity over the trainer devices casts the group to the sampler's dtypes
   (`sampler_dtypes`: bf16 for weights the forward uses in bf16) and re-lays it out so that
   every host holds a complete copy: replicated across hosts, sharded over that host's own
   trainer devices (a `("hosts", "local")` view of the trainer mesh, same devices in the same
   order, which jit requires). The cross-host all-gathers happen here, inside one program;
2. each host assembles its addressable shards into a host-local array and `device_put`s it onto
   its sampler mesh with exactly the sampler's shardings, so `Engine.generate` sees identical
   shapes, dtypes and shardings and does not recompile.

Groups: consecutive parameters (a layer's arrays are adjacent in the tree) whose sampler-dtype
bytes add up to at most `group_bytes`; an array larger than that is a group of its own. Each
group's transfer completes before the next group is gathered, so a trainer chip holds at most
one gathered group (its bytes / trainer chips per host), not a copy of the model: what the plan
counts as the weight-sync memory (plan/estimate.py). The cast comes before the gather, so the
gather moves half the bytes of fp32 masters.

If the trainer mesh's device order interleaves hosts in a way no `(hosts, local)` reshape
captures, step 1 falls back to full replication on every trainer device (correct, more memory).
"""

from __future__ import annotations

import logging
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

log = logging.getLogger(__name__)

WEIGHT_DTYPES = ("compute", "param")


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
    for shape, names, host_axis in (
        ((hosts, local), ("hosts", "local"), 0),
        ((local, hosts), ("local", "hosts"), 1),
    ):
        grid = procs.reshape(shape)
        lines = grid if host_axis == 0 else grid.T  # one line per host
        if (
            all(len(set(line.tolist())) == 1 for line in lines)
            and len({int(line[0]) for line in lines}) == hosts
        ):
            dev_grid = devices.reshape(shape)
            mine = [i for i, line in enumerate(lines) if line[0] == me]
            if not mine:  # this process has no trainer devices
                return Mesh(dev_grid, names), None
            row = dev_grid[mine[0]] if host_axis == 0 else dev_grid[:, mine[0]]
            return Mesh(dev_grid, names), Mesh(np.asarray(row), ("local",))
    log.warning(
        "trainer mesh device order interleaves hosts; weight sync will replicate the "
        "params on every trainer device"
    )
    return Mesh(devices.reshape(1, -1), ("hosts", "local")), None


# ------------------------------------------------------------------------ sampler dtypes
def use_dtype(path_names: tuple, model_cfg) -> np.dtype:
    """The dtype the forward pass casts a parameter to (models/layers.py, moe.py,
    transformer.py): fp32 for RMSNorm scales (`scale`), the router and an fp32 LM head
    (`lm_head`, or the tied `embed` when `fp32_head`); the compute dtype for everything else."""
    f32 = np.dtype(np.float32)
    if "scale" in path_names or "router" in path_names:
        return f32
    if model_cfg.fp32_head and (
        "lm_head" in path_names or (model_cfg.tie_embeddings and "embed" in path_names)
    ):
        return f32
    return np.dtype(jnp.dtype(model_cfg.compute_dtype))


def sampler_dtypes(model_cfg, abstract_params, weight_dtype: str = "compute"):
    """Tree (like `abstract_params`) of the dtype the sampler stores each parameter in.

    "param": the trainer's `param_dtype`. "compute": the narrower of `param_dtype` and the
    dtype the forward casts the parameter to (`use_dtype`). Casting fp32 -> bf16 once here
    instead of at every use gives the very same bf16 operands, so sampling is bit-identical,
    and a bf16 value widened to fp32 at use is exact, so bf16 params are never widened."""
    if weight_dtype not in WEIGHT_DTYPES:
        raise ValueError(f"weight_dtype={weight_dtype!r}: must be one of {WEIGHT_DTYPES}")
    param = np.dtype(jnp.dtype(model_cfg.param_dtype))

    def pick(path, x):
        if weight_dtype == "param":
            return param
        names = tuple(getattr(k, "key", getattr(k, "name", None)) for k in path)
        use = use_dtype(names, model_cfg)
        return use if use.itemsize < param.itemsize else param

    return jax.tree.map_with_path(pick, abstract_params)


def with_dtypes(abstract_params, dtypes):
    """`abstract_params` (ShapeDtypeStruct leaves) with the dtypes of the tree `dtypes`."""
    return jax.tree.map(lambda x, dt: jax.ShapeDtypeStruct(x.shape, dt), abstract_params, dtypes)


# ----------------------------------------------------------------------------- the sync
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


def make_groups(sizes: list, budget: Optional[int]) -> list[list[int]]:
    """Consecutive indices whose sizes add up to at most `budget` (None: one group); an item
    larger than the budget is a group of its own."""
    groups: list[list[int]] = []
    total = 0
    for i, n in enumerate(sizes):
        if not groups or (budget is not None and total + n > budget):
            groups.append([])
            total = 0
        groups[-1].append(i)
        total += n
    return groups


class WeightSync:
    """Callable: trainer-mesh params -> params on this host's sampler mesh.

    sampler_shardings: a tree matching params (e.g. `Engine.param_shardings`: one NamedSharding
    per nnx Variable) on this host's sampler mesh. dtypes: a matching tree of the sampler's
    dtypes (`Engine.param_dtypes`); None keeps the trainer's. group_bytes: bound on one group's
    bytes in the sampler's dtypes (None: the whole model in one group).

    After each call `largest_group_bytes` is the most bytes one trainer device held for one
    gathered group (measured from the gathered arrays' shards) and `groups` the index groups.
    """

    def __init__(
        self, trainer_mesh: Mesh, sampler_shardings, dtypes=None, group_bytes: Optional[int] = None
    ):
        if group_bytes is not None and group_bytes <= 0:
            raise ValueError(f"group_bytes={group_bytes}: must be > 0 (or None: one group)")
        self.host_mesh, self.local_mesh = host_view(trainer_mesh)
        self._sampler_leaves = jax.tree.leaves(sampler_shardings)
        self._dtypes = None if dtypes is None else jax.tree.leaves(dtypes)
        if self._dtypes is not None and len(self._dtypes) != len(self._sampler_leaves):
            raise ValueError(
                f"dtypes has {len(self._dtypes)} leaves, sampler_shardings "
                f"{len(self._sampler_leaves)}"
            )
        self.group_bytes = group_bytes
        self.groups: list[list[int]] = []
        self.largest_group_bytes = 0
        self._gathers: dict = {}  # (specs, dtypes) -> jitted cast + gather; layers share one
        self._specs: Any = None  # one PartitionSpec per leaf, from the first sync on
        self._shapes = None

    @classmethod
    def for_engine(cls, trainer_mesh: Mesh, engine) -> "WeightSync":
        """The sync into `engine`'s shardings and dtypes, in groups of
        `engine.cfg.weight_sync_group_mib`."""
        return cls(
            trainer_mesh,
            engine.param_shardings,
            engine.param_dtypes,
            engine.cfg.weight_sync_group_mib << 20,
        )

    def _build(self, leaves):
        local = self.local_mesh.size if self.local_mesh is not None else 1
        self._specs = [_local_spec(x, local) for x in leaves]
        targets = (
            [np.dtype(x.dtype) for x in leaves]
            if self._dtypes is None
            else [np.dtype(d) for d in self._dtypes]
        )
        self._targets = targets
        self._shapes = [(x.shape, x.dtype) for x in leaves]
        sizes = [int(np.prod(x.shape)) * dt.itemsize for x, dt in zip(leaves, targets)]
        self.groups = make_groups(sizes, self.group_bytes)

    def _gather(self, idx: list[int]):
        key = tuple((self._specs[i], self._targets[i]) for i in idx)
        fn = self._gathers.get(key)
        if fn is None:
            out = [NamedSharding(self.host_mesh, self._specs[i]) for i in idx]
            dts = [self._targets[i] for i in idx]
            fn = jax.jit(lambda xs: [x.astype(dt) for x, dt in zip(xs, dts)], out_shardings=out)
            self._gathers[key] = fn
        return fn

    def programs(self, params) -> list[tuple[Any, list]]:
        """(jitted cast-and-gather, its arguments) of each distinct program a sync of `params`
        (concrete, or ShapeDtypeStructs with their trainer shardings) runs: what `__call__`
        compiles, for compiling ahead of time."""
        leaves = jax.tree.leaves(params)
        if self._specs is None:
            self._build(leaves)
        out: dict = {}
        for idx in self.groups:
            fn, args = self._gather(idx), [leaves[i] for i in idx]
            out.setdefault((id(fn), tuple(x.shape for x in args)), (fn, args))
        return list(out.values())

    def __call__(self, params):
        leaves, treedef = jax.tree.flatten(params)
        if len(leaves) != len(self._sampler_leaves):
            raise ValueError(
                f"params have {len(leaves)} arrays, sampler_shardings {len(self._sampler_leaves)}"
            )
        if self._specs is None:
            self._build(leaves)
        elif [(x.shape, x.dtype) for x in leaves] != self._shapes:
            raise ValueError(
                "params changed shape or dtype since the first sync: the sampler "
                "would recompile; build a new WeightSync for a new model"
            )
        out = [None] * len(leaves)
        largest = 0
        for idx in self.groups:
            gathered = self._gather(idx)([leaves[i] for i in idx])
            per_device: dict = {}
            for x in gathered:
                for s in x.addressable_shards:
                    per_device[s.device] = per_device.get(s.device, 0) + s.data.nbytes
            largest = max(largest, max(per_device.values(), default=0))
            for i, x in zip(idx, gathered):
                shards = x.addressable_shards
                if self.local_mesh is not None:
                    host_copy = jax.make_array_from_single_device_arrays(
                        x.shape,
                        NamedSharding(self.local_mesh, self._specs[i]),
                        [s.data for s in shards],
                    )
                else:  # fully replicated fallback: any one local copy is complete
                    host_copy = shards[0].data
                out[i] = jax.device_put(host_copy, self._sampler_leaves[i])
            # The group's copies must land before the next group is gathered: then the
            # gathered buffers are free and a trainer chip never holds two groups.
            jax.block_until_ready([out[i] for i in idx])
            del gathered, host_copy, shards
        self.largest_group_bytes = largest
        return jax.tree.unflatten(treedef, out)
