"""Create a TPU slice, install scalerl_jax on every worker, run it, fetch logs, relaunch.

Use it through tpu/pod.sh (see tpu/README.md). Every subcommand prints each gcloud command
before running it; with DRY_RUN=1 (or --dry-run) it prints them and runs nothing, gcloud
included. Standard library only: it runs wherever gcloud does.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import shutil
import subprocess
import sys
import time
from typing import Callable, List, Optional, Sequence, Tuple

import commands as C  # tpu/commands.py: a script's own folder is first on sys.path

PROG = os.environ.get("POD_PROG", "tpu/pod.sh")


def say(msg: str) -> None:
    print(f"[pod] {msg}", file=sys.stderr, flush=True)


class Gcloud:
    """Runs argv lists (echoing each to stderr first), or only prints them to stdout (dry run)."""

    def __init__(self, dry_run: bool):
        self.dry_run = dry_run
        if not dry_run and shutil.which(C.GCLOUD) is None:
            raise C.UsageError(
                "gcloud not found on PATH: install the Google Cloud CLI "
                "(https://cloud.google.com/sdk/docs/install), or set DRY_RUN=1 "
                "to print the commands only"
            )

    def run(
        self, argv: Sequence[str], *, capture: bool = False, check: bool = True
    ) -> Tuple[int, str]:
        """Returns (exit status, captured marker lines). Captured stdout is echoed as it comes."""
        if self.dry_run:
            print(C.join(argv), flush=True)
            return 0, ""
        say("+ " + C.join(argv))
        if not capture:
            rc = subprocess.call(list(argv))
            out = ""
        else:
            proc = subprocess.Popen(list(argv), stdout=subprocess.PIPE, text=True, bufsize=1)
            lines = []
            for line in proc.stdout:  # echo while it runs: a launch lasts hours
                sys.stdout.write(line)
                sys.stdout.flush()
                if line.startswith(C.EXIT_MARKER):  # all the caller reads
                    lines.append(line)
            rc, out = proc.wait(), "".join(lines)
        if check and rc != 0:
            raise CommandFailed(argv, rc)
        return rc, out

    def state(self, argv: Sequence[str]) -> str:
        """The one-word state a describe prints; C.MISSING when the resource does not exist."""
        say("+ " + C.join(argv))
        proc = subprocess.run(list(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if proc.returncode == 0:
            return proc.stdout.strip().upper() or "UNKNOWN"
        if "NOT_FOUND" in proc.stderr or "not found" in proc.stderr.lower():
            return C.MISSING
        say(f"describe failed ({proc.returncode}): {proc.stderr.strip()[-300:]}")
        return "UNKNOWN"


class CommandFailed(RuntimeError):
    def __init__(self, argv: Sequence[str], rc: int):
        super().__init__(f"exit status {rc}: {C.join(argv)[:200]}")
        self.rc = rc


# --- subcommands ----------------------------------------------------------------------------------


def do_create(a, g: Gcloud) -> int:
    workers = C.num_workers(a.accelerator_type)
    say(
        f"{a.accelerator_type}: {workers} worker VM(s)"
        + (", queued resource" if a.queued else "")
        + (", spot" if a.spot else "")
    )
    g.run(
        C.create(
            a.name,
            a.zone,
            a.project,
            a.accelerator_type,
            version=a.version,
            spot=a.spot,
            preemptible=a.preemptible,
            queued=a.queued,
        )
    )
    if a.queued:
        if g.dry_run:
            print(f"# then, every {a.poll:g}s until it prints ACTIVE:")
            print(C.join(C.describe(a.name, a.zone, a.project, queued=True)))
            return 0
        wait_ready(a, g, recreate=False)
    return 0


def do_setup(a, g: Gcloud) -> int:
    g.run(setup_argv(a))
    return 0


def do_launch(a, g: Gcloud) -> int:
    if C.workdir_of(a.run_args) is None:
        say(
            "warning: no --workdir in the run command: the recipe's default is on each worker's "
            "boot disk, lost with the VM; relaunch needs a shared --workdir"
        )
    rc, _ = g.run(C.launch(a.name, a.zone, a.project, a.run_args), check=False)
    return rc


def do_logs(a, g: Gcloud) -> int:
    workers = a.workers or C.num_workers(a.accelerator_type)
    failed = fetch_logs(g, a, workers, a.out)
    return 1 if failed else 0


def do_stop(a, g: Gcloud) -> int:
    rc, _ = g.run(C.stop(a.name, a.zone, a.project), check=False)
    return rc


def do_status(a, g: Gcloud) -> int:
    argv = C.describe(a.name, a.zone, a.project, queued=a.queued)
    if g.dry_run:
        print(C.join(argv))
    else:
        print(g.state(argv))
    return 0


def do_delete(a, g: Gcloud) -> int:
    g.run(C.delete(a.name, a.zone, a.project, queued=a.queued))
    return 0


def setup_argv(a) -> List[str]:
    return C.setup(
        a.name,
        a.zone,
        a.project,
        a.repo,
        a.ref,
        extras=a.extras,
        python=a.python,
        setup_command=a.setup_command,
    )


def fetch_logs(g: Gcloud, a, workers: int, out: str) -> int:
    """Copies every worker's run.log to OUT/worker-W.log (8 at a time); returns the failures."""
    cmds = C.collect_logs(a.name, a.zone, a.project, workers, out)
    if g.dry_run:
        for argv in cmds:
            g.run(argv)
        return 0
    os.makedirs(out, exist_ok=True)
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        codes = list(pool.map(lambda argv: g.run(argv, check=False)[0], cmds))
    failed = sum(1 for rc in codes if rc)
    if failed:
        say(f"logs: {failed} of {workers} worker(s) failed to copy")
    say(f"logs in {out}/worker-*.log")
    return failed


