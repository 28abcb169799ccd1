"""Workdir lock and config guard: one live run per workdir, its config kept, failures traceless.

The lock is held by a separate process (the situation of two runs on one workdir), which is
then SIGKILLed: the kernel drops its flock, so the next run takes the lock without cleanup.
"""

import json
import os
import select
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from scalerl_jax import rundir
from scalerl_jax.config import ConfigError, RunConfig, field_defaults
from scalerl_jax.models import presets
from scalerl_jax.rundir import (
    ConfigMismatch,
    WorkdirInUseError,
    check_config,
    lock_workdir,
    write_config,
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HOLDER = textwrap.dedent("""
    import sys, time
    from scalerl_jax.rundir import lock_workdir
    lock = lock_workdir(sys.argv[1])
    print("LOCKED", flush=True)
    time.sleep(120)
""")


def _snapshot(path):
    """{relative path: bytes} of every file and directory under `path`."""
    out = {}
    for root, dirs, files in os.walk(path):
        out.update({os.path.relpath(os.path.join(root, d), path) + "/": None for d in dirs})
        for name in files:
            full = os.path.join(root, name)
            with open(full, "rb") as f:
                out[os.path.relpath(full, path)] = f.read()
    return out


def test_second_run_refused_at_once_and_lock_recovered_after_kill_9(tmp_path, caplog):
    workdir = tmp_path / "run"
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(workdir)], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        ready, _, _ = select.select([holder.stdout], [], [], 60)
        assert ready and holder.stdout.readline().startswith("LOCKED")
        t0 = time.monotonic()
        with pytest.raises(WorkdirInUseError) as err:
            lock_workdir(workdir)
        assert time.monotonic() - t0 < 1.0  # refused at once, not after a wait
        message = str(err.value)
        assert f"pid {holder.pid} on host {socket.gethostname()}" in message
        assert str(workdir) in message and "--workdir" in message and " since " in message
        assert os.listdir(workdir) == [".lock"]  # the refused attempt wrote nothing

        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
    finally:
        if holder.poll() is None:
            holder.kill()
    assert os.listdir(workdir) == [".lock"]  # the dead holder's file is still there...
    with caplog.at_level("WARNING", logger="scalerl_jax.rundir"):
        lock = lock_workdir(workdir)  # ...and its lock is not
    assert f"pid {holder.pid}" in caplog.text and "without releasing" in caplog.text
    with open(workdir / ".lock") as f:
        assert json.load(f)["pid"] == os.getpid()
    with pytest.raises(WorkdirInUseError, match=f"pid {os.getpid()} on host"):
        lock_workdir(workdir)  # a second lock in the same process is refused too
    lock.release()
    lock.release()  # idempotent
    assert os.listdir(workdir) == []
    with lock_workdir(workdir):  # free again
        pass


def test_failing_command_leaves_no_trace(tmp_path):
    cfg = RunConfig(model=presets.get("tiny-qwen2", num_layers=1)).to_dict()
    fresh = tmp_path / "runs" / "new"
    with pytest.raises(ConfigError, match="validation failed"):
        with lock_workdir(fresh):
            assert check_config(fresh, cfg) == []  # fresh workdir: nothing to compare
            # What a trainer may have set up before failing: Orbax's empty checkpoint
            # directory, an opened metrics file with nothing in it yet.
            (fresh / "checkpoints" / "tmp").mkdir(parents=True)
            (fresh / "metrics.jsonl").touch()
            raise ConfigError("validation failed")  # e.g. the tokenizer cannot be loaded
    assert not (tmp_path / "runs").exists()  # neither the workdir nor its parent

    existing = tmp_path / "old"
    existing.mkdir()
    write_config(existing, cfg)
    (existing / "metrics.jsonl").write_text('{"event": "run", "step": 0, "wall_s": 0.0}\n')
    (existing / "tensorboard").mkdir()  # empty, but the old run's: kept
    before = _snapshot(existing)
    changed = dict(cfg, seed=cfg["seed"] + 1)
    with pytest.raises(ConfigMismatch):
        with lock_workdir(existing):
            check_config(existing, changed)
    assert _snapshot(existing) == before  # config.json untouched, no lock file, no temp file
    assert (existing / "tensorboard").is_dir()

    # A run that wrote data keeps it; only its empty leftovers go.
    with lock_workdir(existing):
        (existing / "checkpoints" / "10").mkdir(parents=True)
        (existing / "checkpoints" / "10" / "data").write_bytes(b"x")
        (existing / "checkpoints" / "11").mkdir()
    assert sorted(os.listdir(existing / "checkpoints")) == ["10"]
    assert sorted(os.listdir(existing)) == [
        "checkpoints",
        "config.json",
        "metrics.jsonl",
        "tensorboard",
    ]


