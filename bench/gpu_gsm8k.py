"""The gsm8k recipe on one GPU for a few steps: start/end validation pass rate, tokens/s, MFU.

Issue 24, item 7: one prepared call for the first session lent a GPU (<= 8 minutes). It runs

    experiments/run.py --recipe gsm8k --hf-checkpoint SMOLLM2 --data .../gsm8k/train.jsonl
        --steps N --workdir W --colocate --no-fit eval.every_steps=E [overrides]

under a wall-clock budget, measures the device's bf16 (and fp32) matmul peak in a separate
process first, then reads W/metrics.jsonl and prints one JSON summary and a table row for
bench/README.md (with the device's name).

    python bench/gpu_gsm8k.py run --checkpoint DIR --data GSM8K_DIR/train.jsonl
    python bench/gpu_gsm8k.py run --smoke          # CPU plumbing check: testbed recipe, 2 steps
    python bench/gpu_gsm8k.py run --dry-run        # print the commands and exit

The device machines reach no network and take at most 64 MiB of files per call, less than
SmolLM2's GGUF (98 MB), so the model travels in two halves over two calls back to back (a warm
machine keeps /tmp between calls for 30 s):

    .venv/bin/python bench/gpu_gsm8k.py pack       # here, once: bench/out/gpu_a, bench/out/gpu_b
    run(carry=["bench/out/gpu_a"], timeout_s=60,
        command="python3 bench/gpu_gsm8k.py stage")
    run(carry=["bench/out/gpu_b"], timeout_s=540,
        command="PYTHONUNBUFFERED=1 python3 bench/gpu_gsm8k.py run --out $OUT")

`pack` splits the cached GGUF (`make -s fetch-model`) in two, adds gsm8k's train.jsonl and the
wheels of the pure-Python packages the project imports that the GPU image lacks (gguf for the
conversion, math-verify and its LaTeX parser, tensorboardX; `pip download --no-deps`). `stage`
copies the first half to /tmp/gpu_gsm8k. `run` finds the staged pack (or takes --checkpoint and
--data), joins and checks the GGUF (sha256), installs the wheels into /tmp/gpu_gsm8k/site,
converts the GGUF with `experiments/fetch_model.py --gguf`, then measures and runs.

Figures (from metrics.jsonl; `compute` is the trainer's ComputeMeter, model FLOPs):
* start / end pass rate: the first and the last `eval` record (step 0 and the last step, or
  the last evaluation reached when the budget stopped the run);
* RL span: from the end of the step-0 evaluation to the start of the last evaluation (every
  RL step, the first one's compilation included, and any evaluations between);
* sampled tokens/s and trainer tokens/s over that span; loop MFU = (sampler + trainer model
  FLOPs) / span / peak;
* steady trainer: steps after the first (no compilation): trainer tokens / train-step seconds,
  and its MFU at the run's FLOPs per trainer token;
* the peak is `bench/train_step.py`'s `matmul_peak` in the run's compute dtype;
* before_rl_s: from run.py's start to the RL stage's first record (start-up, the recipe's SFT
  warm-up: on an accelerator `recipes.ACCELERATOR_SIZES["gsm8k"]`, 250 steps of 32 rows, so
  the step-0 evaluation scores the SFT policy).

Evaluation here: every GSM8K test problem once (`EVAL_OVERRIDES`) every `--eval-every` steps
(default 10 of `--steps` 20); any eval key on the command line drops the recipe's accelerator
eval group (1,319 x 4 every 20 steps) as a whole.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

STAGE = "/tmp/gpu_gsm8k"
PACK_A, PACK_B = os.path.join(HERE, "out", "gpu_a"), os.path.join(HERE, "out", "gpu_b")
# GSM8K's train.jsonl, its test.jsonl beside it: --data, else the directory SCALERL_GSM8K_DIR.
DATA = os.path.join(os.environ.get("SCALERL_GSM8K_DIR", "GSM8K_DIR"), "train.jsonl")
# Pure-Python packages the project imports that the GPU image (KINDS.md) does not hold.
WHEELS = (
    "gguf==0.19.0",
    "math-verify==0.9.0",
    "latex2sympy2_extended==1.11.0",
    "antlr4-python3-runtime==4.13.2",
    "tensorboardX==2.6.5",
)
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
# Evaluation in this call: every GSM8K test problem once (standard error ~0.013). Setting any
# eval key drops the recipe's accelerator eval group (1,319 x 4 every 20 steps) as a whole.
EVAL_OVERRIDES = ["eval.num_prompts=1319", "eval.k=1"]


# ------------------------------------------------------------------------------ pack / stage
def pack(args) -> None:
    """Split the cached GGUF into bench/out/gpu_a and gpu_b with the data and the wheels."""
    from scalerl_jax.models import fetch

    gguf = args.gguf or os.path.join(fetch.cache_root(), "gguf", GGUF_NAME)
    if not os.path.isfile(gguf):
        raise SystemExit(f"gpu_gsm8k.py: {gguf} is not there: `make -s fetch-model` gets it")
    for d in (PACK_A, PACK_B):
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
    size = os.path.getsize(gguf)
    with open(gguf, "rb") as src:
        for i, d in enumerate((PACK_A, PACK_B)):
            with open(os.path.join(d, f"model.gguf.{i}"), "wb") as dst:
                dst.write(src.read(size // 2 if i == 0 else size))
    for name in ("train.jsonl", "test.jsonl"):  # the recipe validates on test.jsonl beside
        copy_into(os.path.join(os.path.dirname(args.data), name), PACK_A)
    with open(os.path.join(PACK_A, "manifest.json"), "w") as f:
        json.dump({"gguf": os.path.basename(gguf), "bytes": size, "sha256": sha256(gguf)}, f)
    wheels = os.path.join(PACK_B, "wheels")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "-q",
            "--no-deps",
            "--only-binary=:all:",
            "-d",
            wheels,
            *WHEELS,
        ],
        check=True,
    )
    for d in (PACK_A, PACK_B):
        mib = (
            sum(
                os.path.getsize(p)
                for p in glob.glob(os.path.join(d, "**"), recursive=True)
                if os.path.isfile(p)
            )
            / 2**20
        )
        print(f"{os.path.relpath(d, ROOT)}: {mib:.1f} MiB")


def sha256(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def copy_into(src: str, directory: str) -> None:
    """Copy a file or folder into `directory`, replacing what is there (read-only copies of
    the data files included)."""
    dst = os.path.join(directory, os.path.basename(src))
    if os.path.isdir(src):
        shutil.copytree(src, dst, dirs_exist_ok=True, copy_function=shutil.copyfile)
        return
    if os.path.exists(dst):
        os.remove(dst)
    shutil.copyfile(src, dst)


def stage(args) -> None:
    os.makedirs(STAGE, exist_ok=True)
    for p in glob.glob(os.path.join(PACK_A, "*")):
        copy_into(p, STAGE)
    print(f"staged {sorted(os.listdir(STAGE))} in {STAGE}")


def unpack(args) -> tuple[str, str]:
    """(HF checkpoint dir, data file) from the staged pack: join and check the GGUF, install the
    wheels (PYTHONPATH for the child processes), convert."""
    for p in glob.glob(os.path.join(PACK_B, "*")):
        copy_into(p, STAGE)
    with open(os.path.join(STAGE, "manifest.json")) as f:
        manifest = json.load(f)
    gguf = os.path.join(STAGE, manifest["gguf"])
    if not (os.path.isfile(gguf) and os.path.getsize(gguf) == manifest["bytes"]):
        with open(gguf, "wb") as dst:
            for i in (0, 1):
                with open(os.path.join(STAGE, f"model.gguf.{i}"), "rb") as src:
                    shutil.copyfileobj(src, dst, 1 << 22)
    if sha256(gguf) != manifest["sha256"]:
        raise SystemExit(
            f"gpu_gsm8k.py: {gguf} does not match the pack's sha256 (a part is "
            "missing: run `stage` with bench/out/gpu_a first)"
        )
    site = os.path.join(STAGE, "site")
    wheels = glob.glob(os.path.join(STAGE, "wheels", "*.whl"))
    if wheels and not os.path.isdir(site):
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "-q",
                "--no-index",
                "--no-deps",
                "--no-compile",
                "--target",
                site,
                *wheels,
            ],
            check=True,
        )
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (site, os.environ.get("PYTHONPATH")) if p)
    done = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "experiments", "fetch_model.py"),
            "--gguf",
            gguf,
            "--cache",
            os.path.join(STAGE, "cache"),
        ],
        capture_output=True,
        text=True,
        env=one_device_env(),
    )
    if done.returncode:
        raise SystemExit(f"gpu_gsm8k.py: conversion failed:\n{done.stderr[-3000:]}")
    return done.stdout.strip().splitlines()[-1], os.path.join(STAGE, "train.jsonl")


# ------------------------------------------------------------------------------ measure / run
PEAK_CODE = """
import json, sys
import jax, jax.numpy as jnp
from train_step import matmul_peak
d = jax.devices()[0]
print(json.dumps(dict(device=str(d.device_kind), platform=d.platform, n={n},
                      jax=jax.__version__, count=jax.device_count(),
                      float32=matmul_peak({n}, jnp.float32)[0],
                      bfloat16=matmul_peak({n}, jnp.bfloat16)[0])))
