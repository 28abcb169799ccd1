"""Sampler benchmark: decode throughput, continuous vs static batching, KV cache vs recompute.

    .venv/bin/python bench/sampler.py            # ~2 minutes on 2 CPU cores
    .venv/bin/python bench/sampler.py --quick    # smoke run

1. Mixed-length workload (random small model; generation ends on any of `--eos` token ids, so
   lengths are geometric with mean ~vocab/eos, capped at --max-new): decode tokens/s and slot
   utilisation (useful tokens / slot-steps) under continuous batching, for 1 and 4 decode steps
   per call, and under static batching (a batch waits for its longest sequence), where
   utilisation is bounded by mean/max length of the batch.
2. One decode step with the KV cache vs recomputing the full forward over the whole sequence to
   get the next token, at --seq tokens.
All ratios are measured within one run (the machine may be shared).
"""

from __future__ import annotations

import argparse
import itertools
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from scalerl_jax.config import ModelConfig, SamplerConfig
from scalerl_jax.models import transformer
from scalerl_jax.sampler import Driver, Engine, Prompt, prefill_buckets

MODEL = ModelConfig(
    name="bench-small",
    vocab_size=1024,
    hidden_size=128,
    intermediate_size=384,
    num_layers=4,
    num_heads=4,
    num_kv_heads=2,
    max_position_embeddings=4096,
)


def random_params(engine, seed=0):
    rng = np.random.default_rng(seed)

    def init(path, a):
        scale = "scale" in jax.tree_util.keystr(path)
        return (np.ones(a.shape) if scale else rng.normal(0, 0.02, a.shape)).astype(a.dtype)

    return engine.load_params(jax.tree.map_with_path(init, engine.abstract_params))


def prompt_stream(seed=0):
    """Endless prompts of 8..63 tokens: PipelineRL never runs out of prompts."""
    rng = np.random.default_rng(seed)
    for i in itertools.count():
        yield Prompt(f"p{i}", rng.integers(16, MODEL.vocab_size, rng.integers(8, 64)).tolist())


def run_driver(engine, params, args, continuous):
    """Steady state: warm up (compiles, first fills), then time a fixed number of decode steps."""
    lengths = []
    driver = Driver(
        engine,
        params,
        prompt_stream(),
        group_size=args.group,
        eos_ids=list(range(args.eos)),
        continuous=continuous,
        on_group=lambda g: lengths.extend(len(c.tokens) for c in g.completions),
    )
    buckets = len(prefill_buckets(engine.max_prefill_length))
    while driver.stats["decode_steps"] < args.warmup or engine.traces.get("prefill", 0) < buckets:
        driver.step()
    before = dict(driver.stats)
    t0 = time.perf_counter()
    while driver.stats["decode_steps"] - before["decode_steps"] < args.steps:
        driver.step()
    wall = time.perf_counter() - t0
    d = {k: driver.stats[k] - before[k] for k in before}
    return dict(
        tokens=d["tokens"],
        wall_s=wall,
        tok_s=d["tokens"] / wall,
        utilisation=d["tokens"] / d["slot_steps"],
        decode_steps=d["decode_steps"],
        mean_len=np.mean(lengths),
        max_len=np.max(lengths),
        host_frac=d["time_host"] / wall,
        prefill_frac=d["time_prefill"] / wall,
    )


