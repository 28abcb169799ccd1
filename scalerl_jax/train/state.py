"""The trainer's state, created directly in its mesh shardings.

Nothing is materialised unsharded: shapes come from `jax.eval_shape`, shardings from the
logical-axis rules (`mesh.state_shardings`: the Adam moments are Params too, so they carry the
parameters' logical axes and get the same sharding), then one jitted init with `out_shardings`
writes every shard on its own device. From an HF checkpoint, `models.hf.load_params` places the
weights in their shardings and only the optimizer state is initialised here.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
from flax import nnx

from scalerl_jax import mesh as mesh_lib
from scalerl_jax.config import ModelConfig, OptimConfig
from scalerl_jax.models.transformer import Transformer
from scalerl_jax.train.optim import make_optimizer


class TrainState(NamedTuple):
    params: Any  # nnx.State of the Transformer (Params carry `logical_axes`)
    opt_state: Any  # optax state of `make_optimizer(optim_cfg)`
    step: jax.Array  # int32 []: batches consumed, skipped ones included
    rng: jax.Array  # uint32 [2]: raw PRNG key, advanced once per step
    skipped: jax.Array  # int32 []: updates skipped by the non-finite guard


def _assemble(params, tx, seed: int) -> TrainState:
    return TrainState(
        params=params,
        opt_state=tx.init(params),
        step=jnp.zeros((), jnp.int32),
        rng=jax.random.PRNGKey(seed),
        skipped=jnp.zeros((), jnp.int32),
    )


def _random_state(cfg: ModelConfig, tx, seed: int) -> TrainState:
    return _assemble(nnx.state(Transformer(cfg, nnx.Rngs(params=seed))), tx, seed)


def graphdef_of(cfg: ModelConfig):
    """The model's graph definition (static structure), without allocating any weights."""
    graphdef, _ = nnx.split(nnx.eval_shape(lambda: Transformer(cfg, nnx.Rngs(params=0))))
    return graphdef


def abstract_train_state(model_cfg: ModelConfig, optim_cfg: OptimConfig, mesh, seed: int = 0):
    """(graphdef, TrainState of ShapeDtypeStructs carrying their target shardings).

    The restore target for checkpoints and the source of the train step's shardings.
    """
    tx = make_optimizer(optim_cfg)
    shapes = jax.eval_shape(lambda: _random_state(model_cfg, tx, seed))
    shardings = state_shardings(shapes, mesh)
    return graphdef_of(model_cfg), with_shardings(shapes, shardings)


def with_shardings(shapes, shardings):
    """ShapeDtypeStructs of `shapes` carrying `shardings` (a prefix tree: one per Variable)."""

    def place(sharding, sub):
        return jax.tree.map(
            lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding), sub
        )

    return jax.tree.map(place, shardings, shapes)


def state_shardings(state, mesh):
    """NamedSharding tree of a TrainState (concrete or abstract)."""
    return mesh_lib.state_shardings(state, mesh)


def create_train_state(
    model_cfg: ModelConfig,
    optim_cfg: OptimConfig,
    mesh,
    *,
    seed: int = 0,
    hf_checkpoint: Optional[str] = None,
):
    """(model_cfg, graphdef, TrainState) with every array in its sharding on `mesh`.

    `hf_checkpoint`: an HF model directory whose weights replace the random init. `model_cfg`
    must describe its architecture (e.g. `models.hf.config_from_hf(path, **overrides)`);
    `hf.load_params` checks every name and shape and reads each shard straight into its
    sharding. Returns the config the weights were loaded with.
    """
    if hf_checkpoint is None:
        graphdef, abstract = abstract_train_state(model_cfg, optim_cfg, mesh, seed)
        return model_cfg, graphdef, init_program(model_cfg, optim_cfg, abstract, seed)()

    from scalerl_jax.models import hf  # lazy: pulls safetensors and the HF config reader

    cfg, graphdef, params = hf.load_params(
        hf_checkpoint, mesh=mesh, cfg=model_cfg, dtype=model_cfg.param_dtype
    )
    return cfg, graphdef, assemble_program(optim_cfg, params, mesh, seed)(params)


def init_program(model_cfg: ModelConfig, optim_cfg: OptimConfig, abstract, seed: int = 0):
    """The jitted random init (no arguments) writing `abstract`'s shardings
    (`abstract_train_state`); `.lower()` compiles it ahead of time."""
    tx = make_optimizer(optim_cfg)
    shardings = jax.tree.map(lambda s: s.sharding, abstract)
    return jax.jit(lambda: _random_state(model_cfg, tx, seed), out_shardings=shardings)


def assemble_program(optim_cfg: OptimConfig, params, mesh, seed: int = 0):
    """The jitted TrainState around loaded params (concrete or abstract: only their shapes
    are read), which it takes donated."""
    tx = make_optimizer(optim_cfg)
    shapes = jax.eval_shape(lambda p: _assemble(p, tx, seed), params)
    shardings = state_shardings(shapes, mesh)
    return jax.jit(
        lambda p: _assemble(p, tx, seed),
        in_shardings=(shardings.params,),
        out_shardings=shardings,
        donate_argnums=0,
    )
