"""Progress lines while nothing else prints (the heartbeat: start-up, compilation, evaluation) and
stop signals answered within seconds (the first evaluation, a long native call), through the real
entry point with its output piped, as under nohup or CI."""

import logging
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from scalerl_jax.metrics import read_metrics
from scalerl_jax.heartbeat import Heartbeat

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTBED = [
    "--no-fit",
    "sft=none",
    "reward.verifier=_verifiers:even_length",
    "model.hidden_size=32",
    "model.intermediate_size=64",
    "model.num_layers=1",
    "model.num_heads=2",
    "model.num_kv_heads=2",
    "pipeline.prompts_per_step=4",
    "pipeline.generations_per_prompt=4",
    "checkpoint_every=2",
]


class Lines:
    """A child's stdout and stderr read as they come, each line stamped with its arrival time."""

    def __init__(self, proc):
        self.proc, self.lines, self.start = proc, [], time.monotonic()
        self._lock = threading.Lock()
        self._readers = [
            threading.Thread(target=self._read, args=(s,), daemon=True)
            for s in (proc.stdout, proc.stderr)
        ]
        for r in self._readers:
            r.start()

    def _read(self, stream):
        for line in iter(stream.readline, ""):
            with self._lock:
                self.lines.append((time.monotonic(), line.rstrip("\n")))

    def wait_for(self, pattern, timeout):
        """Until a line matches the regular expression `pattern`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(re.search(pattern, line) for _, line in list(self.lines)):
                return
            assert self.proc.poll() is None, f"exited {self.proc.returncode}:\n{self.text()}"
            time.sleep(0.05)
        raise AssertionError(f"no line matching {pattern!r} within {timeout} s:\n{self.text()}")

    def finish(self, timeout):
        self.proc.wait(timeout=timeout)
        for r in self._readers:
            r.join(timeout=10)
        return self.proc.returncode

    def text(self):
        return "\n".join(line for _, line in list(self.lines))


def launch(*args, interval="1", own_group=False):
    """experiments/run.py with this checkout first; `own_group`: in a process group of its own, as a
    terminal's foreground job (for signals sent to the group)."""
    env = {
        **os.environ,
        "JAX_PLATFORMS": "cpu",
        "XLA_FLAGS": "",
        "PYTHONUNBUFFERED": "1",
        "SCALERL_PROGRESS_INTERVAL": interval,
        "PYTHONPATH": os.pathsep.join([ROOT, os.path.join(ROOT, "tests")]),  # this checkout first
    }
    proc = subprocess.Popen(
        [sys.executable, os.path.join(ROOT, "experiments", "run.py"), *args],
        cwd=ROOT,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=own_group,
    )
    return Lines(proc)


# ------------------------------------------------------------------------------ heartbeat
@pytest.mark.fast
def test_heartbeat_names_nested_phases_only_when_nothing_else_printed(caplog):
    beat = Heartbeat()
    with caplog.at_level(logging.INFO, logger="scalerl_jax.heartbeat"):
        beat.start("job: starting", interval=0.3)
        try:
            with (
                beat.phase("rl step 2/5"),
                beat.phase("evaluation", total=8, unit="completions") as ev,
            ):
                ev.update(2)
                time.sleep(0.5)
                ev.update(3)  # the ETA counts from the first update: before it, compiling
                time.sleep(0.5)
                quiet = len(caplog.records)
                for _ in range(8):  # other output keeps coming: no heartbeat needed
                    beat.printed()
                    time.sleep(0.1)
                assert len(caplog.records) == quiet
        finally:
            beat.stop()
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0] == "job: starting"
    beats = lines[1:]
    assert 2 <= len(beats) <= 4, lines  # ~1 s of silence at 0.3 s intervals
    assert all(b.startswith("rl step 2/5 > evaluation: ") for b in beats)
    assert beats[-1].startswith("rl step 2/5 > evaluation: 3/8 completions (00:0")
    assert re.search(r"ETA 00:0[1-5]\)$", beats[-1])  # ~0.5 s a completion since the 2nd, 5 left
    assert all("ETA after the next update" in b for b in beats if "2/8" in b)
    assert beat.line() == "working"  # the phases ended with their blocks


