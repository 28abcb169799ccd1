"""experiments/run.py as users meet it: every bad input ends in one line naming the flag, the
value and what would work, with exit status 2 and no traceback (unless --debug); `--help`,
`--recipe list`, `--dry-run --tpu`. Nothing here trains or compiles: each command stops before."""

import json
import os
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from scalerl_jax import recipes
from scalerl_jax.config import apply_overrides
from test_run import ROOT, TINY, run_cli


def refused(done, *needles):
    """Exit status 2, the error as the last stderr line, no traceback; returns that line."""
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith("run.py: error: "), line
    for needle in needles:
        assert needle in line, (needle, line)
    return line


def test_missing_data_file_is_named_before_any_tokenizer_talk():
    line = refused(
        run_cli("--data", "/no/such/file.jsonl"),
        "--data /no/such/file.jsonl: no such file or directory",
    )
    assert "tokenizer" not in line


@pytest.mark.fast
def test_unknown_model_preset_lists_the_presets():
    refused(
        run_cli("--model", "nonexistent"),
        "--model nonexistent: unknown model preset",
        "llama-3.1-8b",
        "qwen3-0.6b",
        "--hf-checkpoint",
    )


def test_model_with_the_testbed_is_refused_not_ignored():
    refused(
        run_cli("--model", "qwen3-0.6b"),
        "--model qwen3-0.6b: recipe testbed defines its own model",
        "--recipe scalerl --model qwen3-0.6b",
    )


def test_unknown_recipe_lists_the_recipes():
    refused(
        run_cli("--recipe", "nope"),
        "--recipe nope: invalid choice",
        "scalerl",
        "testbed",
        "--recipe list",
    )


def test_recipe_list_prints_every_recipe_with_a_description():
    done = run_cli("--recipe", "list")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert [line.split()[0] for line in lines] == [n for n, _ in recipes.describe()]
    assert all(len(line.split(None, 1)) == 2 for line in lines)


def test_missing_hf_checkpoint_and_one_without_config(tmp_path):
    refused(
        run_cli("--recipe", "scalerl", "--hf-checkpoint", "/no/such/dir"),
        "--hf-checkpoint /no/such/dir: no such directory",
    )
    (tmp_path / "model.safetensors").write_bytes(b"")
    refused(
        run_cli("--recipe", "scalerl", "--hf-checkpoint", str(tmp_path)),
        f"--hf-checkpoint {tmp_path}: no config.json there",
    )


def test_data_file_with_the_testbed_needs_a_tokenizer(tmp_path):
    data = tmp_path / "train.jsonl"
    data.write_text(json.dumps({"problem": "1+1", "answer": "2"}) + "\n")
    refused(
        run_cli("--data", str(data)),
        f"--data {data}: text prompts need a tokenizer",
        "--hf-checkpoint DIR",
    )


@pytest.mark.parametrize("kind", ["parquet", "jsonl"])
def test_other_column_names_are_listed_with_the_override_that_maps_them(tmp_path, kind):
    data = tmp_path / f"train.{kind}"
    rows = [{"question": "1+1", "final_answer": "2", "level": 1}]
    if kind == "parquet":
        pq.write_table(pa.Table.from_pylist(rows), data)
    else:
        data.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    refused(
        run_cli("--data", str(data)),
        f"--data {data}: no column 'problem' (data.prompt_field) nor 'answer' (data.answer_field)",
        "['question', 'final_answer', 'level']",
        "data.prompt_field=question data.answer_field=final_answer",
    )
    # Mapped, the columns pass and the next missing piece (a tokenizer) is named.
    refused(
        run_cli(
            "--data", str(data), "data.prompt_field=question", "data.answer_field=final_answer"
        ),
        "text prompts need a tokenizer",
    )


def test_separate_sampler_on_one_device_points_at_colocate(tmp_path):
    refused(
        run_cli(
            "--recipe",
            "scalerl",
            "--model",
            "tiny-llama",
            "--data",
            "synthetic:countup?num=100",
            "--workdir",
            str(tmp_path / "w"),
        ),
        "1 cpu device on this host",
        "pass --colocate (= mesh.colocate=true)",
    )
    assert not (tmp_path / "w").exists()


def test_bad_overrides_and_flags_name_the_key():
    refused(run_cli("optim.nope=1"), "OptimConfig has no field 'nope'")
    refused(run_cli("--steps", "0"), "--steps: expected a positive integer, got '0'")
    refused(
        run_cli("reward.verifier=nowhere_module:fn"),
        "reward.verifier=nowhere_module:fn: cannot import nowhere_module",
    )


