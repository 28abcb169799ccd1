"""The train step `train_step(state, batch) -> (state, metrics)`, jitted once on the trainer mesh.

Explicit shardings (state by the logical-axis rules, batch rows over `data` and `fsdp`, metrics
replicated) and a donated state. A `lax.scan` over the batch's M micro-batches accumulates the
gradient exactly for every aggregation (each micro-batch contributes N_k L_k, divided once by
sum_k N_k), and a non-finite loss or gradient norm keeps the state unchanged. The derivation,
the MoE router metrics and the metric list: docs/training.md, "Step".
"""

from __future__ import annotations

import functools
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from scalerl_jax import mesh as mesh_lib
from scalerl_jax.config import LossConfig, ModelConfig, OptimConfig
from scalerl_jax.models import layers
from scalerl_jax.rl import objectives as rl_losses
from scalerl_jax.rl.aggregation import counted_mask, masked_mean
from scalerl_jax.train.batch import TrainBatch, check_layout
from scalerl_jax.train.logprobs import token_logprobs
from scalerl_jax.train.optim import learning_rate, make_optimizer
from scalerl_jax.train.state import TrainState

sg = jax.lax.stop_gradient

# How each per-micro-batch metric of rl.objectives combines over micro-batches.
_SUMMED = ("tokens", "sequences", "prompts", "normaliser", "seq_tokens")
_LOSS_LIKE = ("loss", "pg_loss", "kl", "entropy")  # aggregated like the loss: weight N_k


def batch_sharding(mesh) -> NamedSharding:
    """One sharding for every TrainBatch leaf: rows (axis 1) over the batch mesh axes."""
    return mesh_lib.named(mesh, None, "batch")


def batch_shards(mesh) -> int:
    """How many ways the rows of a micro-batch are split (R must be a multiple)."""
    spec = batch_sharding(mesh).spec
    axes = spec[1] if len(spec) > 1 and spec[1] is not None else ()
    axes = (axes,) if isinstance(axes, str) else axes
    return int(np.prod([mesh.shape[a] for a in axes]))


def put_global(tree, sharding):
    """Place host numpy arrays (the same global arrays on every process) with `sharding`:
    each process builds only its addressable shards, which works in multi-host jobs where jit
    refuses numpy inputs with a non-trivial sharding."""

    def put(x):
        x = np.asarray(x)
        return jax.make_array_from_callback(x.shape, sharding, lambda idx: x[idx])

    return jax.tree.map(put, tree)


def put_batch(batch: TrainBatch, mesh) -> TrainBatch:
    """Place a host numpy batch on the trainer mesh (every process passes the same batch)."""
    return put_global(batch, batch_sharding(mesh))


# Per-expert load keys up to this many experts (Scout: 16); above it (Qwen3-MoE: 128 keys per
# step) only summary statistics: the metrics log and tracking.py take scalars, not vectors.
PER_EXPERT_METRICS_MAX = 16


def router_metrics(stats) -> dict:
    """RouterStats stacked over MoE layers (load [L, E], aux_loss [L]) -> scalar metrics.

    Always: `moe_aux_loss`, `moe_load_max` / `moe_load_min` (share x E over layers),
    `moe_load_cv` (std / mean of the layer-mean load), `moe_load_entropy` (its entropy divided
    by log E: 1.0 is uniform) and `moe_starved_frac` (fraction of experts with load < 0.1 / E
    in the layer mean). With at most PER_EXPERT_METRICS_MAX experts also `moe_load_e{i}`."""
    load = jnp.mean(stats.load, axis=0)
    e = load.shape[0]
    p = load / jnp.maximum(jnp.sum(load), 1e-30)
    entropy = -jnp.sum(jnp.where(p > 0, p * jnp.log(jnp.where(p > 0, p, 1.0)), 0.0))
    out = {
        "moe_aux_loss": jnp.mean(stats.aux_loss),
        "moe_load_max": jnp.max(stats.load) * e,
        "moe_load_min": jnp.min(stats.load) * e,
        "moe_load_cv": jnp.std(load) / jnp.maximum(jnp.mean(load), 1e-30),
        "moe_load_entropy": entropy / max(np.log(e), 1e-30),
        "moe_starved_frac": jnp.mean((load < 0.1 / e).astype(jnp.float32)),
    }
    if e <= PER_EXPERT_METRICS_MAX:
        out.update({f"moe_load_e{i}": load[i] for i in range(e)})
    return out


