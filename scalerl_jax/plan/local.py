"""The plan for the machine a run is on (no --tpu): the TPU plan's memory estimate
(plan/estimate.py) for the config on this host's devices, checked against the memory they have
(CPU: MemAvailable or the cgroup's room, shared by every device; GPU / TPU: each device's
`memory_stats()`) before anything is allocated, so a run that cannot fit is refused with one
line and settings that would fit, instead of being OOM-killed. Nothing is re-planned;
`headroom` is left to XLA's buffers, the compiler and Python.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any, Optional

from scalerl_jax.config import RunConfig
from scalerl_jax.plan.estimate import (
    GIB,
    SamplerMemory,
    TrainerMemory,
    per_shard,
    rows_per_chip,
    sampler_memory,
    seq_len,
    trainer_memory,
)
from scalerl_jax.plan.topology import PlanError


# --------------------------------------------------------------------------------- machine
@dataclasses.dataclass(frozen=True)
class Machine:
    platform: str  # "cpu", "gpu", "tpu"
    kind: str  # jax device_kind
    devices: int  # local devices
    free: int  # bytes: host RAM all devices share (shared), else the least any device has
    source: str  # where `free` comes from
    shared: bool = False
    hosts: int = 1  # processes of a distributed run: the trainer mesh spans all of them
    headroom: float = 0.10

    @property
    def budget(self) -> int:
        return int(self.free * (1 - self.headroom))

    def describe(self) -> str:
        n = f"{self.devices} {self.platform} device" + ("" if self.devices == 1 else "s")
        where = "shared host RAM" if self.shared else "per device"
        return (
            f"{n} ({self.kind}): {self.free / GIB:.1f} GiB {where} ({self.source}), "
            f"{self.budget / GIB:.1f} usable ({self.headroom:.0%} left to XLA and the process)"
        )


def _read_int(path: str) -> Optional[int]:
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # cgroup v2 writes "max" for no limit


# (limit, usage) files of cgroup v2 and v1: a container's limit can be far below the host's RAM.
CGROUP_FILES = (
    ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
    ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"),
)


def host_memory(meminfo: str = "/proc/meminfo", cgroups=CGROUP_FILES) -> tuple[int, str]:
    """(bytes this process can still allocate, where the figure comes from): MemAvailable, or
    a cgroup's limit minus its usage when that is lower."""
    found = []
    try:
        with open(meminfo) as f:
            info = dict(line.split(":", 1) for line in f if ":" in line)
        found.append((int(info["MemAvailable"].split()[0]) * 1024, "MemAvailable"))
    except (OSError, KeyError, ValueError):
        try:
            found.append(
                (os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), "free physical pages")
            )
        except (OSError, ValueError):
            pass
    for limit, usage in cgroups:
        lim, used = _read_int(limit), _read_int(usage)
        if lim is not None and used is not None and lim < 1 << 60:  # v1 "no limit" is ~2^63
            found.append(
                (max(0, lim - used), f"cgroup limit {os.path.basename(limit)} minus usage")
            )
    if not found:
        raise PlanError("cannot tell how much host memory is free (no /proc/meminfo, no sysconf)")
    return min(found)


def detect(headroom: float = 0.10) -> Optional[Machine]:
    """This host's devices and their free memory; None when an accelerator reports none."""
    import jax

    devices = jax.local_devices()
    first = devices[0]
    if first.platform == "cpu":
        free, source = host_memory()
        return Machine(
            "cpu",
            first.device_kind,
            len(devices),
            free,
            source,
            shared=True,
            hosts=jax.process_count(),
            headroom=headroom,
        )
    try:
        stats = [d.memory_stats() or {} for d in devices]
    except Exception:  # noqa: BLE001 - backends without the query raise various errors
        return None
    if not all("bytes_limit" in s for s in stats):
        return None
    free = min(s["bytes_limit"] - s.get("bytes_in_use", 0) for s in stats)
    return Machine(
        first.platform,
        first.device_kind,
        len(devices),
        free,
        "memory_stats: bytes_limit minus bytes_in_use",
        hosts=jax.process_count(),
        headroom=headroom,
    )


