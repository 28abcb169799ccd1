"""Checkpoints: save -> kill -> restore is bitwise equal; retention keeps last-N plus every-M;
a corrupt or non-finite checkpoint is refused with its file named and the previous one restored;
SIGINT saves and stops like SIGTERM, a second SIGINT aborts.

The round trip runs the saving side in subprocesses (8 fake devices, fsdp=4 x tensor=2) that
take real optimizer updates and save asynchronously; one gets SIGTERM mid-run (its handler
makes the loop save, wait and exit), the other is SIGKILLed right after an acknowledged save.
Each dumps the exact state it hands to every save to an .npz, so this process can restore on
a different mesh (fsdp=2 x tensor=4) and compare every leaf bit for bit.
"""

import glob
import json
import os
import select
import signal
import subprocess
import sys
import textwrap
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from scalerl_jax import checkpoint as ckpt_lib
from scalerl_jax import mesh as mesh_lib
from scalerl_jax import rundir
from scalerl_jax.config import MeshConfig, OptimConfig
from scalerl_jax.models import presets
from scalerl_jax.train import state as state_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CFG = presets.get("tiny-qwen2", num_layers=1)
OCFG = OptimConfig(learning_rate=1e-3, warmup_steps=2)

SAVER = textwrap.dedent("""
    import json, os, sys, time
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    os.environ["JAX_PLATFORMS"] = "cpu"
    import jax, numpy as np, optax
    from scalerl_jax import checkpoint as ckpt_lib, mesh as mesh_lib
    from scalerl_jax.config import MeshConfig, OptimConfig
    from scalerl_jax.models import presets
    from scalerl_jax.rl.curriculum import NoPositiveResampling
    from scalerl_jax.train import optim, state as state_lib

    workdir, mode = sys.argv[1], sys.argv[2]
    cfg = presets.get("tiny-qwen2", num_layers=1)
    ocfg = OptimConfig(learning_rate=1e-3, warmup_steps=2)
    mesh = mesh_lib.trainer_mesh(MeshConfig(fsdp=4, tensor=2), jax.devices())
    _, _, state = state_lib.create_train_state(cfg, ocfg, mesh, seed=0)
    shardings = jax.tree.map(lambda x: x.sharding, state)
    tx = optim.make_optimizer(ocfg)

    # A real AdamW update with pseudo-random gradients: a non-trivial optimizer state at
    # little compile cost (the train step itself is tested elsewhere).
    def fake_step(s):
        rng, sub = jax.random.split(s.rng)
        leaves, treedef = jax.tree.flatten(s.params)
        keys = jax.random.split(sub, len(leaves))
        grads = treedef.unflatten([jax.random.normal(k, x.shape, x.dtype)
                                   for k, x in zip(keys, leaves)])
        updates, opt = tx.update(grads, s.opt_state, s.params)
        return s._replace(params=optax.apply_updates(s.params, updates), opt_state=opt,
                          step=s.step + 1, rng=rng, skipped=s.skipped + (s.step % 3 == 0))
    fake_step = jax.jit(fake_step, out_shardings=shardings, donate_argnums=0)

    ckpt = ckpt_lib.Checkpointer(os.path.join(workdir, "ckpt"), save_every=2, keep=10)
    ckpt.install_sigterm_handler()
    curriculum = NoPositiveResampling(0.9)
    dumps = os.path.join(workdir, "dumps")
    os.makedirs(dumps, exist_ok=True)
    step = 0
    while step < 5000:
        state = fake_step(state)
        step += 1
        curriculum.update([f"p{step}", step], [0.5, 1.0])
        meta = {"curriculum": curriculum.to_dict(), "policy_version": step,
                "data_cursor": {"epoch": step // 7, "index": 4 * step}}
        # Every step's state is dumped (the signal may make any step the saved one); odd
        # steps' dumps are dropped once the next step exists.
        flat = {jax.tree_util.keystr(p): np.asarray(x)
                for p, x in jax.tree_util.tree_flatten_with_path(state)[0]}
        np.savez(os.path.join(dumps, f"{step}.npz"), **flat)
        with open(os.path.join(dumps, f"{step}.json"), "w") as f:
            json.dump(meta, f)
        if step % 2 == 0 and step > 1:
            for ext in ("npz", "json"):
                os.remove(os.path.join(dumps, f"{step - 1}.{ext}"))
        if ckpt.maybe_save(step, state, meta):
            print("SAVED", step, flush=True)
        if mode == "ack" and step == 4:
            ckpt.wait()
            print("ACK", step, flush=True)
        if ckpt.preemption_saved:
            print("FINAL", step, flush=True)
            break
        time.sleep(0.02)
    ckpt.close()
""")