def _combine(ms: dict) -> dict:
    """Per-micro-batch metrics (each [M]) -> whole-batch metrics (see module docstring)."""
    norm, tokens = ms["normaliser"], ms["tokens"]
    out = {}
    for k, v in ms.items():
        if k in _SUMMED:
            out[k] = v.sum()
        elif k in _LOSS_LIKE:
            out[k] = (v * norm).sum() / jnp.maximum(norm.sum(), 1.0)
        elif k.endswith("_max"):
            out[k] = v.max()
        elif k.endswith("_min"):
            out[k] = v.min()
        else:  # token means (ratio_mean, clip/cap fractions, sampler-trainer KL)
            out[k] = (v * tokens).sum() / jnp.maximum(tokens.sum(), 1.0)
    return out


def global_norm(tree) -> jax.Array:
    """sqrt of the sum of squares of every leaf, in fp32."""
    return jnp.sqrt(sum(jnp.sum(jnp.square(x.astype(jnp.float32))) for x in jax.tree.leaves(tree)))


def _schedule_count(opt_state):
    """Applied-update count kept by optax's scale_by_schedule (drives the learning rate)."""
    is_sched = lambda x: isinstance(x, optax.ScaleByScheduleState)  # noqa: E731
    for x in jax.tree.leaves(opt_state, is_leaf=is_sched):
        if is_sched(x):
            return x.count
    raise ValueError("optimizer state has no ScaleByScheduleState (not from make_optimizer?)")


def micro_loss(
    params,
    mb,
    *,
    graphdef,
    objective: str,
    hparams: dict,
    num_prompts: int,
    max_length: Optional[int],
    temperature: float,
    logprob_chunk: Optional[int],
    fp32_head: bool,
    router_aux_loss_coef: float,
    hidden_sh,
    logits_sh,
):
    """One micro-batch's loss times its normaliser N_k (see the module docstring), and metrics.

    `mb` is one micro-batch of the TrainBatch (traced arrays, no leading M axis)."""
    model = nnx.merge(graphdef, params)
    with layers.kernel_mesh(hidden_sh.mesh):  # fused attention kernels run per shard
        hidden, router = model.forward(mb.tokens, mb.positions, mb.segment_ids)
    hidden = jax.lax.with_sharding_constraint(hidden, hidden_sh)
    logp, entropy = token_logprobs(
        hidden,
        model.head_kernel(),
        mb.targets,
        chunk_size=logprob_chunk,
        fp32=fp32_head,
        logits_sharding=logits_sh,
        temperature=temperature,
    )
    if not hparams.get("entropy_coef"):
        entropy = sg(entropy)  # metric only: no backward through it
    loss, m = rl_losses.policy_loss(
        objective,
        logp,
        mb.behaviour_logp,
        mb.advantages,
        mb.loss_mask,
        mb.prompt_index,
        num_prompts=num_prompts,
        max_length=max_length,
        entropy=entropy,
        **hparams,
    )
    # KL(sampler || trainer) from the sampler's own samples: k1 = log s - log t and
    # k3 = t/s - log(t/s) - 1 (rl.objectives.kl_penalty with the sampler as "policy").
    counted = counted_mask(mb.loss_mask, mb.prompt_index, num_prompts)
    lp = sg(logp)
    m["kl_sampler_k1"] = masked_mean(mb.behaviour_logp - lp, counted)
    m["kl_sampler_k3"] = masked_mean(rl_losses.kl_penalty(mb.behaviour_logp, lp, "k3"), counted)
    m["seq_tokens"] = jnp.sum(mb.segment_ids > 0).astype(jnp.float32)
    if router is not None:  # an MoE policy
        m.update(router_metrics(router))
        if router_aux_loss_coef:
            loss = loss + router_aux_loss_coef * m["moe_aux_loss"]
    # Scaled by this micro-batch's normaliser; the sum is divided once at the end.
    return loss * sg(m["normaliser"]), m


def loss_and_grad(params, mb, **loss_kw):
    """(gradient of `micro_loss` w.r.t. params, the micro-batch's metrics)."""
    return jax.grad(micro_loss, has_aux=True)(params, mb, **loss_kw)