# --- relaunch -------------------------------------------------------------------------------------


def wait_ready(
    a, g: Gcloud, sleep: Callable[[float], None] = time.sleep, recreate: bool = True
) -> bool:
    """Brings the TPU to READY (ACTIVE): creates it if missing, re-creates it if preempted.

    Returns True when it (re)created it, so the workers need setting up again. With
    `recreate=False` it only waits, and a missing or dead TPU is an error.
    """
    created, start, last = False, time.monotonic(), None
    while True:
        state = g.state(C.describe(a.name, a.zone, a.project, queued=a.queued))
        kind = C.state_kind(state, queued=a.queued)
        if state != last:
            say(f"{a.name}: {state}")
            last = state
        if kind == "ready":
            return created
        if not recreate and kind in ("missing", "dead"):
            raise RuntimeError(f"{a.name} is {state}; `{PROG} delete` it and create it again")
        if kind == "missing":
            g.run(
                C.create(
                    a.name,
                    a.zone,
                    a.project,
                    a.accelerator_type,
                    version=a.version,
                    spot=a.spot,
                    preemptible=a.preemptible,
                    queued=a.queued,
                )
            )
            created = True
            continue
        if kind == "dead":
            say(
                f"{a.name} is {state} (preempted, stopped or failed): deleting it to create it "
                "again"
            )
            if g.run(C.delete(a.name, a.zone, a.project, queued=a.queued), check=False)[0] == 0:
                continue
        waited = time.monotonic() - start
        if waited >= a.max_wait:
            raise RuntimeError(f"{a.name} still {state} after {waited:.0f}s (--max-wait)")
        sleep(a.poll)


def do_relaunch(a, g: Gcloud, sleep: Callable[[float], None] = time.sleep) -> int:
    """Runs the command until it succeeds, re-creating the TPU after preemption.

    Each attempt: TPU ready (created again if preempted) -> setup when new -> the same run
    command with the same --workdir, which resumes from the last checkpoint -> logs into
    OUT/attempt-N/. Stops at success, at exit status 2 (bad input: rerunning cannot help),
    or after --max-attempts; waits --backoff seconds between attempts, doubling each time.
    """
    C.check_workdir(a.run_args)
    C.num_workers(a.accelerator_type)
    if g.dry_run:
        return print_relaunch_plan(a, g)
    need_setup, backoff = True, a.backoff
    for attempt in range(1, a.max_attempts + 1):
        say(f"attempt {attempt}/{a.max_attempts}")
        rc, exits = 1, {}
        try:
            need_setup = wait_ready(a, g, sleep) or need_setup
            if need_setup:
                g.run(setup_argv(a))
                need_setup = False
            rc, out = g.run(
                C.launch(a.name, a.zone, a.project, a.run_args), capture=True, check=False
            )
            exits = C.worker_exits(out)
        except CommandFailed as err:  # create / setup failed: try again after the backoff
            say(f"attempt {attempt} failed before the run started: {err}")
        if exits or rc == 0:
            fetch_logs(
                g, a, C.num_workers(a.accelerator_type), os.path.join(a.out, f"attempt-{attempt}")
            )
        if rc == 0 and exits and all(v == 0 for v in exits.values()):
            say(f"run finished (attempt {attempt})")
            return 0
        if C.BAD_INPUT_EXIT in exits.values():
            say("run.py rejected its input (exit 2); not retrying: fix the command and relaunch")
            return C.BAD_INPUT_EXIT
        say(f"attempt {attempt} ended with status {rc}, workers {exits or 'unreachable'}")
        if attempt < a.max_attempts:
            say(
                f"retrying in {backoff:g}s with the same --workdir (it resumes from its "
                "last checkpoint)"
            )
            sleep(backoff)
            backoff = min(backoff * 2, a.max_backoff)
    say(f"giving up after {a.max_attempts} attempts")
    return 1


