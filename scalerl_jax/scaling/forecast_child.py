"""The loop of the online forecast's child process (scaling/forecast.py, `ProcessRunner`).

The child must choose its JAX platform and lower its priority before JAX is imported, so that
its fits run on the CPU, never on the trainer's accelerator, and give way to the training
step's host work. So this module imports only the standard library, `scalerl_jax.scaling`
resolves its names lazily, and the function the child serves arrives as a "module:function"
name that is imported once the platform is set (which also keeps this module from importing
scaling/forecast.py, its parent's module).
"""

import importlib
import os
import signal
import sys


def child_main(conn, nice: int, fn: str) -> None:
    """Answer each (x, y, kwargs) from `conn` with ("ok", fn(x, y, **kwargs)) or ("err", why);
    `fn` is "package.module:function"."""
    # Ctrl-C is the parent's to handle, and it stops this child (interrupt.start_child).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    os.environ["JAX_PLATFORMS"] = "cpu"
    try:
        os.nice(nice)  # the whole process, XLA's compile and compute threads included
    except OSError:
        pass
    if "jax" in sys.modules:  # a spawned child re-imports the parent's main module first
        sys.modules["jax"].config.update("jax_platforms", "cpu")
    module, _, name = fn.partition(":")
    run = getattr(importlib.import_module(module), name)
    conn.send("ready")
    while True:
        try:
            x, y, kwargs = conn.recv()
        except (EOFError, OSError):
            return
        try:
            result = ("ok", run(x, y, **kwargs))
        except Exception as e:  # noqa: BLE001 - reported to the parent as a failed forecast
            result = ("err", f"{type(e).__name__}: {e}"[:500])
        conn.send(result)