"""


def one_device_env() -> dict:
    """The environment for the child processes, without a forced host device count (a test
    session's 8 fake CPU devices): the run is the one-device run a GPU machine makes. Their
    imports: this checkout's package and bench/ (train_step), since a lent device has the
    checkout but no installed package."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, HERE, env.get("PYTHONPATH")) if p)
    flags = [
        f
        for f in env.get("XLA_FLAGS", "").split()
        if not f.startswith("--xla_force_host_platform_device_count")
    ]
    env["XLA_FLAGS"] = " ".join(flags)
    return env


def measure_peak(n: int) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", PEAK_CODE.format(n=n)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=one_device_env(),
    )
    if done.returncode:
        raise SystemExit(f"gpu_gsm8k.py: the peak measurement failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def gpu_name() -> str | None:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None


def run_command(args, checkpoint, data) -> list:
    cmd = [
        sys.executable,
        os.path.join(ROOT, "experiments", "run.py"),
        "--recipe",
        args.recipe,
        "--steps",
        str(args.steps),
        "--workdir",
        args.workdir,
        "--colocate",
        "--no-fit",
    ]
    if checkpoint:
        cmd += ["--hf-checkpoint", checkpoint]
    if data:
        cmd += ["--data", data]
    return (
        cmd
        + [f"eval.every_steps={args.eval_every}"]
        + EVAL_OVERRIDES * (not args.smoke)
        + list(args.overrides)
    )


def run_with_budget(cmd: list, budget_s: float, log_path: str) -> dict:
    """Run `cmd`, output to log_path; past budget_s send SIGTERM (run.py saves a checkpoint and
    exits), then SIGKILL after 60 s more."""
    t0, started = time.perf_counter(), time.time()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            start_new_session=True,
            env=one_device_env(),
        )
        stopped = None
        try:
            proc.wait(timeout=max(budget_s, 1))
        except subprocess.TimeoutExpired:
            stopped = "budget"
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    return dict(
        returncode=proc.returncode,
        wall_s=time.perf_counter() - t0,
        stopped=stopped,
        started=started,
    )


