"""bench/real_model.py (SmolLM2 against transformers and tunix) and bench/gpu_gsm8k.py (the
prepared GPU run) work end to end at tiny sizes on the CPU: fields, not speeds."""

import json
import math
import os

import pytest
from _scripts import load_script

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _load(name):
    return load_script(f"bench/{name}.py", name)


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    """A random 2-layer Llama (tied embeddings, GQA 4/2, head_dim 16) saved by transformers."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        tie_word_embeddings=True,
        max_position_embeddings=64,
        rms_norm_eps=1e-5,
    )
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("tiny_llama")
    transformers.LlamaForCausalLM(cfg).save_pretrained(path, safe_serialization=True)
    return str(path)


def _check_summary(summary, group, sides, slots):
    for s in slots:
        entry = summary[f"{group} decode {s} slots"]
        assert [side for side in entry] == [x for x in sides if x != "transformers autocast"]
        for side, e in entry.items():
            assert e["tok_s"] > 0 and e["tok_cpu_s"] > 0 and len(e["load"]) == 2
            assert e["tok_s_range"][0] <= e["tok_s"] <= e["tok_s_range"][1]
            assert (side == "ours") != ("ours_over" in e)
    train = summary[f"{group} train"]
    assert list(train) == sides
    for side, e in train.items():
        assert 0 < e["mfu"] < 1 and 0 < e["mfu_cpu"] < 1
        if side != "ours":
            assert math.isclose(e["ours_over"], train["ours"]["tok_s"] / e["tok_s"], rel_tol=1e-6)


def test_real_model_bench_compares_ours_and_transformers_on_a_tiny_llama(tiny_llama, tmp_path):
    bench = _load("real_model")
    out = tmp_path / "result.json"
    res = bench.main(
        [
            "--checkpoint",
            tiny_llama,
            "--slots",
            "2",
            "--prompt",
            "8",
            "--new",
            "4",
            "--rows",
            "2",
            "--rounds",
            "1",
            "--peak-n",
            "128",
            "--no-tunix",
            "--no-torch-peak",
            "--same-workers",
            "--json-out",
            str(out),
            "--log-dir",
            str(tmp_path),
        ]
    )
    assert res["shape"] == dict(
        vocab=256,
        hidden=64,
        mlp=128,
        layers=2,
        heads=4,
        kv_heads=2,
        head_dim=16,
        rope_theta=10000.0,
        norm_eps=1e-5,
        tied=True,
    )
    summary = res["summary"]
    _check_summary(summary, "float32", ["ours", "transformers"], [2])
    _check_summary(summary, "bfloat16", ["ours", "transformers bf16", "transformers autocast"], [2])
    # every side generated exactly slots x new tokens and trained rows x (prompt + new)
    for r in res["records"]:
        assert r["tokens"] == (2 * 4 if r["op"] == "decode" else 2 * 12)
        assert r["peak_tflops"] > 0
    assert (
        res["infos"]["float32"]["ours"]["params"]
        == res["infos"]["float32"]["transformers"]["params"]
    )
    assert json.loads(out.read_text())["summary"] == json.loads(json.dumps(summary))


def test_workload_is_the_same_for_every_side():
    bench = _load("real_model")
    a, b = bench.workload_prompts(3, 4, 8, 100), bench.workload_prompts(3, 4, 8, 100)
    assert a.shape == (4, 8) and (a == b).all() and a.min() >= 3 and a.max() < 100
    rows = bench.workload_rows(1, 3, 8, 4, 100)
    assert rows["tokens"].shape == (3, 12) and rows["behaviour_logp"].shape == (3, 4)
    assert rows["advantages"].tolist() == [1.0, -1.0, 1.0] and rows["num_prompts"] == 2


@pytest.mark.skipif(
    not os.path.exists("/tmp/tunix-venv/bin/python"),
    reason="no tunix virtualenv at /tmp/tunix-venv (bench/README.md says how to make one)",
)
def test_real_model_bench_runs_tunix_worker(tiny_llama, tmp_path):
    bench = _load("real_model")
    res = bench.main(
        [
            "--checkpoint",
            tiny_llama,
            "--dtypes",
            "float32",
            "--slots",
            "2",
            "--prompt",
            "8",
            "--new",
            "4",
            "--rows",
            "2",
            "--rounds",
            "1",
            "--peak-n",
            "128",
            "--no-torch-peak",
            "--same-workers",
            "--log-dir",
            str(tmp_path),
        ]
    )
    _check_summary(res["summary"], "float32", ["ours", "transformers", "tunix"], [2])
    assert res["infos"]["float32"]["tunix"]["params"] == res["infos"]["float32"]["ours"]["params"]


def test_gpu_gsm8k_summary_from_metrics_records():
    bench = _load("gpu_gsm8k")

    def ev(step, wall, rate, sampled, trained, eval_s=2.0):
        return dict(
            event="eval",
            step=step,
            wall_s=wall,
            pass_rate=rate,
            k=1,
            num_prompts=8,
            eval_seconds=eval_s,
            compute=dict(
                sampler_tokens=sampled,
                trainer_tokens=trained,
                sampler_flops=10.0 * sampled,
                trainer_flops=30.0 * trained,
            ),
        )

    recs = [
        dict(
            event="run",
            step=0,
            wall_s=0.0,
            config=dict(model=dict(name="m", compute_dtype="float32")),
        ),
        ev(0, 10.0, 0.25, 0, 0),
        dict(event="train", step=1, wall_s=20.0, train_s=5.0, step_s=9.0, batch_seq_tokens=100),
        dict(event="train", step=2, wall_s=22.0, train_s=1.0, step_s=2.0, batch_seq_tokens=100),
        dict(event="train", step=3, wall_s=24.0, train_s=1.0, step_s=2.0, batch_seq_tokens=100),
        ev(3, 30.0, 0.5, 600, 300),
    ]
    s = bench.summarise(recs, dict(float32=1000.0, bfloat16=2000.0))
    assert (s["start_pass_rate"], s["end_pass_rate"], s["end_step"], s["steps_done"]) == (
        0.25,
        0.5,
        3,
        3,
    )
    assert s["rl_span_s"] == 18.0 and s["sampled_tok_s"] == 600 / 18 and s["peak_tflops"] == 1e-9
    assert math.isclose(s["loop_mfu"], (6000 + 9000) / 18 / 1000)
    assert s["steady_steps"] == 2 and s["steady_trainer_tok_s"] == 100.0
    assert math.isclose(s["steady_trainer_mfu"], 100.0 * 30 / 1000)
    assert "0.250 (step 0) -> 0.500 (step 3)" in bench.table_row(s, "GPU X")


def test_gpu_gsm8k_smoke_runs_the_testbed_on_the_cpu(tmp_path):
    bench = _load("gpu_gsm8k")
    dry = bench.main(
        ["run", "--dry-run", "--checkpoint", "/ckpt", "--data", "/d.jsonl", "--steps", "7", "x.y=1"]
    )
    assert dry["command"][1:] == [
        os.path.join(ROOT, "experiments", "run.py"),
        "--recipe",
        "gsm8k",
        "--steps",
        "7",
        "--workdir",
        "/tmp/gpu_gsm8k/run",
        "--colocate",
        "--no-fit",
        "--hf-checkpoint",
        "/ckpt",
        "--data",
        "/d.jsonl",
        "eval.every_steps=10",
        "eval.num_prompts=1319",
        "eval.k=1",
        "x.y=1",
    ]
    s = bench.main(
        [
            "run",
            "--smoke",
            "--out",
            str(tmp_path),
            "--workdir",
            str(tmp_path / "run"),
            "--budget-s",
            "300",
        ]
    )
    assert s["run"]["returncode"] == 0 and s["run"]["stopped"] is None
    assert s["start_step"] == 0 and s["end_step"] == 2 and s["steps_done"] == 2
    assert 0 <= s["start_pass_rate"] <= 1 and 0 <= s["end_pass_rate"] <= 1
    assert s["sampled_tok_s"] > 0 and 0 < s["loop_mfu"] < 1 and s["peak"]["float32"] > 0
    assert {"summary.json", "metrics.jsonl", "run.log"} <= set(os.listdir(tmp_path))
    assert s["row"].startswith("| gsm8k on cpu")
