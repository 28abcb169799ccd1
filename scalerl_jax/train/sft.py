"""Supervised warm-up (SFT): demonstrations in, an HF checkpoint out.

A random policy earns no reward, so RL starts from an SFT model. Demonstrations (a synthetic
task's worked solutions, or a file of prompt/completion pairs) are formatted with the RL data's
template, every RL validation prompt removed, and trained on the completion tokens' mean
cross-entropy with AdamW, jitted once on the trainer mesh. Output goes to `out_dir.partial`,
renamed when complete, so an existing `out_dir` is reused. Details: docs/training.md, "SFT
warm-up".
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
import time
from typing import Any, Callable, Iterable, Iterator, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from scalerl_jax import mesh as mesh_lib
from scalerl_jax.checkpoint import export_hf
from scalerl_jax.config import DataConfig, ModelConfig, OptimConfig, SFTConfig
from scalerl_jax.data.answers import completion_writer
from scalerl_jax.data.prompts import (
    DataError,
    Prompt,
    check_bad_fraction,
    format_prompt,
    parse_records,
    read_records,
    synthetic_rows,
)
from scalerl_jax.metrics import MetricsWriter
from scalerl_jax.models import layers
from scalerl_jax.models.tokenizer import copy_tokenizer_files
from scalerl_jax.multihost import barrier
from scalerl_jax.train.logprobs import token_logprobs
from scalerl_jax.train.optim import learning_rate, make_optimizer
from scalerl_jax.train.state import TrainState, create_train_state
from scalerl_jax.train.step import global_norm, put_global

log = logging.getLogger(__name__)


class Demo(NamedTuple):
    prompt_id: str
    problem: str
    completion: str


def load_demonstrations(
    sft: SFTConfig, data: DataConfig, exclude: Iterable[Prompt] = ()
) -> tuple[list[Demo], dict]:
    """The demonstrations of `sft.source` (its placeholders filled from `data`; completions
    rewritten by `sft.completion_format`) minus the `exclude` prompts (the RL validation set),
    and counts: {"demonstrations", "excluded", "bad"}."""
    source = sft.source_for(data)
    if source.startswith("synthetic:"):
        if sft.completion_format != "raw":
            raise DataError(
                f"SFTConfig.completion_format={sft.completion_format!r} with "
                f"{source!r}: synthetic tasks write their own completions; use "
                "'raw'"
            )
        try:
            rows = synthetic_rows(source[len("synthetic:") :], data.seed)
        except (ValueError, TypeError) as e:
            raise DataError(f"SFTConfig.source={source!r}: {e}") from None
        demos, bad = [Demo(r.prompt_id, r.prompt, r.completion) for r in rows], 0
    else:
        records, stats = parse_records(
            read_records(source, "train"),
            sft.prompt_field,
            sft.completion_field,
            data.id_field,
            read_answer=completion_writer(sft.completion_format),
        )
        check_bad_fraction(stats, source, data.max_bad_fraction)
        demos, bad = [Demo(*r) for r in records], stats.num_bad
    ids = {p.prompt_id for p in exclude}
    problems = {p.problem for p in exclude}
    kept = [d for d in demos if d.prompt_id not in ids and d.problem not in problems]
    if not kept:
        raise DataError(
            f"SFTConfig.source={source!r}: no demonstrations left after removing "
            f"{len(demos)} that are RL validation prompts"
        )
    return kept, {"demonstrations": len(kept), "excluded": len(demos) - len(kept), "bad": bad}


class Examples(NamedTuple):
    rows: list  # token ids of each demonstration: prompt + completion + eos
    prompt_lengths: list
    skipped: int  # demonstrations longer than max_length


def tokenize(demos: list[Demo], tokenizer: Any, data: DataConfig, max_length: int) -> Examples:
    rows, prompt_lens, skipped = [], [], 0
    for d in demos:
        prompt = tokenizer.encode(format_prompt(d.problem, data, tokenizer))
        ids = prompt + tokenizer.encode(d.completion) + [tokenizer.eos_id]
        if len(ids) > max_length or not prompt:
            skipped += 1
            continue
        rows.append(ids)
        prompt_lens.append(len(prompt))
    if not rows:
        raise DataError(
            f"every demonstration is longer than SFTConfig.max_length={max_length} "
            f"tokens ({skipped} skipped)"
        )
    return Examples(rows, prompt_lens, skipped)


def pack(ex: Examples, order: list, length: int, pad_id: int) -> dict:
    """Demonstrations `order` packed greedily into rows of `length` tokens, each its own segment
    (attention stays within a segment, positions restart): a short demonstration costs its own
    tokens, not a padded row. Position t predicts token t + 1 of its segment; the loss covers
    each completion and its eos, not prompts or padding."""
    rows: list[list[int]] = []
    for i in order:
        if not rows or sum(len(ex.rows[j]) for j in rows[-1]) + len(ex.rows[i]) > length:
            rows.append([])
        rows[-1].append(i)
    shape = (len(rows), length)
    out = {
        "tokens": np.full(shape, pad_id, np.int32),
        "targets": np.zeros(shape, np.int32),
        "positions": np.zeros(shape, np.int32),
        "segment_ids": np.zeros(shape, np.int32),
        "loss_mask": np.zeros(shape, np.float32),
    }
    for r, members in enumerate(rows):
        start = 0
        for seg, i in enumerate(members, start=1):
            ids, n, p = ex.rows[i], len(ex.rows[i]), ex.prompt_lengths[i]
            span = slice(start, start + n - 1)  # the last token predicts nothing
            out["tokens"][r, start : start + n] = ids
            out["targets"][r, span] = ids[1:]
            out["positions"][r, start : start + n] = np.arange(n)
            out["segment_ids"][r, start : start + n] = seg
            out["loss_mask"][r, start + p - 1 : start + n - 1] = 1.0
            start += n
    return out


def make_sft_step(
    graphdef,
    abstract_state: TrainState,
    mesh,
    *,
    model_cfg: ModelConfig,
    optim_cfg: OptimConfig,
    logprob_chunk: Optional[int] = 512,
):
    """`sft_step(state, batch) -> (state, metrics)`, jitted once with the state donated."""
    tx = make_optimizer(optim_cfg)
    schedule = learning_rate(optim_cfg)
    state_sh = jax.tree.map(lambda s: s.sharding, abstract_state)
    rows = mesh_lib.named(mesh, "batch", None)
    replicated = mesh_lib.named(mesh)

    def loss_fn(params, batch):
        model = nnx.merge(graphdef, params)
        with layers.kernel_mesh(mesh):  # fused attention kernels run per shard
            hidden = model(batch["tokens"], batch["positions"], batch["segment_ids"])
        logp, _ = token_logprobs(
            hidden,
            model.head_kernel(),
            batch["targets"],
            chunk_size=logprob_chunk,
            fp32=model_cfg.fp32_head,
            with_entropy=False,
        )
        mask = batch["loss_mask"]
        tokens = jnp.maximum(mask.sum(), 1.0)
        return -(logp * mask).sum() / tokens, tokens

    def step(state: TrainState, batch):
        (loss, tokens), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params, batch)
        updates, opt_state = tx.update(grads, state.opt_state, state.params)
        count = state.step
        new = state._replace(
            params=optax.apply_updates(state.params, updates),
            opt_state=opt_state,
            step=state.step + 1,
        )
        return new, {
            "loss": loss,
            "tokens": tokens,
            "grad_norm": global_norm(grads),
            "learning_rate": schedule(count),
        }

    jitted = jax.jit(
        step,
        in_shardings=(state_sh, rows),
        out_shardings=(state_sh, replicated),
        donate_argnums=(0,),
    )

    def sft_step(state, batch):
        return jitted(state, put_global(batch, rows))

    sft_step.jitted = jitted  # type: ignore[attr-defined]  # for `.lower(...)`
    return sft_step


def is_done(out_dir: str) -> bool:
    return os.path.exists(os.path.join(out_dir, "summary.json"))


def model_dir(out_dir: str) -> str:
    return os.path.join(out_dir, "model")


def run_sft(
    sft: SFTConfig,
    model_cfg: ModelConfig,
    data: DataConfig,
    mesh,
    tokenizer,
    *,
    out_dir: str,
    seed: int = 0,
    exclude: Iterable[Prompt] = (),
    hf_checkpoint: Optional[str] = None,
    logprob_chunk: Optional[int] = 512,
    on_step: Optional[Callable[[int, dict], None]] = None,
    on_trained: Optional[Callable[[int], None]] = None,
) -> str:
    """Run the warm-up unless `out_dir` already holds a finished one; returns the HF model dir.

    Starts from `hf_checkpoint` when given, else from a random init with `seed`. `on_step(step,
    metrics)` is called after every logged step (progress display), `on_trained(step)` after
    every step. Collective in multi-process
    runs: every process calls it with the same arguments; process 0 writes.
    """
    if is_done(out_dir):
        log.info("SFT warm-up: reusing %s", out_dir)
        return model_dir(out_dir)
    ex, counts = _examples(sft, data, tokenizer, exclude)
    model_cfg, state, step_fn = _start(
        sft, model_cfg, mesh, seed=seed, hf_checkpoint=hf_checkpoint, logprob_chunk=logprob_chunk
    )
    writer_proc = jax.process_index() == 0
    partial = out_dir.rstrip("/") + ".partial"
    if writer_proc:
        shutil.rmtree(partial, ignore_errors=True)
    writer = MetricsWriter(partial) if writer_proc else None
    t0 = time.monotonic()
    try:
        state, first, last = _steps(
            step_fn,
            state,
            _batches(ex, sft, tokenizer.pad_id, seed),
            sft,
            t0=t0,
            writer=writer,
            on_step=on_step,
            on_trained=on_trained,
        )
        extra = {"eos_token_id": int(tokenizer.eos_id)}
        export_hf(state.params, model_cfg, model_dir(partial), extra_config=extra)
    finally:
        if writer is not None:
            writer.close()
    if writer_proc:
        summary = {
            "steps": sft.steps,
            "first_loss": first,
            "final_loss": last,
            "seconds": time.monotonic() - t0,
            **counts,
        }
        _publish(partial, out_dir, hf_checkpoint, summary)
    barrier("sft_written")  # the other processes load what process 0 just renamed into place
    return model_dir(out_dir)


def _start(sft: SFTConfig, model_cfg, mesh, *, seed, hf_checkpoint, logprob_chunk):
    """The warm-up's initial state and its jitted step: (model config, state, step)."""
    model_cfg, graphdef, state = create_train_state(
        model_cfg, sft.optim, mesh, seed=seed, hf_checkpoint=hf_checkpoint
    )
    abstract = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state
    )
    step_fn = make_sft_step(
        graphdef,
        abstract,
        mesh,
        model_cfg=model_cfg,
        optim_cfg=sft.optim,
        logprob_chunk=logprob_chunk,
    )
    return model_cfg, state, step_fn