def read_records(path: str) -> list:
    out = []
    with open(path) as f:
        for line in f:
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:  # a torn last line of a killed run
                pass
    return out


def summarise(records: list, peak: dict) -> dict:
    """The figures of the module docstring from metrics.jsonl records and the measured peak."""
    run = next((r for r in records if r.get("event") == "run"), {})
    model = (run.get("config") or {}).get("model") or {}
    dtype = model.get("compute_dtype", "bfloat16")
    peak_flops = peak.get(dtype) or peak.get("bfloat16")
    evals = [r for r in records if r.get("event") == "eval"]
    trains = [r for r in records if r.get("event") == "train"]
    out = dict(
        model=model.get("name"),
        compute_dtype=dtype,
        peak_tflops=peak_flops / 1e12,
        steps_done=max((r["step"] for r in trains), default=0),
        evals=[
            dict(
                step=r["step"],
                pass_rate=r["pass_rate"],
                k=r.get("k"),
                num_prompts=r.get("num_prompts"),
                eval_s=r.get("eval_seconds"),
            )
            for r in evals
        ],
    )
    if evals:
        out["start_pass_rate"], out["start_step"] = evals[0]["pass_rate"], evals[0]["step"]
        out["end_pass_rate"], out["end_step"] = evals[-1]["pass_rate"], evals[-1]["step"]
    if len(evals) >= 2:
        first, last = evals[0], evals[-1]
        span = last["wall_s"] - (last.get("eval_seconds") or 0.0) - first["wall_s"]
        d = {
            k: last["compute"][k] - first["compute"][k]
            for k in ("sampler_tokens", "trainer_tokens", "sampler_flops", "trainer_flops")
        }
        out.update(
            rl_span_s=span,
            sampled_tokens=d["sampler_tokens"],
            trainer_tokens=d["trainer_tokens"],
            sampled_tok_s=d["sampler_tokens"] / span,
            trainer_tok_s=d["trainer_tokens"] / span,
            loop_mfu=(d["sampler_flops"] + d["trainer_flops"]) / span / peak_flops,
        )
        steady = [r for r in trains if r["step"] > trains[0]["step"]] if trains else []
        train_s = sum(r.get("train_s", 0.0) for r in steady)
        tokens = sum(r.get("batch_seq_tokens", 0.0) for r in steady)
        if steady and train_s > 0 and d["trainer_tokens"] > 0:
            per_token = d["trainer_flops"] / d["trainer_tokens"]
            out.update(
                steady_steps=len(steady),
                step_s_median=statistics.median(r["step_s"] for r in steady),
                train_s_median=statistics.median(r["train_s"] for r in steady),
                steady_trainer_tok_s=tokens / train_s,
                steady_trainer_mfu=tokens / train_s * per_token / peak_flops,
            )
    return out


