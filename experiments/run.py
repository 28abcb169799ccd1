"""Run an RL job: the SFT warm-up when the recipe has one, then RL, then the scaling fit.

    python experiments/run.py                       # embedded CPU testbed (recipe `testbed`)
    python experiments/run.py --steps 50 --workdir /tmp/tb
    python experiments/run.py pipeline.mode=sync optim.learning_rate=1e-4 --steps 20
    python experiments/run.py --recipe scalerl --model qwen3-0.6b --hf-checkpoint DIR \\
        --data /path/to/polaris.parquet

Any config field can be set as `key.path=value` (see scalerl_jax/config.py). Re-running the same
command with the same --workdir resumes from its last checkpoint; a workdir started with a
different config is refused unless --allow-config-change. Ctrl-C or SIGTERM saves a checkpoint
and exits with status 130 / 143. `python experiments/fit.py WORKDIR` refits the curve.
"""
from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import signal
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from scalerl_jax import recipes  # noqa: E402
from scalerl_jax.config import ConfigError, apply_overrides  # noqa: E402
from scalerl_jax.data.prompts import DataError  # noqa: E402
from scalerl_jax.progress import setup_logging, summary_lines  # noqa: E402

log = logging.getLogger("run")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n", 1)[1])
    p.add_argument("overrides", nargs="*", metavar="KEY.PATH=VALUE",
                   help="config overrides, e.g. pipeline.mode=sync sft.steps=100")
    p.add_argument("--recipe", default="testbed", choices=sorted(recipes.RECIPES))
    p.add_argument("--workdir", help="run directory (default: the recipe's)")
    p.add_argument("--steps", type=int, help="number of RL train steps")
    p.add_argument("--seed", type=int)
    p.add_argument("--model", help="model preset for --recipe scalerl (e.g. qwen3-0.6b)")
    p.add_argument("--hf-checkpoint", help="HF model directory: initial weights and tokenizer")
    p.add_argument("--data", help="prompt source: .jsonl/.parquet path, hf:NAME, synthetic:TASK")
    p.add_argument("--allow-config-change", action="store_true",
                   help="resume a workdir whose config.json differs from this config")
    p.add_argument("--wandb", metavar="PROJECT", help="also log to Weights & Biases")
    p.add_argument("--no-fit", action="store_true", help="skip the scaling fit at the end")
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
    return apply_overrides(dataclasses.replace(cfg, **top), args.overrides)


def main(argv=None) -> int:
    setup_logging()
    args = parse_args(argv)
    from scalerl_jax import mesh
    from scalerl_jax.train import trainer  # after logging: importing jax/orbax is slow and loud

    mesh.maybe_initialize_distributed()
    from scalerl_jax.rundir import WorkdirInUseError
    try:
        cfg = build_config(args)
        result = trainer.run(cfg, allow_config_change=args.allow_config_change,
                             wandb_project=args.wandb, fit=not args.no_fit)
    except (ConfigError, DataError, WorkdirInUseError) as err:  # bad input: one line, exit 2
        print(f"run.py: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # a second Ctrl-C, or one before training started
        print("run.py: interrupted; re-run the same command to resume", file=sys.stderr)
        return 130
    if result.stopped_by:
        log.warning("interrupted by %s at step %d: re-run the same command to resume",
                    result.stopped_by, result.step)
        return 128 + int(signal.Signals[result.stopped_by])
    if result.evals:
        print("\n".join(summary_lines(cfg.workdir, result.evals, result.fit,
                                      fit_reason=result.fit_reason)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
