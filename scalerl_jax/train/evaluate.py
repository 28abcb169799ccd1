"""Scoring by domain, and held-out validation: mean@k pass rate, the y-axis of the scaling curve
(overall and, for a mixture of domains, per domain).

`sample_groups` is the sampling loop shared with the stand-alone evaluation (scalerl_jax/
evaluation.py): it runs a driver in the caller's thread, reports its count of completions to the
heartbeat (heartbeat.py) and checks a stop callback between sampler calls, so a stop signal ends
an evaluation within a call instead of after it.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Mapping, Optional, Sequence, Union

import numpy as np

from scalerl_jax.data.prompts import Prompt
from scalerl_jax.heartbeat import phase
from scalerl_jax.multihost import allgather_objects
from scalerl_jax.rewards.pool import RewardPool, ScoreResult, Verifier
from scalerl_jax.sampler.driver import Driver, Prompt as SamplerPrompt
from scalerl_jax.sampler.types import Group


def group_domain(group: Group) -> str:
    """The data domain a group's prompt came from ("" for a single-source run)."""
    return group.metadata.get("domain", "")


def score_groups(
    groups: Sequence[Group],
    *,
    tokenizer: Any,
    verifier: Union[Verifier, Mapping[str, Verifier]],
    pool: RewardPool,
) -> ScoreResult:
    """Verify every completion of `groups` against its group's reference answer, in order.

    `verifier` is one verifier, or {domain: verifier} (rewards.domain_verifiers): each group
    is then checked by its domain's, with one `pool.score` call per domain present."""
    verifiers = verifier if isinstance(verifier, Mapping) else None
    if verifiers is None or len(verifiers) == 1 and not any(map(group_domain, groups)):
        one = next(iter(verifier.values())) if isinstance(verifier, Mapping) else verifier
        items = [
            (tokenizer.decode(c.tokens, skip_special_tokens=True), g.metadata["answer"])
            for g in groups
            for c in g.completions
        ]
        return pool.score(one, items)
    by_domain: dict[str, list[int]] = {}  # domain -> indices of its completions in the batch
    items, n = [], 0
    for g in groups:
        domain = group_domain(g)
        if domain not in verifiers:
            raise KeyError(
                f"group {g.prompt_id!r} is of domain {domain!r}, which has no "
                f"verifier (domains: {sorted(verifiers)})"
            )
        for c in g.completions:
            items.append(
                (tokenizer.decode(c.tokens, skip_special_tokens=True), g.metadata["answer"])
            )
            by_domain.setdefault(domain, []).append(n)
            n += 1
    rewards, correct = np.zeros(n, np.float32), np.zeros(n, bool)
    timeouts = errors = 0
    seconds, example = 0.0, None
    for domain, where in by_domain.items():
        part = pool.score(verifiers[domain], [items[i] for i in where])
        rewards[where], correct[where] = part.rewards, part.correct
        timeouts, errors = timeouts + part.num_timeouts, errors + part.num_errors
        seconds += part.seconds
        example = example or (part.error_example and f"[{domain}] {part.error_example}")
    return ScoreResult(rewards, correct, timeouts, errors, seconds, example)


def rate_and_se(per_prompt: np.ndarray) -> tuple[float, Any]:
    """Mean of per-prompt pass rates and its standard error (None below two prompts).
    Prompts are the independent units (a prompt's k samples share its difficulty), so the
    standard error comes from the spread of the per-prompt pass rates."""
    rate = float(per_prompt.mean()) if per_prompt.size else 0.0
    se = float(per_prompt.std(ddof=1) / np.sqrt(per_prompt.size)) if per_prompt.size > 1 else None
    return rate, se


def sample_groups(
    engine,
    params,
    prompts: Sequence[SamplerPrompt],
    *,
    k: int,
    driver_kwargs: dict,
    version: int,
    seed: int = 0,
    label: str = "sampling",
    should_stop: Optional[Callable[[], bool]] = None,
) -> tuple[list[Group], dict, bool]:
    """k samples of each prompt with `params`, on a driver in the caller's thread: (the groups in
    the order they finished, the driver's stats, whether `should_stop()` cut it short).

    Runs a second driver on `engine` (a training sampler may keep running on it): it shares the
    engine's compiled programs. Sample j of prompt i is seeded by (seed, ticket i, j).
    `should_stop` is asked after every sampler call; `label` names the phase in heartbeat lines.
    """
    groups: list[Group] = []
    driver = Driver(
        engine,
        params,
        prompts,
        group_size=k,
        version=version,
        seed=seed,
        on_group=groups.append,
        **driver_kwargs,
    )
    stopped = False
    with phase(label, total=len(prompts) * k, unit="completions") as shown:
        while driver.step():
            shown.update(int(driver.stats["completions"]))
            if should_stop is not None and should_stop():
                stopped = True
                break
    return groups, driver.stats, stopped


