"""metrics.jsonl writer/reader and compute accounting."""

import collections
import json
import os

import numpy as np
import pytest

from scalerl_jax.metrics import (
    COMPUTE_KEYS,
    ComputeMeter,
    MetricsWriter,
    eval_xy,
    forward_flops_per_token,
    get_path,
    read_metrics,
    truncate_after,
)


def _compute(h):
    return {
        "device_hours": h,
        "sampler_device_hours": 0.75 * h,
        "trainer_device_hours": 0.25 * h,
        "flops": 1e15 * h,
        "tokens": 1e4 * h,
    }


@pytest.mark.fast
def test_round_trip_with_malformed_and_torn_lines(tmp_path):
    with MetricsWriter(tmp_path) as w:
        w.run({"model": {"hidden_size": 64}})
        w.train(1, loss=np.float32(0.5), grad_norm=float("nan"))
        w.eval(
            1,
            pass_rate=np.float64(0.25),
            k=16,
            compute=_compute(0.1),
            per_domain={"math": 0.2, "code": 0.3},
        )
    path = tmp_path / "metrics.jsonl"
    with open(path, "a") as f:
        f.write('not json\n[1, 2]\n{"no_event": 1}\n\n')
        f.write('{"event": "eval", "step": 2, "pass_')  # a killed writer's torn line
    with MetricsWriter(tmp_path) as w:  # resume: appends, starts on a fresh line
        assert w.resumed
        w.eval(2, pass_rate=0.3, k=16, compute=_compute(0.2))
    for line in path.read_text().splitlines():  # what the writer wrote is strict JSON
        try:
            json.loads(line, parse_constant=lambda c: pytest.fail(f"non-strict JSON {c}"))
        except json.JSONDecodeError:
            continue
    log = read_metrics(tmp_path)
    assert [e["event"] for e in log.events] == ["run", "train", "eval", "eval"]
    assert [e["step"] for e in log.of("eval")] == [1, 2] and log.events[3]["_line"] == 9
    assert log.malformed == 4 and log.malformed_lines == (4, 5, 6, 8)
    run, train, ev1, ev2 = log.events
    assert run["schema"] == 1 and run["config"] == {"model": {"hidden_size": 64}}
    assert not run["resumed"]
    assert train["loss"] == 0.5 and train["grad_norm"] is None
    assert ev1["per_domain"]["code"] == 0.3 and ev1["compute"] == _compute(0.1)
    assert ev2["wall_s"] >= ev1["wall_s"]  # wall time continues across the resume
    x, y = eval_xy(log)
    assert x.tolist() == [0.1, 0.2] and y.tolist() == [0.25, 0.3]
    x, y = eval_xy(log.events[:3], "step", "per_domain.math")
    assert x.tolist() == [1.0] and y.tolist() == [0.2]


def test_eval_xy_keeps_last_record_per_step_and_names_missing_keys(tmp_path):
    with MetricsWriter(tmp_path) as w:
        w.eval(0, pass_rate=0.1, k=4, compute=_compute(0.0))
        w.eval(5, pass_rate=0.2, k=4, compute=_compute(1.0))
        w.eval(5, pass_rate=0.25, k=4, compute=_compute(1.5))  # re-evaluated after a resume
    x, y = eval_xy(read_metrics(tmp_path / "metrics.jsonl"), "compute.flops")
    assert x.tolist() == [0.0, 1.5e15] and y.tolist() == [0.1, 0.25]
    with pytest.raises(
        KeyError,
        match=r"step 0 .*lacks 'compute.energy'.*no 'energy' under "
        r"compute.*device_hours",
    ):
        eval_xy(read_metrics(tmp_path), "compute.energy")
    with pytest.raises(ValueError, match="no 'eval' records"):
        eval_xy([{"event": "train", "step": 1}])
    assert get_path({"a": {"b": 3}}, "a.b") == 3


def test_writer_rejects_bad_input(tmp_path):
    with MetricsWriter(tmp_path) as w:
        with pytest.raises(ValueError, match="step=-1"):
            w.train(-1, loss=1.0)
        with pytest.raises(ValueError, match=r"lacks \['flops', 'tokens'\]"):
            w.eval(
                1,
                pass_rate=0.5,
                k=1,
                compute={"device_hours": 1, "sampler_device_hours": 1, "trainer_device_hours": 0},
            )
        with pytest.raises(ValueError, match="'wall_s' is set by the writer"):
            w.train(1, wall_s=3.0)
        with pytest.raises(TypeError, match="not JSON-able"):
            w.train(1, thing=object())
    with pytest.raises(FileNotFoundError):
        read_metrics(tmp_path / "missing")


