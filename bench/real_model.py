"""Real-model benchmark: SmolLM2-135M on this machine, ours against transformers and tunix.

    .venv/bin/python bench/real_model.py                        # fp32 and bf16 groups, 3 rounds
    .venv/bin/python bench/real_model.py --dtypes float32 --rounds 5
    .venv/bin/python bench/real_model.py --no-tunix --slots 16  # skip the tunix virtualenv
    .venv/bin/python bench/real_model.py --checkpoint DIR       # another HF Llama checkpoint

Three sides run the same work on the same HF checkpoint (default: SmolLM2-135M-Instruct as
`make -s fetch-model` converts it, `models.fetch`):
* ours: `models.hf.load_params`, the sampler `Engine` + `Driver`, and the real CISPO step
  (`train.step.make_train_step`, fp32 master weights and AdamW, fp32 LM head);
* transformers (torch, CPU): `model.generate` with its KV cache, and forward + backward of a
  plain equivalent of the loss (log-probs of the completion tokens, ratio-weighted
  policy-gradient loss, global-norm clipping, `torch.optim.AdamW`): what TRL users run;
* tunix (google-tunix 0.1.7 in its own virtualenv, `--tunix-python`; bench/real_model_tunix.py):
  its Llama-3 model loaded from the same safetensors, its `Sampler`, and its GRPO policy update
  (`RLCluster.update_actor`, beta 0, the same clipped AdamW).

Work (identical on every side; prompts and rows come from `workload` with the round's seed):
* decode: `--slots` random prompts of `--prompt` tokens, `--new` new tokens each, sampled at
  temperature 1 from the full distribution (no top-k / top-p cut, no EOS: every row generates
  exactly `--new` tokens); tokens/s = generated tokens / wall of the whole call (prefill
  included), and per CPU-second of the process.
* train: one update on `--rows` rows of `--prompt` + `--new` tokens (the completion's `--new`
  targets carry the loss): tokens/s = rows x (prompt + new) / step wall; MFU = model FLOPs
  (`num_flops_per_token`: 6N + causal attention, LM head over every position) per second over
  the matmul peak (`bench/train_step.py`'s `matmul_peak`, 2048^3 `jnp.dot` in the row's dtype)
  measured by our worker before and after each round.

Dtype groups (`--dtypes`):
* float32: fp32 weights and compute on every side.
* bfloat16: ours as the recipes run it (fp32 masters and AdamW, bf16 compute, fp32 LM head; the
  sampler holds bf16 weights and an fp32 head); transformers twice: `bf16` = the model cast to
  bf16 (weights, AdamW state and head in bf16: cheaper than ours, not like for like) and
  `autocast` = fp32 masters, the body under `torch.autocast(bfloat16)`, the head in fp32 (like
  for like with ours; train only); tunix with its weights cast to bf16 (its Llama-3 has no
  separate compute dtype).

Each side is a long-lived worker process (one per side and dtype) that loads the model once,
compiles / warms up every operation once, then answers requests on stdin; the driver alternates
the sides request by request (the order rotates every round), so every ratio compares runs a
few seconds apart under the same machine load (the 1-minute load average is recorded before
each request). It prints one JSON line per measurement, a table of medians, per-round ratios
ours / peer (median and range), and a final JSON summary line.

What tunix 0.1.7's Llama-3 cannot take from SmolLM2 (tunix/models/llama3/model.py): its
attention calls `apply_rope` without the config's `rope_theta`, so it always rotates with
theta 1e6 (SmolLM2: 1e5). The FLOPs and every shape are the same, so its speed is SmolLM2's;
its samples are not.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MARK = "@@real_model "  # prefixes a worker's answer line (libraries may print to stdout)
DEFAULT_TUNIX_PYTHON = "/tmp/tunix-venv/bin/python"


# ------------------------------------------------------------------------------ workload
def workload_prompts(seed: int, slots: int, prompt: int, vocab: int) -> np.ndarray:
    """[slots, prompt] int32 token ids in [3, vocab) (clear of the usual special ids)."""
    return np.random.default_rng(seed).integers(3, vocab, (slots, prompt)).astype(np.int32)


def workload_rows(seed: int, rows: int, prompt: int, new: int, vocab: int) -> dict:
    """One update's rows: tokens [rows, prompt + new]; the last `new` tokens are the completion
    (position t predicts token t + 1, so targets prompt-1 .. prompt+new-2 carry the loss);
    a sampler log-prob per completion token; advantages +-1 in groups of 2 rows per prompt."""
    r = np.random.default_rng(10_000 + seed)
    tokens = r.integers(3, vocab, (rows, prompt + new)).astype(np.int32)
    adv = np.repeat(np.array([1.0, -1.0], np.float32)[None], (rows + 1) // 2, 0).ravel()[:rows]
    return dict(
        tokens=tokens,
        behaviour_logp=np.full((rows, new), -np.log(vocab), np.float32),
        advantages=adv,
        prompt_index=(np.arange(rows) // 2).astype(np.int32),
        num_prompts=(rows + 1) // 2,
    )


def read_shape(checkpoint: str) -> dict:
    """The fields of an HF Llama config.json that the three sides need."""
    with open(os.path.join(checkpoint, "config.json")) as f:
        hf = json.load(f)
    rope = (hf.get("rope_parameters") or {}).get("rope_theta", hf.get("rope_theta", 10000.0))
    heads = hf["num_attention_heads"]
    return dict(
        vocab=hf["vocab_size"],
        hidden=hf["hidden_size"],
        mlp=hf["intermediate_size"],
        layers=hf["num_hidden_layers"],
        heads=heads,
        kv_heads=hf.get("num_key_value_heads", heads),
        head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
        rope_theta=float(rope),
        norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        tied=bool(hf.get("tie_word_embeddings", False)),
    )


def default_checkpoint() -> str:
    """SmolLM2-135M-Instruct's HF directory from the local cache (no network)."""
    from scalerl_jax.models import fetch

    gguf = os.path.join(fetch.cache_root(), "gguf", os.path.basename(fetch.SMOLLM2.member))
    if not os.path.isfile(gguf):
        raise SystemExit(
            f"real_model.py: {gguf} is not there: `make -s fetch-model` gets it "
            "(or pass --checkpoint DIR)"
        )
    return fetch.from_gguf(gguf)


