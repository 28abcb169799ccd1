"""experiments/fit.py on run directories written here with MetricsWriter and ComputeMeter."""
import importlib.util
import json
import os
import subprocess
import sys

import matplotlib.image as mpimg
import numpy as np
import pytest

from scalerl_jax.metrics import ComputeMeter, MetricsWriter
from scalerl_jax.scaling import sigmoid_law

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_spec = importlib.util.spec_from_file_location("experiments_fit",
                                               os.path.join(ROOT, "experiments", "fit.py"))
fit_cli = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fit_cli)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def write_run(workdir, A, B, C_mid, R0=0.2, steps=100, every=2, noise=0.004, seed=0,
              malformed=False):
    """A fake run: 3 sampler devices x 36 s and 1 trainer device x 12 s per step.

    malformed=True kills the writer half-way with a torn line, then resumes, as a crash would.
    """
    rng = np.random.default_rng(seed)
    meter = ComputeMeter(num_params=5e8, num_layers=12, hidden_size=1024)
    w = MetricsWriter(workdir)
    w.run({"recipe": os.path.basename(workdir)})
    for step in range(steps + 1):
        if step:
            meter.add_sampler(seconds=36.0, devices=3, tokens=4096, context_len=600)
            meter.add_trainer(seconds=12.0, devices=1, tokens=4096, context_len=400)
            w.train(step, loss=0.1)
        if step % every == 0:
            c = meter.compute()
            h = c["device_hours"]
            r = R0 if h == 0 else sigmoid_law(h, A, B, C_mid, R0)
            w.eval(step, pass_rate=r + noise * rng.standard_normal(), k=16, compute=c)
        if malformed and step == steps // 2:
            w.close()
            with open(os.path.join(workdir, "metrics.jsonl"), "a") as f:
                f.write('{"event": "train", "st')
            w = MetricsWriter(workdir)
            w.run({"recipe": os.path.basename(workdir)})
    w.close()
    return meter.compute()["flops"] / meter.compute()["device_hours"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    flops_per_hour = write_run(root / "scalerl", A=0.60, B=1.9, C_mid=0.8, malformed=True)
    write_run(root / "baseline", A=0.50, B=1.5, C_mid=1.0, seed=1)
    write_run(root / "stuck", A=0.2005, B=1.5, C_mid=1.0, seed=2)
    for s in range(3):  # 3 x 26 evaluations: pads to the same compiled shape as single runs
        write_run(root / "seeds" / f"seed{s}", A=0.60, B=1.9, C_mid=0.8, every=4, seed=10 + s)
    return root, flops_per_hour


def test_cli_table_pngs_and_json(runs, capsys):
    root, _ = runs
    dirs = [str(root / d) for d in ("scalerl", "baseline", "stuck", "seeds")]
    compare_dir = root / "cmp"
    # 100 resamples, as in test_scaling_fit, so the compiled shapes are shared.
    assert fit_cli.main(dirs + ["--bootstrap", "100", "--alternatives",
                                "--compare-dir", str(compare_dir)]) == 0
    out = capsys.readouterr().out
    header = out.splitlines()[0]
    for column in ("run", "A [95% CI]", "B [95% CI]", "C_mid [95% CI]", "RMSE", "R at target C",
                   "extrapolation"):
        assert column in header
    rows = {line.split()[0]: line for line in out.splitlines()[1:5]}
    assert set(rows) == {"scalerl", "baseline", "stuck", "seeds"}
    assert "no fit: flat" in rows["stuck"]
    assert "skipped 1 malformed line(s)" in out
    assert "seeds: per-seed A" in out and "power law" in out
    assert "scalerl vs baseline: A differs by" in out
    for d in dirs:
        png = os.path.join(d, "fit", "fit.png")
        with open(png, "rb") as f:
            assert f.read(8) == PNG_MAGIC
        assert os.path.getsize(png) > 20_000
        height, width = mpimg.imread(png).shape[:2]
        assert height >= 400 and width >= 600
    with open(compare_dir / "compare.png", "rb") as f:
        assert f.read(8) == PNG_MAGIC
    assert (compare_dir / "compare.txt").read_text().startswith(header)
    result = json.loads((root / "scalerl" / "fit" / "fit.json").read_text())
    assert result["fit"]["ok"] and abs(result["fit"]["A"] - 0.60) < 0.015
    lo, hi = result["bootstrap"]["intervals"]["A"]
    assert lo <= result["fit"]["A"] <= hi
    stuck = json.loads((root / "stuck" / "fit" / "fit.json").read_text())
    assert not stuck["fit"]["ok"] and "A" not in stuck["fit"] and stuck["fit"]["reason"]


def test_cli_flops_axis_and_pool(runs, capsys):
    root, flops_per_hour = runs
    seeds = [str(root / "seeds" / f"seed{s}") for s in range(3)]
    assert fit_cli.main(seeds + ["--pool", "--name", "pooled", "--x", "compute.flops",
                                 "--bootstrap", "0", "--extrapolate", "0", "--no-plots"]) == 0
    out = capsys.readouterr().out
    result = json.loads((root / "seeds" / "seed0" / "fit" / "fit.json").read_text())
    assert result["run"] == "pooled" and result["seeds"] == 3 and result["x_key"] == "compute.flops"
    assert result["fit"]["C_mid"] == pytest.approx(0.8 * flops_per_hour, rel=0.1)
    assert "pooled" in out and "per-seed A" in out
    assert fit_cli.main(seeds[:1] + ["--x", "compute.energy"]) == 2
    err = capsys.readouterr().err
    assert "lacks 'compute.energy'" in err and "device_hours" in err
    assert fit_cli.main([str(root / "nowhere")]) == 2
    assert "nowhere: not a directory" in capsys.readouterr().err


def test_documented_command_runs(runs):
    root, _ = runs
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "experiments", "fit.py"), str(root / "scalerl"),
         "--bootstrap", "0", "--extrapolate", "0", "--no-plots"],
        capture_output=True, text=True, timeout=300, cwd=str(root))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[1].startswith("scalerl")
