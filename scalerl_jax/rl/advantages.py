"""Group-relative advantages, zero-variance groups, and length-based reward shaping.

Rows are sequences; ``prompt_index`` [N] (static ``num_prompts``) names each row's group (rows
of one prompt need not be adjacent) and ``valid`` [N] marks real rows; rows outside
[0, num_prompts) never influence any statistic and get advantage 0. Conventions (Bessel-
corrected std, ``std + eps``, ScaleRL's batch std after zero-variance filtering) and how they
differ from TRL and verl: docs/losses.md, "Advantages, reward shaping, conventions".
"""

from __future__ import annotations


import jax
import jax.numpy as jnp
import numpy as np

ADVANTAGE_NORMS = ("batch", "group", "none")


def _rows(values, prompt_index, num_prompts, valid):
    if not (isinstance(num_prompts, (int, np.integer)) and num_prompts > 0):
        raise ValueError(f"num_prompts={num_prompts!r}: must be a positive Python int (static)")
    values = jnp.asarray(values)
    n = values.shape[0] if values.ndim == 1 else None
    for name, x in (("values", values), ("prompt_index", prompt_index), ("valid", valid)):
        if x is not None and (jnp.ndim(x) != 1 or jnp.shape(x)[0] != n):
            raise ValueError(f"{name} must be [N] with N={n}, got shape {jnp.shape(x)}")
    p = jnp.asarray(prompt_index)
    ok = (p >= 0) & (p < num_prompts)
    if valid is not None:
        ok = ok & (jnp.asarray(valid) != 0)
    onehot = (p[:, None] == jnp.arange(num_prompts)[None, :]) & ok[:, None]  # [N, P]
    return values.astype(jnp.float32), ok, onehot


def _group_sum(x, onehot):
    return jnp.sum(jnp.where(onehot, x[:, None], 0.0), axis=0)


def _to_rows(per_group, onehot):
    return jnp.sum(jnp.where(onehot, per_group[None, :], 0.0), axis=1)


def group_counts(prompt_index, *, num_prompts: int, valid=None) -> jax.Array:
    """Number of valid rows per prompt, int32 [num_prompts]."""
    _, _, onehot = _rows(jnp.zeros(jnp.shape(prompt_index)), prompt_index, num_prompts, valid)
    return onehot.sum(axis=0, dtype=jnp.int32)


def group_mean(values, prompt_index, *, num_prompts: int, valid=None) -> jax.Array:
    """Mean of ``values`` [N] per prompt over valid rows, fp32 [num_prompts]; 0 for empty groups.

    With 0/1 correctness as values this is each prompt's pass rate (what the curriculum needs).
    """
    v, _, onehot = _rows(values, prompt_index, num_prompts, valid)
    count = onehot.sum(axis=0, dtype=jnp.int32)
    return _group_sum(v, onehot) / jnp.maximum(count, 1).astype(jnp.float32)


def zero_variance_groups(
    rewards, prompt_index, *, num_prompts: int, valid=None, atol: float = 0.0
) -> jax.Array:
    """bool [num_prompts]: groups with >= 1 valid row whose rewards all agree (max - min <= atol).

    Such a group has all-zero centred advantages, so it carries no signal (all correct or all
    wrong under 0/1 or +-1 rewards). A group with a single valid row counts as zero-variance.
    Empty groups are False (they are absent, not zero-variance).
    """
    r, _, onehot = _rows(rewards, prompt_index, num_prompts, valid)
    hi = jnp.max(jnp.where(onehot, r[:, None], -jnp.inf), axis=0)
    lo = jnp.min(jnp.where(onehot, r[:, None], jnp.inf), axis=0)
    present = onehot.any(axis=0)
    return present & (jnp.where(present, hi - lo, 0.0) <= atol)


