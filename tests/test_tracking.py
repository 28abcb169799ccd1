"""Tracker: TensorBoard event files read back as TensorBoard reads them, resume purge, W&B."""

import glob
import math
import os
import struct
import sys
import types

import numpy as np
import pytest

from scalerl_jax import tracking
from scalerl_jax.metrics import MetricsWriter


def read_scalars(run_dir: str) -> dict[str, list[tuple[int, float]]]:
    """{tag: [(step, value)]} as TensorBoard shows it; without tensorboard, the raw records."""
    try:
        from tensorboard.backend.event_processing import event_accumulator
    except ImportError:
        return _read_raw(run_dir)
    acc = event_accumulator.EventAccumulator(run_dir, size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def _read_raw(run_dir: str) -> dict[str, list[tuple[int, float]]]:
    from tensorboardX.proto import event_pb2

    out: dict[str, list] = {}
    for path in sorted(glob.glob(os.path.join(run_dir, "*tfevents*"))):
        data = open(path, "rb").read()
        pos = 0
        while pos < len(data):  # TFRecord: u64 length, u32 crc, payload, u32 crc
            (length,) = struct.unpack("<Q", data[pos : pos + 8])
            event = event_pb2.Event.FromString(data[pos + 12 : pos + 12 + length])
            pos += 16 + length
            for v in event.summary.value:
                out.setdefault(v.tag, []).append((event.step, v.simple_value))
    return out


def _eval_record(step, pass_rate, device_hours, flops, **extra):
    compute = {"device_hours": device_hours, "flops": flops, "tokens": 1e6}
    return {
        "event": "eval",
        "step": step,
        "wall_s": 1.0,
        "pass_rate": pass_rate,
        "k": 4,
        "compute": compute,
        **extra,
    }


@pytest.mark.fast
def test_records_become_tagged_scalars(tmp_path):
    with tracking.Tracker(tmp_path) as tracker:
        tracker.write(
            {
                "event": "run",
                "step": 0,
                "wall_s": 0.0,
                "schema": 1,
                "resumed": False,
                "config": {"steps": 10, "lr": 1e-6},
            }
        )
        tracker.write({"event": "sft", "step": 0, "wall_s": 0.5, "loss": 2.0})
        for step in (1, 2):
            tracker.write(
                {
                    "event": "train",
                    "step": step,
                    "wall_s": 1.0 + step,
                    "loss": 0.5 / step,
                    "grad_norm": None,
                    "lag": np.float32(2.0),
                    "bad": float("nan"),
                    "name": "x",
                    "lens": [1, 2],
                    "ok": True,
                }
            )
        tracker.write(
            _eval_record(
                2,
                0.25,
                device_hours=0.5,
                flops=3.2e12,
                per_domain={"math": 0.3, "code": float("inf")},
            )
        )
    tb = os.path.join(tmp_path, "tensorboard")
    assert sorted(os.listdir(tb)) == ["rl", "sft", "vs_compute"]
    rl = read_scalars(os.path.join(tb, "rl"))
    assert rl["train/loss"] == [(1, 0.5), (2, 0.25)]
    assert rl["train/lag"] == [(1, 2.0), (2, 2.0)] and rl["train/ok"] == [(1, 1.0), (2, 1.0)]
    assert rl["eval/pass_rate"] == [(2, 0.25)]
    assert rl["eval/compute/device_hours"] == [(2, 0.5)]
    assert rl["eval/per_domain/math"] == [(2, pytest.approx(0.3))]
    assert not any(
        t.split("/")[1] in ("grad_norm", "bad", "name", "lens", "wall_s", "step") for t in rl
    )
    assert "eval/per_domain/code" not in rl and not any(t.startswith("run/") for t in rl)
    assert read_scalars(os.path.join(tb, "sft")) == {"sft/loss": [(0, 2.0)]}
    vs = read_scalars(os.path.join(tb, "vs_compute"))
    assert vs["eval/pass_rate_vs_device_seconds"] == [(1800, 0.25)]
    assert vs["eval/pass_rate_vs_gflops"] == [(3200, 0.25)]
    assert vs["eval/per_domain/math_vs_gflops"] == [(3200, pytest.approx(0.3))]


def test_resume_purges_superseded_steps_of_its_own_stage_only(tmp_path):
    pytest.importorskip("tensorboard")  # the purge is the Python loader's behaviour
    with tracking.Tracker(tmp_path) as tracker:
        for step in range(10):
            tracker.write({"event": "sft", "step": step, "wall_s": 0.0, "loss": 1.0})
        for step in range(1, 9):
            tracker.write({"event": "train", "step": step, "wall_s": 0.0, "loss": 1.0})
    # Restored from the step-5 checkpoint: steps 6.. are redone with new values.
    with tracking.Tracker(tmp_path) as tracker:
        tracker.write({"event": "run", "step": 5, "wall_s": 9.0, "resumed": True, "config": {}})
        for step in (6, 7):
            tracker.write({"event": "train", "step": step, "wall_s": 0.0, "loss": 2.0})
    tb = os.path.join(tmp_path, "tensorboard")
    loss = read_scalars(os.path.join(tb, "rl"))["train/loss"]
    assert loss == [(s, 1.0) for s in range(1, 6)] + [(6, 2.0), (7, 2.0)]
    assert [s for s, _ in read_scalars(os.path.join(tb, "sft"))["sft/loss"]] == list(range(10))


def test_replay_from_metrics_jsonl(tmp_path):
    with MetricsWriter(tmp_path / "sft") as writer:  # the SFT warm-up's own file
        writer.write("sft", 10, loss=1.5, tokens=100.0)
    with MetricsWriter(tmp_path) as writer:
        writer.run({"steps": 2})
        writer.train(1, loss=0.5)
        writer.eval(
            1,
            pass_rate=0.5,
            k=2,
            compute={
                "device_hours": 1.0,
                "sampler_device_hours": 0.5,
                "trainer_device_hours": 0.5,
                "flops": 1e10,
                "tokens": 10,
            },
        )
    assert tracking.replay(tmp_path) == 4
    rl = read_scalars(os.path.join(tmp_path, "tensorboard", "rl"))
    assert rl["train/loss"] == [(1, 0.5)] and rl["eval/pass_rate"] == [(1, 0.5)]
    assert read_scalars(os.path.join(tmp_path, "tensorboard", "sft"))["sft/loss"] == [(10, 1.5)]


def test_disabled_tracker_writes_nothing(tmp_path):
    with tracking.Tracker(tmp_path, enabled=False, wandb_project="p") as tracker:
        tracker.write({"event": "train", "step": 1, "wall_s": 0.0, "loss": 1.0})
        tracker.purge("rl", 0)
    assert os.listdir(tmp_path) == []


def test_wandb_asked_for_but_missing(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # makes `import wandb` raise ImportError
    with pytest.raises(ImportError, match=r"project 'myproj'.*pip install wandb"):
        tracking.Tracker(tmp_path, wandb_project="myproj")


def test_wandb_gets_per_event_axes_and_config(tmp_path, monkeypatch):
    calls = []

    class FakeRun:
        config = types.SimpleNamespace(update=lambda cfg, **kw: calls.append(("config", cfg)))

        def define_metric(self, name, **kw):
            calls.append(("define", name, kw.get("step_metric")))

        def log(self, data):
            calls.append(("log", data))

        def finish(self):
            calls.append(("finish",))

    fake = types.SimpleNamespace(init=lambda **kw: calls.append(("init", kw)) or FakeRun())
    monkeypatch.setitem(sys.modules, "wandb", fake)
    for _ in range(2):  # the second Tracker is a resumed run: same W&B run id
        with tracking.Tracker(tmp_path, wandb_project="p") as tracker:
            tracker.write(
                {"event": "run", "step": 0, "wall_s": 0.0, "resumed": False, "config": {"lr": 1.0}}
            )
            tracker.write({"event": "sft", "step": 0, "wall_s": 0.0, "loss": 3.0})
            tracker.write(
                {"event": "train", "step": 0, "wall_s": 0.0, "loss": math.nan, "reward_mean": 0.5}
            )
    inits = [c[1] for c in calls if c[0] == "init"]
    assert inits[0]["id"] == inits[1]["id"] and inits[0]["resume"] == "allow"
    assert ("config", {"lr": 1.0}) in calls
    assert ("define", "train/*", "train/step") in calls and ("define", "sft/*", "sft/step") in calls
    assert ("log", {"sft/loss": 3.0, "sft/step": 0}) in calls
    assert ("log", {"train/reward_mean": 0.5, "train/step": 0}) in calls
    assert calls[-1] == ("finish",)
