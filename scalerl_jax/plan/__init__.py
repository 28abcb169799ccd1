"""Resource plans for TPU slices (`experiments/run.py --tpu TOPOLOGY [--dry-run]`).

  topology.py   the slice table (hosts, chips per host, HBM, bf16 peak, HBM bandwidth) and the
                check that this machine is the named slice
  estimate.py   memory per chip (params, optimizer, gradients, activations with and without
                remat, one weight-sync group, sampler weights in their dtype of use, KV
                cache) and step time (FLOPs, MFU, decode bandwidth)
  planner.py    resolution: roles, trainer / sampler meshes, micro-batches, remat, slots; the
                printout and the one-line reason a plan cannot run
  local.py      the same estimate for the config on this machine's devices (host RAM on CPU,
                device memory elsewhere), checked before a run allocates (`plan.local`)
  aot.py        `--compile`: every program of the run compiled ahead of time for the slice
                (libtpu's description of it, no TPU) or this host's devices, XLA's memory and
                cost analysis against the chip and the estimate (imported on its own: jax)

Pure functions of the config and the table: importing or calling them touches no device
(except `local.detect`, which asks jax for this host's devices, and aot.py).
"""

from scalerl_jax.plan import local
from scalerl_jax.plan.estimate import (
    GIB,
    Assumptions,
    Layout,
    SamplerMemory,
    StepTime,
    TrainerMemory,
    activation_bytes,
    kv_cache_bytes,
    param_bytes,
    param_inventory,
    rows_per_chip,
    sampler_memory,
    sampler_param_bytes,
    seq_len,
    shard_elements,
    step_time,
    sync_group_bytes,
    trainer_memory,
)
from scalerl_jax.plan.planner import PLANNED, Plan, explain, format_plan, resolve, smallest_fitting
from scalerl_jax.plan.topology import (
    CHIPS,
    Chip,
    PlanError,
    Topology,
    check_hardware,
    known_topologies,
    slices,
    topology,
)

__all__ = [
    "CHIPS",
    "GIB",
    "PLANNED",
    "Assumptions",
    "Chip",
    "Layout",
    "Plan",
    "PlanError",
    "SamplerMemory",
    "StepTime",
    "Topology",
    "TrainerMemory",
    "activation_bytes",
    "check_hardware",
    "explain",
    "format_plan",
    "known_topologies",
    "kv_cache_bytes",
    "local",
    "param_bytes",
    "param_inventory",
    "resolve",
    "rows_per_chip",
    "sampler_memory",
    "sampler_param_bytes",
    "seq_len",
    "shard_elements",
    "slices",
    "smallest_fitting",
    "step_time",
    "sync_group_bytes",
    "topology",
    "trainer_memory",
]
