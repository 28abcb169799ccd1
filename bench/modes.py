"""PipelineRL-k vs sync vs PPO-off-policy-k on the embedded testbed, one run each.

    python bench/modes.py                          # 120 RL steps per mode, eval every 10
    python bench/modes.py --steps 60 --target 0.5 --modes pipeline sync

All modes start from the same SFT warm-up (made once, copied into each run directory) and use
the testbed recipe otherwise unchanged, so the only difference is `pipeline.mode`. Figures per
mode, from each run's metrics.jsonl:

* samples/s: generations trained on per second of RL wall time (evaluation time excluded);
* sampler busy: 1 - mean `sampler_idle_frac` (share of time the sampler had work admitted);
* trainer busy: 1 - mean `trainer_wait_frac` (share of each step not spent waiting for data);
* time to target: RL wall seconds (evaluations excluded) until the first evaluation at or
  above `--target`, and the step it happened at;
* staleness: mean and max over steps, in policy versions.

Results go to stdout and bench/out/modes.json. The modes run one after the other on the same
machine, so quote ratios from one invocation.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys

import numpy as np

from scalerl_jax.metrics import read_metrics

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(workdir: str, *args: str) -> None:
    cmd = [
        sys.executable,
        os.path.join(ROOT, "experiments", "run.py"),
        "--workdir",
        workdir,
        "--no-fit",
        *args,
    ]
    print("$", " ".join(cmd[1:]), flush=True)
    subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)


def summarise(workdir: str, target: float) -> dict:
    log = read_metrics(workdir)
    train, evals = log.of("train"), log.of("eval")
    eval_s = {e["step"]: e["eval_seconds"] for e in evals}
    rl_start = evals[0]["wall_s"]  # after the step-0 evaluation
    # RL time at each step, evaluation time removed.
    clock, spent = {}, 0.0
    for r in train:
        spent += eval_s.get(r["step"], 0.0)
        clock[r["step"]] = r["wall_s"] - rl_start - spent
    samples = sum(r["samples_per_s"] * r["step_s"] for r in train)  # generations per step
    reached = next((e for e in evals[1:] if e["pass_rate"] >= target), None)
    return {
        "steps": len(train),
        "rl_seconds": clock[train[-1]["step"]],
        "samples_per_s": samples / clock[train[-1]["step"]],
        "sampler_busy": 1.0 - float(np.mean([r["sampler_idle_frac"] for r in train])),
        "trainer_busy": 1.0 - float(np.mean([r["trainer_wait_frac"] for r in train])),
        "staleness_mean": float(np.mean([r["staleness_mean"] for r in train])),
        "staleness_max": int(max(r["staleness_max"] for r in train)),
        "stale_groups": int(sum(r["stale_groups"] for r in train)),
        "base_pass_rate": evals[0]["pass_rate"],
        "final_pass_rate": evals[-1]["pass_rate"],
        "target_step": reached["step"] if reached else None,
        "target_seconds": clock[reached["step"]] if reached else None,
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--modes", nargs="+", default=["pipeline", "sync", "ppo_off_policy"])
    p.add_argument("--steps", type=int, default=120)
    p.add_argument("--eval-every", type=int, default=10)
    p.add_argument("--target", type=float, default=0.6, help="validation pass rate to reach")
    p.add_argument("--out", default=os.path.join(ROOT, "bench", "out", "modes"))
    args = p.parse_args(argv)
    common = [f"eval.every_steps={args.eval_every}", "--steps", str(args.steps)]
    base = os.path.join(args.out, "sft-base")
    if not os.path.exists(os.path.join(base, "sft", "summary.json")):
        shutil.rmtree(base, ignore_errors=True)
        run(base, "--steps", "1", "eval.every_steps=1")  # makes base/sft
    results = {}
    for mode in args.modes:
        workdir = os.path.join(args.out, mode)
        shutil.rmtree(workdir, ignore_errors=True)
        os.makedirs(workdir)
        shutil.copytree(os.path.join(base, "sft"), os.path.join(workdir, "sft"))
        run(workdir, f"pipeline.mode={mode}", *common)
        results[mode] = summarise(workdir, args.target)
    load = os.getloadavg()
    header = (
        "mode",
        "samples/s",
        "sampler busy",
        "trainer busy",
        "staleness mean/max",
        f"time to {args.target}",
        "base -> final",
    )
    rows = [header]
    for mode, r in results.items():
        reach = (
            f"{r['target_seconds']:.0f} s (step {r['target_step']})"
            if r["target_step"]
            else "not reached"
        )
        rows.append(
            (
                mode,
                f"{r['samples_per_s']:.1f}",
                f"{r['sampler_busy']:.2f}",
                f"{r['trainer_busy']:.2f}",
                f"{r['staleness_mean']:.1f} / {r['staleness_max']}",
                reach,
                f"{r['base_pass_rate']:.3f} -> {r['final_pass_rate']:.3f}",
            )
        )
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(header))]
    for row in rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths)))
    if "pipeline" in results and "sync" in results:
        print(
            f"pipeline / sync samples/s: "
            f"x{results['pipeline']['samples_per_s'] / results['sync']['samples_per_s']:.2f}"
        )
    print(f"load average: {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")
    with open(os.path.join(args.out, "modes.json"), "w") as f:
        json.dump({"args": vars(args), "results": results, "loadavg": load}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
