"""bench/accelerator.py (the one-call accelerator figures) runs end to end on the CPU at a tiny
shape, so a session lent a GPU spends its minutes measuring, not debugging."""

import math
import os
from _scripts import load_script

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_accelerator_bench_reports_every_part_on_a_tiny_model():
    bench = load_script("bench/accelerator.py", "accelerator_bench")
    out = bench.main(
        [
            "--preset",
            "tiny-qwen2",
            "--rows",
            "2",
            "--seq",
            "32",
            "--steps",
            "2",
            "--slots",
            "2",
            "4",
            "--prompt",
            "8",
            "--new",
            "4",
            "--steps-per-call",
            "2",
            "--peak-n",
            "128",
            "--copy-mib",
            "4",
        ]
    )
    assert [d["part"] for d in out] == ["peak", "train", "decode", "decode", "sync"]
    peak, train, dec2, dec4, sync = out
    assert peak["bf16_matmul_tflops"] > 0 and peak["hbm_gb_s"] > 0
    assert train["preset"] == "tiny-qwen2" and train["rows"] * train["seq"] == 64
    assert 0 < train["mfu"] < 1 and math.isfinite(train["loss"])
    assert train["memory_GiB"]["argument"] > 0 and len(train["step_s_rounds"]) == 2
    assert (dec2["slots"], dec4["slots"]) == (2, 4)
    for d in (dec2, dec4):
        assert d["tokens_per_s"] > 0 and d["roofline_tokens_per_s"] > 0
        assert math.isclose(
            d["of_roofline"],
            d["tokens_per_s"] / d["roofline_tokens_per_s"],
            rel_tol=0.01,
            abs_tol=1e-3,
        )
    assert sync["groups"] >= 1 and sync["sync_s"] > 0
