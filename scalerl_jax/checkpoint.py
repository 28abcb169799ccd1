"""Orbax checkpoints of the trainer: state arrays plus JSON items, async, retained, resumable.

A checkpoint at step S holds two items:
* `state`: the TrainState (params, optimizer state, step, rng, skipped count) as a nested dict
  of arrays keyed by their pytree path (e.g. params/layers/0/attn/q/value), so the files do not
  depend on Python class names;
* `meta`: one JSON object for the host-side rest: curriculum state, data cursor, policy
  version, anything the trainer adds.

Saves are asynchronous (the call returns once the arrays are copied off the devices), every
`save_every` steps, on SIGTERM and at the end. Retention: the last `keep` checkpoints plus,
permanently, every step that is a multiple of `keep_every`. Restore reads straight into the
target shardings of an abstract state (ShapeDtypeStructs with `.sharding`), so a run can resume
on a different mesh shape. Resume = re-running the same command with the same workdir: the
trainer calls `restore` and gets None on a fresh directory.

SIGTERM (preemption, `kill`, TPU maintenance) only sets a flag: JAX work cannot safely run
inside a signal handler and the latest state may be mid-donation there. The loop calls
`maybe_save` after every step; once the flag is set that call saves the current state, waits
for the write to finish, and `preemption_saved` tells the loop to stop. With several processes the
flag is OR-ed across them so that all save the same step.
"""
from __future__ import annotations

import logging
import os
import signal
from typing import Callable, Optional, Union

import jax
import numpy as np
import orbax.checkpoint as ocp

log = logging.getLogger(__name__)

Meta = Union[dict, Callable[[], dict]]


def _key_name(key) -> str:
    for attr in ("key", "name", "idx"):
        if hasattr(key, attr):
            return str(getattr(key, attr))
    return str(key)


def to_nested(tree) -> dict:
    """A pytree's leaves as a nested dict of string path entries (the on-disk layout)."""
    out: dict = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        names = [_key_name(k) for k in path]
        if not names:
            raise ValueError("to_nested: a bare leaf has no path; wrap it in a container")
        node = out
        for name in names[:-1]:
            node = node.setdefault(name, {})
        if names[-1] in node:
            raise ValueError(f"to_nested: two leaves map to {'/'.join(names)}")
        node[names[-1]] = leaf
    return out


def from_nested(nested: dict, like):
    """Inverse of `to_nested`: rebuild a pytree shaped like `like` from a nested dict."""
    paths, treedef = jax.tree_util.tree_flatten_with_path(like)
    leaves = []
    for path, _ in paths:
        node = nested
        for name in (_key_name(k) for k in path):
            if not isinstance(node, dict) or name not in node:
                raise KeyError(f"checkpoint has no entry {jax.tree_util.keystr(path)}")
            node = node[name]
        leaves.append(node)
    return treedef.unflatten(leaves)


class Checkpointer:
    """Orbax CheckpointManager for the train state and its JSON companions."""

    def __init__(self, directory: str, *, save_every: int, keep: int,
                 keep_every: Optional[int] = None, async_save: bool = True):
        if save_every <= 0 or keep <= 0 or (keep_every is not None and keep_every <= 0):
            raise ValueError(f"Checkpointer: save_every={save_every}, keep={keep}, keep_every="
                             f"{keep_every} must be > 0")
        self.directory = os.path.abspath(directory)
        self.save_every = save_every
        options = ocp.CheckpointManagerOptions(
            max_to_keep=keep, keep_period=keep_every, create=True,
            enable_async_checkpointing=async_save)
        self._manager = ocp.CheckpointManager(self.directory, options=options,
                                              item_names=("state", "meta"))
        self._sigterm = False
        self._preemption_saved = False
        self._previous_handler = None

    # -- saving --------------------------------------------------------------------------------
    def save(self, step: int, state, meta: Meta) -> bool:
        """Start an async save of `state` and `meta` at `step`; False if that step exists."""
        step = int(step)
        if step in self._manager.all_steps():
            return False
        meta = meta() if callable(meta) else meta
        args = ocp.args.Composite(state=ocp.args.StandardSave(to_nested(state)),
                                  meta=ocp.args.JsonSave(meta))
        self._manager.save(step, args=args, force=True)
        log.info("checkpoint: saving step %d to %s", step, self.directory)
        return True

    def maybe_save(self, step: int, state, meta: Meta) -> bool:
        """Save every `save_every` steps; once SIGTERM was received, save this step, wait for
        it and set `preemption_saved` (the loop's cue to stop). True when a save started."""
        if self.preempted:
            saved = self.save(step, state, meta)
            self.wait()
            self._preemption_saved = True
            return saved
        if int(step) % self.save_every == 0:
            return self.save(step, state, meta)
        return False

    @property
    def preemption_saved(self) -> bool:
        """True once `maybe_save` has written the state after a SIGTERM: stop the loop now.

        The loop checks this rather than `preempted`, so a signal landing between the two calls
        cannot end the run with the last step unsaved."""
        return self._preemption_saved

    def wait(self) -> None:
        """Block until every started save is on disk (an acknowledged save)."""
        self._manager.wait_until_finished()

    def close(self) -> None:
        self.wait()
        self._manager.close()
        self.uninstall_sigterm_handler()

    # -- restoring -----------------------------------------------------------------------------
    def latest_step(self) -> Optional[int]:
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        return sorted(self._manager.all_steps())

    def restore(self, abstract_state, step: Optional[int] = None):
        """(state, meta) of `step` (default: the latest), or None when there is no checkpoint.

        abstract_state: ShapeDtypeStructs with `.sharding` (train.state.abstract_train_state):
        every array is read directly into its target sharding.
        """
        step = self.latest_step() if step is None else int(step)
        if step is None:
            return None
        args = ocp.args.Composite(state=ocp.args.StandardRestore(to_nested(abstract_state)),
                                  meta=ocp.args.JsonRestore())
        restored = self._manager.restore(step, args=args)
        return from_nested(restored["state"], abstract_state), restored["meta"]

    # -- preemption ----------------------------------------------------------------------------
    def install_sigterm_handler(self) -> None:
        """Route SIGTERM to a flag that `maybe_save` / `preempted` act on (main thread only)."""
        def handler(signum, frame):
            log.warning("SIGTERM received: saving a checkpoint after the current step")
            self._sigterm = True
        self._previous_handler = signal.signal(signal.SIGTERM, handler)

    def uninstall_sigterm_handler(self) -> None:
        if self._previous_handler is not None:
            signal.signal(signal.SIGTERM, self._previous_handler)
            self._previous_handler = None

    @property
    def preempted(self) -> bool:
        """SIGTERM seen by this process (or by any process of a multi-process job)."""
        if jax.process_count() == 1:
            return self._sigterm
        from jax.experimental import multihost_utils
        flags = multihost_utils.process_allgather(np.array(self._sigterm))
        return bool(np.any(flags))


def export_hf(params, cfg, out_dir: str, **kwargs) -> list[str]:
    """Write the policy as an HF checkpoint (config.json + safetensors) through
    `models.hf.export` (kwargs: max_shard_bytes, dtype, extra_config); returns the files.
    Collective in multi-process runs: every process calls it, process 0 writes."""
    from scalerl_jax.models import hf  # lazy: pulls safetensors

    return hf.export(params, cfg, out_dir, **kwargs)
