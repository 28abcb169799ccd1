"""Which verifier scores what: the named verifiers ("math", "code", "exact") and
"package.module:function" ones, each data domain's verifier, the checks of reference answers
at load time, and whether the reward pool runs verifiers in child processes."""

import functools
import importlib
import logging
from typing import Callable, Optional, cast

# NAMED_VERIFIERS holds import paths: a verifier is imported only when used (keeps math-only
# runs from importing the code verifier, and the reverse).
from scalerl_jax.config import NAMED_VERIFIERS, ConfigError, DataConfig
from scalerl_jax.rewards.pool import Verifier

log = logging.getLogger(__name__)

# What validates a verifier's reference answers at load time (a malformed row is skipped and
# counted like any bad row instead of scoring every completion of its prompt as wrong).
ANSWER_CHECKS = {
    "code": "scalerl_jax.rewards.code:check_tests",
    "math": "scalerl_jax.rewards.math:check_reference",
}
# The verifier of each synthetic task's reference answers (data/synthetic_tasks.py); the others:
# "exact". Here rather than beside the tasks so that data imports rewards and never the reverse.
TASK_VERIFIERS = {"pycode": "code"}


def _import(path: str, field: str):
    module_name, _, name = path.partition(":")
    try:
        fn = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError) as e:
        raise ConfigError(f"{field}={path!r}: cannot import it ({e})") from None
    if not callable(fn):
        raise ConfigError(f"{field}={path!r} is not callable")
    return fn


def default_verifier(source: str) -> str:
    """The verifier name for a source: a synthetic task's own (`pycode`: code, the others:
    exact), else math."""
    if source.startswith("synthetic:"):
        tasks = {part.partition("?")[0] for part in source[len("synthetic:") :].split("|")}
        return next((TASK_VERIFIERS[t] for t in sorted(tasks) if t in TASK_VERIFIERS), "exact")
    return "math"


def verifier_by_name(name: str, field: str = "RewardConfig.verifier") -> Verifier:
    """ "math" / "code" / "exact", or a "package.module:function" taking (completion text,
    reference answer) and returning a bool. `field` names the setting in errors."""
    if name in NAMED_VERIFIERS:
        return _import(NAMED_VERIFIERS[name], field)
    if ":" not in name:
        raise ConfigError(
            f"{field}={name!r}: unknown verifier; use one of "
            f"{tuple(NAMED_VERIFIERS)} or 'package.module:function'"
        )
    return _import(name, field)


def verifier_for_source(source: str, custom: Optional[str] = None) -> Verifier:
    """The verifier for a DataConfig.source (`default_verifier`); or `custom`, a
    "package.module:function" (RewardConfig.verifier)."""
    return verifier_by_name(default_verifier(source) if custom is None else custom)


def verifier_names(data: DataConfig, custom: Optional[str] = None) -> dict[str, str]:
    """{domain: verifier name or "package.module:function"}: {"": ...} for one source (its
    prompts' domain is ""), each domain's `verifier` (or its source's default) in a mixture,
    where RewardConfig.verifier (`custom`) must stay None."""
    if not data.is_mixture:
        return {"": custom or default_verifier(data.source)}
    if custom is not None:
        raise ConfigError(
            f"RewardConfig.verifier={custom!r} applies to a single source; a "
            "mixture picks one per domain: set data.domains.NAME.verifier"
        )
    return {d.name: d.verifier or default_verifier(d.source) for d in data.domains}


def _field(domain: str) -> str:
    return f"DomainConfig[{domain!r}].verifier" if domain else "RewardConfig.verifier"


def domain_verifiers(
    data: DataConfig, custom: Optional[str] = None, code_isolation: str = "strong"
) -> dict[str, Verifier]:
    """{domain: verifier} for `train.evaluate.score_groups` (keys as `verifier_names`). The code
    verifier runs under `code_isolation` (RewardConfig.code_isolation): it is checked here,
    before any program runs, and the mode is logged (SandboxUnavailable when "strong" cannot be
    met)."""
    verifiers = {}
    for domain, name in verifier_names(data, custom).items():
        verifiers[domain] = verifier_by_name(name, _field(domain))
        if name == "code":
            from scalerl_jax.rewards.sandbox import describe

            log.info(describe(code_isolation))
            # The named "code" verifier is rewards.code.verify_code, which takes `isolation`
            # beside the (completion, reference) of every verifier.
            code = cast(Callable[..., bool], verifiers[domain])
            verifiers[domain] = functools.partial(code, isolation=code_isolation)
    return verifiers


def answer_checks(data: DataConfig, custom: Optional[str] = None) -> dict[str, Callable]:
    """{domain: check(reference) raising ValueError} for the domains whose verifier validates
    its references (code: `rewards.code.check_tests`); same domain keys as `domain_verifiers`."""
    return {
        domain: _import(ANSWER_CHECKS[name], f"{name} verifier's answer check")
        for domain, name in verifier_names(data, custom).items()
        if name in ANSWER_CHECKS
    }


def use_processes(reward_cfg, data: DataConfig) -> bool:
    """Whether the reward pool runs verifiers in child processes (RewardConfig.processes; None
    decides here). Only a wall-clock limit enforced by killing a process bounds a SymPy /
    math-verify call, so every verifier runs in processes except the exact-match one of
    `synthetic:` tasks: a string compare of bounded input, where a process per worker would only
    add start-up time. Every domain's verifier counts, overrides included."""
    if reward_cfg.processes is not None:
        return reward_cfg.processes
    exact = NAMED_VERIFIERS["exact"]
    return not all(
        NAMED_VERIFIERS.get(name, name) == exact
        for name in verifier_names(data, reward_cfg.verifier).values()
    )
