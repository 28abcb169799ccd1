"""tpu/: the gcloud commands for a pod (create, setup, launch, logs, relaunch), the dry runs of
tpu/pod.sh, the scripts the workers run, and the relaunch loop against a fake gcloud."""

import json
import os
import shutil
import stat
import subprocess
import sys
import textwrap
import time

import pytest
from _scripts import load_script

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TPU = os.path.join(ROOT, "tpu")
POD_SH = os.path.join(TPU, "pod.sh")


def _load(name):
    return load_script(f"tpu/{name}.py", f"tpu_{name}")


C = _load("commands")

WHERE = ["--zone=us-east5-a", "--project=my-proj"]
TARGET = ["--name", "rl", "--zone", "us-east5-a", "--project", "my-proj"]
SSH = ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "rl", *WHERE, "--worker=all"]


# --- command construction -------------------------------------------------------------------------


def test_create_tpu_vm_and_queued_resource():
    assert C.create("rl", "us-east5-a", "my-proj", "v5p-256", spot=True) == [
        "gcloud",
        "compute",
        "tpus",
        "tpu-vm",
        "create",
        "rl",
        *WHERE,
        "--accelerator-type=v5p-256",
        "--version=v2-alpha-tpuv5",
        "--spot",
    ]
    assert C.create(
        "rl", "us-east5-a", "my-proj", "v4-32", preemptible=True, version="tpu-ubuntu2204-base"
    ) == [
        "gcloud",
        "compute",
        "tpus",
        "tpu-vm",
        "create",
        "rl",
        *WHERE,
        "--accelerator-type=v4-32",
        "--version=tpu-ubuntu2204-base",
        "--preemptible",
    ]
    assert C.create("rl", "us-east5-a", "my-proj", "v6e-64", spot=True, queued=True) == [
        "gcloud",
        "compute",
        "tpus",
        "queued-resources",
        "create",
        "rl",
        "--node-id=rl",
        *WHERE,
        "--accelerator-type=v6e-64",
        "--runtime-version=v2-alpha-tpuv6e",
        "--spot",
    ]
    assert (
        C.create("rl", "us-east5-a", "my-proj", "v5litepod-16")[-1]
        == "--version=v2-alpha-tpuv5-lite"
    )


def test_describe_and_delete():
    assert C.describe("rl", "us-east5-a", "my-proj") == [
        "gcloud",
        "compute",
        "tpus",
        "tpu-vm",
        "describe",
        "rl",
        *WHERE,
        "--format=value(state)",
    ]
    assert C.describe("rl", "us-east5-a", "my-proj", queued=True) == [
        "gcloud",
        "compute",
        "tpus",
        "queued-resources",
        "describe",
        "rl",
        *WHERE,
        "--format=value(state.state)",
    ]
    assert C.delete("rl", "us-east5-a", "my-proj") == [
        "gcloud",
        "compute",
        "tpus",
        "tpu-vm",
        "delete",
        "rl",
        *WHERE,
        "--quiet",
    ]
    assert C.delete("rl", "us-east5-a", "my-proj", queued=True) == [
        "gcloud",
        "compute",
        "tpus",
        "queued-resources",
        "delete",
        "rl",
        *WHERE,
        "--force",
        "--quiet",
    ]


