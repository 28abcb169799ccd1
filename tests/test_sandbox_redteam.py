"""Red team of the code sandbox: programs written to fake a pass, escape, outlive or exhaust it.

Every attack asserts that it is not accepted and that it is blocked (or returns within its
limit). Non-destructive: the programs aim only at files in this test's temporary directory, at
listeners this test starts on 127.0.0.1 and a unix socket, and at processes of the sandbox.
The escapes run in the strong mode (bubblewrap); forged passes run in both modes, since the
verdict never depends on the sandbox. `.ci/run` installs bubblewrap; without it the strong-mode
tests skip, saying so. `test_attacks_as_an_unprivileged_user` reruns a set of them as a user
without root's capabilities (through a user namespace) where the host allows one.
"""

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from scalerl_jax.rewards import SandboxLimits, extract_code, run_tests, verify_code
from scalerl_jax.rewards.code_compare import outputs_match
from scalerl_jax.rewards.sandbox import bwrap_status, owner_tag
from scalerl_jax.rewards.sandbox_policy import UID_RANGE

STRONG = SandboxLimits(timeout_s=3.0, cpu_s=3.0, total_timeout_s=8.0)
WEAK = SandboxLimits(timeout_s=3.0, cpu_s=3.0, total_timeout_s=8.0, isolation="weak")
MODES = {"strong": STRONG, "weak": WEAK}
ONE = {"inputs": [""], "outputs": ["done"]}
CALL = {"fn_name": "f", "inputs": [[1], [2]], "outputs": [2, 4]}
MBPP = {"test_list": ["assert f(1) == 2", "assert f(2) == 4"]}
HUMANEVAL = {
    "entry_point": "f",
    "test": "def check(candidate):\n    assert candidate(1) == 2\n    assert candidate(2) == 4\n",
}
ASSERT_FORMATS = {"mbpp": MBPP, "humaneval": HUMANEVAL, "call": CALL}


def _strong_or_skip():
    usable, why = bwrap_status()
    if not usable:
        pytest.skip(f"no strong sandbox on this host: {why}")


def _processes(marker: bytes) -> list:
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/cmdline", "rb") as f:
                    cmdline = f.read()
                with open(f"/proc/{name}/stat") as f:
                    state = f.read().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if marker in cmdline and state != "Z":
                found.append(int(name))
    return found


def _gone(marker: bytes, wait_s: float = 1.0) -> bool:
    deadline = time.monotonic() + wait_s  # SIGKILL is asynchronous
    while _processes(marker) and time.monotonic() < deadline:
        time.sleep(0.02)
    return not _processes(marker)


def _run(code, spec, limits):
    start = time.monotonic()
    result = run_tests(code, spec, limits)
    return result, time.monotonic() - start


# ------------------------------------------------------------------------ forged passes
FORGERIES = {
    "always_equal": "class A:\n    def __eq__(self, o): return True\n    __hash__ = None\n"
    "def f(x):\n    return A()\n",
    "always_equal_int": "class A(int):\n    def __eq__(self, o): return True\n"
    "def f(x):\n    return A(0)\n",
    "exit_before_tests": "import sys\ndef f(x):\n    return 0\nsys.exit(0)\n",
    "os_exit": "import os\ndef f(x):\n    return 0\nos._exit(0)\n",
    "exit_in_call": "import os\ndef f(x):\n    os._exit(0)\n",
    "forged_records": (
        "import os, json\n"
        "for fd in (1, 3, 4, 5, 6):\n"
        "    for rec in ({'status': 'ok', 'value': True}, {'verdict': 'ok', 'detail': ''},\n"
        "                {'i': 0, 'status': 'ok', 'detail': '', 'output': ''}):\n"
        "        try:\n            os.write(fd, (json.dumps(rec) + '\\n').encode())\n"
        "        except OSError:\n            pass\n"
        "def f(x):\n    return 0\n"
    ),
    "patched_modules": (
        "import json, builtins\n"
        'json.dumps = lambda *a, **k: \'{"status": "ok", "value": 4}\'\n'
        "json.loads = lambda *a, **k: {'status': 'ok'}\n"
        "builtins.compile = lambda *a, **k: compile('pass', '<x>', 'exec')\n"
        "AssertionError.__init__ = lambda *a: None\n"
        "def f(x):\n    return 0\n"
    ),
    "raise_base_exception": "def f(x):\n    raise KeyboardInterrupt\n",
    "deep_value": "def f(x):\n    v = []\n    for _ in range(100000):\n        v = [v]\n"
    "    return v\n",
    "wrong_types": "def f(x):\n    return str(2 * x)\n",
    "generator": "def f(x):\n    return (i for i in [2 * x])\n",
}


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("fmt", sorted(ASSERT_FORMATS))
@pytest.mark.parametrize("attack", sorted(FORGERIES))
def test_forged_passes_are_not_accepted(attack, fmt, mode):
    if mode == "strong":
        _strong_or_skip()
    result, seconds = _run(FORGERIES[attack], ASSERT_FORMATS[fmt], MODES[mode])
    assert result.passed == 0, result
    assert seconds < 8.0
    # and the honest program passes under the same spec and mode
    assert run_tests("def f(x):\n    return 2 * x\n", ASSERT_FORMATS[fmt], MODES[mode]).all_passed


