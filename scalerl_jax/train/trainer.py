"""The training loop, top to bottom: run directory, meshes, data, initial policy (SFT warm-up),
state and step, resume, sampler, loop, fit. `_run` reads as that list; the start-up phases it
calls are in train/startup.py, the SFT warm-up, export and fit in train/stages.py. Every host
runs this same program and host 0 writes the run directory. What a run writes, how it resumes
and how it stops: docs/architecture.md, "The training loop".
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from typing import Any, NamedTuple, Optional

import jax
import numpy as np

from scalerl_jax import metrics as metrics_lib
from scalerl_jax import rundir
from scalerl_jax.config import ConfigError, RunConfig, field_defaults
from scalerl_jax.models.transformer import matmul_params
from scalerl_jax.multihost import allgather_objects
from scalerl_jax.heartbeat import phase
from scalerl_jax.progress import Progress
from scalerl_jax.rl.curriculum import NoPositiveResampling
from scalerl_jax.train import batch as batch_lib
from scalerl_jax.train import stages
from scalerl_jax.train import startup
from scalerl_jax.train.evaluate import evaluate, group_domain, score_groups
from scalerl_jax.train.pipeline import Schedule
from scalerl_jax.train.step import batch_shards

log = logging.getLogger(__name__)


@dataclasses.dataclass
class RunResult:
    workdir: str
    step: int
    last: dict  # the last train record
    evals: list  # this run directory's eval records
    fit: Optional[dict] = None  # report.headline of the end-of-run fit
    fit_reason: Optional[str] = None  # why there is no fit
    domain_fits: dict = dataclasses.field(default_factory=dict)  # report.domain_headlines
    stopped_by: Optional[str] = None  # "SIGTERM" / "SIGINT" when a signal ended the run early
    model_dir: Optional[str] = None  # the final policy as an HF checkpoint (a finished run)


def load_tokenizer(cfg: RunConfig):
    if all(src.startswith("synthetic:") for src in cfg.data.sources()):
        from scalerl_jax.data.synthetic_tasks import CharTokenizer

        return CharTokenizer()
    if cfg.hf_checkpoint is None:
        raise ConfigError(
            f"DataConfig.source={cfg.data.source!r} needs a tokenizer (sources "
            f"{list(cfg.data.sources())}): set RunConfig.hf_checkpoint to an HF "
            "model directory"
        )
    from scalerl_jax.models.tokenizer import load_tokenizer as load

    return load(cfg.hf_checkpoint)


def run(
    cfg: RunConfig,
    *,
    allow_config_change: bool = False,
    wandb_project: Optional[str] = None,
    fit: bool = True,
) -> RunResult:
    """Train `cfg` in `cfg.workdir` (resuming it when it holds a checkpoint). See the module
    docstring. Raises ConfigError / DataError / WorkdirInUseError before writing anything."""
    Schedule.from_config(cfg.pipeline, jax.process_count())  # enough prompts for every host
    tokenizer = load_tokenizer(cfg)
    # Everything the run opens is closed in reverse order however it ends; the lock goes last.
    with contextlib.ExitStack() as cleanup:
        if jax.process_index() == 0:
            cleanup.callback(rundir.lock_workdir(cfg.workdir).release)
        return _run(
            cfg,
            tokenizer=tokenizer,
            cleanup=cleanup,
            allow_config_change=allow_config_change,
            wandb_project=wandb_project,
            fit=fit,
        )


def _run(
    cfg: RunConfig,
    *,
    tokenizer,
    cleanup: contextlib.ExitStack,
    allow_config_change: bool,
    wandb_project: Optional[str],
    fit: bool,
) -> RunResult:
    if jax.process_index() == 0:
        rundir.check_config(
            cfg.workdir, cfg.to_dict(), allow_change=allow_config_change, defaults=field_defaults()
        )
    ctx = _start(cfg, tokenizer=tokenizer, cleanup=cleanup, wandb_project=wandb_project)
    state, start = ctx.policy.state, ctx.policy.start
    if startup.eval_missing(cfg, start):
        _evaluate(ctx, start, ctx.sampling.params)
    last, stopped_by = {}, None
    if ctx.policy.checkpoints.preempted:  # a stop signal in start-up or the first evaluation
        stopped_by = ctx.policy.checkpoints.stop_signal
        log.warning(
            "%s: stopped before training step %d; nothing was trained, so nothing to "
            "save (re-run the same command to resume)",
            stopped_by,
            start + 1,
        )
    else:
        state, last, stopped_by = _train(ctx, state)
    return _finish(ctx, state, last, stopped_by, fit=fit)


def _start(
    cfg: RunConfig,
    *,
    tokenizer,
    cleanup: contextlib.ExitStack,
    wandb_project: Optional[str],
) -> _Run:
    """Open what the run uses, in order: meshes, data, policy, metrics, sampler, progress bar."""
    starting = phase(
        "start-up: data, reward workers, initial policy, sampler", announce=True
    ).begin()
    cleanup.callback(starting.end)
    meshes = startup.Meshes.for_run(cfg)
    curriculum = NoPositiveResampling(threshold=cfg.pipeline.retire_pass_rate)
    retire = cfg.pipeline.no_positive_resampling
    # `skip` looks `curriculum` up at call time: it sees the one restored below.
    data = startup.open_data(
        cfg,
        tokenizer=tokenizer,
        cleanup=cleanup,
        skip=lambda pid: curriculum.is_retired(pid) if retire else False,
    )
    first_step_done = threading.Event()  # before this invocation's first step, nothing is unsaved
    policy = startup.open_policy(
        cfg,
        tokenizer=tokenizer,
        cleanup=cleanup,
        mesh=meshes.trainer,
        data=data,
        first_step_done=first_step_done,
        wandb_project=wandb_project,
    )
    if "curriculum" in policy.meta:
        curriculum = NoPositiveResampling.from_dict(policy.meta["curriculum"])
    metrics = startup.open_metrics(cfg, cleanup=cleanup, policy=policy)
    schedule = Schedule.from_config(cfg.pipeline, jax.process_count(), jax.process_index())
    sampling = startup.open_sampler(
        cfg,
        tokenizer=tokenizer,
        cleanup=cleanup,
        meshes=meshes,
        schedule=schedule,
        data=data,
        policy=policy,
    )
    starting.end()
    return _Run(
        cfg=cfg,
        tokenizer=tokenizer,
        meshes=meshes,
        data=data,
        curriculum=curriculum,
        policy=policy,
        metrics=metrics,
        meter=_compute_meter(policy),
        sampling=sampling,
        bar=cleanup.enter_context(_progress_bar(cfg, policy.start)),
        first_step_done=first_step_done,
    )


def _progress_bar(cfg: RunConfig, start: int) -> Progress:
    return Progress(
        "rl",
        cfg.steps,
        initial=start,
        tokens_key="batch_seq_tokens",
        enabled=None if jax.process_index() == 0 else False,
    )


def _compute_meter(policy: startup.Policy) -> metrics_lib.ComputeMeter:
    """The run's compute meter, restored from the checkpoint when it has one."""
    model_cfg = policy.model_cfg
    meter = metrics_lib.ComputeMeter(
        matmul_params(model_cfg), model_cfg.num_layers, model_cfg.num_heads * model_cfg.dim_per_head
    )
    if "compute" in policy.meta:
        meter.load_state_dict(policy.meta["compute"])
    return meter


