"""Peer benchmark: our sampler and train step against google-tunix 0.1.7 on the same shapes.

    .venv/bin/python bench/peer.py                       # alternate ours / tunix, 3 rounds each
    .venv/bin/python bench/peer.py --rounds 5
    .venv/bin/python bench/peer.py ours                  # only our side, one JSON line
    .venv/bin/python bench/peer.py --no-train            # sampler only (tunix still runs 1 update)
    .venv/bin/python bench/peer.py --steps-per-call 4,1  # headline decode_steps_per_call 4
    .venv/bin/python bench/peer.py --only update         # the policy update only
    .venv/bin/python bench/peer.py ours --dispatch-ab 4  # our sampler, dispatch ahead vs lockstep
    .venv/bin/python bench/peer.py ours --prefill-ab 4   # batched first-fill prefill vs one by one

Shapes (issue 14): a Qwen2-shaped 8.0M-param model (hidden 256, 4 layers, 8 query / 2 KV heads,
head_dim 32, MLP 1024, vocab 8192, untied, fp32, random init) on 1 CPU device.
* sampler: 32 prompts x 64 tokens, 256 new tokens each, temperature 1, no EOS; one "call" is
  a fresh `Driver` over 32 prompts run to completion (prefills + decode + host bookkeeping), the
  same span tunix's `Sampler.__call__` covers. tokens/s = generated tokens / wall of the call.
* mixed lengths: the same sampler with `--eos` of the 8,192 ids as EOS (the random model's
  next-token distribution is near uniform, so lengths are ~geometric, capped at 256): useful
  (generated) tokens/s in the steady state of an endless prompt stream under continuous
  batching (`--mixed-steps` decode steps after the first 256). Tunix decodes every row
  of a batch until the longest row ends (256 when any row reaches the cap), so its cost per batch
  is that of the full-length call: its useful tokens/s = its measured tokens/s x mean / 256.
* train step: our jitted CISPO step (bench/train_step.py's `bench_step`) on 32 x 320 tokens
  against tunix's GRPO policy update (`RLCluster.update_actor`) on the same token count.

The driver runs our side and tunix's side as alternating subprocesses: a script you provide
(`--tunix-script PATH`, or SCALERL_TUNIX_BENCH), run by `--tunix-python` from tunix's own
virtualenv (bench/README.md, "First pass", says how to make it), so both see the same machine
load; it prints the per-round ratios, their medians and the load average before each run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SHAPE = dict(hidden=256, layers=4, heads=8, kv_heads=2, head_dim=32, mlp=1024, vocab=8192)
PROMPT, GEN, BATCH = 64, 256, 32


def model_config():
    from scalerl_jax.config import ModelConfig

    return ModelConfig(
        name="peer-qwen2-8m",
        vocab_size=SHAPE["vocab"],
        hidden_size=SHAPE["hidden"],
        intermediate_size=SHAPE["mlp"],
        num_layers=SHAPE["layers"],
        num_heads=SHAPE["heads"],
        num_kv_heads=SHAPE["kv_heads"],
        head_dim=SHAPE["head_dim"],
        qkv_bias=True,
        rope_theta=1e6,
        max_position_embeddings=PROMPT + GEN,
    )


def random_params(engine):
    """N(0, 1/fan_in) weights like tunix_bench's re-drawn init, norm scales at 1."""
    import jax
    import numpy as np

    rng = np.random.default_rng(0)

    def init(path, a):
        if "scale" in jax.tree_util.keystr(path):
            return np.ones(a.shape, a.dtype)
        fan_in = a.shape[0] if a.ndim >= 2 else 1
        return (rng.normal(0, 1, a.shape) / np.sqrt(fan_in)).astype(a.dtype)

    return engine.load_params(jax.tree.map_with_path(init, engine.abstract_params))


def sampler_setup(steps_per_call: int):
    """(SamplerConfig, Engine, params) at the peer shape on one CPU device, with every engine
    program compiled (as a run does before its first step)."""
    import jax
    import numpy as np
    from jax.sharding import Mesh

    from scalerl_jax.config import SamplerConfig
    from scalerl_jax.sampler import Driver, Engine, Prompt

    mesh = Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("data", "tensor"))
    cfg = SamplerConfig(
        max_concurrent_decodes=BATCH,
        max_prefill_length=PROMPT,
        max_target_length=PROMPT + GEN,
        max_new_tokens=GEN,
        interruptions=False,
        temperature=1.0,
        decode_steps_per_call=steps_per_call,
    )
    engine = Engine(model_config(), mesh, cfg)
    params = random_params(engine)
    Driver(engine, params, [Prompt("w", [1] * PROMPT)], group_size=1, eos_ids=[]).precompile()
    return cfg, engine, params


