"""The gcloud commands behind tpu/pod.sh, as pure functions returning argv lists.

Nothing here runs anything: `pod.py` executes (or, with DRY_RUN=1, prints) what these return,
and tests compare them with expected lists. Flags are the public gcloud CLI's
(`gcloud compute tpus tpu-vm ...`, `gcloud compute tpus queued-resources ...`), always with an
explicit --zone and --project so that no command depends on `gcloud config`.

On every worker the package lives in ~/scalerl_jax (a git checkout of --repo at --ref), its
virtual environment in ~/scalerl-venv and the run's output in ~/scalerl-logs/run.log. The
workdir is not here: it must be on storage every worker shares and that outlives the VMs
(see tpu/README.md), since a preempted VM's disks are gone with it.
"""

from __future__ import annotations

import re
import shlex
from typing import Dict, List, Optional, Sequence, Tuple

GCLOUD = "gcloud"
REPO_DIR = '"$HOME/scalerl_jax"'  # written into sh scripts, hence the quotes
VENV_DIR = '"$HOME/scalerl-venv"'
LOG_DIR = "scalerl-logs"  # relative to $HOME: `scp NAME:scalerl-logs/run.log` reads it there
LOG_FILE = LOG_DIR + "/run.log"
EXIT_MARKER = "scalerl-worker"  # "scalerl-worker W exit RC", one line per worker on stdout
BAD_INPUT_EXIT = 2  # run.py: bad config / data / workdir in use; re-running cannot help

# Runtime (software) version per TPU generation: Cloud TPU's recommended images for JAX.
RUNTIME_VERSIONS = {
    "v4": "tpu-ubuntu2204-base",
    "v5p": "v2-alpha-tpuv5",
    "v5litepod": "v2-alpha-tpuv5-lite",
    "v6e": "v2-alpha-tpuv6e",
}
# v4 / v5p types count TensorCores (2 per chip, 4 chips per worker VM); v5e / v6e types count
# chips (a slice of up to 8 chips is one VM, larger slices have 4 chips per VM).
_CORE_COUNTED = ("v4", "v5p")
_CHIP_SIZES = (1, 4, 8, 16, 32, 64, 128, 256)

NODE_STATES = {  # `gcloud compute tpus tpu-vm describe --format=value(state)`
    "ready": {"READY"},
    "dead": {"PREEMPTED", "TERMINATED", "STOPPED", "STOPPING"},  # delete and create again
}
QUEUED_STATES = {  # `gcloud compute tpus queued-resources describe --format=value(state.state)`
    "ready": {"ACTIVE"},
    "dead": {"FAILED", "SUSPENDED"},
}
MISSING = "MISSING"  # describe said NOT_FOUND


# Not scalerl_jax's UserError: pod.sh runs on the user's machine with any python3 >= 3.8, where
# the package is not installed (only the workers get it); pod.py's main catches this one.
class UsageError(ValueError):
    """A bad argument; the message says which and what would be accepted."""


# --- validation -----------------------------------------------------------------------------


def parse_accelerator(accelerator_type: str) -> Tuple[str, int]:
    """'v5p-256' -> ('v5p', 256), checking the size is one that generation comes in."""
    m = re.fullmatch(r"(v4|v5p|v5litepod|v6e)-(\d+)", accelerator_type or "")
    if not m:
        raise UsageError(
            f"unknown accelerator type {accelerator_type!r}: expected v4-N or v5p-N (N "
            "TensorCores, a multiple of 8, e.g. v5p-256) or v5litepod-N or v6e-N (N chips in "
            f"{_CHIP_SIZES})"
        )
    family, size = m.group(1), int(m.group(2))
    if family in _CORE_COUNTED and (size < 8 or size % 8):
        raise UsageError(
            f"{accelerator_type}: {family} sizes count TensorCores and must be a "
            f"multiple of 8 (one 4-chip worker), e.g. {family}-8, {family}-256"
        )
    if family not in _CORE_COUNTED and size not in _CHIP_SIZES:
        raise UsageError(f"{accelerator_type}: {family} slices come in {_CHIP_SIZES} chips")
    return family, size


def num_workers(accelerator_type: str) -> int:
    """Worker VMs of a slice: v5p-256 -> 32 (128 chips, 4 per VM), v5litepod-16 -> 4."""
    family, size = parse_accelerator(accelerator_type)
    if family in _CORE_COUNTED:
        return size // 8
    return 1 if size <= 8 else size // 4


def runtime_version(accelerator_type: str) -> str:
    return RUNTIME_VERSIONS[parse_accelerator(accelerator_type)[0]]


