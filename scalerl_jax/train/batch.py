"""TrainBatch: what one train step consumes, and its assembly from scored rollout groups.

Arrays are [M, R, T] per token and [M, R] per row (M micro-batches of R rows, one sequence per
row, left-aligned); position t holds input `tokens[t]` and target `targets[t]`, with
`loss_mask` and `behaviour_logp` aligned to the targets. R and T are fixed by the prompt
capacity and `seq_bucket`, so the step compiles once; unused rows are padding (prompt_index -1,
empty mask). Micro-batches hold whole prompts (`check_layout`), which keeps gradient
accumulation exact (docs/training.md, "Step").
"""

from __future__ import annotations

from typing import Optional, Sequence

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from scalerl_jax.config import LossConfig
from scalerl_jax.rl import advantages as adv_lib
from scalerl_jax.sampler.types import Group


@flax.struct.dataclass
class TrainBatch:
    tokens: np.ndarray  # [M, R, T] int32 input tokens
    targets: np.ndarray  # [M, R, T] int32 next tokens (what position t predicts)
    positions: np.ndarray  # [M, R, T] int32
    segment_ids: np.ndarray  # [M, R, T] int32: 1 on real tokens, 0 on padding
    loss_mask: np.ndarray  # [M, R, T] bool: policy-sampled completion targets (not forced)
    behaviour_logp: np.ndarray  # [M, R, T] float32: sampler log-prob of each target
    advantages: np.ndarray  # [M, R] float32, one per row
    prompt_index: np.ndarray  # [M, R] int32 in [0, num_prompts); -1 on padding rows
    num_prompts: int = flax.struct.field(pytree_node=False)  # static prompt capacity

    @property
    def shape(self) -> tuple[int, int, int]:
        """(micro_batches M, rows per micro-batch R, sequence length T)."""
        return tuple(self.tokens.shape)


_TOKEN_FIELDS = ("tokens", "targets", "positions", "segment_ids", "loss_mask", "behaviour_logp")
_ROW_FIELDS = ("advantages", "prompt_index")


def check_layout(batch: TrainBatch) -> None:
    """Host-side checks of a numpy batch; ValueError naming the field and the numbers."""
    shape = batch.shape
    if len(shape) != 3:
        raise ValueError(f"TrainBatch.tokens must be [M, R, T], got shape {shape}")
    for name in _TOKEN_FIELDS:
        if tuple(np.shape(getattr(batch, name))) != shape:
            raise ValueError(
                f"TrainBatch.{name} has shape {np.shape(getattr(batch, name))}, tokens has {shape}"
            )
    for name in _ROW_FIELDS:
        if tuple(np.shape(getattr(batch, name))) != shape[:2]:
            raise ValueError(
                f"TrainBatch.{name} has shape {np.shape(getattr(batch, name))}, "
                f"expected [M, R]={shape[:2]}"
            )
    pidx = np.asarray(batch.prompt_index)
    if pidx.size and (pidx.max() >= batch.num_prompts or pidx.min() < -1):
        raise ValueError(
            f"TrainBatch.prompt_index spans [{pidx.min()}, {pidx.max()}]; must lie "
            f"in [-1, num_prompts={batch.num_prompts})"
        )
    micro_of: dict[int, int] = {}
    for m, row in zip(*np.nonzero(pidx >= 0)):
        p = int(pidx[m, row])
        if micro_of.setdefault(p, m) != m:
            raise ValueError(
                f"TrainBatch: prompt {p} has rows in micro-batches {micro_of[p]} and "
                f"{m}; each prompt's rows must share one micro-batch"
            )


