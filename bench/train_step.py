"""Train-step benchmark: tokens/s and MFU on this machine, and log-prob peak memory at 152k vocab.

    python bench/train_step.py                      # both parts, CPU, one device
    python bench/train_step.py --part step --seq 2048 --layers 8
    python bench/train_step.py --part memory
    python bench/train_step.py --part dense-ab      # 2-D matmuls vs [B, T, ...] einsums

MFU is measured against the same run's matmul peak (a large fp32/bf16 `jnp.dot` timed right
before and after each timed step; the median of `--steps` rounds), so the ratio holds on a shared,
noisy machine; "mfu_cpu_time" is the same ratio in FLOP per process CPU-second, which other jobs
disturb much less (the two agree on a quiet machine). Model FLOPs per token come from
`models.transformer.num_flops_per_token` (6N + attention); the log-prob chunks' recomputed
LM-head forward is not counted (MFU counts model FLOPs, not hardware FLOPs).

The memory part compiles (does not run) forward+backward of the log-prob computation for one
row at Qwen2.5's vocabulary (151,936) and hidden size 896 and reads XLA's temp-buffer size from
`compiled.memory_analysis()`, with and without chunking, at several sequence lengths.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from scalerl_jax import mesh as mesh_lib
from scalerl_jax.config import LossConfig, MeshConfig, ModelConfig, OptimConfig
from scalerl_jax.models.transformer import num_flops_per_token
from scalerl_jax.train import state as state_lib
from scalerl_jax.train.batch import TrainBatch
from scalerl_jax.train.logprobs import token_logprobs
from scalerl_jax.train.step import make_train_step


def matmul_peak(n: int, dtype, repeats: int = 5) -> tuple[float, float]:
    """(FLOP per wall second, FLOP per process CPU second) of an n x n x n matmul, best of
    `repeats`. CPU time counts only this process's threads, so other jobs on a shared machine
    disturb it much less than wall time."""
    a = jnp.ones((n, n), dtype)
    b = jnp.ones((n, n), dtype)
    f = jax.jit(lambda x, y: jnp.dot(x, y, preferred_element_type=jnp.float32))
    f(a, b).block_until_ready()
    best, best_cpu = float("inf"), float("inf")
    for _ in range(repeats):
        t, c = time.perf_counter(), time.process_time()
        f(a, b).block_until_ready()
        best = min(best, time.perf_counter() - t)
        best_cpu = min(best_cpu, time.process_time() - c)
    return 2.0 * n**3 / best, 2.0 * n**3 / best_cpu


def synthetic_batch(rows: int, seq: int, vocab: int, num_prompts: int, seed: int = 0):
    """Full-length rows (no padding) with random tokens, +-1 advantages and a 3/4 loss mask."""
    rng = np.random.default_rng(seed)
    shape = (1, rows, seq)
    tokens = rng.integers(0, vocab, shape).astype(np.int32)
    mask = np.zeros(shape, bool)
    mask[..., seq // 4 :] = True  # the first quarter plays the prompt
    pidx = (np.arange(rows) // max(rows // num_prompts, 1)).astype(np.int32)[None]
    return TrainBatch(
        tokens=tokens,
        targets=np.roll(tokens, -1, axis=-1),
        positions=np.broadcast_to(np.arange(seq, dtype=np.int32), shape).copy(),
        segment_ids=np.ones(shape, np.int32),
        loss_mask=mask,
        behaviour_logp=np.full(shape, -np.log(vocab), np.float32),
        advantages=rng.choice([-1.0, 1.0], (1, rows)).astype(np.float32),
        prompt_index=np.minimum(pidx, num_prompts - 1),
        num_prompts=num_prompts,
    )


def build_step(args):
    """(cfg, jitted step, fresh state, batch) of the bench model at the command line's shape."""
    cfg = ModelConfig(
        name="bench-mid",
        vocab_size=args.vocab,
        hidden_size=args.d,
        intermediate_size=args.ffn,
        num_layers=args.layers,
        num_heads=args.heads,
        num_kv_heads=args.kv_heads,
        compute_dtype=args.dtype,
        max_position_embeddings=max(args.seq, 2048),
        remat=args.remat,
    )
    mesh = mesh_lib.trainer_mesh(MeshConfig(fsdp=-1), jax.devices())
    return (cfg, *cispo_step(cfg, mesh, args.rows, args.seq, args.chunk))