def accumulate(params, batch: TrainBatch, *, grad_fn, grad_sh):
    """Scan `grad_fn(params, mb)` over the micro-batches: (whole-batch grads, combined metrics).

    Gradients accumulate in fp32 and are divided once by the whole batch's normaliser."""
    zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params)
    zeros = jax.lax.with_sharding_constraint(zeros, grad_sh)

    def body(acc, mb):
        grads, m = grad_fn(params, mb)
        acc = jax.tree.map(lambda a, g: a + g.astype(jnp.float32), acc, grads)
        return jax.lax.with_sharding_constraint(acc, grad_sh), m

    acc, per_micro = jax.lax.scan(body, zeros, batch)
    metrics = _combine(per_micro)
    scale = 1.0 / jnp.maximum(metrics["normaliser"], 1.0)
    grads = jax.tree.map(lambda a, p: (a * scale).astype(p.dtype), acc, params)
    return grads, metrics


def guarded_update(state: TrainState, grads, metrics: dict, *, tx, schedule, max_grad_norm):
    """Apply the optimiser update unless the loss/gradient is not finite or the batch is empty.

    Returns the new state and `metrics` plus the update's (norms, learning rate, skip flags)."""
    params = state.params
    grad_norm = global_norm(grads)
    finite = jnp.isfinite(grad_norm) & jnp.isfinite(metrics["loss"])
    nonempty = metrics["tokens"] > 0
    apply = finite & nonempty
    lr = schedule(_schedule_count(state.opt_state))
    updates, new_opt = tx.update(grads, state.opt_state, params)
    new_params = optax.apply_updates(params, updates)

    def pick(new, old):
        return jnp.where(apply, new, old)

    new_state = TrainState(
        params=jax.tree.map(pick, new_params, params),
        opt_state=jax.tree.map(pick, new_opt, state.opt_state),
        step=state.step + 1,
        rng=jax.random.split(state.rng)[0],
        skipped=state.skipped + (~finite).astype(jnp.int32),
    )
    metrics = dict(
        metrics,
        grad_norm=grad_norm,
        param_norm=global_norm(new_state.params),
        update_norm=jnp.where(apply, global_norm(updates), 0.0),
        learning_rate=lr,
        skipped=(~finite).astype(jnp.float32),
        empty=(~nonempty).astype(jnp.float32),
        skipped_total=new_state.skipped.astype(jnp.float32),
    )
    if max_grad_norm is not None:
        metrics["grad_clipped"] = (grad_norm > max_grad_norm).astype(jnp.float32)
    return new_state, metrics


def step(state: TrainState, batch: TrainBatch, *, grad_fn, grad_sh, update_kw: dict):
    """The whole train step: accumulate the micro-batches' gradients, then a guarded update."""
    grads, metrics = accumulate(state.params, batch, grad_fn=grad_fn, grad_sh=grad_sh)
    new_state, metrics = guarded_update(state, grads, metrics, **update_kw)
    return new_state, {k: v.astype(jnp.float32) for k, v in metrics.items()}


def check_batch(batch: TrainBatch, *, num_prompts: int, micro_batches: int, shards: int, mesh):
    """Host-side checks of a batch against the step it is fed to (clear errors, before jit)."""
    m, r, _ = batch.shape
    if batch.num_prompts != num_prompts:
        raise ValueError(
            f"TrainBatch.num_prompts={batch.num_prompts} but the step was "
            f"built for num_prompts={num_prompts}"
        )
    if m != micro_batches:
        raise ValueError(
            f"TrainBatch has {m} micro-batches, OptimConfig.micro_batches={micro_batches}"
        )
    if r % shards:
        raise ValueError(
            f"TrainBatch has {r} rows per micro-batch; must be a multiple of "
            f"the {shards} batch shards of the trainer mesh {dict(mesh.shape)}"
        )