def test_a_test_that_catches_exceptions_cannot_hide_a_crash():
    _strong_or_skip()
    spec = {"test_list": ["try:\n    r = f(1)\nexcept BaseException:\n    r = 2\nassert r == 2"]}
    result = run_tests("import os\ndef f(x):\n    os._exit(0)\n", spec, STRONG)
    assert result.passed == 0 and result.counts == {"crash": 1}, result
    # an exception the program raises is one failure, never the builtin type the test expects
    # (issue 34: the test must not see the program's control flow)
    spec = {"test_list": ["try:\n    f(-1)\nexcept ValueError:\n    pass\nelse:\n    assert False"]}
    result = run_tests("def f(x):\n    raise ValueError('negative')\n", spec, STRONG)
    assert result.counts == {"crash": 1} and "ValueError" in result.outcomes[0].detail, result


@pytest.mark.parametrize(
    "expected, printed, ok",
    [
        ("1000000000000000000", "1000000000000000999.0", False),
        ("1000000000000000000", "1e18", True),
        ("123456789", "123456800.0", False),
        ("12", "12.0", True),
        ("12", "12.5", False),
        ("1" * 5000, "1" * 5000, True),
        ("1" * 5000, "1" * 4999 + "2", False),
        ("0.333333", "0.3333333333", True),
        ("1e400", "1e400", True),
        ("1e400", "inf", False),
    ],
)
def test_exact_integers_and_big_numbers(expected, printed, ok):
    assert outputs_match(printed, expected) is ok
    call = (
        {"fn_name": "f", "inputs": [[]], "outputs": [int(expected)]}
        if (expected.isdigit() and len(expected) < 100)
        else None
    )
    if call and printed.replace(".", "").replace("e", "").isdigit() and ok is False:
        _strong_or_skip()
        result = run_tests(f"def f():\n    return {printed}\n", call, STRONG)
        assert result.passed == 0, result


def test_expected_outputs_cannot_be_read_from_any_process():
    """The expected output is a token only the trusted side holds; the program searches the
    memory and command lines of every process it can see for it."""
    _strong_or_skip()
    secret = "token-6f1d2a9e77"
    code = (
        "import os, re\nfound = []\nfor pid in os.listdir('/proc'):\n"
        "    if not pid.isdigit(): continue\n"
        "    for part in ('cmdline', 'environ'):\n"
        "        try: found.append(open(f'/proc/{pid}/{part}', 'rb').read())\n"
        "        except OSError: pass\n"
        "    try:\n        maps = open(f'/proc/{pid}/maps').read().splitlines()\n"
        "        mem = open(f'/proc/{pid}/mem', 'rb')\n"
        "        for line in maps:\n            a, b = (int(x, 16) for x in line.split()[0].split('-'))\n"
        "            try:\n                mem.seek(a); found.append(mem.read(min(b - a, 1 << 22)))\n"
        "            except (OSError, ValueError, OverflowError): pass\n"
        "    except OSError: pass\n"
        "blob = b''.join(found)\nm = re.search(rb'token-[0-9a-f]{10}', blob)\n"
        "print(m.group().decode() if m else 'nothing', os.getppid(), len(os.listdir('/proc')))\n"
    )
    result = run_tests(code, {"inputs": [""], "outputs": [secret]}, STRONG)
    assert result.passed == 0, result
    assert secret not in result.outcomes[0].output