@dataclasses.dataclass(frozen=True)
class _Run:
    """What the loop, the evaluations and the end of a run use, opened by `_start` and closed
    by the run's ExitStack."""

    cfg: RunConfig
    tokenizer: Any
    meshes: startup.Meshes
    data: startup.Data
    curriculum: NoPositiveResampling
    policy: startup.Policy  # its `state` is the start's; the loop carries the state on
    metrics: startup.Metrics
    meter: metrics_lib.ComputeMeter
    sampling: startup.Sampling
    bar: Progress
    first_step_done: threading.Event

    def record(self, event: str, step: int, **fields) -> dict:
        return self.metrics.record(event, step, **fields)


def _train(ctx: _Run, state):
    """The RL loop until `cfg.steps` or a stop signal: (state, the last train record, the
    signal's name or None)."""
    cfg, checkpoints, driver = ctx.cfg, ctx.policy.checkpoints, ctx.sampling.driver
    last, stopped_by, skipped_in_a_row, tokens_seen = {}, None, 0, 0
    while stopped_by is None and int(state.step) < cfg.steps:
        t0 = time.monotonic()
        step, version = int(state.step) + 1, int(state.step)
        step_phase = phase(
            f"rl step {step}/{cfg.steps}"
            + ("" if ctx.first_step_done.is_set() else " (the first step compiles the train step)"),
            detail=lambda: f"{driver.stats['completions']} completions sampled so far",
        ).begin()
        got = _collect(ctx, step, version, tokens_seen=tokens_seen)
        tokens_seen = got.tokens_seen
        t1 = time.monotonic()
        state, step_metrics = ctx.policy.train_step(state, got.batch)
        step_metrics = {k: float(v) for k, v in jax.device_get(step_metrics).items()}
        t_train = time.monotonic() - t1
        ctx.first_step_done.set()
        pushed = ctx.sampling.rollouts.publish(lambda: ctx.sampling.sync(state.params), step)
        last = _record_train(
            ctx, step, got, step_metrics, t_train=t_train, step_wall=time.monotonic() - t0
        )
        ctx.bar.update(step, last)
        _write_forecasts(ctx, ctx.metrics.forecaster.poll())
        skipped_in_a_row = skipped_in_a_row + 1 if step_metrics["skipped"] else 0
        _check_not_diverged(skipped_in_a_row, cfg, step, step_metrics)
        if step % cfg.eval.every_steps == 0 or step == cfg.steps:
            params = pushed if pushed is not None else ctx.sampling.sync(state.params)
            _evaluate(ctx, step, params)
        with phase(f"checkpoint of step {step}"):
            checkpoints.maybe_save(step, state, lambda: _meta(ctx, state))
        step_phase.end()
        if checkpoints.preemption_saved:
            stopped_by = checkpoints.stop_signal
            log.warning(
                "%s: stopped after saving step %d; re-run the same command to resume",
                stopped_by,
                step,
            )
    return state, last, stopped_by


