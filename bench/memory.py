"""Compiled memory of the ScaleRL recipe's train step and sampler decode, from XLA's own buffer
analysis on CPU (nothing is allocated: every input is a ShapeDtypeStruct).

    python bench/memory.py                                   # train + sampler, 2 and 4 layers
    python bench/memory.py --part train --layers 2 4 --remat none full dots attn_out
    XLA_FLAGS=--xla_force_host_platform_device_count=8 python bench/memory.py --fsdp 8

Train: the real `train.step.make_train_step` (CISPO, AdamW, fp32 master params, bf16 compute,
fp32 LM head, chunked log-probs) on `recipes.scalerl()`'s model (llama-3.1-8b) and its longest
row (`plan.estimate.seq_len`: 16,384 tokens), one row per micro-batch per chip. Sampler: the
real `sampler.engine.Engine` with the recipe's 64 slots and max_target_length, its decode state
(`init_decode_state`) and one `generate` call over the whole cache.

The layers are scanned, so a compile takes about as long at 32 layers as at 8
(bench/compile_depth.py: x1.06) and `--layers 32` compiles the real depth. By default the
model is compiled at 2 and 4 layers and the per-layer slope and the intercept, fitted from the
first and last depth, are extrapolated to the real depth: quicker, and it shows what each layer
adds. Every figure is per device.
XLA's CPU buffer assignment is not the GPU's or the TPU's (fusion differs, no rematerialisation
pass under memory pressure), so these are an upper-bound-style reference for the planner's
arithmetic (`plan.estimate`), printed beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import time

# XLA:CPU's default scheduler trades memory for concurrency: it runs a rematerialised block's
# forward as early as it can, so remat shows no saving at all in the analysis (measured: the
# same temp bytes with and without remat). The memory-minimising scheduler is the behaviour
# GPU and TPU schedulers aim for. Set before jax is imported.
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_cpu_enable_concurrency_optimized_scheduler=false"
).strip()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from scalerl_jax import mesh as mesh_lib
from scalerl_jax import recipes
from scalerl_jax.config import MeshConfig
from scalerl_jax.plan import estimate
from scalerl_jax.sampler.engine import Engine
from scalerl_jax.train import state as state_lib
from scalerl_jax.train.batch import TrainBatch
from scalerl_jax.train.step import make_train_step

GIB = 1 << 30
FIELDS = ("argument", "output", "alias", "temp", "generated_code")


def _analysis(compiled) -> dict:
    m = compiled.memory_analysis()
    out = {k: getattr(m, f"{k}_size_in_bytes") for k in FIELDS}
    # Live at once: inputs, outputs not written in place of donated inputs, and temporaries.
    out["peak"] = out["argument"] + out["output"] - out["alias"] + out["temp"]
    return out


def _abstract_batch(mesh, rows: int, t: int, num_prompts: int) -> TrainBatch:
    token = mesh_lib.named(mesh, None, "batch", None, shape=(1, rows, t))
    row = mesh_lib.named(mesh, None, "batch", shape=(1, rows))

    def s(dtype, shape, sharding):
        return jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)

    i32, f32 = jnp.int32, jnp.float32
    return TrainBatch(
        tokens=s(i32, (1, rows, t), token),
        targets=s(i32, (1, rows, t), token),
        positions=s(i32, (1, rows, t), token),
        segment_ids=s(i32, (1, rows, t), token),
        loss_mask=s(jnp.bool_, (1, rows, t), token),
        behaviour_logp=s(f32, (1, rows, t), token),
        advantages=s(f32, (1, rows), row),
        prompt_index=s(i32, (1, rows), row),
        num_prompts=num_prompts,
    )


def train_memory(cfg, layers: int, remat: str, fsdp: int) -> dict:
    """XLA memory analysis of one train step (one micro-batch of one row per batch shard)."""
    policy = dict(remat=remat != "none", remat_policy="full" if remat == "none" else remat)
    model = cfg.model.replace(num_layers=layers, **policy)
    mesh = mesh_lib.trainer_mesh(MeshConfig(fsdp=fsdp), jax.devices()[:fsdp])
    graphdef, abstract = state_lib.abstract_train_state(model, cfg.optim, mesh)
    step = make_train_step(
        graphdef,
        abstract,
        mesh,
        model_cfg=model,
        loss_cfg=cfg.loss,
        optim_cfg=cfg.optim,
        num_prompts=1,
    )
    t = estimate.seq_len(cfg)
    batch = _abstract_batch(mesh, fsdp, t, num_prompts=1)
    start = time.perf_counter()
    compiled = step.jitted.lower(abstract, batch).compile()
    out = _analysis(compiled)
    out.update(compile_s=round(time.perf_counter() - start, 1))
    return out


def sampler_memory(cfg, layers: int) -> dict:
    """XLA memory analysis of one `generate` call over the whole cache (the decode state is its
    donated argument, so the cache is counted once)."""
    model = cfg.model.replace(num_layers=layers)
    mesh = mesh_lib.sampler_mesh(MeshConfig(), jax.devices()[:1])
    engine = Engine(model, mesh, cfg.sampler)
    params = state_lib.with_shardings(engine.abstract_params, engine.param_shardings)
    # The engine's own decode state and generate function (private: the engine exposes no
    # lowering hook), abstract only.
    state = state_lib.with_shardings(jax.eval_shape(engine._init), engine.state_shardings)
    start = time.perf_counter()
    compiled = engine._generate.lower(
        jax.tree.leaves(params), state, engine.max_target_length
    ).compile()
    out = _analysis(compiled)
    out.update(compile_s=round(time.perf_counter() - start, 1))
    return out


def _fit(rows: list[dict], depths: list[int], full: int) -> dict:
    """Per-layer slope and intercept of every field from the first and last depth, and the
    value extrapolated to `full` layers."""
    (d0, r0), (d1, r1) = (depths[0], rows[0]), (depths[-1], rows[-1])
    fit = {}
    for k in FIELDS + ("peak",):
        slope = (r1[k] - r0[k]) / (d1 - d0)
        fit[k] = {
            "per_layer": slope,
            "intercept": r0[k] - slope * d0,
            "at_full": r0[k] + slope * (full - d0),
        }
    return fit


def _gib(x) -> float:
    return round(x / GIB, 3)


def planner_train(cfg, remat: str, fsdp: int) -> dict:
    """plan.estimate's figures for the same layout: one row per chip (micro_batches = rows)."""
    rows = cfg.pipeline.prompts_per_step * cfg.pipeline.generations_per_prompt
    shape = {"data": 1, "fsdp": fsdp, "tensor": 1}
    mem = estimate.trainer_memory(cfg, shape, rows // fsdp, remat != "none", 1)
    return {
        "params": mem.params,
        "optimizer": mem.optimizer,
        "gradients": mem.gradients,
        "activations": mem.activations,
        "peak": mem.peak,
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--part", choices=("train", "sampler", "all"), default="all")
    p.add_argument("--layers", type=int, nargs="+", default=[2, 4])
    p.add_argument(
        "--remat",
        nargs="+",
        default=["none", "full", "dots_no_batch", "attn_out"],
        choices=("none", "full", "dots", "dots_no_batch", "attn_out"),
    )
    p.add_argument("--fsdp", type=int, default=1, help="fake CPU devices: set XLA_FLAGS too")
    p.add_argument("--model", default=recipes.DEFAULT_MODEL)
    args = p.parse_args()
    cfg = recipes.scalerl(args.model)
    full = cfg.model.num_layers
    head = {
        "model": cfg.model.name,
        "layers_full": full,
        "seq": estimate.seq_len(cfg),
        "slots": cfg.sampler.max_concurrent_decodes,
        "cache_len": cfg.sampler.max_target_length,
        "fsdp": args.fsdp,
        "devices": len(jax.devices()),
    }
    print(json.dumps(head))
    if args.part in ("train", "all"):
        for remat in args.remat:
            rows = [train_memory(cfg, n, remat, args.fsdp) for n in args.layers]
            for n, r in zip(args.layers, rows):
                print(
                    json.dumps(
                        {
                            "part": "train",
                            "remat": remat,
                            "layers": n,
                            **{k: _gib(v) if k != "compile_s" else v for k, v in r.items()},
                        }
                    )
                )
            fit = _fit(rows, args.layers, full) if len(args.layers) > 1 else {}
            print(
                json.dumps(
                    {
                        "part": "train",
                        "remat": remat,
                        "fit_GiB": {k: {a: _gib(b) for a, b in v.items()} for k, v in fit.items()},
                        "planner_GiB": {
                            k: _gib(v) for k, v in planner_train(cfg, remat, args.fsdp).items()
                        },
                    }
                )
            )
    if args.part in ("sampler", "all") and args.fsdp == 1:
        rows = [sampler_memory(cfg, n) for n in args.layers]
        for n, r in zip(args.layers, rows):
            print(
                json.dumps(
                    {
                        "part": "sampler",
                        "layers": n,
                        **{k: _gib(v) if k != "compile_s" else v for k, v in r.items()},
                    }
                )
            )
        fit = _fit(rows, args.layers, full) if len(args.layers) > 1 else {}
        mem = estimate.sampler_memory(cfg, 1, 1, cfg.sampler.max_concurrent_decodes, tpu=False)
        print(
            json.dumps(
                {
                    "part": "sampler",
                    "fit_GiB": {k: {a: _gib(b) for a, b in v.items()} for k, v in fit.items()},
                    "planner_GiB": {
                        "params": _gib(mem.params),
                        "kv_cache": _gib(mem.kv_cache),
                        "working": _gib(mem.working),
                        "decode": _gib(mem.decode),
                        "peak": _gib(mem.peak),
                    },
                }
            )
        )


if __name__ == "__main__":
    main()
