"""The training loop, top to bottom: meshes, data, state, step, resume, sampler, loop.

One host. The sampler driver runs continuously in a background thread on the sampler mesh and
takes new weights after every optimiser step without draining (PipelineRL); the trainer takes
`prompts_per_step` completed groups per step. Groups whose oldest token is more than
`max_lag` policy versions behind are dropped and counted (`sync` mode is max_lag = 0).
"""
from __future__ import annotations

import logging
import os
import time

import jax
import numpy as np

from scalerl_jax import checkpoint as ckpt_lib
from scalerl_jax import mesh as mesh_lib
from scalerl_jax import metrics as metrics_lib
from scalerl_jax.config import ConfigError, RunConfig
from scalerl_jax.data.prompts import PromptSource
from scalerl_jax.models.transformer import matmul_params
from scalerl_jax.rewards import RewardPool, verifier_for_source
from scalerl_jax.rl.curriculum import NoPositiveResampling
from scalerl_jax.sampler.driver import Driver
from scalerl_jax.sampler.engine import Engine
from scalerl_jax.sampler.weight_sync import WeightSync
from scalerl_jax.train import batch as batch_lib
from scalerl_jax.train import state as state_lib
from scalerl_jax.train.evaluate import evaluate, score_groups
from scalerl_jax.train.feed import PromptFeed
from scalerl_jax.train.step import batch_shards, make_train_step

log = logging.getLogger(__name__)


def load_tokenizer(cfg: RunConfig):
    if cfg.data.source.startswith("synthetic:"):
        from scalerl_jax.data.synthetic import CharTokenizer
        return CharTokenizer()
    if cfg.hf_checkpoint is None:
        raise ConfigError(f"DataConfig.source={cfg.data.source!r} needs a tokenizer: set "
                          "RunConfig.hf_checkpoint to an HF model directory")
    from scalerl_jax.models.tokenizer import load_tokenizer as load
    return load(cfg.hf_checkpoint)


def _check_supported(cfg: RunConfig) -> None:
    if jax.process_count() > 1:
        raise ConfigError(f"this loop runs on one host; jax.process_count()="
                          f"{jax.process_count()} (multi-host batches are assembled by the "
                          "PipelineRL loop)")
    if cfg.pipeline.mode == "ppo_off_policy":
        raise ConfigError("PipelineConfig.mode='ppo_off_policy' is not available in this loop; "
                          "use 'pipeline' or 'sync'")


def collect(driver: Driver, feed: PromptFeed, n: int, version: int, max_lag: int,
            timeout_s: float = 600.0):
    """The next `n` groups within the staleness bound, and how many stale ones were dropped."""
    groups, stale = [], 0
    while len(groups) < n:
        group = driver.get(timeout=timeout_s)
        if group is None:
            raise RuntimeError("the sampler ran out of prompts")
        feed.consumed(group.metadata["seq"])
        if version - group.min_version > max_lag:
            stale += 1
            continue
        groups.append(group)
    return groups, stale


