"""UserError: every error class a user can cause derives from it (keeping its built-in base), the
others are named here as bugs or internal signals; the programs catch a UserError raised deep
inside a run as one line with exit status 2, and keep a bug's traceback."""

import importlib
import os
import pkgutil
import subprocess
import sys

import scalerl_jax
from scalerl_jax import UserError
from test_run import ROOT, TINY, run_cli

# Exceptions of the package that no user input can cause: they are not UserErrors.
NOT_USER = {
    "scalerl_jax.rewards._inside.WireError": "the sandbox's wire format, inside the sandbox",
    "scalerl_jax.rewards._harness.CandidateFailed": "a tested program's failure, inside it",
    "scalerl_jax.rewards.sympy_safe._Reject": "an answer refused, caught where it is raised",
    "scalerl_jax.sampler.driver.DriverError": "the driver thread failed: its cause says why",
    "scalerl_jax.sampler.engine.EngineError": "the driver called the engine wrongly: a bug",
}


def _error_classes() -> dict:
    """{qualified name: class} of every exception class defined in the package."""
    found = {}
    for info in pkgutil.walk_packages(scalerl_jax.__path__, "scalerl_jax."):
        module = importlib.import_module(info.name)
        for value in vars(module).values():
            if (
                isinstance(value, type)
                and issubclass(value, BaseException)
                and value.__module__ == module.__name__
            ):
                found[f"{value.__module__}.{value.__qualname__}"] = value
    return found


def test_every_error_a_user_can_cause_is_a_user_error():
    classes = _error_classes()
    assert set(NOT_USER) <= set(classes), set(NOT_USER) - set(classes)
    users = {name: cls for name, cls in classes.items() if name not in NOT_USER}
    unsorted = [name for name, cls in users.items() if not issubclass(cls, UserError)]
    assert not unsorted, f"derive these from UserError or name them in NOT_USER: {unsorted}"
    assert not [name for name in NOT_USER if issubclass(classes[name], UserError)]
    # The built-in bases stay: `except ValueError` / `except RuntimeError` still catch them.
    builtin = {name for name, cls in users.items() if issubclass(cls, (ValueError, RuntimeError))}
    assert builtin == set(users) - {"scalerl_jax.errors.UserError"}
    for name in (
        "scalerl_jax.config.checks.ConfigError",
        "scalerl_jax.rewards.sandbox.SandboxUnavailable",
        "scalerl_jax.checkpoint.CheckpointError",
        "scalerl_jax.plan.topology.PlanError",
        "scalerl_jax.preflight.UsageError",
    ):
        assert name in users


# A run whose trainer raises `KIND` after a normal start-up (the config, inputs and memory plan
# are checked for real first).
DEEP = """
import sys
from scalerl_jax.cli import run
from scalerl_jax.train import trainer
from scalerl_jax.checkpoint import CheckpointError
from scalerl_jax.errors import UserError

class NeverHeardOf(UserError):
    pass

KINDS = {"user": NeverHeardOf, "checkpoint": CheckpointError, "bug": RuntimeError}

def deep(cfg, **kwargs):
    raise KINDS[sys.argv[1]](f"raised deep inside, at step 0 of {cfg.steps}")

trainer.run = deep
sys.exit(run.main(sys.argv[2:]))
"""


def _deep(tmp_path, kind, *flags):
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": "", "PYTHONPATH": ROOT}
    args = ["--workdir", str(tmp_path / "run"), "--steps", "3", *TINY, *flags]
    return subprocess.run(
        [sys.executable, "-c", DEEP, kind, *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=ROOT,
    )


def test_run_reports_a_user_error_raised_deep_inside_in_one_line(tmp_path):
    done = _deep(tmp_path, "user")
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last == "run.py: error: raised deep inside, at step 0 of 3"
    # --debug shows where it came from.
    done = _deep(tmp_path, "user", "--debug")
    assert done.returncode == 1 and "Traceback" in done.stderr and "in deep" in done.stderr


def test_run_keeps_its_exit_status_for_checkpoints_and_the_traceback_of_a_bug(tmp_path):
    done = _deep(tmp_path, "checkpoint")  # a run that cannot resume failed: 1, one line
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert done.stderr.strip().splitlines()[-1].startswith("run.py: error: raised deep inside")
    done = _deep(tmp_path, "bug")
    assert done.returncode == 1 and "Traceback" in done.stderr
    assert "RuntimeError: raised deep inside" in done.stderr


def test_run_reports_a_prompt_too_long_for_the_sampler_in_one_line(tmp_path):
    # The synthetic prompts ("226+8=", ...) are longer than 4 tokens: the rollout driver's
    # thread raises it (and the step-0 evaluation's driver, in the run's thread; the run's
    # clean-up re-raises the rollout driver's, which used to be a DriverError: exit 1).
    tiny = [a for a in TINY if not a.startswith(("sft.", "eval."))]
    args = ["--workdir", str(tmp_path / "run"), "--steps", "1", "--no-fit", "sft=none", *tiny]
    done = run_cli(*args, "sampler.max_prefill_length=4", timeout=300)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("run.py: error: prompt 'countup/") and last.endswith(
        "tokens > max_prefill_length=4 (set SamplerConfig.truncate_long_prompts=True to keep "
        "its last 4)"
    ), last


def test_eval_reports_a_user_error_raised_deep_inside_in_one_line(tmp_path):
    script = (
        "import sys\n"
        "from scalerl_jax import evaluation\n"
        "from scalerl_jax.cli import eval as cli\n"
        "from scalerl_jax.errors import UserError\n"
        "def deep(workdir):\n"
        "    raise type('NeverHeardOf', (UserError,), {})(f'{workdir}: unreadable')\n"
        "evaluation.run_config = deep\n"
        "sys.exit(cli.main(sys.argv[1:]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, "--workdir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": "", "PYTHONPATH": ROOT},
        cwd=ROOT,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert done.stderr.strip().splitlines()[-1] == f"eval.py: error: {tmp_path}: unreadable"
