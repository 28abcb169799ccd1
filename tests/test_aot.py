"""`run.py --dry-run --compile`: every program of a run compiled ahead of time (plan/aot.py),
for a TPU slice described by libtpu on this CPU host, or for the local (fake CPU) devices.

The TPU tests need libtpu: installed, or in the directory SCALERL_LIBTPU_DIR names (`make
libtpu` puts it there; CI sets SCALERL_REQUIRE_LIBTPU=1, which turns the skip into a failure).
"""

import os
import sys

import pytest

from scalerl_jax.cli import run
from scalerl_jax.plan import aot


# A tiny Qwen2 under the scalerl recipe with short rows: every program of the run, quickly.
SMALL = [
    "--recipe",
    "scalerl",
    "--model",
    "tiny-qwen2",
    "sampler.max_prefill_length=64",
    "sampler.max_new_tokens=64",
    "sampler.max_target_length=128",
    "pipeline.prompts_per_step=4",
    "pipeline.generations_per_prompt=4",
]
PROGRAMS = ("state init", "train step", "weight sync 1", "decode state init", "prefill 1x64")
PROGRAMS += ("insert", "generate 66 slots x 1 steps, window 128")


def _need_libtpu():
    if aot.has_libtpu():
        return
    why = f"libtpu not installed (make libtpu, then {aot.LIBTPU_DIR}=DIR): {aot.install_hint()}"
    if os.environ.get("SCALERL_REQUIRE_LIBTPU"):
        pytest.fail(why)
    pytest.skip(why)


@pytest.fixture(scope="module")
def v5p_small():
    """(exit status, printed lines, compiled programs, target) of `run.py --compile --tpu
    v5p:2x2x1` on SMALL, at the matmul precision a run uses (conftest sets "highest" for the
    CPU tests: on a TPU that compiles multi-pass fp32 matmuls with their own temporaries)."""
    import jax

    _need_libtpu()
    seen: list = []
    out: list = []
    mp = pytest.MonkeyPatch()
    mp.setattr(aot, "compile_all", _recording(aot.compile_all, seen))
    mp.setattr("builtins.print", lambda *a, **k: out.append(" ".join(map(str, a))))
    try:
        with jax.default_matmul_precision(None):
            code = run.main(["--compile", "--tpu", "v5p:2x2x1", *SMALL])
    finally:
        mp.undo()
    programs, target = seen
    return code, "\n".join(out), programs, target


def _recording(fn, seen):
    def wrapper(cfg, devices, target, *a, **k):
        done = fn(cfg, devices, target, *a, **k)
        seen.extend([done, target])
        return done

    return wrapper


def test_every_program_compiles_for_v5p_and_fits(v5p_small):
    code, text, programs, target = v5p_small
    assert code == 0, text
    assert [p.name for p in programs] == list(PROGRAMS)
    assert target.name == "v5p-8" and target.budget == 95 * 2**30
    for p in programs:
        assert p.name in text
        assert p.total > 0 and p.need <= target.budget, p
        assert p.bytes_accessed > 0, p
        assert 0 < p.lowering < p.seconds, p  # the Python side, part of the whole
    step = programs[1]
    assert step.flops > 0 and step.aliases > 0  # the donated state
    assert "roofline" in text and "programs in" in text


def test_planner_and_xla_agree_on_the_big_programs(v5p_small):
    """The planner refuses runs by its own estimate, so it counts what the scanned programs
    hold (plan/estimate.py): the train step's stacked residuals, then either one fp32 logits
    chunk or one layer's set and its gradients (the head's and the layers' backward run one
    after the other), minor axes in whole 128-lane tiles; the decode step's scores and logits
    and, with head_dim < 128, the copy of the KV cache its layer scan carries with head_dim
    minor. XLA's bytes per chip then stay within 1.5x of the estimate either way: here (d=64,
    head_dim 16, splash attention) 1.35x over it for the train step, 1.27x for generate;
    qwen2.5-0.5b as planned for v5p:2x2x1 1.06x, llama-3.1-8b on v5p-256 0.85x
    (bench/README.md)."""
    _, _, programs, _ = v5p_small
    by_name = {p.name: p for p in programs}
    for name in ("train step", PROGRAMS[-1]):
        p = by_name[name]
        assert p.estimate is not None
        assert 1 / 1.5 <= p.total / p.estimate <= 1.5, (name, p.total, p.estimate)


def test_a_program_that_does_not_fit_is_named_with_its_figures(v5p_small):
    _, _, programs, target = v5p_small
    small = aot.Target("v5p-8", 1 << 20, target.chip, False, target.trainer, target.sampler)
    line = aot.problem(programs, small)
    assert line is not None and line.startswith("state init does not fit v5p-8")
    assert "XLA's count" in line and "1.0 GiB" not in line and "\n" not in line
    assert aot.problem(programs, target) is None


@pytest.mark.fast
def test_missing_libtpu_is_one_line_naming_the_install(monkeypatch, capsys):
    monkeypatch.setattr(aot, "has_libtpu", lambda: False)
    code = run.main(["--compile", "--tpu", "v5p-8", *SMALL])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1, err
    import jax

    assert f'pip install "jax[tpu]=={jax.__version__}"' in err[0]
    assert aot.LIBTPU_DIR in err[0]


