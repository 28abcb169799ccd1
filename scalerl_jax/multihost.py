"""Host-level exchange of Python data between the processes of a multi-controller JAX job.

Each host samples and scores its own share of a step's prompts, and every host must then build
the same global batch (each process places only its addressable shards of it), so the hosts'
groups are exchanged through `allgather_objects`. JAX's collectives move arrays, not objects:
the objects are pickled (our own processes' data: token ids, log-probs, rewards; never model
text to be evaluated), sizes are all-gathered first, then the byte strings padded to the
largest. With one process everything is a no-op.
"""

from __future__ import annotations

import pickle
from typing import Any

import jax
import numpy as np


def allgather_objects(obj: Any) -> list:
    """[object of process 0, object of process 1, ...] on every process."""
    if jax.process_count() == 1:
        return [obj]
    from jax.experimental import multihost_utils

    data = np.frombuffer(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), np.uint8)
    sizes = np.asarray(multihost_utils.process_allgather(np.array([data.size], np.int64)))
    sizes = sizes.reshape(-1)
    padded = np.zeros(int(sizes.max()), np.uint8)
    padded[: data.size] = data
    gathered = np.asarray(multihost_utils.process_allgather(padded)).reshape(len(sizes), -1)
    return [pickle.loads(gathered[i, : int(n)].tobytes()) for i, n in enumerate(sizes)]


def barrier(name: str) -> None:
    """All processes reach this point before any goes on (a no-op with one process)."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)
