"""The SFT warm-up: demonstrations from a synthetic task or a Parquet file, packing, the loss
falling, RL validation prompts kept out, and an HF checkpoint that transformers loads with the
same logits."""

import dataclasses
import json
import os
import re

import jax
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from scalerl_jax import mesh as mesh_lib
from scalerl_jax.config import DataConfig, MeshConfig, ModelConfig, OptimConfig, SFTConfig
from scalerl_jax.data.prompts import DataError, PromptSource
from scalerl_jax.data.synthetic_tasks import CharTokenizer
from scalerl_jax.models import hf
from scalerl_jax.models.transformer import forward_logits
from scalerl_jax.train import sft as sft_lib

TOK = CharTokenizer()
TINY = ModelConfig(
    name="tiny",
    vocab_size=TOK.vocab_size,
    hidden_size=32,
    intermediate_size=64,
    num_layers=2,
    num_heads=2,
    num_kv_heads=1,
    max_position_embeddings=128,
    tie_embeddings=False,
)
DATA = DataConfig(source="synthetic:countup?num=600", num_validation=50)
OPTIM = OptimConfig(learning_rate=3e-3, warmup_steps=5, eps=1e-8, weight_decay=0.0)


@pytest.mark.fast
def test_packing_keeps_demonstrations_apart_and_masks_only_completions():
    ex = sft_lib.Examples(
        rows=[[5, 6, 7, 1], [8, 9, 1], [10, 11, 12, 13, 1]], prompt_lengths=[2, 1, 3], skipped=0
    )
    packed = sft_lib.pack(ex, [0, 1, 2], length=8, pad_id=0)
    assert packed["tokens"].tolist() == [[5, 6, 7, 1, 8, 9, 1, 0], [10, 11, 12, 13, 1, 0, 0, 0]]
    assert packed["segment_ids"].tolist() == [[1, 1, 1, 1, 2, 2, 2, 0], [1, 1, 1, 1, 1, 0, 0, 0]]
    assert packed["positions"].tolist() == [[0, 1, 2, 3, 0, 1, 2, 0], [0, 1, 2, 3, 4, 0, 0, 0]]
    # Position t predicts t + 1 within its segment; only completion tokens (and eos) count.
    assert packed["targets"][0, :3].tolist() == [6, 7, 1]
    assert packed["targets"][0, 4:6].tolist() == [9, 1]
    assert packed["loss_mask"].tolist() == [[0, 1, 1, 0, 1, 1, 0, 0], [0, 0, 1, 1, 0, 0, 0, 0]]


def test_demonstrations_from_parquet_with_bad_rows_and_validation_removed(tmp_path):
    rows = [
        {"id": f"q{i}", "prompt": f"{i}+1=", "completion": f"<think></think>{i + 1}"}
        for i in range(40)
    ]
    rows[3]["completion"] = None
    path = tmp_path / "demos.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    sft = SFTConfig(source=str(path))
    data = DataConfig(
        source=str(path), prompt_field="prompt", answer_field="completion", max_bad_fraction=0.05
    )
    held_out = PromptSource(
        DataConfig(source="synthetic:addition?num=30", num_validation=3), TOK
    ).validation()
    demos, counts = sft_lib.load_demonstrations(sft, data, held_out)
    assert counts == {"demonstrations": 39, "excluded": 0, "bad": 1}
    excluded = [demos[0]._replace(prompt_id="x")]  # same problem text, another id
    from scalerl_jax.data.prompts import Prompt

    demos, counts = sft_lib.load_demonstrations(
        sft, data, [Prompt("x", excluded[0].problem, "", "")]
    )
    assert counts["excluded"] == 1 and len(demos) == 38
    with pytest.raises(DataError, match="no demonstrations left"):
        sft_lib.load_demonstrations(
            sft, data, [Prompt(d.prompt_id, d.problem, "", "") for d in demos + excluded]
        )


