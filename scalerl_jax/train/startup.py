"""The start-up phases of a run, in the order `trainer._start` opens them: the meshes, the data
(verifiers, this host's prompt shard, validation prompts, reward pool), the policy (checkpointer,
the restored or initial state, the jitted train step), the metrics (writer, forecaster) and the
sampler (engine, weight sync, driver). Each returns one object and registers what it opens on the
run's ExitStack.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import threading
import time
from typing import Any, Callable, Optional

import jax

from scalerl_jax import checkpoint as ckpt_lib
from scalerl_jax import mesh as mesh_lib
from scalerl_jax import metrics as metrics_lib
from scalerl_jax import rundir
from scalerl_jax.config import RunConfig
from scalerl_jax.data.mixture import open_source
from scalerl_jax.interrupt import Watchdog
from scalerl_jax.multihost import allgather_objects
from scalerl_jax.heartbeat import HEARTBEAT
from scalerl_jax.rewards import RewardPool, answer_checks, domain_verifiers, use_processes
from scalerl_jax.sampler.driver import Driver, driver_token_ids
from scalerl_jax.sampler.engine import Engine
from scalerl_jax.sampler.weight_sync import WeightSync
from scalerl_jax.scaling.forecast import Forecaster
from scalerl_jax.tracking import Tracker
from scalerl_jax.train import stages
from scalerl_jax.train import state as state_lib
from scalerl_jax.train.feed import PromptFeed
from scalerl_jax.train.pipeline import Rollouts, Schedule
from scalerl_jax.train.step import make_train_step

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Meshes:
    """The trainer mesh over every host's trainer devices and this host's sampler mesh."""

    split: mesh_lib.DeviceSplit  # trainer and sampler devices, colocated or not
    trainer: Any
    sampler: Any

    @classmethod
    def for_run(cls, cfg: RunConfig) -> "Meshes":
        split = mesh_lib.split_devices(cfg.mesh)
        return cls(
            split=split,
            trainer=mesh_lib.trainer_mesh(cfg.mesh, split.trainer),
            sampler=mesh_lib.sampler_mesh(cfg.mesh, split.sampler),
        )


@dataclasses.dataclass(frozen=True)
class Data:
    verifiers: dict  # each domain's verifier
    source: Any  # this host's shard of the training prompts
    validation: list  # all hosts' validation prompts; each evaluates its share
    pool: RewardPool


@dataclasses.dataclass(frozen=True)
class Policy:
    checkpoints: ckpt_lib.Checkpointer
    tracker: Tracker
    restored: bool  # resumed from a checkpoint of this run directory
    state: Any  # the start's train state, donated to the first step (the loop carries it on)
    start: int  # its step: where this invocation starts
    meta: dict  # the checkpoint's host-side state ({} for a fresh start)
    model_cfg: Any
    train_step: Callable


@dataclasses.dataclass(frozen=True)
class Metrics:
    writer: Optional[metrics_lib.MetricsWriter]  # None except on process 0
    tracker: Tracker
    forecaster: Forecaster

    def record(self, event: str, step: int, **fields) -> dict:
        """Write a record (process 0) and return it."""
        if self.writer is None:
            return {"event": event, "step": step, **fields}
        rec = self.writer.write(event, step, **fields)
        self.tracker.write(rec)
        return rec


@dataclasses.dataclass(frozen=True)
class Sampling:
    engine: Engine
    sync: WeightSync
    feed: PromptFeed
    driver: Driver
    driver_kwargs: dict
    seed: int
    rollouts: Rollouts
    params: Any  # the sampler-side params the driver started with


def open_data(
    cfg: RunConfig, *, tokenizer, cleanup: contextlib.ExitStack, skip: Callable[[Any], bool]
) -> Data:
    """Each domain's verifier; this host's shard of the training prompts (one source, or a
    mixture of domains drawn by weight, without the prompts `skip` names); the validation
    prompts; the reward pool."""
    verifiers = domain_verifiers(cfg.data, cfg.reward.verifier, cfg.reward.code_isolation)
    source = open_source(
        cfg.data,
        tokenizer,
        process_index=jax.process_index(),
        process_count=jax.process_count(),
        skip=skip,
        check_answers=answer_checks(cfg.data, cfg.reward.verifier),
    )
    validation = source.validation()[: cfg.eval.num_prompts]
    # Thread or child-process workers, decided from all domains' sources.
    processes = use_processes(cfg.reward, cfg.data)
    pool = RewardPool(
        cfg.reward.workers,
        cfg.reward.timeout_s,
        reward_correct=cfg.loss.reward_correct,
        reward_incorrect=cfg.loss.reward_incorrect,
        processes=processes,
    )
    cleanup.callback(pool.close)
    return Data(verifiers=verifiers, source=source, validation=validation, pool=pool)


def open_policy(
    cfg: RunConfig,
    *,
    tokenizer,
    cleanup: contextlib.ExitStack,
    mesh,
    data: Data,
    first_step_done: threading.Event,
    wandb_project: Optional[str],
) -> Policy:
    """The checkpointer with its stop signals, and the policy on the trainer `mesh`: the newest
    good checkpoint, else the initial policy (SFT warm-up, HF checkpoint, or init); the jitted
    train step."""
    _, abstract = state_lib.abstract_train_state(cfg.model, cfg.optim, mesh, cfg.seed)
    sft_trained = [0]  # steps of an SFT warm-up under way: it keeps no checkpoint of its own
    checkpoints = _open_checkpoints(
        cfg, cleanup=cleanup, first_step_done=first_step_done, sft_trained=sft_trained
    )
    restored = checkpoints.restore(abstract)
    if jax.process_index() == 0:  # the first write: everything above has validated
        rundir.write_config(cfg.workdir, cfg.to_dict())
    tracker = cleanup.enter_context(
        Tracker(cfg.workdir, enabled=jax.process_index() == 0, wandb_project=wandb_project)
    )
    if restored is None:
        model_cfg, graphdef, state = _initial_state(
            cfg, tokenizer=tokenizer, mesh=mesh, data=data, tracker=tracker, sft_trained=sft_trained
        )
        meta = {}
    else:
        (state, meta), model_cfg = restored, cfg.model
        graphdef = state_lib.graphdef_of(model_cfg)
        log.info("resumed from step %d in %s", int(state.step), cfg.workdir)
    return Policy(
        checkpoints=checkpoints,
        tracker=tracker,
        restored=restored is not None,
        state=state,
        start=int(state.step),
        meta=meta,
        model_cfg=model_cfg,
        train_step=build_train_step(cfg, model_cfg, graphdef, abstract, mesh),
    )


def _open_checkpoints(
    cfg: RunConfig,
    *,
    cleanup: contextlib.ExitStack,
    first_step_done: threading.Event,
    sft_trained: list,
) -> ckpt_lib.Checkpointer:
    """The checkpointer with its stop-signal handlers, and the watchdog that ends the process
    on a stop signal while nothing is unsaved (before the first step)."""
    checkpoints = ckpt_lib.Checkpointer(
        os.path.join(cfg.workdir, "checkpoints"),
        save_every=cfg.checkpoint_every,
        keep=cfg.keep_checkpoints,
        keep_every=cfg.keep_every,
    )
    checkpoints.install_signal_handlers()
    cleanup.callback(checkpoints.close)
    cleanup.enter_context(
        Watchdog(
            can_exit=lambda: not first_step_done.is_set(),
            describe=HEARTBEAT.line,
            nothing_lost=lambda: _lost_on_exit(cfg, sft_trained[0]),
            acknowledged=lambda: checkpoints.stop_signal is not None,
        )
    )
    return checkpoints


def _initial_state(cfg: RunConfig, *, tokenizer, mesh, data: Data, tracker: Tracker, sft_trained):
    """A fresh start's (model config, graphdef, train state): the SFT warm-up's model when the
    run has one, else the HF checkpoint or a random init."""
    init = cfg.hf_checkpoint
    if cfg.sft is not None:
        init = stages.warm_up(
            cfg,
            cfg.sft,
            mesh,
            tokenizer,
            data.source.validation(),
            tracker,
            on_trained=lambda step: sft_trained.__setitem__(0, step),
        )
        sft_trained[0] = 0  # written: nothing of it is lost any more
    return state_lib.create_train_state(
        cfg.model, cfg.optim, mesh, seed=cfg.seed, hf_checkpoint=init
    )


def _lost_on_exit(cfg: RunConfig, sft_trained: int) -> str:
    """What an exit before the first RL step loses (the watchdog's stop line)."""
    if sft_trained and cfg.sft is not None:
        return (
            f"the SFT warm-up's {sft_trained} of {cfg.sft.steps} steps are lost (it is "
            "saved only when it ends; re-running the same command starts it over)"
        )
    return (
        "nothing trained since the last checkpoint, so nothing to save (re-run the same "
        "command to resume)"
    )


def build_train_step(cfg: RunConfig, model_cfg, graphdef, abstract, trainer_mesh) -> Callable:
    """The run's jitted RL step (make_train_step with the run's settings)."""
    return make_train_step(
        graphdef,
        abstract,
        trainer_mesh,
        model_cfg=model_cfg,
        loss_cfg=cfg.loss,
        optim_cfg=cfg.optim,
        num_prompts=cfg.pipeline.prompts_per_step,
        max_length=cfg.sampler.max_new_tokens,
        # The ratio's denominator was drawn at the sampler's temperature (greedy reports at 1).
        temperature=cfg.sampler.temperature or 1.0,
    )


def open_metrics(cfg: RunConfig, *, cleanup: contextlib.ExitStack, policy: Policy) -> Metrics:
    """The metrics writer and the forecaster, after the run's opening record. Records after
    the step the policy starts from are superseded."""
    main, start = jax.process_index() == 0, policy.start
    writer = None
    if main:
        metrics_lib.truncate_after(cfg.workdir, start)
        writer = cleanup.enter_context(metrics_lib.MetricsWriter(cfg.workdir))
    # Online forecast (process 0): each evaluation queues a refit of the sigmoid in a
    # low-priority child process; finished forecasts are written by the trainer's thread,
    # after the step that saw them.
    forecaster = cleanup.enter_context(
        Forecaster.for_run(cfg.forecast, cfg.workdir, total_steps=cfg.steps, enabled=main)
    )
    metrics = Metrics(writer=writer, tracker=policy.tracker, forecaster=forecaster)
    metrics.record(
        "run",
        start,
        schema=metrics_lib.SCHEMA_VERSION,
        time=time.time(),
        resumed=policy.restored,
        config=cfg.to_dict(),
    )
    return metrics


def eval_missing(cfg: RunConfig, start: int) -> bool:
    """Whether the evaluation of `start` is due and not in the metrics. Collective.

    The base policy is evaluated at step 0; a resumed run re-evaluates its restored step only
    if that evaluation was due and did not survive. Host 0 knows; all hosts must agree."""
    missing = (
        jax.process_index() == 0
        and (start == 0 or start % cfg.eval.every_steps == 0)
        and not any(e["step"] == start for e in metrics_lib.read_metrics(cfg.workdir).of("eval"))
    )
    return allgather_objects(missing)[0]


def open_sampler(
    cfg: RunConfig,
    *,
    tokenizer,
    cleanup: contextlib.ExitStack,
    meshes: Meshes,
    schedule: Schedule,
    data: Data,
    policy: Policy,
) -> Sampling:
    """The engine on this host's sampler mesh, weights synced from the trainer mesh, and the
    driver that samples ahead of the trainer in its thread."""
    host = jax.process_index()
    engine = Engine(policy.model_cfg, meshes.sampler, cfg.sampler, seed=cfg.seed)
    sync = WeightSync.for_engine(meshes.trainer, engine)  # engine dtypes, bounded groups
    feed = PromptFeed(data.source, tokenizer)
    if "data" in policy.meta:
        feed.load_state_dict(policy.meta["data"][host])
    driver_kwargs = driver_token_ids(
        cfg.sampler, tokenizer, max_forced_tokens=engine.max_forced_tokens
    )
    params = sync(policy.state.params)
    seed = cfg.seed + 7919 * host  # tickets are per host: keep hosts' samples apart
    driver = Driver(
        engine,
        params,
        feed,
        group_size=cfg.pipeline.generations_per_prompt,
        version=policy.start,
        seed=seed,
        admit=lambda version: feed.issued < schedule.limit(version),
        max_queued_groups=schedule.window + schedule.batch,
        **driver_kwargs,
    )
    rollouts = Rollouts(driver, feed, schedule).start()
    cleanup.callback(rollouts.stop)
    return Sampling(
        engine=engine,
        sync=sync,
        feed=feed,
        driver=driver,
        driver_kwargs=driver_kwargs,
        seed=seed,
        rollouts=rollouts,
        params=params,
    )