@dataclasses.dataclass(frozen=True)
class _Collected:
    """A step's data: every host's scored groups and the global batch made of them."""

    shared: _Shared
    batch: Any
    info: dict  # batch_lib.from_groups's figures
    rollout: dict  # Rollouts.take's figures
    tokens_seen: int  # tokens this host's sampler generated so far


def _collect(ctx: _Run, step: int, version: int, *, tokens_seen: int) -> _Collected:
    """The groups of `step`, scored and shared by all hosts, as the global batch."""
    cfg, driver = ctx.cfg, ctx.sampling.driver
    local, roll = ctx.sampling.rollouts.take(step, version)
    scored = score_groups(
        local, tokenizer=ctx.tokenizer, verifier=ctx.data.verifiers, pool=ctx.data.pool
    )
    sampled, tokens_seen = int(driver.stats["tokens"]) - tokens_seen, int(driver.stats["tokens"])
    data = _share(local, scored, sampled, cfg.pipeline.generations_per_prompt)
    if cfg.pipeline.no_positive_resampling:
        ctx.curriculum.update([g.prompt_id for g in data.groups], data.correct.mean(axis=1))
    batch, info = batch_lib.from_groups(
        data.groups,
        data.rewards,
        loss_cfg=cfg.loss,
        num_prompts=cfg.pipeline.prompts_per_step,
        micro_batches=cfg.optim.micro_batches,
        row_multiple=batch_shards(ctx.meshes.trainer),
        seq_bucket=cfg.pipeline.seq_bucket,
        correct=data.correct,
        pad_id=ctx.tokenizer.pad_id,
    )
    return _Collected(shared=data, batch=batch, info=info, rollout=roll, tokens_seen=tokens_seen)