def table_row(s: dict, device: str) -> str:
    if "end_pass_rate" not in s:
        return f"| gsm8k on {device} | `python bench/gpu_gsm8k.py run` | no evaluation recorded |"
    text = (
        f"{device}: pass rate {s['start_pass_rate']:.3f} (step {s['start_step']}) -> "
        f"{s['end_pass_rate']:.3f} (step {s['end_step']})"
    )
    if "loop_mfu" in s:
        text += (
            f"; {s['sampled_tok_s']:,.0f} sampled + {s['trainer_tok_s']:,.0f} trained "
            f"tok/s over {s['rl_span_s']:.0f} s of RL, loop MFU {100 * s['loop_mfu']:.1f}% "
            f"of {s['peak_tflops']:.0f} TFLOP/s {s['compute_dtype']}"
        )
    if "steady_trainer_mfu" in s:
        text += (
            f"; train step {s['train_s_median']:.2f} s, "
            f"{s['steady_trainer_tok_s']:,.0f} tok/s, "
            f"MFU {100 * s['steady_trainer_mfu']:.1f}%"
        )
    return f"| gsm8k on {device} | `python bench/gpu_gsm8k.py run` | {text} |"


def run(args) -> dict:
    t0 = time.perf_counter()
    if args.smoke:  # CPU: the embedded testbed recipe, no model files, a tiny evaluation
        args.recipe, checkpoint, data = "testbed", None, None
        args.steps, args.eval_every, args.peak_n = 2, 2, 256
        args.overrides = [
            "sft=none",
            "eval.num_prompts=8",
            "eval.k=1",
            "pipeline.prompts_per_step=2",
            "pipeline.generations_per_prompt=2",
            "sampler.max_concurrent_decodes=4",
        ] + list(args.overrides)
    elif args.checkpoint:
        checkpoint, data = args.checkpoint, args.data
    elif os.path.isfile(os.path.join(STAGE, "manifest.json")) and not args.dry_run:
        checkpoint, data = unpack(args)
    else:
        from scalerl_jax.models import fetch

        gguf = os.path.join(fetch.cache_root(), "gguf", GGUF_NAME)
        checkpoint = fetch.converted_dir(gguf) if os.path.isfile(gguf) else "SMOLLM2_DIR"
        data = args.data
    args.workdir = args.workdir or os.path.join(STAGE, "run")  # checkpoints: never in --out
    cmd = run_command(args, checkpoint, data)
    if args.dry_run:
        print(" ".join(cmd))
        return {"command": cmd}
    os.makedirs(args.out or STAGE, exist_ok=True)
    shutil.rmtree(args.workdir, ignore_errors=True)  # a fresh run, never a resume
    device = gpu_name()
    peak = measure_peak(args.peak_n)
    device = device or f"{peak['platform']} {peak['device']}"
    print(json.dumps(dict(device=device, peak=peak, command=cmd)), flush=True)
    budget = args.budget_s - (time.perf_counter() - t0) - 15  # 15 s to read and report
    log_path = os.path.join(args.out or STAGE, "run.log")
    res = run_with_budget(cmd, budget, log_path)
    metrics_path = os.path.join(args.workdir, "metrics.jsonl")
    if not os.path.isfile(metrics_path):
        with open(log_path) as f:
            tail = f.read()[-3000:]
        raise SystemExit(
            f"gpu_gsm8k.py: no metrics.jsonl (run.py exit {res['returncode']}, "
            f"{res['stopped'] or 'not stopped'}); its output ends:\n{tail}"
        )
    records = read_records(metrics_path)
    summary = dict(device=device, peak=peak, run=res, **summarise(records, peak))
    first_run = next((r for r in records if r.get("event") == "run"), None)
    if first_run and "time" in first_run:  # start-up, model conversion and the SFT stage
        summary["before_rl_s"] = first_run["time"] - res["started"]
    summary["total_s"] = time.perf_counter() - t0
    summary["row"] = table_row(summary, device)
    if args.out:
        with open(os.path.join(args.out, "summary.json"), "w") as f:
            json.dump(summary, f, indent=1)
        shutil.copy(metrics_path, os.path.join(args.out, "metrics.jsonl"))
    print(json.dumps({k: v for k, v in summary.items() if k != "row"}), flush=True)
    print(summary["row"])
    return summary


