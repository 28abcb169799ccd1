"""Forward+backward throughput of the decoder and its model-FLOPs utilisation (MFU).

The peak is this machine's own dense matmul rate, measured in the same run (a large `jnp.dot`
in the benchmark dtype), so the ratio holds on a shared, noisy machine. Model FLOPs are
`transformer.num_flops_per_token` (6·N per token for the weights plus causal attention), i.e.
the useful work: the masked-out upper half of the attention scores is not counted.

    .venv/bin/python bench/model.py             # ~200M-param Llama-shaped model, seq 512, fp32
    python bench/model.py --seq 1024 --batch 1
    python bench/model.py --preset qwen2.5-0.5b --dtype bfloat16   # on an accelerator
"""

from __future__ import annotations

import argparse
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from scalerl_jax.config import ModelConfig
from scalerl_jax.models import presets, transformer

# ~200M parameters, Llama-3 shaped (GQA 4:1, SwiGLU), 32k vocabulary.
MID = ModelConfig(
    name="mid-200m",
    vocab_size=32000,
    hidden_size=1024,
    intermediate_size=2816,
    num_layers=12,
    num_heads=16,
    num_kv_heads=4,
    rope_theta=500000.0,
    max_position_embeddings=8192,
)


def timed(fn, repeats: int = 1) -> tuple[float, float]:
    """(wall, process CPU) seconds of the fastest of `repeats` calls. CPU time counts only this
    process's threads, so it is far less disturbed by other jobs on a shared machine."""
    best = (float("inf"), float("inf"))
    for _ in range(repeats):
        wall, cpu = time.perf_counter(), time.process_time()
        jax.block_until_ready(fn())
        best = min(best, (time.perf_counter() - wall, time.process_time() - cpu))
    return best


def matmul_peak(dtype, n: int, repeats: int) -> tuple[float, float]:
    """FLOP per wall second and per CPU second of an [n, n] @ [n, n] matmul: the machine's dense
    peak as XLA reaches it."""
    a = jax.random.normal(jax.random.key(0), (n, n), dtype)
    b = jax.random.normal(jax.random.key(1), (n, n), dtype)
    dot = jax.jit(lambda a, b: jnp.dot(a, b, preferred_element_type=dtype))
    dot(a, b).block_until_ready()
    wall, cpu = timed(lambda: dot(a, b), repeats)
    return 2 * n**3 / wall, 2 * n**3 / cpu


def train_step_fn(graphdef):
    """Loss and gradients of next-token cross-entropy: the work of one training step minus the
    optimizer update (which is O(N), not O(N·T))."""

    def loss_fn(params, tokens):
        model = nnx.merge(graphdef, params)
        logits = model.logits(model(tokens[:, :-1]))
        logp = jax.nn.log_softmax(logits, axis=-1)
        return -jnp.mean(jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1))

    return jax.jit(jax.value_and_grad(loss_fn))


def compiled_step(cfg: ModelConfig, batch: int, seq: int):
    """(run_step, compile seconds): one fwd+bwd of random params on a fixed random batch."""
    graphdef, params = random_params(cfg)
    tokens = jnp.asarray(
        np.random.RandomState(1).randint(0, cfg.vocab_size, (batch, seq + 1)), jnp.int32
    )
    step = train_step_fn(graphdef)
    run_step = lambda: step(params, tokens)  # noqa: E731
    return run_step, timed(run_step)[0]


def mfu_rounds(run_step, flops: float, dtype, peak_n: int, steps: int) -> list:
    """`steps` rounds of (peak, step, peak): the machine is shared, so each step is compared with
    the peak measured right around it; callers report the median round. The same ratio in CPU
    seconds (FLOP per CPU-second of the model vs of the matmul) is the steadier figure.
    Returns [(mfu, mfu_cpu, step_s, peak)]."""
    rounds = []
    for _ in range(steps):
        before = matmul_peak(dtype, peak_n, 2)
        step_s, step_cpu = timed(run_step)
        after = matmul_peak(dtype, peak_n, 2)
        peak, peak_cpu = (before[0] + after[0]) / 2, (before[1] + after[1]) / 2
        rounds.append((flops / step_s / peak, flops / step_cpu / peak_cpu, step_s, peak))
    return rounds