def sampler_call(engine, params, seed: int, **driver_kwargs):
    """One call: a fresh Driver over BATCH random prompts run to completion, no EOS ->
    (wall seconds, driver)."""
    import numpy as np

    from scalerl_jax.sampler import Driver, Prompt

    r = np.random.default_rng(seed)
    ps = [
        Prompt(f"p{seed}-{i}", r.integers(1, SHAPE["vocab"], PROMPT).tolist()) for i in range(BATCH)
    ]
    driver = Driver(engine, params, ps, group_size=1, eos_ids=[], seed=seed, **driver_kwargs)
    t0 = time.perf_counter()
    driver.run()
    return time.perf_counter() - t0, driver


def bench_sampler(args) -> dict:
    ks = [int(k) for k in str(args.steps_per_call).split(",")]
    out = bench_sampler_k(args, ks[0])
    for k in ks[1:]:  # further settings of decode_steps_per_call, same process and load
        out[f"steps_per_call_{k}"] = bench_sampler_k(args, k, mixed=False)
    return out


def bench_sampler_k(args, steps_per_call: int, mixed: bool = True) -> dict:
    _, engine, params = sampler_setup(steps_per_call)
    sampler_call(engine, params, 0)  # untimed
    full = []
    for i in range(args.sample_iters):
        wall, driver = sampler_call(engine, params, i + 1)
        full.append(
            dict(
                wall_s=wall,
                tokens=int(driver.stats["tokens"]),
                host_s=driver.stats["time_host"],
                prefill_s=driver.stats["time_prefill"],
            )
        )
    tokens = sum(r["tokens"] for r in full)
    wall = sum(r["wall_s"] for r in full)
    out = dict(
        steps_per_call=steps_per_call,
        decode_tok_s=round(tokens / wall, 1),
        call_s=[round(r["wall_s"], 3) for r in full],
        tokens_per_call=[r["tokens"] for r in full],
        step_ms=round(1e3 * wall / (GEN * len(full)), 2),
        host_frac=round(sum(r["host_s"] for r in full) / wall, 3),
        prefill_frac=round(sum(r["prefill_s"] for r in full) / wall, 3),
    )
    if args.mixed_steps and mixed:
        out["mixed"] = bench_mixed(args, engine, params)
    return out


def bench_driver_ab(rounds: int, what: str) -> dict:
    """Our sampler calls (32 prompts x 256 new tokens, one decode step per call) alternating
    a driver feature off and on in one process, `rounds` calls each: tokens/s per round and the
    median of the per-round ratios (on / off). what: "dispatch" (dispatch ahead vs lockstep) or
    "prefill" (the first fill's batched prefill vs one prompt per pass)."""
    import dataclasses

    cfg, engine, params = sampler_setup(1)
    off, on = {
        "dispatch": ({"dispatch_ahead": False}, {"dispatch_ahead": True}),
        "prefill": ({"cfg": dataclasses.replace(cfg, prefill_batch_tokens=0)}, {}),
    }[what]

    def tok_s(seed, kwargs):
        wall, driver = sampler_call(engine, params, seed, **kwargs)
        return driver.stats["tokens"] / wall

    tok_s(0, off)
    tok_s(0, on)
    res = [(tok_s(i + 1, off), tok_s(i + 1, on)) for i in range(rounds)]
    return dict(
        off_tok_s=[round(a) for a, _ in res],
        on_tok_s=[round(b) for _, b in res],
        ratio_median=round(statistics.median(b / a for a, b in res), 3),
    )


def bench_mixed(args, engine, params) -> dict:
    """Steady state on an endless prompt stream (PipelineRL never runs dry): useful tokens/s
    over `--mixed-steps` decode steps after a warm-up that fills the slots."""
    import itertools

    import numpy as np

    from scalerl_jax.sampler import Driver, Prompt

    def stream():
        r = np.random.default_rng(1000)
        for i in itertools.count():
            yield Prompt(f"m{i}", r.integers(1, SHAPE["vocab"], PROMPT).tolist())

    lengths = []
    driver = Driver(
        engine,
        params,
        stream(),
        group_size=1,
        eos_ids=list(range(args.eos)),
        on_group=lambda g: lengths.extend(len(c.tokens) for c in g.completions),
    )
    while driver.stats["decode_steps"] < GEN:  # past the first wave of (all long) completions
        driver.step()
    before, n_before = dict(driver.stats), len(lengths)
    t0 = time.perf_counter()
    while driver.stats["decode_steps"] - before["decode_steps"] < args.mixed_steps:
        driver.step()
    wall = time.perf_counter() - t0
    d = {k: driver.stats[k] - before[k] for k in before}
    done = lengths[n_before:]
    return dict(
        eos_ids=args.eos,
        decode_steps=d["decode_steps"],
        useful_tok_s=round(d["tokens"] / wall, 1),
        utilisation=round(d["tokens"] / d["slot_steps"], 3),
        completions=len(done),
        mean_len=round(float(np.mean(done)), 1),
        min_len=int(np.min(done)),
        max_len=int(np.max(done)),
        wall_s=round(wall, 2),
    )


