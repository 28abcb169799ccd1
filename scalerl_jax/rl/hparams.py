"""Which hyper-parameters each objective reads: one table for `rl.objectives` and `LossConfig`.

Free of JAX on purpose, so that `config/training.py` can validate a LossConfig against the same
table the losses dispatch with. A setting that the chosen objective would not read is refused (by
`policy_loss` and by `LossConfig`) rather than silently ignored.
"""

from __future__ import annotations

# Read by every objective (kl_estimator only when a reference policy is given).
SHARED_HPARAMS = ("aggregation", "kl_coef", "kl_estimator", "entropy_coef")

# Read only by some objectives: one row per objective registered with `rl.registry.objective`
# (its function's keywords must be the row). `tis_cap` belongs to all of them: 'tis' is built
# on it, the others apply the truncated importance-sampling weight on top when it is set.
OBJECTIVE_HPARAMS = {
    "cispo": ("ratio_cap", "ratio_floor", "tis_cap"),
    "grpo": ("clip_eps_low", "clip_eps_high", "dual_clip", "tis_cap"),
    "dapo": ("clip_eps_low", "clip_eps_high", "dual_clip", "tis_cap"),
    "gspo": ("gspo_eps_low", "gspo_eps_high", "tis_cap"),
    "tis": ("tis_cap",),
}

OBJECTIVES = tuple(OBJECTIVE_HPARAMS)

# Every objective-specific name, in table order, those that every objective reads last.
SPECIFIC_HPARAMS = tuple(
    sorted(
        dict.fromkeys(n for row in OBJECTIVE_HPARAMS.values() for n in row),
        key=lambda n: all(n in row for row in OBJECTIVE_HPARAMS.values()),
    )
)

# Keyword names of `policy_loss` that are also LossConfig fields (e.g. jit's static_argnames).
HPARAM_NAMES = ("aggregation",) + SPECIFIC_HPARAMS + SHARED_HPARAMS[1:]


def check_objective(objective: str) -> None:
    if objective not in OBJECTIVES:
        raise ValueError(f"objective={objective!r}: must be one of {OBJECTIVES}")


def unused_hparams(objective: str, names) -> list[str]:
    """The objective-specific names among `names` that `objective` does not read."""
    check_objective(objective)
    return [n for n in names if n in SPECIFIC_HPARAMS and n not in OBJECTIVE_HPARAMS[objective]]


def describe_unused(objective: str, settings: dict) -> str:
    """'clip_eps_low=0.0003 is not used by objective='gspo' (it reads ...)' for an error."""
    given = ", ".join(f"{k}={v!r}" for k, v in settings.items())
    verb = "is" if len(settings) == 1 else "are"
    return (
        f"{given} {verb} not used by objective={objective!r} (it reads "
        f"{', '.join(OBJECTIVE_HPARAMS[objective])})"
    )
