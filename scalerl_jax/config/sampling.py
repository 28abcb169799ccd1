"""The generation side of a run: SamplerConfig (decode slots, lengths, sampling,
interruptions, weight sync) and PipelineConfig (off-policy mode and batch shape)."""

from __future__ import annotations

import dataclasses

from scalerl_jax.config.checks import _check, _choice, _positive


@dataclasses.dataclass(frozen=True)
class SamplerConfig:
    """Generation: slots, lengths, sampling, interruptions (docs/sampler.md)."""

    max_concurrent_decodes: int = 64  # decode slots per sampler replica
    max_prefill_length: int = 2048
    max_target_length: int = 14336  # KV-cache length: prompt + generation
    max_new_tokens: int = 14336  # hard cap on generated tokens (truncation)
    truncate_long_prompts: bool = False  # else a prompt over max_prefill_length is an error
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0: off
    interruptions: bool = True
    think_min: int = 10000
    think_max: int = 12000
    answer_budget: int = 2048
    think_close: str = "</think>"
    interruption_phrase: str = (
        "Okay, time is up. Let me stop thinking and formulate a final answer now. </think>"
    )
    decode_steps_per_call: int = 1  # generate() steps fused per host round trip
    # When many slots refill at once (a run's first fill, a synchronous round), the driver
    # prefills prompts of one length bucket together, in passes of at most this many padded
    # prompt tokens (bounds the pass's activation memory); 0: one prompt per pass.
    prefill_batch_tokens: int = 8192
    # Sampler weights: "compute" stores each weight in the dtype the forward casts it to
    # (compute dtype; fp32 for norms, the router and an fp32 LM head): the same log-probs
    # bit for bit as "param" (the trainer's param_dtype), in half the HBM with fp32 masters.
    weight_dtype: str = "compute"
    # Weight sync moves the params in groups of at most this many MiB (in the sampler's dtype;
    # a larger single array is its own group): a trainer chip's extra memory is one group.
    weight_sync_group_mib: int = 1024

    def __post_init__(self):
        c = "SamplerConfig"
        _positive(
            c,
            max_concurrent_decodes=self.max_concurrent_decodes,
            max_prefill_length=self.max_prefill_length,
            max_target_length=self.max_target_length,
            max_new_tokens=self.max_new_tokens,
            decode_steps_per_call=self.decode_steps_per_call,
            weight_sync_group_mib=self.weight_sync_group_mib,
        )
        _choice(c, "weight_dtype", self.weight_dtype, ("compute", "param"))
        _check(
            self.prefill_batch_tokens >= 0,
            c,
            "prefill_batch_tokens",
            self.prefill_batch_tokens,
            "must be >= 0 (0: one prompt per prefill pass)",
        )
        _check(
            self.max_prefill_length < self.max_target_length,
            c,
            "max_prefill_length",
            self.max_prefill_length,
            f"must be < max_target_length={self.max_target_length}",
        )
        _check(
            self.temperature >= 0, c, "temperature", self.temperature, "must be >= 0 (0: greedy)"
        )
        _check(0 < self.top_p <= 1, c, "top_p", self.top_p, "must be in (0, 1]")
        _check(self.top_k >= 0, c, "top_k", self.top_k, "must be >= 0 (0: off)")
        if self.interruptions:
            _check(
                0 < self.think_min <= self.think_max,
                c,
                "think_min",
                self.think_min,
                f"must be in (0, think_max={self.think_max}]",
            )
            _check(self.answer_budget >= 0, c, "answer_budget", self.answer_budget, "must be >= 0")
            _check(
                bool(self.interruption_phrase),
                c,
                "interruption_phrase",
                self.interruption_phrase,
                "must be non-empty when interruptions are on",
            )


@dataclasses.dataclass(frozen=True)
class PipelineConfig:
    """Off-policy mode and batch shape. Paper: PipelineRL-8, 48 prompts x 16 generations."""

    mode: str = "pipeline"  # pipeline | ppo_off_policy | sync
    max_lag: int = 8  # k: trainer waits when this many versions ahead of its oldest data
    prompts_per_step: int = 48
    generations_per_prompt: int = 16
    seq_bucket: int = 128  # train batches pad T to a multiple of this, so the step compiles once
    no_positive_resampling: bool = True
    retire_pass_rate: float = 0.9

    def __post_init__(self):
        c = "PipelineConfig"
        _choice(c, "mode", self.mode, ("pipeline", "ppo_off_policy", "sync"))
        _positive(
            c,
            max_lag=self.max_lag,
            prompts_per_step=self.prompts_per_step,
            seq_bucket=self.seq_bucket,
        )
        _check(
            self.generations_per_prompt >= 2,
            c,
            "generations_per_prompt",
            self.generations_per_prompt,
            "must be >= 2 (group-relative advantages)",
        )
        _check(
            0 < self.retire_pass_rate <= 1,
            c,
            "retire_pass_rate",
            self.retire_pass_rate,
            "must be in (0, 1]",
        )