def test_the_program_sees_no_other_process():
    _strong_or_skip()
    code = "import os\nprint(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))\n"
    result = run_tests(code, ONE, STRONG)
    visible = json.loads(result.outcomes[0].output)
    assert max(visible) < 10, visible  # its own PID namespace: bubblewrap, the runner, itself


# ------------------------------------------------------------------------------- escapes
def _escape_attempts(target: str, port: int, unix_path: str, abstract: str) -> str:
    """A program that tries every escape the issue lists and prints what each gave. Success is
    judged by the test on the host side: files made next to `target`, the secret's text in the
    output, a connection accepted, root's uid or a capability."""
    return f"""
import ctypes, os, socket, sqlite3, subprocess, sys
target, port = {target!r}, {port}
for how, fn in [
    ('write', lambda: open(target + '.w', 'w').write('x')),
    ('read', lambda: open(target).read()),
    ('proc_root', lambda: open('/proc/1/root' + target).read()),
    ('dir_fd', lambda: os.open('escaped.df', os.O_CREAT | os.O_WRONLY,
                               dir_fd=os.open(os.path.dirname(target), os.O_RDONLY))),
    ('sqlite_attach', lambda: sqlite3.connect(':memory:').execute(
        "ATTACH DATABASE '" + target + ".db' AS x").execute('CREATE TABLE x.t(a)')),
    ('shadow', lambda: open('/etc/shadow').read()),
    ('tcp', lambda: socket.create_connection(('127.0.0.1', port), timeout=1)),
    ('unix', lambda: socket.socket(socket.AF_UNIX).connect({unix_path!r})),
    ('abstract', lambda: socket.socket(socket.AF_UNIX).connect('\\0' + {abstract!r})),
    ('libc_open', lambda: ctypes.CDLL(None).open((target + '.c').encode(), 0o101, 0o644)),
    ('libc_read', lambda: open(target, 'rb').read() if ctypes.CDLL(None).access(
        target.encode(), 4) == 0 else None),
    ('nsenter', lambda: subprocess.run(['nsenter', '--net=/proc/1/ns/net', '--', sys.executable,
        '-c', 'import socket; socket.create_connection(("127.0.0.1", %d), timeout=1)' % port],
        capture_output=True, timeout=3).returncode),
    ('shell_write', lambda: subprocess.run(['sh', '-c', 'echo x > ' + target + '.sh; cat '
        + target], capture_output=True, timeout=3).stdout),
    ('setuid_root', lambda: os.setuid(0)),
]:
    try:
        print(how, repr(fn())[:100], flush=True)
    except BaseException as e:
        print(how, 'refused:', type(e).__name__, flush=True)
st = open('/proc/self/status').read()
caps = [l.split()[1] for l in st.splitlines() if l.startswith('CapEff')][0]
print('uid', os.getuid(), 'caps', caps, 'files', sorted(os.listdir('/')))
print('done')
"""


def test_escapes_are_blocked(tmp_path):
    _strong_or_skip()
    secret = tmp_path / "secret.txt"
    secret.write_text("root only")
    secret.chmod(0o600)
    unix_path = str(tmp_path / "listener.sock")
    abstract = f"scalerl-redteam-{os.getpid()}"
    with (
        socket.socket() as tcp,
        socket.socket(socket.AF_UNIX) as unix,
        socket.socket(socket.AF_UNIX) as abstract_server,
    ):
        for server, address in (
            (tcp, ("127.0.0.1", 0)),
            (unix, unix_path),
            (abstract_server, "\0" + abstract),
        ):
            server.bind(address)
            server.listen(4)
            server.settimeout(0.2)
        code = _escape_attempts(str(secret), tcp.getsockname()[1], unix_path, abstract)
        result, seconds = _run(code, {"inputs": [""], "outputs": ["x"]}, STRONG)
        out = result.outcomes[0].output
        assert "done" in out, result  # the program ran to the end
        for server in (tcp, unix, abstract_server):
            with pytest.raises(socket.timeout):
                server.accept()
    assert "root only" not in out, out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["listener.sock", "secret.txt"], out
    uid, caps = out.split("uid ")[1].split()[0], out.split("caps ")[1].split()[0]
    assert int(caps, 16) == 0, out
    if os.geteuid() == 0:
        assert int(uid) in UID_RANGE, out  # never root's uid: one of the sandboxes' own
    assert "setuid_root refused" in out, out
    assert seconds < 8.0