def _steps(step_fn, state, batches, sft: SFTConfig, *, t0: float, writer, on_step, on_trained):
    """Train on `batches`, logging every `sft.log_every` steps; (state, first and last logged
    loss)."""
    first = last = None
    tokens_done = 0.0
    for step, batch in enumerate(batches, start=1):
        tokens_done += float(batch["loss_mask"].sum())
        state, metrics = step_fn(state, batch)
        if on_trained is not None:
            on_trained(step)
        if step % sft.log_every == 0 or step in (1, sft.steps):
            metrics = _logged(metrics, sft, step, tokens_done / max(time.monotonic() - t0, 1e-9))
            first = metrics["loss"] if first is None else first
            last = metrics["loss"]
            if writer is not None:
                writer.write("sft", step, **metrics)
            if on_step is not None:
                on_step(step, metrics)
    return state, first, last


def _examples(sft: SFTConfig, data: DataConfig, tokenizer, exclude: Iterable[Prompt]):
    """The tokenized demonstrations and their counts (excluded prompts, too long ones)."""
    demos, counts = load_demonstrations(sft, data, exclude)
    ex = tokenize(demos, tokenizer, data, sft.max_length)
    counts["too_long"] = ex.skipped
    log.info(
        "SFT warm-up: %d demonstrations (%d RL validation prompts removed, %d too long), "
        "%d steps of %d packed rows",
        len(ex.rows),
        counts["excluded"],
        ex.skipped,
        sft.steps,
        sft.batch_size,
    )
    return ex, counts