def _record_train(
    ctx: _Run,
    step: int,
    got: _Collected,
    step_metrics: dict,
    *,
    t_train: float,
    step_wall: float,
) -> dict:
    """Charge the step's compute to the meter and write its train record."""
    data, info, roll = got.shared, got.info, got.rollout
    groups, correct, rewards, split = data.groups, data.correct, data.rewards, ctx.meshes.split
    # Compute: colocated devices are charged to whichever side used them.
    completions = [c for g in groups for c in g.completions]
    mean_len = float(np.mean([len(c.tokens) for c in completions]))
    mean_prompt = float(np.mean([len(g.prompt_tokens) for g in groups]))
    ctx.meter.add_sampler(
        seconds=step_wall - t_train if split.colocated else step_wall,
        devices=len(split.sampler) * jax.process_count(),
        tokens=data.sampled_tokens,
        context_len=mean_prompt + mean_len / 2,
    )
    ctx.meter.add_trainer(
        seconds=t_train if split.colocated else step_wall,
        devices=len(split.trainer),
        tokens=info["seq_tokens"],
        context_len=info["seq_len"] / 2,
    )
    return ctx.record(
        "train",
        step,
        **step_metrics,
        **{f"batch_{k}": v for k, v in info.items()},
        reward_mean=float(rewards.mean()),
        pass_rate_train=float(correct.mean()),
        truncation_rate=np.mean([c.finish_reason == "truncated" for c in completions]),
        interruption_rate=np.mean([c.interrupted for c in completions]),
        mean_completion_len=mean_len,
        **_per_domain_train(groups, correct),
        **roll,
        trainer_wait_frac=roll["wait_s"] / max(step_wall, 1e-9),
        reward_timeouts=data.timeouts,
        reward_errors=data.errors,
        retired_prompts=ctx.curriculum.num_retired,
        policy_version=step,
        train_s=t_train,
        step_s=step_wall,
        samples_per_s=len(completions) / max(step_wall, 1e-9),
    )


def _evaluate(ctx: _Run, step: int, params) -> None:
    """Evaluate `params` as `step` and write its record, unless a stop signal cuts the
    evaluation short."""
    cfg, checkpoints, sampling = ctx.cfg, ctx.policy.checkpoints, ctx.sampling
    hosts, host = jax.process_count(), jax.process_index()
    with phase(f"evaluation of step {step}"):
        result = evaluate(
            sampling.engine,
            params,
            ctx.data.validation[host::hosts],
            tokenizer=ctx.tokenizer,
            k=cfg.eval.k,
            verifier=ctx.data.verifiers,
            pool=ctx.data.pool,
            driver_kwargs=sampling.driver_kwargs,
            version=step,
            seed=sampling.seed,
            should_stop=lambda: checkpoints.stop_signal is not None,
        )
        if result is None:
            log.warning(
                "%s: evaluation of step %d stopped unfinished; no record written "
                "(a resumed run evaluates step %d again if it was due)",
                checkpoints.stop_signal or "stop signal",
                step,
                step,
            )
            return
        rec = ctx.record("eval", step, compute=ctx.meter.compute(), **result)
        ctx.metrics.forecaster.submit(rec)
    domains = "".join(f", {d} {r:.3f}" for d, r in result.get("per_domain", {}).items())
    log.info(
        "eval step %d: pass rate %.3f%s (%d prompts x %d)",
        step,
        result["pass_rate"],
        domains,
        result["num_prompts"],
        cfg.eval.k,
    )
    ctx.bar.set_eval(step, rec["pass_rate"])


def _write_forecasts(ctx: _Run, done: list) -> None:
    for fields in done:
        ctx.bar.set_forecast(ctx.record("forecast", **fields))


