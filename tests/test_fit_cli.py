"""experiments/fit.py on run directories written here with MetricsWriter and ComputeMeter."""

import json
import os
import subprocess
import sys

import matplotlib.image as mpimg
import numpy as np
import pytest

from scalerl_jax.cli import fit as fit_cli
from scalerl_jax.metrics import ComputeMeter, MetricsWriter
from scalerl_jax.scaling import sigmoid_law

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def write_run(
    workdir, A, B, C_mid, R0=0.2, steps=100, every=2, noise=0.004, seed=0, malformed=False
):
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
    assert (
        fit_cli.main(
            dirs + ["--bootstrap", "100", "--alternatives", "--compare-dir", str(compare_dir)]
        )
        == 0
    )
    out = capsys.readouterr().out
    header = out.splitlines()[0]
    for column in (
        "run",
        "A [95% CI]",
        "B [95% CI]",
        "C_mid [95% CI]",
        "RMSE",
        "R at target C",
        "extrapolation",
    ):
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
    assert result["bootstrap"]["method"] == "ar1" and 0 <= result["bootstrap"]["rho"] <= 0.97
    assert "intervals: AR(1) residual bootstrap (rho " in out
    stuck = json.loads((root / "stuck" / "fit" / "fit.json").read_text())
    assert not stuck["fit"]["ok"] and "A" not in stuck["fit"] and stuck["fit"]["reason"]


def test_cli_flops_axis_and_pool(runs, capsys):
    root, flops_per_hour = runs
    seeds = [str(root / "seeds" / f"seed{s}") for s in range(3)]
    assert (
        fit_cli.main(
            seeds
            + [
                "--pool",
                "--name",
                "pooled",
                "--x",
                "compute.flops",
                "--bootstrap",
                "0",
                "--extrapolate",
                "0",
                "--no-plots",
            ]
        )
        == 0
    )
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


def test_block_length_needs_the_pairs_interval(runs, capsys):
    root, _ = runs
    assert fit_cli.main([str(root / "scalerl"), "--block", "4", "--no-plots"]) == 2
    assert "--block 4 applies to --interval pairs only" in capsys.readouterr().err


def test_documented_command_runs(runs):
    root, _ = runs
    proc = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "experiments", "fit.py"),
            str(root / "scalerl"),
            "--bootstrap",
            "0",
            "--extrapolate",
            "0",
            "--no-plots",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=str(root),
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[1].startswith("scalerl")


@pytest.mark.fast
def test_readable_numbers():
    from scalerl_jax.scaling.plot import readable

    assert readable(2470.3) == "2,470" and readable(2424.9) == "2,420"
    assert readable(0.0123456) == "0.0123" and readable(0.5) == "0.500"
    assert readable(999_999.0) == "1e+06" and readable(123_456.0) == "123,000"
    assert readable(2.5e7) == "2.5e+07" and readable(4e-4) == "0.0004" and readable(0) == "0"
    assert readable(float("nan")) == "n/a"


def test_out_dir_and_fit_end_check_the_points_after_it(runs, capsys):
    root, _ = runs
    run_dir = str(root / "scalerl")
    before = sorted(os.listdir(os.path.join(run_dir, "fit")))
    outs = {end: root / f"window{end}" for end in (1.0, 2.0)}
    for end, out in outs.items():  # two windows of one run, side by side
        assert (
            fit_cli.main(
                [
                    run_dir,
                    "--fit-start",
                    "0.2",
                    "--fit-end",
                    str(end),
                    "--out",
                    str(out),
                    "--bootstrap",
                    "0",
                    "--target",
                    "5",
                ]
            )
            == 0
        )
    text = capsys.readouterr().out
    assert sorted(os.listdir(os.path.join(run_dir, "fit"))) == before  # RUN_DIR/fit untouched
    from scalerl_jax.scaling import report

    curve, _ = report.load_curve([run_dir])
    for end, out in outs.items():
        result = json.loads((out / "scalerl" / "fit.json").read_text())
        fit = result["fit"]
        assert fit["ok"] and fit["x_range"][1] <= end and fit["x_range"][0] >= 0.2
        # Inclusive window: the first point at or after 0.2 is in it.
        assert fit["x_range"][0] == pytest.approx(curve.x[curve.x >= 0.2].min())
        e = result["extrapolation"]
        after = curve.x > end
        assert e["mode"] == "after fit_end" and e["split"] == end
        assert e["n_heldout"] == int(after.sum())
        pred = sigmoid_law(curve.x[after], fit["A"], fit["B"], fit["C_mid"], fit["R0"])
        assert e["rmse"] == pytest.approx(np.sqrt(np.mean((pred - curve.y[after]) ** 2)), rel=1e-6)
        assert e["final_err"] == pytest.approx(pred[-1] - curve.y[after][-1], rel=1e-6)
        assert (out / "scalerl" / "fit.png").exists()
    from scalerl_jax.scaling.plot import readable

    row = [line for line in text.splitlines() if line.startswith("scalerl")][-1]
    assert f"{int((curve.x > 2.0).sum())} pts after 2.00: RMSE" in row
    lo, hi = fit["x_range"]  # the x range fitted
    assert f"  {readable(lo)}-{readable(hi)}  " in row and readable(hi) == "2.00"
    assert "e+0" not in row and "e-0" not in row  # C_mid etc. without scientific notation