def group_advantages(
    rewards,
    prompt_index,
    *,
    num_prompts: int,
    valid=None,
    norm: str = "batch",
    filter_zero_variance: bool = True,
    eps: float = 1e-6,
    ddof: int = 1,
    atol: float = 0.0,
) -> tuple[jax.Array, jax.Array, dict]:
    """Group-mean-centred advantages, normalised by `norm`.

    ``A_i = r_i - mean_{group(i)}(r)`` over valid rows, then

    * ``"batch"`` (ScaleRL): ``A_i / (std(A over kept rows) + eps)``;
    * ``"group"`` (GRPO):    ``A_i / (std_{group(i)}(r) + eps)``;
    * ``"none"``  (Dr.GRPO): ``A_i``.

    Kept rows: valid rows of groups that are present and, when ``filter_zero_variance``, not
    zero-variance (see `zero_variance_groups`). Rows not kept get advantage 0; multiply the
    loss mask by ``keep`` so they are not counted in the loss normaliser either (that is what
    "dropping" a group means for aggregation='prompt' or 'token').

    Returns ``(advantages fp32 [N], keep bool [N], metrics)``; metrics (fp32 scalars):
    ``groups`` (present), ``zero_variance_groups``, ``zero_variance_frac`` (of present groups),
    ``kept_groups``, ``kept_rows``, ``reward_mean`` (valid rows), ``centred_std`` (std of the
    centred advantages over kept rows: the "batch" divisor before eps).
    """
    if norm not in ADVANTAGE_NORMS:
        raise ValueError(f"norm={norm!r}: must be one of {ADVANTAGE_NORMS}")
    if ddof not in (0, 1):
        raise ValueError(f"ddof={ddof!r}: must be 0 or 1")
    r, ok, onehot = _rows(rewards, prompt_index, num_prompts, valid)
    count = onehot.sum(axis=0, dtype=jnp.int32)
    mean = _group_sum(r, onehot) / jnp.maximum(count, 1).astype(jnp.float32)
    centred = jnp.where(ok, r - _to_rows(mean, onehot), 0.0)

    present = count > 0
    zero_var = zero_variance_groups(
        rewards, prompt_index, num_prompts=num_prompts, valid=valid, atol=atol
    )
    kept_group = present & ~zero_var if filter_zero_variance else present
    keep = ok & (_to_rows(kept_group.astype(jnp.float32), onehot) > 0)

    n_keep = keep.sum(dtype=jnp.int32)
    kept_mean = jnp.sum(jnp.where(keep, centred, 0.0)) / jnp.maximum(n_keep, 1).astype(jnp.float32)
    kept_var = jnp.sum(jnp.where(keep, (centred - kept_mean) ** 2, 0.0)) / jnp.maximum(
        n_keep - ddof, 1
    ).astype(jnp.float32)
    centred_std = jnp.sqrt(kept_var)

    if norm == "batch":
        adv = centred / (centred_std + eps)
    elif norm == "group":
        group_var = _group_sum(centred**2, onehot) / jnp.maximum(count - ddof, 1).astype(
            jnp.float32
        )
        adv = centred / (_to_rows(jnp.sqrt(group_var), onehot) + eps)
    else:
        adv = centred
    adv = jnp.where(keep, adv, 0.0)

    n_present = present.sum(dtype=jnp.int32)
    n_zero = zero_var.sum(dtype=jnp.int32)
    metrics = {
        "groups": n_present,
        "zero_variance_groups": n_zero,
        "zero_variance_frac": n_zero / jnp.maximum(n_present, 1),
        "kept_groups": kept_group.sum(dtype=jnp.int32),
        "kept_rows": n_keep,
        "reward_mean": jnp.sum(jnp.where(ok, r, 0.0)) / jnp.maximum(ok.sum(), 1),
        "centred_std": centred_std,
    }
    return adv, keep, {k: jnp.asarray(v, jnp.float32) for k, v in metrics.items()}


def _check_lengths(max_length, cache_length):
    if not 0 < cache_length <= max_length:
        raise ValueError(f"cache_length={cache_length}: must be in (0, max_length={max_length}]")


def overlong_penalty(lengths, *, max_length: int, cache_length: int) -> jax.Array:
    """DAPO's soft overlong punishment for response lengths [N], fp32 [N] in [-1, 0].

    ``0`` for ``|y| <= max_length - cache_length``; ``((max_length - cache_length) - |y|) /
    cache_length`` in between (linear down to -1 at max_length); ``-1`` beyond max_length.
    Equal to ``clip((max_length - |y|) / cache_length - 1, -1, 0)``. DAPO adds it to every
    reward; see `length_penalty` for ScaleRL's correct-only variant.
    """
    _check_lengths(max_length, cache_length)
    y = jnp.asarray(lengths).astype(jnp.float32)
    return jnp.clip((max_length - y) / cache_length - 1.0, -1.0, 0.0)


def length_penalty(
    lengths, correct, *, max_length: int = 14336, cache_length: int = 2048
) -> jax.Array:
    """ScaleRL's length penalty (LOO "length penalty instead of interruptions"), fp32 [N].

    ``R_len = clip((L_max - |y|) / L_cache - 1, -1, 0)`` on correct traces (``correct`` != 0),
    0 on the others; add it to the reward before computing advantages. Paper: L_max = 14k,
    L_cache = 2k. Note that correct traces then have different rewards, so a group can stop
    being zero-variance.
    """
    pen = overlong_penalty(lengths, max_length=max_length, cache_length=cache_length)
    return jnp.where(jnp.asarray(correct) != 0, pen, 0.0)
