"""Ahead-of-time compiles of every program a run executes (`run.py --dry-run --compile`).

The programs are the run's own jitted functions (train/state.py, train/step.py, train/sft.py,
sampler/engine.py, sampler/weight_sync.py) built on the run's meshes, lowered on abstract
inputs (ShapeDtypeStructs carrying their shardings: no weight is ever allocated) and compiled
for the devices of a TPU slice that libtpu describes on this host (`tpu_devices`) or for this
host's own devices. Each compile reports XLA's memory per chip and its cost
analysis (FLOPs, bytes accessed), set against the chip's HBM, the planner's estimate
(plan/estimate.py) and the roofline of the chip table (plan/topology.py).
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import importlib.util
import math
import os
import sys
import time
from typing import Any, Callable, Iterator, Optional

import jax
import jax.numpy as jnp
import numpy as np

from scalerl_jax.config import RunConfig
from scalerl_jax.plan.estimate import GIB, SamplerMemory, TrainerMemory, rows_per_chip, seq_len
from scalerl_jax.plan.topology import Chip, PlanError, Topology, grid_name

LIBTPU_DIR = "SCALERL_LIBTPU_DIR"  # a directory holding libtpu, put on sys.path only here


# ------------------------------------------------------------------------------- devices
def libtpu_pin() -> str:
    """The libtpu requirement of the installed jax's `tpu` extra, e.g. `libtpu==0.0.42.*`."""
    for req in importlib.metadata.requires("jax") or []:
        name, _, marker = req.partition(";")
        if name.strip().startswith("libtpu") and "tpu" in marker:
            return name.strip().replace(" ", "")
    return "libtpu"


def install_hint() -> str:
    v = jax.__version__
    return (
        f"compiling for a TPU slice needs libtpu (the TPU compiler) on this host: pip install "
        f'"jax[tpu]=={v}" (pulls {libtpu_pin()}), or, so that other starts do not load it, '
        f'pip install --target DIR "{libtpu_pin()}" and set {LIBTPU_DIR}=DIR'
    )


def has_libtpu() -> bool:
    extra = os.environ.get(LIBTPU_DIR)
    if extra and extra not in sys.path:
        sys.path.insert(0, extra)
    return importlib.util.find_spec("libtpu") is not None


def tpu_devices(topo: Topology) -> list:
    """The devices of slice `topo` as libtpu describes them (no TPU needed): jit compiles for
    them. PlanError with `install_hint()` when libtpu is missing."""
    if not has_libtpu():
        raise PlanError(install_hint())
    if "JAX_PLATFORMS" not in os.environ:  # the host's backend stays the CPU: no TPU probing
        jax.config.update("jax_platforms", "cpu")
    accel = topo.name.replace("v5e-", "v5litepod-")
    for key, value in (
        ("TPU_SKIP_MDS_QUERY", "1"),  # no GCE metadata server: the slice is named here
        ("TPU_ACCELERATOR_TYPE", accel),
        ("TPU_WORKER_HOSTNAMES", "localhost"),
        # Compiling touches no chip: several processes may compile at once (else the second
        # fails on libtpu's /tmp/libtpu_lockfile, e.g. under pytest -n 2).
        ("ALLOW_MULTIPLE_LIBTPU_LOAD", "1"),
    ):
        os.environ.setdefault(key, value)
    from jax.experimental import topologies

    devices = list(topologies.get_topology_desc(grid_name(topo), "tpu").devices)
    if len(devices) != topo.chips:
        raise PlanError(
            f"libtpu describes {grid_name(topo)} as {len(devices)} devices, the plan for "
            f"{topo.name} has {topo.chips} chips"
        )
    return devices