def test_libtpu_dir_is_put_on_the_path(monkeypatch, tmp_path):
    (tmp_path / "libtpu").mkdir()
    (tmp_path / "libtpu" / "__init__.py").write_text("")
    monkeypatch.setattr(sys, "path", list(sys.path))  # restored afterwards
    monkeypatch.setenv(aot.LIBTPU_DIR, str(tmp_path))
    assert aot.has_libtpu()
    assert sys.path[0] == str(tmp_path)


def test_local_devices_compile_the_same_programs(monkeypatch, capsys):
    """No --tpu: the programs compile for this host's devices (the 8 fake CPUs) the same way;
    colocated, the train step's chip also holds the sampler's weights and decode state."""
    seen: list = []
    monkeypatch.setattr(aot, "compile_all", _recording(aot.compile_all, seen))
    code = run.main(["--compile", *SMALL, "--colocate", "mesh.fsdp=8"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "compile for 8 cpu device(s)" in out
    programs, target = seen
    assert [p.name for p in programs[:-1]] == list(PROGRAMS[:-1])
    assert programs[-1].name == "generate 64 slots x 1 steps, window 128"  # as configured
    assert target.colocated and target.chip is None
    by_name = {p.name: p for p in programs}
    sampler_side = programs[-1].arguments
    assert 0.5 < by_name["train step"].resident / sampler_side < 2  # its params + decode state
    assert by_name["state init"].resident == 0  # before the sampler exists


def test_stacked_weights_cut_for_the_sync_add_their_slice_writes(monkeypatch, capsys):
    """MLP weights of 1.5 MiB (3 layers x 64 x 4096, bf16) with 1 MiB sync groups are cut into
    2-layer slices that the sampler writes into its copy in place: one donated slice write per
    weight shape (gate/up, down), compiled for the local devices. Its chip holds the weights
    decoding meanwhile, the rest of the next weights (less the one it writes: its output,
    aliased to the donated copy) and the decode state; generate reads the params and the
    decode state, with the next weights (one more copy of the params) held beside it."""
    seen: list = []
    compile_all = aot.compile_all

    def writes_and_generate(cfg, devices, target, *a, **k):
        keep = ("weight slice write", "generate")
        return compile_all(cfg, devices, target, *a, **k, select=lambda n: n.startswith(keep))

    monkeypatch.setattr(aot, "compile_all", _recording(writes_and_generate, seen))
    cut = ["model.num_layers=3", "model.intermediate_size=4096", "sampler.weight_sync_group_mib=1"]
    code = run.main(["--compile", *SMALL, *cut])
    out = capsys.readouterr().out
    assert code == 0, out
    programs, target = seen
    *writes, generate = programs
    assert [p.name for p in writes] == ["weight slice write 1", "weight slice write 2"]
    assert generate.name.startswith("generate") and not target.colocated
    for p in writes:
        assert p.name in out and p.estimate is None
        assert p.aliases == p.outputs == 3 * 64 * 4096 * 2 // 4  # the copy's shard (tensor 4)
        assert p.arguments == p.outputs + 2 * 64 * 4096 * 2 // 4 + 4  # + the slice, the start
        assert p.total == p.arguments and p.temporaries == 0
        assert p.resident + p.outputs == generate.arguments + generate.resident
    assert 0 < generate.resident < generate.arguments  # the incoming params


def test_programs_for_a_tpu_are_traced_with_the_tpu_kernels():
    """On a CPU host the TPU programs must still take the TPU's code paths (here MoE's native
    ragged_dot instead of the CPU's blocked matmul)."""
    import jax
    import jax.numpy as jnp

    from scalerl_jax.models import layers, moe

    args = (jnp.ones((16, 8)), jnp.ones((2, 8, 4)), jnp.array([8, 8], jnp.int32))

    def primitives():  # a new function each time: make_jaxpr caches traces by function
        return str(jax.make_jaxpr(lambda *a: moe.grouped_matmul(*a))(*args))

    assert "ragged_dot" not in primitives()
    with layers.target_platform("tpu"):
        assert layers._platform() == "tpu"
        assert "ragged_dot" in primitives()
    assert layers._platform() == "cpu"


def test_a_program_xla_refuses_for_lack_of_hbm_is_named():
    """XLA refuses to compile a program whose buffers exceed the chip's HBM: that is a plan
    that does not fit, reported with XLA's figures, not a crash."""
    _need_libtpu()
    from scalerl_jax import plan, recipes
    from scalerl_jax.config import apply_overrides

    cfg = apply_overrides(
        recipes.get("scalerl", model="tiny-qwen2"),
        ["sampler.max_concurrent_decodes=4096", "sampler.max_target_length=1048576"],
    )
    topo = plan.topology("v5p-8")
    target = aot.Target(topo.name, int(95 * 2**30), topo.chip, False)
    done = aot.compile_all(
        cfg, aot.tpu_devices(topo), target, select=lambda name: name == "decode state init"
    )
    assert [p.name for p in done] == ["decode state init"]
    assert done[0].refused and "HBM" in done[0].refused
    line = aot.problem(done, target)
    assert line.startswith("decode state init does not fit v5p-8: ") and "\n" not in line
