"""The loop of a reward verifier child process (rewards/pool.py, `processes=True`).

A module of its own, outside the `scalerl_jax.rewards` package: a spawned child imports the
module of its entry point before it can report ready, and the package would import SymPy and
math-verify (about 1 s), paid again at every restart after a timeout even for a verifier that
needs neither. Here the child imports only what unpickling its first verifier needs.
"""
import pickle


def _describe(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"[:300]


def child_main(conn) -> None:
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
            result = ("ok", bool(verifier(completion, reference)))
        except BaseException as e:  # noqa: BLE001
            result = ("err", _describe(e))
        conn.send(result)
