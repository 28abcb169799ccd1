"""The training loop, top to bottom: run directory, meshes, data, initial policy (SFT warm-up),
state and step, resume, sampler, loop, fit.

Every host runs this same program. Each host samples its own share of every step's prompts on
its sampler devices (train/pipeline.py: PipelineRL-k, ppo_off_policy or sync, all by admission
of ticketed prompts), scores them, and the hosts exchange their scored groups so that each
builds the same global batch for the jitted step on the trainer mesh. Host 0 writes the run
directory: `config.json`, `metrics.jsonl` (schema in metrics.py; a `forecast` record follows
each evaluation, scaling/forecast.py), `tensorboard/`, Orbax `checkpoints/`, `sft/` (the
warm-up's HF checkpoint) and, at the end, `model/` (the final policy as an HF checkpoint that
transformers loads, with the initial checkpoint's tokenizer files) and `fit/`.

Resume: re-running the same command restores the newest good checkpoint (params, optimizer,
step, RNG, curriculum, every host's data cursor and in-flight prompts, compute meter), and the
records written after it are superseded (`metrics.truncate_after`), so metrics.jsonl keeps one
record per step and per evaluation and the compute axis does not depend on when a kill landed.

Progress and stop signals. Every slow part runs inside a `heartbeat.phase`, so the heartbeat
names it (start-up, evaluation with its count of completions, each step, the save, the export).
SIGTERM / Ctrl-C set the checkpointer's stop flag; an evaluation checks it between sampler calls
and ends without a record (a resumed run redoes an evaluation that was due), the loop then saves
the step and stops. Before this invocation's first step ends nothing is unsaved, so there the
`interrupt.Watchdog` ends the process within seconds even inside a compilation.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import shutil
import time
from typing import NamedTuple, Optional

import jax
import numpy as np

from scalerl_jax import checkpoint as ckpt_lib
from scalerl_jax import mesh as mesh_lib
from scalerl_jax import metrics as metrics_lib
from scalerl_jax import rundir
from scalerl_jax.config import ConfigError, RunConfig, field_defaults
from scalerl_jax.data.mixture import open_source
from scalerl_jax.interrupt import Watchdog
from scalerl_jax.models.tokenizer import copy_tokenizer_files
from scalerl_jax.models.transformer import matmul_params
from scalerl_jax.multihost import allgather_objects, barrier
from scalerl_jax.heartbeat import HEARTBEAT, phase
from scalerl_jax.progress import SFT_FIELDS, Progress
from scalerl_jax.rewards import RewardPool, answer_checks, domain_verifiers, use_processes
from scalerl_jax.rl.curriculum import NoPositiveResampling
from scalerl_jax.sampler.driver import Driver, driver_token_ids
from scalerl_jax.sampler.engine import Engine
from scalerl_jax.sampler.weight_sync import WeightSync
from scalerl_jax.scaling import report
from scalerl_jax.scaling.forecast import Forecaster
from scalerl_jax.tracking import Tracker
from scalerl_jax.train import batch as batch_lib
from scalerl_jax.train import sft as sft_lib
from scalerl_jax.train import state as state_lib
from scalerl_jax.train.evaluate import evaluate, group_domain, score_groups
from scalerl_jax.train.feed import PromptFeed
from scalerl_jax.train.pipeline import Rollouts, Schedule
from scalerl_jax.train.step import batch_shards, make_train_step

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
        from scalerl_jax.data.synthetic import CharTokenizer
        return CharTokenizer()
    if cfg.hf_checkpoint is None:
        raise ConfigError(f"DataConfig.source={cfg.data.source!r} needs a tokenizer (sources "
                          f"{list(cfg.data.sources())}): set RunConfig.hf_checkpoint to an HF "
                          "model directory")
    from scalerl_jax.models.tokenizer import load_tokenizer as load
    return load(cfg.hf_checkpoint)


def run(cfg: RunConfig, *, allow_config_change: bool = False,
        wandb_project: Optional[str] = None, fit: bool = True) -> RunResult:
    """Train `cfg` in `cfg.workdir` (resuming it when it holds a checkpoint). See the module
    docstring. Raises ConfigError / DataError / WorkdirInUseError before writing anything."""
    Schedule.from_config(cfg.pipeline, jax.process_count())  # enough prompts for every host
    tokenizer = load_tokenizer(cfg)
    # Everything the run opens is closed in reverse order however it ends; the lock goes last.
    with contextlib.ExitStack() as cleanup:
        if jax.process_index() == 0:
            cleanup.callback(rundir.lock_workdir(cfg.workdir).release)
        return _run(cfg, tokenizer, cleanup, allow_config_change, wandb_project, fit)


def _run(cfg: RunConfig, tokenizer, cleanup: contextlib.ExitStack, allow_config_change,
         wandb_project, fit) -> RunResult:
    main = jax.process_index() == 0
    if main:
        rundir.check_config(cfg.workdir, cfg.to_dict(), allow_change=allow_config_change,
                            defaults=field_defaults())
    starting = phase("start-up: data, reward workers, initial policy, sampler",
                     announce=True).begin()
    cleanup.callback(starting.end)

    # Meshes: trainer devices of all hosts, this host's sampler devices.
    split = mesh_lib.split_devices(cfg.mesh)
    trainer_mesh = mesh_lib.trainer_mesh(cfg.mesh, split.trainer)
    sampler_mesh = mesh_lib.sampler_mesh(cfg.mesh, split.sampler)
    hosts, host = jax.process_count(), jax.process_index()
    schedule = Schedule.from_config(cfg.pipeline, hosts, host)

    # Data: this host's shard of the training prompts (one source, or a mixture of domains
    # drawn by weight); the validation set, split over hosts. Each domain's verifier.
    curriculum = NoPositiveResampling(threshold=cfg.pipeline.retire_pass_rate)
    retire = cfg.pipeline.no_positive_resampling
    verifiers = domain_verifiers(cfg.data, cfg.reward.verifier, cfg.reward.code_isolation)
    source = open_source(cfg.data, tokenizer, process_index=host, process_count=hosts,
                         skip=lambda pid: curriculum.is_retired(pid) if retire else False,
                         check_answers=answer_checks(cfg.data, cfg.reward.verifier))
    validation = source.validation()[:cfg.eval.num_prompts]
    # Thread or child-process workers, decided from all domains' sources.
    processes = use_processes(cfg.reward, cfg.data)
    pool = RewardPool(cfg.reward.workers, cfg.reward.timeout_s,
                      reward_correct=cfg.loss.reward_correct,
                      reward_incorrect=cfg.loss.reward_incorrect, processes=processes)
    cleanup.callback(pool.close)

    # Resume from the newest good checkpoint; else the initial policy (SFT warm-up, HF, init).
    _, abstract = state_lib.abstract_train_state(cfg.model, cfg.optim, trainer_mesh, cfg.seed)
    checkpoints = ckpt_lib.Checkpointer(os.path.join(cfg.workdir, "checkpoints"),
                                        save_every=cfg.checkpoint_every,
                                        keep=cfg.keep_checkpoints, keep_every=cfg.keep_every)
    checkpoints.install_signal_handlers()
    cleanup.callback(checkpoints.close)
    trained_here = 0  # steps this invocation finished: before the first, nothing is unsaved
    cleanup.enter_context(Watchdog(
        can_exit=lambda: trained_here == 0, describe=HEARTBEAT.line,
        nothing_lost="nothing trained since the last checkpoint, so nothing to save (re-run "
                     "the same command to resume)",
        acknowledged=lambda: checkpoints.stop_signal is not None))
    restored = checkpoints.restore(abstract)
    if main:  # the first write: everything above has validated
        rundir.write_config(cfg.workdir, cfg.to_dict())
    tracker = cleanup.enter_context(Tracker(cfg.workdir, enabled=main,
                                            wandb_project=wandb_project))
    if restored is None:
        init = cfg.hf_checkpoint
        if cfg.sft is not None:
            init = _warm_up(cfg, trainer_mesh, tokenizer, source.validation(), tracker)
        model_cfg, graphdef, state = state_lib.create_train_state(
            cfg.model, cfg.optim, trainer_mesh, seed=cfg.seed, hf_checkpoint=init)
        meta = {}
    else:
        (state, meta), model_cfg = restored, cfg.model
        graphdef = state_lib.graphdef_of(model_cfg)
        log.info("resumed from step %d in %s", int(state.step), cfg.workdir)
    train_step = make_train_step(graphdef, abstract, trainer_mesh, model_cfg=model_cfg,
                                 loss_cfg=cfg.loss, optim_cfg=cfg.optim,
                                 num_prompts=cfg.pipeline.prompts_per_step,
                                 max_length=cfg.sampler.max_new_tokens)
    start = int(state.step)
    if "curriculum" in meta:  # `source.skip` looks the name up at call time: it sees this one
        curriculum = NoPositiveResampling.from_dict(meta["curriculum"])
    meter = metrics_lib.ComputeMeter(matmul_params(model_cfg), model_cfg.num_layers,
                                     model_cfg.num_heads * model_cfg.dim_per_head)
    if "compute" in meta:
        meter.load_state_dict(meta["compute"])

    # Metrics: records after the restored step are superseded.
    writer = None
    if main:
        metrics_lib.truncate_after(cfg.workdir, start)
        writer = cleanup.enter_context(metrics_lib.MetricsWriter(cfg.workdir))

    def record(event: str, step: int, **fields) -> dict:
        if writer is None:
            return {"event": event, "step": step, **fields}
        rec = writer.write(event, step, **fields)
        tracker.write(rec)
        return rec

    # Online forecast (process 0): each evaluation queues a refit of the sigmoid in a
    # low-priority child process; finished forecasts are written here, after the step that
    # saw them.
    forecaster = cleanup.enter_context(Forecaster.for_run(cfg.forecast, cfg.workdir,
                                                          total_steps=cfg.steps, enabled=main))

    def write_forecasts(done: list) -> None:
        for fields in done:
            bar.set_forecast(record("forecast", **fields))

    record("run", start, schema=metrics_lib.SCHEMA_VERSION, time=time.time(),
           resumed=restored is not None, config=cfg.to_dict())
    # The base policy is evaluated at step 0; a resumed run re-evaluates its restored step only
    # if that evaluation was due and did not survive. Host 0 knows; all hosts must agree.
    missing = main and (start == 0 or start % cfg.eval.every_steps == 0) and not any(
        e["step"] == start for e in metrics_lib.read_metrics(cfg.workdir).of("eval"))
    missing = allgather_objects(missing)[0]

    # Sampler: engine on this host's sampler mesh, weights synced from the trainer mesh.
    engine = Engine(model_cfg, sampler_mesh, cfg.sampler, seed=cfg.seed)
    sync = WeightSync.for_engine(trainer_mesh, engine)  # engine dtypes, bounded groups
    feed = PromptFeed(source, tokenizer)
    if "data" in meta:
        feed.load_state_dict(meta["data"][host])
    driver_kwargs = driver_token_ids(cfg.sampler, tokenizer,
                                     max_forced_tokens=engine.max_forced_tokens)
    sampler_params = sync(state.params)
    sample_seed = cfg.seed + 7919 * host  # tickets are per host: keep hosts' samples apart
    driver = Driver(engine, sampler_params, feed, group_size=cfg.pipeline.generations_per_prompt,
                    version=start, seed=sample_seed,
                    admit=lambda version: feed.issued < schedule.limit(version),
                    max_queued_groups=schedule.window + schedule.batch, **driver_kwargs)
    rollouts = Rollouts(driver, feed, schedule).start()
    cleanup.callback(rollouts.stop)
    n_train, n_sample = len(split.trainer), len(split.sampler) * hosts

    def run_eval(step: int, params) -> Optional[dict]:
        """The eval record of `step`, or None when a stop signal cut the evaluation short."""
        with phase(f"evaluation of step {step}"):
            result = evaluate(engine, params, validation[host::hosts], tokenizer=tokenizer,
                              k=cfg.eval.k, verifier=verifiers, pool=pool,
                              driver_kwargs=driver_kwargs, version=step, seed=sample_seed,
                              should_stop=lambda: checkpoints.stop_signal is not None)
            if result is None:
                log.warning("%s: evaluation of step %d stopped unfinished; no record written "
                            "(a resumed run evaluates step %d again if it was due)",
                            checkpoints.stop_signal or "stop signal", step, step)
                return None
            rec = record("eval", step, compute=meter.compute(), **result)
            forecaster.submit(rec)
        domains = "".join(f", {d} {r:.3f}" for d, r in result.get("per_domain", {}).items())
        log.info("eval step %d: pass rate %.3f%s (%d prompts x %d)", step, result["pass_rate"],
                 domains, result["num_prompts"], cfg.eval.k)
        return rec

    def meta_now() -> dict:  # collective: every host's data cursor goes into the checkpoint
        return {"policy_version": int(state.step), "curriculum": curriculum.to_dict(),
                "data": allgather_objects(feed.state_dict()), "compute": meter.state_dict()}

    last, stopped_by, skipped_in_a_row, tokens_seen = {}, None, 0, 0
    starting.end()
    bar = cleanup.enter_context(Progress("rl", cfg.steps, initial=start,
                                         tokens_key="batch_seq_tokens",
                                         enabled=None if main else False))
    if missing:
        rec = run_eval(start, sampler_params)
        if rec is not None:
            bar.set_eval(start, rec["pass_rate"])
    if checkpoints.preempted:  # a stop signal in start-up or the first evaluation (collective)
        stopped_by = checkpoints.stop_signal
        log.warning("%s: stopped before training step %d; nothing was trained, so nothing to "
                    "save (re-run the same command to resume)", stopped_by, start + 1)
    while stopped_by is None and int(state.step) < cfg.steps:
        t0 = time.monotonic()
        step, version = int(state.step) + 1, int(state.step)
        step_phase = phase(f"rl step {step}/{cfg.steps}" + (
            " (the first step compiles the train step)" if trained_here == 0 else ""),
            detail=lambda: f"{driver.stats['completions']} completions sampled so far").begin()
        local, roll = rollouts.take(step, version)
        scored = score_groups(local, tokenizer=tokenizer, verifier=verifiers, pool=pool)
        sampled, tokens_seen = driver.stats["tokens"] - tokens_seen, driver.stats["tokens"]
        data = _share(local, scored, sampled, cfg.pipeline.generations_per_prompt)
        groups, correct, rewards = data.groups, data.correct, data.rewards
        if retire:
            curriculum.update([g.prompt_id for g in groups], correct.mean(axis=1))
        batch, info = batch_lib.from_groups(
            groups, rewards, loss_cfg=cfg.loss, num_prompts=cfg.pipeline.prompts_per_step,
            micro_batches=cfg.optim.micro_batches, row_multiple=batch_shards(trainer_mesh),
            seq_bucket=cfg.pipeline.seq_bucket, correct=correct, pad_id=tokenizer.pad_id)
        t1 = time.monotonic()
        state, step_metrics = train_step(state, batch)
        step_metrics = {k: float(v) for k, v in jax.device_get(step_metrics).items()}
        t_train = time.monotonic() - t1
        trained_here += 1
        pushed = rollouts.publish(lambda: sync(state.params), step)
        sampler_params = pushed if pushed is not None else sampler_params

        # Compute: colocated devices are charged to whichever side used them.
        step_wall = time.monotonic() - t0
        completions = [c for g in groups for c in g.completions]
        mean_len = float(np.mean([len(c.tokens) for c in completions]))
        mean_prompt = float(np.mean([len(g.prompt_tokens) for g in groups]))
        meter.add_sampler(seconds=step_wall - t_train if split.colocated else step_wall,
                          devices=n_sample, tokens=data.sampled_tokens,
                          context_len=mean_prompt + mean_len / 2)
        meter.add_trainer(seconds=t_train if split.colocated else step_wall,
                          devices=n_train, tokens=info["seq_tokens"],
                          context_len=info["seq_len"] / 2)
        last = record(
            "train", step, **step_metrics, **{f"batch_{k}": v for k, v in info.items()},
            reward_mean=float(rewards.mean()), pass_rate_train=float(correct.mean()),
            truncation_rate=np.mean([c.finish_reason == "truncated" for c in completions]),
            interruption_rate=np.mean([c.interrupted for c in completions]),
            mean_completion_len=mean_len, **_per_domain_train(groups, correct), **roll,
            trainer_wait_frac=roll["wait_s"] / max(step_wall, 1e-9),
            reward_timeouts=data.timeouts, reward_errors=data.errors,
            retired_prompts=curriculum.num_retired, policy_version=step, train_s=t_train,
            step_s=step_wall, samples_per_s=len(completions) / max(step_wall, 1e-9))
        bar.update(step, last)
        write_forecasts(forecaster.poll())
        skipped_in_a_row = skipped_in_a_row + 1 if step_metrics["skipped"] else 0
        _check_not_diverged(skipped_in_a_row, cfg, step, step_metrics)
        if step % cfg.eval.every_steps == 0 or step == cfg.steps:
            params = sampler_params if pushed is not None else sync(state.params)
            rec = run_eval(step, params)
            if rec is not None:
                bar.set_eval(step, rec["pass_rate"])
        with phase(f"checkpoint of step {step}"):
            checkpoints.maybe_save(step, state, meta_now)
        step_phase.end()
        if checkpoints.preemption_saved:
            stopped_by = checkpoints.stop_signal
            log.warning("%s: stopped after saving step %d; re-run the same command to "
                        "resume", stopped_by, step)
    model_dir = None
    if stopped_by is None:  # finished: the policy for transformers, then the last checkpoint
        # Export first: a run that a re-run finds complete then always has its model/.
        model_dir = _export(state.params, model_cfg, tokenizer, cfg)
        with phase(f"saving step {int(state.step)}"):
            checkpoints.save(int(state.step), state, meta_now)
    write_forecasts(forecaster.finish(timeout=None if stopped_by is None else 0.0))
    bar.close()
    rollouts.stop()
    with phase("waiting for checkpoint writes"):
        checkpoints.wait()
    result = RunResult(cfg.workdir, int(state.step), last,
                       metrics_lib.read_metrics(cfg.workdir).of("eval") if main else [],
                       stopped_by=stopped_by, model_dir=model_dir)
    if fit and main and stopped_by is None:
        with phase("fitting the scaling curve"):
            result.fit, result.fit_reason, result.domain_fits = _fit(cfg.workdir)
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
    parts = allgather_objects((local, scored.correct, scored.rewards, sampled,
                               scored.num_timeouts, scored.num_errors))
    return _Shared(
        groups=[g for part in parts for g in part[0]],
        correct=np.concatenate([np.asarray(p[1], bool) for p in parts]).reshape(-1, group_size),
        rewards=np.concatenate([np.asarray(p[2], np.float32) for p in parts]).reshape(
            -1, group_size),
        sampled_tokens=sum(p[3] for p in parts), timeouts=sum(p[4] for p in parts),
        errors=sum(p[5] for p in parts))


def _per_domain_train(groups, correct: np.ndarray) -> dict:
    """A mixture's train record fields: each domain's pass rate over this step's samples and
    its number of prompts; {} for a single source."""
    domains = np.array([group_domain(g) for g in groups], dtype=object)
    names = sorted({d for d in domains if d})
    if not names:
        return {}
    return {"per_domain_train": {d: float(correct[domains == d].mean()) for d in names},
            "per_domain_prompts_train": {d: int((domains == d).sum()) for d in names}}


def _check_not_diverged(skipped_in_a_row: int, cfg: RunConfig, step: int, m: dict) -> None:
    if skipped_in_a_row >= cfg.max_skipped_steps:
        raise FloatingPointError(
            f"{skipped_in_a_row} consecutive steps (up to step {step}) had a non-finite loss or "
            f"gradient (loss {m['loss']}, grad_norm {m['grad_norm']}); stopping instead of "
            f"skipping silently (RunConfig.max_skipped_steps={cfg.max_skipped_steps}). The last "
            f"checkpoint is intact; lower OptimConfig.learning_rate={cfg.optim.learning_rate} "
            "or check the data")


def _warm_up(cfg: RunConfig, mesh, tokenizer, validation, tracker: Tracker) -> str:
    """The SFT stage (reused when WORKDIR/sft is complete); returns its HF model directory."""
    out = os.path.join(cfg.workdir, "sft")
    if sft_lib.is_done(out):
        return sft_lib.model_dir(out)
    tracker.purge("sft", 0)
    with Progress("sft", cfg.sft.steps, fields=SFT_FIELDS, tokens_key="tokens",
                  enabled=None if jax.process_index() == 0 else False) as bar, \
            phase("SFT warm-up", total=cfg.sft.steps, unit="steps") as shown:
        def on_step(step, metrics):
            bar.update(step, metrics)
            shown.update(step)
            tracker.write({"event": "sft", "step": step, **metrics})
        return sft_lib.run_sft(cfg.sft, cfg.model, cfg.data, mesh, tokenizer, out_dir=out,
                               seed=cfg.seed, exclude=validation, hf_checkpoint=cfg.hf_checkpoint,
                               logprob_chunk=cfg.sft.optim.logprob_chunk, on_step=on_step)


def _export(params, model_cfg, tokenizer, cfg: RunConfig) -> str:
    """WORKDIR/model: the policy as an HF checkpoint (written beside, then renamed into place),
    with the tokenizer files of the checkpoint the run started from. Collective."""
    out = os.path.join(cfg.workdir, "model")
    partial = out + ".partial"
    with phase(f"exporting the final policy to {out}", announce=True):
        if jax.process_index() == 0:
            shutil.rmtree(partial, ignore_errors=True)
        ckpt_lib.export_hf(params, model_cfg, partial,
                           extra_config={"eos_token_id": int(tokenizer.eos_id)})
        if jax.process_index() == 0:
            copy_tokenizer_files(cfg.hf_checkpoint, partial)
            shutil.rmtree(out, ignore_errors=True)
            os.replace(partial, out)
    barrier("model_written")
    return out


def _fit(workdir: str) -> tuple[Optional[dict], Optional[str], dict]:
    """Fit the run's own validation curve (and a mixture's per-domain curves) into
    WORKDIR/fit; (headline, None, domain headlines) or (None, why, ...)."""
    try:
        analysis, files = report.fit_run_dir(workdir)
    except (ValueError, KeyError, FileNotFoundError) as err:
        return None, str(err), {}
    log.info("scaling fit written to %s", os.path.dirname(files[0]))
    return (report.headline(analysis), None if analysis.fit.ok else analysis.fit.reason,
            report.domain_headlines(analysis))
