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

Groups: consecutive pieces (a layer's arrays are adjacent in the tree) whose sampler-dtype
bytes add up to at most `group_bytes`. A piece is an array, or, for an array larger than the
bound whose leading axis neither mesh shards (a weight stacked over the scanned layers), a slice
of its leading axis that fits the bound (`split`); the sampler writes the slices into its copy
in place. Only a piece larger than the bound by itself (one layer's slice, an embedding sharded
along its leading axis) is a group alone. Each group's transfer completes before the next group
is gathered, so a trainer chip holds at most one gathered group (its bytes / trainer chips per
host), not a copy of the model: what the plan counts as the weight-sync memory
(plan/estimate.py). The cast comes before the gather, so the gather moves half the bytes of
fp32 masters.

If the trainer mesh's device order interleaves hosts in a way no `(hosts, local)` reshape
captures, step 1 falls back to full replication on every trainer device (correct, more memory).
"""

from __future__ import annotations

import logging
import math
from typing import Any, NamedTuple, Optional

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
def _local_spec(shape: tuple, spec, local: int) -> PartitionSpec:
    """Shard one dimension over the host's trainer devices: preferably one the trainer already
    shards (`spec`; less data moves), else the largest that `local` divides; else replicate."""
    if local <= 1:
        return PartitionSpec()
    sharded = [i for i, s in enumerate(spec) if s is not None]
    for i in sharded + sorted(range(len(shape)), key=lambda i: -shape[i]):
        if shape[i] % local == 0:
            return PartitionSpec(*([None] * i), "local")
    return PartitionSpec()


def _spec(sharding) -> tuple:
    return tuple(getattr(sharding, "spec", ()))


def _cuttable(x, sampler_sharding) -> int:
    """The length of `x`'s leading axis when neither the trainer's nor the sampler's sharding
    splits it (a slice of it then stays on the devices that hold it), else 0."""
    specs = (_spec(getattr(x, "sharding", None)), _spec(sampler_sharding))
    return x.shape[0] if len(x.shape) and all(not s or s[0] is None for s in specs) else 0


class Piece(NamedTuple):
    """Array `leaf` whole (`rows` None) or its rows [start, start + rows) along axis 0."""

    leaf: int
    start: int = 0
    rows: Optional[int] = None


def split(sizes: list, lengths: list, budget: Optional[int]) -> tuple[list[Piece], list[int]]:
    """(pieces, their bytes): array i whole, or, when it is larger than `budget` and
    `lengths[i]` > 1 (its leading axis, 0 where it may not be cut), in slices of as many rows as
    fit the budget (at least one). The last slice ends at the last row, overlapping the one
    before when the slice does not divide the axis: every slice of an array then has one shape,
    so one program gathers them all, and rewriting a row with its own value keeps the copy exact."""
    pieces: list[Piece] = []
    out: list[int] = []
    for i, (n, length) in enumerate(zip(sizes, lengths)):
        if budget is None or n <= budget or length <= 1:
            pieces.append(Piece(i))
            out.append(n)
            continue
        row = n // length
        k = min(length, max(1, budget // row))
        starts = list(range(0, length - k, k)) + [length - k]
        pieces += [Piece(i, s, k) for s in starts]
        out += [k * row] * len(starts)
    return pieces, out


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


def write_slice(buf, x, start):
    """`buf` with rows [start, start + len(x)) replaced by `x`."""
    return jax.lax.dynamic_update_slice_in_dim(buf, x, start, 0)


class WeightSync:
    """Callable: trainer-mesh params -> params on this host's sampler mesh.

    sampler_shardings: a tree matching params (e.g. `Engine.param_shardings`: one NamedSharding
    per nnx Variable) on this host's sampler mesh. dtypes: a matching tree of the sampler's
    dtypes (`Engine.param_dtypes`); None keeps the trainer's. group_bytes: bound on one group's
    bytes in the sampler's dtypes (None: the whole model in one group).

    `groups` lists each group's pieces and `group_sizes` its bytes in the sampler's dtypes;
    after each call `largest_group_bytes` is the most bytes one trainer device held for one
    gathered group (measured from the gathered arrays' shards).
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
        self.groups: list[list[Piece]] = []
        self.group_sizes: list[int] = []
        self.largest_group_bytes = 0
        self._jits: dict = {}  # key -> jitted program; the layers' groups share them
        self._specs: Any = None  # one PartitionSpec per piece, from the first sync on
        self._shapes: list = []  # (shape, dtype) per leaf

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
        self._targets = (
            [np.dtype(x.dtype) for x in leaves]
            if self._dtypes is None
            else [np.dtype(d) for d in self._dtypes]
        )
        self._shapes = [(x.shape, x.dtype) for x in leaves]
        sizes = [math.prod(x.shape) * dt.itemsize for x, dt in zip(leaves, self._targets)]
        lengths = [_cuttable(x, sh) for x, sh in zip(leaves, self._sampler_leaves)]
        pieces, piece_bytes = split(sizes, lengths, self.group_bytes)
        trainer_specs = [_spec(getattr(x, "sharding", None)) for x in leaves]
        self._specs = {
            p: _local_spec(self._piece_shape(p), trainer_specs[p.leaf], local) for p in pieces
        }
        index = make_groups(piece_bytes, self.group_bytes)
        self.groups = [[pieces[j] for j in g] for g in index]
        self.group_sizes = [sum(piece_bytes[j] for j in g) for g in index]

    def _piece_shape(self, p: Piece) -> tuple:
        shape = self._shapes[p.leaf][0]
        return shape if p.rows is None else (p.rows, *shape[1:])

    def _jit(self, key, make):
        fn = self._jits.get(key)
        if fn is None:
            fn = self._jits[key] = make()
        return fn

    def _gather(self, group: list[Piece]):
        """Cast and gather a group: (arrays, their slices' starts) -> the pieces, replicated
        across hosts and sharded over each host's trainer devices."""
        rows = [p.rows for p in group]
        dts = [self._targets[p.leaf] for p in group]

        def cast(xs, starts):
            return [
                (x if k is None else jax.lax.dynamic_slice_in_dim(x, s, k)).astype(dt)
                for x, s, k, dt in zip(xs, starts, rows, dts)
            ]

        out = [NamedSharding(self.host_mesh, self._specs[p]) for p in group]
        key = ("gather", tuple(zip((self._specs[p] for p in group), dts, rows)))
        return self._jit(key, lambda: jax.jit(cast, out_shardings=out))

    def _write(self, sharding):
        """(the sampler's copy of a stacked array, a slice of it, start) -> the copy with the
        slice written in place (the copy is donated)."""
        return self._jit(
            ("write", sharding),
            lambda: jax.jit(write_slice, donate_argnums=0, out_shardings=sharding),
        )

    def _args(self, leaves, group: list[Piece]) -> tuple[list, list]:
        return [leaves[p.leaf] for p in group], [np.int32(p.start) for p in group]

    def _built(self, params) -> list:
        leaves = jax.tree.leaves(params)
        if self._specs is None:
            self._build(leaves)
        return leaves

    def programs(self, params) -> list[tuple[Any, tuple]]:
        """(jitted cast-and-gather, its arguments) of each distinct program a sync of `params`
        (concrete, or ShapeDtypeStructs with their trainer shardings) runs on the trainer
        devices: what `__call__` compiles, for compiling ahead of time."""
        leaves = self._built(params)
        out: dict = {}
        for group in self.groups:
            fn, args = self._gather(group), self._args(leaves, group)
            out.setdefault((id(fn), tuple(x.shape for x in args[0])), (fn, args))
        return list(out.values())

    def write_programs(self, params) -> list[tuple[Any, tuple]]:
        """(jitted slice write, abstract arguments with the sampler's sharding) of each distinct
        program a sync of `params` runs on the sampler devices to write a slice of a stacked
        weight into its copy; none when no weight is cut."""
        self._built(params)
        out: dict = {}
        for p in (p for group in self.groups for p in group if p.rows is not None):
            shape, dt = self._shapes[p.leaf][0], self._targets[p.leaf]
            target = self._sampler_leaves[p.leaf]
            key = (target, shape, dt, p.rows)
            if key not in out:
                buf = jax.ShapeDtypeStruct(shape, dt, sharding=target)
                piece = jax.ShapeDtypeStruct(self._piece_shape(p), dt, sharding=target)
                start = jax.ShapeDtypeStruct((), np.int32)
                out[key] = (self._write(target), (buf, piece, start))
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
        out: list = [None] * len(leaves)
        largest = 0
        for group in self.groups:
            gathered = self._gather(group)(*self._args(leaves, group))
            per_device: dict = {}
            for x in gathered:
                for s in x.addressable_shards:
                    per_device[s.device] = per_device.get(s.device, 0) + s.data.nbytes
            largest = max(largest, max(per_device.values(), default=0))
            for p, x in zip(group, gathered):
                shards = x.addressable_shards
                if self.local_mesh is not None:
                    host_copy = jax.make_array_from_single_device_arrays(
                        x.shape,
                        NamedSharding(self.local_mesh, self._specs[p]),
                        [s.data for s in shards],
                    )
                else:  # fully replicated fallback: any one local copy is complete
                    host_copy = shards[0].data
                target = self._sampler_leaves[p.leaf]
                piece = jax.device_put(host_copy, target)
                if p.rows is None:
                    out[p.leaf] = piece
                    continue
                if out[p.leaf] is None:
                    shape, dt = self._shapes[p.leaf][0], self._targets[p.leaf]
                    out[p.leaf] = jnp.zeros(shape, dt, device=target)
                out[p.leaf] = self._write(target)(out[p.leaf], piece, np.int32(p.start))
            # The group's copies must land before the next group is gathered: then the
            # gathered buffers are free and a trainer chip never holds two groups.
            jax.block_until_ready([out[p.leaf] for p in group])
            del gathered, host_copy, shards, piece
        self.largest_group_bytes = largest
        return jax.tree.unflatten(treedef, out)