@pytest.mark.fast
def test_config_guard_names_keys_allows_steps_and_override(tmp_path, caplog):
    cfg = RunConfig(model=presets.get("tiny-qwen2", num_layers=1)).to_dict()
    path = write_config(tmp_path, cfg)
    assert json.load(open(path)) == cfg
    assert check_config(tmp_path, cfg) == []
    assert check_config(tmp_path, dict(cfg, steps=cfg["steps"] * 2)) == []  # extending a run

    changed = json.loads(json.dumps(cfg))
    changed["model"]["num_layers"] = 2
    changed["optim"]["learning_rate"] = 3e-4
    with pytest.raises(ConfigMismatch) as err:
        check_config(tmp_path, changed)
    message = str(err.value)
    assert isinstance(err.value, ConfigError)
    assert "2 key(s) differ" in message and "model.num_layers: 1 -> 2" in message
    assert f"optim.learning_rate: {cfg['optim']['learning_rate']!r} -> 0.0003" in message
    assert "--allow-config-change" in message and str(path) in message

    with caplog.at_level("WARNING", logger="scalerl_jax.rundir"):
        diffs = check_config(tmp_path, changed, allow_change=True)
    assert [d[0] for d in diffs] == ["model.num_layers", "optim.learning_rate"]
    assert "model.num_layers" in caplog.text
    assert check_config(tmp_path, changed, ignore=("steps", "model", "optim")) == []

    # A key only on one side is named; at most MAX_LISTED keys are listed.
    many = dict(cfg, extra={f"k{i:02d}": i for i in range(12)})
    with pytest.raises(
        ConfigMismatch,
        match=r"12 key\(s\).*extra.k00: <absent> -> 0.*"
        r"and 2 more",
    ):
        check_config(tmp_path, many)
    # Tuples in the new config equal the lists JSON reads back.
    write_config(tmp_path, {"shape": [1, 2], "steps": 5})
    assert check_config(tmp_path, {"shape": (1, 2), "steps": 9}) == []
    with pytest.raises(ConfigMismatch, match=r"shape: \[1, 2\] -> \[1, 3\]"):
        check_config(tmp_path, {"shape": (1, 3), "steps": 5})

    (tmp_path / "config.json").write_text('{"model": {"num_')  # cut by a crash of old code
    with pytest.raises(ConfigError, match=r"config.json is not valid JSON.*allow-config-change"):
        check_config(tmp_path, cfg)


def test_a_run_started_before_a_field_existed_resumes_while_it_keeps_its_default(tmp_path):
    cfg = RunConfig(model=presets.get("tiny-qwen2", num_layers=1)).to_dict()
    old = json.loads(json.dumps(cfg))
    del old["model"]["num_experts"], old["reward"]["processes"]  # fields added by an upgrade
    write_config(tmp_path, old)
    assert check_config(tmp_path, cfg, defaults=field_defaults()) == []
    with pytest.raises(ConfigMismatch, match="model.num_experts: <absent> -> 0"):
        check_config(tmp_path, cfg)  # without the defaults every new key is a difference
    moe = json.loads(json.dumps(cfg))
    moe["model"]["num_experts"] = 4  # a new field set to a non-default value does differ
    with pytest.raises(ConfigMismatch, match=r"1 key\(s\).*model.num_experts: <absent> -> 4"):
        check_config(tmp_path, moe, defaults=field_defaults())


@pytest.mark.fast
def test_write_config_is_atomic(tmp_path, monkeypatch):
    write_config(tmp_path, {"seed": 1})
    before = _snapshot(tmp_path)

    def crash(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(rundir.os, "replace", crash)
    with pytest.raises(OSError, match="disk full"):
        write_config(tmp_path, {"seed": 2})
    assert _snapshot(tmp_path) == before  # the old config intact, no temp file left
    monkeypatch.undo()
    write_config(tmp_path, {"seed": 2})
    assert json.load(open(tmp_path / "config.json")) == {"seed": 2}
    assert os.listdir(tmp_path) == ["config.json"]
