"""kill -9 at a random moment, then the same command: every train step appears exactly once in
metrics.jsonl and the compute axis keeps growing (it is checkpointed, not re-derived)."""

import os
import random
import signal
import subprocess
import sys
import time

from scalerl_jax.metrics import read_metrics

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ARGS = [
    "--steps",
    "30",
    "--no-fit",
    "sft=none",
    "reward.verifier=_verifiers:even_length",
    "model.hidden_size=32",
    "model.intermediate_size=64",
    "model.num_layers=1",
    "model.num_heads=2",
    "model.num_kv_heads=2",
    "data.num_validation=16",
    "eval.num_prompts=16",
    "eval.k=2",
    "eval.every_steps=5",
    "checkpoint_every=4",
    "pipeline.prompts_per_step=4",
    "pipeline.generations_per_prompt=4",
]


def _command(workdir):
    env = {
        **os.environ,
        "JAX_PLATFORMS": "cpu",
        "XLA_FLAGS": "",
        "PYTHONPATH": os.pathsep.join([ROOT, os.path.join(ROOT, "tests")]),  # this checkout first
    }
    return [
        sys.executable,
        os.path.join(ROOT, "experiments", "run.py"),
        "--workdir",
        workdir,
        *ARGS,
    ], env


def _train_steps(workdir):
    try:
        return [r["step"] for r in read_metrics(workdir).of("train")]
    except FileNotFoundError:
        return []


def test_kill_9_then_rerun_leaves_one_record_per_step_and_growing_compute(tmp_path):
    workdir = str(tmp_path / "run")
    cmd, env = _command(workdir)
    proc = subprocess.Popen(
        cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 300
    while len(_train_steps(workdir)) < 6 and proc.poll() is None:
        assert time.monotonic() < deadline, "the run made no progress"
        time.sleep(0.2)
    time.sleep(random.uniform(0.0, 1.5))  # a few steps later: mid-step, mid-save, mid-eval...
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed_at = _train_steps(workdir)
    assert killed_at and killed_at[-1] < 30

    done = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    log = read_metrics(workdir)
    assert [r["step"] for r in log.of("train")] == list(range(1, 31))
    evals = log.of("eval")
    assert [r["step"] for r in evals] == list(range(0, 31, 5))
    for key in ("device_hours", "flops", "tokens"):
        values = [r["compute"][key] for r in evals]
        assert all(b > a for a, b in zip(values, values[1:])), (key, values)
    assert [r["resumed"] for r in log.of("run")] == [False, True]


def test_ctrl_c_saves_the_current_step_and_exits_130(tmp_path):
    workdir = str(tmp_path / "run")
    cmd, env = _command(workdir)
    proc = subprocess.Popen(
        cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 300
    while len(_train_steps(workdir)) < 3:
        assert time.monotonic() < deadline and proc.poll() is None, "no progress"
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    assert "Traceback" not in err and "interrupted by SIGINT" in err
    last = _train_steps(workdir)[-1]
    assert os.path.isdir(os.path.join(workdir, "checkpoints", str(last)))  # saved where it stopped
