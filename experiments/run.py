"""Run an RL job.

    python experiments/run.py                       # embedded CPU testbed (recipe `testbed`)
    python experiments/run.py --steps 5 --workdir /tmp/tb
    python experiments/run.py --recipe scalerl --model qwen3-0.6b --hf-checkpoint DIR \
        --data /path/to/polaris.parquet

Re-running the same command with the same --workdir resumes from its last checkpoint.
Fit the scaling curve afterwards with `python experiments/fit.py WORKDIR`.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from scalerl_jax import recipes  # noqa: E402
from scalerl_jax.train import trainer  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--recipe", default="testbed", choices=sorted(recipes.RECIPES))
    p.add_argument("--workdir", help="run directory (default: the recipe's)")
    p.add_argument("--steps", type=int, help="number of train steps")
    p.add_argument("--seed", type=int)
    p.add_argument("--model", help="model preset for --recipe scalerl (e.g. qwen3-0.6b)")
    p.add_argument("--hf-checkpoint", help="HF model directory: initial weights and tokenizer")
    p.add_argument("--data", help="prompt source: .jsonl/.parquet path, hf:NAME, synthetic:TASK")
    return p.parse_args(argv)


def build_config(args):
    cfg = recipes.get(args.recipe, **({"model": args.model} if args.model else {}))
    top = {k: v for k, v in (("workdir", args.workdir), ("steps", args.steps),
                             ("seed", args.seed), ("hf_checkpoint", args.hf_checkpoint))
           if v is not None}
    if args.data:
        top["data"] = dataclasses.replace(cfg.data, source=args.data)
    if args.hf_checkpoint and args.recipe != "testbed":
        from scalerl_jax.models import hf
        top["model"] = hf.config_from_hf(args.hf_checkpoint).replace(
            param_dtype=cfg.model.param_dtype, compute_dtype=cfg.model.compute_dtype,
            fp32_head=cfg.model.fp32_head)
    return dataclasses.replace(cfg, **top)


def main(argv=None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    cfg = build_config(parse_args(argv))
    last = trainer.run(cfg)
    print(json.dumps({"workdir": cfg.workdir, "step": last.get("step"),
                      "loss": last.get("loss"), "pass_rate_train": last.get("pass_rate_train")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
