"""The `gsm8k` recipe with the real model and data: SFT demonstrations through SmolLM2's chat
template and tokenizer, the sizes it takes on an accelerator (TPU plan, a GPU's local plan),
and a CI-sized run of experiments/run.py (SFT, evaluation, one RL step) on this CPU.

The model comes from `make fetch-model` (skipped, saying so, when it has not run; failed when
SCALERL_REQUIRE_MODEL is set, as CI does); GSM8K from the directory SCALERL_GSM8K_DIR names
(skipped when absent). Nothing here downloads."""

import dataclasses
import json
import os

import pytest

from scalerl_jax import plan, preflight, recipes
from scalerl_jax.metrics import read_metrics
from scalerl_jax.train import sft as sft_lib
from test_data import GSM8K, GSM8K_ABSENT, gsm8k_lines
from test_run import run_cli

TRAIN = os.path.join(GSM8K, "train.jsonl")


@pytest.fixture(scope="module")
def train_file():
    if not os.path.isfile(TRAIN):
        pytest.skip(f"{TRAIN} absent: {GSM8K_ABSENT}")
    return TRAIN


def test_sft_demonstrations_through_the_chat_template(smollm2, train_file):
    """A GSM8K demonstration is the chat prompt (system instruction, question, assistant
    header) then the rewritten solution and <|im_end|>; only the latter is trained on."""
    from scalerl_jax.models.tokenizer import load_tokenizer

    tok = load_tokenizer(smollm2)
    cfg = recipes.get("gsm8k")
    data = dataclasses.replace(cfg.data, source=train_file)
    (row,) = gsm8k_lines("train", 1)
    demos, counts = sft_lib.load_demonstrations(cfg.sft, data)
    assert counts["bad"] == 0 and counts["demonstrations"] == 7473
    demo = next(d for d in demos if d.problem == row["question"])
    ex = sft_lib.tokenize([demo], tok, data, cfg.sft.max_length)
    ids, n_prompt = ex.rows[0], ex.prompt_lengths[0]
    prompt = tok.decode(ids[:n_prompt])
    assert prompt.startswith(
        "<|im_start|>system\nPlease reason step by step, and put your "
        "final answer within \\boxed{}.<|im_end|>\n<|im_start|>user\n"
    )
    assert prompt.endswith(row["question"] + "<|im_end|>\n<|im_start|>assistant\n")
    assert tok.decode(ids[n_prompt:]) == demo.completion + "<|im_end|>"
    assert demo.completion.endswith("The final answer is \\boxed{72}.")
    assert ids[-1] == tok.eos_id and tok.eos_id in tok.eos_ids  # the sampler stops there too
    packed = sft_lib.pack(ex, [0], length=cfg.sft.max_length, pad_id=tok.pad_id)
    trained = packed["targets"][0][packed["loss_mask"][0] > 0].tolist()
    assert trained == ids[n_prompt:]  # the completion and its eos, nothing of the prompt
    # Every demonstration fits the recipe's row length.
    all_ex = sft_lib.tokenize(demos, tok, data, cfg.sft.max_length)
    assert all_ex.skipped == 0