def print_relaunch_plan(a, g: Gcloud) -> int:
    print(
        f"# relaunch: up to {a.max_attempts} attempts, {a.backoff:g}s backoff doubling to "
        f"{a.max_backoff:g}s. Each attempt checks the state:"
    )
    print(C.join(C.describe(a.name, a.zone, a.project, queued=a.queued)))
    print("# if it is preempted / stopped / failed:")
    print(C.join(C.delete(a.name, a.zone, a.project, queued=a.queued)))
    print("# if it is missing (or was just deleted):")
    print(
        C.join(
            C.create(
                a.name,
                a.zone,
                a.project,
                a.accelerator_type,
                version=a.version,
                spot=a.spot,
                preemptible=a.preemptible,
                queued=a.queued,
            )
        )
    )
    print("# on the first attempt and after every create:")
    print(C.join(setup_argv(a)))
    print("# then the run (the same command every attempt), and its logs:")
    print(C.join(C.launch(a.name, a.zone, a.project, a.run_args)))
    for argv in C.collect_logs(
        a.name,
        a.zone,
        a.project,
        C.num_workers(a.accelerator_type),
        os.path.join(a.out, "attempt-N"),
    ):
        print(C.join(argv))
    return 0


# --- command line ---------------------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        description=__doc__.split("\n")[0],
        epilog="Arguments after -- go to experiments/run.py unchanged.",
    )
    sub = p.add_subparsers(dest="cmd", metavar="SUBCOMMAND")

    def add(name, func, help_, *groups):
        s = sub.add_parser(name, help=help_, description=help_)
        s.set_defaults(func=func)
        s.add_argument("--name", help="TPU VM (and queued resource) name")
        s.add_argument("--zone", help="e.g. us-east5-a")
        s.add_argument("--project", help="Google Cloud project id")
        s.add_argument(
            "--dry-run",
            action="store_true",
            help="print the gcloud commands, run nothing (same as DRY_RUN=1)",
        )
        for group in groups:
            group(s)
        return s

    def tpu(s):
        s.add_argument("--accelerator-type", help="e.g. v5p-256, v4-32, v5litepod-16, v6e-64")
        s.add_argument(
            "--version", help=f"TPU runtime; default per generation {C.RUNTIME_VERSIONS}"
        )
        s.add_argument("--spot", action="store_true", help="Spot capacity (preemptible)")
        s.add_argument(
            "--preemptible",
            action="store_true",
            help="legacy preemptible TPU VM (not with --queued)",
        )
        s.add_argument(
            "--queued",
            action="store_true",
            help="request it as a queued resource (waits for capacity)",
        )
        s.add_argument(
            "--poll",
            type=float,
            default=30.0,
            help="seconds between state checks while waiting (30)",
        )
        s.add_argument(
            "--max-wait",
            type=float,
            default=86400.0,
            help="give up waiting for READY/ACTIVE after this many seconds (86400)",
        )

    def install(s):
        s.add_argument("--repo", help="git URL the workers clone (must be readable from them)")
        s.add_argument("--ref", default="main", help="branch, tag or commit (main)")
        s.add_argument("--extras", default="tpu,hf", help="pip extras to install (tpu,hf)")
        s.add_argument("--python", default="3.12", help="Python version for the venv (3.12)")
        s.add_argument(
            "--setup-command",
            default="",
            help="shell run on every worker after the install, e.g. the mount "
            "of the shared workdir",
        )

    def logs(s):
        s.add_argument("--out", default="tpu-logs", help="local directory for logs (tpu-logs)")

    def queued(s):
        s.add_argument("--queued", action="store_true", help="it is a queued resource")

    add("create", do_create, "create the TPU VM or queued resource (waits until ready)", tpu)
    add("setup", do_setup, "install the package on every worker (idempotent)", install)
    add("launch", do_launch, "run experiments/run.py on every worker, SCALERL_DISTRIBUTED=auto")
    s = add("logs", do_logs, "copy every worker's log to --out/worker-W.log", logs)
    s.add_argument("--accelerator-type", help="sets the number of workers, e.g. v5p-256")
    s.add_argument("--workers", type=int, help="number of workers (instead of the type)")
    add("stop", do_stop, "SIGTERM the run on every worker (it checkpoints, exits 143)")
    add("status", do_status, "print the TPU's (or queued resource's) state", queued)
    add("delete", do_delete, "delete the TPU VM or queued resource", queued)
    s = add(
        "relaunch",
        do_relaunch,
        "launch, and after a preemption re-create, set up and run "
        "the same command again until it finishes",
        tpu,
        install,
        logs,
    )
    s.add_argument("--max-attempts", type=int, default=10, help="runs at most (10)")
    s.add_argument(
        "--backoff",
        type=float,
        default=60.0,
        help="seconds before the second attempt, doubling after (60)",
    )
    s.add_argument("--max-backoff", type=float, default=1800.0, help="backoff cap (1800)")
    return p


