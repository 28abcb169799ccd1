"""Forward+backward throughput and MFU of a small mixture-of-experts decoder against the dense
decoder with the same active parameters, in one run.

Both models share everything but the FFN: the MoE has E experts of width F_e, top-k routed
(sorted dispatch + `jax.lax.ragged_dot`, models/moe.py), the dense one a single FFN of width
k x F_e, so a token does the same matmul work in both (the MoE adds only its [D, E] router).
Model FLOPs are `transformer.num_flops_per_token`, which counts active parameters only; MFU is
those FLOPs per second over the same run's `jnp.dot` peak (bench/model.py's method: rounds of
peak, step, peak and the median round).

    .venv/bin/python bench/moe.py                      # 16 experts top-2, d=512, seq 512, fp32
    python bench/moe.py --experts 64 --top-k 8 --dtype bfloat16   # on an accelerator
"""

from __future__ import annotations

import argparse
import os

import jax
import jax.numpy as jnp

from model import compiled_step, mfu_rounds  # bench/model.py, beside this script
from scalerl_jax.config import ModelConfig
from scalerl_jax.models import transformer


def configs(args) -> tuple[ModelConfig, ModelConfig]:
    base = dict(
        vocab_size=32000,
        hidden_size=args.hidden,
        num_layers=args.layers,
        num_heads=args.hidden // 64,
        num_kv_heads=max(1, args.hidden // 256),
        rope_theta=500000.0,
        max_position_embeddings=8192,
        param_dtype=args.dtype,
        compute_dtype=args.dtype,
    )
    moe = ModelConfig(
        name=f"moe-{args.experts}x{args.expert_size}-top{args.top_k}",
        intermediate_size=args.expert_size,
        num_experts=args.experts,
        experts_per_token=args.top_k,
        moe_intermediate_size=args.expert_size,
        **base,
    )
    dense = ModelConfig(
        name=f"dense-{args.top_k * args.expert_size}",
        intermediate_size=args.top_k * args.expert_size,
        **base,
    )
    return moe, dense


def measure(cfg: ModelConfig, args, dtype) -> dict:
    run_step, compile_s = compiled_step(cfg, args.batch, args.seq)
    n_tokens = args.batch * args.seq
    flops = transformer.num_flops_per_token(cfg, args.seq, training=True) * n_tokens
    rounds = mfu_rounds(run_step, flops, dtype, args.peak_n, args.steps)
    mfu, _, step_s, _ = sorted(rounds)[len(rounds) // 2]
    return dict(
        cfg=cfg,
        compile_s=compile_s,
        step_s=step_s,
        tokens_s=n_tokens / step_s,
        mfu=mfu,
        mfu_cpu=sorted(r[1] for r in rounds)[len(rounds) // 2],
        tflops=flops / step_s / 1e12,
    )


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--experts", type=int, default=16)
    p.add_argument("--top-k", type=int, default=2)
    p.add_argument("--expert-size", type=int, default=512)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--dtype", default="float32", help="param and compute dtype")
    p.add_argument("--steps", type=int, default=3, help="timed rounds (the median is reported)")
    p.add_argument("--peak-n", type=int, default=2048, help="matmul size for the peak")
    args = p.parse_args()
    dtype = jnp.dtype(args.dtype)
    print(
        f"device {jax.devices()[0].device_kind} x{jax.device_count()} "
        f"({os.cpu_count()} host cores); batch x seq {args.batch} x {args.seq}, {args.dtype}"
    )
    results = [measure(cfg, args, dtype) for cfg in configs(args)]
    print(
        f"{'model':<26} {'total':>8} {'active':>8} {'compile':>8} {'step':>8} "
        f"{'tokens/s':>9} {'TFLOP/s':>8} {'MFU':>6} {'MFU cpu':>8}"
    )
    for r in results:
        c = r["cfg"]
        print(
            f"{c.name:<26} {c.num_params() / 1e6:>7.1f}M {c.num_params(active=True) / 1e6:>7.1f}M"
            f" {r['compile_s']:>7.1f}s {r['step_s'] * 1e3:>6.0f}ms {r['tokens_s']:>9.1f} "
            f"{r['tflops']:>8.3f} {100 * r['mfu']:>5.1f}% {100 * r['mfu_cpu']:>7.1f}%"
        )
    moe, dense = results
    print(f"MoE / dense tokens/s: x{moe['tokens_s'] / dense['tokens_s']:.2f}")


if __name__ == "__main__":
    main()