# ------------------------------------------------------------------------------ workers
def serve(handlers: dict) -> None:
    """Answer JSON requests from stdin, one per line, until EOF or {"op": "quit"}: each answer
    is one `MARK`-prefixed JSON line on stdout. A failing request answers {"error": ...}."""
    import traceback

    for line in sys.stdin:
        req = json.loads(line)
        if req["op"] == "quit":
            break
        try:
            out = handlers[req["op"]](req)
        except Exception as err:  # the driver reports it with the worker's log
            traceback.print_exc()
            out = {"error": f"{type(err).__name__}: {err}"}
        sys.stdout.write(MARK + json.dumps(out) + "\n")
        sys.stdout.flush()


def timed(fn):
    """(result, wall seconds, process CPU seconds) of fn()."""
    t, c = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - t, time.process_time() - c


class OursWorker:
    """Our Engine + Driver and CISPO train step on the HF checkpoint, one dtype."""

    def __init__(self, args):
        import jax
        from jax.sharding import Mesh

        from scalerl_jax.models import hf

        self.jax, self.args = jax, args
        self.cfg = hf.config_from_hf(args.checkpoint).replace(
            param_dtype="float32",
            compute_dtype=args.variant,
            fp32_head=True,
            max_position_embeddings=args.prompt + args.new + 1,
        )
        self.params = None  # loaded by the first decode request (train builds its own state)
        self.mesh = Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("data", "tensor"))
        self.engines: dict = {}
        self.step = None

    def info(self, req) -> dict:
        from scalerl_jax.models.transformer import num_flops_per_token

        a = self.args
        seq = a.prompt + a.new
        return dict(
            side="ours",
            variant=a.variant,
            params=self.cfg.num_params(),
            train_flops=num_flops_per_token(self.cfg, seq, training=True) * a.rows * seq,
            device=str(self.jax.devices()[0].device_kind),
            jax=self.jax.__version__,
        )

    def peak(self, req) -> dict:
        import jax.numpy as jnp
        from train_step import matmul_peak

        n = self.args.peak_n
        f32, b16 = matmul_peak(n, jnp.float32, 3), matmul_peak(n, jnp.bfloat16, 3)
        return dict(float32=f32[0], bfloat16=b16[0], float32_cpu=f32[1], bfloat16_cpu=b16[1])

    def decode(self, req) -> dict:
        from scalerl_jax.config import SamplerConfig
        from scalerl_jax.sampler import Driver, Engine, Prompt

        a, slots = self.args, req["slots"]
        if self.params is None:
            from scalerl_jax.models import hf

            _, _, self.params = hf.load_params(a.checkpoint, cfg=self.cfg)
        if slots not in self.engines:
            scfg = SamplerConfig(
                max_concurrent_decodes=slots,
                max_prefill_length=a.prompt,
                max_target_length=a.prompt + a.new,
                max_new_tokens=a.new,
                interruptions=False,
                temperature=1.0,
            )
            engine = Engine(self.cfg, self.mesh, scfg)
            self.engines[slots] = (engine, engine.load_params(self.params))
        engine, params = self.engines[slots]
        ids = workload_prompts(req["seed"], slots, a.prompt, self.cfg.vocab_size)
        driver = Driver(
            engine,
            params,
            [Prompt(f"p{i}", row.tolist()) for i, row in enumerate(ids)],
            group_size=1,
            eos_ids=[],
            seed=req["seed"],
        )
        _, wall, cpu = timed(driver.run)
        return dict(tokens=int(driver.stats["tokens"]), wall_s=wall, cpu_s=cpu)

    def _build_step(self):
        from scalerl_jax.config import LossConfig, MeshConfig, OptimConfig
        from scalerl_jax import mesh as mesh_lib
        from scalerl_jax.train import state as state_lib
        from scalerl_jax.train.step import make_train_step

        a = self.args
        ocfg = OptimConfig(learning_rate=1e-6, warmup_steps=0, eps=1e-8)
        mesh = mesh_lib.trainer_mesh(MeshConfig(fsdp=-1), self.jax.devices()[:1])
        _, graphdef, self.state = state_lib.create_train_state(
            self.cfg, ocfg, mesh, hf_checkpoint=a.checkpoint
        )
        _, abstract = state_lib.abstract_train_state(self.cfg, ocfg, mesh)
        self.step = make_train_step(
            graphdef,
            abstract,
            mesh,
            model_cfg=self.cfg,
            loss_cfg=LossConfig(),
            optim_cfg=ocfg,
            num_prompts=(a.rows + 1) // 2,
        )

    def train(self, req) -> dict:
        from scalerl_jax.train.batch import TrainBatch

        a = self.args
        if self.step is None:
            self._build_step()
        w = workload_rows(req["seed"], a.rows, a.prompt, a.new, self.cfg.vocab_size)
        rows, seq = w["tokens"].shape
        mask = np.zeros((rows, seq), bool)
        mask[:, a.prompt - 1 : seq - 1] = True
        blogp = np.zeros((rows, seq), np.float32)
        blogp[:, a.prompt - 1 : seq - 1] = w["behaviour_logp"]
        batch = TrainBatch(
            tokens=w["tokens"][None],
            targets=np.roll(w["tokens"], -1, axis=-1)[None],
            positions=np.broadcast_to(np.arange(seq, dtype=np.int32), (1, rows, seq)).copy(),
            segment_ids=np.ones((1, rows, seq), np.int32),
            loss_mask=mask[None],
            behaviour_logp=blogp[None],
            advantages=w["advantages"][None],
            prompt_index=w["prompt_index"][None],
            num_prompts=w["num_prompts"],
        )

        def run():
            self.state, metrics = self.step(self.state, batch)
            return self.jax.device_get(metrics)

        metrics, wall, cpu = timed(run)
        return dict(
            tokens=rows * seq,
            wall_s=wall,
            cpu_s=cpu,
            loss=float(metrics["loss"]),
            skipped=float(metrics["skipped"]),
        )


