"""Ahead-of-time compiles of a run's programs for a TPU slice on this CPU host (`run.py
--compile`'s machinery, plan/aot.py): compile seconds, XLA's memory per chip, and the device-free
efficiency of the TPU programs from XLA's cost analysis.

    python bench/compile.py --tpu v5p:2x2x1 --model qwen2.5-0.5b --only "train step" \\
        pipeline.prompts_per_step=2 pipeline.generations_per_prompt=16 ...   # one program
    python bench/compile.py --tpu v5p-256 --model llama-3.1-8b              # every program

Needs libtpu (`pip install "jax[tpu]==<jax version>"`, or a --target directory named by
SCALERL_LIBTPU_DIR). The config is the one `experiments/run.py --dry-run --tpu` plans (the same
functions build it). Efficiency, per chip:

* train step: XLA's FLOPs against the model FLOPs of its tokens (`num_flops_per_token`: 6 N +
  causal attention) plus remat's recomputed forward (2 N + attention) when remat is on;
* generate: XLA's bytes accessed against what a decode step must read, the sampler's weights
  and its whole KV cache (the window compiled is the whole cache), times the steps per call.

Prints one JSON line per program (and the efficiency ratios) after the table; `--json FILE`
writes them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from scalerl_jax import plan
from scalerl_jax.cli import run
from scalerl_jax.plan import aot


def planned_config(argv: list[str]):
    """(config, plan) exactly as `run.py --dry-run --tpu` resolves them (`_prepare`)."""
    args = run.parse_args(argv)
    cfg, pinned = run.build_config(args)
    topo = plan.topology(args.tpu)
    cfg = run.preflight.size_for_platform(args.recipe, cfg, pinned, [], dry_run=True, topo=topo)
    the_plan = plan.resolve(cfg, topo, pinned, plan.Assumptions(mfu=args.mfu))
    if not the_plan.ok:
        raise SystemExit(f"the plan cannot run: {plan.explain(the_plan, pinned)}")
    return the_plan.config, the_plan


def efficiency(p: aot.Program, cfg, the_plan) -> dict:
    """Ratios of XLA's cost analysis to the roofline's own counts (1.0 = nothing extra), for
    loop-free programs only: XLA's cost analysis counts a loop body once (a 10-step lax.scan
    of matmuls reports one matmul's FLOPs, measured for v5p), so a step with micro-batches,
    chunked log-probs or several decode steps per call is reported as `loops`."""
    from scalerl_jax.models.transformer import num_flops_per_token

    lay = the_plan.layout
    if p.name == "train step":
        t = plan.seq_len(cfg)
        chunk = cfg.optim.logprob_chunk
        if lay.micro_batches > 1 or (chunk is not None and chunk < t):
            return {"flops_ratio": "loops (micro-batches or log-prob chunks)"}
        shards = lay.trainer_mesh[0] * lay.trainer_mesh[1]
        tokens = plan.rows_per_chip(cfg, shards, 1) * shards * t
        fwd = num_flops_per_token(cfg.model, t, training=False)
        # remat ("full") recomputes each block's forward, not the LM head's
        head = 2 * cfg.model.vocab_size * cfg.model.hidden_size
        per_token = 3 * fwd + (fwd - head if lay.remat else 0)
        model = per_token * tokens / lay.trainer_chips
        return {"model_flops": model, "flops_ratio": p.flops / model}
    if p.name.startswith("generate"):
        if cfg.sampler.decode_steps_per_call > 1:
            return {"bytes_ratio": "loops (decode_steps_per_call > 1)"}
        need = the_plan.sampler.params + the_plan.sampler.kv_cache
        return {"weights_kv_bytes": need, "bytes_ratio": p.bytes_accessed / need}
    return {}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--only", action="append", help="compile only programs whose name starts so")
    p.add_argument("--json", help="write the rows here")
    args, rest = p.parse_known_args(argv)
    cfg, the_plan = planned_config(["--dry-run", "--recipe", "scalerl", *rest])
    target = aot.tpu_target(the_plan)
    devices = aot.tpu_devices(the_plan.topology)
    print(plan.format_plan(the_plan).split("\n  planned")[0], flush=True)
    print(aot.header(target), flush=True)
    t0 = time.perf_counter()
    done = aot.compile_all(
        cfg,
        devices,
        target,
        lambda prog: print(aot.format_program(prog, target), flush=True),
        select=(lambda name: any(name.startswith(o) for o in args.only)) if args.only else None,
    )
    wall = time.perf_counter() - t0
    print(aot.summary(done, target))
    rows = []
    for prog in done:
        row = {
            "program": prog.name,
            "seconds": round(prog.seconds, 1),
            "lowering_s": round(prog.lowering, 1),  # tracing + lowering, in `seconds`
            "total_bytes": prog.total,
            "held_bytes": prog.resident,
            "plan_bytes": prog.estimate,
            "flops": prog.flops,
            "bytes_accessed": prog.bytes_accessed,
            "roofline_s": prog.roofline(target.chip),
            "refused": prog.refused,
            **({} if prog.refused else efficiency(prog, cfg, the_plan)),
        }
        rows.append(row)
        print(json.dumps(row))
    print(f"wall {wall:.0f} s (lowering of the skipped programs included); load {os.getloadavg()}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"argv": rest, "wall_s": wall, "programs": rows}, f, indent=1)
    problem = aot.problem(done, target)
    if problem:
        print(f"compile.py: {problem}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