def bench_batching(args, mesh):
    rows = []
    for k, continuous in ((1, True), (args.steps_per_call, True), (1, False)):
        cfg = SamplerConfig(
            max_concurrent_decodes=args.slots,
            max_prefill_length=64,
            max_target_length=64 + args.max_new,
            max_new_tokens=args.max_new,
            interruptions=False,
            decode_steps_per_call=k,
        )
        engine = Engine(MODEL, mesh, cfg)
        r = run_driver(engine, random_params(engine), args, continuous)
        r.update(mode="continuous" if continuous else "static", steps_per_call=k)
        rows.append(r)
        print(
            f"{r['mode']:>10} K={k}: {r['tokens']:6d} tokens in {r['wall_s']:6.2f} s = "
            f"{r['tok_s']:7.0f} tok/s, slot utilisation {r['utilisation']:.3f} over "
            f"{r['decode_steps']} steps (completion length mean {r['mean_len']:.1f}, max "
            f"{r['max_len']}; host {r['host_frac']:.0%}, prefill {r['prefill_frac']:.0%} "
            f"of wall)",
            flush=True,
        )
    cont, static = rows[0], rows[2]
    print(
        f"continuous/static: utilisation x{cont['utilisation'] / static['utilisation']:.2f}, "
        f"tokens/s x{cont['tok_s'] / static['tok_s']:.2f}; "
        f"K={args.steps_per_call}/K=1 tokens/s x{rows[1]['tok_s'] / cont['tok_s']:.2f}"
    )
    return rows


def bench_kv_cache(args, mesh):
    t, b = args.seq, args.cache_batch
    cfg = SamplerConfig(
        max_concurrent_decodes=b,
        max_prefill_length=t,
        max_target_length=t + 64,
        interruptions=False,
    )
    engine = Engine(MODEL, mesh, cfg)
    params = random_params(engine)
    tokens = np.random.default_rng(0).integers(16, MODEL.vocab_size, t).astype(np.int32)
    state = engine.bulk_insert(
        engine.prefill(params, tokens, t), engine.init_decode_state(), list(range(b))
    )
    state, _ = engine.generate(params, state)
    jax.block_until_ready(state)
    n = args.reps
    t0 = time.perf_counter()
    for _ in range(n):
        state, res = engine.generate(params, state)
    jax.block_until_ready(res)
    decode = (time.perf_counter() - t0) / n

    @jax.jit
    def next_token_by_recompute(p, seq):  # what a cache-less sampler does for every token
        logits = transformer.forward_logits(engine.graphdef, p, seq)[:, -1]
        return jnp.argmax(logits, -1)

    seq = jnp.asarray(np.tile(tokens, (b, 1)))
    jax.block_until_ready(next_token_by_recompute(params, seq))
    reps = max(2, n // 20)
    t0 = time.perf_counter()
    for _ in range(reps):
        out = next_token_by_recompute(params, seq)
    jax.block_until_ready(out)
    full = (time.perf_counter() - t0) / reps
    print(
        f"KV cache at {t} tokens, batch {b}: decode step {decode * 1e3:.2f} ms vs full "
        f"forward {full * 1e3:.1f} ms per token -> x{full / decode:.0f}"
    )
    return dict(
        seq=t, batch=b, decode_ms=decode * 1e3, full_forward_ms=full * 1e3, speedup=full / decode
    )


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--slots", type=int, default=16)
    ap.add_argument("--steps", type=int, default=600, help="timed decode steps per mode")
    ap.add_argument("--warmup", type=int, default=64)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument(
        "--eos", type=int, default=32, help="eos ids among the 1024: mean length ~1024/eos"
    )
    ap.add_argument("--max-new", type=int, default=160)
    ap.add_argument("--steps-per-call", type=int, default=4)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--cache-batch", type=int, default=4)
    ap.add_argument("--reps", type=int, default=40)
    args = ap.parse_args()
    if args.quick:
        args.steps, args.warmup, args.max_new, args.seq, args.reps = 100, 16, 64, 256, 10
    mesh = Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("data", "tensor"))
    print(
        f"model {MODEL.name}: {MODEL.num_params() / 1e6:.1f}M params; devices "
        f"{jax.devices()[0].platform} x1; {args.slots} slots, "
        f"{args.group} samples per prompt",
        flush=True,
    )
    bench_batching(args, mesh)
    bench_kv_cache(args, mesh)


if __name__ == "__main__":
    main()