def test_fit_png_draws_both_bands_fit_end_and_target(runs):
    from scalerl_jax.scaling import FitSpec, plot, report

    root, _ = runs
    curve, _ = report.load_curve([str(root / "scalerl")])
    spec = FitSpec(fit_end=2.0)
    a = report.analyse(curve, spec, n_boot=100, target=5.0)
    fig = plot.run_figure(
        curve, spec, a.fit, boot=a.boot, extrap=a.extrap, target=5.0, at_target=a.at_target()
    )
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert any(t.startswith("fit end = 2.00: RMSE after it") for t in labels)
    bands = {c.get_label(): c for c in ax.collections if "band" in c.get_label()}
    conf = next(c for name, c in bands.items() if "confidence" in name)
    pred = next(c for name, c in bands.items() if "prediction" in name)
    assert conf.get_zorder() > pred.get_zorder()  # the confidence band is drawn on top
    face = pred.get_facecolor()
    assert (len(face) == 0 or face[0][3] == 0.0) and pred.get_hatch()  # hatched, not filled
    r, lo, hi = a.at_target()
    assert any(t.get_text() == f"R = {r:.3f} [{lo:.3f}, {hi:.3f}]" for t in ax.texts)


def test_compare_png_is_readable_with_seven_runs():
    from scalerl_jax.scaling import Curve, fit_curve, plot

    x = np.concatenate([[0.0], np.geomspace(100, 5000, 30)])
    curves, fits = [], []
    for i in range(7):  # asymptotes within 0.03 of each other, as in the issue
        y = sigmoid_law(np.maximum(x, 1e-9), 0.60 + 0.005 * i, 1.6 + 0.1 * i, 800.0, 0.2)
        y[0] = 0.2
        curves.append(Curve(f"recipe-{i}", x, y + 0.003 * np.sin(7 * i + x)))
        fits.append(fit_curve(curves[-1]))
    assert all(f.ok for f in fits)
    fig = plot.compare_figure(curves, fits)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    ax, eff = fig.axes
    styles = {
        (line.get_color(), line.get_linestyle())
        for line in ax.get_lines()
        if line.get_label().startswith("recipe-")
    }
    assert len(styles) == 7
    legend = fig.legends[0].get_window_extent(renderer)
    for axes in (ax, eff):
        assert not legend.overlaps(axes.get_window_extent(renderer))  # legend outside
    labels = [t for t in ax.texts if t.get_text().startswith("A=")]
    assert len(labels) == 7
    from matplotlib.text import Text

    boxes = [Text.get_window_extent(t, renderer) for t in labels]  # the text, not its leader
    assert not any(b.overlaps(c) for i, b in enumerate(boxes) for c in boxes[i + 1 :])
    frame = ax.get_window_extent(renderer)
    assert all(b.x0 >= frame.x1 and frame.y0 <= b.y0 < b.y1 <= frame.y1 + 2 for b in boxes)
    # Efficiency view: each fit is a line of slope -B in ln C.
    for line, fit in zip([ln for ln in eff.get_lines()], fits):
        xs, ys = (np.asarray(v) for v in line.get_data())
        ok = np.isfinite(ys)
        slope = np.polyfit(np.log(xs[ok]), ys[ok], 1)[0]
        assert slope == pytest.approx(-fit.B, rel=1e-3)


@pytest.mark.fast
def test_compare_applies_the_paper_rule_with_intervals(runs, capsys, tmp_path):
    root, _ = runs
    write_run(tmp_path / "steep", A=0.605, B=2.6, C_mid=0.8, seed=5)
    dirs = [str(root / "scalerl"), str(root / "baseline"), str(tmp_path / "steep")]
    out = tmp_path / "cmp"
    assert (
        fit_cli.main(
            ["--compare", *dirs, "--bootstrap", "100", "--extrapolate", "0", "--out", str(out)]
        )
        == 0
    )
    text = capsys.readouterr().out
    lines = {line.strip().split(":")[0]: line for line in text.splitlines() if " vs " in line}
    # A apart (0.60 vs 0.50): A decides, the higher A wins, the difference's interval is clear.
    assert "A decides" in lines["scalerl vs baseline"]
    assert "scalerl wins by +0.1" in lines["scalerl vs baseline"]
    # A within the margin (0.60 vs 0.605): B at the shared A decides; the steeper run wins.
    assert "B decides" in lines["scalerl vs steep"]
    assert "steep is more compute-efficient" in lines["scalerl vs steep"]
    decisions = json.loads((out / "compare.json").read_text())
    by_pair = {tuple(d["runs"]): d for d in decisions}
    a_rule, b_rule = by_pair[("scalerl", "baseline")], by_pair[("scalerl", "steep")]
    assert a_rule["rule"] == "A" and a_rule["winner"] == "scalerl" and a_rule["clear"]
    lo, hi = a_rule["margin_interval"]
    assert lo < 0.1 < hi and lo > 0
    assert b_rule["rule"] == "B" and b_rule["winner"] == "steep" and b_rule["clear"]
    assert b_rule["values"][1] > b_rule["values"][0] and b_rule["margin"] > 1
    assert all(lo <= v <= hi for v, (lo, hi) in zip(b_rule["values"], b_rule["intervals"]))
    assert (out / "compare.txt").read_text().strip().endswith(lines["scalerl vs steep"].strip())
    with open(out / "compare.png", "rb") as f:
        assert f.read(8) == PNG_MAGIC
    assert {p.name for p in out.iterdir()} >= {"scalerl", "baseline", "steep"}
    # Every pair; bad combinations are refused with a one-line error.
    assert (
        fit_cli.main(
            [
                "--compare",
                "--pairwise",
                *dirs,
                "--bootstrap",
                "0",
                "--extrapolate",
                "0",
                "--no-plots",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    text = capsys.readouterr().out
    assert "every pair" in text and "baseline vs steep: A decides" in text
    assert fit_cli.main(["--compare", dirs[0]]) == 2
    assert "--compare needs at least two runs" in capsys.readouterr().err
    assert fit_cli.main(["--pairwise", *dirs[:2]]) == 2
