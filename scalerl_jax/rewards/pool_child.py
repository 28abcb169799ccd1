"""The loop of a reward verifier child process (rewards/pool.py, `processes=True`).

Standard library only: a spawned child imports its entry point's packages before it reports
ready, and `scalerl_jax.rewards` resolves names lazily so that costs nothing (eager, SymPy and
math-verify, ~1 s, again at every restart). The child caps its own address space (RLIMIT_AS,
soft and hard) before importing anything heavy; a MemoryError is that item's error, and the
child then exits to be replaced. The parent bounds time by killing it.
"""

import os
import signal
import pickle


def _describe(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"[:300]


def limit_memory(memory_mb) -> None:
    """Cap this process's address space at `memory_mb` MiB (None: no cap)."""
    if memory_mb is None:
        return
    import resource

    # Verifiers are single-threaded; a BLAS thread pool sized to a many-core host would reserve
    # a stack per core (gigabytes of address space) when numpy is imported under the cap.
    for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[name] = "1"
    limit = int(memory_mb) << 20
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def child_main(conn, memory_mb=None) -> None:
    # Ctrl-C is the parent's to handle, and it stops this child (interrupt.start_child).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    try:
        limit_memory(memory_mb)
    except (ValueError, OSError) as e:  # the parent reports the child as not ready
        conn.send(("err", f"cannot limit memory to {memory_mb} MiB: {_describe(e)}"))
        return
    conn.send("ready")
    while True:
        try:
            payload = conn.recv_bytes()
        except (EOFError, OSError):
            return
        try:
            verifier, completion, reference = pickle.loads(payload)
        except BaseException as e:  # noqa: BLE001 - e.g. the verifier's module fails to import
            conn.send(("err", _describe(e)))
            continue
        conn.send("go")
        try:
            result: tuple[str, object] = ("ok", bool(verifier(completion, reference)))
        except MemoryError as e:
            conn.send(("oom", _describe(e) + f" (over the {memory_mb} MiB limit)"))
            return
        except BaseException as e:  # noqa: BLE001
            result = ("err", _describe(e))
        conn.send(result)