def test_setup_clones_the_ref_and_installs_on_all_workers():
    argv = C.setup(
        "rl",
        "us-east5-a",
        "my-proj",
        "https://github.com/org/scalerl_jax.git",
        "v1.2",
        setup_command="sudo mount -a",
    )
    assert argv[:-1] == SSH
    script = argv[-1].removeprefix("--command=")
    assert script.splitlines() == [
        "set -eu",
        'if [ -d "$HOME/scalerl_jax"/.git ]; then git -C "$HOME/scalerl_jax" remote set-url '
        "origin https://github.com/org/scalerl_jax.git; else git clone --quiet "
        'https://github.com/org/scalerl_jax.git "$HOME/scalerl_jax"; fi',
        'git -C "$HOME/scalerl_jax" fetch --quiet origin v1.2',
        'git -C "$HOME/scalerl_jax" checkout --quiet --force --detach FETCH_HEAD',
        'export PATH="$HOME/.local/bin:$PATH"',
        "command -v uv >/dev/null || python3 -m pip install --quiet --user uv "
        "|| curl -LsSf https://astral.sh/uv/install.sh | sh",
        '[ -x "$HOME/scalerl-venv"/bin/python ] || uv venv --quiet --python 3.12 '
        '"$HOME/scalerl-venv"',
        'uv pip install --quiet --python "$HOME/scalerl-venv"/bin/python '
        '-e "$HOME/scalerl_jax[tpu,hf]"',
        "sudo mount -a",
        'echo "scalerl-worker $(hostname) setup done: '
        '$(git -C "$HOME/scalerl_jax" rev-parse --short HEAD)"',
    ]


def test_launch_runs_the_same_command_everywhere_with_distributed_auto():
    argv = C.launch(
        "rl",
        "us-east5-a",
        "my-proj",
        ["--recipe", "scalerl", "--workdir", "/mnt/gcs/runs/r 1", "pipeline.max_lag=4"],
    )
    assert argv[:-1] == SSH
    lines = argv[-1].removeprefix("--command=").splitlines()
    assert (
        'SCALERL_DISTRIBUTED=auto "$HOME/scalerl-venv"/bin/python experiments/run.py '
        "--recipe scalerl --workdir '/mnt/gcs/runs/r 1' pipeline.max_lag=4 "
        '>> "$log" 2>&1 < /dev/null &'
    ) in lines
    assert 'log="$HOME/scalerl-logs/run.log"' in lines
    assert lines[-2:] == ['echo "scalerl-worker $w exit $rc"', 'exit "$rc"']


def test_logs_are_copied_from_each_worker():
    assert C.collect_logs("rl", "us-east5-a", "my-proj", 2, "out/") == [
        [
            "gcloud",
            "compute",
            "tpus",
            "tpu-vm",
            "scp",
            "rl:scalerl-logs/run.log",
            f"out/worker-{w}.log",
            f"--worker={w}",
            *WHERE,
        ]
        for w in (0, 1)
    ]


@pytest.mark.parametrize(
    "accelerator, workers",
    [
        ("v5p-8", 1),
        ("v5p-256", 32),
        ("v4-32", 4),
        ("v5litepod-8", 1),
        ("v5litepod-16", 4),
        ("v6e-256", 64),
        ("v6e-1", 1),
    ],
)
def test_workers_per_slice(accelerator, workers):
    assert C.num_workers(accelerator) == workers


@pytest.mark.parametrize(
    "accelerator, message",
    [
        ("v5p-7", "multiple of 8"),
        ("v5p-4", "multiple of 8"),
        ("v7-8", "unknown accelerator"),
        ("tpu-v5p", "unknown accelerator"),
        ("v5litepod-12", "slices come in"),
        ("", "unknown"),
    ],
)
@pytest.mark.fast
def test_bad_accelerator_types(accelerator, message):
    with pytest.raises(C.UsageError, match=message):
        C.create("rl", "us-east5-a", "my-proj", accelerator)


@pytest.mark.parametrize(
    "name, zone, project, message",
    [
        ("rl", None, "p-1", "missing --zone"),
        ("rl", "us-east5-a", "", "missing --project"),
        (None, "us-east5-a", "p-1", "missing --name"),
        ("rl", "us-east5", "p-1", "not a region"),
        ("RL_1", "us-east5-a", "p-1", "bad --name"),
    ],
)
def test_bad_targets(name, zone, project, message):
    with pytest.raises(C.UsageError, match=message):
        C.create(name, zone, project, "v5p-8")


@pytest.mark.parametrize(
    "run_args, message",
    [
        (["--steps", "5"], "needs --workdir"),
        (["--workdir", "gs://b/r"], "Cloud Storage FUSE"),
        (["--workdir=runs/r"], "boot disk"),
        (["--workdir", "/tmp/r"], "boot disk"),
        (["--workdir", "/home/me/r"], "boot disk"),
    ],
)
def test_relaunch_refuses_workdirs_lost_with_the_vm(run_args, message):
    with pytest.raises(C.UsageError, match=message):
        C.check_workdir(run_args)