def run(cfg: RunConfig) -> dict:
    _check_supported(cfg)
    os.makedirs(cfg.workdir, exist_ok=True)
    with open(os.path.join(cfg.workdir, "config.json"), "w") as f:
        f.write(cfg.to_json())

    # Meshes: trainer devices and this host's sampler devices.
    split = mesh_lib.split_devices(cfg.mesh)
    trainer_mesh = mesh_lib.trainer_mesh(cfg.mesh, split.trainer)
    sampler_mesh = mesh_lib.sampler_mesh(cfg.mesh, split.sampler)

    # State and step (created sharded), then resume if the workdir has a checkpoint.
    model_cfg, graphdef, state = state_lib.create_train_state(
        cfg.model, cfg.optim, trainer_mesh, seed=cfg.seed, hf_checkpoint=cfg.hf_checkpoint)
    _, abstract = state_lib.abstract_train_state(model_cfg, cfg.optim, trainer_mesh, cfg.seed)
    num_prompts = cfg.pipeline.prompts_per_step
    train_step = make_train_step(graphdef, abstract, trainer_mesh, model_cfg=model_cfg,
                                 loss_cfg=cfg.loss, optim_cfg=cfg.optim, num_prompts=num_prompts,
                                 max_length=cfg.sampler.max_new_tokens,
                                 logprob_chunk=cfg.optim.logprob_chunk)
    checkpoints = ckpt_lib.Checkpointer(os.path.join(cfg.workdir, "checkpoints"),
                                        save_every=cfg.checkpoint_every,
                                        keep=cfg.keep_checkpoints, keep_every=cfg.keep_every)
    checkpoints.install_sigterm_handler()
    restored = checkpoints.restore(abstract)
    meta = {}
    if restored is not None:
        state, meta = restored
        log.info("resumed from step %d in %s", int(state.step), cfg.workdir)
    version = int(meta.get("policy_version", 0))

    # Data, curriculum, rewards.
    tokenizer = load_tokenizer(cfg)
    curriculum = (NoPositiveResampling.from_dict(meta["curriculum"]) if "curriculum" in meta
                  else NoPositiveResampling(threshold=cfg.pipeline.retire_pass_rate))
    retire = cfg.pipeline.no_positive_resampling
    # The sampler thread reads the curriculum while the trainer updates it; a stale read only
    # lets one more epoch of an about-to-retire prompt through.
    source = PromptSource(cfg.data, tokenizer, skip=curriculum.is_retired if retire else None,
                          id_field=cfg.data.id_field)
    feed = PromptFeed(source, tokenizer)
    if "data" in meta:
        feed.load_state_dict(meta["data"])
    verifier = verifier_for_source(cfg.data.source)
    pool = RewardPool(cfg.reward.workers, cfg.reward.timeout_s,
                      reward_correct=cfg.loss.reward_correct,
                      reward_incorrect=cfg.loss.reward_incorrect, processes=cfg.reward.processes)
    validation = source.validation()[:cfg.eval.num_prompts]

    # Sampler: engine on the sampler mesh, weights synced from the trainer mesh.
    engine = Engine(model_cfg, sampler_mesh, cfg.sampler, seed=cfg.seed)
    sync = WeightSync(trainer_mesh, engine.param_shardings)
    encode = lambda text: tokenizer.encode(text) if text else []  # noqa: E731
    driver_kwargs = dict(eos_ids=tokenizer.eos_ids, think_close_ids=encode(cfg.sampler.think_close),
                         phrase_ids=encode(cfg.sampler.interruption_phrase) if
                         cfg.sampler.interruptions else ())
    sampler_params = sync(state.params)  # re-synced once per step, shared with evaluation
    driver = Driver(engine, sampler_params, feed,
                    group_size=cfg.pipeline.generations_per_prompt,
                    version=version, max_queued_groups=cfg.pipeline.queue_groups,
                    seed=cfg.seed + int(state.step), **driver_kwargs).start()
    max_lag = 0 if cfg.pipeline.mode == "sync" else cfg.pipeline.max_lag

    # Metrics and compute accounting (continued from the last eval record on resume).
    writer = metrics_lib.MetricsWriter(cfg.workdir)
    writer.run(cfg.to_dict(), step=int(state.step))
    evals = metrics_lib.read_metrics(cfg.workdir).of("eval")
    meter = metrics_lib.ComputeMeter(matmul_params(model_cfg), model_cfg.num_layers,
                                     model_cfg.num_heads * model_cfg.dim_per_head,
                                     initial=evals[-1]["compute"] if evals else None)
    n_train, n_sample = len(split.trainer), len(split.sampler)

    def do_eval(step: int) -> dict:
        result = evaluate(engine, sampler_params, validation, tokenizer=tokenizer,
                          k=cfg.eval.k, verifier=verifier, pool=pool,
                          driver_kwargs=driver_kwargs, version=version)
        record = writer.eval(step, compute=meter.compute(), **result)
        log.info("eval step %d: pass_rate %.3f", step, result["pass_rate"])
        return record

    def meta_now() -> dict:
        return {"policy_version": version, "curriculum": curriculum.to_dict(),
                "data": feed.state_dict()}

    last = {}
    tokens_seen = driver.stats["tokens"]
    try:
        if int(state.step) == 0 and not evals:
            do_eval(0)
        while int(state.step) < cfg.steps:
            t0 = time.monotonic()
            groups, stale = collect(driver, feed, num_prompts, version, max_lag)
            t_wait = time.monotonic() - t0
            scored = score_groups(groups, tokenizer=tokenizer, verifier=verifier, pool=pool)
            g_size = cfg.pipeline.generations_per_prompt
            correct = np.asarray(scored.correct, bool).reshape(len(groups), g_size)
            rewards = np.asarray(scored.rewards, np.float32).reshape(len(groups), g_size)
            if retire:
                curriculum.update([g.prompt_id for g in groups], correct.mean(axis=1))
            batch, info = batch_lib.from_groups(
                groups, rewards, loss_cfg=cfg.loss, num_prompts=num_prompts,
                micro_batches=cfg.optim.micro_batches, row_multiple=batch_shards(trainer_mesh),
                seq_bucket=cfg.pipeline.seq_bucket, correct=correct, pad_id=tokenizer.pad_id)
            t1 = time.monotonic()
            state, step_metrics = train_step(state, batch)
            step_metrics = {k: float(v) for k, v in jax.device_get(step_metrics).items()}
            t_train = time.monotonic() - t1
            version += 1
            sampler_params = sync(state.params)
            driver.update_params(sampler_params, version)

            # Compute: colocated devices are charged to whichever side used them.
            step_wall = time.monotonic() - t0
            new_tokens = driver.stats["tokens"] - tokens_seen
            tokens_seen = driver.stats["tokens"]
            completions = [c for g in groups for c in g.completions]
            mean_len = float(np.mean([len(c.tokens) for c in completions]))
            mean_prompt = float(np.mean([len(g.prompt_tokens) for g in groups]))
            meter.add_sampler(seconds=step_wall - t_train if split.colocated else step_wall,
                              devices=n_sample, tokens=new_tokens,
                              context_len=mean_prompt + mean_len / 2)
            meter.add_trainer(seconds=t_train if split.colocated else step_wall,
                              devices=n_train, tokens=info["seq_tokens"],
                              context_len=info["seq_len"] / 2)
            step = int(state.step)
            last = writer.train(
                step, **step_metrics, **{f"batch_{k}": v for k, v in info.items()},
                reward_mean=float(rewards.mean()), pass_rate_train=float(correct.mean()),
                truncation_rate=np.mean([c.finish_reason == "truncated" for c in completions]),
                interruption_rate=np.mean([c.interrupted for c in completions]),
                mean_completion_len=mean_len, stale_groups=stale,
                max_lag_seen=version - 1 - min(g.min_version for g in groups),
                reward_timeouts=scored.num_timeouts, reward_errors=scored.num_errors,
                retired_prompts=curriculum.num_retired, policy_version=version,
                wait_s=t_wait, train_s=t_train, step_s=step_wall,
                sampler_utilisation=driver.utilisation)
            log.info("step %d loss %.4f reward %.3f pass %.3f", step, step_metrics["loss"],
                     rewards.mean(), correct.mean())
            if step % cfg.eval.every_steps == 0 or step == cfg.steps:
                do_eval(step)
            checkpoints.maybe_save(step, state, meta_now)
            if checkpoints.preemption_saved:
                log.warning("stopping after the SIGTERM checkpoint at step %d", step)
                break
        else:
            checkpoints.save(int(state.step), state, meta_now())
    finally:
        driver.stop()
        checkpoints.close()
        pool.close()
        writer.close()
    return last