def _launch(workdir, mode):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.Popen(
        [sys.executable, "-c", SAVER, str(workdir), mode],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )


def _wait_for(proc, prefix, timeout=120.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 1.0)
        if ready:
            line = proc.stdout.readline()
            if not line:
                break
            if line.startswith(prefix):
                return int(line.split()[1])
    proc.kill()
    raise AssertionError(f"saver never printed {prefix!r} (exit code {proc.poll()})")


def _check_restored(workdir, step):
    mesh = mesh_lib.trainer_mesh(MeshConfig(fsdp=2, tensor=4), jax.devices())
    _, abstract = state_lib.abstract_train_state(CFG, OCFG, mesh)
    ckpt = ckpt_lib.Checkpointer(os.path.join(workdir, "ckpt"), save_every=2, keep=10)
    assert ckpt.latest_step() == step
    state, meta = ckpt.restore(abstract)
    ckpt.close()
    dump = np.load(os.path.join(workdir, "dumps", f"{step}.npz"))
    flat = jax.tree_util.tree_flatten_with_path(state)[0]
    assert sorted(dump.files) == sorted(jax.tree_util.keystr(p) for p, _ in flat)
    for path, x in flat:
        want = dump[jax.tree_util.keystr(path)]
        got = np.asarray(x)
        assert got.dtype == want.dtype and got.shape == want.shape, jax.tree_util.keystr(path)
        assert got.tobytes() == want.tobytes(), jax.tree_util.keystr(path)  # bit for bit
    for (path, x), (_, a) in zip(flat, jax.tree_util.tree_flatten_with_path(abstract)[0]):
        assert x.sharding == a.sharding, jax.tree_util.keystr(path)
    assert int(state.step) == step and int(state.skipped) > 0
    assert float(jnp.abs(state.opt_state[1][0].nu["embed"].get_value()).max()) > 0
    with open(os.path.join(workdir, "dumps", f"{step}.json")) as f:
        assert meta == json.load(f)
    assert meta["policy_version"] == step


def test_save_kill_restore_round_trip_is_bitwise(tmp_path):
    term_dir, kill_dir = tmp_path / "sigterm", tmp_path / "sigkill"
    term = _launch(term_dir, "term")
    kill = _launch(kill_dir, "ack")
    try:
        # SIGKILL right after an acknowledged save: nothing acknowledged may be lost.
        acked = _wait_for(kill, "ACK")
        kill.send_signal(signal.SIGKILL)
        kill.wait(timeout=30)
        # SIGTERM mid-run: the handler makes the loop save the current step and exit cleanly.
        _wait_for(term, "SAVED")
        time.sleep(0.3)
        term.send_signal(signal.SIGTERM)
        final = _wait_for(term, "FINAL")
        assert term.wait(timeout=60) == 0
    finally:
        for p in (term, kill):
            if p.poll() is None:
                p.kill()
    _check_restored(term_dir, final)

    ckpt = ckpt_lib.Checkpointer(os.path.join(kill_dir, "ckpt"), save_every=2, keep=10)
    latest = ckpt.latest_step()
    ckpt.close()
    assert latest is not None and latest >= acked
    _check_restored(kill_dir, latest)


