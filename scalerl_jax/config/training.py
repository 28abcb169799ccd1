"""How the policy is trained: LossConfig (the RL objective and its static settings),
OptimConfig (AdamW and its schedule) and SFTConfig (the supervised warm-up before RL)."""

from __future__ import annotations

import dataclasses
from typing import Optional

from scalerl_jax.config.checks import _check, _choice, _positive
from scalerl_jax.config.data import (
    COMPLETION_FORMATS,
    DataConfig,
    _check_placeholders,
    resolve_source,
)

# The objective -> settings table is shared with rl.objectives; that module is free of JAX.
from scalerl_jax.rl.hparams import OBJECTIVE_HPARAMS, OBJECTIVES, SPECIFIC_HPARAMS

LOSS_OBJECTIVES = OBJECTIVES
AGGREGATIONS = ("token", "sequence", "prompt", "constant")
ADVANTAGE_NORMS = ("batch", "group", "none")


@dataclasses.dataclass(frozen=True)
class LossConfig:
    """Objective and its static hyper-parameters. Defaults are ScaleRL's.

    The fields are `rl.objectives.policy_loss`'s keywords, one name per setting. The defaults are
    valid for every objective; a setting the chosen objective does not read
    (`rl.hparams.OBJECTIVE_HPARAMS`) must keep its default, else construction fails naming the
    setting and the objective (e.g. objective='cispo' with clip_eps_high=0.28).
    """

    objective: str = "cispo"
    ratio_cap: float = 4.0  # CISPO: absolute cap on rho = pi_theta / pi_behaviour (not 1 + eps)
    ratio_floor: Optional[float] = None  # CISPO optional lower cap (paper: none)
    clip_eps_low: float = 0.2  # grpo / dapo (PPO-clip): clip(rho, 1 - low, 1 + high)
    # 0.2 keeps the default valid for 'grpo' (symmetric); 'dapo' wants clip-higher, set it
    # (DAPO: 0.28, the paper's DAPO baseline: 0.26; dapo_loss's own default is 0.28).
    clip_eps_high: float = 0.2
    dual_clip: Optional[float] = None  # grpo / dapo: dual clip constant c > 1 for A < 0
    gspo_eps_low: float = 3e-3  # GSPO's clip range on the sequence ratio
    gspo_eps_high: float = 4e-3
    # Truncated importance sampling cap on pi_old / pi_behaviour: the 'tis' objective's weight
    # (None: 5.0, PipelineRL's); for the other objectives an optional correction on top (None:
    # off). The train step has no separate pi_old (pi_old = pi_theta), so there any objective
    # with tis_cap=C updates as 'tis' with C does (see train/step.py).
    tis_cap: Optional[float] = None
    aggregation: str = "prompt"
    advantage_norm: str = "batch"
    zero_variance_filter: bool = True
    kl_coef: float = 0.0
    kl_estimator: str = "k3"
    entropy_coef: float = 0.0
    reward_correct: float = 1.0  # paper: +-1 rewards
    reward_incorrect: float = -1.0
    length_penalty: bool = False  # LOO "length penalty instead of interruptions"
    length_penalty_max: int = 14336  # L_max
    length_penalty_cache: int = 2048  # L_cache

    def __post_init__(self):
        c = "LossConfig"
        _choice(c, "objective", self.objective, LOSS_OBJECTIVES)
        _choice(c, "aggregation", self.aggregation, AGGREGATIONS)
        _choice(c, "advantage_norm", self.advantage_norm, ADVANTAGE_NORMS)
        _choice(c, "kl_estimator", self.kl_estimator, ("k1", "k3"))
        uses = OBJECTIVE_HPARAMS[self.objective]
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        for name in SPECIFIC_HPARAMS:
            value = getattr(self, name)
            _check(
                name in uses or value == defaults[name],
                c,
                name,
                value,
                f"not used by objective={self.objective!r} (it reads {', '.join(uses)}); "
                f"leave it at its default {defaults[name]!r}",
            )
        _positive(
            c,
            ratio_cap=self.ratio_cap,
            gspo_eps_low=self.gspo_eps_low,
            gspo_eps_high=self.gspo_eps_high,
        )
        if self.tis_cap is not None:
            _positive(c, tis_cap=self.tis_cap)
        _check(
            0 <= self.clip_eps_low < 1, c, "clip_eps_low", self.clip_eps_low, "must be in [0, 1)"
        )
        _check(self.clip_eps_high >= 0, c, "clip_eps_high", self.clip_eps_high, "must be >= 0")
        if self.objective == "grpo":
            _check(
                self.clip_eps_high == self.clip_eps_low,
                c,
                "clip_eps_high",
                self.clip_eps_high,
                f"objective='grpo' clips symmetrically: must equal "
                f"clip_eps_low={self.clip_eps_low} (clip-higher is 'dapo')",
            )
        if self.ratio_floor is not None:
            _check(
                0 <= self.ratio_floor < self.ratio_cap,
                c,
                "ratio_floor",
                self.ratio_floor,
                f"must be in [0, ratio_cap={self.ratio_cap})",
            )
        if self.dual_clip is not None:
            _check(self.dual_clip > 1, c, "dual_clip", self.dual_clip, "must be > 1")
        _check(self.kl_coef >= 0, c, "kl_coef", self.kl_coef, "must be >= 0")
        _check(
            self.reward_correct > self.reward_incorrect,
            c,
            "reward_correct",
            self.reward_correct,
            f"must exceed reward_incorrect={self.reward_incorrect}",
        )

    def objective_hparams(self) -> dict:
        """The settings its objective reads, as `policy_loss` keywords (the shared ones
        aggregation / kl_coef / kl_estimator / entropy_coef not included)."""
        return {name: getattr(self, name) for name in OBJECTIVE_HPARAMS[self.objective]}