def test_run_prints_a_line_every_interval_from_its_first_second(tmp_path):
    out = launch(
        "--workdir",
        str(tmp_path / "run"),
        "--steps",
        "3",
        *TESTBED,
        "data.num_validation=64",
        "eval.num_prompts=64",
        "eval.k=4",
        "eval.every_steps=3",
    )
    assert out.finish(timeout=600) == 0, out.text()[-3000:]
    times = [t for t, _ in out.lines]
    assert times[0] - out.start < 5.0, out.text()  # the start line (interpreter start included)
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert max(gaps) < 3.0, (max(gaps), out.text())  # a line every ~1 s, slack for a busy CPU
    text = out.text()
    for phase in (
        "run.py: recipe testbed",
        "start-up: data, reward workers",
        "evaluation of step 0 > sampling:",
        "completions",
        "rl step 1/3",
    ):
        assert phase in text, phase


# ---------------------------------------------------------------------------- stop signals
def test_sigterm_in_the_first_evaluation_stops_within_seconds(tmp_path):
    workdir = str(tmp_path / "run")
    # A random 1-layer policy rambles to the length cap: 400 prompts x 16 take minutes. The
    # signal comes once completions finish, i.e. after the sampler's compilation, where the
    # watchdog would act instead (test_watchdog_*).
    out = launch(
        "--workdir", workdir, "--steps", "3", *TESTBED, "eval.num_prompts=400", "eval.k=16"
    )
    out.wait_for(r"evaluation of step 0 > sampling: [1-9]\d*/6400 completions", timeout=300)
    sent = time.monotonic()
    out.proc.send_signal(signal.SIGTERM)
    code = out.finish(timeout=60)
    took = time.monotonic() - sent
    text = out.text()
    assert code == 143, text[-3000:]
    assert took < 10.0, (took, text[-2000:])
    assert "Traceback" not in text
    assert "SIGTERM received: stopping when the current step or evaluation ends" in text
    assert "SIGTERM: evaluation of step 0 stopped unfinished; no record written" in text
    assert "nothing was trained, so nothing to save" in text
    assert "interrupted by SIGTERM at step 0: re-run the same command to resume" in text
    assert not read_metrics(workdir).of("eval") and not read_metrics(workdir).of("train")
    checkpoints = os.path.join(workdir, "checkpoints")
    assert not os.path.isdir(checkpoints) or not any(n.isdigit() for n in os.listdir(checkpoints))


WATCHDOG_SCRIPT = textwrap.dedent("""
    import signal, sys, time
    import numpy as np
    from scalerl_jax.interrupt import Watchdog
    from scalerl_jax.progress import setup_logging
    setup_logging()
    seen = []
    for sig in (signal.SIGTERM, signal.SIGINT):  # handlers that only take note, as the
        signal.signal(sig, lambda s, f: seen.append(s))  # trainer's do before a step ends
    with Watchdog(can_exit=lambda: sys.argv[1] == "nothing-unsaved", nothing_lost="all saved",
                  acknowledged=lambda: bool(seen), describe=lambda: "a long native call",
                  grace_s=1.0, second_grace_s=1.0):
        print("busy", flush=True)
        a = np.random.default_rng(0).random((1500, 1500))
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # numpy's LAPACK holds the main thread
            np.linalg.svd(a)
    print("never finished by itself", flush=True)
""")


def _watchdog(mode):
    env = {**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1"}
    return Lines(
        subprocess.Popen(
            [sys.executable, "-c", WATCHDOG_SCRIPT, mode],
            cwd=ROOT,
            env=env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
    )


def test_watchdog_ends_a_busy_process_with_nothing_unsaved():
    out = _watchdog("nothing-unsaved")
    out.wait_for("busy", timeout=60)
    sent = time.monotonic()
    out.proc.send_signal(signal.SIGTERM)
    assert out.finish(timeout=60) == 143, out.text()
    assert time.monotonic() - sent < 6.0
    assert "SIGTERM: all saved; exiting now instead of waiting for a long native call" in out.text()


@pytest.mark.parametrize("second", [signal.SIGTERM, signal.SIGINT])
def test_watchdog_second_signal_exits_at_once(second):
    out = _watchdog("unsaved-work")
    out.wait_for("busy", timeout=60)
    out.proc.send_signal(signal.SIGTERM)
    time.sleep(2.0)  # past the grace: the first signal alone does not end unsaved work
    assert out.proc.poll() is None, out.text()
    sent = time.monotonic()
    out.proc.send_signal(second)
    assert out.finish(timeout=60) == 128 + second, out.text()
    assert time.monotonic() - sent < 6.0
    text = out.text()
    assert f"second stop signal ({signal.Signals(second).name}): exiting now without saving" in text
    assert "never finished" not in text