def test_retention_keeps_last_n_and_every_m(tmp_path):
    ckpt = ckpt_lib.Checkpointer(str(tmp_path), save_every=1, keep=2, keep_every=4)
    assert ckpt.restore({"x": jax.ShapeDtypeStruct((3,), jnp.float32)}) is None
    for step in range(1, 11):
        assert ckpt.maybe_save(step, {"x": jnp.full((3,), step, jnp.float32)}, {"s": step})
    assert not ckpt.save(10, {"x": jnp.zeros(3)}, {})  # an existing step is not overwritten
    ckpt.wait()
    assert ckpt.all_steps() == [4, 8, 9, 10]
    for step in ckpt.all_steps():  # retention and later commits leave the manifests valid
        assert os.path.exists(tmp_path / str(step) / rundir.MANIFEST)
        assert rundir.verify_manifest(str(tmp_path / str(step))) is None
    state, meta = ckpt.restore({"x": jax.ShapeDtypeStruct((3,), jnp.float32)}, step=4)
    np.testing.assert_array_equal(state["x"], [4.0, 4.0, 4.0])
    assert meta == {"s": 4}
    ckpt.close()

    every3 = ckpt_lib.Checkpointer(str(tmp_path / "every3"), save_every=3, keep=5)
    saved = [s for s in range(1, 10) if every3.maybe_save(s, {"x": jnp.zeros(2)}, lambda: {})]
    every3.close()
    assert saved == [3, 6, 9]


def test_sigterm_handler_saves_the_current_step_and_signals_stop(tmp_path):
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    ckpt = ckpt_lib.Checkpointer(str(tmp_path), save_every=100, keep=3)
    ckpt.install_signal_handlers()
    try:
        assert not ckpt.maybe_save(7, {"x": jnp.ones(2)}, {}) and not ckpt.preemption_saved
        os.kill(os.getpid(), signal.SIGTERM)  # handled: sets the flag, the process lives on
        assert ckpt.preempted and not ckpt.preemption_saved and ckpt.stop_signal == "SIGTERM"
        assert ckpt.maybe_save(8, {"x": jnp.full((2,), 8.0)}, {"v": 8})
        assert ckpt.preemption_saved and ckpt.all_steps() == [8]  # already on disk
        assert rundir.verify_manifest(str(tmp_path / "8")) is None
        assert (tmp_path / "8" / rundir.MANIFEST).exists()  # wait() includes the hash
        os.kill(os.getpid(), signal.SIGTERM)  # a repeated SIGTERM changes nothing
        assert ckpt.stop_signal == "SIGTERM"
        with pytest.raises(KeyboardInterrupt):  # Ctrl-C once stopping: abort at once
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1.0)
    finally:
        ckpt.close()  # also restores the previous handlers
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before


SIGINT_SAVER = textwrap.dedent("""
    import os, signal, sys, time
    os.environ["JAX_PLATFORMS"] = "cpu"
    import jax.numpy as jnp
    from scalerl_jax import checkpoint as ckpt_lib

    ckpt = ckpt_lib.Checkpointer(sys.argv[1], save_every=3, keep=2)
    ckpt.install_signal_handlers()
    step = 0
    while True:
        step += 1
        if ckpt.maybe_save(step, {"x": jnp.full((4,), float(step))}, {"step": step}):
            print("SAVED", step, flush=True)
        if ckpt.preemption_saved:
            print("FINAL", step, ckpt.stop_signal, flush=True)
            break
        time.sleep(0.02)
    ckpt.close()
    sys.exit(128 + signal.Signals[ckpt.stop_signal])
""")


