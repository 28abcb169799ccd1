"""The start-up phases of a run, in the order `trainer._run` calls them: the data (verifiers,
this host's prompt shard, validation prompts, reward pool), the policy (checkpointer and its
stop signals, the restored or initial state, the jitted train step), the metrics (writer,
forecaster, whether the start's evaluation is missing) and the sampler (engine, weight sync,
driver and its rollouts). Each registers what it opens on the run's ExitStack.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from typing import Any, Callable, NamedTuple

import jax

from scalerl_jax import checkpoint as ckpt_lib
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


class Policy(NamedTuple):
    checkpoints: ckpt_lib.Checkpointer
    tracker: Tracker
    restored: bool  # resumed from a checkpoint of this run directory
    state: Any
    meta: dict  # the checkpoint's host-side state ({} for a fresh start)
    model_cfg: Any
    train_step: Callable


class Sampling(NamedTuple):
    engine: Engine
    sync: WeightSync
    feed: PromptFeed
    driver: Driver
    driver_kwargs: dict
    seed: int
    rollouts: Rollouts


def record(writer, tracker: Tracker, event: str, step: int, **fields) -> dict:
    if writer is None:
        return {"event": event, "step": step, **fields}
    rec = writer.write(event, step, **fields)
    tracker.write(rec)
    return rec


def open_data(cfg: RunConfig, tokenizer, cleanup: contextlib.ExitStack, skip):
    """Each domain's verifier; this host's shard of the training prompts (one source, or a
    mixture of domains drawn by weight); the validation prompts; the reward pool."""
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
    return verifiers, source, validation, pool


def open_policy(
    cfg: RunConfig,
    tokenizer,
    cleanup: contextlib.ExitStack,
    trainer_mesh,
    source,
    first_step_done: threading.Event,
    wandb_project,
) -> Policy:
    """The checkpointer with its stop signals, and the policy: the newest good checkpoint, else
    the initial policy (SFT warm-up, HF checkpoint, or init); the jitted train step."""
    _, abstract = state_lib.abstract_train_state(cfg.model, cfg.optim, trainer_mesh, cfg.seed)
    checkpoints = ckpt_lib.Checkpointer(
        os.path.join(cfg.workdir, "checkpoints"),
        save_every=cfg.checkpoint_every,
        keep=cfg.keep_checkpoints,
        keep_every=cfg.keep_every,
    )
    checkpoints.install_signal_handlers()
    cleanup.callback(checkpoints.close)
    sft_trained = [0]  # steps of an SFT warm-up under way: it keeps no checkpoint of its own

    def lost() -> str:
        if sft_trained[0] and cfg.sft is not None:
            return (
                f"the SFT warm-up's {sft_trained[0]} of {cfg.sft.steps} steps are lost (it is "
                "saved only when it ends; re-running the same command starts it over)"
            )
        return (
            "nothing trained since the last checkpoint, so nothing to save (re-run the same "
            "command to resume)"
        )

    cleanup.enter_context(
        Watchdog(
            can_exit=lambda: not first_step_done.is_set(),
            describe=HEARTBEAT.line,
            nothing_lost=lost,
            acknowledged=lambda: checkpoints.stop_signal is not None,
        )
    )
    restored = checkpoints.restore(abstract)
    if jax.process_index() == 0:  # the first write: everything above has validated
        rundir.write_config(cfg.workdir, cfg.to_dict())
    tracker = cleanup.enter_context(
        Tracker(cfg.workdir, enabled=jax.process_index() == 0, wandb_project=wandb_project)
    )
    if restored is None:
        init = cfg.hf_checkpoint
        if cfg.sft is not None:
            init = stages.warm_up(
                cfg,
                cfg.sft,
                trainer_mesh,
                tokenizer,
                source.validation(),
                tracker,
                on_trained=lambda step: sft_trained.__setitem__(0, step),
            )
            sft_trained[0] = 0  # written: nothing of it is lost any more
        model_cfg, graphdef, state = state_lib.create_train_state(
            cfg.model, cfg.optim, trainer_mesh, seed=cfg.seed, hf_checkpoint=init
        )
        meta = {}
    else:
        (state, meta), model_cfg = restored, cfg.model
        graphdef = state_lib.graphdef_of(model_cfg)
        log.info("resumed from step %d in %s", int(state.step), cfg.workdir)
    train_step = build_train_step(cfg, model_cfg, graphdef, abstract, trainer_mesh)
    return Policy(checkpoints, tracker, restored is not None, state, meta, model_cfg, train_step)


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


def open_metrics(
    cfg: RunConfig, cleanup: contextlib.ExitStack, tracker: Tracker, start: int, resumed: bool
):
    """(metrics writer, forecaster, whether the evaluation of `start` is missing), after the
    run's opening record. Records after the restored step are superseded."""
    main = jax.process_index() == 0
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
    record(
        writer,
        tracker,
        "run",
        start,
        schema=metrics_lib.SCHEMA_VERSION,
        time=time.time(),
        resumed=resumed,
        config=cfg.to_dict(),
    )
    # The base policy is evaluated at step 0; a resumed run re-evaluates its restored step only
    # if that evaluation was due and did not survive. Host 0 knows; all hosts must agree.
    missing = (
        main
        and (start == 0 or start % cfg.eval.every_steps == 0)
        and not any(e["step"] == start for e in metrics_lib.read_metrics(cfg.workdir).of("eval"))
    )
    return writer, forecaster, allgather_objects(missing)[0]


def open_sampler(
    cfg: RunConfig,
    tokenizer,
    cleanup: contextlib.ExitStack,
    model_cfg,
    sampler_mesh,
    trainer_mesh,
    schedule: Schedule,
    source,
    state,
    meta: dict,
):
    """The engine on this host's sampler mesh, weights synced from the trainer mesh, and the
    driver that samples ahead of the trainer in its thread; (sampling, the synced params)."""
    host = jax.process_index()
    engine = Engine(model_cfg, sampler_mesh, cfg.sampler, seed=cfg.seed)
    sync = WeightSync.for_engine(trainer_mesh, engine)  # engine dtypes, bounded groups
    feed = PromptFeed(source, tokenizer)
    if "data" in meta:
        feed.load_state_dict(meta["data"][host])
    driver_kwargs = driver_token_ids(
        cfg.sampler, tokenizer, max_forced_tokens=engine.max_forced_tokens
    )
    sampler_params = sync(state.params)
    seed = cfg.seed + 7919 * host  # tickets are per host: keep hosts' samples apart
    start = int(state.step)
    driver = Driver(
        engine,
        sampler_params,
        feed,
        group_size=cfg.pipeline.generations_per_prompt,
        version=start,
        seed=seed,
        admit=lambda version: feed.issued < schedule.limit(version),
        max_queued_groups=schedule.window + schedule.batch,
        **driver_kwargs,
    )
    rollouts = Rollouts(driver, feed, schedule).start()
    cleanup.callback(rollouts.stop)
    return Sampling(engine, sync, feed, driver, driver_kwargs, seed, rollouts), sampler_params