def test_compute_meter_accounting():
    N, L, d = 1.0e9, 16, 2048
    meter = ComputeMeter(N, L, d)
    meter.add_sampler(seconds=1800.0, devices=3, tokens=1e6, context_len=1000.0)
    meter.add_trainer(seconds=900.0, devices=1, tokens=2e6, context_len=512.0)
    c = meter.compute()
    assert set(COMPUTE_KEYS) <= set(c)
    assert c["sampler_device_hours"] == pytest.approx(1.5)
    assert c["trainer_device_hours"] == pytest.approx(0.25)
    assert c["device_hours"] == pytest.approx(1.75)
    sampler = 1e6 * (2 * N + 4 * L * d * 1000.0)
    trainer = 2e6 * (6 * N + 12 * L * d * 512.0)
    assert c["flops"] == pytest.approx(sampler + trainer)
    assert c["tokens"] == 3e6
    assert forward_flops_per_token(N, L, d, 0.0) == 2 * N
    resumed = ComputeMeter(N, L, d, initial=c)  # continue from the last eval record
    resumed.add_trainer(seconds=3600.0, devices=2, tokens=0.0, context_len=1.0)
    assert resumed.compute()["trainer_device_hours"] == pytest.approx(2.25)
    assert resumed.compute()["flops"] == pytest.approx(c["flops"])
    with pytest.raises(ValueError, match="hidden_size=0"):
        ComputeMeter(N, L, 0)
    with pytest.raises(ValueError, match="devices=0"):
        meter.add_sampler(seconds=1.0, devices=0, tokens=1.0, context_len=1.0)


def _line(event, step, wall_s, **fields):
    return json.dumps({"event": event, "step": step, "wall_s": wall_s, **fields}) + "\n"


def test_truncate_after_supersedes_records_written_after_the_restored_checkpoint(tmp_path):
    # A run evaluated every 5 steps, resumed once at step 5, then was kill -9'd during step 14
    # with its last checkpoint at step 10.
    lines = [_line("run", 0, 0.0, schema=1, resumed=False), _line("eval", 0, 1.0, pass_rate=0.0)]
    lines += [_line("train", s, 10.0 * s, loss=1.0 / s) for s in range(1, 6)]
    lines += [_line("eval", 5, 51.0, pass_rate=0.1), _line("run", 5, 52.0, resumed=True)]
    lines += [_line("train", s, 10.0 * s, loss=1.0 / s) for s in range(6, 14)]
    lines += [_line("eval", 10, 101.0, pass_rate=0.2), "not json\n", "\n"]
    lines += ['{"event": "train", "step": 14, "wa']  # torn by the kill
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(lines))

    assert truncate_after(tmp_path, 10) == 5  # train 11-13, the malformed and the torn line
    log = read_metrics(path)
    assert log.malformed == 0 and path.read_text().endswith("\n")
    assert [(e["event"], e["step"]) for e in log.of("run")] == [("run", 0), ("run", 5)]
    assert [e["step"] for e in log.of("train")] == list(range(1, 11))
    assert [e["step"] for e in log.of("eval")] == [0, 5, 10]
    assert not [n for n in os.listdir(tmp_path) if n != "metrics.jsonl"]  # no temp file left

    with MetricsWriter(tmp_path) as w:  # the resumed run
        assert w.resumed and 101.0 <= w.wall_s() < 102.0  # continues from the survivors' max
        w.run({}, step=10)
        for s in range(11, 16):
            w.train(s, loss=0.0)
        w.eval(15, pass_rate=0.3, k=1, compute=_compute(1.0))
    log = read_metrics(tmp_path)
    counts = collections.Counter(e["step"] for e in log.of("train"))
    assert sorted(counts) == list(range(1, 16)) and set(counts.values()) == {1}
    assert [e["step"] for e in log.of("eval")] == [0, 5, 10, 15]
    assert all(a["wall_s"] <= b["wall_s"] for a, b in zip(log.events[-7:], log.events[-6:]))

    inode = os.stat(path).st_ino
    assert truncate_after(path, 15) == 0 and os.stat(path).st_ino == inode  # nothing to drop
    assert truncate_after(path, 0) == 20 and [e["step"] for e in read_metrics(path).events] == [
        0,
        0,
    ]
    assert truncate_after(tmp_path / "missing.jsonl", 3) == 0
    assert not (tmp_path / "missing.jsonl").exists()
    with pytest.raises(ValueError, match="step=-1"):
        truncate_after(path, -1)


def test_compute_meter_state_round_trips_through_json():
    meter = ComputeMeter(1.3e9, 24, 2048)
    meter.add_sampler(seconds=12.345678901, devices=7, tokens=123457.0, context_len=333.3)
    meter.add_trainer(seconds=0.1 + 0.2, devices=1, tokens=98765.0, context_len=1e3 / 3)
    state = json.loads(json.dumps(meter.state_dict()))  # as stored in checkpoint meta
    restored = ComputeMeter(1.3e9, 24, 2048)
    restored.load_state_dict(state)
    assert restored.totals == meter.totals and restored.compute() == meter.compute()  # exact
    for m in (meter, restored):
        m.add_trainer(seconds=1.0, devices=2, tokens=10.0, context_len=5.0)
    assert restored.compute() == meter.compute()
    del state["trainer_flops"]
    with pytest.raises(ValueError, match=r"missing \['trainer_flops'\]"):
        restored.load_state_dict(state)
