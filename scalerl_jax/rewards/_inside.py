"""What the sandboxed processes (`_sandbox_runner.py`, `_harness.py`) and the trusted side share:
the wire format of values, line I/O, and the privilege drop. Standard library only: the two
scripts run as `python -I -S` with only this directory added to sys.path.

Wire format: JSON, with tagged tuple `{"$t": [...]}`, set `{"$s": ...}`, frozenset `{"$fs": ...}`,
dict `{"$d": [[k, v], ...]}`, bytes `{"$b": "hex"}`, complex `{"$c": [re, im]}` and non-finite
float `{"$f": "inf"}`; plain JSON objects never appear, so no tag can be faked. What arrives is
plain data, never an object of the candidate's (pickle would run code on decode). Decoding is
bounded before anything is built: message size, digits, nesting, value count, and set members
or dict keys that share a hash.
"""

import json
import math
import os

MAX_DEPTH = 64  # nesting of a value on the wire; deeper is refused on both sides
MAX_ITEMS = 1 << 17  # values (scalars and containers) in one decoded value
MAX_INT_DIGITS = 4300  # Python's default int-from-text limit, whatever this process set
MAX_FLOAT_CHARS = 400
MAX_SAME_HASH = 16  # set members / dict keys with one hash value
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


def decode(obj):
    """The value `encode` made. Builds only builtin types, at most MAX_ITEMS values; WireError
    on anything unexpected or over a limit."""
    return _decode(obj, 0, [MAX_ITEMS])


def _hashable_few_collisions(items):
    counts = {}
    for item in items:
        try:
            h = hash(item)
        except TypeError as e:  # an unhashable member of a set or key of a dict
            raise WireError(str(e)) from None
        counts[h] = counts.get(h, 0) + 1
        if counts[h] > MAX_SAME_HASH:
            raise WireError(f"more than {MAX_SAME_HASH} members with one hash value")


def _decode(obj, depth, budget):
    if depth > MAX_DEPTH:
        raise WireError(f"nesting deeper than {MAX_DEPTH}")
    budget[0] -= 1
    if budget[0] < 0:
        raise WireError(f"more than {MAX_ITEMS} values")
    t = type(obj)
    if t in _SCALARS or t is float:
        return obj
    if t is list:
        return [_decode(v, depth + 1, budget) for v in obj]
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
    items = [_decode(v, depth + 1, budget) for v in body]
    if tag == "$t":
        return tuple(items)
    if tag in ("$s", "$fs"):
        _hashable_few_collisions(items)
        return set(items) if tag == "$s" else frozenset(items)
    if tag == "$d" and all(type(kv) is list and len(kv) == 2 for kv in items):
        _hashable_few_collisions([k for k, _ in items])
        return {k: v for k, v in items}
    if tag == "$c" and len(items) == 2 and all(type(x) is float for x in items):
        return complex(*items)
    raise WireError(f"malformed {tag!r} value")


def _parse_int(text):
    if len(text) > MAX_INT_DIGITS + 1:
        raise WireError(f"an integer of more than {MAX_INT_DIGITS} digits")
    return int(text)


def _parse_float(text):
    if len(text) > MAX_FLOAT_CHARS:
        raise WireError(f"a number of more than {MAX_FLOAT_CHARS} characters")
    return float(text)


def loads(line, limit=None):
    """A JSON message from another process: a dict, or WireError (also for the RecursionError
    that a deeply nested document raises inside `json`)."""
    if limit is not None and len(line) > limit:
        raise WireError(f"message over {limit} bytes")
    try:
        msg = json.loads(line, parse_int=_parse_int, parse_float=_parse_float)
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