# ------------------------------------------------------------------------------------- plan
@dataclasses.dataclass(frozen=True)
class LocalPlan:
    machine: Machine
    config: RunConfig
    trainer_devices: int  # per host
    sampler_devices: int
    trainer_mesh: dict  # data, fsdp, tensor (and expert) over all hosts' trainer devices
    sampler_mesh: tuple[int, int]  # (data, tensor) of this host's replica
    trainer: TrainerMemory
    sampler: SamplerMemory

    @property
    def colocated(self) -> bool:
        return self.config.mesh.colocate

    @property
    def need(self) -> int:
        """Bytes against `machine.budget`: the sum over devices of shared host RAM, else the
        fullest device (a colocated device holds both)."""
        t, s = self.trainer.peak, self.sampler.peak
        if self.machine.shared:
            return self.trainer_devices * t + self.sampler_devices * s
        return t + s if self.colocated else max(t, s)

    @property
    def fits(self) -> bool:
        return self.need <= self.machine.budget


def _mesh_shape(cfg: RunConfig, n: int) -> dict:
    """The trainer mesh mesh.trainer_mesh builds over n devices (-1 takes the rest)."""
    m = cfg.mesh
    sizes = {"data": m.data, "fsdp": m.fsdp, "tensor": m.tensor}
    fixed = m.expert * math.prod(v for v in sizes.values() if v != -1)
    for name in [k for k, v in sizes.items() if v == -1]:
        sizes[name] = n // fixed if n % fixed == 0 else 0
    if m.expert * math.prod(sizes.values()) != n:
        raise PlanError(
            f"mesh.*: the trainer mesh {dict(sizes, expert=m.expert)} does not "
            f"cover {n} trainer devices"
        )
    # `expert` is one more data axis for rows (mesh.RULES "batch"), and shards only the experts.
    return {
        "data": sizes["data"] * m.expert,
        "fsdp": sizes["fsdp"],
        "tensor": sizes["tensor"],
        "expert": m.expert,
    }