def test_sft_loss_falls_and_the_checkpoint_round_trips_through_transformers(tmp_path):
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    mesh = mesh_lib.trainer_mesh(MeshConfig(), jax.devices()[:1])
    validation = PromptSource(DATA, TOK).validation()
    sft = SFTConfig(
        source="synthetic:countup?num=600&direct=0.5",
        steps=60,
        batch_size=8,
        max_length=64,
        optim=OPTIM,
        log_every=5,
    )
    out = str(tmp_path / "sft")
    seen = []
    model_dir = sft_lib.run_sft(
        sft,
        TINY,
        DATA,
        mesh,
        TOK,
        out_dir=out,
        exclude=validation,
        on_step=lambda step, m: seen.append((step, m["loss"])),
    )
    summary = json.load(open(os.path.join(out, "summary.json")))
    assert summary["excluded"] == 50 and summary["demonstrations"] == 550
    assert summary["final_loss"] < 0.5 * summary["first_loss"]
    assert [s for s, _ in seen] == [1] + list(range(5, 61, 5))
    assert not os.path.exists(out + ".partial")

    # transformers loads the export and computes the same logits as our model on it.
    cfg, graphdef, params = hf.load_params(model_dir, cfg=TINY)
    ids = np.array([TOK.encode("123+4=<think>124:3,125:2")], np.int32)
    ours = np.asarray(forward_logits(graphdef, params, ids))
    theirs = transformers.AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
    with torch.no_grad():
        ref = theirs(torch.tensor(ids, dtype=torch.long)).logits.numpy()
    np.testing.assert_allclose(ours, ref, atol=1e-4, rtol=1e-4)
    assert json.load(open(os.path.join(model_dir, "config.json")))["eos_token_id"] == TOK.eos_id

    # A finished warm-up is reused, not redone.
    mtime = os.path.getmtime(os.path.join(out, "summary.json"))
    assert sft_lib.run_sft(sft, TINY, DATA, mesh, TOK, out_dir=out) == model_dir
    assert os.path.getmtime(os.path.join(out, "summary.json")) == mtime


# --------------------------------------------------------------------- GSM8K worked solutions
from scalerl_jax.config import ConfigError  # noqa: E402
from scalerl_jax.data.answers import gsm8k_solution  # noqa: E402
from test_data import gsm8k_lines  # noqa: E402


def test_gsm8k_solution_rewrite_on_real_rows():
    first, thousands, negative = gsm8k_lines("train", 1, 346, 5845)
    assert first["answer"] == (
        "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold "
        "48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72"
    )
    assert gsm8k_solution(first["answer"]) == (
        "Natalia sold 48/2 = 24 clips in May.\nNatalia sold 48+24 = 72 clips altogether in April "
        "and May.\nThe final answer is \\boxed{72}."
    )
    for row, final in ((thousands, "1080"), (negative, "-47")):
        text = gsm8k_solution(row["answer"])
        lines = text.split("\n")
        assert lines[-1] == f"The final answer is \\boxed{{{final}}}."
        assert "<<" not in text and ">>" not in text and "####" not in text
        # The reasoning lines are the solution's, annotations cut out, in order.
        original = [ln for ln in row["answer"].rpartition("####")[0].split("\n") if ln.strip()]
        assert len(lines) == len(original) + 1
        assert all(
            ln.replace(" ", "") in re.sub(r"<<[^<>]*>>", "", o).replace(" ", "")
            for ln, o in zip(lines, original)
        )
    with pytest.raises(ValueError, match="no reasoning"):
        gsm8k_solution("#### 5")
    with pytest.raises(ValueError, match="unbalanced"):
        gsm8k_solution("3 + 4 = <<3+4=7 7\n#### 7")


def test_gsm8k_demonstrations_rewritten_bad_rows_counted_validation_removed(tmp_path):
    rows = [
        {"question": f"q{i}?", "answer": f"{i} + 1 = <<{i}+1={i + 1}>>{i + 1}\n#### {i + 1}"}
        for i in range(60)
    ]
    rows[4]["answer"] = "no final line"
    path = tmp_path / "train.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    data = DataConfig(
        source=str(path), prompt_field="question", answer_format="gsm8k", max_bad_fraction=0.05
    )
    sft = SFTConfig(
        source="{data_source}",
        prompt_field="question",
        completion_field="answer",
        completion_format="gsm8k",
    )
    from scalerl_jax.data.prompts import Prompt

    held_out = [Prompt("test:x", "q7?", "8", "")]  # same problem text as a training row
    demos, counts = sft_lib.load_demonstrations(sft, data, held_out)
    assert counts == {"demonstrations": 58, "excluded": 1, "bad": 1}
    assert demos[0].completion == "0 + 1 = 1\nThe final answer is \\boxed{1}."
    raw = sft_lib.load_demonstrations(dataclasses.replace(sft, completion_format="raw"), data)[0]
    assert raw[0].completion == rows[0]["answer"]
    with pytest.raises(DataError, match="synthetic tasks write their own completions"):
        sft_lib.load_demonstrations(
            dataclasses.replace(sft, source="synthetic:countup?num=9"), DATA
        )
    with pytest.raises(ConfigError, match="completion_format='boxed'"):
        SFTConfig(completion_format="boxed")
