"""The real model on real data, through the entry points: experiments/eval.py's greedy GSM8K
completions and verdicts against an independent harness (transformers `generate` + Math-Verify),
and experiments/run.py's first RL steps on SmolLM2-135M-Instruct on the CPU (sampling, rewards,
the CISPO step, weight sync, evaluation, checkpoint, resume, and an HF export that transformers
reloads with our logits).

Skipped, saying why, without the converted model (`make fetch-model`) or GSM8K (the directory
SCALERL_GSM8K_DIR names); with SCALERL_REQUIRE_MODEL set (CI) a missing model fails instead. The
subprocesses share a JAX compilation cache, so later invocations skip the compiles of earlier
ones (a resumed run recompiles nothing it compiled before)."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from scalerl_jax import recipes
from scalerl_jax.metrics import read_metrics

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
math_verify = pytest.importorskip("math_verify")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GSM8K = os.environ.get("SCALERL_GSM8K_DIR", "<SCALERL_GSM8K_DIR unset>")


def gsm8k(split):
    path = os.path.join(GSM8K, f"{split}.jsonl")
    if not os.path.isfile(path):
        pytest.skip(f"GSM8K not found at {path} (SCALERL_GSM8K_DIR names its directory)")
    return path


@pytest.fixture(scope="module")
def cli_env(tmp_path_factory):
    cache = tmp_path_factory.mktemp("jax_cache")
    return {
        **os.environ,
        "JAX_PLATFORMS": "cpu",
        "XLA_FLAGS": "",
        "JAX_COMPILATION_CACHE_DIR": str(cache),
        "PYTHONPATH": os.pathsep.join([ROOT, os.path.join(ROOT, "tests")]),  # this checkout first
    }


def cli(script, *args, env, timeout=900):
    return subprocess.run(
        [sys.executable, os.path.join(ROOT, "experiments", script), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


# ------------------------------------------------------------------------- evaluation
def test_eval_agrees_with_transformers_generate_and_math_verify(smollm2, cli_env, tmp_path):
    n, new_tokens = 20, 160
    out = tmp_path / "greedy.jsonl"
    done = cli(
        "eval.py",
        "--recipe",
        "gsm8k",
        "--hf-checkpoint",
        smollm2,
        "--data",
        gsm8k("test"),
        "reward.workers=2",
        "--num-prompts",
        str(n),
        "--max-new-tokens",
        str(new_tokens),
        "--slots",
        str(n),
        "--out",
        str(out),
        env=cli_env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    records = [json.loads(line) for line in open(out)]
    summary = json.load(open(tmp_path / "greedy.summary.json"))
    rows = [json.loads(line) for _, line in zip(range(n), open(gsm8k("test")))]
    assert [r["index"] for r in records] == list(range(n))
    assert {r["mode"] for r in records} == {"greedy"}

    # The prompts: transformers' own tokenizer and chat template give the ids we sampled from.
    tok = transformers.AutoTokenizer.from_pretrained(smollm2)
    system = recipes.BOXED_INSTRUCTION  # the recipe's system prompt
    prompts = [
        tok.apply_chat_template(
            [{"role": "system", "content": system}, {"role": "user", "content": row["question"]}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=True,
        )["input_ids"]
        for row in rows
    ]
    assert [r["prompt_tokens"] for r in records] == [list(p) for p in prompts]

    # The completions: transformers' greedy decoding in fp32, all prompts in one left-padded
    # batch; a prompt whose batched completion differs is decoded again alone (no padding at
    # all), and that is the reference it must equal.
    model = transformers.AutoModelForCausalLM.from_pretrained(smollm2, dtype=torch.float32).eval()
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    ours = [r["completion_tokens"] for r in records]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # on a busy 2-core machine more threads make torch many times slower
    try:
        theirs = _generate(model, prompts, eos, new_tokens)
        for i in [i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b]:
            theirs[i] = _generate(model, [prompts[i]], eos, new_tokens)[0]
    finally:
        torch.set_num_threads(threads)
    differ = {
        i: next(j for j, (x, y) in enumerate(zip(a + [-1], b + [-1])) if x != y)
        for i, (a, b) in enumerate(zip(ours, theirs))
        if a != b
    }
    assert not differ, f"problem: first differing token {differ}"

    # The verdicts: Math-Verify on transformers' text against the gold number after '####'.
    # One difference is by design (rewards/math.py): a completion that states no final answer
    # (no box, no "the answer is", no last line that is a value) scores 0 with us, where
    # Math-Verify falls back to the last expression it can parse (e.g. "... is 80 + 150 = " cut
    # off by the token limit reads as 230). Every other verdict must agree.
    unstated = []
    for r, row, ids in zip(records, rows, theirs):
        gold = row["answer"].rsplit("####", 1)[1].strip().replace(",", "")
        assert r["reference"] == gold
        text = tok.decode(ids, skip_special_tokens=True)
        assert r["completion"] == text
        verdict = math_verify.verify(math_verify.parse(f"${gold}$"), math_verify.parse(text))
        if r["correct"] != verdict:
            assert verdict and r["extracted"] is None and "\\boxed" not in text, (
                r["index"],
                r["extracted"],
                gold,
                text[-300:],
            )
            unstated.append(r["index"])
    assert len(unstated) < n // 2, unstated  # most completions state an answer, or none at all
    figures = summary["modes"]["greedy"]
    assert figures["correct"] == sum(r["correct"] for r in records)
    assert figures["pass@1"] == pytest.approx(figures["correct"] / n)
    assert figures["truncated"] == sum(len(t) == new_tokens and t[-1] != eos for t in theirs)


def _generate(model, prompts, eos, new_tokens):
    """transformers' greedy completions of token-id prompts, each cut after its first eos."""
    width = max(map(len, prompts))
    ids = torch.tensor([[eos] * (width - len(p)) + list(p) for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    with torch.no_grad():
        out = model.generate(
            ids,
            attention_mask=mask,
            do_sample=False,
            max_new_tokens=new_tokens,
            eos_token_id=eos,
            pad_token_id=eos,
        )
    completions = []
    for row in out[:, width:].tolist():
        end = row.index(eos) + 1 if eos in row else len(row)
        completions.append(row[:end])
    return completions


# --------------------------------------------------------------------------------- RL
def test_rl_first_steps_resume_and_export_on_the_real_model(smollm2, cli_env, tmp_path):
    # GSM8K training problems, references cut to the final number (the gsm8k recipe's answer
    # format will do that); rewards from a length-parity verifier, so that the groups are mixed
    # and the CISPO step has advantages to follow (a 135M model solves too few problems).
    data = tmp_path / "train.jsonl"
    with open(gsm8k("train")) as f, open(data, "w") as out:
        for i, line in zip(range(24), f):
            row = json.loads(line)
            out.write(
                json.dumps(
                    {
                        "id": f"train-{i}",
                        "question": row["question"],
                        "answer": row["answer"].rsplit("####", 1)[1].strip(),
                    }
                )
                + "\n"
            )
    workdir = tmp_path / "run"
    args = [
        "--recipe",
        "scalerl",
        "--colocate",
        "--hf-checkpoint",
        smollm2,
        "--data",
        str(data),
        "--workdir",
        str(workdir),
        "--no-fit",
        "data.prompt_field=question",
        "data.template=Question: {prompt}\nAnswer:",
        "data.num_validation=2",
        "eval.num_prompts=2",
        "eval.k=2",
        "eval.every_steps=100",
        "reward.verifier=_verifiers:even_length",
        "reward.workers=2",
        "sampler.interruptions=false",
        "sampler.max_new_tokens=32",
        "sampler.max_prefill_length=128",
        "sampler.max_target_length=192",
        "sampler.max_concurrent_decodes=8",
        "pipeline.mode=sync",
        "pipeline.prompts_per_step=2",
        "pipeline.generations_per_prompt=4",
        "pipeline.seq_bucket=64",
        "model.compute_dtype=float32",
        "optim.learning_rate=1e-5",
        "optim.warmup_steps=0",
        "keep_checkpoints=1",
    ]
    first = cli("run.py", *args, "--steps", "1", env=cli_env)
    assert first.returncode == 0, first.stderr[-3000:]
    second = cli("run.py", *args, "--steps", "2", env=cli_env)  # resumes from step 1
    assert second.returncode == 0, second.stderr[-3000:]
    assert "resumed from step 1" in second.stderr

    log = read_metrics(str(workdir))
    train = log.of("train")
    assert [r["step"] for r in train] == [1, 2]
    assert [r["resumed"] for r in log.of("run")] == [False, True]
    assert [r["step"] for r in log.of("eval")] == [0, 1, 2]
    for r in train:  # sampled and rewarded; the weights synced to the sampler after each step
        assert r["policy_version"] == r["step"] and r["staleness_max"] == 0
        assert r["reward_errors"] == r["reward_timeouts"] == 0 and np.isfinite(r["loss"])
        if r["batch_kept_groups"]:  # a group with mixed rewards: the CISPO step moved weights
            assert r["grad_norm"] > 0 and r["update_norm"] > 0
    assert any(r["batch_kept_groups"] for r in train)  # all-equal groups each time: 1 in 4096
    assert sorted(os.listdir(workdir / "checkpoints")) == ["2"]

    # The export: transformers reloads it and gives the logits our model gives with the
    # trained params (read back from the step-2 checkpoint), which differ from the initial ones.
    from scalerl_jax import evaluation
    from scalerl_jax.models.transformer import forward_logits
    from scalerl_jax.train.state import graphdef_of

    trained = evaluation.load_model(workdir=str(workdir))
    initial = evaluation.load_model(hf_checkpoint=smollm2)
    ids = np.array([trained.tokenizer.encode("Question: What is 17 times 3?\nAnswer: 51")])
    graphdef = graphdef_of(trained.cfg)
    ours = np.asarray(forward_logits(graphdef, trained.params, ids))
    before = np.asarray(forward_logits(graphdef, initial.params, ids))
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(
        str(workdir / "model"), dtype=torch.float32
    ).eval()
    with torch.no_grad():
        theirs = reloaded(input_ids=torch.tensor(ids)).logits.numpy()
    parity, moved = np.abs(ours - theirs).max(), np.abs(ours - before).max()
    assert parity < 1e-3 and moved > 50 * parity, (parity, moved)
    tok = transformers.AutoTokenizer.from_pretrained(str(workdir / "model"))
    assert tok("Answer: 51")["input_ids"] == trained.tokenizer.encode("Answer: 51")