# ------------------------------------------------------------------------------ programs
@dataclasses.dataclass(frozen=True)
class Program:
    """One compiled program: XLA's bytes per chip and cost analysis (per chip)."""

    name: str
    seconds: float  # tracing + lowering + XLA's compile
    arguments: int
    outputs: int
    temporaries: int
    aliases: int
    resident: int  # bytes the chip holds beside the program's own buffers (see `_resident`)
    flops: float
    bytes_accessed: float
    estimate: Optional[int]  # the planner's bytes for the same program, when it has one
    refused: Optional[str] = None  # XLA's reason when it refused to compile it (out of HBM)
    lowering: float = 0.0  # of `seconds`, the Python side: tracing and lowering to StableHLO

    @property
    def total(self) -> int:
        return self.arguments + self.outputs + self.temporaries - self.aliases

    @property
    def need(self) -> int:
        return self.total + self.resident

    def roofline(self, chip: Optional[Chip]) -> Optional[float]:
        """Seconds at the chip's bf16 peak or HBM bandwidth, whichever binds."""
        if chip is None:
            return None
        return max(
            self.flops / (chip.bf16_tflops * 1e12), self.bytes_accessed / (chip.hbm_gbps * 1e9)
        )


def per_chip_bytes(tree) -> int:
    """Bytes one device holds of a tree of sharded ShapeDtypeStructs (the largest shard)."""
    total = 0
    for x in jax.tree.leaves(tree):
        shape = x.sharding.shard_shape(x.shape) if x.sharding is not None else x.shape
        total += math.prod(shape) * np.dtype(x.dtype).itemsize
    return total


def _struct(shape, dtype, sharding) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(tuple(shape), jnp.dtype(dtype), sharding=sharding)


def _abstract_out(lowered):
    return jax.tree.map(lambda o: _struct(o.shape, o.dtype, o.sharding), lowered.out_info)


def _train_batch(cfg: RunConfig, mesh):
    from scalerl_jax.train.batch import TrainBatch
    from scalerl_jax.train.step import batch_sharding, batch_shards

    m, shards = cfg.optim.micro_batches, batch_shards(mesh)
    shape = (m, rows_per_chip(cfg, shards, m) * shards, seq_len(cfg))
    sh = batch_sharding(mesh)
    fields: dict[str, Any] = {
        name: _struct(shape, dtype, sh)
        for name, dtype in (
            ("tokens", jnp.int32),
            ("targets", jnp.int32),
            ("positions", jnp.int32),
            ("segment_ids", jnp.int32),
            ("loss_mask", jnp.bool_),
            ("behaviour_logp", jnp.float32),
        )
    }
    fields["advantages"] = _struct(shape[:2], jnp.float32, sh)
    fields["prompt_index"] = _struct(shape[:2], jnp.int32, sh)
    return TrainBatch(**fields, num_prompts=cfg.pipeline.prompts_per_step)