def test_overrides_anywhere_on_the_line(tmp_path):
    """KEY=VALUE after, between and before flags: all reach the config (a bad one is named by
    the config, not called an unrecognized argument)."""
    refused(
        run_cli("--steps", "3", "--workdir", str(tmp_path), "optim.nope=1"),
        "OptimConfig has no field 'nope'",
    )
    done = run_cli(
        "sampler.top_k=5",
        "--dry-run",
        "sampler.max_concurrent_decodes=8",
        "--steps",
        "3",
        "--workdir",
        str(tmp_path / "w"),
        "sampler.max_target_length=64",
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "8 decode slots (8 per device), KV cache length 64" in done.stdout


def test_debug_shows_the_traceback():
    done = run_cli("--debug", "--model", "nonexistent")
    assert done.returncode != 0 and "Traceback" in done.stderr and "UsageError" in done.stderr


def test_help_shows_defaults_and_examples():
    done = run_cli("--help")
    assert done.returncode == 0
    out = done.stdout
    assert "(default: testbed)" in out and "(default: 0.4)" in out
    assert "examples:" in out and "--dry-run --tpu v5p-64 --recipe scalerl" in out
    for flag in (
        "--allow-config-change",
        "--wandb",
        "--no-fit",
        "--colocate",
        "--tpu",
        "--dry-run",
        "--debug",
        "KEY.PATH=VALUE",
    ):
        assert flag in out


# ------------------------------------------------------------------------------ --tpu plans
def _memory_row(out, label):
    line = next(x for x in out.splitlines() if x.strip().startswith(label))
    return [float(v) for v in line[len(line) - len(line.lstrip()) + 30 :].split()[:2] if v != "-"]


def test_dry_run_v5p_256_scalerl_8b_plan():
    done = run_cli(
        "--dry-run", "--tpu", "v5p-256", "--recipe", "scalerl", "--model", "llama-3.1-8b"
    )
    out = done.stdout
    assert "plan for llama-3.1-8b" in out and "32 hosts x v5p chips = 128 chips" in out
    assert "every host: chip 0 train, chips 1-3 sample" in out
    assert "mesh data=1 fsdp=32 tensor=1" in out and "mesh data=3 tensor=1" in out
    assert "trainer fits, sampler fits" in out
    # Hand-computed from the preset: fp32 params fsdp-sharded 32 ways except the replicated
    # RMSNorm scales; AdamW keeps two moments of the same size.
    m = recipes.get("scalerl", model="llama-3.1-8b").model
    norms = (2 * m.num_layers + 1) * m.hidden_size
    params = 4 * ((m.num_params() - norms) / 32 + norms) / (1 << 30)
    assert _memory_row(out, "params")[0] == round(params, 2)
    assert _memory_row(out, "optimizer (AdamW")[0] == round(2 * params, 2)
    assert "PFLOP (6N + attention)" in out and "40% MFU" in out and "step      ~" in out
    assert done.returncode == 0, done.stderr  # 48 prompts over 32 hosts: uneven shares


def test_dry_run_fits_and_exits_zero_on_v5p_64():
    done = run_cli("--dry-run", "--tpu", "v5p-64", "--recipe", "scalerl", "--model", "llama-3.1-8b")
    assert done.returncode == 0, done.stderr
    assert "trainer fits, sampler fits" in done.stdout and "PROBLEM" not in done.stdout
    assert "a real run needs --hf-checkpoint DIR" in done.stdout


def test_dry_run_impossible_plan_fails_with_the_numbers():
    done = run_cli("--dry-run", "--tpu", "v5e-8", "--recipe", "scalerl", "--model", "llama-3.1-70b")
    assert "DOES NOT FIT" in done.stdout
    refused(
        done,
        "--tpu v5e-8: llama-3.1-70b does not fit on v5e-8 (14.4 GiB usable of 16 GiB "
        "per chip): each chip trains and samples and needs",
        "trainer: params 32.9",
        "sampler: params 16.7",
    )


def test_dry_run_initialises_no_jax_backend():
    """--dry-run must be safe on a TPU VM whose chips a running job holds: no backend starts."""
    script = (
        "from scalerl_jax.cli import run; "
        "rc = run.main(['--dry-run', '--tpu', 'v5p-64', '--recipe', 'scalerl']); "
        "from jax._src import xla_bridge; print('backends', rc, dict(xla_bridge._backends))"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env={**os.environ, "XLA_FLAGS": ""},
    )
    assert "backends 0 {}" in done.stdout, done.stdout[-2000:] + done.stderr[-2000:]


def test_unknown_topology():
    refused(
        run_cli("--dry-run", "--tpu", "v9-8"),
        "--tpu v9-8: unknown TPU topology",
        "v5p-256",
        "v5e-8",
        "v6e-16",
        "v4-8",
    )


def test_tpu_on_other_hardware_says_what_it_expected_and_found():
    refused(
        run_cli("--tpu", "v5p-8"),
        "--tpu v5p-8 expects 4 TPU v5p chips on 1 host(s)",
        "found 1 cpu device(s)",
        "tpu/pod.sh launch",
        "--dry-run",
    )


# ------------------------------------------------------------------------------ a done run
def test_rerunning_a_finished_run_says_it_is_complete(tmp_path):
    workdir = tmp_path / "run"
    (workdir / "checkpoints" / "5").mkdir(parents=True)
    (workdir / "checkpoints" / "5" / "scalerl_manifest.json").write_text("{}")
    cfg = apply_overrides(recipes.testbed(), TINY)
    (workdir / "config.json").write_text(json.dumps(cfg.to_dict()))
    done = run_cli("--workdir", str(workdir), "--steps", "5", *TINY)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (
        f"run already complete at step 5 in {workdir} (--steps 5); raise --steps above 5 "
        f"to continue; no scaling fit in it yet: python experiments/fit.py {workdir}" in done.stdout
    )
    assert sorted(os.listdir(workdir)) == ["checkpoints", "config.json"]  # nothing started
    (workdir / "fit").mkdir()
    (workdir / "fit" / "fit.txt").write_text("A 0.7\n")
    done = run_cli("--workdir", str(workdir), "--steps", "5", *TINY)
    assert done.returncode == 0 and f"its scaling fit: {workdir}/fit/fit.txt" in done.stdout
