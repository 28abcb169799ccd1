"""The loop of the online forecast's child process (scaling/forecast.py, `ProcessRunner`).

A module of its own, outside `scalerl_jax.scaling` (whose package imports JAX): the child must
choose its JAX platform and lower its priority before JAX is imported, so that its fits run on
the CPU, never on the trainer's accelerator, and give way to the training step's host work.
"""
import os
import sys


def child_main(conn, nice: int) -> None:
    os.environ["JAX_PLATFORMS"] = "cpu"
    try:
        os.nice(nice)  # the whole process, XLA's compile and compute threads included
    except OSError:
        pass
    if "jax" in sys.modules:  # a spawned child re-imports the parent's main module first
        sys.modules["jax"].config.update("jax_platforms", "cpu")
    from scalerl_jax.scaling.forecast import forecast
    conn.send("ready")
    while True:
        try:
            x, y, kwargs = conn.recv()
        except (EOFError, OSError):
            return
        try:
            result = ("ok", forecast(x, y, **kwargs))
        except Exception as e:  # noqa: BLE001 - reported to the parent as a failed forecast
            result = ("err", f"{type(e).__name__}: {e}"[:500])
        conn.send(result)
