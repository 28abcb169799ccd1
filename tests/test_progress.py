"""Console output: logging after an Orbax import, the bar on/off a terminal, the summary."""

import io
import itertools
import logging
import os
import pty
import re
import select
import subprocess
import sys
import textwrap
import types

import pytest

from scalerl_jax import progress
from scalerl_jax.progress import SFT_FIELDS, Progress, setup_logging, summary_lines

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN = {
    "loss": 0.01234,
    "reward_mean": 0.5,
    "pass_rate_train": 0.375,
    "staleness_max": 2,
    "batch_seq_tokens": 4096,
}


class FakeTTY(io.StringIO):
    def isatty(self):
        return True


@pytest.fixture
def restore_logging(monkeypatch):
    """setup_logging changes process-wide state; put it back for the other tests."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    levels = {name: logging.getLogger(name).level for name in ("scalerl_jax", "__main__")}
    monkeypatch.delenv(progress.ENV_PROGRESS, raising=False)
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    for name, lvl in levels.items():
        logging.getLogger(name).setLevel(lvl)
    logging.captureWarnings(False)


def test_info_lines_appear_after_orbax_import():
    # A fresh interpreter: what experiments/run.py does, in the same order.
    script = textwrap.dedent("""
        import logging
        import orbax.checkpoint  # absl's basicConfig() happens here
        logging.basicConfig(level=logging.INFO)
        logging.getLogger("scalerl_jax.train.trainer").info("lost before setup")
        from scalerl_jax.progress import setup_logging
        setup_logging()
        logging.getLogger("scalerl_jax.train.trainer").info("step 5 loss 0.1")
        logging.getLogger("absl").info("absl chatter")
        logging.getLogger("orbax.checkpoint").info("orbax chatter")
        logging.getLogger("jax._src.xla_bridge").info("jax chatter")
        logging.getLogger("absl").warning("absl warning")
    """)
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    out = subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert "lost before setup" not in out.stderr  # the bug this module fixes
    assert re.search(r"^\d\d:\d\d:\d\d train\.trainer: step 5 loss 0\.1$", out.stderr, re.M)
    assert "chatter" not in out.stderr
    assert "absl: absl warning" in out.stderr
    assert out.stderr.count("step 5 loss") == 1  # the old handler is gone, no duplicates


def test_log_lines_go_above_a_live_bar(restore_logging):
    stream = FakeTTY()
    setup_logging(stream=stream)
    setup_logging(stream=stream)  # idempotent: still one handler
    with Progress("rl", 10, stream=stream) as bar:
        bar.update(1, TRAIN)
        logging.getLogger("scalerl_jax.test").info("hello")
        bar.update(2, TRAIN)
    text = stream.getvalue()
    # tqdm.write clears the bar ("\r ... \r"), prints the line, then redraws the bar.
    assert re.search(r"\r\d\d:\d\d:\d\d test: hello\n", text)
    assert text.count("hello") == 1


def test_progress_off_a_terminal_logs_plain_lines_only(restore_logging, caplog):
    stream = io.StringIO()
    with caplog.at_level(logging.INFO, logger="scalerl_jax.progress"):
        with Progress(
            "rl",
            12,
            tokens_key="batch_seq_tokens",
            stream=stream,
            log_every_steps=5,
            log_every_s=None,
        ) as bar:
            assert not bar.enabled and bar.bar is None
            for step in range(1, 12):
                bar.update(step, TRAIN, forecast="A 0.61")
                if step == 5:
                    bar.set_eval(5, 0.4)
            bar.note("evaluating")
    assert stream.getvalue() == ""
    lines = [r.getMessage() for r in caplog.records]
    assert [re.match(r"(rl \d+/12)", m).group(1) for m in lines if m.startswith("rl ")] == [
        "rl 1/12",
        "rl 6/12",
        "rl 11/12",
    ]
    assert "loss 0.0123 | reward 0.500 | pass 0.375 | stale 2 | val 0.400@5 | tok/s" in lines[1]
    assert "forecast A 0.61" in lines[1] and "ETA" in lines[1]
    assert "rl: evaluating" in lines


@pytest.mark.fast
def test_progress_time_based_lines_and_final_line(restore_logging, caplog):
    with caplog.at_level(logging.INFO, logger="scalerl_jax.progress"):
        with Progress("sft", 100, fields=SFT_FIELDS, stream=io.StringIO(), log_every_s=3600) as bar:
            for step in range(1, 4):
                bar.update(step, {"loss": 1.0 / step})
    assert [r.getMessage().split(" |")[0] for r in caplog.records] == [
        "sft 1/100 (1%)",
        "sft 3/100 (3%)",
    ]  # first update, then close()


def test_rates_with_updates_every_k_steps(restore_logging, monkeypatch):
    clock = itertools.count()  # one second per call: construction, then one per update
    monkeypatch.setattr(progress, "time", types.SimpleNamespace(monotonic=lambda: next(clock)))
    with Progress(
        "sft", 50, fields=SFT_FIELDS, tokens_key="tokens", stream=io.StringIO(), log_every_s=None
    ) as bar:
        for step in (10, 20, 30):  # SFT reports every 10th step, each with one step's tokens
            bar.update(step, {"loss": 1.0, "tokens": 500.0})
    tokens_per_s, s_per_step = bar.rates()
    assert s_per_step == pytest.approx(0.1) and tokens_per_s == pytest.approx(5000.0)


@pytest.mark.parametrize("env, expected", [("1", True), ("0", False)])
def test_env_forces_the_bar(restore_logging, monkeypatch, env, expected):
    monkeypatch.setenv(progress.ENV_PROGRESS, env)
    stream = io.StringIO() if expected else FakeTTY()
    with Progress("rl", 3, stream=stream) as bar:
        bar.update(1, TRAIN)
    assert bar.enabled is expected and (stream.getvalue() != "") is expected
    assert Progress("rl", 3, stream=stream, enabled=not expected).enabled is not expected


def test_bar_on_a_terminal_shows_resumed_step_and_fields(restore_logging, caplog):
    stream = FakeTTY()
    with caplog.at_level(logging.INFO, logger="scalerl_jax.progress"):
        with Progress("rl", 100, initial=40, tokens_key="batch_seq_tokens", stream=stream) as bar:
            assert bar.enabled
            for step in (41, 42):
                bar.update(step, TRAIN, forecast="A 0.61")
            bar.set_eval(42, 0.5)
            bar.note("checkpoint saved")
    text = stream.getvalue()
    assert "40/100" in text and "42/100" in text
    last = text.rsplit("\r", 1)[-1]
    for part in (
        "loss 0.0123",
        "reward 0.500",
        "pass 0.375",
        "stale 2",
        "val 0.500@42",
        "tok/s",
        "forecast A 0.61",
    ):
        assert part in last, (part, last)
    assert "checkpoint saved\n" in text
    assert not caplog.records  # a live bar replaces the periodic lines


def test_bar_on_a_real_pseudo_terminal(restore_logging):
    master, slave = pty.openpty()
    with os.fdopen(slave, "w") as tty_stream:
        with Progress("sft", 5, fields=SFT_FIELDS, stream=tty_stream) as bar:
            assert bar.enabled
            bar.update(5, {"loss": 0.5})
        tty_stream.flush()
        chunks = b""
        while select.select([master], [], [], 0.2)[0]:
            chunks += os.read(master, 65536)
    os.close(master)
    assert b"sft" in chunks and b"5/5" in chunks and b"loss 0.5000" in chunks


@pytest.mark.fast
def test_summary_with_fit(tmp_path):
    os.makedirs(tmp_path / "tensorboard")
    os.makedirs(tmp_path / "fit")
    evals = [
        {"step": 0, "pass_rate": 0.2},
        {"step": 10, "pass_rate": 0.3},
        {
            "step": 10,
            "pass_rate": 0.35,  # re-evaluated after a resume: the last counts
            "compute": {"device_hours": 12.5, "flops": 4.2e18, "tokens": 2.3e9},
        },
    ]
    fit = {
        "A": 0.61,
        "A_lo": 0.6,
        "A_hi": 0.62,
        "B": 1.42,
        "B_lo": 1.3,
        "B_hi": 1.55,
        "C_mid": 1820.0,
    }
    lines = summary_lines(str(tmp_path), evals, fit)
    assert 5 <= len(lines) <= 10
    assert lines[0] == "validation pass rate: 0.200 (step 0) -> 0.350 (step 10), 2 eval points"
    assert lines[1] == "compute: 12.5 device-hours, 4.2e+18 FLOPs, 2.3e+09 tokens"
    assert lines[2] == (
        "fit: A 0.610 [0.600, 0.620]  B 1.42 [1.3, 1.55]  C_mid 1820  (C_mid in device-hours)"
    )
    text = "\n".join(lines)
    assert f"{tmp_path}/metrics.jsonl" in text
    assert f"tensorboard --logdir {tmp_path}/tensorboard" in text and f"{tmp_path}/fit" in text


def test_summary_without_fit(tmp_path):
    lines = summary_lines(
        str(tmp_path), [{"step": 0, "pass_rate": None}], None, fit_reason="too few points (2 < 4)"
    )
    assert lines[0].startswith("validation pass rate: n/a (step 0) -> n/a (step 0), 1 eval")
    assert "fit: none (too few points (2 < 4))" in lines
    assert f"python experiments/fit.py {tmp_path}" in lines[-1]
    assert not any("tensorboard" in line for line in lines)
    assert summary_lines(str(tmp_path), [], None)[:2] == [
        "validation pass rate: no eval points",
        "fit: none (not run)",
    ]


def test_eta_leaves_out_the_compiling_first_step_and_the_forecast_column_is_explained(
    restore_logging, monkeypatch, caplog
):
    clock = itertools.chain([0.0, 100.0, 101.0, 102.0], itertools.repeat(102.0))
    monkeypatch.setattr(progress, "time", types.SimpleNamespace(monotonic=lambda: next(clock)))
    with caplog.at_level(logging.INFO, logger="scalerl_jax.progress"):
        with Progress("rl", 10, stream=io.StringIO(), log_every_steps=1, log_every_s=None) as bar:
            bar.update(1, TRAIN)  # 100 s: compiling, then the step
            bar.set_forecast({"ok": False, "reason": "1 point; a fit needs 4"})
            bar.update(2, TRAIN)  # 1 s a step from here on
            bar.update(3, TRAIN)
    lines = [r.getMessage() for r in caplog.records]
    first, legend, _, third = lines
    assert first.startswith("rl 1/10") and first.endswith(
        "ETA after the next update (this one compiled)"
    )
    assert third.endswith("| 1 s/step | ETA 00:07") and "A≈ n/a" in third
    assert legend.startswith("rl: A≈: the pass rate the sigmoid fitted to the evaluations")
    assert legend.endswith("n/a until the evaluations support a fit (now: 1 point; a fit needs 4)")
