"""The loop of a reward verifier child process (rewards/pool.py, `processes=True`).

A spawned child imports the module of its entry point, and the packages above it, before it
can report ready. `scalerl_jax.rewards` resolves its names lazily, so that import costs nothing;
eager, it would import SymPy and math-verify (about 1 s), paid again at every restart after a
timeout even for a verifier that needs neither. Here the child imports only what unpickling its
first verifier needs. Keep this module to the standard library.

Memory: before it imports anything heavy the child caps its own address space (RLIMIT_AS, soft
and hard, so nothing in the child can raise it again). A verifier that needs more gets a
MemoryError, which is reported as that item's error; the child then exits so that the pool
replaces it with a fresh process instead of reusing one whose heap is near the cap. Time is
bounded by the parent, which kills a child that runs past the item's limit.
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