def test_no_process_outlives_the_run(tmp_path):
    """setsid + ignored SIGTERM + double fork; the daemon would write a file 1.5 s later."""
    marker = f"{time.time_ns() % 10**9}.25"
    code = (
        "import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
        f"        os.execvp('sh', ['sh', '-c', \"trap '' TERM HUP; sleep {marker}\"])\n"
        "    os._exit(0)\nprint('done', flush=True)\n"
    )
    for mode in ("strong", "weak"):
        if mode == "strong" and not bwrap_status()[0]:
            continue
        limits = SandboxLimits(timeout_s=2.0, isolation=mode)
        # the weak mode's audit hook would refuse the fork: the sweep must hold without it too
        result = run_tests(code, ONE, limits) if mode == "strong" else _weak_without_hook(code)
        assert "done" in result.outcomes[0].output, (mode, result)  # the daemon was started
        assert _gone(marker.encode()), (mode, result)


# The weak mode's audit hook refuses fork: undo it first, as the attacker did (its
# closure found through gc), so that the subreaper sweep is what is tested.
UNDO_HOOK = (
    "import gc, types\nfor o in gc.get_objects():\n"
    "    if isinstance(o, types.FunctionType) and o.__name__ == 'hook' and o.__closure__:\n"
    "        for c in o.__closure__:\n"
    "            if isinstance(c.cell_contents, (set, dict)):\n"
    "                c.cell_contents.clear()\n"
)


def _weak_without_hook(code):
    return run_tests(UNDO_HOOK + code, ONE, WEAK)


def test_sandbox_files_are_always_removed(tmp_path):
    """A file made immutable (weak mode as root can) or a full tmpfs leaves nothing behind."""
    code = (
        "import fcntl, os, struct\nopen('pinned', 'w').write('x')\n"
        "fd = os.open('pinned', os.O_RDONLY)\n"
        "try:\n    fcntl.ioctl(fd, 0x40086602, struct.pack('i', 0x10))\n"
        "except OSError as e:\n    print('no immutable flag:', e)\n"
        "print(os.getcwd(), flush=True)\n"
    )
    before = set(os.listdir("/tmp"))
    result = run_tests(code, ONE, WEAK)
    workdir = result.outcomes[0].output.strip().splitlines()[-1]
    assert workdir.startswith("/tmp/scalerl-sandbox-") and not os.path.exists(workdir)
    if bwrap_status()[0]:
        fill = "open('big', 'wb').write(b'x' * (200 << 20))\n"
        result = run_tests(fill, ONE, SandboxLimits(tmpfs_mb=16, max_file_bytes=1 << 30))
        assert result.passed == 0
    assert {p for p in set(os.listdir("/tmp")) - before if p.startswith("scalerl-")} == set()


