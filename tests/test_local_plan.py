"""plan/local.py: a run's memory estimate on this machine's devices (host RAM on CPU, device memory
elsewhere), the one-line refusal with the largest items and settings that fit, and the CLI: a run
that cannot fit exits 2 before allocating anything; `--dry-run` alone prints the local plan."""

import dataclasses

import pytest

from scalerl_jax import recipes
from scalerl_jax.config import apply_overrides
from scalerl_jax.models import hf
from scalerl_jax.plan import GIB, local
from test_cli import refused
from test_run import run_cli

# config.json of SmolLM2-135M-Instruct as experiments/fetch_model.py converts it from the GGUF.
SMOLLM2 = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "head_dim": 64,
    "vocab_size": 49152,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5,
    "hidden_act": "silu",
    "rope_parameters": {"rope_theta": 100000.0, "rope_type": "default"},
    "tie_word_embeddings": True,
    "attention_bias": False,
    "mlp_bias": False,
}


def _cpu(gib, devices=1):
    return local.Machine("cpu", "cpu", devices, int(gib * GIB), "test", shared=True)


def _issue_run():
    """The run of issue 24: `--recipe scalerl --hf-checkpoint SmolLM2 --colocate`, which the
    kernel killed on a 24 GB machine."""
    cfg = recipes.get("scalerl")
    m = hf.config_from_hf(SMOLLM2, name="SmolLM2-135M").replace(
        param_dtype=cfg.model.param_dtype,
        compute_dtype=cfg.model.compute_dtype,
        fp32_head=cfg.model.fp32_head,
    )
    return dataclasses.replace(cfg, model=m, mesh=dataclasses.replace(cfg.mesh, colocate=True))


def test_host_memory_takes_the_lower_of_meminfo_and_a_cgroup_limit(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24684084 kB\nMemAvailable:    8388608 kB\n")
    limit, usage = tmp_path / "memory.max", tmp_path / "memory.current"
    limit.write_text(f"{4 * GIB}\n")
    usage.write_text(f"{GIB}\n")
    assert local.host_memory(str(meminfo), ((str(limit), str(usage)),)) == (
        3 * GIB,
        "cgroup limit memory.max minus usage",
    )
    limit.write_text("max\n")  # cgroup v2 without a limit
    assert local.host_memory(str(meminfo), ((str(limit), str(usage)),)) == (8 * GIB, "MemAvailable")


@pytest.mark.fast
def test_the_issue_run_is_refused_with_its_kv_cache_and_settings_that_fit():
    cfg, machine = _issue_run(), _cpu(24 * 0.93)  # 24 GB of RAM, most of it available
    plan = local.local_plan(cfg, machine)
    # 64 slots x 16,448 positions x 30 layers x (k, v) x 3 kv heads x 64 dims x 2 bytes (bf16)
    assert plan.sampler.kv_cache == 64 * 16448 * 30 * 2 * 3 * 64 * 2
    assert not plan.fits
    line = local.explain(plan)
    assert "\n" not in line
    assert line.startswith("SmolLM2-135M does not fit this machine: it needs ")
    assert "KV cache (64 slots x 16,448 tokens per device) 22.6 GiB" in line
    assert "activations (768 rows x 16,384 tokens per micro-batch per device, remat off)" in line
    settings = line.split("Settings that fit: ")[1].split()
    assert {s.partition("=")[0] for s in settings} <= {
        "model.remat",
        "optim.micro_batches",
        "sampler.max_concurrent_decodes",
        "sampler.max_new_tokens",
        "sampler.max_target_length",
        "sampler.think_min",
        "sampler.think_max",
        "sampler.answer_budget",
    }
    fixed = apply_overrides(cfg, settings)  # valid settings, and with them it fits
    assert local.local_plan(fixed, machine).fits
    assert fixed.sampler.think_max + fixed.sampler.answer_budget <= fixed.sampler.max_new_tokens


def test_fewer_slots_are_proposed_before_shorter_lengths():
    cfg = apply_overrides(recipes.testbed(), ["sampler.max_concurrent_decodes=65536"])
    need = local.local_plan(cfg, _cpu(1000)).need
    kv_per_slot = local.local_plan(cfg, _cpu(1000)).sampler.kv_cache / 65536
    machine = _cpu((need - 60000 * kv_per_slot) / GIB / 0.9)  # room for ~5,000 slots
    assert local.fitting_settings(cfg, machine) == ["sampler.max_concurrent_decodes=4096"]


def test_shared_ram_sums_the_devices_and_device_memory_takes_the_fullest():
    cfg = apply_overrides(recipes.testbed(), ["mesh.colocate=false"])
    ram = local.local_plan(cfg, _cpu(100, devices=8))
    assert (ram.trainer_devices, ram.sampler_devices) == (4, 4)
    assert ram.trainer_mesh == {"data": 1, "fsdp": 4, "tensor": 1, "expert": 1}
    assert ram.need == 4 * ram.trainer.peak + 4 * ram.sampler.peak
    gpu = local.local_plan(cfg, dataclasses.replace(_cpu(100, devices=8), shared=False))
    assert gpu.need == max(gpu.trainer.peak, gpu.sampler.peak)
    colocated = local.local_plan(recipes.testbed(), dataclasses.replace(_cpu(100, 8), shared=False))
    assert colocated.need == colocated.trainer.peak + colocated.sampler.peak


def test_a_machine_nothing_fits_says_so():
    plan = local.local_plan(_issue_run(), _cpu(0.01))
    assert local.explain(plan).endswith(
        "No shorter lengths, remat, micro-batches or decode "
        "slots fit: use a smaller model or a machine with more "
        "memory"
    )


def test_the_testbed_fits_this_machine():
    machine = local.detect()
    assert machine.platform == "cpu" and machine.shared and machine.free > 0
    plan = local.local_plan(recipes.testbed(), machine)
    assert plan.fits, local.format_local(plan)


# --------------------------------------------------------------------------------- the CLI
def test_cli_refuses_a_run_that_cannot_fit_before_allocating(tmp_path):
    workdir = tmp_path / "w"
    done = run_cli(
        "--workdir", str(workdir), "--steps", "3", "sampler.max_concurrent_decodes=10000000"
    )
    refused(
        done,
        "testbed does not fit this machine: it needs",
        "KV cache (10000000 slots x 96 tokens per device)",
        "Settings that fit: sampler.max_concurrent_decodes=",
        "(--dry-run prints the whole plan)",
    )
    assert not workdir.exists()  # refused before the trainer started


def test_dry_run_without_tpu_prints_this_machines_plan():
    done = run_cli("--dry-run", "--steps", "3", "sampler.max_concurrent_decodes=8")
    assert done.returncode == 0, done.stderr[-2000:]
    out = done.stdout
    assert out.startswith("local plan for testbed (") and "on this machine" in out
    assert "1 cpu device (cpu): " in out and "shared host RAM (MemAvailable" in out
    assert "8 decode slots (8 per device), KV cache length 96" in out
    assert out.strip().splitlines()[-1].endswith(": fits")
