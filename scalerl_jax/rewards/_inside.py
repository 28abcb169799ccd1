"""What the sandboxed processes (`_sandbox_runner.py`, `_harness.py`) and the trusted side share:
the wire format of values, line I/O, and the privilege drop. Standard library only: the two
scripts run as `python -I -S` with only this directory added to sys.path.

Wire format. Values cross between the candidate's process and the trusted side as JSON, so what
arrives is always plain data built by `json` and `decode` — never an object of the candidate's
(an `__eq__` that is always true cannot cross). JSON has no tuple, set, bytes, complex or
non-finite float, and tests compare against those (`candidate([]) == (0, 1)`), so they are
tagged: `{"$t": [...]}` tuple, `{"$s": [...]}` set, `{"$fs": [...]}` frozenset, `{"$d": [[k, v],
...]}` dict (any hashable keys), `{"$b": "hex"}` bytes, `{"$c": [re, im]}` complex, `{"$f":
"inf"}` non-finite float. Plain JSON objects never appear on the wire, so no tag can be faked by a
string key. Hand-written: pickle would run code on decode, and no JSON library keeps these types.
"""

import json
import math
import os

MAX_DEPTH = 64  # nesting of a value on the wire; deeper is refused on both sides
_SCALARS = (type(None), bool, int, str)


class WireError(ValueError):
    """A value that cannot cross: not plain data, too deep, or a malformed encoding."""


def encode(value, depth=0):
    """JSON-ready form of a plain value (types in the module docstring; numpy scalars and
    arrays via `tolist`). WireError for anything else."""
    if depth > MAX_DEPTH:
        raise WireError(f"nesting deeper than {MAX_DEPTH}")
    t = type(value)
    if t in _SCALARS:
        return value
    if t is float:
        return value if math.isfinite(value) else {"$f": repr(value)}
    if t is list:
        return [encode(v, depth + 1) for v in value]
    if t in (tuple, set, frozenset):
        tag = {tuple: "$t", set: "$s", frozenset: "$fs"}[t]
        return {tag: [encode(v, depth + 1) for v in value]}
    if t is dict:
        return {"$d": [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in value.items()]}
    if t in (bytes, bytearray):
        return {"$b": bytes(value).hex()}
    if t is complex:
        return {"$c": [encode(value.real, depth + 1), encode(value.imag, depth + 1)]}
    if getattr(t, "__module__", None) == "numpy" and hasattr(value, "tolist"):
        return encode(value.tolist(), depth + 1)
    raise WireError(f"a value of type {t.__name__} is not plain data")


def decode(obj, depth=0):
    """The value `encode` made. Builds only builtin types; WireError on anything unexpected."""
    if depth > MAX_DEPTH:
        raise WireError(f"nesting deeper than {MAX_DEPTH}")
    t = type(obj)
    if t in _SCALARS or t is float:
        return obj
    if t is list:
        return [decode(v, depth + 1) for v in obj]
    if t is not dict or len(obj) != 1:
        raise WireError(f"malformed value of type {t.__name__}")
    ((tag, body),) = obj.items()
    if tag == "$f" and body in ("inf", "-inf", "nan"):
        return float(body)
    if tag == "$b" and type(body) is str:
        try:
            return bytes.fromhex(body)
        except ValueError:
            raise WireError("malformed bytes") from None
    if type(body) is not list:
        raise WireError(f"malformed {tag!r} value")
    items = [decode(v, depth + 1) for v in body]
    try:
        if tag == "$t":
            return tuple(items)
        if tag == "$s":
            return set(items)
        if tag == "$fs":
            return frozenset(items)
        if tag == "$d" and all(type(kv) is list and len(kv) == 2 for kv in items):
            return {k: v for k, v in items}
        if tag == "$c" and len(items) == 2 and all(type(x) is float for x in items):
            return complex(*items)
    except TypeError as e:  # an unhashable member of a set or key of a dict
        raise WireError(str(e)) from None
    raise WireError(f"malformed {tag!r} value")


def loads(line, limit=None):
    """A JSON message from another process: a dict, or WireError (also for the RecursionError
    that a deeply nested document raises inside `json`)."""
    if limit is not None and len(line) > limit:
        raise WireError(f"message over {limit} bytes")
    try:
        msg = json.loads(line)
    except (ValueError, RecursionError) as e:
        raise WireError(f"unreadable message ({type(e).__name__})") from None
    if type(msg) is not dict:
        raise WireError("a message must be a JSON object")
    return msg


def dumps(msg):
    """One line of JSON, as bytes."""
    return (json.dumps(msg) + "\n").encode()


def write_all(fd, data):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def drop_privileges(uid):
    """Become `uid` (and its group) for good, with no supplementary groups: every capability
    goes with root's uid. Raises OSError when it cannot."""
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    if os.getresuid() != (uid, uid, uid) or os.getresgid() != (uid, uid, uid):
        raise OSError(f"still uid {os.getresuid()} gid {os.getresgid()} after the drop")