def _sft_batch(cfg: RunConfig, mesh):
    from scalerl_jax import mesh as mesh_lib

    assert cfg.sft is not None
    shape = (cfg.sft.batch_size, -(-cfg.sft.max_length // 16) * 16)  # run_sft's packed rows
    sh = mesh_lib.named(mesh, "batch", None)
    out = {k: _struct(shape, jnp.int32, sh) for k in ("tokens", "targets", "positions")}
    return {
        **out,
        "segment_ids": _struct(shape, jnp.int32, sh),
        "loss_mask": _struct(shape, jnp.float32, sh),
    }


class _Lowered:
    """A program lowered on abstract arguments, with the seconds tracing and lowering took."""

    def __init__(self, name: str, role: str, fn, *args):
        t0 = time.perf_counter()
        self.name, self.role, self.lowered = name, role, fn.lower(*args)
        self.seconds = time.perf_counter() - t0


def programs(cfg: RunConfig, devices, held: dict) -> Iterator[_Lowered]:
    """Every program of the run, lowered in the order the run runs them, on the meshes
    `devices` split into. Roles: "trainer", "sampler", "sync" (the trainer chips, with the
    train state held) or "write" (a weight's slice written into the sampler's copy, on the
    sampler chips). `held` gets the bytes per chip of what stays resident between programs:
    "train" (TrainState), "params" (the sampler's weights), "decode" (its decode state)."""
    from scalerl_jax import mesh as mesh_lib
    from scalerl_jax.sampler.engine import Engine
    from scalerl_jax.sampler.weight_sync import WeightSync
    from scalerl_jax.train import sft, startup
    from scalerl_jax.train import state as state_lib

    split = mesh_lib.split_devices(cfg.mesh, devices)
    tmesh = mesh_lib.trainer_mesh(cfg.mesh, split.trainer)
    smesh = mesh_lib.sampler_mesh(cfg.mesh, split.sampler)
    graphdef, abstract = state_lib.abstract_train_state(cfg.model, cfg.optim, tmesh, cfg.seed)
    engine = Engine(cfg.model, smesh, cfg.sampler, seed=cfg.seed)  # as startup.open_sampler
    params = state_lib.with_shardings(engine.abstract_params, engine.param_shardings)
    state = state_lib.with_shardings(jax.eval_shape(engine._init), engine.state_shardings)
    held.update(train=per_chip_bytes(abstract), params=per_chip_bytes(params))
    held["decode"] = per_chip_bytes(state)
    if cfg.sft is not None:  # the warm-up: its own state; RL then loads the model it exports
        _, sft_state = state_lib.abstract_train_state(cfg.model, cfg.sft.optim, tmesh, cfg.seed)
        init = state_lib.init_program(cfg.model, cfg.sft.optim, sft_state, cfg.seed)
        yield _Lowered("sft state init", "trainer", init)
        step = sft.make_sft_step(
            graphdef,
            sft_state,
            tmesh,
            model_cfg=cfg.model,
            optim_cfg=cfg.sft.optim,
            logprob_chunk=cfg.sft.optim.logprob_chunk,
        )
        yield _Lowered("sft step", "trainer", step.jitted, sft_state, _sft_batch(cfg, tmesh))
    if cfg.sft is not None or cfg.hf_checkpoint:
        assemble = state_lib.assemble_program(cfg.optim, abstract.params, tmesh, cfg.seed)
        yield _Lowered("state assembly", "trainer", assemble, abstract.params)
    else:
        init = state_lib.init_program(cfg.model, cfg.optim, abstract, cfg.seed)
        yield _Lowered("state init", "trainer", init)
    train = startup.build_train_step(cfg, cfg.model, graphdef, abstract, tmesh)
    step_fn = train.jitted  # type: ignore[attr-defined]
    yield _Lowered("train step", "trainer", step_fn, abstract, _train_batch(cfg, tmesh))

    sync = WeightSync.for_engine(tmesh, engine)
    for i, (fn, args) in enumerate(sync.programs(abstract.params)):
        yield _Lowered(f"weight sync {i + 1}", "sync", fn, *args)
    for i, (fn, args) in enumerate(sync.write_programs(abstract.params)):
        yield _Lowered(f"weight slice write {i + 1}", "write", fn, *args)
    # The engine's own jitted functions (those Engine.precompile runs), on the longest prompt
    # and the whole cache window.
    yield _Lowered("decode state init", "sampler", engine._init)
    rep = engine._replicated
    t, b = engine.max_prefill_length, engine.max_concurrent_decodes
    prompt = (_struct((1, t), jnp.int32, rep), _struct((1,), jnp.int32, rep))
    prefill = _Lowered(f"prefill 1x{t}", "sampler", engine._prefill, params, *prompt)
    yield prefill
    prefix = _abstract_out(prefill.lowered)
    slots = (_struct((2, b), jnp.int32, rep), _struct((), jnp.int32, rep))
    keys = (_struct((b, 2), jnp.uint32, rep), _struct((), jnp.bool_, rep))
    yield _Lowered("insert", "sampler", engine._insert, prefix, state, *slots, *keys)
    s, k = engine.max_target_length, engine.decode_steps_per_call
    name = f"generate {b} slots x {k} steps, window {s}"
    yield _Lowered(name, "sampler", engine._generate, jax.tree.leaves(params), state, s)


# ------------------------------------------------------------------------------- compile
@dataclasses.dataclass(frozen=True)
class Target:
    """What the programs are judged against: bytes per chip and the chip's peaks."""

    name: str
    budget: int  # bytes per chip (device)
    chip: Optional[Chip]  # None: no roofline (local devices)
    colocated: bool
    trainer: Optional[TrainerMemory] = None  # the planner's estimate
    sampler: Optional[SamplerMemory] = None


def _estimate(name: str, role: str, target: Target) -> Optional[int]:
    t, s = target.trainer, target.sampler
    if role == "sync":
        return None if t is None else t.weight_sync
    if role == "write":
        return None  # the planner does not size it: one stacked weight and one slice
    if role == "trainer":
        if t is None or name.startswith("sft"):
            return None  # the planner sizes the RL step, not the warm-up
        state = t.params + t.optimizer
        return state + t.gradients + t.activations if name == "train step" else state
    if s is None:
        return None
    by_name = {"decode state init": s.kv_cache, "insert": s.kv_cache}
    if name.startswith("prefill"):
        return s.params + s.working
    return by_name.get(name, s.params + s.kv_cache + s.decode)


def _resident(
    name: str, role: str, held: dict, target: Target, arguments: int, outputs: int
) -> int:
    """Bytes a chip holds while the program runs that are not its own buffers: the train state
    beside the weight sync (less the group it reads); beside a slice write the sampler's params
    decoding, the rest of the next params and the decode state; the sampler's params beside a
    decode-state program and its decode state beside prefill; the next params (arriving by the
    weight sync while decoding goes on) beside prefill, insert and generate; a colocated chip
    also holds the other side's."""
    train, params, decode = held.get("train", 0), held.get("params", 0), held.get("decode", 0)
    if role == "sync":
        return max(0, train - arguments) + (2 * params + decode if target.colocated else 0)
    if role == "write":
        return params + max(0, params - outputs) + decode + (train if target.colocated else 0)
    if role == "trainer":
        return 2 * params + decode if target.colocated and name == "train step" else 0
    if name == "decode state init":  # before the first sync
        return params + (train if target.colocated else 0)
    own = decode if name.startswith("prefill") else params if name == "insert" else 0
    return own + params + (train if target.colocated else 0)


def compile_all(
    cfg: RunConfig,
    devices,
    target: Target,
    on_program: Callable[[Program], None] = lambda p: None,
    select: Optional[Callable[[str], bool]] = None,
) -> list[Program]:
    """Compile every program of `programs(cfg, devices)` (those `select` takes, by name; the
    others are only lowered); `on_program` sees each as it ends."""
    from scalerl_jax.models.layers import target_platform

    out: list[Program] = []
    held: dict = {}
    tpu = devices[0].platform == "tpu" and jax.default_backend() != "tpu"
    with target_platform("tpu" if tpu else None):  # the TPU's kernels (splash attention, ...)
        for p in programs(cfg, devices, held):
            if select is None or select(p.name):
                out.append(_compile(p, held, target))
                on_program(out[-1])
    return out


def _compile(p: _Lowered, held: dict, target: Target) -> Program:
    t0 = time.perf_counter()
    try:
        compiled = p.lowered.compile()
    except jax.errors.JaxRuntimeError as err:  # XLA refuses a program larger than the HBM
        if "RESOURCE_EXHAUSTED" not in str(err):
            raise
        seconds = p.seconds + time.perf_counter() - t0
        reason = str(err).strip().splitlines()[0]
        est = _estimate(p.name, p.role, target)
        return Program(
            p.name, seconds, 0, 0, 0, 0, 0, 0.0, 0.0, est, refused=reason, lowering=p.seconds
        )
    seconds = p.seconds + time.perf_counter() - t0
    mem = compiled.memory_analysis()
    cost = compiled.cost_analysis()
    cost = (cost[0] if cost else {}) if isinstance(cost, list) else (cost or {})
    args, outs = int(mem.argument_size_in_bytes), int(mem.output_size_in_bytes)
    return Program(
        p.name,
        seconds,
        args,
        outs,
        int(mem.temp_size_in_bytes),
        int(mem.alias_size_in_bytes),
        _resident(p.name, p.role, held, target, args, outs),
        float(cost.get("flops", 0.0)),
        float(cost.get("bytes accessed", 0.0)),
        _estimate(p.name, p.role, target),
        lowering=p.seconds,
    )


# -------------------------------------------------------------------------------- report
def tpu_target(plan) -> Target:
    """Judged against a whole chip's HBM: XLA's count includes its own buffers, the headroom
    the planner leaves for them."""
    topo = plan.topology
    return Target(
        topo.name,
        int(topo.chip.hbm_gib * GIB),
        topo.chip,
        plan.layout.colocated,
        plan.trainer,
        plan.sampler,
    )


def local_target(local) -> Target:
    """This host's devices (plan/local.py's LocalPlan): devices sharing host RAM get an equal
    share of it each."""
    m = local.machine
    per_device = m.budget // m.devices if m.shared else m.budget
    name = f"{m.devices} {m.platform} device(s) ({m.kind})"
    return Target(name, per_device, None, local.colocated, local.trainer, local.sampler)


def _g(n: Optional[float]) -> str:
    return "-" if n is None else f"{n / GIB:.2f}"


def _size(n: Optional[float], unit: str = "B") -> str:
    """1.23G / 45.6M / 7.8K (binary prefixes for bytes, decimal for FLOPs)."""
    if n is None:
        return "-"
    base = 1024.0 if unit == "B" else 1000.0
    for prefix in ("T", "G", "M", "K"):
        scale = base ** "KMGT".index(prefix) * base
        if abs(n) >= scale:
            v = n / scale
            return f"{v:.0f}{prefix}" if abs(v) >= 100 else f"{v:.3g}{prefix}"
    return f"{n:.0f}"


def _secs(t: Optional[float]) -> str:
    if t is None:
        return "-"
    return f"{t * 1e3:.3g} ms" if t >= 1e-3 else f"{t * 1e6:.3g} us"


COLUMNS = (
    f"  {'program':<44}{'compile':>8}{'args':>8}{'outputs':>8}{'temps':>8}{'aliases':>8}"
    f"{'total':>8}{'+held':>8}{'plan':>8}{'FLOP':>8}{'bytes':>8}{'roofline':>11}"
)


def format_program(p: Program, target: Target) -> str:
    if p.refused:
        return f"  {p.name:<44}{p.seconds:>7.1f}s  refused by XLA: {p.refused}"
    sizes = (p.arguments, p.outputs, p.temporaries, p.aliases, p.total, p.resident, p.estimate)
    return (
        f"  {p.name:<44}{p.seconds:>7.1f}s"
        + "".join(f"{_size(n):>8}" for n in sizes)
        + f"{_size(p.flops, 'FLOP'):>8}{_size(p.bytes_accessed):>8}"
        + f"{_secs(p.roofline(target.chip)):>11}"
    )


def header(target: Target) -> str:
    return (
        f"compile for {target.name}, per chip against {target.budget / GIB:.1f} GiB: XLA's "
        "memory (total = args + outputs + temps - aliases; +held: what the chip keeps beside "
        "the program; plan: the planner's estimate), FLOPs and bytes accessed (cost "
        "analysis), and the roofline time they take at the chip's peaks\n" + COLUMNS
    )


def summary(programs: list[Program], target: Target) -> str:
    refused = [p.name for p in programs if p.refused]
    worst = max(programs, key=lambda p: p.need)
    if refused:
        return (
            f"  {len(programs)} programs in {sum(p.seconds for p in programs):.0f} s; "
            f"refused for lack of HBM: {', '.join(refused)}"
        )
    return (
        f"  {len(programs)} programs in {sum(p.seconds for p in programs):.0f} s; the fullest "
        f"chip: {worst.name}, {worst.need / GIB:.2f} of {target.budget / GIB:.1f} GiB"
    )


def problem(programs: list[Program], target: Target) -> Optional[str]:
    """One line naming the first program that does not fit, with its figures; else None."""
    for p in programs:
        if p.refused:
            return (
                f"{p.name} does not fit {target.name}: {p.refused} (the planner estimated "
                f"{_g(p.estimate)} GiB)"
            )
        if p.need > target.budget:
            return (
                f"{p.name} does not fit {target.name}: {p.need / GIB:.2f} GiB per chip by "
                f"XLA's count (arguments {_g(p.arguments)}, outputs {_g(p.outputs)}, "
                f"temporaries {_g(p.temporaries)}, aliases -{_g(p.aliases)}, held beside it "
                f"{_g(p.resident)}) > {target.budget / GIB:.1f} GiB; the planner estimated "
                f"{_g(p.estimate)} GiB"
            )
    return None