def local_plan(cfg: RunConfig, machine: Machine) -> LocalPlan:
    """Memory of `cfg` on `machine`, with the device split mesh.split_devices makes."""
    n = machine.devices
    if cfg.mesh.colocate:
        k, s = n, n
    else:
        k = cfg.mesh.trainer_devices_per_host or (n + 1) // 2
        s = n - k
        if s < 1 or k < 1:
            raise PlanError(
                f"mesh.trainer_devices_per_host={k} with {n} local devices leaves "
                "no sampler device; set mesh.colocate=true"
            )
    mesh = _mesh_shape(cfg, k * machine.hosts)
    st = s if cfg.mesh.sampler_tensor == -1 else cfg.mesh.sampler_tensor
    data = max(1, s // st)
    slots = cfg.sampler.max_concurrent_decodes
    return LocalPlan(
        machine,
        cfg,
        k,
        s,
        mesh,
        (data, st),
        trainer_memory(
            cfg,
            mesh,
            cfg.optim.micro_batches,
            cfg.model.remat,
            k,
            platform={"gpu": "cuda"}.get(machine.platform, machine.platform),
        ),
        sampler_memory(cfg, data, st, slots, tpu=machine.platform == "tpu"),
    )


def items(plan: LocalPlan) -> list[tuple[str, int]]:
    """(what, bytes on the machine: summed over devices when they share host RAM), largest
    first."""
    cfg, tm, sm = plan.config, plan.trainer, plan.sampler
    kt, ks = (plan.trainer_devices, plan.sampler_devices) if plan.machine.shared else (1, 1)
    rows = rows_per_chip(
        cfg, plan.trainer_mesh["data"] * plan.trainer_mesh["fsdp"], cfg.optim.micro_batches
    )
    s = cfg.sampler
    out = [
        ("trainer params", kt * tm.params),
        ("AdamW moments", kt * tm.optimizer),
        ("gradients", kt * tm.gradients),
        (
            f"activations ({rows} rows x {seq_len(cfg):,} tokens per micro-batch per device, "
            f"remat {'on' if cfg.model.remat else 'off'})",
            kt * tm.activations,
        ),
        ("weight-sync copy", kt * tm.weight_sync),
        ("sampler params", ks * sm.params),
        ("sampler weight-sync copy", ks * sm.incoming),
        (
            f"KV cache ({per_shard(s.max_concurrent_decodes, plan.sampler_mesh[0])} slots x "
            f"{s.max_target_length:,} tokens per device)",
            ks * sm.kv_cache,
        ),
        ("sampler working set", ks * sm.work),
    ]
    return sorted(out, key=lambda x: -x[1])


# ---------------------------------------------------------------------------------- fixes
def _length_options(cfg: RunConfig):
    """The configured lengths, then max_new_tokens halved (down to 64), the KV cache keeping
    its room beyond prompt + completion and the thinking / answer budgets scaled alike, so
    interruptions still happen before the cap."""
    s = cfg.sampler
    yield s
    room = max(0, s.max_target_length - s.max_prefill_length - s.max_new_tokens)
    new = s.max_new_tokens // 2
    while new >= 64:
        f = new / s.max_new_tokens
        think: dict[str, Any] = {}
        if s.interruptions:
            think = dict(
                think_min=max(1, int(s.think_min * f)),
                think_max=max(1, int(s.think_max * f)),
                answer_budget=int(s.answer_budget * f),
            )
        yield dataclasses.replace(
            s, max_new_tokens=new, **think, max_target_length=s.max_prefill_length + new + room
        )
        new //= 2


def _slot_options(cfg: RunConfig):
    n, floor = (
        cfg.sampler.max_concurrent_decodes,
        min(cfg.sampler.max_concurrent_decodes, cfg.pipeline.generations_per_prompt),
    )
    while n >= floor:
        yield n
        n //= 2


def fitting_settings(cfg: RunConfig, machine: Machine) -> list[str]:
    """KEY=VALUE settings under which `cfg` fits `machine` ([] when none does). Lengths change
    the experiment, the rest only its speed, so the first fit is taken in this order: the
    configured lengths before shorter ones, then without remat before with it, fewer
    micro-batches (divisors of the prompts per step: whole prompts in each), more decode
    slots."""
    p, first = cfg.pipeline.prompts_per_step, cfg.optim.micro_batches
    micros = [first] + [m for m in range(first + 1, p + 1) if p % m == 0]
    for sampler in _length_options(cfg):
        base = dataclasses.replace(cfg, sampler=sampler)
        for remat in dict.fromkeys([cfg.model.remat, True]):
            seen = set()
            for micro in micros:
                trial = dataclasses.replace(
                    base,
                    model=cfg.model.replace(remat=remat),
                    optim=dataclasses.replace(cfg.optim, micro_batches=micro),
                )
                plan = local_plan(trial, machine)
                rows = rows_per_chip(
                    trial, plan.trainer_mesh["data"] * plan.trainer_mesh["fsdp"], micro
                )
                if rows in seen:  # more micro-batches that hold no fewer rows: no use
                    continue
                seen.add(rows)
                for slots in _slot_options(trial):  # the trainer's figures stay as they are
                    fit = dataclasses.replace(
                        trial,
                        sampler=dataclasses.replace(trial.sampler, max_concurrent_decodes=slots),
                    )
                    if dataclasses.replace(
                        plan,
                        config=fit,
                        sampler=sampler_memory(
                            fit, *plan.sampler_mesh, slots, tpu=machine.platform == "tpu"
                        ),
                    ).fits:
                        return _diff(cfg, fit)
    return []


def _diff(old: RunConfig, new: RunConfig) -> list[str]:
    text = lambda v: str(v).lower() if isinstance(v, bool) else str(v)  # noqa: E731
    return [
        f"{section}.{f.name}={text(getattr(getattr(new, section), f.name))}"
        for section in ("model", "optim", "sampler")
        for f in dataclasses.fields(getattr(new, section))
        if getattr(getattr(old, section), f.name) != getattr(getattr(new, section), f.name)
    ]


def explain(plan: LocalPlan) -> str:
    """One line: what does not fit, its largest items, and settings that would fit."""
    m = plan.machine
    top = ", ".join(f"{what} {n / GIB:,.1f} GiB" for what, n in items(plan)[:3])
    where = "" if m.shared else " on its fullest device"
    text = (
        f"{plan.config.model.name} does not fit this machine: it needs {plan.need / GIB:,.1f} "
        f"GiB{where}, {m.budget / GIB:,.1f} GiB usable of {m.free / GIB:,.1f} GiB "
        f"({m.source}; {m.devices} {m.platform} device{'s' if m.devices > 1 else ''}). "
        f"Largest: {top}"
    )
    fix = fitting_settings(plan.config, m)
    return text + (
        f". Settings that fit: {' '.join(fix)}"
        if fix
        else ". No shorter lengths, remat, micro-batches or decode slots fit: use a "
        "smaller model or a machine with more memory"
    )


# ----------------------------------------------------------------------------- the printout
def format_local(plan: LocalPlan) -> str:
    cfg, m, tm, sm = plan.config, plan.machine, plan.trainer, plan.sampler
    pipe, mesh, (sdata, stensor) = cfg.pipeline, plan.trainer_mesh, plan.sampler_mesh
    n, k = m.devices, plan.trainer_devices
    rows = rows_per_chip(cfg, mesh["data"] * mesh["fsdp"], cfg.optim.micro_batches)
    g = lambda b: f"{b / GIB:9.2f}"  # noqa: E731
    label = lambda text: f"    {text:<30}"  # noqa: E731
    dash = f"{'-':>9}"
    if plan.colocated:
        roles = (
            "its device trains and samples" if n == 1 else f"all {n} devices train and sample"
        ) + " (colocated)"
    else:
        roles = (
            ("device 0" if k == 1 else f"devices 0-{k - 1}")
            + " train, "
            + (f"device {k}" if k == n - 1 else f"devices {k}-{n - 1}")
            + " sample"
        )
    total = (
        "the sum over devices, on shared host RAM"
        if m.shared
        else "the fullest device" + (": trainer + sampler" if plan.colocated else "")
    )
    params = cfg.model.num_params()
    size = f"{params / 1e9:.2f}B" if params >= 1e9 else f"{params / 1e6:.1f}M"
    micro = cfg.optim.micro_batches
    lines = [
        f"local plan for {cfg.model.name} ({size} params in "
        f"{cfg.model.param_dtype}, {cfg.model.compute_dtype} compute) on this machine",
        f"  devices   {m.describe()}",
        f"  roles     {roles}",
        f"  trainer   mesh data={mesh['data']} fsdp={mesh['fsdp']} tensor={mesh['tensor']}; "
        f"{pipe.prompts_per_step * pipe.generations_per_prompt} rows per step "
        f"({pipe.prompts_per_step} prompts x {pipe.generations_per_prompt}) in "
        f"{micro} micro-batch{'es' if micro > 1 else ''}: {rows} rows per device per micro-batch, "
        f"up to {seq_len(cfg):,} tokens each; remat {'on' if cfg.model.remat else 'off'}",
        f"  sampler   mesh data={sdata} tensor={stensor}; {cfg.sampler.max_concurrent_decodes} "
        f"decode slots ({per_shard(cfg.sampler.max_concurrent_decodes, sdata)} per device), "
        f"KV cache length {cfg.sampler.max_target_length:,}",
        f"  memory per device, GiB{'':12}trainer   sampler",
        label("params") + g(tm.params) + g(sm.params),
        label("optimizer (AdamW mu, nu)") + g(tm.optimizer) + dash,
        label("gradients (fp32 acc + grads)") + g(tm.gradients) + dash,
        label(f"activations (remat {'on' if cfg.model.remat else 'off'})")
        + g(tm.activations)
        + dash,
        label("weight-sync copy") + g(tm.weight_sync) + g(sm.incoming),
        label("KV cache") + dash + g(sm.kv_cache),
        label("working set") + dash + g(sm.work),
        label("peak") + g(tm.peak) + g(sm.peak),
        f"  total     {plan.need / GIB:,.2f} GiB ({total}) of {m.budget / GIB:,.2f} GiB usable: "
        + ("fits" if plan.fits else "DOES NOT FIT"),
    ]
    return "\n".join(lines)