@dataclasses.dataclass(frozen=True)
class OptimConfig:
    """AdamW. Paper: constant 5e-7 after 100 warm-up steps, eps 1e-15, weight decay 0.01, no KL.
    Betas and clipping are not stated by the paper; these are common choices."""

    learning_rate: float = 5e-7
    warmup_steps: int = 100
    schedule: str = "constant"  # after warm-up: constant | cosine
    total_steps: int = 0  # needed by cosine
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-15
    weight_decay: float = 0.01
    max_grad_norm: Optional[float] = 1.0  # None: no clipping
    micro_batches: int = 1  # gradient accumulation
    logprob_chunk: Optional[int] = 512  # sequence positions per fp32 log-prob chunk (None: all)

    def __post_init__(self):
        c = "OptimConfig"
        _positive(
            c, learning_rate=self.learning_rate, eps=self.eps, micro_batches=self.micro_batches
        )
        if self.logprob_chunk is not None:
            _positive(c, logprob_chunk=self.logprob_chunk)
        _check(self.warmup_steps >= 0, c, "warmup_steps", self.warmup_steps, "must be >= 0")
        _choice(c, "schedule", self.schedule, ("constant", "cosine"))
        if self.schedule == "cosine":
            _check(
                self.total_steps > self.warmup_steps,
                c,
                "total_steps",
                self.total_steps,
                f"cosine needs total_steps > warmup_steps={self.warmup_steps}",
            )
        for name in ("b1", "b2"):
            v = getattr(self, name)
            _check(0 <= v < 1, c, name, v, "must be in [0, 1)")
        _check(self.weight_decay >= 0, c, "weight_decay", self.weight_decay, "must be >= 0")
        if self.max_grad_norm is not None:
            _positive(c, max_grad_norm=self.max_grad_norm)


@dataclasses.dataclass(frozen=True)
class SFTConfig:
    """Supervised warm-up that makes the RL stage's base policy (the paper RL-trains an SFT model).

    `source`: demonstrations, `synthetic:TASK[?knobs]` (each problem with its worked thought) or
    a local .jsonl/.parquet file whose rows hold `prompt_field` (the problem, formatted with the
    RL data's template so the policy sees the same prompts in both stages) and
    `completion_field` (the full target text, e.g. "<think>...</think>answer"); "{data_source}"
    is the RL data's source (DataConfig.source), "{data_dir}" its directory.
    `completion_format`: "raw" takes the completion as it is; "gsm8k" rewrites a GSM8K worked
    solution into the reasoning lines without their <<...>> calculator annotations, ending in
    "The final answer is \\boxed{N}." (data/answers.py); a row that cannot be rewritten is
    skipped and counted. The RL validation prompts are removed from the demonstrations. The
    loss is the mean token cross-entropy of the completions (eos appended); demonstrations are
    packed into rows.
    """

    source: str = "synthetic:chain"
    prompt_field: str = "prompt"
    completion_field: str = "completion"
    steps: int = 200
    batch_size: int = 16  # rows per step, each packed with whole demonstrations
    max_length: int = 256  # row length in tokens; longer demonstrations are skipped
    optim: OptimConfig = OptimConfig(
        learning_rate=1e-3, warmup_steps=10, eps=1e-8, weight_decay=0.0
    )
    log_every: int = 10
    completion_format: str = "raw"

    def __post_init__(self):
        c = "SFTConfig"
        _check(bool(self.source), c, "source", self.source, "must be non-empty")
        _check_placeholders(c, "source", self.source)
        _positive(
            c,
            steps=self.steps,
            batch_size=self.batch_size,
            max_length=self.max_length,
            log_every=self.log_every,
        )
        _choice(c, "completion_format", self.completion_format, COMPLETION_FORMATS)

    def source_for(self, data: "DataConfig") -> str:
        """`source` with its placeholders filled in from the RL data config."""
        return resolve_source(self.source, data.source, "SFTConfig.source")