def bench_train(args) -> dict:
    import train_step

    ns = argparse.Namespace(
        layers=SHAPE["layers"],
        d=SHAPE["hidden"],
        ffn=SHAPE["mlp"],
        heads=SHAPE["heads"],
        kv_heads=SHAPE["kv_heads"],
        vocab=SHAPE["vocab"],
        seq=PROMPT + GEN,
        rows=BATCH,
        dtype="float32",
        chunk=512,
        remat=False,
        steps=args.train_iters,
        peak_n=2048,
    )
    r = train_step.bench_step(ns)
    return dict(
        tok_s=r["tokens_per_s"],
        step_s=r["step_s"],
        mfu=r["mfu_vs_matmul_peak"],
        mfu_cpu=r["mfu_cpu_time"],
        params_M=r["params_M"],
    )


def run_ours(args) -> dict:
    import jax

    res = dict(devices=f"{jax.devices()[0].platform} x1")
    if args.dispatch_ab or args.prefill_ab:
        for what, rounds in (("dispatch", args.dispatch_ab), ("prefill", args.prefill_ab)):
            if rounds:
                res[f"{what}_ab"] = bench_driver_ab(rounds, what)
        return res
    if args.only != "update":
        res["sampler"] = bench_sampler(args)
    if not args.no_train:
        res["train_update"] = bench_train(args)
    return res