def test_accelerator_sizes_on_a_tpu_slice(tmp_path):
    for split in ("train", "test"):  # a plan reads no rows; the files must exist
        (tmp_path / f"{split}.jsonl").write_text('{"question": "q", "answer": "#### 1"}\n')
    args = (
        "--dry-run",
        "--recipe",
        "gsm8k",
        "--tpu",
        "v5e-8",
        "--data",
        str(tmp_path / "train.jsonl"),
        "--workdir",
        str(tmp_path / "w"),
    )
    done = run_cli(*args, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "512 rows per step (32 prompts x 16)" in done.stdout
    assert "KV cache length 768" in done.stdout
    assert "note      sized for tpu v5e-8: pipeline.prompts_per_step=32" in done.stdout
    pinned = run_cli(*args, "pipeline.prompts_per_step=8", timeout=300)
    assert pinned.returncode == 0, pinned.stderr[-2000:]
    assert "128 rows per step (8 prompts x 16)" in pinned.stdout


@pytest.mark.parametrize(
    "gib,micro,remat", [(78, 8, False), pytest.param(24, 32, False, marks=pytest.mark.fast)]
)
def test_accelerator_sizes_on_a_gpu_fit_its_memory(monkeypatch, gib, micro, remat):
    """On a GPU the local plan picks micro-batches / remat / slots for the bigger batch (the
    lengths stay), where the CPU sizes stay as they are. It plans cuDNN's attention ("auto"),
    which keeps no [T, T] scores: 24 GiB then takes 32 micro-batches without remat (4 with
    remat when the scores were counted)."""
    machine = plan.local.Machine("gpu", "NVIDIA GPU", 1, int(gib * plan.GIB), "test")
    monkeypatch.setattr(plan.local, "detect", lambda headroom=0.10: machine)
    cpu = recipes.get("gsm8k")
    notes = []
    cfg = preflight.size_for_platform(
        "gsm8k", cpu, frozenset(), notes, dry_run=True, platform="gpu"
    )
    local = preflight.local_plan(cfg)
    assert local.fits and cfg.pipeline.prompts_per_step == 32
    assert (cfg.optim.micro_batches, cfg.model.remat) == (micro, remat)
    assert cfg.sampler.max_new_tokens == 512 and len(notes) == 1
    assert (
        preflight.size_for_platform("gsm8k", cpu, frozenset(), [], dry_run=True, platform="cpu")
        is cpu
    )
    # A TPU VM without --tpu is planned like a GPU: by the local plan.
    on_tpu = preflight.size_for_platform(
        "gsm8k", cpu, frozenset(), [], dry_run=True, platform="tpu"
    )
    assert on_tpu.optim.micro_batches == micro and preflight.local_plan(on_tpu).fits
    # A pinned micro-batch count is not re-planned: the plan then refuses, naming settings,
    # unless the recipe's 4 is what the planner picks anyway.
    pinned = preflight.size_for_platform(
        "gsm8k", cpu, {"optim.micro_batches"}, [], dry_run=True, platform="gpu"
    )
    assert pinned.optim.micro_batches == 4
    assert preflight.local_plan(pinned).fits == (micro == 4)


def test_cli_sft_then_first_rl_step_on_smollm2(smollm2, train_file, tmp_path):
    """The recipe end to end at CI size: the SFT stage on GSM8K solutions through the chat
    template, validation on GSM8K test at step 0 and after one RL step."""
    workdir = str(tmp_path / "run")
    tiny = [
        "sft.steps=2",
        "sft.optim.total_steps=2",
        "sft.optim.warmup_steps=1",
        "sft.batch_size=1",
        "sft.max_length=256",
        "sft.log_every=1",
        "pipeline.prompts_per_step=1",
        "pipeline.generations_per_prompt=2",
        "optim.micro_batches=1",
        "sampler.max_concurrent_decodes=2",
        "sampler.max_new_tokens=8",
        "sampler.max_target_length=264",
        "eval.num_prompts=2",
        "model.remat=false",
    ]  # remat doubles this run's CPU time (compilation)
    done = run_cli(
        "--recipe",
        "gsm8k",
        "--hf-checkpoint",
        smollm2,
        "--data",
        train_file,
        "--workdir",
        workdir,
        "--steps",
        "1",
        "--no-fit",
        *tiny,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.load(open(os.path.join(workdir, "sft", "summary.json")))
    assert summary["demonstrations"] == 7473 and summary["bad"] == 0 and summary["steps"] == 2
    assert os.path.exists(os.path.join(workdir, "sft", "model", "chat_template.jinja"))
    config = json.load(open(os.path.join(workdir, "config.json")))
    assert config["data"]["answer_format"] == "gsm8k" and config["sft"]["source"] == "{data_source}"
    log = read_metrics(workdir)
    assert [r["step"] for r in log.of("train")] == [1]
    evals = log.of("eval")
    assert [r["step"] for r in evals] == [0, 1] and evals[0]["num_prompts"] == 2
    assert "validation: 1319 prompts from" in done.stderr
