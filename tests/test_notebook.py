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

nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOK = os.path.join(ROOT, "notebooks", "quickstart.ipynb")
KERNEL = "scalerl-jax-test"

TINY_MODEL = ["model.hidden_size=32", "model.intermediate_size=64", "model.num_layers=1",
              "model.num_heads=2", "model.num_kv_heads=2", "data.num_validation=16",
              "eval.k=2", "pipeline.prompts_per_step=4", "pipeline.generations_per_prompt=4"]


def tiny_parameters(workdir: str) -> str:
    return "\n".join([
        "# injected by tests/test_notebook.py",
        "SFT_STEPS = 20", "RL_STEPS = 3", "EVAL_PROMPTS = 16", "EVAL_EVERY = 3",
        f"OVERRIDES = {TINY_MODEL!r}", f"WORKDIR = {workdir!r}",
    ])


def inject_parameters(nb, source: str):
    """A copy of `nb` with a cell running `source` right after the "parameters" cell."""
    nb = nbformat.from_dict(json.loads(json.dumps(nb)))
    at = [i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", [])]
    assert len(at) == 1, "the notebook needs exactly one cell tagged 'parameters'"
    nb.cells.insert(at[0] + 1, nbformat.v4.new_code_cell(
        source, metadata={"tags": ["injected-parameters"]}))
    return nb


def kernel_manager(tmp_path):
    """A kernel manager whose only kernel is this interpreter running ipykernel."""
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import AsyncKernelManager

    spec_dir = tmp_path / "kernels" / KERNEL
    spec_dir.mkdir(parents=True)
    (spec_dir / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": f"Python ({sys.executable})", "language": "python"}))
    specs = KernelSpecManager(kernel_dirs=[str(tmp_path / "kernels")],
                              ensure_native_kernel=False)
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
    return any(out.output_type == "display_data" and "image/png" in out.data
               for out in cell.get("outputs", []))


def cell_with(nb, needle: str):
    found = [c for c in nb.cells if c.cell_type == "code" and needle in c.source]
    assert len(found) == 1, f"{len(found)} code cells contain {needle!r}"
    return found[0]


def test_committed_notebook_has_no_outputs():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, cell.source[:80]


def test_quickstart_notebook_runs_on_cpu(tmp_path):
    workdir = str(tmp_path / "run")
    nb = inject_parameters(nbformat.read(NOTEBOOK, as_version=4), tiny_parameters(workdir))
    env = {**os.environ, "JAX_PLATFORMS": "cpu",
           "XLA_FLAGS": "",  # one CPU device, as on Colab (conftest asks for 8 fake ones)
           "MPLBACKEND": "module://matplotlib_inline.backend_inline",
           "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]).rstrip(
               os.pathsep)}
    env.pop("SCALERL_REPO", None)
    client = nbclient.NotebookClient(nb, km=kernel_manager(tmp_path), timeout=600,
                                     resources={"metadata": {"path": str(tmp_path)}})
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
        cell_with(nb, "run_fit_png ="))
