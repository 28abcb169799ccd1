"""Rewards: answer verifiers (math, code, synthetic testbed tasks), which verifier scores what
(verifiers.py), and the host scoring pool with its child processes.

    from scalerl_jax.rewards import RewardPool, verify_math, domain_verifiers

The names below load their module on first use (PEP 562): the pool's child processes import
this package on their way to pool_child.py, and must not pay for SymPy, math-verify or the
config there.
"""

import importlib

_EXPORTS = {
    "math": (
        "extract_answer",
        "is_equivalent",
        "normalize_answer",
        "parse_math",
        "strip_thinking",
        "to_reward",
        "verify_math",
    ),
    "code": (
        "CodeResult",
        "SandboxLimits",
        "TestOutcome",
        "check_tests",
        "extract_code",
        "run_tests",
        "verify_code",
    ),
    "pool": ("RewardPool", "ScoreResult", "Verifier"),
    "exact_match": ("extract_final", "verify_exact"),
    "verifiers": (
        "ANSWER_CHECKS",
        "NAMED_VERIFIERS",
        "answer_checks",
        "default_verifier",
        "domain_verifiers",
        "use_processes",
        "verifier_by_name",
        "verifier_for_source",
        "verifier_names",
    ),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}


def __getattr__(name: str):
    if name not in _MODULE_OF:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_MODULE_OF[name]}"), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_MODULE_OF))


__all__ = sorted(_MODULE_OF)