def _round_up(x: int, k: int) -> int:
    return -(-x // k) * k


def _host_advantages(rewards, prompt_index, num_prompts, loss_cfg):
    # Tiny arrays: run them on the CPU backend when there is one, not on the accelerator.
    try:
        device = jax.local_devices(backend="cpu")[0]
    except RuntimeError:
        device = None
    with jax.default_device(device):
        adv, keep, metrics = adv_lib.group_advantages(
            jnp.asarray(rewards),
            jnp.asarray(prompt_index),
            num_prompts=num_prompts,
            norm=loss_cfg.advantage_norm,
            filter_zero_variance=loss_cfg.zero_variance_filter,
        )
        return np.asarray(adv), np.asarray(keep), {k: float(v) for k, v in metrics.items()}


def _shaped_rewards(groups, rewards, loss_cfg, correct):
    flat = np.concatenate([np.asarray(r, np.float32).reshape(-1) for r in rewards])
    if not loss_cfg.length_penalty:
        return flat
    lengths = np.array([len(c.tokens) for g in groups for c in g.completions], np.float32)
    ok = (
        flat >= loss_cfg.reward_correct
        if correct is None
        else np.concatenate([np.asarray(c, bool).reshape(-1) for c in correct])
    )
    pen = adv_lib.length_penalty(
        lengths,
        ok,
        max_length=loss_cfg.length_penalty_max,
        cache_length=loss_cfg.length_penalty_cache,
    )
    return flat + np.asarray(pen, np.float32)


def from_groups(
    groups: Sequence[Group],
    rewards: Sequence[Sequence[float]] | np.ndarray,
    *,
    loss_cfg: LossConfig,
    num_prompts: int,
    micro_batches: int = 1,
    rows_per_micro: Optional[int] = None,
    row_multiple: int = 1,
    seq_bucket: int = 128,
    max_seq_len: Optional[int] = None,
    pad_id: int = 0,
    correct: Optional[Sequence[Sequence[bool]] | np.ndarray] = None,
) -> tuple[TrainBatch, dict]:
    """Assemble a padded numpy TrainBatch from scored groups.

    rewards[i][j] is the reward of groups[i].completions[j]. Advantages come from
    `rl.advantages.group_advantages` with `loss_cfg.advantage_norm`; with
    `loss_cfg.zero_variance_filter` the zero-variance groups are dropped (not placed at all).
    With `loss_cfg.length_penalty` the ScaleRL length penalty is added to the rewards of
    correct completions first (`correct` defaults to reward >= loss_cfg.reward_correct).
    Kept prompts get dense prompt indices 0..K-1 in the order given.

    `num_prompts` is the static prompt capacity (e.g. PipelineConfig.prompts_per_step); R
    defaults to ceil(num_prompts x largest group / micro_batches) rounded up to row_multiple.
    Returns (batch, info) where info counts groups, kept/dropped groups, rows, loss tokens,
    forced tokens, sequence length and padding, plus the advantage metrics.
    """
    _check_groups(groups, rewards, num_prompts, micro_batches, row_multiple, seq_bucket)
    row_group = np.array([i for i, g in enumerate(groups) for _ in g.completions], np.int32)
    flat_rewards = _shaped_rewards(groups, rewards, loss_cfg, correct)
    if len(row_group):
        adv, keep, adv_metrics = _host_advantages(flat_rewards, row_group, num_prompts, loss_cfg)
    else:
        adv, keep, adv_metrics = np.zeros(0, np.float32), np.zeros(0, bool), {}
    kept = _kept_rows(groups, keep)
    largest = max((len(g.completions) for g in groups), default=1)
    if rows_per_micro is None:
        rows_per_micro = -(-num_prompts * largest // micro_batches)
    rows_per_micro = _round_up(rows_per_micro, row_multiple)
    place = _place(groups, kept, micro_batches, rows_per_micro)
    comp_of_row = [(g, c) for g in groups for c in g.completions]
    seq_len = _seq_len(comp_of_row, place, seq_bucket, max_seq_len)
    batch, forced_tokens = _fill(
        comp_of_row, place, adv, (micro_batches, rows_per_micro, seq_len), pad_id, num_prompts
    )
    check_layout(batch)
    real = int(batch.segment_ids.sum())
    info = {
        "groups": len(groups),
        "kept_groups": len(kept),
        "dropped_groups": len(groups) - len(kept),
        "rows": len(place),
        "loss_tokens": int(batch.loss_mask.sum()),
        "forced_tokens": forced_tokens,
        "seq_tokens": real,
        "seq_len": seq_len,
        "padding_frac": 1.0 - real / float(np.prod(batch.tokens.shape)),
        **adv_metrics,
    }
    return batch, info


def _check_groups(groups, rewards, num_prompts, micro_batches, row_multiple, seq_bucket):
    if len(rewards) != len(groups):
        raise ValueError(f"from_groups: {len(groups)} groups but {len(rewards)} reward lists")
    if len(groups) > num_prompts:
        raise ValueError(f"from_groups: {len(groups)} groups exceed num_prompts={num_prompts}")
    for i, (g, group_rewards) in enumerate(zip(groups, rewards)):
        if len(group_rewards) != len(g.completions):
            raise ValueError(
                f"from_groups: group {i} ({g.prompt_id!r}) has "
                f"{len(g.completions)} completions but {len(group_rewards)} rewards"
            )
        if len(g.prompt_tokens) == 0:
            raise ValueError(
                f"from_groups: group {i} ({g.prompt_id!r}) has an empty prompt; "
                "the first completion token needs a token before it"
            )
    if micro_batches <= 0 or row_multiple <= 0 or seq_bucket <= 0:
        raise ValueError(
            f"from_groups: micro_batches={micro_batches}, row_multiple="
            f"{row_multiple}, seq_bucket={seq_bucket} must all be > 0"
        )


def _kept_rows(groups, keep) -> list:
    """Kept groups, in order, as (group index, [global row ids of its kept rows])."""
    kept = []
    start = 0
    for i, g in enumerate(groups):
        rows = [start + j for j in range(len(g.completions)) if keep[start + j]]
        if rows:
            kept.append((i, rows))
        start += len(g.completions)
    return kept


def _place(groups, kept, micro_batches: int, rows_per_micro: int) -> list:
    """Whole prompts per micro-batch, each to the emptiest one (balances rows, hence compute):
    (micro, row slot, group index, global row, dense prompt index) per kept row."""
    fill = [0] * micro_batches
    place = []
    for dense, (i, rows) in enumerate(kept):
        m = min(range(micro_batches), key=lambda k: (fill[k], k))
        if fill[m] + len(rows) > rows_per_micro:
            raise ValueError(
                f"from_groups: prompt {groups[i].prompt_id!r} ({len(rows)} rows) "
                f"does not fit: micro-batches hold {rows_per_micro} rows and the "
                f"emptiest has {fill[m]}"
            )
        for r in rows:
            place.append((m, fill[m], i, r, dense))
            fill[m] += 1
    return place


def _seq_len(comp_of_row, place, seq_bucket: int, max_seq_len: Optional[int]) -> int:
    """The longest placed sequence rounded up to `seq_bucket` (at most `max_seq_len`)."""
    longest = max(
        (
            len(comp_of_row[r][0].prompt_tokens) + len(comp_of_row[r][1].tokens) - 1
            for _, _, _, r, _ in place
        ),
        default=1,
    )
    seq_len = _round_up(max(longest, 1), seq_bucket)
    if max_seq_len is not None:
        if longest > max_seq_len:
            raise ValueError(
                f"from_groups: a sequence needs {longest} positions, max_seq_len={max_seq_len}"
            )
        seq_len = min(seq_len, max_seq_len)
    return seq_len


def _fill(comp_of_row, place, adv, shape, pad_id: int, num_prompts: int):
    """The padded batch of the placed rows, and its number of forced tokens."""
    tokens = np.full(shape, pad_id, np.int32)
    targets = np.full(shape, pad_id, np.int32)
    positions = np.zeros(shape, np.int32)
    segment_ids = np.zeros(shape, np.int32)
    loss_mask = np.zeros(shape, bool)
    behaviour = np.zeros(shape, np.float32)
    advantages = np.zeros(shape[:2], np.float32)
    prompt_index = np.full(shape[:2], -1, np.int32)
    forced_tokens = 0
    for m, slot, _, r, dense in place:
        g, c = comp_of_row[r]
        seq = np.concatenate(
            [np.asarray(g.prompt_tokens, np.int32), np.asarray(c.tokens, np.int32)]
        )
        n, p = len(seq) - 1, len(g.prompt_tokens)
        tokens[m, slot, :n] = seq[:-1]
        targets[m, slot, :n] = seq[1:]
        positions[m, slot, :n] = np.arange(n)
        segment_ids[m, slot, :n] = 1
        # Completion token k is the target of position p - 1 + k.
        forced = np.asarray(c.forced, bool)
        loss_mask[m, slot, p - 1 : n] = ~forced
        behaviour[m, slot, p - 1 : n] = np.asarray(c.logprobs, np.float32)
        advantages[m, slot] = adv[r]
        prompt_index[m, slot] = dense
        forced_tokens += int(forced.sum())
    batch = TrainBatch(
        tokens=tokens,
        targets=targets,
        positions=positions,
        segment_ids=segment_ids,
        loss_mask=loss_mask,
        behaviour_logp=behaviour,
        advantages=advantages,
        prompt_index=prompt_index,
        num_prompts=num_prompts,
    )
    return batch, forced_tokens
