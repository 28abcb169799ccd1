"""Verifiers for tests: any policy, even an untrained one, gets mixed rewards from them.

Imported by `RewardConfig.verifier="_verifiers:NAME"` (tests/ is on sys.path under pytest;
subprocess runs put it on PYTHONPATH).
"""

import time


def even_length(completion: str, reference: str) -> bool:
    """Deterministic and about 50/50 on random text: groups are rarely zero-variance."""
    return len(completion) % 2 == 0


def flaky(completion: str, reference: str) -> bool:
    """Raises on some completions and hangs on others, like a buggy or adversarial checker."""
    if len(completion) % 4 == 1:
        raise ValueError("verifier bug")
    if len(completion) % 4 == 3:
        time.sleep(30)
    return len(completion) % 2 == 0