def test_sigint_saves_the_current_step_and_reports_it(tmp_path):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen(
        [sys.executable, "-c", SIGINT_SAVER, str(tmp_path)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _wait_for(proc, "SAVED")
        proc.send_signal(signal.SIGINT)  # Ctrl-C
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    final = [line.split() for line in out.splitlines() if line.startswith("FINAL")]
    assert final and final[0][2] == "SIGINT", (out, err[-2000:])
    assert proc.returncode == 130 and "Traceback" not in err, err[-2000:]
    step = int(final[0][1])
    ckpt = ckpt_lib.Checkpointer(str(tmp_path), save_every=3, keep=2)
    state, meta = ckpt.restore({"x": jax.ShapeDtypeStruct((4,), jnp.float32)})
    ckpt.close()
    assert ckpt.restored_step == step and meta == {"step": step}
    np.testing.assert_array_equal(state["x"], np.full(4, step, np.float32))


# -- corrupt checkpoints ----------------------------------------------------------------------
ABSTRACT = {
    "w": jax.ShapeDtypeStruct((3, 4), jnp.float32),
    "h": jax.ShapeDtypeStruct((8,), jnp.bfloat16),
    "n": {"count": jax.ShapeDtypeStruct((), jnp.int32)},
}


def _states(steps):
    rng = np.random.default_rng(0)
    return {
        s: {
            "w": jnp.asarray(rng.normal(size=(3, 4)), jnp.float32),
            "h": jnp.asarray(rng.normal(size=8), jnp.bfloat16),
            "n": {"count": jnp.int32(s)},
        }
        for s in steps
    }


def _save_all(directory, states):
    ckpt = ckpt_lib.Checkpointer(str(directory), save_every=1, keep=10)
    for step, state in states.items():
        assert ckpt.save(step, state, {"step": step})
    ckpt.close()


def _biggest_data_file(step_dir):
    return max(
        glob.glob(os.path.join(step_dir, "state", "ocdbt.process_*", "d", "*")), key=os.path.getsize
    )


def _flip(path):
    with open(path, "r+b") as f:
        data = bytearray(f.read())
        for i in range(len(data) // 3, len(data), 5):
            data[i] ^= 0xFF
        f.seek(0)
        f.write(data)


def _cut(path):
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)


def _corrupt_flip(step_dir):
    path = _biggest_data_file(step_dir)
    _flip(path)
    return os.path.relpath(path, step_dir)


def _corrupt_truncate(step_dir):
    path = _biggest_data_file(step_dir)
    _cut(path)
    return os.path.relpath(path, step_dir)


def _corrupt_metadata(step_dir):
    _cut(os.path.join(step_dir, "state", "_METADATA"))
    return os.path.join("state", "_METADATA")


def _corrupt_metadata_no_manifest(step_dir):
    # Killed between the commit and the hash: Orbax's own read fails, and the JSON decode
    # error (which names no file) must still be traced to the file.
    os.remove(os.path.join(step_dir, rundir.MANIFEST))
    _cut(os.path.join(step_dir, "meta", "metadata"))
    return os.path.join("meta", "metadata") + ": not valid JSON"


@pytest.mark.parametrize(
    "corrupt", [_corrupt_flip, _corrupt_truncate, _corrupt_metadata, _corrupt_metadata_no_manifest]
)
def test_corrupt_latest_checkpoint_is_refused_and_the_previous_restored(tmp_path, caplog, corrupt):
    states = _states([1, 2, 3])
    _save_all(tmp_path, states)
    named = corrupt(str(tmp_path / "3"))
    ckpt = ckpt_lib.Checkpointer(str(tmp_path), save_every=1, keep=10)
    with caplog.at_level("WARNING", logger="scalerl_jax.checkpoint"):
        state, meta = ckpt.restore(ABSTRACT)
    assert ckpt.restored_step == 2 and meta == {"step": 2} and list(ckpt.rejected) == [3]
    for key in ("w", "h"):
        assert np.asarray(state[key]).tobytes() == np.asarray(states[2][key]).tobytes(), key
    assert f"checkpoint step 3 in {tmp_path} is unusable: {named}" in caplog.text
    # The refused step is kept aside, so the resumed run can save step 3 again.
    assert ckpt.all_steps() == [1, 2] and (tmp_path / "rejected" / "3").is_dir()
    assert ckpt.save(3, states[3], {"step": 3})
    ckpt.wait()
    state, meta = ckpt.restore(ABSTRACT)
    ckpt.close()
    assert ckpt.restored_step == 3 and not ckpt.rejected
    assert np.asarray(state["w"]).tobytes() == np.asarray(states[3]["w"]).tobytes()


@pytest.mark.fast
def test_checkpoint_without_manifest_is_accepted(tmp_path):
    states = _states([1, 2])
    _save_all(tmp_path, states)
    os.remove(tmp_path / "2" / rundir.MANIFEST)
    ckpt = ckpt_lib.Checkpointer(str(tmp_path), save_every=1, keep=10)
    state, _ = ckpt.restore(ABSTRACT)
    ckpt.close()
    assert ckpt.restored_step == 2 and not ckpt.rejected
    assert np.asarray(state["h"]).tobytes() == np.asarray(states[2]["h"]).tobytes()


def test_non_finite_checkpoint_is_refused(tmp_path, caplog):
    states = _states([1, 2])
    states[2]["w"] = states[2]["w"].at[1, 2].set(jnp.nan)
    states[2]["h"] = states[2]["h"].at[0].set(jnp.inf)
    _save_all(tmp_path, states)
    ckpt = ckpt_lib.Checkpointer(str(tmp_path), save_every=1, keep=10)
    with caplog.at_level("WARNING", logger="scalerl_jax.checkpoint"):
        state, meta = ckpt.restore(ABSTRACT)
    ckpt.close()
    assert ckpt.restored_step == 1 and meta == {"step": 1}
    assert np.asarray(state["w"]).tobytes() == np.asarray(states[1]["w"]).tobytes()
    assert "step 2" in caplog.text and "w: 1 of 12 values non-finite" in caplog.text
    assert "h: 1 of 8 values non-finite" in caplog.text


def test_no_usable_checkpoint_raises_naming_every_step(tmp_path):
    _save_all(tmp_path, _states([1, 2]))
    for step in (1, 2):
        _corrupt_flip(str(tmp_path / str(step)))
    ckpt = ckpt_lib.Checkpointer(str(tmp_path), save_every=1, keep=10)
    with pytest.raises(
        ckpt_lib.CheckpointError,
        match=r"no usable checkpoint.*step 2: state/ocdbt.*crc32.*; "
        r"step 1: state/ocdbt.*crc32",
    ):
        ckpt.restore(ABSTRACT)
    assert ckpt.all_steps() == [1, 2]  # nothing moved when nothing could be restored
    with pytest.raises(ckpt_lib.CheckpointError, match=r"step 7 .*steps there: \[1, 2\]"):
        ckpt.restore(ABSTRACT, step=7)
    ckpt.close()


@pytest.mark.fast
def test_nested_layout_round_trip_and_errors():
    tree = (jnp.arange(2), {"a": [jnp.ones(1), jnp.zeros(1)]})
    nested = ckpt_lib.to_nested(tree)
    assert set(nested) == {"0", "1"} and set(nested["1"]["a"]) == {"0", "1"}
    back = ckpt_lib.from_nested(nested, tree)
    assert jax.tree.structure(back) == jax.tree.structure(tree)
    with pytest.raises(KeyError, match="no entry"):
        ckpt_lib.from_nested({"0": 1}, tree)
    with pytest.raises(ValueError, match="save_every=0"):
        ckpt_lib.Checkpointer("/tmp/never", save_every=0, keep=1)


@pytest.mark.fast
def test_export_hf_then_init_from_hf_gives_the_same_params(tmp_path):
    pytest.importorskip("safetensors")
    mesh = mesh_lib.trainer_mesh(MeshConfig(fsdp=4, tensor=2), jax.devices())
    cfg = presets.get("tiny-qwen2")  # tied embeddings and q/k/v biases
    _, _, state = state_lib.create_train_state(cfg, OCFG, mesh, seed=3)
    files = ckpt_lib.export_hf(state.params, cfg, str(tmp_path / "hf"))
    assert all(os.path.exists(f) for f in files)
    cfg2, _, loaded = state_lib.create_train_state(
        cfg, OCFG, mesh, seed=0, hf_checkpoint=str(tmp_path / "hf")
    )
    assert cfg2 == cfg
    for (path, x), y in zip(
        jax.tree_util.tree_flatten_with_path(loaded.params)[0], jax.tree.leaves(state.params)
    ):
        assert np.asarray(x).tobytes() == np.asarray(y).tobytes(), jax.tree_util.keystr(path)
        assert x.sharding == y.sharding, jax.tree_util.keystr(path)
    mu = loaded.opt_state[1][0].mu["layers"][0]["attn"]["q"].get_value()
    assert mu.sharding == state.params["layers"][0]["attn"]["q"].get_value().sharding
    assert not np.asarray(mu).any() and int(loaded.step) == 0