# ------------------------------------------------------------------------ resource attacks
RESOURCE_ATTACKS = {
    "busy_loop": ("while True:\n    pass\n", {"timeout"}),
    "sleep": ("import time\ntime.sleep(60)\n", {"timeout"}),
    "memory": ("x = []\nwhile True:\n    x.append(bytearray(10 ** 7))\n", {"memory", "timeout"}),
    "output_flood": ("while True:\n    print('y' * 999)\n", {"wrong"}),
    "fork_bomb": (
        "import os\nfor _ in range(12):\n    try:\n        os.fork()\n"
        "    except OSError:\n        pass\nimport time\ntime.sleep(30)\n",
        {"timeout"},
    ),
    "thread_bomb": (
        "import threading, time\nfor _ in range(10000):\n    try:\n"
        "        threading.Thread(target=time.sleep, args=(30,)).start()\n"
        "    except RuntimeError:\n        break\ntime.sleep(30)\n",
        {"timeout"},
    ),
    "disk_fill": (
        "import itertools\nfor i in itertools.count():\n"
        "    with open(f'f{i}', 'wb') as f:\n        f.write(b'x' * (8 << 20))\n",
        {"crash"},
    ),
    "deep_recursion": (
        "import sys\nsys.setrecursionlimit(10 ** 6)\ndef r(n):\n    return r(n + 1)\nr(0)\n",
        {"crash", "memory", "timeout"},
    ),
}


@pytest.mark.parametrize("attack", sorted(RESOURCE_ATTACKS))
def test_resource_attacks_return_within_the_limit(attack, record_property):
    _strong_or_skip()
    code, statuses = RESOURCE_ATTACKS[attack]
    limits = SandboxLimits(
        timeout_s=1.5, cpu_s=2.0, memory_mb=512, max_output_bytes=1 << 16, total_timeout_s=4.0
    )
    result, seconds = _run(code, ONE, limits)
    record_property("seconds", round(seconds, 2))
    assert result.passed == 0 and set(result.counts) <= statuses, result
    assert seconds < limits.total_timeout_s + 1.0
    assert _gone(owner_tag().encode())


def test_pathological_completions_are_cheap():
    for completion in [
        "```" + " " * 120_000,
        "``` " * 50_000 + "\n",
        "```python\n" * 40_000,
        "x" * 300_000,
    ]:
        start = time.monotonic()
        code = extract_code(completion)
        assert time.monotonic() - start < 0.5
        assert code is None or len(code) <= 100_000
    deep = json.dumps({"fn_name": "f", "inputs": [[1]], "outputs": [[[[[0]]]]]})
    assert not verify_code("```python\nimport json\nprint(json.dumps([[[]]]))\n```", deep)


# ------------------------------------------------------------------ as an unprivileged user
def test_attacks_as_an_unprivileged_user(tmp_path):
    """The trainer as a user without root's capabilities (uid 1000 of a user namespace that
    maps it onto this uid): the sandbox nests its own user namespace, and the same escapes and
    forgeries fail."""
    _strong_or_skip()
    probe = subprocess.run(
        ["unshare", "--user", "--map-user=1000", "--map-group=1000", "true"], capture_output=True
    )
    if probe.returncode != 0:
        pytest.skip(f"this host gives no user namespace: {probe.stderr.decode().strip()}")
    script = tmp_path / "as_user.py"
    secret = tmp_path / "secret.txt"
    secret.write_text("x")
    script.write_text(f"""
import json, os
from scalerl_jax.rewards import SandboxLimits, run_tests
from scalerl_jax.rewards.sandbox import describe
print(describe('strong'))
lim = SandboxLimits(timeout_s=3.0, total_timeout_s=6.0)
eq = "class A:\\n    def __eq__(self, o): return True\\ndef f(x):\\n    return A()\\n"
forged = run_tests(eq, {json.dumps(MBPP)}, lim).passed
esc = run_tests("import os\\nprint(open({str(secret)!r}).read(), os.listdir('/proc'))",
                {{"inputs": [""], "outputs": ["x"]}}, lim)
honest = run_tests("def f(x):\\n    return 2 * x\\n", {json.dumps(MBPP)}, lim).all_passed
print(json.dumps({{"uid": os.geteuid(), "forged": forged, "escaped": esc.passed,
                  "isolation": esc.isolation, "honest": honest}}))
""")
    out = subprocess.run(
        ["unshare", "--user", "--map-user=1000", "--map-group=1000", sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=os.path.dirname(os.path.dirname(__file__)),
    )
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.strip().splitlines()
    assert "user namespace" in lines[0], lines
    report = json.loads(lines[-1])
    assert report["uid"] == 1000 and report["isolation"]["uid"] == 1000
    assert report == {**report, "forged": 0, "escaped": 0, "honest": True}