def main(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("action", choices=("run", "pack", "stage"))
    p.add_argument(
        "overrides",
        nargs="*",
        metavar="KEY.PATH=VALUE",
        help="more config overrides for experiments/run.py",
    )
    p.add_argument("--recipe", default="gsm8k")
    p.add_argument(
        "--checkpoint",
        help="HF checkpoint directory (default: the staged pack, "
        "else the converted SmolLM2 of `make -s fetch-model`)",
    )
    p.add_argument(
        "--data", default=DATA, help="GSM8K's train.jsonl (default: $SCALERL_GSM8K_DIR/train.jsonl)"
    )
    p.add_argument("--gguf", help="pack: this GGUF file instead of the cached SmolLM2")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--eval-every", type=int, default=10)
    p.add_argument(
        "--budget-s",
        type=float,
        default=450.0,
        help="the whole call's wall-clock budget, peak and conversion included",
    )
    p.add_argument("--peak-n", type=int, default=8192)
    p.add_argument("--workdir", help=f"run directory (default: {STAGE}/run; removed first)")
    p.add_argument("--out", help="write summary.json, metrics.jsonl and run.log here")
    p.add_argument(
        "--smoke",
        action="store_true",
        help="CPU check of the plumbing: recipe testbed, 2 steps, tiny evaluation",
    )
    p.add_argument("--dry-run", action="store_true", help="print run.py's command and exit")
    args = p.parse_intermixed_args(argv)
    return {"run": run, "pack": pack, "stage": stage}[args.action](args)


if __name__ == "__main__":
    main()