def cispo_step(cfg, mesh, rows: int, seq: int, chunk):
    """(jitted step, fresh state, host batch) of the CISPO train step of `cfg` on `mesh`, with
    a synthetic batch of `rows` x `seq` tokens and log-prob chunks of `chunk` positions."""
    ocfg = OptimConfig(learning_rate=1e-6, warmup_steps=0, logprob_chunk=chunk)
    num_prompts = max(rows // 2, 1)
    _, graphdef, state = state_lib.create_train_state(cfg, ocfg, mesh)
    _, abstract = state_lib.abstract_train_state(cfg, ocfg, mesh)
    step = make_train_step(
        graphdef,
        abstract,
        mesh,
        model_cfg=cfg,
        loss_cfg=LossConfig(),
        optim_cfg=ocfg,
        num_prompts=num_prompts,
    )
    return step, state, synthetic_batch(rows, seq, cfg.vocab_size, num_prompts)


def bench_step(args) -> dict:
    cfg, step, state, batch = build_step(args)
    t = time.perf_counter()
    state, metrics = step(state, batch)
    jax.block_until_ready(metrics)
    first_s = time.perf_counter() - t
    # Rounds of (peak, step, peak), as bench/model.py: each step is compared with the peak
    # measured around it and the median round is reported, in wall and in CPU seconds.
    tokens = args.rows * args.seq
    flops = num_flops_per_token(cfg, args.seq, training=True) * tokens
    rounds = []
    for _ in range(args.steps):
        before = matmul_peak(args.peak_n, jnp.dtype(args.dtype), 3)
        t, c = time.perf_counter(), time.process_time()
        state, metrics = step(state, batch)
        jax.block_until_ready(metrics)
        dt, dc = time.perf_counter() - t, time.process_time() - c
        after = matmul_peak(args.peak_n, jnp.dtype(args.dtype), 3)
        peak, peak_cpu = (before[0] + after[0]) / 2, (before[1] + after[1]) / 2
        rounds.append((flops / dt / peak, flops / dc / peak_cpu, dt, peak, os.getloadavg()[0]))
    mfu, _, dt, peak, load = sorted(rounds)[len(rounds) // 2]
    mfu_cpu = float(np.median([r[1] for r in rounds]))
    return {
        "part": "step",
        "params_M": round(cfg.num_params() / 1e6, 1),
        "seq": args.seq,
        "rows": args.rows,
        "dtype": args.dtype,
        "devices": len(jax.devices()),
        "first_step_s": round(first_s, 1),
        "step_s": round(dt, 3),
        "tokens_per_s": round(tokens / dt, 1),
        "model_tflops_per_s": round(flops / dt / 1e12, 4),
        "matmul_peak_tflops_per_s": round(peak / 1e12, 4),
        "mfu_vs_matmul_peak": round(mfu, 3),
        "mfu_cpu_time": round(mfu_cpu, 3),
        "mfu_rounds": [round(r[0], 3) for r in rounds],
        "mfu_cpu_rounds": [round(r[1], 3) for r in rounds],
        "load_average": round(load, 1),
        "loss": float(metrics["loss"]),
        "skipped": float(metrics["skipped_total"]),
    }


def bench_dense_ab(args) -> dict:
    """The step with `layers.dense` (projections as 2-D matmuls) against the same step with
    `dense` swapped for an einsum of the same contraction (what it replaced), both built in
    this process and alternated for `--steps` rounds: step seconds per round and the ratio."""
    import string

    from scalerl_jax.models import layers, transformer
    from scalerl_jax.train import logprobs

    def dense_einsum(x, w, contract=1, preferred_element_type=None):
        lead = string.ascii_lowercase[: x.ndim - contract]
        k, out = string.ascii_uppercase[:contract], string.ascii_uppercase[contract : w.ndim]
        return jnp.einsum(
            f"{lead}{k},{k}{out}->{lead}{out}", x, w, preferred_element_type=preferred_element_type
        )

    runs, original = {}, layers.dense
    try:
        for name, fn in (("einsum", dense_einsum), ("dense", original)):
            for module in (layers, transformer, logprobs):  # read when the step is traced
                module.dense = fn
            _, step, state, batch = build_step(args)
            state, metrics = step(state, batch)
            jax.block_until_ready(metrics)
            runs[name] = [step, state, []]
    finally:
        for module in (layers, transformer, logprobs):
            module.dense = original
    for _ in range(args.steps):
        for run in runs.values():
            t = time.perf_counter()
            run[1], metrics = run[0](run[1], batch)
            jax.block_until_ready(metrics)
            run[2].append(time.perf_counter() - t)
    ratios = [d / e for d, e in zip(runs["dense"][2], runs["einsum"][2])]
    return {
        "part": "dense-ab",
        "dtype": args.dtype,
        "rows": args.rows,
        "seq": args.seq,
        "einsum_step_s": [round(x, 3) for x in runs["einsum"][2]],
        "dense_step_s": [round(x, 3) for x in runs["dense"][2]],
        "dense_over_einsum": [round(r, 3) for r in ratios],
        "median": round(float(np.median(ratios)), 3),
        "load_average": round(os.getloadavg()[0], 1),
    }


def logprob_temp_bytes(seq: int, chunk, d: int = 896, vocab: int = 151936, rows: int = 1):
    """XLA temp bytes of forward+backward of the log-prob computation (compiled, not run)."""

    def f(hidden, kernel, targets, weights):
        logp, entropy = token_logprobs(hidden, kernel, targets, chunk_size=chunk)
        return jnp.sum(weights * logp) + jnp.sum(jax.lax.stop_gradient(entropy))

    args = (
        jax.ShapeDtypeStruct((rows, seq, d), jnp.bfloat16),
        jax.ShapeDtypeStruct((d, vocab), jnp.float32),
        jax.ShapeDtypeStruct((rows, seq), jnp.int32),
        jax.ShapeDtypeStruct((rows, seq), jnp.float32),
    )
    compiled = jax.jit(jax.grad(f, argnums=(0, 1))).lower(*args).compile()
    return compiled.memory_analysis().temp_size_in_bytes


def bench_memory(args) -> list[dict]:
    out = []
    for seq in args.mem_seqs:
        for chunk in (None, args.mem_chunk):
            b = logprob_temp_bytes(seq, chunk)
            out.append(
                {
                    "part": "memory",
                    "vocab": 151936,
                    "hidden": 896,
                    "rows": 1,
                    "seq": seq,
                    "chunk": chunk,
                    "temp_MiB": round(b / 2**20, 1),
                    "fp32_logits_MiB": round(seq * 151936 * 4 / 2**20, 1),
                }
            )
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--part", choices=("step", "memory", "all", "dense-ab"), default="all")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--d", type=int, default=512)
    p.add_argument("--ffn", type=int, default=1536)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=32768)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--rows", type=int, default=4)
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    p.add_argument("--chunk", type=int, default=512)
    p.add_argument("--remat", action="store_true")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--peak-n", type=int, default=2048)
    p.add_argument("--mem-seqs", type=int, nargs="+", default=[1024, 4096, 16384])
    p.add_argument("--mem-chunk", type=int, default=512)
    args = p.parse_args()
    results = []
    if args.part in ("step", "all"):
        results.append(bench_step(args))
    if args.part in ("memory", "all"):
        results.extend(bench_memory(args))
    if args.part == "dense-ab":
        results.append(bench_dense_ab(args))
    for r in results:
        print(json.dumps(r))


if __name__ == "__main__":
    main()
