"""Orbax checkpoints of the trainer: state arrays plus JSON items, async, verified, resumable.

A step holds `state` (the TrainState as a dict keyed by pytree path) and `meta` (one JSON
object: curriculum, data cursor, policy version, compute meter). Saves are asynchronous; a
background thread writes a CRC32 manifest per step, and `restore` falls back past a step whose
files disagree with it, fail to read or hold NaN/inf. SIGTERM and a first Ctrl-C only set a
flag that the loop's next `maybe_save` honours. Retention, verification, signals and
multi-process rules: docs/training.md, "Checkpoints".
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import threading
import time
from typing import Callable, Optional, Union

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from scalerl_jax.errors import UserError
from scalerl_jax.rundir import manifest_files, verify_manifest, write_manifest

log = logging.getLogger(__name__)

Meta = Union[dict, Callable[[], dict]]
REJECTED = "rejected"
_SIGNALS = {"SIGTERM": 1, "SIGINT": 2}  # codes all-gathered across processes


class CheckpointError(UserError, RuntimeError):
    """No usable checkpoint; the message names every step tried and why it was refused."""


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
    return jax.tree_util.tree_unflatten(treedef, leaves)


def _shapes(nested, prefix: str = "") -> dict[str, tuple]:
    """'a/b/c' -> shape for the leaves of a nested dict (arrays or Orbax ArrayMetadata)."""
    if not isinstance(nested, dict):
        return {prefix: tuple(getattr(nested, "shape", ()))}
    out: dict[str, tuple] = {}
    for k, v in nested.items():
        out.update(_shapes(v, f"{prefix}/{k}" if prefix else str(k)))
    return out


def layout_mismatch(stored: dict, target: dict) -> Optional[str]:
    """Why a checkpoint's arrays (`stored`, Orbax's tree metadata) cannot restore into
    `target` (to_nested of the abstract state), or None: names missing, unused, or of
    another shape."""
    have, want = _shapes(stored), _shapes(target)
    missing = [k for k in want if k not in have]
    unused = [k for k in have if k not in want]
    differ = [f"{k} {have[k]} vs {want[k]}" for k in want if k in have and have[k] != want[k]]
    if not (missing or unused or differ):
        return None
    parts = [
        f"{len(x)} {what} (e.g. {', '.join(x[:3])})"
        for x, what in (
            (missing, "arrays missing"),
            (unused, "arrays this model does not have"),
            (differ, "shapes differ, stored vs model"),
        )
        if x
    ]
    why = "its arrays do not match this model's state: " + "; ".join(parts)
    if any("/layers/" in k for k in missing + unused + differ):
        why += (
            ". The decoder's layers are stacked along a leading layer axis (params/layers/<j>/"
            "... holds every P-th layer, P = transformer.layer_period); a checkpoint with one "
            "entry per layer was written before that: export it to HF safetensors with the "
            "version that wrote it and start from that (--hf-checkpoint)"
        )
    return why


def _describe_error(step_dir: str, err: BaseException) -> str:
    """An Orbax/TensorStore read error as 'FILE: what', finding the file when the error does
    not say it (json.JSONDecodeError carries no file name)."""
    chain: list[str] = []
    e: Optional[BaseException] = err
    while e is not None and len(chain) < 5:
        chain.append(f"{type(e).__name__}: {e}")
        e = e.__cause__ or e.__context__
    text = " <- ".join(chain)
    first_line = text.splitlines()[0] if text else ""
    what = first_line[:400] + (" ..." if len(first_line) > 400 else "")
    for name in reversed(re.findall(r'file "([^"]+)"', text)):
        if os.path.isfile(name):
            return f"{os.path.relpath(name, step_dir)}: {what}"
    for rel in manifest_files(step_dir):
        parts = rel.split(os.sep)
        if "d" in parts[:-1] or rel.endswith(".ocdbt") or parts[-1] == "commit_success.txt":
            continue  # binary TensorStore data, not JSON
        try:
            with open(os.path.join(step_dir, rel), "rb") as f:
                json.loads(f.read())
        except ValueError as bad:
            return f"{rel}: not valid JSON ({bad}); Orbax said {what}"
        except OSError:
            continue
    named = re.findall(r'"([^"]+)"', first_line)
    return f"{step_dir} ({', '.join(named[:2]) or 'no file named'}): {what}"


@jax.jit
def _nonfinite_counts(leaves):
    return [jnp.sum(~jnp.isfinite(x)) for x in leaves]


def _check_finite(state) -> Optional[str]:
    """Which floating-point arrays of `state` hold NaN/inf, or None. A global jitted reduction,
    so every process of a multi-process job reaches the same verdict."""
    named = [
        ("/".join(_key_name(k) for k in path), x)
        for path, x in jax.tree_util.tree_flatten_with_path(state)[0]
        if jax.dtypes.issubdtype(getattr(x, "dtype", np.int32), jnp.inexact)
    ]
    if not named:
        return None
    counts = jax.device_get(_nonfinite_counts([x for _, x in named]))
    bad = [
        f"{name}: {int(n)} of {x.size} values non-finite"
        for (name, x), n in zip(named, counts)
        if n
    ]
    if not bad:
        return None
    more = f" and {len(bad) - 3} more arrays" if len(bad) > 3 else ""
    return "non-finite values in " + "; ".join(bad[:3]) + more


class Checkpointer:
    """Orbax CheckpointManager for the train state and its JSON companions."""

    def __init__(
        self,
        directory: str,
        *,
        save_every: int,
        keep: int,
        keep_every: Optional[int] = None,
        async_save: bool = True,
    ):
        if save_every <= 0 or keep <= 0 or (keep_every is not None and keep_every <= 0):
            raise ValueError(
                f"Checkpointer: save_every={save_every}, keep={keep}, keep_every="
                f"{keep_every} must be > 0"
            )
        self.directory = os.path.abspath(directory)
        self.save_every = save_every
        options = ocp.CheckpointManagerOptions(
            max_to_keep=keep,
            keep_period=keep_every,
            create=True,
            enable_async_checkpointing=async_save,
        )
        self._manager = ocp.CheckpointManager(
            self.directory, options=options, item_names=("state", "meta")
        )
        self._primary = jax.process_index() == 0
        self._stop_signal: Optional[str] = None
        self._preemption_saved = False
        self._previous_handlers: dict = {}
        self._hasher: Optional[threading.Thread] = None
        self.restored_step: Optional[int] = None
        self.rejected: dict[int, str] = {}  # step -> why, from the last restore

    def _step_dir(self, step: int) -> str:
        return os.path.join(self.directory, str(step))

    # -- saving --------------------------------------------------------------------------------
    def save(self, step: int, state, meta: Meta) -> bool:
        """Start an async save of `state` and `meta` at `step`; False if that step exists."""
        step = int(step)
        if step in self._manager.all_steps():
            return False
        meta = meta() if callable(meta) else meta
        args = ocp.args.Composite(
            state=ocp.args.StandardSave(to_nested(state)), meta=ocp.args.JsonSave(meta)
        )
        # The previous step's hash must end before Orbax may delete that step (retention runs
        # when this save commits); it has normally ended long ago.
        self._join_hasher()
        self._manager.save(step, args=args, force=True)
        log.info("saving step %d to %s", step, self.directory)
        if self._primary:
            self._hasher = threading.Thread(
                target=self._hash_when_committed,
                args=(step,),
                name=f"checkpoint-hash-{step}",
                daemon=True,
            )
            self._hasher.start()
        return True

    def _hash_when_committed(self, step: int) -> None:
        # Orbax renames the temporary directory to STEP as the last act of a commit, so its
        # appearance means the files are final; if the save ended without it, it failed.
        step_dir, delay = self._step_dir(step), 0.01
        while not os.path.isdir(step_dir):
            if not self._manager.is_saving_in_progress() and not os.path.isdir(step_dir):
                log.warning(
                    "checkpoint step %d: %s absent after its save ended; no manifest",
                    step,
                    step_dir,
                )
                return
            time.sleep(delay)
            delay = min(2 * delay, 0.25)
        t0 = time.monotonic()
        try:
            files = write_manifest(step_dir)["files"]
        except OSError as err:
            log.warning("checkpoint step %d: no manifest written (%s)", step, err)
            return
        log.info(
            "checkpoint step %d: manifest of %d files, %.1f MB hashed in %.2f s",
            step,
            len(files),
            sum(f["size"] for f in files.values()) / 1e6,
            time.monotonic() - t0,
        )

    def _join_hasher(self) -> None:
        if self._hasher is not None:
            self._hasher.join()
            self._hasher = None

    def maybe_save(self, step: int, state, meta: Meta) -> bool:
        """Save every `save_every` steps; once a stop signal was received, save this step, wait
        for it and set `preemption_saved` (the loop's cue to stop). True when a save started."""
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
        """True once `maybe_save` has written the state after a stop signal: stop the loop now.

        The loop checks this rather than `preempted`, so a signal landing between the two calls
        cannot end the run with the last step unsaved."""
        return self._preemption_saved

    def wait(self) -> None:
        """Block until every started save is on disk and has its manifest (acknowledged)."""
        self._manager.wait_until_finished()
        self._join_hasher()

    def close(self) -> None:
        self.wait()
        self._manager.close()
        self.uninstall_signal_handlers()

    # -- restoring -----------------------------------------------------------------------------
    def latest_step(self) -> Optional[int]:
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        return sorted(self._manager.all_steps())

    def restore(self, abstract_state, step: Optional[int] = None):
        """(state, meta) of the latest usable step, or None when there is no checkpoint; the
        step restored is `restored_step`, the steps refused and why are `rejected`.

        abstract_state: ShapeDtypeStructs with `.sharding` (train.state.abstract_train_state):
        every array is read directly into its target sharding. With `step` given, only that
        step is tried (CheckpointError if it is unusable) and nothing is moved.
        """
        self.wait()
        steps = self.all_steps()
        self.restored_step, self.rejected = None, {}
        if step is not None and int(step) not in steps:
            raise CheckpointError(
                f"no checkpoint at step {step} in {self.directory} (steps there: {steps})"
            )
        candidates = [int(step)] if step is not None else steps[::-1]
        for s in candidates:
            restored, why = self._try_restore(s, abstract_state)
            if why is None:
                self.restored_step = s
                if self.rejected:
                    self._set_aside(sorted(self.rejected))
                return restored
            self.rejected[s] = why
            log.warning(
                "checkpoint step %d in %s is unusable: %s%s",
                s,
                self.directory,
                why,
                "; trying the previous step" if s != candidates[-1] else "",
            )
        if not candidates:
            return None
        tried = "; ".join(f"step {s}: {why}" for s, why in self.rejected.items())
        raise CheckpointError(
            f"no usable checkpoint in {self.directory}; tried {tried}. Nothing was moved. To "
            f"restart the run from step 0, move {self.directory} aside; or choose another "
            "--workdir"
        )

    def _try_restore(self, step: int, abstract_state):
        step_dir, why = self._step_dir(step), None
        if self._primary:
            try:
                why = verify_manifest(step_dir)
            except OSError as err:
                why = f"{err.filename}: {err.strerror}"
        why = self._agree(why)
        if why is not None:
            return None, why
        target = to_nested(abstract_state)
        try:
            stored = self._manager.item_metadata(step)["state"]
        except Exception:  # noqa: BLE001 - unreadable metadata: the restore below reports it
            stored = None
        mismatch = layout_mismatch(getattr(stored, "tree", stored), target) if stored else None
        if mismatch:  # a step of another model or layout, not a damaged one: refuse, move none
            raise CheckpointError(
                f"checkpoint step {step} in {step_dir}: {mismatch}. Nothing was moved."
            )
        args = ocp.args.Composite(
            state=ocp.args.StandardRestore(target), meta=ocp.args.JsonRestore()
        )
        try:
            restored = self._manager.restore(step, args=args)
            state = from_nested(restored["state"], abstract_state)
        except Exception as err:  # noqa: BLE001 - any failure to read makes the step unusable
            why = _describe_error(step_dir, err)
        else:
            why = _check_finite(state)
        why = self._agree(why)
        return (None, why) if why is not None else ((state, restored["meta"]), None)

    def _agree(self, why: Optional[str]) -> Optional[str]:
        """A step refused by any process is refused by all (they must restore the same step)."""
        if jax.process_count() == 1:
            return why
        from jax.experimental import multihost_utils

        flags = multihost_utils.process_allgather(np.array(why is not None))
        if why is None and np.any(flags):
            why = f"refused by process(es) {np.flatnonzero(flags).tolist()} (see their logs)"
        return why

    def _set_aside(self, steps: list[int]) -> None:
        # A refused step newer than the restored one would block saving that step again
        # (Orbax keeps existing steps) and be retried at every resume; keep it for a post-mortem.
        if self._primary:
            rejected = os.path.join(self.directory, REJECTED)
            os.makedirs(rejected, exist_ok=True)
            for step in steps:
                dest = os.path.join(rejected, str(step))
                if os.path.exists(dest):
                    dest += f"-{int(time.time())}"
                os.rename(self._step_dir(step), dest)
                log.warning("moved unusable step %d to %s", step, dest)
        if jax.process_count() > 1:
            from jax.experimental import multihost_utils

            multihost_utils.sync_global_devices("scalerl_jax.checkpoint.set_aside")
        self._manager.reload()

    # -- stop signals --------------------------------------------------------------------------
    def install_signal_handlers(self) -> None:
        """Route SIGTERM and SIGINT to the stop flag that `maybe_save` acts on (main thread
        only); a SIGINT after a stop was requested raises KeyboardInterrupt."""

        def handler(signum, frame):
            name = signal.Signals(signum).name
            if self._stop_signal is not None:
                if signum == signal.SIGINT:
                    raise KeyboardInterrupt(f"second stop signal ({name}): not saving")
                log.warning("%s received; already stopping after %s", name, self._stop_signal)
                return
            self._stop_signal = name
            log.warning(
                "%s received: stopping when the current step or evaluation ends, with "
                "a checkpoint if a step was trained since the last one (a second signal "
                "exits at once, unsaved)",
                name,
            )

        for sig in (signal.SIGTERM, signal.SIGINT):
            self._previous_handlers.setdefault(sig, signal.signal(sig, handler))

    install_sigterm_handler = install_signal_handlers  # the name older callers use

    def uninstall_signal_handlers(self) -> None:
        for sig, previous in self._previous_handlers.items():
            signal.signal(sig, previous)
        self._previous_handlers = {}

    @property
    def stop_signal(self) -> Optional[str]:
        """'SIGTERM' or 'SIGINT' once one asked this run to stop (in a multi-process job: any
        process, as of the last `preempted` check), else None. Exit with 128 + its number."""
        return self._stop_signal

    @property
    def preempted(self) -> bool:
        """A stop signal seen by this process (or by any process of a multi-process job)."""
        if jax.process_count() == 1:
            return self._stop_signal is not None
        from jax.experimental import multihost_utils

        code = _SIGNALS.get(self._stop_signal or "", 0)
        codes = multihost_utils.process_allgather(np.array(code))
        top = int(np.max(codes))
        if top and self._stop_signal is None:
            self._stop_signal = {v: k for k, v in _SIGNALS.items()}[top]
        return bool(top)


def export_hf(params, cfg, out_dir: str, **kwargs) -> list[str]:
    """Write the policy as an HF checkpoint (config.json + safetensors) through
    `models.hf.export` (kwargs: max_shard_bytes, dtype, extra_config); returns the files.
    Collective in multi-process runs: every process calls it, process 0 writes."""
    from scalerl_jax.models import hf  # lazy: pulls safetensors

    return hf.export(params, cfg, out_dir, **kwargs)
