"""Accelerator figures in one call: bf16 matmul peak and HBM bandwidth, the train step's MFU,
sampler decode tokens/s against the HBM roofline, and the trainer -> sampler weight-sync time.

    python bench/accelerator.py                                   # qwen2.5-0.5b, 64 and 256 slots
    python bench/accelerator.py --preset qwen2.5-1.5b --rows 4
    python bench/accelerator.py --preset tiny-qwen2 --rows 2 --seq 64 --slots 4 --prompt 16 \\
        --new 8 --peak-n 256 --copy-mib 16                        # a smoke run on the CPU

Written so that a session lent a GPU (minutes of device time) gets every figure from one
prepared command. One device (the default backend's first) holds trainer and sampler, as on
the one-GPU machines. Each part prints one JSON line:
* peak: the best of 5 n^3 bf16 `jnp.dot`s with fp32 accumulation (TFLOP/s; bench/train_step.py's
  `matmul_peak`), and of 5 passes `x * 2` over a large fp32 array (HBM GB/s: bytes read +
  written per second).
* train: the real CISPO step (`make_train_step`) of the preset in the recipe's precision (bf16
  compute, fp32 LM head, fp32 master weights and AdamW) and `--attention` (default auto: cuDNN on
  GPUs, splash on TPUs, the XLA path elsewhere), `--rows` x `--seq` tokens: the median of
  `--steps` steps after a warm-up, model TFLOP/s (`num_flops_per_token`), MFU against the peak,
  and XLA's memory analysis of the compiled step.
* decode (per `--slots`): an Engine whose slots all hold a `--prompt`-token prefix, then `--new`
  decode steps, each call timed (median): tokens/s, and the roofline a step cannot beat, i.e.
  slots / ((sampler weight bytes + KV bytes of the filled lengths) / HBM bandwidth).
* sync: `WeightSync.for_engine` of the trainer's fp32 params into the sampler's shardings and
  dtypes (median of 5 after a warm-up).
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from scalerl_jax import mesh as mesh_lib
from scalerl_jax.config import MeshConfig, SamplerConfig
from scalerl_jax.models import presets
from scalerl_jax.models.transformer import num_flops_per_token
from scalerl_jax.sampler import Engine, WeightSync
from scalerl_jax.train.step import put_batch
from train_step import cispo_step, matmul_peak  # bench/train_step.py, beside this script

GIB = 1 << 30


def best_seconds(fn, repeats: int = 5) -> float:
    jax.block_until_ready(fn())
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(fn())
        best = min(best, time.perf_counter() - t)
    return best


def bench_peak(args, device) -> dict:
    flops = matmul_peak(args.peak_n, jnp.bfloat16)[0]  # on the default device
    x = jax.device_put(jnp.ones(((args.copy_mib << 20) // 4,), jnp.float32), device)
    double = jax.jit(lambda v: v * 2)
    bandwidth = 2.0 * x.nbytes / best_seconds(lambda: double(x))
    return {
        "part": "peak",
        "device": str(device.device_kind),
        "platform": device.platform,
        # Significant digits, not decimals: a small smoke-run matmul on a busy CPU is well
        # under 0.01 TFLOP/s, and the MFU below divides by this figure.
        "bf16_matmul_tflops": float(f"{flops / 1e12:.3g}"),
        "n": args.peak_n,
        "hbm_gb_s": round(bandwidth / 1e9, 1),
        "copy_mib": args.copy_mib,
    }


def model_config(args):
    return presets.get(
        args.preset,
        param_dtype="float32",
        compute_dtype="bfloat16",
        fp32_head=True,
        attention_impl=args.attention,
        max_position_embeddings=max(args.seq, args.prompt + args.new + 1),
    )


def bench_train(args, cfg, device, peak_flops: float):
    """-> (JSON dict, trainer mesh, trainer params)."""
    mesh = mesh_lib.trainer_mesh(MeshConfig(fsdp=-1), [device])
    step, state, batch = cispo_step(cfg, mesh, args.rows, args.seq, args.chunk)
    batch = put_batch(batch, mesh)
    t = time.perf_counter()
    compiled = step.jitted.lower(state, batch).compile()  # run as it is: one compile
    compile_s = time.perf_counter() - t
    mem = compiled.memory_analysis()
    state, metrics = compiled(state, batch)  # warm-up
    jax.block_until_ready(metrics)
    times = []
    for _ in range(args.steps):
        t = time.perf_counter()
        state, metrics = compiled(state, batch)
        jax.block_until_ready(metrics)
        times.append(time.perf_counter() - t)
    dt = float(np.median(times))
    tokens = args.rows * args.seq
    flops = num_flops_per_token(cfg, args.seq, training=True) * tokens / dt
    out = {
        "part": "train",
        "preset": cfg.name,
        "params_M": round(cfg.num_params() / 1e6, 1),
        "rows": args.rows,
        "seq": args.seq,
        "attention": args.attention,
        "compile_s": round(compile_s, 1),
        "step_s": round(dt, 4),
        "step_s_rounds": [round(x, 4) for x in times],
        "tokens_per_s": round(tokens / dt, 1),
        "model_tflops": round(flops / 1e12, 3),
        "mfu": round(flops / peak_flops, 3),
        "loss": float(metrics["loss"]),
    }
    if mem is not None:
        out["memory_GiB"] = {
            k: round(getattr(mem, f"{k}_size_in_bytes") / GIB, 3)
            for k in ("argument", "output", "alias", "temp")
        }
    return out, mesh, state.params


def bench_decode(args, cfg, device, slots: int, bandwidth: float):
    """-> (JSON dict, engine)."""
    mesh = Mesh(np.array([device]).reshape(1, 1), ("data", "tensor"))
    scfg = SamplerConfig(
        max_concurrent_decodes=slots,
        max_prefill_length=args.prompt,
        max_target_length=args.prompt + args.new + 1,
        max_new_tokens=args.new,
        interruptions=False,
        decode_steps_per_call=args.steps_per_call,
    )
    engine = Engine(cfg, mesh, scfg)
    rng = np.random.default_rng(0)
    params = engine.load_params(
        jax.tree.map(
            lambda a: (rng.normal(0, 0.02, a.shape)).astype(a.dtype), engine.abstract_params
        )
    )
    prompt = rng.integers(1, cfg.vocab_size, (1, args.prompt))
    prefix = engine.prefill_batch(params, prompt, [args.prompt])
    engine.precompile(params, [args.prompt])

    def filled():
        return engine.bulk_insert(
            prefix,
            engine.init_decode_state(),
            range(slots),
            keys=rng.integers(0, 2**31, (slots, 2)),
        )

    k = args.steps_per_call
    calls = args.new // k
    state = filled()
    for i in range(calls):  # warm-up pass over every window
        state, res = engine.generate(params, state, args.prompt - 1 + i * k)
    jax.device_get(res)
    state, times = filled(), []
    for i in range(calls):
        t = time.perf_counter()
        state, res = engine.generate(params, state, args.prompt - 1 + i * k)
        jax.device_get(res)  # what a driver reads back after every call
        times.append(time.perf_counter() - t)
    step_s = float(np.median(times)) / k
    weight_bytes = sum(x.nbytes for x in jax.tree.leaves(params))
    mean_len = args.prompt + args.new / 2
    kv_bytes = (
        2
        * cfg.num_layers
        * cfg.num_kv_heads
        * cfg.dim_per_head
        * slots
        * mean_len
        * jnp.dtype(engine.cache_dtype).itemsize
    )
    roofline = slots / ((weight_bytes + kv_bytes) / bandwidth)
    return {
        "part": "decode",
        "slots": slots,
        "prompt": args.prompt,
        "new": args.new,
        "steps_per_call": k,
        "step_ms": round(step_s * 1e3, 3),
        "tokens_per_s": round(slots / step_s, 1),
        "weight_GiB": round(weight_bytes / GIB, 3),
        "kv_read_GiB_per_step": round(kv_bytes / GIB, 3),
        "roofline_tokens_per_s": round(roofline, 1),
        "of_roofline": round(slots / step_s / roofline, 3),
    }, engine


def bench_sync(trainer_mesh, engine, params) -> dict:
    sync = WeightSync.for_engine(trainer_mesh, engine)
    jax.block_until_ready(sync(params))
    times = []
    for _ in range(5):
        t = time.perf_counter()
        jax.block_until_ready(sync(params))
        times.append(time.perf_counter() - t)
    nbytes = sum(x.nbytes for x in jax.tree.leaves(params))
    return {
        "part": "sync",
        "trainer_GiB_fp32": round(nbytes / GIB, 3),
        "groups": len(sync.groups),
        "sync_s": round(float(np.median(times)), 4),
        "sync_s_rounds": [round(x, 4) for x in times],
    }


def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--preset", default="qwen2.5-0.5b")
    p.add_argument("--attention", default="auto", help="ModelConfig.attention_impl")
    p.add_argument("--rows", type=int, default=8)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--chunk", type=int, default=1024, help="OptimConfig.logprob_chunk")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--slots", type=int, nargs="+", default=[64, 256])
    p.add_argument("--prompt", type=int, default=512)
    p.add_argument("--new", type=int, default=256)
    p.add_argument("--steps-per-call", type=int, default=8)
    p.add_argument("--peak-n", type=int, default=8192)
    p.add_argument("--copy-mib", type=int, default=2048)
    args = p.parse_args(argv)
    if args.new % args.steps_per_call:
        p.error(f"--new {args.new} must be a multiple of --steps-per-call {args.steps_per_call}")
    device = jax.devices()[0]
    cfg = model_config(args)
    results = []

    def emit(d):
        results.append(d)
        print(json.dumps(d), flush=True)

    emit(bench_peak(args, device))
    peak = results[0]["bf16_matmul_tflops"] * 1e12
    bandwidth = results[0]["hbm_gb_s"] * 1e9
    train, trainer_mesh, trainer_params = bench_train(args, cfg, device, peak)
    emit(train)
    engine = None
    for slots in args.slots:
        decode, engine = bench_decode(args, cfg, device, slots, bandwidth)
        emit(decode)
    emit(bench_sync(trainer_mesh, engine, trainer_params))
    return results


if __name__ == "__main__":
    main()