def test_exit_markers_and_states():
    out = "noise\nscalerl-worker 0 exit 143\n[worker 1] x\nscalerl-worker 1 exit 0\n"
    assert C.worker_exits(out) == {"0": 143, "1": 0}
    assert [C.state_kind(s) for s in ("READY", "PREEMPTED", "CREATING", C.MISSING)] == [
        "ready",
        "dead",
        "wait",
        "missing",
    ]
    assert [
        C.state_kind(s, queued=True)
        for s in ("ACTIVE", "SUSPENDED", "FAILED", "WAITING_FOR_RESOURCES", "SUSPENDING")
    ] == ["ready", "dead", "dead", "wait", "wait"]


# --- tpu/pod.sh: dry runs and argument errors, with no gcloud on PATH ----------------------------


@pytest.fixture
def no_gcloud_env(tmp_path):
    """PATH holding only bash and python3, so any gcloud call would fail."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    os.symlink(shutil.which("bash"), bin_dir / "bash")
    os.symlink(sys.executable, bin_dir / "python3")
    env = {"PATH": str(bin_dir), "HOME": str(tmp_path), "LANG": "C.UTF-8"}
    assert shutil.which("gcloud", path=env["PATH"]) is None
    return env


def pod(args, env, dry=True):
    env = dict(env, **({"DRY_RUN": "1"} if dry else {}))
    return subprocess.run(
        [POD_SH, *args], env=env, capture_output=True, text=True, timeout=60, cwd=env["HOME"]
    )


def joined(*argvs):
    return "".join(C.join(a) + "\n" for a in argvs)


REPO = ["--repo", "https://github.com/org/scalerl_jax.git", "--ref", "abc123"]
RUN = ["--recipe", "scalerl", "--workdir", "/mnt/gcs/runs/r1"]


def test_dry_run_prints_the_exact_commands(no_gcloud_env):
    env = no_gcloud_env
    r = pod(["create", *TARGET, "--accelerator-type", "v5p-256", "--spot"], env)
    assert r.returncode == 0, r.stderr
    assert r.stdout == joined(C.create("rl", "us-east5-a", "my-proj", "v5p-256", spot=True))
    assert "32 worker VM(s)" in r.stderr

    r = pod(["create", *TARGET, "--accelerator-type", "v5p-256", "--spot", "--queued"], env)
    assert r.stdout.splitlines()[0] == C.join(
        C.create("rl", "us-east5-a", "my-proj", "v5p-256", spot=True, queued=True)
    )
    assert r.stdout.splitlines()[-1] == C.join(
        C.describe("rl", "us-east5-a", "my-proj", queued=True)
    )

    r = pod(["setup", *TARGET, *REPO], env)
    assert r.stdout == joined(C.setup("rl", "us-east5-a", "my-proj", REPO[1], REPO[3]))

    r = pod(["launch", *TARGET, "--", *RUN], env)
    assert r.returncode == 0 and r.stdout == joined(C.launch("rl", "us-east5-a", "my-proj", RUN))

    r = pod(["logs", *TARGET, "--accelerator-type", "v5p-16", "--out", "L"], env)
    assert r.stdout == joined(*C.collect_logs("rl", "us-east5-a", "my-proj", 2, "L"))
    assert not os.path.exists(os.path.join(env["HOME"], "L"))  # a dry run writes nothing

    for sub, queued in (("delete", False), ("delete", True), ("status", True)):
        r = pod([sub, *TARGET] + (["--queued"] if queued else []), env)
        build = C.delete if sub == "delete" else C.describe
        assert r.returncode == 0 and r.stdout == joined(
            build("rl", "us-east5-a", "my-proj", queued=queued)
        )

    r = pod(["stop", *TARGET], env)
    assert r.stdout == joined(C.stop("rl", "us-east5-a", "my-proj"))

    r = pod(
        [
            "relaunch",
            *TARGET,
            "--accelerator-type",
            "v5p-16",
            "--spot",
            *REPO,
            "--out",
            "L",
            "--",
            *RUN,
        ],
        env,
    )
    assert r.returncode == 0, r.stderr
    expected = [
        C.describe("rl", "us-east5-a", "my-proj"),
        C.delete("rl", "us-east5-a", "my-proj"),
        C.create("rl", "us-east5-a", "my-proj", "v5p-16", spot=True),
        C.setup("rl", "us-east5-a", "my-proj", REPO[1], REPO[3]),
        C.launch("rl", "us-east5-a", "my-proj", RUN),
        *C.collect_logs("rl", "us-east5-a", "my-proj", 2, "L/attempt-N"),
    ]
    positions = [r.stdout.find(C.join(argv)) for argv in expected]
    assert -1 not in positions and positions == sorted(positions)
    assert r.stdout.startswith("# relaunch: up to 10 attempts, 60s backoff doubling to 1800s")


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["create", "--name", "rl", "--project", "p-1", "--accelerator-type", "v5p-8"],
            "missing --zone",
        ),
        (
            ["create", "--name", "rl", "--zone", "us-east5-a", "--accelerator-type", "v5p-8"],
            "missing --project",
        ),
        (["create", *TARGET, "--accelerator-type", "v5p-12"], "multiple of 8"),
        (["create", *TARGET, "--accelerator-type", "h100-8"], "unknown accelerator type"),
        (["create", *TARGET], "missing --accelerator-type"),
        (
            ["create", *TARGET, "--accelerator-type", "v5p-8", "--queued", "--preemptible"],
            "take --spot",
        ),
        (["setup", *TARGET], "missing --repo"),
        (["launch", *TARGET], "give the run command after --"),
        (["logs", *TARGET], "--accelerator-type"),
        (
            ["relaunch", *TARGET, "--accelerator-type", "v5p-8", *REPO, "--", "--steps", "9"],
            "needs --workdir",
        ),
        (
            [
                "relaunch",
                *TARGET,
                "--accelerator-type",
                "v5p-8",
                *REPO,
                "--max-attempts",
                "0",
                "--",
                *RUN,
            ],
            "--max-attempts must be >= 1",
        ),
        (["frobnicate", *TARGET], "unknown subcommand 'frobnicate'"),
        ([], "usage: tpu/pod.sh SUBCOMMAND"),
    ],
)
def test_bad_arguments_fail_with_a_clear_error(no_gcloud_env, args, message):
    r = pod(args, no_gcloud_env)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert message in r.stderr
    assert r.stdout == ""


def test_help_and_missing_gcloud(no_gcloud_env):
    r = pod(["--help"], no_gcloud_env)
    assert r.returncode == 0 and "relaunch" in r.stdout
    r = pod(["relaunch", "--help"], no_gcloud_env)
    assert r.returncode == 0 and "--max-attempts" in r.stdout
    r = pod(["status", *TARGET], no_gcloud_env, dry=False)
    assert r.returncode == 2 and "gcloud not found on PATH" in r.stderr


# --- the scripts the workers run, run here -------------------------------------------------------


def _exe(path, text):
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


@pytest.fixture
def worker(tmp_path):
    """A fake worker: HOME with a checkout and a venv whose python reports and exits with $RC."""
    home = tmp_path / "home"
    (home / "scalerl_jax" / "experiments").mkdir(parents=True)
    (home / "scalerl-venv" / "bin").mkdir(parents=True)
    _exe(
        home / "scalerl-venv" / "bin" / "python",
        textwrap.dedent("""\
        #!/bin/sh
        trap 'echo "python got SIGTERM"; exit 143' TERM
        echo "python $* distributed=$SCALERL_DISTRIBUTED cwd=$(pwd)"
        i=0
        while [ -n "${SLEEP:-}" ] && [ "$i" -lt 300 ]; do sleep 0.1; i=$((i + 1)); done
        exit "${RC:-0}"
        """),
    )
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _exe(bin_dir / "curl", "#!/bin/sh\nexit 6\n")  # no metadata server here
    _exe(bin_dir / "hostname", "#!/bin/sh\necho host-w-3\n")
    env = {"HOME": str(home), "PATH": f"{bin_dir}:/usr/bin:/bin"}
    return home, env


@pytest.mark.parametrize("rc", [0, 143])
def test_run_script_logs_and_reports_the_exit_status(worker, rc):
    home, env = worker
    script = C.run_script(["--workdir", "/mnt/x y", "--steps", "3"])
    r = subprocess.run(
        ["sh", "-c", script], env=dict(env, RC=str(rc)), capture_output=True, text=True, timeout=30
    )
    assert r.returncode == rc
    assert r.stdout.splitlines()[-1] == f"scalerl-worker host-w-3 exit {rc}"
    assert C.worker_exits(r.stdout) == {"host-w-3": rc}
    log = (home / "scalerl-logs" / "run.log").read_text()
    assert (
        f"python experiments/run.py --workdir /mnt/x y --steps 3 distributed=auto "
        f"cwd={home}/scalerl_jax"
    ) in log
    assert f"worker host-w-3 exit {rc}" in log
    assert ("[worker host-w-3] python" in r.stdout) == (rc != 0)  # the log's tail on failure
    assert not (home / "scalerl-logs" / "run.pid").exists()


def test_run_script_stops_a_run_still_going_first(worker):
    home, env = worker
    script = C.run_script(["--workdir", "/w"])
    first = subprocess.Popen(
        ["sh", "-c", script], env=dict(env, SLEEP="1"), stdout=subprocess.PIPE, text=True
    )
    pidfile = home / "scalerl-logs" / "run.pid"
    for _ in range(100):
        if pidfile.exists() and pidfile.read_text().strip():
            break
        time.sleep(0.05)
    second = subprocess.run(
        ["sh", "-c", script], env=env, capture_output=True, text=True, timeout=30
    )
    assert second.returncode == 0
    assert "stopping run.py (pid" in second.stdout
    assert first.wait(timeout=30) == 143  # it got SIGTERM, so it would have checkpointed
    assert first.stdout.read().splitlines()[-1] == "scalerl-worker host-w-3 exit 143"
    assert "python got SIGTERM" in (home / "scalerl-logs" / "run.log").read_text()


def test_setup_script_is_idempotent(tmp_path, worker):
    home, env = worker
    shutil.rmtree(home / "scalerl_jax")
    shutil.rmtree(home / "scalerl-venv")
    src = tmp_path / "src"
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(src)]
    subprocess.run(["git", "init", "-q", str(src)], check=True)
    (src / "setup.py").write_text("v1\n")
    subprocess.run(git + ["add", "."], check=True)
    subprocess.run(git + ["commit", "-qm", "v1"], check=True)
    subprocess.run(git + ["tag", "v1"], check=True)
    (src / "setup.py").write_text("v2\n")
    subprocess.run(git + ["commit", "-qam", "v2"], check=True)
    _exe(
        home.parent / "bin" / "uv",
        textwrap.dedent("""\
        #!/bin/sh
        echo "uv $*" >> "$HOME/uv.calls"
        if [ "$1" = venv ]; then mkdir -p "$5/bin" && touch "$5/bin/python" && chmod +x "$5/bin/python"; fi
        """),
    )
    script = C.setup_script(str(src), "v1", setup_command='echo mounted > "$HOME/mount.log"')
    for _ in range(2):
        r = subprocess.run(
            ["sh", "-c", script], env=env, capture_output=True, text=True, timeout=60
        )
        assert r.returncode == 0, r.stderr
        assert "scalerl-worker host-w-3 setup done" in r.stdout
    assert (home / "scalerl_jax" / "setup.py").read_text() == "v1\n"
    calls = (home / "uv.calls").read_text().splitlines()
    assert calls[0] == f"uv venv --quiet --python 3.12 {home}/scalerl-venv"
    assert (
        calls[1:]
        == [
            f"uv pip install --quiet --python {home}/scalerl-venv/bin/python "
            f"-e {home}/scalerl_jax[tpu,hf]"
        ]
        * 2
    )  # the venv is made once
    assert (home / "mount.log").read_text() == "mounted\n"


# --- relaunch against a fake gcloud -------------------------------------------------------------

FAKE_GCLOUD = """\
#!{python}
import json, os, sys
d = os.environ["FAKE_DIR"]
args = sys.argv[1:]
with open(os.path.join(d, "calls.jsonl"), "a") as f:
    f.write(json.dumps(args) + "\\n")
