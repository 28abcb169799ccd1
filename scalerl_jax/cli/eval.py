"""Evaluate a model on a dataset: greedy pass@1, sampled mean@k and pass@k, standard errors.

Every completion and its verdict are saved as JSONL (the logic: scalerl_jax/evaluation.py).

examples:
  M=$(python experiments/fetch_model.py)          # SmolLM2-135M-Instruct as an HF directory
  python experiments/eval.py --recipe gsm8k --hf-checkpoint $M \\
      --data data/gsm8k/test.jsonl --num-prompts 200 --max-new-tokens 320 \\
      --greedy --temperature 0.7 --k 4 --out runs/eval/smollm2-gsm8k.jsonl
  python experiments/eval.py --workdir runs/testbed     # a run's newest checkpoint, on its own
                                                        # validation prompts and prompt format

Decoding: --temperature 0 (the default) is greedy, one completion per problem (pass@1);
--temperature T --k K samples K completions per problem (mean@K, pass@K); --greedy adds a greedy
pass to a sampled one. Prompts and references are read and formatted as a run's DataConfig
would: a recipe's (--recipe gsm8k: the chat template, its system prompt, the `question` field,
GSM8K's "#### N" answers), a run directory's own (--workdir), else the defaults, with
`data.template=chat`, `data.system_prompt=...`, `data.prompt_field=...`, `data.answer_field=...`,
`data.answer_format=gsm8k|boxed|raw` as `key=value` overrides on top; `reward.verifier`,
`reward.workers` and `reward.timeout_s` choose and bound the verifier.

Output: --out FILE.jsonl holds one line per completion; FILE.summary.json the figures (one line
per decoding also printed). Progress: a log line at least every 30 s (SCALERL_PROGRESS_INTERVAL=S);
Ctrl-C / SIGTERM stop it within seconds, writing nothing.

exit status: 0 done, 2 bad input (one line; --debug adds the traceback), 130 / 143 interrupted.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import sys
from typing import cast

from scalerl_jax import cli, evaluation, preflight, recipes
from scalerl_jax.config import DataConfig, RewardConfig, apply_overrides
from scalerl_jax.errors import UserError
from scalerl_jax.heartbeat import HEARTBEAT, heartbeat, phase
from scalerl_jax.interrupt import Watchdog
from scalerl_jax.progress import setup_logging

log = logging.getLogger("scalerl_jax.eval")


def parse_args(argv=None):
    p = cli.parser(__doc__)
    p.add_argument(
        "overrides",
        nargs="*",
        metavar="KEY.PATH=VALUE",
        help="data.* and reward.* settings, e.g. data.template=chat",
    )
    p.add_argument(
        "--hf-checkpoint",
        metavar="DIR|ORG/NAME|FILE.gguf",
        help="the model: an HF directory, a Hub id or a .gguf file",
    )
    p.add_argument("--workdir", help="the model: a run directory's newest Orbax checkpoint")
    p.add_argument("--step", type=int, help="with --workdir: this checkpoint step")
    p.add_argument(
        "--recipe",
        help="take the data (prompt format, fields, answer format) and "
        "reward settings of this recipe, e.g. gsm8k (default: the run's with "
        "--workdir, else the defaults)",
    )
    p.add_argument(
        "--data",
        help="FILE.jsonl / FILE.parquet / DIR / hf:NAME (default with "
        "--workdir: the run's validation prompts)",
    )
    p.add_argument("--num-prompts", type=int, metavar="N", help="the first N problems (all)")
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy (default 0)")
    p.add_argument(
        "--k", type=int, default=1, help="completions per problem when sampling (default 1)"
    )
    p.add_argument(
        "--greedy", action="store_true", help="also a greedy pass (pass@1) beside the sampled one"
    )
    p.add_argument("--max-new-tokens", type=int, default=512, help="default 512")
    p.add_argument("--slots", type=int, default=32, help="decode slots (default 32)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    p.add_argument(
        "--dtype",
        choices=("float32", "bfloat16"),
        help="compute dtype (default: float32 for --hf-checkpoint, the run's own for --workdir)",
    )
    p.add_argument("--out", help="completions JSONL (default: runs/eval/MODEL-DATA.jsonl)")
    p.add_argument("--debug", action="store_true", help="show tracebacks of input errors")
    return p.parse_intermixed_args(argv)


def modes(args) -> list:
    for flag, value, least in (
        ("--k", args.k, 1),
        ("--max-new-tokens", args.max_new_tokens, 1),
        ("--slots", args.slots, 1),
        ("--num-prompts", args.num_prompts, 1),
    ):
        if value is not None and value < least:
            raise preflight.UsageError(f"{flag} {value}: must be >= {least}")
    if args.temperature < 0:
        raise preflight.UsageError(f"--temperature {args.temperature}: must be >= 0 (0: greedy)")
    if args.temperature == 0:
        if args.k != 1:
            raise preflight.UsageError(
                f"--k {args.k} with --temperature 0: greedy decoding gives one completion per "
                "problem; sample with --temperature > 0 for mean@k (and --greedy for pass@1)"
            )
        return [evaluation.Mode("greedy", 0.0, 1)]
    sampled = evaluation.Mode(f"t{args.temperature:g}_k{args.k}", args.temperature, args.k)
    return ([evaluation.Mode("greedy", 0.0, 1)] if args.greedy else []) + [sampled]


def configs(args, run_cfg) -> tuple[DataConfig, RewardConfig, bool]:
    """(DataConfig, RewardConfig, whether to use the run's validation split) from the recipe,
    the run's config (`run_cfg`, with --workdir) or the defaults, with --data and the overrides
    applied; the data are checked (files, columns) here, before any model is loaded."""
    if args.recipe:
        try:
            base = recipes.get(args.recipe)
        except KeyError:
            raise preflight.UsageError(
                f"--recipe {args.recipe}: no such recipe (`python "
                "experiments/run.py --recipe list` names them)"
            ) from None
        settings = evaluation.Settings(base.data, base.reward)
    elif run_cfg is not None:
        settings = evaluation.Settings(run_cfg.data, run_cfg.reward)
    else:
        workers = min(8, os.cpu_count() or 1)
        settings = evaluation.Settings(DataConfig(source=args.data), RewardConfig(workers=workers))
    # apply_overrides takes any dataclass of config sections; it is annotated for RunConfig.
    settings = cast(evaluation.Settings, apply_overrides(settings, args.overrides))  # type: ignore[arg-type]
    data = settings.data
    if data.is_mixture:
        raise preflight.UsageError(
            "a mixture run: pass --data with one domain's source and its data.* fields"
        )
    if args.data:  # --data alone is scored: a recipe's validation source does not apply
        data = dataclasses.replace(data, source=args.data, validation_source=None)
        preflight.check_data(data, "--data", read=True)
    return data, settings.reward, run_cfg is not None and not args.data


def default_out(args, model) -> str:
    if args.workdir:
        return os.path.join(args.workdir, "eval", f"step_{model.step}.jsonl")
    name = os.path.basename(os.path.normpath(model.source))
    data = os.path.splitext(os.path.basename(os.path.normpath(args.data)))[0]
    return os.path.join("runs", "eval", f"{name}-{data}.jsonl")


def run(args, should_stop) -> int:
    chosen = modes(args)
    if bool(args.workdir) == bool(args.hf_checkpoint):
        raise preflight.UsageError(
            "give one model: --hf-checkpoint DIR|ORG/NAME|FILE.gguf or --workdir RUN_DIR"
        )
    if args.hf_checkpoint and not args.data:
        raise preflight.UsageError(
            "--data FILE is needed with --hf-checkpoint (only a run "
            "directory brings its own validation prompts)"
        )
    if args.step is not None and not args.workdir:
        raise preflight.UsageError(f"--step {args.step} needs --workdir RUN_DIR")
    bad = [o for o in args.overrides if not o.startswith(("data.", "reward."))]
    if bad:
        raise preflight.UsageError(f"{bad[0]}: only data.* and reward.* settings apply here")
    hf_dir = preflight.hf_checkpoint(args.hf_checkpoint) if args.hf_checkpoint else None
    run_cfg = evaluation.run_config(args.workdir) if args.workdir else None
    data, reward, validation = configs(args, run_cfg)
    model = evaluation.load_model(
        hf_checkpoint=hf_dir, workdir=args.workdir, step=args.step, dtype=args.dtype
    )
    from scalerl_jax.rewards import use_processes, verifier_names

    verifier = verifier_names(data, reward.verifier)[""]
    problems = evaluation.load_problems(
        data, model.tokenizer, args.num_prompts, validation=validation
    )
    out = args.out or default_out(args, model)
    about = {
        "data": data.source,
        "split": "run validation" if validation else "file order",
        "template": data.template,
        "system_prompt": data.system_prompt,
        "dtype": model.cfg.compute_dtype,
    }
    summary = evaluation.evaluate_model(
        model,
        problems,
        chosen,
        out=out,
        verifier_name=verifier,
        max_new_tokens=args.max_new_tokens,
        slots=args.slots,
        workers=reward.workers,
        timeout_s=reward.timeout_s,
        processes=use_processes(reward, data),
        seed=args.seed,
        about=about,
        should_stop=should_stop,
    )
    if summary is None:
        return -1
    for name, figures in summary["modes"].items():
        print(evaluation.headline(name, figures))
    print(f"completions: {out}\nsummary:     {evaluation.summary_path(out)}")
    return 0


def main(argv=None) -> int:
    setup_logging()
    args = parse_args(argv)
    stop: dict = {}

    def on_signal(signum, frame):
        if stop:
            raise KeyboardInterrupt
        stop["name"] = signal.Signals(signum).name
        log.warning("%s received: stopping the evaluation, writing nothing", stop["name"])

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)
    with (
        heartbeat(f"eval.py: pid {os.getpid()}: starting"),
        Watchdog(
            can_exit=lambda: True,
            nothing_lost="evaluation stopped, nothing written",
            acknowledged=lambda: bool(stop),
            describe=HEARTBEAT.line,
        ),
    ):
        try:
            with phase("eval.py"):
                code = run(args, should_stop=lambda: bool(stop))
        except KeyboardInterrupt:
            code = -1
        except UserError as err:  # one line; anything else is a bug: its traceback
            if args.debug:
                raise
            print(f"eval.py: error: {err}", file=sys.stderr)
            return 2
    if code == -1:
        name = stop.get("name", "SIGINT")
        print(f"eval.py: interrupted by {name}; nothing written", file=sys.stderr)
        return 128 + int(signal.Signals[name])
    return code


if __name__ == "__main__":
    sys.exit(main())