def last_json(text: str) -> dict:
    for line in reversed(text.strip().splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise RuntimeError(f"no JSON summary line in the output:\n{text[-2000:]}")


def run_sub(cmd, label) -> dict:
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if p.returncode:
        raise RuntimeError(f"{label} exited {p.returncode}:\n{p.stderr[-3000:]}")
    res = last_json(p.stdout)
    res["_load"], res["_wall"] = load, time.perf_counter() - t0
    return res


def drive(args):
    ours_cmd = [
        sys.executable,
        os.path.abspath(__file__),
        "ours",
        "--sample-iters",
        str(args.sample_iters),
        "--train-iters",
        str(args.train_iters),
        "--steps-per-call",
        str(args.steps_per_call),
        "--eos",
        str(args.eos),
        "--mixed-steps",
        str(args.mixed_steps),
        "--only",
        args.only,
    ] + (["--no-train"] if args.no_train else [])
    sample_iters = 1 if args.only == "update" else args.sample_iters  # its script needs >= 1
    tunix_cmd = [
        args.tunix_python,
        args.tunix_script,
        "--grpo-steps",
        "0",
        "--no-prefill-probe",
        "--sample-iters",
        str(sample_iters),
        "--train-iters",
        str(1 if args.no_train else args.train_iters),
    ]
    rounds = []
    for i in range(args.rounds):
        o = run_sub(ours_cmd, "ours")
        t = run_sub(tunix_cmd, "tunix")
        r = dict(round=i, load_ours=o["_load"], load_tunix=t["_load"])
        if "sampler" in o:  # absent with --only update
            r.update(
                ours_tok_s=o["sampler"]["decode_tok_s"],
                tunix_tok_s=t["sampler"]["decode_tok_s"],
                ours_step_ms=o["sampler"]["step_ms"],
            )
            r["sampler_ratio"] = r["ours_tok_s"] / r["tunix_tok_s"]
        for key, extra in o.get("sampler", {}).items():  # further decode_steps_per_call settings
            if key.startswith("steps_per_call_"):
                k = key.rsplit("_", 1)[1]
                r[f"ours_tok_s_k{k}"] = extra["decode_tok_s"]
                r[f"sampler_ratio_k{k}"] = extra["decode_tok_s"] / r["tunix_tok_s"]
        if "mixed" in o.get("sampler", {}):
            m = o["sampler"]["mixed"]
            r["mixed_ours"] = m["useful_tok_s"]
            r["mixed_tunix"] = r["tunix_tok_s"] * m["mean_len"] / GEN
            r["mixed_ratio"] = r["mixed_ours"] / r["mixed_tunix"]
            r["mixed_mean_len"] = m["mean_len"]
        if not args.no_train:
            r["ours_train_tok_s"] = o["train_update"]["tok_s"]
            r["tunix_train_tok_s"] = t["train_update"]["tok_s"]
            r["train_ratio"] = r["ours_train_tok_s"] / r["tunix_train_tok_s"]
            r["ours_mfu"] = o["train_update"]["mfu"]
            r["ours_mfu_cpu"] = o["train_update"]["mfu_cpu"]
        rounds.append(r)
        print(
            json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in r.items()}),
            flush=True,
        )
    med = {k: round(statistics.median(r[k] for r in rounds), 3) for k in rounds[0] if k != "round"}
    print("median over rounds: " + json.dumps(med))
    ks = str(args.steps_per_call).split(",")
    print(
        f"load average {min(min(r['load_ours'], r['load_tunix']) for r in rounds):.1f}-"
        f"{max(max(r['load_ours'], r['load_tunix']) for r in rounds):.1f}"
    )
    if "sampler_ratio" in med:
        print(
            f"sampler (32 x 64 prompt, 256 new), decode_steps_per_call {ks[0]}: ours "
            f"{med['ours_tok_s']:.0f} tok/s vs tunix {med['tunix_tok_s']:.0f} -> "
            f"x{med['sampler_ratio']:.2f}"
        )
    for k in ks[1:] if "sampler_ratio" in med else []:
        print(
            f"  decode_steps_per_call {k}: ours {med[f'ours_tok_s_k{k}']:.0f} tok/s -> "
            f"x{med[f'sampler_ratio_k{k}']:.2f}"
        )
    if "mixed_ratio" in med:
        print(
            f"mixed lengths (mean {med['mixed_mean_len']:.0f} of max {GEN}): useful tok/s ours "
            f"{med['mixed_ours']:.0f} vs tunix {med['mixed_tunix']:.0f} (decodes to the "
            f"longest) -> x{med['mixed_ratio']:.2f}"
        )
    if "train_ratio" in med:
        print(
            f"train update (32 x 320): ours {med['ours_train_tok_s']:.0f} tok/s vs tunix "
            f"{med['tunix_train_tok_s']:.0f} -> x{med['train_ratio']:.2f}; ours MFU "
            f"{med['ours_mfu']:.2f} of the run's matmul peak (CPU time "
            f"{med['ours_mfu_cpu']:.2f})"
        )


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("side", nargs="?", choices=("drive", "ours"), default="drive")
    p.add_argument("--rounds", type=int, default=3, help="alternations of ours / tunix")
    p.add_argument("--sample-iters", type=int, default=2, help="timed sampler calls per run")
    p.add_argument("--train-iters", type=int, default=3, help="timed update steps per run")
    p.add_argument(
        "--steps-per-call",
        default="1,4",
        help="our decode steps fused per generate() call: the first is the headline "
        "(and the mixed run's), further comma-separated values are measured in "
        "the same process (1 is the SamplerConfig default)",
    )
    p.add_argument(
        "--mixed-steps",
        type=int,
        default=512,
        help="timed decode steps of the mixed-length run (0: skip it)",
    )
    p.add_argument(
        "--eos",
        type=int,
        default=64,
        help="EOS ids among the 8,192 in the mixed run: mean length ~8192/eos",
    )
    p.add_argument("--no-train", action="store_true", help="sampler only")
    p.add_argument(
        "--only",
        choices=("all", "update"),
        default="all",
        help="update: the train update only (tunix's script still runs its sampler: "
        "one warm-up and one timed call, not reported)",
    )
    p.add_argument(
        "--dispatch-ab",
        type=int,
        default=0,
        help="with 'ours': only alternate this many sampler calls with the driver's "
        "dispatch ahead and in lockstep (one decode step per call)",
    )
    p.add_argument(
        "--prefill-ab",
        type=int,
        default=0,
        help="with 'ours': only alternate this many sampler calls with the first "
        "fill's prompts prefilled in batched passes and one per pass",
    )
    p.add_argument("--tunix-python", default="/tmp/tunix-venv/bin/python")
    p.add_argument(
        "--tunix-script",
        default=os.environ.get("SCALERL_TUNIX_BENCH"),
        help="tunix's side of the benchmark (default: $SCALERL_TUNIX_BENCH)",
    )
    args = p.parse_args()
    if args.side != "ours" and not (args.tunix_script and os.path.isfile(args.tunix_script)):
        p.error(f"--tunix-script={args.tunix_script!r}: no such file (or set SCALERL_TUNIX_BENCH)")
    if args.side == "ours":
        print(json.dumps(run_ours(args)))
    else:
        drive(args)


if __name__ == "__main__":
    main()
