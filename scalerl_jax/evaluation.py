"""Evaluating a model on a dataset, outside training: experiments/eval.py's logic.

Greedy pass@1, and mean@k / pass@k at temperature T, each with its standard error over
problems, over the first N problems of a file (or a run's validation split), through the
training code path (DataConfig formatting, Engine + Driver sampling seeded per (seed, i, j),
the run's verifier in killable child processes). The model is an HF directory, Hub id or .gguf
file, or a run directory's checkpoint. Every completion becomes one JSONL line; the summary is
JSON beside it (docs/real-models.md).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from typing import Any, Callable, Optional, Sequence

import numpy as np

from scalerl_jax.config import DataConfig, ModelConfig, RewardConfig, RunConfig, SamplerConfig
from scalerl_jax.data.prompts import PromptSource, format_prompt, load_rows
from scalerl_jax.errors import UserError
from scalerl_jax.heartbeat import phase

log = logging.getLogger(__name__)


class EvalError(UserError, ValueError):
    """The evaluation cannot run as asked; the message names the flag or field and the value."""


@dataclasses.dataclass(frozen=True)
class Mode:
    """One way of decoding: greedy (temperature 0, k = 1) or k samples at a temperature."""

    name: str
    temperature: float
    k: int


@dataclasses.dataclass(frozen=True)
class Problem:
    index: int  # position in the evaluated list (its sampling ticket)
    prompt_id: str
    question: str
    reference: str
    prompt: str  # the formatted text the sampler sees
    prompt_tokens: tuple


@dataclasses.dataclass
class Model:
    cfg: ModelConfig
    params: Any
    tokenizer: Any
    source: str  # what was loaded, for the summary
    run_cfg: Optional[RunConfig] = None  # a run directory's config
    step: Optional[int] = None  # its checkpoint step


# ---------------------------------------------------------------------------------- loading
def load_model(
    *,
    hf_checkpoint: Optional[str] = None,
    workdir: Optional[str] = None,
    step: Optional[int] = None,
    dtype: Optional[str] = None,
) -> Model:
    """The params, config and tokenizer of an HF directory or of a run's Orbax checkpoint
    (newest, or `step`; read without moving anything). `dtype`: the compute dtype (and an HF
    model's param dtype); default float32 for an HF model, the run's own for a run."""
    import jax

    from scalerl_jax.models import hf

    if (hf_checkpoint is None) == (workdir is None):
        raise EvalError("give one model: --hf-checkpoint DIR or --workdir RUN_DIR")
    if hf_checkpoint is not None:
        from scalerl_jax.models.tokenizer import load_tokenizer

        dtype = dtype or "float32"
        cfg = hf.config_from_hf(hf_checkpoint).replace(param_dtype=dtype, compute_dtype=dtype)
        with phase(f"loading {hf_checkpoint}", announce=True):
            cfg, _, params = hf.load_params(hf_checkpoint, cfg=cfg)
        return Model(cfg, params, load_tokenizer(hf_checkpoint), hf_checkpoint)

    from scalerl_jax import checkpoint as ckpt_lib
    from scalerl_jax import mesh as mesh_lib
    from scalerl_jax.config import MeshConfig
    from scalerl_jax.train import state as state_lib
    from scalerl_jax.train.trainer import load_tokenizer as load_run_tokenizer

    # workdir is set here: exactly one of the two was given (checked above).
    run_cfg = run_config(workdir)  # type: ignore[arg-type]
    if dtype is not None:  # the stored params keep the run's dtype: the sampler casts them
        run_cfg = dataclasses.replace(run_cfg, model=run_cfg.model.replace(compute_dtype=dtype))
    directory = os.path.join(workdir, "checkpoints")  # type: ignore[arg-type]
    if not os.path.isdir(directory):
        raise EvalError(f"--workdir {workdir}: no checkpoints/ there")
    checkpoints = ckpt_lib.Checkpointer(directory, save_every=1, keep=1 << 30)
    try:
        steps = checkpoints.all_steps()
        if not steps:
            raise EvalError(f"--workdir {workdir}: no checkpoint in {checkpoints.directory}")
        chosen = steps[-1] if step is None else step
        mesh = mesh_lib.trainer_mesh(MeshConfig(), jax.local_devices())
        _, abstract = state_lib.abstract_train_state(
            run_cfg.model, run_cfg.optim, mesh, run_cfg.seed
        )
        with phase(f"restoring step {chosen} of {workdir}", announce=True):
            state, _ = checkpoints.restore(abstract, step=chosen)  # named step: nothing moved
    finally:
        checkpoints.close()
    return Model(
        run_cfg.model,
        state.params,
        load_run_tokenizer(run_cfg),
        f"{workdir} step {chosen}",
        run_cfg,
        chosen,
    )


@dataclasses.dataclass(frozen=True)
class Settings:
    """What an evaluation takes from a run's config (its data.* and reward.* sections), the
    form `apply_overrides` takes them in."""

    data: DataConfig
    reward: RewardConfig


def run_config(workdir: str) -> RunConfig:
    """The RunConfig a run directory was started with (its config.json)."""
    from scalerl_jax.config import from_dict

    config = os.path.join(workdir, "config.json")
    if not os.path.isfile(config):
        raise EvalError(f"--workdir {workdir}: no config.json there (not a run directory)")
    with open(config) as f:
        return from_dict(RunConfig, json.load(f))


def load_problems(
    data: DataConfig, tokenizer, num_prompts: Optional[int], *, validation: bool = False
) -> list[Problem]:
    """The first `num_prompts` problems of `data.source` in file order, or with `validation`
    the run's held-out split (in the trainer's order), formatted by `data`."""
    rows: list[tuple[str, ...]]
    if validation:
        rows = [
            (p.prompt_id, p.problem, p.answer) for p in PromptSource(data, tokenizer).validation()
        ]
    else:
        rows = [tuple(r) for r in load_rows(data)[0]]
    rows = rows[:num_prompts] if num_prompts is not None else rows
    problems = []
    for i, (prompt_id, question, answer) in enumerate(rows):
        text = format_prompt(question, data, tokenizer)
        problems.append(
            Problem(
                i, prompt_id, question, answer, text, tuple(int(t) for t in tokenizer.encode(text))
            )
        )
    return problems


# --------------------------------------------------------------------------------- sampling
def sampler_config(
    problems: Sequence[Problem], mode: Mode, *, max_new_tokens: int, slots: int
) -> SamplerConfig:
    """Room for the longest prompt plus max_new_tokens; plain sampling (no top-p / top-k, no
    interruptions), so greedy means argmax and a temperature means just that."""
    longest = max(len(p.prompt_tokens) for p in problems)
    prefill = -(-longest // 16) * 16
    return SamplerConfig(
        max_concurrent_decodes=slots,
        max_prefill_length=prefill,
        max_target_length=-(-(prefill + max_new_tokens) // 64) * 64,
        max_new_tokens=max_new_tokens,
        temperature=mode.temperature,
        top_p=1.0,
        top_k=0,
        interruptions=False,
    )


def run_mode(
    model: Model,
    problems: Sequence[Problem],
    mode: Mode,
    *,
    verifier_name: str,
    pool,
    max_new_tokens: int,
    slots: int,
    seed: int = 0,
    should_stop: Optional[Callable[[], bool]] = None,
) -> Optional[tuple[list, dict]]:
    """(one record per completion, the mode's summary), or None when `should_stop` ended it."""
    import jax

    from scalerl_jax import mesh as mesh_lib
    from scalerl_jax.config import MeshConfig
    from scalerl_jax.rewards import verifier_by_name
    from scalerl_jax.sampler.driver import Prompt as SamplerPrompt
    from scalerl_jax.sampler.driver import driver_token_ids
    from scalerl_jax.sampler.engine import Engine
    from scalerl_jax.train.evaluate import sample_groups, score_groups

    scfg = sampler_config(problems, mode, max_new_tokens=max_new_tokens, slots=slots)
    engine = Engine(
        model.cfg, mesh_lib.sampler_mesh(MeshConfig(), jax.local_devices()), scfg, seed=seed
    )
    params = engine.load_params(model.params)
    stream = [
        SamplerPrompt(p.prompt_id, p.prompt_tokens, {"answer": p.reference}, p.index)
        for p in problems
    ]
    start = time.monotonic()
    groups, stats, stopped = sample_groups(
        engine,
        params,
        stream,
        k=mode.k,
        version=0,
        seed=seed,
        should_stop=should_stop,
        # One prefill length (the longest prompt's): one program to compile instead of one
        # per power of two, for padding that costs little next to the decoding.
        driver_kwargs=dict(
            driver_token_ids(scfg, model.tokenizer, max_forced_tokens=engine.max_forced_tokens),
            min_prefill_bucket=scfg.max_prefill_length,
        ),
        label=f"{mode.name}: sampling {len(problems)} problems x {mode.k}",
    )
    if stopped:
        return None
    sampled_s = time.monotonic() - start
    groups.sort(key=lambda g: g.ticket)
    with phase(f"{mode.name}: verifying {len(groups) * mode.k} completions"):
        scored = score_groups(
            groups, tokenizer=model.tokenizer, verifier=verifier_by_name(verifier_name), pool=pool
        )
    records = _records(groups, problems, mode, model, scored.correct, verifier_name)
    return records, summarize(records, mode, scored, stats, sampled_s, verifier_name)


def _records(groups, problems, mode: Mode, model: Model, correct, verifier_name: str) -> list:
    """One record per completion, in problem order then sample order."""
    from scalerl_jax.rewards import extract_answer

    records, n = [], 0
    for g in groups:
        p = problems[g.ticket]
        for j, c in enumerate(g.completions):
            text = model.tokenizer.decode(c.tokens, skip_special_tokens=True)
            extracted = extract_answer(text) if verifier_name == "math" else None
            records.append(
                {
                    "mode": mode.name,
                    "temperature": mode.temperature,
                    "index": p.index,
                    "prompt_id": p.prompt_id,
                    "sample": j,
                    "question": p.question,
                    "reference": p.reference,
                    "prompt": p.prompt,
                    "completion": text,
                    "extracted": extracted,
                    "correct": bool(correct[n]),
                    "finish_reason": c.finish_reason,
                    "num_tokens": int(len(c.tokens)),
                    "completion_tokens": [int(t) for t in c.tokens],
                    "prompt_tokens": list(p.prompt_tokens),
                }
            )
            n += 1
    return records


def evaluate_model(
    model: Model,
    problems: Sequence[Problem],
    modes: Sequence[Mode],
    *,
    out: str,
    verifier_name: str,
    max_new_tokens: int,
    slots: int,
    workers: int,
    timeout_s: float,
    processes: bool,
    seed: int = 0,
    about: Optional[dict] = None,
    should_stop: Optional[Callable[[], bool]] = None,
) -> Optional[dict]:
    """Run every mode, write the completions to `out` and the summary beside it; returns the
    summary, or None (nothing written) when `should_stop` ended it. `workers`, `timeout_s` and
    `processes` size the verifier pool as RewardConfig and `rewards.use_processes` do."""
    from scalerl_jax.rewards import RewardPool

    if not problems:
        raise EvalError("no problems to evaluate (--num-prompts 0, or an empty split)")
    records: list = []
    summary = {
        "model": model.source,
        "problems": len(problems),
        "max_new_tokens": max_new_tokens,
        "seed": seed,
        "verifier": verifier_name,
        **(about or {}),
        "modes": {},
    }
    with RewardPool(workers, timeout_s, processes=processes) as pool:
        for mode in modes:
            done = run_mode(
                model,
                problems,
                mode,
                verifier_name=verifier_name,
                pool=pool,
                max_new_tokens=max_new_tokens,
                slots=slots,
                seed=seed,
                should_stop=should_stop,
            )
            if done is None:
                return None
            records += done[0]
            summary["modes"][mode.name] = done[1]
            log.info("%s", headline(mode.name, done[1]))
    summary["completions_file"] = os.path.abspath(out)
    write_results(out, records, summary)
    return summary


def summarize(
    records: list, mode: Mode, scored, stats: dict, seconds: float, verifier_name: str
) -> dict:
    from scalerl_jax.train.evaluate import rate_and_se

    correct = np.array([r["correct"] for r in records], bool).reshape(-1, mode.k)
    out = {
        "temperature": mode.temperature,
        "k": mode.k,
        "problems": int(correct.shape[0]),
        "completions": int(correct.size),
        "correct": int(correct.sum()),
    }
    if mode.k == 1:
        out["pass@1"], out["pass@1_se"] = rate_and_se(correct[:, 0].astype(np.float64))
    else:
        out[f"mean@{mode.k}"], out[f"mean@{mode.k}_se"] = rate_and_se(
            np.asarray(correct.mean(axis=1))
        )
        out[f"pass@{mode.k}"], out[f"pass@{mode.k}_se"] = rate_and_se(
            np.asarray(correct.any(axis=1), np.float64)
        )
    if verifier_name == "math":
        out["no_answer"] = sum(r["extracted"] is None for r in records)
    out.update(
        truncated=sum(r["finish_reason"] == "truncated" for r in records),
        verifier_timeouts=int(scored.num_timeouts),
        verifier_errors=int(scored.num_errors),
        tokens=int(stats["tokens"]),
        mean_completion_tokens=float(np.mean([r["num_tokens"] for r in records])),
        seconds=seconds,
        tokens_per_s=stats["tokens"] / max(seconds, 1e-9),
    )
    return out


def headline(name: str, s: dict) -> str:
    """One line of a mode's summary: its main figures with standard errors, then the counts."""

    def pm(key):
        se = s.get(f"{key}_se")
        return f"{key} {s[key]:.3f}" + (f" ± {se:.3f}" if se is not None else "")

    figures = [pm("pass@1")] if s["k"] == 1 else [pm(f"mean@{s['k']}"), pm(f"pass@{s['k']}")]
    counts = [f"{s['correct']}/{s['completions']} correct"]
    if "no_answer" in s:
        counts.append(f"{s['no_answer']} without an answer")
    counts += [
        f"{s['truncated']} truncated",
        f"{s['verifier_timeouts']} verifier timeouts",
        f"{s['verifier_errors']} verifier errors",
        f"{s['mean_completion_tokens']:.0f} tokens/completion",
        f"{s['seconds']:.0f} s ({s['tokens_per_s']:.0f} tokens/s)",
    ]
    return (
        f"{name} (T={s['temperature']:g}): {', '.join(figures)} over {s['problems']} "
        f"problems; {', '.join(counts)}"
    )


def summary_path(out: str) -> str:
    """Where the summary goes beside the completions file: X.jsonl -> X.summary.json."""
    return (out[: -len(".jsonl")] if out.endswith(".jsonl") else out) + ".summary.json"


def write_results(out: str, records: list, summary: dict) -> str:
    """The completions (JSONL) at `out` and the summary beside it; each written whole, then
    renamed into place. Returns the summary's path."""
    from scalerl_jax.rundir import atomic_write

    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    atomic_write(out, "".join(json.dumps(r) + "\n" for r in records))
    path = summary_path(out)
    atomic_write(path, json.dumps(summary, indent=2) + "\n")
    return path