path = os.path.join(d, "state")
state = open(path).read().strip()
verb = args[3]
if verb == "describe":
    if state == "MISSING":
        sys.exit(print("ERROR: (gcloud) NOT_FOUND: not found", file=sys.stderr) or 1)
    sys.exit(print(state) or 0)
if verb in ("create", "delete"):
    open(path, "w").write(os.environ["FAKE_READY"] if verb == "create" else "MISSING")
    sys.exit(0)
if verb == "scp":
    os.makedirs(os.path.dirname(args[5]), exist_ok=True)
    sys.exit(open(args[5], "w").write("log\\n") and 0)
command = [a for a in args if a.startswith("--command=")][0]
if "experiments/run.py" not in command:
    sys.exit(print("scalerl-worker t1v-w-0 setup done: abc") or 0)
runs = [json.loads(line) for line in open(os.path.join(d, "calls.jsonl"))
        if "experiments/run.py" in line]
outcomes = os.environ["FAKE_RUNS"].split(",")
outcome = outcomes[min(len(runs), len(outcomes)) - 1]
rc = {{"ok": 0, "preempt": 143, "sigterm": 143, "bad": 2}}[outcome]
for w in (0, 1):
    print(f"scalerl-worker {{w}} exit {{rc}}")
if outcome == "preempt":
    open(path, "w").write(os.environ["FAKE_DEAD"])
