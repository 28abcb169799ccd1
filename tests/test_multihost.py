"""The whole loop on 2 processes x 4 CPU devices (jax.distributed on 127.0.0.1, gloo): each host
samples its half of every step's prompts on its 2 sampler devices, the trainer mesh spans the
2 + 2 trainer devices of both hosts; SFT warm-up, RL, evaluation and checkpoints; then one
process is SIGKILLed, the job is relaunched (as a scheduler would) and resumes."""

import os
import signal
import socket
import subprocess
import sys
import time

from scalerl_jax.metrics import read_metrics

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ARGS = [
    "--no-fit",
    "reward.verifier=_verifiers:even_length",
    "mesh.colocate=false",
    "mesh.trainer_devices_per_host=2",
    "model.hidden_size=32",
    "model.intermediate_size=64",
    "model.num_layers=1",
    "model.num_heads=2",
    "model.num_kv_heads=2",
    "sft.steps=6",
    "sft.batch_size=8",
    "data.num_validation=16",
    "eval.num_prompts=16",
    "eval.k=2",
    "eval.every_steps=3",
    "checkpoint_every=3",
    "pipeline.prompts_per_step=4",
    "pipeline.generations_per_prompt=4",
    "sampler.max_concurrent_decodes=8",
]


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(workdir, steps, log_dir, tag):
    port = _free_port()
    procs = []
    for pid in range(2):
        env = {
            **os.environ,
            "JAX_PLATFORMS": "cpu",
            "XLA_FLAGS": "--xla_force_host_platform_device_count=4",
            "PYTHONPATH": os.pathsep.join([ROOT, os.path.join(ROOT, "tests")]),
            "SCALERL_COORDINATOR": f"127.0.0.1:{port}",
            "SCALERL_NUM_PROCESSES": "2",
            "SCALERL_PROCESS_ID": str(pid),
        }
        out = open(os.path.join(log_dir, f"{tag}-{pid}.log"), "w")
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    os.path.join(ROOT, "experiments", "run.py"),
                    "--workdir",
                    workdir,
                    "--steps",
                    str(steps),
                    *ARGS,
                ],
                env=env,
                cwd=ROOT,
                stdout=out,
                stderr=out,
            )
        )
    return procs


def _logs(log_dir):
    return "\n".join(
        f"--- {name}\n" + open(os.path.join(log_dir, name)).read()[-2500:]
        for name in sorted(os.listdir(log_dir))
    )


def _train_steps(workdir):
    try:
        return [r["step"] for r in read_metrics(workdir).of("train")]
    except FileNotFoundError:
        return []


def test_two_hosts_train_evaluate_checkpoint_and_resume_after_a_kill(tmp_path):
    workdir, log_dir = str(tmp_path / "run"), tmp_path / "logs"
    log_dir.mkdir()
    procs = _launch(workdir, 9, str(log_dir), "first")
    deadline = time.monotonic() + 420
    while len(_train_steps(workdir)) < 5:
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs), _logs(log_dir)
        time.sleep(0.3)
    procs[1].send_signal(signal.SIGKILL)  # a host dies; the scheduler then stops the job
    procs[1].wait()
    procs[0].send_signal(signal.SIGKILL)
    procs[0].wait()
    assert _train_steps(workdir)[-1] < 9

    procs = _launch(workdir, 9, str(log_dir), "second")
    for p in procs:
        assert p.wait(timeout=420) == 0, _logs(log_dir)
    log = read_metrics(workdir)
    records = log.of("train")
    assert [r["step"] for r in records] == list(range(1, 10))
    assert all(r["batch_groups"] == 4 for r in records)  # 2 groups from each host, every step
    assert sum(r["stale_groups"] for r in records) == 0
    evals = log.of("eval")
    assert [r["step"] for r in evals] == [0, 3, 6, 9]
    assert all(r["num_prompts"] == 16 for r in evals)  # both hosts' halves of the validation set
    hours = [r["compute"]["device_hours"] for r in evals]
    assert all(b > a for a, b in zip(hours, hours[1:]))
    assert [r["resumed"] for r in log.of("run")] == [False, True]
    assert os.path.exists(os.path.join(workdir, "sft", "model", "model.safetensors"))