def check_target(name: Optional[str], zone: Optional[str], project: Optional[str]) -> None:
    """The three arguments every command needs, checked before anything runs."""
    if not name:
        raise UsageError("missing --name (the TPU VM's name, e.g. --name=scalerl-v5p)")
    if not re.fullmatch(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?", name):
        raise UsageError(
            f"bad --name {name!r}: lowercase letters, digits and '-', starting with "
            "a letter, at most 63 characters"
        )
    if not zone:
        raise UsageError(
            "missing --zone (e.g. --zone=us-east5-a); gcloud's default zone is "
            "never used, so every command names the same TPU"
        )
    if not re.fullmatch(r"[a-z]+-[a-z]+[0-9]+-[a-z]", zone):
        raise UsageError(
            f"bad --zone {zone!r}: expected a zone such as us-east5-a or "
            "europe-west4-b (not a region)"
        )
    if not project:
        raise UsageError(
            "missing --project (the Google Cloud project id, e.g. --project=my-project)"
        )
    if not re.fullmatch(r"[a-z0-9.:-]+", project):
        raise UsageError(f"bad --project {project!r}: a project id such as my-project-123")


def workdir_of(run_args: Sequence[str]) -> Optional[str]:
    """The value of --workdir in run.py's arguments, if any."""
    for i, arg in enumerate(run_args):
        if arg == "--workdir" and i + 1 < len(run_args):
            return run_args[i + 1]
        if arg.startswith("--workdir="):
            return arg.split("=", 1)[1]
    return None


def check_workdir(run_args: Sequence[str]) -> str:
    """Relaunching resumes only if the workdir survives the VMs: refuse ones that cannot."""
    workdir = workdir_of(run_args)
    if not workdir:
        raise UsageError(
            "the run command needs --workdir DIR on storage shared by all workers "
            "(e.g. -- --workdir /mnt/gcs/runs/r1): relaunching resumes from its "
            "checkpoints"
        )
    if workdir.startswith("gs://"):
        raise UsageError(
            f"--workdir {workdir}: run.py writes its workdir through the file system "
            "(lock file, renames); mount the bucket with Cloud Storage FUSE on every "
            "worker (setup --setup-command) and pass the mount path"
        )
    if not workdir.startswith("/") or re.match(r"/(tmp|home|root)(/|$)", workdir):
        raise UsageError(
            f"--workdir {workdir}: on a worker's boot disk the checkpoints are lost "
            "when the VM is preempted or re-created; use an absolute path on a "
            "shared mount (Cloud Storage FUSE or Filestore NFS), e.g. /mnt/gcs/run1"
        )
    return workdir


# --- gcloud commands ----------------------------------------------------------------------------


def _where(zone: str, project: str) -> List[str]:
    return [f"--zone={zone}", f"--project={project}"]


def create(
    name: str,
    zone: str,
    project: str,
    accelerator_type: str,
    *,
    version: Optional[str] = None,
    spot: bool = False,
    preemptible: bool = False,
    queued: bool = False,
) -> List[str]:
    """A TPU VM (blocks until READY) or a queued resource for one (returns once queued)."""
    check_target(name, zone, project)
    version = version or runtime_version(accelerator_type)
    if spot and preemptible:
        raise UsageError("--spot and --preemptible exclude each other (spot is the newer one)")
    if queued:
        if preemptible:
            raise UsageError("queued resources take --spot, not --preemptible")
        # The queued resource and its node share the name, so ssh/scp/describe use one name.
        argv = [
            GCLOUD,
            "compute",
            "tpus",
            "queued-resources",
            "create",
            name,
            f"--node-id={name}",
            *_where(zone, project),
            f"--accelerator-type={accelerator_type}",
            f"--runtime-version={version}",
        ]
    else:
        argv = [
            GCLOUD,
            "compute",
            "tpus",
            "tpu-vm",
            "create",
            name,
            *_where(zone, project),
            f"--accelerator-type={accelerator_type}",
            f"--version={version}",
        ]
    return argv + (["--spot"] if spot else []) + (["--preemptible"] if preemptible else [])


def describe(name: str, zone: str, project: str, *, queued: bool = False) -> List[str]:
    """Prints one word: the node's state (READY, PREEMPTED, ...) or the queued resource's."""
    check_target(name, zone, project)
    if queued:
        return [
            GCLOUD,
            "compute",
            "tpus",
            "queued-resources",
            "describe",
            name,
            *_where(zone, project),
            "--format=value(state.state)",
        ]
    return [
        GCLOUD,
        "compute",
        "tpus",
        "tpu-vm",
        "describe",
        name,
        *_where(zone, project),
        "--format=value(state)",
    ]


def delete(name: str, zone: str, project: str, *, queued: bool = False) -> List[str]:
    check_target(name, zone, project)
    if queued:  # --force deletes the node first, then the request
        return [
            GCLOUD,
            "compute",
            "tpus",
            "queued-resources",
            "delete",
            name,
            *_where(zone, project),
            "--force",
            "--quiet",
        ]
    return [GCLOUD, "compute", "tpus", "tpu-vm", "delete", name, *_where(zone, project), "--quiet"]


def ssh_all(name: str, zone: str, project: str, script: str) -> List[str]:
    """Runs `script` on every worker at once; exits with the first non-zero worker status."""
    check_target(name, zone, project)
    return [
        GCLOUD,
        "compute",
        "tpus",
        "tpu-vm",
        "ssh",
        name,
        *_where(zone, project),
        "--worker=all",
        f"--command={script}",
    ]


def setup(
    name: str,
    zone: str,
    project: str,
    repo: str,
    ref: str = "main",
    *,
    extras: str = "tpu,hf",
    python: str = "3.12",
    setup_command: str = "",
) -> List[str]:
    return ssh_all(
        name,
        zone,
        project,
        setup_script(repo, ref, extras=extras, python=python, setup_command=setup_command),
    )


def launch(name: str, zone: str, project: str, run_args: Sequence[str]) -> List[str]:
    return ssh_all(name, zone, project, run_script(run_args))


def stop(name: str, zone: str, project: str) -> List[str]:
    return ssh_all(name, zone, project, stop_script())


def collect_logs(name: str, zone: str, project: str, workers: int, out_dir: str) -> List[List[str]]:
    """One scp per worker: gcloud copies TPU -> local from a single worker per call."""
    check_target(name, zone, project)
    if workers < 1:
        raise UsageError(f"--workers must be >= 1, got {workers}")
    return [
        [
            GCLOUD,
            "compute",
            "tpus",
            "tpu-vm",
            "scp",
            f"{name}:{LOG_FILE}",
            f"{out_dir.rstrip('/') or '/'}/worker-{w}.log",
            f"--worker={w}",
            *_where(zone, project),
        ]
        for w in range(workers)
    ]


# --- scripts run on the workers (POSIX sh: the login shell runs them) ---------------------------

_WORKER_ID = (
    'w=$(curl -sf -m 5 -H "Metadata-Flavor: Google" '
    "http://metadata.google.internal/computeMetadata/v1/instance/attributes/"
    "agent-worker-number || hostname)"
)


def setup_script(
    repo: str,
    ref: str = "main",
    *,
    extras: str = "tpu,hf",
    python: str = "3.12",
    setup_command: str = "",
) -> str:
    """Idempotent install: checkout of `repo` at `ref`, a venv with uv, `pip install -e .[extras]`.

    TPU VM images ship Python 3.10 and the package needs >= 3.11, so uv provides the
    interpreter. `setup_command` (shell, run last) is where a shared workdir gets mounted.
    """
    if not repo:
        raise UsageError(
            "missing --repo: a git URL every worker can clone (e.g. "
            "https://github.com/ORG/scalerl_jax.git)"
        )
    if not ref or ref.startswith("-") or any(c.isspace() for c in ref):
        raise UsageError(f"bad --ref {ref!r}: a branch, tag or commit")
    if not re.fullmatch(r"[a-z0-9_,-]*", extras):
        raise UsageError(f"bad --extras {extras!r}: comma-separated extras such as tpu,hf")
    if not re.fullmatch(r"3\.\d+", python):
        raise UsageError(f"bad --python {python!r}: a version such as 3.12")
    target = '"$HOME/scalerl_jax' + (f"[{extras}]" if extras else "") + '"'
    lines = [
        "set -eu",
        f"if [ -d {REPO_DIR}/.git ]; then git -C {REPO_DIR} remote set-url origin "
        f"{shlex.quote(repo)}; else git clone --quiet {shlex.quote(repo)} {REPO_DIR}; fi",
        f"git -C {REPO_DIR} fetch --quiet origin {shlex.quote(ref)}",
        f"git -C {REPO_DIR} checkout --quiet --force --detach FETCH_HEAD",
        'export PATH="$HOME/.local/bin:$PATH"',
        "command -v uv >/dev/null || python3 -m pip install --quiet --user uv "
        "|| curl -LsSf https://astral.sh/uv/install.sh | sh",
        f"[ -x {VENV_DIR}/bin/python ] || uv venv --quiet --python {python} {VENV_DIR}",
        f"uv pip install --quiet --python {VENV_DIR}/bin/python -e {target}",
    ]
    if setup_command:
        lines.append(setup_command)
    lines.append(
        f'echo "{EXIT_MARKER} $(hostname) setup done: $(git -C {REPO_DIR} rev-parse --short HEAD)"'
    )
    return "\n".join(lines)


def run_script(run_args: Sequence[str]) -> str:
    """Runs run.py with SCALERL_DISTRIBUTED=auto, output to ~/scalerl-logs/run.log (appended).

    A run still going on the worker (an earlier launch whose ssh was cut) is stopped first with
    SIGTERM, which makes it checkpoint, since a TPU serves one process at a time. The last line
    on stdout is "scalerl-worker W exit RC"; on failure the log's tail comes before it.
    """
    args = " ".join(shlex.quote(a) for a in run_args)
    return "\n".join(
        [
            _WORKER_ID,
            f'mkdir -p "$HOME/{LOG_DIR}"',
            f'log="$HOME/{LOG_FILE}"',
            f'pidfile="$HOME/{LOG_DIR}/run.pid"',
            _STOP_PREVIOUS,
            f"cd {REPO_DIR} || exit 1",
            f'echo "=== $(date -u +%Y-%m-%dT%H:%M:%SZ) worker $w start: run.py {_dq(args)}" '
            '>> "$log"',
            f"SCALERL_DISTRIBUTED=auto {VENV_DIR}/bin/python experiments/run.py {args} "
            '>> "$log" 2>&1 < /dev/null &',
            "pid=$!",
            'echo "$pid" > "$pidfile"',
            'wait "$pid"',
            "rc=$?",
            'rm -f "$pidfile"',
            'echo "=== $(date -u +%Y-%m-%dT%H:%M:%SZ) worker $w exit $rc" >> "$log"',
            '[ "$rc" -eq 0 ] || tail -n 20 "$log" | sed "s/^/[worker $w] /"',
            f'echo "{EXIT_MARKER} $w exit $rc"',
            'exit "$rc"',
        ]
    )


def stop_script() -> str:
    """SIGTERM to the run on every worker: it saves a checkpoint and exits with 143."""
    return "\n".join(
        [
            _WORKER_ID,
            f'pidfile="$HOME/{LOG_DIR}/run.pid"',
            _STOP_PREVIOUS,
            f'echo "{EXIT_MARKER} $w stopped"',
        ]
    )


# Stop the run named by the pid file, if it is alive and is run.py (pids get reused).
_STOP_PREVIOUS = "\n".join(
    [
        'if [ -f "$pidfile" ]; then',
        '  old=$(cat "$pidfile")',
        '  if kill -0 "$old" 2>/dev/null && grep -q experiments/run.py "/proc/$old/cmdline"; then',
        '    echo "worker $w: stopping run.py (pid $old) with SIGTERM; it checkpoints first"',
        '    kill -TERM "$old"',
        "    i=0",
        '    while kill -0 "$old" 2>/dev/null && [ "$i" -lt 600 ]; do sleep 1; i=$((i + 1)); done',
        '    kill -KILL "$old" 2>/dev/null || true',
        "  fi",
        '  rm -f "$pidfile"',
        "fi",
    ]
)


def _dq(text: str) -> str:
    """Text made safe inside a double-quoted sh string (for the log's header line)."""
    return re.sub(r'(["$`\\])', r"\\\1", text)


# --- reading results ------------------------------------------------------------------------------


def worker_exits(stdout: str) -> Dict[str, int]:
    """Worker id -> run.py's exit status, from the marker lines of a launch's output."""
    found = re.findall(rf"^{EXIT_MARKER} (\S+) exit (\d+)\s*$", stdout, re.M)
    return {w: int(rc) for w, rc in found}


def state_kind(state: str, *, queued: bool = False) -> str:
    """'ready', 'missing', 'dead' (delete, then create again) or 'wait' (anything else)."""
    if state == MISSING:
        return "missing"
    table = QUEUED_STATES if queued else NODE_STATES
    for kind, states in table.items():
        if state in states:
            return kind
    return "wait"  # CREATING, PROVISIONING, WAITING_FOR_RESOURCES, SUSPENDING, REPAIRING, ...


def join(argv: Sequence[str]) -> str:
    """The argv as one line a shell runs unchanged (what dry-run prints)."""
    return " ".join(shlex.quote(a) for a in argv)
