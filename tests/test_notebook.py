"""notebooks/quickstart.ipynb executed end to end with nbclient, on CPU, with tiny parameters.

The kernel is this interpreter (`sys.executable`, the venv's python under `make test`), through a
kernel spec written to a temporary directory and a KernelSpecManager that looks only there. Why
not the kernel name "python3": jupyter_client resolves it to an installed spec first (e.g.
~/.local/share/jupyter/kernels/python3, possibly another interpreter without scalerl_jax) and
falls back to the current interpreter only when there is none; and `ipykernel install --user`
would write into the user's home. A private spec needs nothing installed and cannot pick up
anything else.

Parameters are injected the way papermill does: a cell after the one tagged "parameters".
"""

import json
import os
import sys

import nbformat
import pytest

from conftest import smollm2_gguf

nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOK = os.path.join(ROOT, "notebooks", "quickstart.ipynb")
KERNEL = "scalerl-jax-test"

TINY_MODEL = [
    "model.hidden_size=32",
    "model.intermediate_size=64",
    "model.num_layers=1",
    "model.num_heads=2",
    "model.num_kv_heads=2",
    "data.num_validation=16",
    "eval.k=2",
    "pipeline.prompts_per_step=4",
    "pipeline.generations_per_prompt=4",
]


# Part 5 at CI size: one SFT step, one RL step of 1 prompt x 2 samples, 8 new tokens.
TINY_REAL = [
    "sft.batch_size=1",
    "sft.max_length=256",
    "sft.optim.warmup_steps=0",
    "sft.log_every=1",
    "pipeline.prompts_per_step=1",
    "pipeline.generations_per_prompt=2",
    "optim.micro_batches=1",
    "sampler.max_concurrent_decodes=2",
    "sampler.max_new_tokens=8",
    "sampler.max_target_length=264",
    "eval.num_prompts=2",
    "model.remat=false",
]  # remat doubles the compilation time on a CPU


def real_model_and_data():
    """(SmolLM2's HF directory, GSM8K's directory), or (None, why) when either is absent (an
    absent model fails under SCALERL_REQUIRE_MODEL: conftest.smollm2_gguf)."""
    from scalerl_jax.models import fetch

    gguf, why = smollm2_gguf()
    if gguf is None:
        return None, why
    gsm8k = os.path.join(os.path.dirname(ROOT), "shared", "data", "gsm8k")
    if not os.path.isfile(os.path.join(gsm8k, "train.jsonl")):
        return None, f"no GSM8K at {gsm8k}"
    pytest.importorskip("gguf")
    return fetch.from_gguf(gguf), gsm8k


def tiny_parameters(workdir: str, real_model=None, gsm8k=None) -> str:
    return "\n".join(
        [
            "# injected by tests/test_notebook.py",
            "SFT_STEPS = 20",
            "RL_STEPS = 3",
            "EVAL_PROMPTS = 16",
            "EVAL_EVERY = 3",
            f"OVERRIDES = {TINY_MODEL!r}",
            f"WORKDIR = {workdir!r}",
            f"REAL_MODEL = {real_model!r}",
            f"GSM8K = {gsm8k!r}",
            "REAL_EVAL_PROBLEMS = 2",
            "REAL_SFT_STEPS = 1",
            "REAL_RL_STEPS = 1",
            f"REAL_OVERRIDES = {TINY_REAL!r}",
            f"REAL_WORKDIR = {workdir + '-gsm8k'!r}",
        ]
    )