def parse(argv: Sequence[str]) -> argparse.Namespace:
    argv = list(argv)
    run_args: List[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, run_args = argv[:i], argv[i + 1 :]
    p = parser()
    a = p.parse_args(argv)
    if a.cmd is None:
        p.print_help(sys.stderr)
        raise C.UsageError("missing SUBCOMMAND")
    a.run_args = run_args
    if a.cmd in ("launch", "relaunch") and not run_args:
        raise C.UsageError(
            f"{a.cmd}: give the run command after --, e.g. "
            "-- --recipe scalerl --workdir /mnt/gcs/runs/r1"
        )
    if run_args and a.cmd not in ("launch", "relaunch"):
        raise C.UsageError(f"{a.cmd} takes no run command (arguments after --)")
    C.check_target(a.name, a.zone, a.project)
    if a.cmd in ("create", "relaunch"):
        if not a.accelerator_type:
            raise C.UsageError("missing --accelerator-type (e.g. --accelerator-type=v5p-256)")
        C.create(
            a.name,
            a.zone,
            a.project,
            a.accelerator_type,
            version=a.version,
            spot=a.spot,
            preemptible=a.preemptible,
            queued=a.queued,
        )  # validates
    if a.cmd in ("setup", "relaunch"):
        setup_argv(a)  # validates --repo, --ref, --extras, --python
    if a.cmd == "logs" and not a.workers:
        if not a.accelerator_type:
            raise C.UsageError("logs: give --accelerator-type (e.g. v5p-256) or --workers N")
        C.num_workers(a.accelerator_type)
    if a.cmd == "relaunch":
        C.check_workdir(run_args)
        for flag in ("max_attempts", "backoff", "max_backoff", "poll", "max_wait"):
            if getattr(a, flag) < (1 if flag == "max_attempts" else 0):
                raise C.UsageError(
                    f"--{flag.replace('_', '-')} must be "
                    f"{'>= 1' if flag == 'max_attempts' else '>= 0'}"
                )
    return a


def main(argv: Optional[Sequence[str]] = None) -> int:
    try:
        a = parse(sys.argv[1:] if argv is None else argv)
        dry = a.dry_run or os.environ.get("DRY_RUN", "") not in ("", "0")
        return a.func(a, Gcloud(dry))
    except C.UsageError as err:
        print(f"{PROG}: error: {err}", file=sys.stderr)
        return 2
    except (CommandFailed, RuntimeError) as err:
        print(f"{PROG}: failed: {err}", file=sys.stderr)
        return getattr(err, "rc", 1) or 1
    except KeyboardInterrupt:
        print(
            f"{PROG}: interrupted; a run already started keeps going on the workers "
            f"(`{PROG} stop` ends it with a checkpoint)",
            file=sys.stderr,
        )
        return 130


if __name__ == "__main__":
    sys.exit(main())
