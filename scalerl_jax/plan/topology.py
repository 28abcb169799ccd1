"""The TPU topology table (hosts, chips per host, HBM, bf16 peak, HBM bandwidth) and the check
that this machine is the slice a command names."""

from __future__ import annotations

import dataclasses
from typing import Optional

from scalerl_jax.errors import UserError


class PlanError(UserError, ValueError):
    """A topology is unknown, or a config cannot run on it. The message names the numbers."""


# ------------------------------------------------------------------------------- the table
@dataclasses.dataclass(frozen=True)
class Chip:
    generation: str
    kinds: tuple  # jax `Device.device_kind` strings of this chip (assumption: not documented)
    hbm_gib: float
    bf16_tflops: float  # dense bf16 peak per chip
    hbm_gbps: float  # HBM bandwidth per chip, GB/s
    cores_per_chip: int  # v4-N / v5p-N count TensorCores (2 per chip); v5e-N / v6e-N count chips


# Per-chip figures of the public Cloud TPU system-architecture pages (cloud.google.com/tpu/docs/
# v4, /v5e, /v5p, /v6e): HBM capacity (GiB, as the pages write it), dense bf16 peak, HBM
# bandwidth. Written from what those pages publish, not re-checked against them when this table
# was made and not measured here: check a borderline fit against the current pages.
# Assumptions (not documented as such): the `device_kind` strings jax reports.
CHIPS = (
    Chip("v4", ("TPU v4",), 32.0, 275.0, 1200.0, 2),
    Chip("v5e", ("TPU v5 lite", "TPU v5e"), 16.0, 197.0, 819.0, 1),
    Chip("v5p", ("TPU v5", "TPU v5p"), 95.0, 459.0, 2765.0, 2),
    Chip("v6e", ("TPU v6 lite", "TPU v6e"), 32.0, 918.0, 1640.0, 1),
)


@dataclasses.dataclass(frozen=True)
class Topology:
    name: str
    chip: Chip
    hosts: int
    chips_per_host: int

    @property
    def chips(self) -> int:
        return self.hosts * self.chips_per_host

    def describe(self) -> str:
        return (
            f"{self.name} ({self.hosts} host(s) x {self.chips_per_host} "
            f"{self.chip.generation} chips)"
        )


def slices() -> list[Topology]:
    """Every slice the table knows. v4-N and v5p-N count TensorCores (2 per chip), v5e-N and
    v6e-N count chips. v4 and v5p hosts have 4 chips; v5e / v6e slices of 1, 4 or 8 chips are
    one host, larger ones 4 chips per host (assumption, from the ct5lp- / ct6e- "4t" machine
    types of multi-host slices). Sizes: powers of two up to the full pod (v4: 4,096 chips; v5e /
    v6e: 256), and for v5p also the full pod of 8,960 chips (v5p-17920; assumption: that the
    whole pod is one slice)."""
    out = []
    by_gen = {c.generation: c for c in CHIPS}
    for gen, largest in (("v4", 4096), ("v5p", 8960)):
        chip = by_gen[gen]
        sizes = [4 << k for k in range(12) if 4 << k <= largest]
        sizes += [largest] if largest not in sizes else []
        out += [Topology(f"{gen}-{n * chip.cores_per_chip}", chip, n // 4, 4) for n in sizes]
    for gen in ("v5e", "v6e"):
        chip = by_gen[gen]
        for n in (1, 4, 8, 16, 32, 64, 128, 256):
            hosts, per_host = (1, n) if n <= 8 else (n // 4, 4)
            out.append(Topology(f"{gen}-{n}", chip, hosts, per_host))
    return out


def known_topologies() -> list[str]:
    return [t.name for t in slices()]


# Chip grids of the slices (libtpu's topology names, `v5p:4x4x8`): v4 / v5p are 3-D tori, v5e /
# v6e 2-D; the full v5p pod (8,960 chips) is 16x20x28. Assumption: the grid Cloud TPU gives each
# size (the public pages list these shapes for the common sizes).
_GRID_3D = {4: "2x2x1", 8: "2x2x2", 16: "2x2x4", 32: "2x4x4", 64: "4x4x4", 128: "4x4x8"}
_GRID_3D |= {256: "4x8x8", 512: "8x8x8", 1024: "8x8x16", 2048: "8x16x16", 4096: "16x16x16"}
_GRID_3D |= {8192: "16x16x32", 8960: "16x20x28"}
_GRID_2D = {1: "1x1", 4: "2x2", 8: "2x4", 16: "4x4", 32: "4x8", 64: "8x8", 128: "8x16"}
_GRID_2D |= {256: "16x16"}


def grid_name(topo: Topology) -> str:
    """libtpu's name of the slice's chip grid, e.g. `v5p:4x4x8` for v5p-256."""
    grids = _GRID_2D if topo.chip.generation in ("v5e", "v6e") else _GRID_3D
    return f"{topo.chip.generation}:{grids[topo.chips]}"


def topology(name: str) -> Topology:
    """A slice by its accelerator-type name (`v5p-256`; `v5litepod-16` is `v5e-16`) or its chip
    grid (`v5p:4x4x8`)."""
    key = name.strip().lower().replace("v5litepod-", "v5e-")
    for t in slices():
        if key == grid_name(t):
            return t
    for t in slices():
        if t.name == key:
            return t
    raise PlanError(f"unknown TPU topology {name!r}; known: {', '.join(known_topologies())}")


# --------------------------------------------------------------------------- real hardware
def check_hardware(topo: Topology, devices, process_count: int) -> Optional[str]:
    """Refuse (PlanError) devices that are not the slice `topo`; a warning (or None) when only
    the device kind string differs from the table's (those strings are an assumption)."""
    platforms = sorted({d.platform for d in devices})
    kinds = sorted({d.device_kind for d in devices})
    if platforms != ["tpu"] or len(devices) != topo.chips or process_count != topo.hosts:
        raise PlanError(
            f"--tpu {topo.name} expects {topo.chips} TPU {topo.chip.generation} chips on "
            f"{topo.hosts} host(s) ({topo.chips_per_host} per host); found {len(devices)} "
            f"{'/'.join(platforms)} device(s) ({', '.join(kinds)}) in {process_count} "
            f"process(es). Run the same command on every worker of a {topo.name} slice "
            "(`tpu/pod.sh launch` runs it on all workers), or add --dry-run to print the plan "
            "here"
        )
    if not set(kinds) <= set(topo.chip.kinds):
        return (
            f"--tpu {topo.name}: devices report kind {kinds}, the table expects "
            f"{list(topo.chip.kinds)}; check the topology name"
        )
    return None