def inject_parameters(nb, source: str):
    """A copy of `nb` with a cell running `source` right after the "parameters" cell."""
    nb = nbformat.from_dict(json.loads(json.dumps(nb)))
    at = [i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", [])]
    assert len(at) == 1, "the notebook needs exactly one cell tagged 'parameters'"
    nb.cells.insert(
        at[0] + 1, nbformat.v4.new_code_cell(source, metadata={"tags": ["injected-parameters"]})
    )
    return nb


def kernel_manager(tmp_path):
    """A kernel manager whose only kernel is this interpreter running ipykernel."""
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import AsyncKernelManager

    spec_dir = tmp_path / "kernels" / KERNEL
    spec_dir.mkdir(parents=True)
    (spec_dir / "kernel.json").write_text(
        json.dumps(
            {
                "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                "display_name": f"Python ({sys.executable})",
                "language": "python",
            }
        )
    )
    specs = KernelSpecManager(kernel_dirs=[str(tmp_path / "kernels")], ensure_native_kernel=False)
    return AsyncKernelManager(kernel_name=KERNEL, kernel_spec_manager=specs)


def text_of(cell) -> str:
    parts = []
    for out in cell.get("outputs", []):
        if out.output_type == "stream":
            parts.append(out.text)
        elif out.output_type in ("execute_result", "display_data"):
            parts.append(out.data.get("text/plain", ""))
    return "".join(parts)


def has_image(cell) -> bool:
    return any(
        out.output_type == "display_data" and "image/png" in out.data
        for out in cell.get("outputs", [])
    )


def cell_with(nb, needle: str):
    found = [c for c in nb.cells if c.cell_type == "code" and needle in c.source]
    assert len(found) == 1, f"{len(found)} code cells contain {needle!r}"
    return found[0]


@pytest.mark.fast
def test_committed_notebook_has_no_outputs():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, cell.source[:80]


def test_quickstart_notebook_runs_on_cpu(tmp_path):
    workdir = str(tmp_path / "run")
    real_model, gsm8k = real_model_and_data()
    nb = inject_parameters(
        nbformat.read(NOTEBOOK, as_version=4),
        tiny_parameters(workdir, real_model, gsm8k if real_model else None),
    )
    env = {
        **os.environ,
        "JAX_PLATFORMS": "cpu",
        "XLA_FLAGS": "",  # one CPU device, as on Colab (conftest asks for 8 fake ones)
        "MPLBACKEND": "module://matplotlib_inline.backend_inline",
        "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
    }
    env.pop("SCALERL_REPO", None)
    client = nbclient.NotebookClient(
        nb,
        km=kernel_manager(tmp_path),
        timeout=600,
        resources={"metadata": {"path": str(tmp_path)}},
    )
    client.execute(env=env)  # raises CellExecutionError, with the cell's traceback, on an error

    install = text_of(cell_with(nb, "find_checkout"))
    assert "already importable" in install and "skipping the install" in install

    run = cell_with(nb, "trainer.run(cfg)")
    assert "final validation pass rate: " in text_of(run) and "(step 3)" in text_of(run)
    evals = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
    assert [e["step"] for e in evals if e["event"] == "eval"] == [0, 3]
    assert has_image(cell_with(nb, "eval_xy(log"))

    losses_out = text_of(cell_with(nb, "losses.policy_loss"))
    assert "cispo: loss=" in losses_out and "dapo: loss=" in losses_out, losses_out
    assert "refused: policy_loss: clip_eps_low=0.2 is not used by objective='gspo'" in losses_out

    fit_cell = cell_with(nb, "fit_curve(curve, spec)")
    out = text_of(fit_cell)
    assert "fitted: A = " in out and "C_mid = " in out and "rmse" in out
    fitted_a = float(out.split("fitted: A = ")[1].split()[0])
    assert abs(fitted_a - 0.610) < 0.05, out  # paper Table 1's A, 1% noise
    assert has_image(fit_cell) and (tmp_path / "synthetic_fit.png").exists()
    # Two evaluations are too few for the run's own fit: the reason is shown instead.
    assert "no fit of the run's own curve: too few points" in text_of(
        cell_with(nb, "run_fit_png =")
    )

    # Part 5: the real model evaluated, warmed up, trained for a step, exported, plotted.
    if real_model is None:
        assert "part 5 is skipped" in text_of(cell_with(nb, "preflight.hf_checkpoint(REAL_MODEL)"))
        pytest.skip(f"part 5 not run: {gsm8k}")
    setup = text_of(cell_with(nb, "preflight.hf_checkpoint(REAL_MODEL)"))
    assert "30 layers, hidden 576" in setup and "sized for this CPU" in setup, setup
    before = text_of(cell_with(nb, "evaluation.load_model(hf_checkpoint=model_dir)"))
    assert "before training (T=0): pass@1" in before and "over 2 problems" in before, before
    assert "completion: " in before
    real_cell = cell_with(nb, "trainer.run(gsm8k")
    real_dir = workdir + "-gsm8k"
    assert f"the policy as an HF checkpoint: {real_dir}/model" in text_of(real_cell)
    assert has_image(real_cell)
    records = [json.loads(line) for line in open(os.path.join(real_dir, "metrics.jsonl"))]
    assert [r["step"] for r in records if r["event"] == "eval"] == [0, 1]
    sft = json.load(open(os.path.join(real_dir, "sft", "summary.json")))
    assert sft["steps"] == 1 and sft["demonstrations"] == 7473 and sft["bad"] == 0, sft
    assert os.path.isfile(os.path.join(real_dir, "model", "config.json"))