class TorchWorker:
    """transformers' LlamaForCausalLM on the CPU, one variant: float32, bf16 (the model cast to
    bfloat16) or autocast (fp32 weights, bf16 autocast body, fp32 head; train only)."""

    def __init__(self, args):
        import torch
        import transformers

        self.torch, self.args = torch, args
        torch.manual_seed(0)
        self.model = transformers.AutoModelForCausalLM.from_pretrained(
            args.checkpoint, dtype=torch.float32
        )
        if args.variant == "bf16":
            self.model.to(torch.bfloat16)
        self.model.train()  # Llama has no dropout: train() only matters for autograd hooks
        self.vocab = self.model.config.vocab_size
        self.opt = None

    def info(self, req) -> dict:
        import transformers

        t = self.torch
        return dict(
            side="transformers",
            variant=self.args.variant,
            params=sum(p.numel() for p in self.model.parameters()),
            threads=t.get_num_threads(),
            torch=t.__version__,
            transformers=transformers.__version__,
            attention=self.model.config._attn_implementation,
        )

    def peak(self, req) -> dict:
        t, n = self.torch, self.args.peak_n
        out = {}
        for name, dt in (("float32", t.float32), ("bfloat16", t.bfloat16)):
            a, b = t.ones(n, n, dtype=dt), t.ones(n, n, dtype=dt)
            t.mm(a, b)
            out[name] = 2.0 * n**3 / min(timed(lambda: t.mm(a, b))[1] for _ in range(3))
        return out

    def decode(self, req) -> dict:
        import transformers

        t, a = self.torch, self.args
        ids = t.from_numpy(
            workload_prompts(req["seed"], req["slots"], a.prompt, self.vocab).astype(np.int64)
        )
        gen = transformers.GenerationConfig(
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=a.new,
            min_new_tokens=a.new,
            eos_token_id=None,
            pad_token_id=0,
        )
        t.manual_seed(req["seed"])

        def run():
            with t.inference_mode():
                return self.model.generate(
                    input_ids=ids, attention_mask=t.ones_like(ids), generation_config=gen
                )

        out, wall, cpu = timed(run)
        return dict(tokens=int(out[:, ids.shape[1] :].numel()), wall_s=wall, cpu_s=cpu)

    def train(self, req) -> dict:
        import contextlib

        t, a = self.torch, self.args
        if self.opt is None:
            self.opt = t.optim.AdamW(
                self.model.parameters(), lr=1e-6, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01
            )
        w = workload_rows(req["seed"], a.rows, a.prompt, a.new, self.vocab)
        tokens = t.from_numpy(w["tokens"].astype(np.int64))
        targets = tokens[:, a.prompt :]
        blogp = t.from_numpy(w["behaviour_logp"])
        adv = t.from_numpy(w["advantages"])[:, None]
        head_dtype = t.bfloat16 if a.variant == "bf16" else t.float32
        body = (
            t.autocast("cpu", dtype=t.bfloat16)
            if a.variant == "autocast"
            else contextlib.nullcontext()
        )

        def run():
            with body:
                hidden = self.model.model(input_ids=tokens).last_hidden_state
            # The LM head over every position (as HF's forward and ours), fp32 unless the whole
            # model is bf16; log-probs of the completion targets in fp32.
            logits = t.nn.functional.linear(
                hidden.to(head_dtype), self.model.lm_head.weight.to(head_dtype)
            )
            logp = logits[:, a.prompt - 1 : -1].float().log_softmax(-1)
            logp = logp.gather(-1, targets[..., None])[..., 0]
            # CISPO: stop-gradient of the capped importance ratio x advantage x log-prob.
            weight = t.exp(logp.detach() - blogp).clamp(max=4.0) * adv
            loss = -(weight * logp).sum() / logp.numel()
            loss.backward()
            t.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
            return float(loss)

        loss, wall, cpu = timed(run)
        return dict(tokens=int(tokens.numel()), wall_s=wall, cpu_s=cpu, loss=loss)