sys.exit(rc)
"""


def fake_pod(tmp_path, args, *, runs=("ok",), state="READY", queued=False, ready=None):
    """Runs tpu/pod.sh ARGS with the fake gcloud first on PATH; returns (result, its calls)."""
    fake = tmp_path / "fake"
    fake.mkdir()
    _exe(fake / "gcloud", FAKE_GCLOUD.format(python=sys.executable))
    (fake / "state").write_text(state)
    env = {
        "PATH": f"{fake}:{os.environ['PATH']}",
        "HOME": str(tmp_path),
        "FAKE_DIR": str(fake),
        "FAKE_RUNS": ",".join(runs),
        "FAKE_READY": ready or ("ACTIVE" if queued else "READY"),
        "FAKE_DEAD": "SUSPENDED" if queued else "PREEMPTED",
    }
    r = subprocess.run([POD_SH, *args], env=env, capture_output=True, text=True, timeout=60)
    calls = [json.loads(line) for line in (fake / "calls.jsonl").read_text().splitlines()]
    return r, calls


def relaunch(tmp_path, runs, *, state="READY", queued=False, max_attempts=5):
    args = (
        [
            "relaunch",
            *TARGET,
            "--accelerator-type",
            "v5p-16",
            "--spot",
            *REPO,
            "--backoff",
            "0",
            "--poll",
            "0",
            "--max-attempts",
            str(max_attempts),
            "--out",
            str(tmp_path / "logs"),
        ]
        + (["--queued"] if queued else [])
        + ["--", *RUN]
    )
    return fake_pod(tmp_path, args, runs=runs, state=state, queued=queued)


@pytest.mark.parametrize("ready, rc", [("ACTIVE", 0), ("FAILED", 1)])
def test_create_queued_waits_for_active(tmp_path, ready, rc):
    r, calls = fake_pod(
        tmp_path,
        ["create", *TARGET, "--accelerator-type", "v5p-8", "--spot", "--queued", "--poll", "0"],
        state="MISSING",
        ready=ready,
    )
    assert r.returncode == rc, r.stderr
    assert calls == [
        C.create("rl", "us-east5-a", "my-proj", "v5p-8", spot=True, queued=True)[1:],
        C.describe("rl", "us-east5-a", "my-proj", queued=True)[1:],
    ]
    assert (f"rl is {ready}" in r.stderr) == (rc != 0)


def _verbs(calls):
    """Each call as 'verb' plus 'setup' / 'run' for the two kinds of ssh."""
    out = []
    for c in calls:
        if c[3] == "ssh":
            out.append("run" if "experiments/run.py" in c[-1] else "setup")
        else:
            out.append(c[3])
    return out


def test_relaunch_recreates_after_preemption_and_resumes_the_same_workdir(tmp_path):
    r, calls = relaunch(tmp_path, ["preempt", "ok"])
    assert r.returncode == 0, r.stderr
    assert _verbs(calls) == [
        "describe",
        "setup",
        "run",
        "scp",
        "scp",  # attempt 1: preempted mid-run
        "describe",
        "delete",
        "describe",
        "create",
        "describe",
        "setup",
        "run",
        "scp",
        "scp",
    ]
    runs = [c for c in calls if c[3] == "ssh" and "experiments/run.py" in c[-1]]
    assert runs[0] == runs[1] == C.launch("rl", "us-east5-a", "my-proj", RUN)[1:]
    assert "--workdir /mnt/gcs/runs/r1" in runs[1][-1]
    assert [c for c in calls if c[3] == "create"] == [
        C.create("rl", "us-east5-a", "my-proj", "v5p-16", spot=True)[1:]
    ]
    assert "rl is PREEMPTED" in r.stderr and "run finished (attempt 2)" in r.stderr
    assert sorted(os.listdir(tmp_path / "logs")) == ["attempt-1", "attempt-2"]
    assert sorted(os.listdir(tmp_path / "logs" / "attempt-2")) == ["worker-0.log", "worker-1.log"]


def test_relaunch_queued_resource_after_suspension(tmp_path):
    r, calls = relaunch(tmp_path, ["preempt", "ok"], state="MISSING", queued=True)
    assert r.returncode == 0, r.stderr
    assert _verbs(calls) == [
        "describe",
        "create",
        "describe",
        "setup",
        "run",
        "scp",
        "scp",
        "describe",
        "delete",
        "describe",
        "create",
        "describe",
        "setup",
        "run",
        "scp",
        "scp",
    ]
    assert [c for c in calls if c[3] == "delete"] == [
        C.delete("rl", "us-east5-a", "my-proj", queued=True)[1:]
    ]
    assert [c for c in calls if c[3] == "create"][0] == C.create(
        "rl", "us-east5-a", "my-proj", "v5p-16", spot=True, queued=True
    )[1:]


def test_relaunch_retries_a_sigterm_on_the_same_vm_and_gives_up_when_bounded(tmp_path):
    r, calls = relaunch(tmp_path, ["sigterm"], max_attempts=3)
    assert r.returncode == 1 and "giving up after 3 attempts" in r.stderr
    assert _verbs(calls).count("run") == 3
    assert "create" not in _verbs(calls) and _verbs(calls).count("setup") == 1


def test_relaunch_stops_on_bad_input(tmp_path):
    r, calls = relaunch(tmp_path, ["bad"])
    assert r.returncode == 2 and "not retrying" in r.stderr
    assert _verbs(calls).count("run") == 1


# --- shellcheck -------------------------------------------------------------------------------


def test_shellcheck():
    if shutil.which("shellcheck") is None:
        pytest.skip(
            "shellcheck is not installed (apt-get install -y shellcheck); .ci/run installs it"
        )
    scripts = sorted(os.path.join(TPU, f) for f in os.listdir(TPU) if f.endswith(".sh"))
    assert scripts
    r = subprocess.run(["shellcheck", *scripts], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout
    for script in (
        C.run_script(["--workdir", "/w"]),
        C.stop_script(),
        C.setup_script("https://x/y.git", "main", setup_command="true"),
    ):
        r = subprocess.run(
            ["shellcheck", "-s", "sh", "-"], input=script, capture_output=True, text=True
        )
        assert r.returncode == 0, r.stdout
