#!/usr/bin/env bash
# Run scalerl_jax on a Cloud TPU slice: create it, install the package on every worker, run the
# same command on all workers, fetch their logs, relaunch after preemption. The commands are
# built by tpu/commands.py and run by tpu/pod.py; this wrapper checks the subcommand and finds
# Python. DRY_RUN=1 prints the exact gcloud commands and runs nothing. See tpu/README.md.
set -euo pipefail

USAGE='usage: tpu/pod.sh SUBCOMMAND --name NAME --zone ZONE --project PROJECT [options] [-- RUN_ARGS]

subcommands:
  create    create the TPU VM (--accelerator-type, [--spot|--preemptible], [--queued])
  setup     install the package on every worker (--repo URL [--ref REF] [--setup-command SH])
  launch    run experiments/run.py RUN_ARGS on every worker with SCALERL_DISTRIBUTED=auto
  logs      copy the log of each worker to --out/worker-W.log (--accelerator-type or --workers)
  relaunch  create/setup/launch options together; re-creates and re-runs after preemption
  stop      SIGTERM the run on every worker (it saves a checkpoint)
  status    print the state of the TPU (or queued resource)
  delete    delete the TPU VM (or, with --queued, the queued resource)

tpu/pod.sh SUBCOMMAND --help lists the options of a subcommand. DRY_RUN=1 prints the commands only.
example:
  DRY_RUN=1 tpu/pod.sh create --name rl --zone us-east5-a --project my-proj \
      --accelerator-type v5p-256 --spot'

usage() { printf '%s\n' "$USAGE"; }  # builtins only: works with a bare PATH

if [ "$#" -eq 0 ]; then
  usage >&2
  exit 2
fi
case "$1" in
  -h | --help | help)
    usage
    exit 0
    ;;
  create | setup | launch | logs | relaunch | stop | status | delete) ;;
  *)
    echo "tpu/pod.sh: error: unknown subcommand '$1'" >&2
    usage >&2
    exit 2
    ;;
esac

python="${PYTHON:-python3}"
if ! command -v "$python" >/dev/null 2>&1; then
  echo "tpu/pod.sh: error: $python not found; set PYTHON=/path/to/python3 (3.8 or newer)" >&2
  exit 2
fi
here="${BASH_SOURCE[0]%/*}"
[ "$here" = "${BASH_SOURCE[0]}" ] && here="."
export POD_PROG="tpu/pod.sh"
exec "$python" "$here/pod.py" "$@"