def _meta(ctx: _Run, state) -> dict:
    """The checkpoint's host-side state. Collective: every host's data cursor goes in."""
    return {
        "policy_version": int(state.step),
        "curriculum": ctx.curriculum.to_dict(),
        "data": allgather_objects(ctx.sampling.feed.state_dict()),
        "compute": ctx.meter.state_dict(),
    }


def _finish(ctx: _Run, state, last: dict, stopped_by: Optional[str], *, fit: bool) -> RunResult:
    """A finished run's export and final save; then, however the run ended, the last
    forecasts, the sampler's stop, the pending checkpoint writes, and the fit."""
    cfg, checkpoints = ctx.cfg, ctx.policy.checkpoints
    main = jax.process_index() == 0
    model_dir = None
    if stopped_by is None:  # finished: the policy for transformers, then the last checkpoint
        # Export first: a run that a re-run finds complete then always has its model/.
        model_dir = stages.export(state.params, ctx.policy.model_cfg, ctx.tokenizer, cfg)
        with phase(f"saving step {int(state.step)}"):
            checkpoints.save(int(state.step), state, lambda: _meta(ctx, state))
    _write_forecasts(
        ctx, ctx.metrics.forecaster.finish(timeout=None if stopped_by is None else 0.0)
    )
    ctx.bar.close()
    ctx.sampling.rollouts.stop()
    with phase("waiting for checkpoint writes"):
        checkpoints.wait()
    result = RunResult(
        cfg.workdir,
        int(state.step),
        last,
        metrics_lib.read_metrics(cfg.workdir).of("eval") if main else [],
        stopped_by=stopped_by,
        model_dir=model_dir,
    )
    if fit and main and stopped_by is None:
        with phase("fitting the scaling curve"):
            result.fit, result.fit_reason, result.domain_fits = stages.fit(cfg.workdir)
    return result


class _Shared(NamedTuple):
    groups: list  # every host's groups of this step, in host order
    correct: np.ndarray  # [groups, G] bool
    rewards: np.ndarray  # [groups, G] float32
    sampled_tokens: int  # tokens the samplers of all hosts generated since the last step
    timeouts: int
    errors: int


def _share(local, scored, sampled: int, group_size: int) -> _Shared:
    """This host's scored groups -> every host's (the same on each, for the global batch)."""
    parts = allgather_objects(
        (local, scored.correct, scored.rewards, sampled, scored.num_timeouts, scored.num_errors)
    )
    return _Shared(
        groups=[g for part in parts for g in part[0]],
        correct=np.concatenate([np.asarray(p[1], bool) for p in parts]).reshape(-1, group_size),
        rewards=np.concatenate([np.asarray(p[2], np.float32) for p in parts]).reshape(
            -1, group_size
        ),
        sampled_tokens=sum(p[3] for p in parts),
        timeouts=sum(p[4] for p in parts),
        errors=sum(p[5] for p in parts),
    )


def _per_domain_train(groups, correct: np.ndarray) -> dict:
    """A mixture's train record fields: each domain's pass rate over this step's samples and
    its number of prompts; {} for a single source."""
    domains = np.array([group_domain(g) for g in groups], dtype=object)
    names = sorted({d for d in domains if d})
    if not names:
        return {}
    return {
        "per_domain_train": {d: float(correct[domains == d].mean()) for d in names},
        "per_domain_prompts_train": {d: int((domains == d).sum()) for d in names},
    }


def _check_not_diverged(skipped_in_a_row: int, cfg: RunConfig, step: int, m: dict) -> None:
    if skipped_in_a_row >= cfg.max_skipped_steps:
        raise FloatingPointError(
            f"{skipped_in_a_row} consecutive steps (up to step {step}) had a non-finite loss or "
            f"gradient (loss {m['loss']}, grad_norm {m['grad_norm']}); stopping instead of "
            f"skipping silently (RunConfig.max_skipped_steps={cfg.max_skipped_steps}). The last "
            f"checkpoint is intact; lower OptimConfig.learning_rate={cfg.optim.learning_rate} "
            "or check the data"
        )