def _logged(metrics, sft: SFTConfig, step: int, tokens_per_s: float) -> dict:
    """A logged step's metrics as floats; FloatingPointError on a non-finite loss."""
    metrics = {k: float(v) for k, v in jax.device_get(metrics).items()}
    metrics["tokens_per_s"] = tokens_per_s
    if not np.isfinite(metrics["loss"]):
        raise FloatingPointError(
            f"SFT loss is {metrics['loss']} at step {step}: lower "
            f"SFTConfig.optim.learning_rate="
            f"{sft.optim.learning_rate}"
        )
    return metrics


def _batches(ex, sft: SFTConfig, pad_id: int, seed: int) -> Iterator[dict]:
    """`sft.steps` batches of `sft.batch_size` packed rows; each epoch is shuffled and packed
    anew, and its last partial batch dropped."""
    rng = random.Random(f"sft:{seed}")
    length = -(-sft.max_length // 16) * 16
    packed: dict = {}
    cursor = 0
    for _ in range(sft.steps):
        if not packed or cursor + sft.batch_size > len(packed["tokens"]):
            epoch = list(range(len(ex.rows)))
            rng.shuffle(epoch)
            packed, cursor = pack(ex, epoch, length, pad_id), 0
            if len(packed["tokens"]) < sft.batch_size:
                raise DataError(
                    f"SFT demonstrations fill {len(packed['tokens'])} rows of "
                    f"{length} tokens, fewer than SFTConfig.batch_size="
                    f"{sft.batch_size}"
                )
        yield {k: v[cursor : cursor + sft.batch_size] for k, v in packed.items()}
        cursor += sft.batch_size


def _publish(partial: str, out_dir: str, hf_checkpoint: Optional[str], summary: dict) -> None:
    """Complete the warm-up written in `partial` (tokenizer files, summary.json) and rename it
    into place as `out_dir`."""
    copy_tokenizer_files(hf_checkpoint, model_dir(partial))
    with open(os.path.join(partial, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    shutil.rmtree(out_dir, ignore_errors=True)
    os.replace(partial, out_dir)
    log.info(
        "SFT warm-up: loss %.3f -> %.3f in %.0f s, wrote %s",
        summary["first_loss"],
        summary["final_loss"],
        summary["seconds"],
        out_dir,
    )