def evaluate(
    engine,
    params,
    prompts: Sequence[Prompt],
    *,
    tokenizer: Any,
    k: int,
    verifier: Union[Verifier, Mapping[str, Verifier]],
    pool: RewardPool,
    driver_kwargs: dict,
    version: int,
    seed: int = 0,
    should_stop: Optional[Callable[[], bool]] = None,
) -> Optional[dict]:
    """Generate k samples per held-out prompt with `params` and score them; None when
    `should_stop()` (asked between sampler calls) ended the evaluation early on any process.

    Runs a second driver on the same engine in the caller's thread (the training sampler keeps
    running); it shares the engine's compiled programs, so evaluation compiles nothing new.
    Sample j of prompt i is seeded by (seed, i, j): every evaluation of a run draws the same
    random numbers, so the differences between its points come from the policy, not the dice.

    Prompts of a mixture (`Prompt.domain` set) also give `per_domain` {domain: pass rate},
    `per_domain_se` {domain: standard error} and `per_domain_prompts` {domain: prompts}.

    Multi-process: each process passes its own share of the prompts (e.g.
    `PromptSource.validation(shard=True)`); the counts are summed over processes, so every
    process returns the same figures for the whole validation set. A process that was stopped
    still meets the others in the all-gather, and all of them return None.
    """
    start = time.monotonic()
    stream = [
        SamplerPrompt(
            p.prompt_id, tokenizer.encode(p.text), {"answer": p.answer, "domain": p.domain}, i
        )
        for i, p in enumerate(prompts)
    ]
    groups, sampled, stopped = sample_groups(
        engine,
        params,
        stream,
        k=k,
        driver_kwargs=driver_kwargs,
        version=version,
        seed=seed,
        label="sampling",
        should_stop=should_stop,
    )
    local = None
    if not stopped:
        with phase(f"scoring {len(groups) * k} completions"):
            scored = score_groups(groups, tokenizer=tokenizer, verifier=verifier, pool=pool)
        per_prompt = np.asarray(scored.correct, np.float64).reshape(len(groups), k).mean(axis=1)
        local = (
            per_prompt,
            [group_domain(g) for g in groups],
            int(sampled["tokens"]),
            int(sampled["finish_truncated"]),
            int(sampled["interrupted"]),
        )
    shared = allgather_objects(local)
    if any(part is None for part in shared):
        return None
    return _figures(shared, k, seconds=time.monotonic() - start)


def _figures(shared: list, k: int, *, seconds: float) -> dict:
    """The evaluation record's fields from every process's (per-prompt pass rates, domains,
    tokens, truncated, interrupted)."""
    per_prompt = np.concatenate([part[0] for part in shared])
    domains = np.array([d for part in shared for d in part[1]], dtype=object)
    tokens, truncated, interrupted = (sum(part[i] for part in shared) for i in (2, 3, 4))
    samples = max(per_prompt.size * k, 1)
    rate, se = rate_and_se(per_prompt)
    out = {
        "pass_rate": rate,
        "pass_rate_se": se,
        "k": k,
        "num_prompts": int(per_prompt.size),
        "eval_seconds": seconds,
        "eval_tokens": tokens,
        "eval_truncation_rate": truncated / samples,
        "eval_interruption_rate": interrupted / samples,
    }
    names = sorted({d for d in domains if d})
    if names:  # a mixture: one curve per domain as well
        stats = {d: rate_and_se(per_prompt[domains == d]) for d in names}
        out["per_domain"] = {d: stats[d][0] for d in names}
        out["per_domain_se"] = {d: stats[d][1] for d in names}
        out["per_domain_prompts"] = {d: int((domains == d).sum()) for d in names}
    return out
