"""Weight sync trainer mesh -> sampler mesh: time per sync, the most bytes one trainer device
holds for a gathered group, and the sampler's weight bytes, for the trainer's fp32 weights in
one group (the old behaviour) against weights cast to their dtype of use in bounded groups.

One process, 8 CPU devices: trainer fsdp=4 on devices 0-3, sampler data=2 x tensor=2 on 4-7.
The modes alternate within each round, so a ratio compares like with like on a loaded machine.

    .venv/bin/python bench/weight_sync.py            # 58M params, bf16 compute, 5 rounds
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import numpy as np

from scalerl_jax import mesh as mesh_lib
from scalerl_jax.config import MeshConfig, ModelConfig, SamplerConfig
from scalerl_jax.sampler import Engine, WeightSync

MIB = 1 << 20


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    cfg = ModelConfig(
        name="sync-bench",
        vocab_size=32000,
        hidden_size=args.hidden,
        intermediate_size=4 * args.hidden,
        num_layers=args.layers,
        num_heads=args.hidden // 64,
        num_kv_heads=max(1, args.hidden // 256),
        rope_theta=1e4,
        max_position_embeddings=4096,
        compute_dtype="bfloat16",
    )
    devices = jax.devices()
    trainer = mesh_lib.trainer_mesh(MeshConfig(fsdp=-1), devices[:4])
    sampler = mesh_lib.sampler_mesh(MeshConfig(sampler_tensor=2), devices[4:8])
    sc = SamplerConfig(
        max_concurrent_decodes=2, max_prefill_length=8, max_target_length=16, interruptions=False
    )
    engines = {
        "param": Engine(cfg, sampler, SamplerConfig(**{**sc.__dict__, "weight_dtype": "param"})),
        "compute": Engine(cfg, sampler, sc),
    }
    rng = np.random.default_rng(0)
    host = jax.tree.map(
        lambda a: rng.normal(0, 0.02, a.shape).astype(np.float32), engines["param"].abstract_params
    )
    master = jax.device_put(
        host, mesh_lib.state_shardings(engines["param"].abstract_params, trainer)
    )
    biggest = max(x.nbytes for x in jax.tree.leaves(host))
    modes = {  # name: (engine, group bytes)
        "fp32, one group (before)": ("param", None),
        "dtype of use, one group": ("compute", None),
        "dtype of use, 16 MiB groups": ("compute", 16 * MIB),
        "dtype of use, 4 MiB groups": ("compute", 4 * MIB),
    }
    syncs = {
        name: WeightSync(trainer, engines[e].param_shardings, engines[e].param_dtypes, g)
        for name, (e, g) in modes.items()
    }
    times = {name: [] for name in modes}
    out = {}
    for name, sync in syncs.items():  # warm-up: compile every group's program
        out[name] = jax.block_until_ready(sync(master))
    for _ in range(args.rounds):
        for name, sync in syncs.items():
            t0 = time.perf_counter()
            jax.block_until_ready(sync(master))
            times[name].append(time.perf_counter() - t0)
    n = sum(x.size for x in jax.tree.leaves(host))
    print(
        f"model {n / 1e6:.1f}M params (largest array {biggest / MIB:.1f} MiB fp32), "
        f"trainer fsdp=4 -> sampler data=2 x tensor=2, {args.rounds} alternating rounds, "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    base = np.median(times["fp32, one group (before)"])
    for name, sync in syncs.items():
        per_chip = sum(x.addressable_shards[0].data.nbytes for x in jax.tree.leaves(out[name]))
        med = np.median(times[name])
        print(
            f"  {name:<28} groups {len(sync.groups):3d}  largest group per trainer device "
            f"{sync.largest_group_bytes / MIB:7.2f} MiB  sampler weights per device "
            f"{per_chip / MIB:7.2f} MiB  sync {med * 1e3:7.1f} ms (x{med / base:.2f})"
        )


if __name__ == "__main__":
    main()