def random_params(cfg: ModelConfig, seed: int = 0):
    # Host-side numpy init: the benchmark measures the step, not parameter creation.
    graphdef, params = nnx.split(
        nnx.eval_shape(lambda: transformer.Transformer(cfg, nnx.Rngs(params=0)))
    )
    rng = np.random.RandomState(seed)
    for path, v in nnx.to_flat_state(params):
        shape = v.get_value().shape
        x = np.ones(shape) if path[-1] == "scale" else 0.02 * rng.standard_normal(shape)
        v.set_value(jnp.asarray(x, cfg.param_dtype))
    return graphdef, params


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--preset", default=None, help="a models.presets name instead of mid-200m")
    p.add_argument("--layers", type=int, default=None, help="override num_layers")
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--dtype", default="float32", help="param and compute dtype")
    p.add_argument("--steps", type=int, default=5, help="timed rounds (the median is reported)")
    p.add_argument(
        "--attention-chunk",
        type=int,
        default=None,
        help="override ModelConfig.attention_chunk (0: unchunked attention)",
    )
    p.add_argument("--peak-n", type=int, default=2048, help="matmul size for the peak")
    args = p.parse_args()

    cfg = presets.get(args.preset) if args.preset else MID
    cfg = cfg.replace(param_dtype=args.dtype, compute_dtype=args.dtype)
    if args.layers:
        cfg = cfg.replace(num_layers=args.layers)
    if args.attention_chunk is not None:
        cfg = cfg.replace(attention_chunk=args.attention_chunk)
    dtype = jnp.dtype(args.dtype)
    run_step, compile_s = compiled_step(cfg, args.batch, args.seq)

    n_tokens = args.batch * args.seq
    model_flops = transformer.num_flops_per_token(cfg, args.seq, training=True) * n_tokens
    rounds = mfu_rounds(run_step, model_flops, dtype, args.peak_n, args.steps)
    median = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    mfu, step_s, peak = sorted((r[0], r[2], r[3]) for r in rounds)[len(rounds) // 2]
    mfu_cpu = median([r[1] for r in rounds])
    achieved = model_flops / step_s
    rows = [
        (
            "device",
            f"{jax.devices()[0].device_kind} x{jax.device_count()} ({os.cpu_count()} host cores)",
        ),
        (
            "model",
            f"{cfg.name}: {cfg.num_params() / 1e6:.0f}M params, {cfg.num_layers} layers, "
            f"d={cfg.hidden_size}, {args.dtype}",
        ),
        ("batch x seq", f"{args.batch} x {args.seq} (attention_chunk {cfg.attention_chunk})"),
        ("compile", f"{compile_s:.1f} s"),
        ("fwd+bwd step", f"{step_s * 1e3:.0f} ms"),
        ("tokens/s", f"{n_tokens / step_s:,.1f}"),
        ("model TFLOP/s", f"{achieved / 1e12:.3f}"),
        (f"matmul peak ({args.peak_n}^3)", f"{peak / 1e12:.3f} TFLOP/s"),
        (
            "MFU (wall)",
            f"{100 * mfu:.1f}% (median of {len(rounds)} rounds: "
            + ", ".join(f"{100 * r[0]:.0f}%" for r in rounds)
            + ")",
        ),
        (
            "MFU (CPU time)",
            f"{100 * mfu_cpu:.1f}% (rounds: "
            + ", ".join(f"{100 * r[1]:.0f}%" for r in rounds)
            + ")",
        ),
    ]
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")


if __name__ == "__main__":
    main()