def worker_main(args) -> None:
    cls = OursWorker if args.side == "ours" else TorchWorker
    w = cls(args)
    serve({"info": w.info, "peak": w.peak, "decode": w.decode, "train": w.train})


# ------------------------------------------------------------------------------ driver
def _first_to_go() -> None:
    """In a worker, before exec: if memory runs out, the kernel's OOM killer takes a benchmark
    worker (the driver then stops with its exit status) before other jobs on the machine."""
    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("1000")
    except OSError:
        pass


class Worker:
    """One worker subprocess: `request` sends a JSON line and returns its answer."""

    def __init__(self, name: str, cmd: list, log_dir: str, env: dict):
        self.name = name
        self.log_path = os.path.join(log_dir, name.replace(" ", "_") + ".log")
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            cwd=ROOT,
            bufsize=1,
            env=env,
            preexec_fn=_first_to_go,
        )

    def request(self, **req) -> dict:
        load = os.getloadavg()[0]
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        for line in self.proc.stdout:
            if line.startswith(MARK):
                out = json.loads(line[len(MARK) :])
                if "error" in out:
                    raise RuntimeError(
                        f"{self.name}: {req} failed: {out['error']}\n{self.log_tail()}"
                    )
                out["load"] = load
                return out
            sys.stderr.write(f"[{self.name}] {line}")
        raise RuntimeError(
            f"{self.name} exited ({self.proc.wait()}) during {req}:\n{self.log_tail()}"
        )

    def log_tail(self, n: int = 3000) -> str:
        self._log.flush()
        with open(self.log_path) as f:
            return f.read()[-n:]

    def close(self):
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
                self.proc.stdin.close()
                self.proc.wait(timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        self._log.close()


# (label, side, variant, ops) per dtype group; ours first: its peak brackets each round.
def group_sides(dtype: str, tunix: bool) -> list:
    if dtype == "float32":
        sides = [
            ("ours", "ours", "float32", ("decode", "train")),
            ("transformers", "torch", "float32", ("decode", "train")),
        ]
    else:
        sides = [
            ("ours", "ours", "bfloat16", ("decode", "train")),
            ("transformers bf16", "torch", "bf16", ("decode", "train")),
            ("transformers autocast", "torch", "autocast", ("train",)),
        ]
    if tunix:
        sides.append(
            ("tunix", "tunix", "float32" if dtype == "float32" else "bfloat16", ("decode", "train"))
        )
    return sides


def worker_cmd(args, side: str, variant: str) -> list:
    common = [
        "--checkpoint",
        args.checkpoint,
        "--variant",
        variant,
        "--prompt",
        str(args.prompt),
        "--new",
        str(args.new),
        "--rows",
        str(args.rows),
        "--peak-n",
        str(args.peak_n),
    ]
    if side == "tunix":
        return [args.tunix_python, os.path.join(HERE, "real_model_tunix.py")] + common
    return [sys.executable, os.path.abspath(__file__), "worker", side] + common


def worker_env(args, side: str) -> dict:
    """One CPU device for every side (a test session's forced fake devices dropped). Torch's
    OpenMP threads wait passively unless --torch-omp-active: libgomp's default spin-wait stalls
    at every parallel region's barrier when other jobs hold the cores (a 16-slot generate ran
    ~7x slower in CPU time at load 7-9 with spinning than with OMP_WAIT_POLICY=PASSIVE)."""
    env = dict(os.environ)
    env["XLA_FLAGS"] = " ".join(
        f
        for f in env.get("XLA_FLAGS", "").split()
        if not f.startswith("--xla_force_host_platform_device_count")
    )
    if side == "torch" and not args.torch_omp_active:
        env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    return env


def run_group(args, dtype: str, log_dir: str, emit) -> list:
    """The decode phase, then the train phase, each with its own workers: a worker holds only
    one phase's state (KV caches or optimizer state), which halves the memory of each side."""
    phases = ([[("decode", s) for s in args.slots]] if args.slots else []) + (
        [[("train", None)]] if args.rows else []
    )
    if args.same_workers:
        phases = [[op for ops in phases for op in ops]]
    return [run_phase(args, dtype, ops, log_dir, emit) for ops in phases]


def run_phase(args, dtype: str, ops: list, log_dir: str, emit) -> dict:
    kinds = {op for op, _ in ops}
    sides = [
        s
        for s in group_sides(dtype, args.tunix)
        if kinds & set(s[3]) and (args.sides is None or s[0] == "ours" or s[0] in args.sides)
    ]
    workers = {}
    try:
        for label, side, variant, _ in sides:
            workers[label] = Worker(
                f"{dtype} {ops[0][0]} {label}",
                worker_cmd(args, side, variant),
                log_dir,
                worker_env(args, side),
            )
        infos = {label: w.request(op="info") for label, w in workers.items()}
        flops = infos["ours"]["train_flops"]
        # Warm-up: every operation once on every side (compiles, first-call allocations).
        for op, slots in ops:
            for label, _, _, side_ops in sides:
                if op in side_ops:
                    r = workers[label].request(op=op, slots=slots, seed=0)
                    emit(
                        dict(
                            group=dtype,
                            round="warm-up",
                            op=op,
                            slots=slots,
                            side=label,
                            wall_s=round(r["wall_s"], 2),
                        )
                    )
        records = []
        for rnd in range(args.rounds):
            before = workers["ours"].request(op="peak")
            measured = []
            for op, slots in ops:
                order = [s for s in sides if op in s[3]]
                k = rnd % len(order)
                for label, *_ in order[k:] + order[:k]:
                    for _ in range(args.iters):
                        r = workers[label].request(op=op, slots=slots, seed=1 + rnd)
                        rec = dict(
                            group=dtype,
                            round=rnd,
                            op=op,
                            slots=slots,
                            side=label,
                            tok_s=r["tokens"] / r["wall_s"],
                            tok_cpu_s=r["tokens"] / r["cpu_s"],
                            wall_s=r["wall_s"],
                            tokens=r["tokens"],
                            load=r["load"],
                        )
                        if op == "train":
                            rec["loss"] = r.get("loss")
                        measured.append(rec)
            after = workers["ours"].request(op="peak")
            peak_key = "float32" if dtype == "float32" else "bfloat16"
            peak = (before[peak_key] + after[peak_key]) / 2
            peak_cpu = (before[peak_key + "_cpu"] + after[peak_key + "_cpu"]) / 2
            for rec in measured:
                rec["peak_tflops"] = peak / 1e12
                if rec["op"] == "train":
                    rec["mfu"] = flops * rec["tok_s"] / rec["tokens"] / peak
                    rec["mfu_cpu"] = flops * rec["tok_cpu_s"] / rec["tokens"] / peak_cpu
                emit(rec)
            records.extend(measured)
            tp = workers.get("transformers" if dtype == "float32" else "transformers bf16")
            if args.torch_peak and tp is not None:
                p = tp.request(op="peak")
                emit(
                    dict(
                        group=dtype,
                        round=rnd,
                        op="peak",
                        jax_tflops={k: round(after[k] / 1e12, 3) for k in ("float32", "bfloat16")},
                        torch_tflops={k: round(p[k] / 1e12, 3) for k in ("float32", "bfloat16")},
                        load=p["load"],
                    )
                )
        return dict(group=dtype, infos=infos, records=records)
    finally:
        for w in workers.values():
            w.close()


def summarise(groups: list) -> dict:
    """Medians per (group, op, slots, side) and per-round ratios ours / side."""
    out = {}
    for g in groups:
        recs = g["records"]
        keys = sorted({(r["op"], r["slots"] or 0) for r in recs})
        for op, slots in keys:
            rows = [r for r in recs if r["op"] == op and (r["slots"] or 0) == slots]
            sides = list(dict.fromkeys(r["side"] for r in rows))
            entry = {}
            for side in sides:
                mine = [r for r in rows if r["side"] == side]
                e = dict(
                    tok_s=statistics.median(r["tok_s"] for r in mine),
                    tok_s_range=[min(r["tok_s"] for r in mine), max(r["tok_s"] for r in mine)],
                    tok_cpu_s=statistics.median(r["tok_cpu_s"] for r in mine),
                    load=[min(r["load"] for r in mine), max(r["load"] for r in mine)],
                )
                if op == "train":
                    e["mfu"] = statistics.median(r["mfu"] for r in mine)
                    e["mfu_cpu"] = statistics.median(r["mfu_cpu"] for r in mine)
                if side != "ours":
                    ratios, cpu_ratios = [], []
                    for rnd in sorted({r["round"] for r in mine}):
                        o = [r for r in rows if r["side"] == "ours" and r["round"] == rnd]
                        p = [r for r in mine if r["round"] == rnd]
                        if o and p:
                            ratios.append(
                                statistics.median(r["tok_s"] for r in o)
                                / statistics.median(r["tok_s"] for r in p)
                            )
                            cpu_ratios.append(
                                statistics.median(r["tok_cpu_s"] for r in o)
                                / statistics.median(r["tok_cpu_s"] for r in p)
                            )
                    e["ours_over"] = statistics.median(ratios)
                    e["ours_over_range"] = [min(ratios), max(ratios)]
                    e["ours_over_cpu"] = statistics.median(cpu_ratios)
                entry[side] = e
            name = f"{g['group']} {op}" + (f" {slots} slots" if op == "decode" else "")
            out[name] = entry
    return out


def print_table(summary: dict, file=sys.stdout) -> None:
    print(
        f"\n{'what':<26} {'side':<22} {'tok/s (range)':<22} {'tok/CPU-s':>9} "
        f"{'ours/side (range)':<20} {'by CPU':>7} {'MFU':>5} {'CPU':>5}  load",
        file=file,
    )
    for name, entry in summary.items():
        for side, e in entry.items():
            rng = f"{e['tok_s']:.0f} ({e['tok_s_range'][0]:.0f}-{e['tok_s_range'][1]:.0f})"
            ratio = (
                f"x{e['ours_over']:.2f} ({e['ours_over_range'][0]:.2f}-"
                f"{e['ours_over_range'][1]:.2f})"
                if "ours_over" in e
                else ""
            )
            cpu_ratio = f"x{e['ours_over_cpu']:.2f}" if "ours_over_cpu" in e else ""
            mfu = f"{e['mfu']:.2f} {e['mfu_cpu']:.2f}" if "mfu" in e else f"{'':>5} {'':>5}"
            print(
                f"{name:<26} {side:<22} {rng:<22} {e['tok_cpu_s']:>9.0f} {ratio:<20} "
                f"{cpu_ratio:>7} {mfu:>11}  {e['load'][0]:.1f}-{e['load'][1]:.1f}",
                file=file,
            )


def read_records(paths: list) -> list:
    """Measurement records from earlier runs: their --json-out files or their printed output
    (one JSON line per measurement), e.g. of a run that stopped part-way."""
    groups: dict = {}
    for path in paths:
        with open(path) as f:
            text = f.read()
        if text.lstrip().startswith("{\n"):  # a --json-out file
            recs = json.loads(text)["records"]
        else:
            recs = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
        for r in recs:
            if isinstance(r.get("round"), int) and "tok_s" in r:
                r = dict(r, round=f"{path}:{r['round']}")  # rounds of different runs differ
                groups.setdefault(r["group"], []).append(r)
    return [dict(group=g, records=recs) for g, recs in groups.items()]


def drive(args) -> dict:
    if args.summarise:
        summary = summarise(read_records(args.summarise))
        print_table(summary)
        return dict(summary=summary)
    if args.checkpoint is None:
        args.checkpoint = default_checkpoint()
    args.checkpoint = os.path.abspath(args.checkpoint)
    if args.tunix and not os.path.exists(args.tunix_python):
        print(
            f"real_model.py: no tunix at {args.tunix_python} (bench/README.md, peer's "
            '"First pass", says how to make its virtualenv): running without it',
            file=sys.stderr,
        )
        args.tunix = False
    shape = read_shape(args.checkpoint)
    print(
        json.dumps(
            dict(
                checkpoint=args.checkpoint,
                shape=shape,
                prompt=args.prompt,
                new=args.new,
                slots=args.slots,
                rows=args.rows,
                rounds=args.rounds,
                load=os.getloadavg(),
            )
        ),
        flush=True,
    )
    log_dir = args.log_dir or tempfile.mkdtemp(prefix="real_model_")
    os.makedirs(log_dir, exist_ok=True)

    def emit(rec):
        print(
            json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in rec.items()}),
            flush=True,
        )

    groups = []
    for dtype in args.dtypes:
        groups.extend(run_group(args, dtype, log_dir, emit))
    summary = summarise(groups)
    print_table(summary)
    infos: dict = {}
    for g in groups:
        infos.setdefault(g["group"], {}).update(g["infos"])
    result = dict(
        checkpoint=args.checkpoint,
        shape=shape,
        summary=summary,
        infos=infos,
        records=[r for g in groups for r in g["records"]],
        log_dir=log_dir,
    )
    print(json.dumps(dict(summary=summary)), flush=True)
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(result, f, indent=1)
    return result


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("role", nargs="*", help=argparse.SUPPRESS)  # "worker ours|torch"
    p.add_argument("--checkpoint", help="HF Llama directory (default: the cached SmolLM2)")
    p.add_argument(
        "--dtypes", nargs="+", default=["float32", "bfloat16"], choices=("float32", "bfloat16")
    )
    p.add_argument(
        "--slots",
        type=int,
        nargs="*",
        default=[16, 64],
        help="decode slots (none: no decode phase)",
    )
    p.add_argument("--prompt", type=int, default=64, help="prompt tokens (decode and train)")
    p.add_argument(
        "--new", type=int, default=128, help="new tokens (decode) / completion tokens per train row"
    )
    p.add_argument("--rows", type=int, default=8, help="train rows (0: no train step)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--iters", type=int, default=1, help="timed requests per side, op and round")
    p.add_argument("--peak-n", type=int, default=2048)
    p.add_argument(
        "--same-workers",
        action="store_true",
        help="decode and train in the same worker processes (fewer start-ups, each "
        "worker holds both phases' memory)",
    )
    p.add_argument(
        "--sides",
        nargs="+",
        metavar="LABEL",
        help="only these peers beside ours (labels as printed: transformers, "
        "'transformers bf16', 'transformers autocast', tunix): fewer resident "
        "workers on a machine short of memory",
    )
    p.add_argument("--no-tunix", dest="tunix", action="store_false")
    p.add_argument("--tunix-python", default=DEFAULT_TUNIX_PYTHON)
    p.add_argument(
        "--no-torch-peak",
        dest="torch_peak",
        action="store_false",
        help="skip transformers' own matmul peak (reported beside XLA's)",
    )
    p.add_argument(
        "--torch-omp-active",
        action="store_true",
        help="leave torch's OpenMP wait policy at its default (spinning) instead of "
        "OMP_WAIT_POLICY=PASSIVE",
    )
    p.add_argument("--json-out", help="write every record and the summary to this file")
    p.add_argument(
        "--summarise",
        nargs="+",
        metavar="FILE",
        help="only print the table of earlier runs' records (their --json-out files "
        "or printed output), pooled",
    )
    p.add_argument("--log-dir", help="workers' stderr logs (default: a new temp directory)")
    # worker-only
    p.add_argument("--variant", help=argparse.SUPPRESS)
    return p


def main(argv=None):
    args = parser().parse_args(argv)
    if args.role:
        if args.role[0] != "worker" or len(args.role) != 2 or args.role[1] not in ("ours", "torch"):
            parser().error(f"unknown arguments {args.role}")
        args.side = args.role[1]
        return worker_main(args)
    return drive(args)


if __name__ == "__main__":
    main()
