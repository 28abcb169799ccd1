"""Where the time of bench/real_model.py's operations goes, on the same checkpoint and shapes.

    .venv/bin/python bench/real_model_parts.py dots     # matmul rates at the model's shapes
    .venv/bin/python bench/real_model_parts.py train    # our train step, piece by piece
    .venv/bin/python bench/real_model_parts.py decode   # our decode step against its roofline
    .venv/bin/python bench/real_model_parts.py all --checkpoint DIR --dtypes float32 bfloat16

* dots: GFLOP/s of the model's matmuls (x @ W with x [M, D]: the q / MLP / LM-head shapes at
  M = 16 and 64 decode rows and M = rows x seq training rows) in XLA (`jnp.dot`, bf16 with a
  bf16 result and with fp32 accumulation `preferred_element_type`) and in torch (`torch.mm`),
  fp32 and bf16, best of `--repeats`, each pair measured back to back (torch's OpenMP threads
  wait passively, as in bench/real_model.py). This is the question
  behind the bf16 rows: does this CPU's bf16 path beat fp32 in each library?
* train: the full CISPO step (`make_train_step`), then separately jitted pieces at the same
  shape: forward+backward of the loss without the optimizer, the body alone (no LM head:
  gradient of a fixed projection of the final hidden states), the fp32 log-prob head alone
  (`train.logprobs.token_logprobs` fwd+bwd on fixed hidden states), the forward alone, and the
  optimizer update alone; wall median of `--repeats`, with each piece's model FLOPs rate.
* decode: one `Engine.generate` step (median over a full run of `--new` steps at `--slots`),
  against the time to stream the sampler's weights once from memory at the measured copy
  bandwidth (a decode step reads every weight once; the KV cache is small here).

Each part prints JSON lines. Load average is printed with each.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
# As bench/real_model.py's torch workers: OpenMP threads sleep at barriers instead of spinning,
# which stalls torch whenever other jobs hold the cores (set before torch is imported).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def best(fn, repeats: int, min_s: float = 0.02) -> float:
    """Seconds per call of fn, best of `repeats` samples of enough calls to last min_s."""
    fn()
    t = time.perf_counter()
    fn()
    inner = max(1, int(min_s / max(time.perf_counter() - t, 1e-6)))
    out = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(inner):
            fn()
        out = min(out, (time.perf_counter() - t) / inner)
    return out


def median_time(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def load() -> float:
    return round(os.getloadavg()[0], 1)


def part_dots(args, shape) -> list:
    import jax
    import jax.numpy as jnp
    import torch

    d, f, v = shape["hidden"], shape["mlp"], shape["vocab"]
    q = shape["heads"] * shape["head_dim"]
    rows = [m for m in args.slots] + [args.rows * (args.prompt + args.new)]
    out = []
    r = np.random.default_rng(0)
    for m in rows:
        for name, k, n in (
            ("q_proj", d, q),
            ("mlp_up", d, f),
            ("mlp_down", f, d),
            ("lm_head", d, v),
        ):
            a32 = r.standard_normal((m, k)).astype(np.float32)
            b32 = r.standard_normal((k, n)).astype(np.float32)
            rec = dict(part="dots", shape=name, m=m, k=k, n=n, load=load())
            flops = 2.0 * m * k * n
            for dt in ("float32", "bfloat16"):
                ja, jb = jnp.asarray(a32, dt), jnp.asarray(b32, dt)
                f_same = jax.jit(lambda x, y: jnp.dot(x, y))
                rec[f"jax_{dt}"] = (
                    flops / best(lambda: f_same(ja, jb).block_until_ready(), args.repeats) / 1e9
                )
                if dt == "bfloat16":
                    f_acc = jax.jit(lambda x, y: jnp.dot(x, y, preferred_element_type=jnp.float32))
                    rec["jax_bfloat16_f32acc"] = (
                        flops / best(lambda: f_acc(ja, jb).block_until_ready(), args.repeats) / 1e9
                    )
                tdt = getattr(torch, dt)
                ta, tb = torch.from_numpy(a32).to(tdt), torch.from_numpy(b32).to(tdt)
                rec[f"torch_{dt}"] = flops / best(lambda: torch.mm(ta, tb), args.repeats) / 1e9
            out.append({k: round(x, 1) if isinstance(x, float) else x for k, x in rec.items()})
            print(json.dumps(out[-1]), flush=True)
    return out


def _train_setup(args, dtype):
    import jax

    from real_model import workload_rows
    from scalerl_jax import mesh as mesh_lib
    from scalerl_jax.config import LossConfig, MeshConfig, OptimConfig
    from scalerl_jax.models import hf
    from scalerl_jax.train import state as state_lib
    from scalerl_jax.train.batch import TrainBatch
    from scalerl_jax.train.step import make_train_step, put_batch

    cfg = hf.config_from_hf(args.checkpoint).replace(
        param_dtype="float32",
        compute_dtype=dtype,
        fp32_head=True,
        max_position_embeddings=args.prompt + args.new + 1,
    )
    ocfg = OptimConfig(learning_rate=1e-6, warmup_steps=0, eps=1e-8)
    mesh = mesh_lib.trainer_mesh(MeshConfig(fsdp=-1), jax.devices()[:1])
    _, graphdef, state = state_lib.create_train_state(
        cfg, ocfg, mesh, hf_checkpoint=args.checkpoint
    )
    _, abstract = state_lib.abstract_train_state(cfg, ocfg, mesh)
    nprompts = (args.rows + 1) // 2
    step = make_train_step(
        graphdef,
        abstract,
        mesh,
        model_cfg=cfg,
        loss_cfg=LossConfig(),
        optim_cfg=ocfg,
        num_prompts=nprompts,
        donate=False,
    )
    w = workload_rows(1, args.rows, args.prompt, args.new, cfg.vocab_size)
    rows, seq = w["tokens"].shape
    mask = np.zeros((rows, seq), bool)
    mask[:, args.prompt - 1 : seq - 1] = True
    blogp = np.zeros((rows, seq), np.float32)
    blogp[:, args.prompt - 1 : seq - 1] = w["behaviour_logp"]
    batch = put_batch(
        TrainBatch(
            tokens=w["tokens"][None],
            targets=np.roll(w["tokens"], -1, axis=-1)[None],
            positions=np.broadcast_to(np.arange(seq, dtype=np.int32), (1, rows, seq)).copy(),
            segment_ids=np.ones((1, rows, seq), np.int32),
            loss_mask=mask[None],
            behaviour_logp=blogp[None],
            advantages=w["advantages"][None],
            prompt_index=w["prompt_index"][None],
            num_prompts=w["num_prompts"],
        ),
        mesh,
    )
    return cfg, ocfg, graphdef, state, step, batch


def part_train(args, dtype) -> list:
    import jax
    import jax.numpy as jnp
    import optax
    from flax import nnx

    from scalerl_jax.config import LossConfig
    from scalerl_jax.models.transformer import num_flops_per_token
    from scalerl_jax.rl import objectives as rl_losses
    from scalerl_jax.train.logprobs import token_logprobs
    from scalerl_jax.train.optim import make_optimizer
    from train_step import matmul_peak

    cfg, ocfg, graphdef, state, step, batch = _train_setup(args, dtype)
    mb = jax.tree.map(lambda x: x[0], batch)  # the one micro-batch
    seq = args.prompt + args.new
    tokens = args.rows * seq
    d, v = cfg.hidden_size, cfg.vocab_size
    total = num_flops_per_token(cfg, seq, training=True) * tokens
    head = 6.0 * d * v * tokens
    params = state.params
    nprompts = (args.rows + 1) // 2
    hp = dict(LossConfig().objective_hparams(), aggregation="prompt", entropy_coef=0.0)

    def loss_fn(p):
        model = nnx.merge(graphdef, p)
        hidden, _ = model.forward(mb.tokens, mb.positions, mb.segment_ids)
        logp, ent = token_logprobs(
            hidden, model.head_kernel(), mb.targets, chunk_size=ocfg.logprob_chunk, fp32=True
        )
        loss, _ = rl_losses.policy_loss(
            "cispo",
            logp,
            mb.behaviour_logp,
            mb.advantages,
            mb.loss_mask,
            mb.prompt_index,
            num_prompts=nprompts,
            entropy=jax.lax.stop_gradient(ent),
            **hp,
        )
        return loss

    probe = jnp.asarray(np.random.default_rng(0).standard_normal(d), jnp.float32)

    def body_fn(p):
        model = nnx.merge(graphdef, p)
        hidden, _ = model.forward(mb.tokens, mb.positions, mb.segment_ids)
        return jnp.sum(hidden.astype(jnp.float32) @ probe)

    def fwd_fn(p):
        model = nnx.merge(graphdef, p)
        return model.forward(mb.tokens, mb.positions, mb.segment_ids)[0]

    hidden = jax.jit(fwd_fn)(params)
    kernel = nnx.merge(graphdef, params).head_kernel()

    def head_fn(h, k):
        logp, _ = token_logprobs(h, k, mb.targets, chunk_size=ocfg.logprob_chunk, fp32=True)
        return jnp.sum(logp * mb.loss_mask)

    tx = make_optimizer(ocfg)
    grads = jax.tree.map(lambda p: jnp.full(p.shape, 1e-3, p.dtype), params)
    opt = jax.jit(lambda g, s, p: optax.apply_updates(p, tx.update(g, s, p)[0]))
    loss_grad, body_grad = jax.jit(jax.grad(loss_fn)), jax.jit(jax.grad(body_fn))
    head_grad, fwd = jax.jit(jax.grad(head_fn, (0, 1))), jax.jit(fwd_fn)
    pieces = {
        "step (make_train_step)": (lambda: jax.block_until_ready(step(state, batch)), total),
        "loss fwd+bwd (no optimizer)": (lambda: jax.block_until_ready(loss_grad(params)), total),
        "body fwd+bwd (no LM head)": (
            lambda: jax.block_until_ready(body_grad(params)),
            total - head,
        ),
        "fp32 log-prob head fwd+bwd": (
            lambda: jax.block_until_ready(head_grad(hidden, kernel)),
            head,
        ),
        "body forward": (lambda: jax.block_until_ready(fwd(params)), (total - head) / 3),
        "optimizer (clip + AdamW)": (
            lambda: jax.block_until_ready(opt(grads, state.opt_state, params)),
            0.0,
        ),
    }
    peak = matmul_peak(args.peak_n, jnp.dtype(dtype), 3)[0]
    out = []
    for name, (fn, flops) in pieces.items():
        t = median_time(fn, args.repeats)  # the first call compiles, untimed
        rec = dict(
            part="train",
            dtype=dtype,
            piece=name,
            s=round(t, 3),
            gflop_s=round(flops / t / 1e9, 1) if flops else None,
            of_peak=round(flops / t / peak, 3) if flops else None,
            peak_gflop_s=round(peak / 1e9, 1),
            load=load(),
        )
        out.append(rec)
        print(json.dumps(rec), flush=True)
    return out


def _copy_bandwidth(jax, jnp) -> float:
    """Bytes/s of reading and writing a 256 MiB array once (x * 2), best of 5."""
    x = jnp.ones(((256 << 20) // 4,), jnp.float32)
    double = jax.jit(lambda a: a * 2)
    return 2.0 * x.nbytes / best(lambda: double(x).block_until_ready(), 5)


def part_decode(args, dtype) -> list:
    import jax
    import jax.numpy as jnp
    from jax.sharding import Mesh

    from real_model import workload_prompts
    from scalerl_jax.config import SamplerConfig
    from scalerl_jax.models import hf
    from scalerl_jax.sampler import Engine

    cfg = hf.config_from_hf(args.checkpoint).replace(
        param_dtype="float32",
        compute_dtype=dtype,
        fp32_head=True,
        max_position_embeddings=args.prompt + args.new + 1,
    )
    _, _, params = hf.load_params(args.checkpoint, cfg=cfg)
    mesh = Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("data", "tensor"))
    bandwidth = _copy_bandwidth(jax, jnp)
    out = []
    for slots in args.slots:
        scfg = SamplerConfig(
            max_concurrent_decodes=slots,
            max_prefill_length=args.prompt,
            max_target_length=args.prompt + args.new,
            max_new_tokens=args.new,
            interruptions=False,
            temperature=1.0,
        )
        engine = Engine(cfg, mesh, scfg)
        p = engine.load_params(params)
        ids = workload_prompts(1, slots, args.prompt, cfg.vocab_size)
        prefix = engine.prefill_batch(p, ids, [args.prompt] * slots)

        def fresh():
            return engine.bulk_insert(
                prefix,
                engine.init_decode_state(),
                range(slots),
                rows=range(slots),
                keys=np.random.default_rng(0).integers(0, 2**31, (slots, 2)),
            )

        times = []
        for rnd in range(2):  # the first pass compiles every cache window
            st = fresh()
            for i in range(args.new - 1):
                t = time.perf_counter()
                st, res = engine.generate(p, st, args.prompt + i)
                jax.device_get(res)
                if rnd:
                    times.append(time.perf_counter() - t)
        step = statistics.median(times)
        weight_bytes = sum(a.nbytes for a in jax.tree.leaves(p))
        kv = (
            2
            * cfg.num_layers
            * cfg.num_kv_heads
            * cfg.dim_per_head
            * slots
            * (args.prompt + args.new / 2)
            * jnp.dtype(engine.cache_dtype).itemsize
        )
        floor = (weight_bytes + kv) / bandwidth
        flops = 2.0 * cfg.num_params() * slots  # per step: a tied table counts once (head)
        rec = dict(
            part="decode",
            dtype=dtype,
            slots=slots,
            step_ms=round(1e3 * step, 2),
            tok_s=round(slots / step, 1),
            weight_MiB=round(weight_bytes / 2**20, 1),
            kv_MiB=round(kv / 2**20, 1),
            copy_GB_s=round(bandwidth / 1e9, 1),
            memory_floor_ms=round(1e3 * floor, 2),
            gflop_s=round(flops / step / 1e9, 1),
            load=load(),
        )
        out.append(rec)
        print(json.dumps(rec), flush=True)
    return out


def main(argv=None) -> list:
    from real_model import default_checkpoint, read_shape

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("part", choices=("dots", "train", "decode", "all"))
    p.add_argument("--checkpoint")
    p.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    p.add_argument("--slots", type=int, nargs="+", default=[16, 64])
    p.add_argument("--prompt", type=int, default=64)
    p.add_argument("--new", type=int, default=128)
    p.add_argument("--rows", type=int, default=8)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--peak-n", type=int, default=2048)
    p.add_argument(
        "--one-thread",
        action="store_true",
        help="XLA and torch on one thread each: per-core efficiency, much less "
        "disturbed by other jobs than two threads that wait for each other",
    )
    args = p.parse_args(argv)
    if args.one_thread:  # before jax / torch are imported
        os.environ["XLA_FLAGS"] = (
            os.environ.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_"
            "eigen=false intra_op_parallelism_threads=1"
        ).strip()
        os.environ["OMP_NUM_THREADS"] = "1"
    args.checkpoint = args.checkpoint or default_checkpoint()
    out = []
    if args.part in ("dots", "all"):
        out += part_dots(args, read_shape(args.checkpoint))
    for dtype in args.dtypes:
        if args.part in ("train", "all"):
            out += part_train(args, dtype)
        if args.part in ("decode", "all"):
            out += part_decode(args, dtype)
    return out


if __name__ == "__main__":
    main()
