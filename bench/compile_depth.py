"""Compile time against depth, with the layers scanned (ModelConfig.scan_layers, the default) or
unrolled: `jit(...).lower(...).compile()` of the random-state init (train/state.py's, params +
AdamW state) and of the real CISPO train step, on abstract inputs (nothing is allocated, so an
8B model compiles on a laptop).

    python bench/compile_depth.py                       # 8 vs 32 layers, the two init presets
    python bench/compile_depth.py --unrolled            # the same, also with the scan unrolled
    python bench/compile_depth.py --preset tiny-qwen2 --layers 2 4 --init-presets tiny-llama

Targets (issue 33): the step's compile at 32 layers within 1.5x of 8 layers of the same width,
the llama-3.1-8b random init compile <= 10 s.
"""

from __future__ import annotations

import argparse
import time

import jax

from memory import _abstract_batch  # bench/memory.py: the train step's abstract batch
from scalerl_jax import mesh as mesh_lib
from scalerl_jax.config import LossConfig, MeshConfig, OptimConfig
from scalerl_jax.models import presets
from scalerl_jax.train import state as state_lib
from scalerl_jax.train.optim import make_optimizer
from scalerl_jax.train.step import make_train_step


def _compile(fn, *args) -> tuple[float, float, int]:
    """(wall and process CPU seconds of lower + compile, characters of the lowered StableHLO
    text). CPU time is what other jobs on a shared machine disturb least."""
    start, cpu = time.perf_counter(), time.process_time()
    lowered = fn.lower(*args)
    lowered.compile()
    return time.perf_counter() - start, time.process_time() - cpu, len(lowered.as_text())


def init_compile(model) -> tuple[float, float, int]:
    """The random-state init as train/state.py's create_train_state jits it."""
    tx = make_optimizer(OptimConfig())
    return _compile(jax.jit(lambda: state_lib._random_state(model, tx, 0)))


def step_compile(model, seq: int) -> tuple[float, float, int]:
    mesh = mesh_lib.trainer_mesh(MeshConfig(), jax.devices()[:1])
    optim = OptimConfig()
    graphdef, abstract = state_lib.abstract_train_state(model, optim, mesh)
    step = make_train_step(
        graphdef,
        abstract,
        mesh,
        model_cfg=model,
        loss_cfg=LossConfig(),
        optim_cfg=optim,
        num_prompts=1,
    )
    return _compile(step.jitted, abstract, _abstract_batch(mesh, 1, seq, num_prompts=1))


def _scan(scan: bool) -> dict:
    # The default (scanned) is left unnamed, so this script also times a tree without the
    # field (the unrolled layers before the scan), for a before/after in one session.
    return {} if scan else {"scan_layers": False}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="qwen2.5-0.5b", help="the width the depths share")
    ap.add_argument("--layers", type=int, nargs="+", default=[8, 32])
    ap.add_argument("--seq", type=int, default=1024, help="train step row length")
    ap.add_argument("--init-presets", nargs="*", default=["qwen2.5-0.5b", "llama-3.1-8b"])
    ap.add_argument("--unrolled", action="store_true", help="also time the unrolled layers")
    args = ap.parse_args(argv)
    modes = [True, False] if args.unrolled else [True]
    head = f"{'program':<34} {'layers':>6} {'scan':>5} {'compile s':>10} {'CPU s':>7}"
    print(f"{head} {'HLO chars':>11}")

    def row(name, layers, scan, result):
        secs, cpu, chars = result
        print(
            f"{name:<34} {layers:>6} {str(scan):>5} {secs:>10.1f} {cpu:>7.1f} {chars:>11,}",
            flush=True,
        )
        return secs

    for name in args.init_presets:
        cfg = presets.get(name)
        row(f"init {name}", cfg.num_layers, True, init_compile(cfg))
    base = presets.get(args.preset, remat=True, compute_dtype="bfloat16")
    for scan in modes:
        times = [
            row(
                f"train step {args.preset} T={args.seq}",
                n,
                scan,
                step_compile(base.replace(num_layers=n, **_scan(scan)), args.seq),
            )
            for n in args.layers
        ]
        print(
            f"  step compile {args.layers[-1]} / {args.layers[0]} layers: "
            f"x{times[-1] / times[0]:.2f} (scan={scan})"
        )


if __name__ == "__main__":
    main()