def make_train_step(
    graphdef,
    abstract_state: TrainState,
    mesh,
    *,
    model_cfg: ModelConfig,
    loss_cfg: LossConfig,
    optim_cfg: OptimConfig,
    num_prompts: int,
    max_length: Optional[int] = None,
    donate: bool = True,
    temperature: float = 1.0,
):
    """Build `train_step(state, batch) -> (state, metrics)`, jitted once.
    Long because it binds every setting to the module-level functions above by keyword;
    the step's logic is in them.

    abstract_state: from `train.state.abstract_train_state` (ShapeDtypeStructs with shardings).
    num_prompts: the batch's static prompt capacity. max_length: the 'constant' aggregation's
    divisor (Dr.GRPO: the max completion length; default T). Log-probs are computed in chunks
    of `optim_cfg.logprob_chunk` positions (None: all at once). The objective gets exactly the
    settings it reads (`loss_cfg.objective_hparams()`, plus aggregation and entropy_coef).
    temperature: the sampler's (its greedy 0 reports log-probs at 1, so pass 1 then): the
    trainer's log-probs and entropy are those of softmax(logits / temperature), the distribution
    the behaviour log-probs come from, so the ratio measures the policy's change and not the
    temperature. The sampler's top-k / top-p renormalisation is not mirrored: with either set,
    the sampler's log-prob of a kept token is higher by minus the log of the kept mass, and the
    ratio reads that as lag.

    TIS here. The step has the sampler's log-probs (the batch's behaviour_logp) and the current
    trainer's, but no trainer log-probs at the parameters that sampled the batch (the sampler
    may lag by up to max_lag versions, and those parameters are gone). Each batch gets one
    optimiser step, from the parameters its log-probs are computed at, so the step uses
    pi_old = pi_theta, i.e. old_logp = sg(logp). With `loss_cfg.tis_cap = C`, every objective's
    own ratio is then 1 in value (its clip or cap cannot bind) and each token is weighted by
    sg(min(pi_theta / pi_sampler, C)), a weight that covers the sampler's lag as well as the
    sampler/trainer mismatch: the step's update equals that of objective 'tis' with tis_cap C
    (tested for cispo, whose loss value is also 'tis's). Without tis_cap, ratios are against
    the sampler as in ScaleRL.

    The returned function checks a numpy batch on the host and places it with `put_batch`;
    device batches go straight in. `train_step.jitted` is the jitted function itself (for
    `.lower(...)`).
    """
    if loss_cfg.kl_coef > 0:
        raise ValueError(
            f"LossConfig.kl_coef={loss_cfg.kl_coef}: the train step computes no "
            "reference-policy log-probs; KL to a reference is not supported here"
        )
    state_sh = jax.tree.map(lambda s: s.sharding, abstract_state)
    grad_sh = state_sh.params
    grad_fn = functools.partial(
        loss_and_grad,
        graphdef=graphdef,
        objective=loss_cfg.objective,
        # Only what the objective reads: policy_loss refuses a setting its objective would ignore.
        hparams=dict(
            loss_cfg.objective_hparams(),
            aggregation=loss_cfg.aggregation,
            entropy_coef=loss_cfg.entropy_coef,
        ),
        num_prompts=num_prompts,
        max_length=max_length,
        temperature=temperature,
        logprob_chunk=optim_cfg.logprob_chunk,
        fp32_head=model_cfg.fp32_head,
        router_aux_loss_coef=model_cfg.router_aux_loss_coef,
        # Activations: rows over the batch axes; the logits' vocab over `tensor` (as the LM head).
        hidden_sh=mesh_lib.named(mesh, "batch", None, None),
        logits_sh=mesh_lib.named(mesh, "batch", None, "vocab"),
    )
    update_kw = dict(
        tx=make_optimizer(optim_cfg),
        schedule=learning_rate(optim_cfg),
        max_grad_norm=optim_cfg.max_grad_norm,
    )
    jitted = jax.jit(
        functools.partial(step, grad_fn=grad_fn, grad_sh=grad_sh, update_kw=update_kw),
        in_shardings=(state_sh, batch_sharding(mesh)),
        out_shardings=(state_sh, NamedSharding(mesh, PartitionSpec())),
        donate_argnums=(0,) if donate else (),
    )
    shards = batch_shards(mesh)

    def train_step(state: TrainState, batch: TrainBatch):
        check_batch(
            batch,
            num_prompts=num_prompts,
            micro_batches=optim_cfg.micro_batches,
            shards=shards,
            mesh=mesh,
        )
        if isinstance(batch.tokens, np.ndarray):
            check_layout(batch)
            batch = put_batch(batch, mesh)
        return jitted(state, batch)

    train_step.jitted = jitted  # type: ignore[attr-defined]  # the compiled step, for lowering
    return train_step
