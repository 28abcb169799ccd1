"""Public RL objectives: ``from scalerl_jax import losses``.

Pure, jit-friendly functions of arrays with static Python hyper-parameters; each objective
returns ``(loss, metrics)`` with ``loss`` an fp32 scalar to minimise. See the docstrings of
`scalerl_jax.rl.objectives`, `scalerl_jax.rl.aggregation` and `scalerl_jax.rl.advantages` for the
exact formulas and how they relate to TRL and verl.
"""

from scalerl_jax.rl.advantages import (
    ADVANTAGE_NORMS,
    group_advantages,
    group_counts,
    group_mean,
    length_penalty,
    overlong_penalty,
    zero_variance_groups,
)
from scalerl_jax.rl.aggregation import AGGREGATIONS, aggregate, token_weights
from scalerl_jax.rl.objectives import (
    HPARAM_NAMES,
    OBJECTIVE_HPARAMS,
    OBJECTIVES,
    cispo_loss,
    dapo_loss,
    grpo_loss,
    gspo_loss,
    kl_penalty,
    policy_loss,
    ppo_clip_loss,
    tis_loss,
)

__all__ = [
    "ADVANTAGE_NORMS",
    "AGGREGATIONS",
    "HPARAM_NAMES",
    "OBJECTIVE_HPARAMS",
    "OBJECTIVES",
    "aggregate",
    "cispo_loss",
    "dapo_loss",
    "grpo_loss",
    "group_advantages",
    "group_counts",
    "group_mean",
    "gspo_loss",
    "kl_penalty",
    "length_penalty",
    "overlong_penalty",
    "policy_loss",
    "ppo_clip_loss",
    "tis_loss",
    "token_weights",
    "zero_variance_groups",
]
