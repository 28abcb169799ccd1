"""No-positive-resampling: retirement rule, permanence, JSON round trip, errors."""

import json

import numpy as np
import pytest

from scalerl_jax.rl.curriculum import NoPositiveResampling


@pytest.mark.fast
def test_retires_at_threshold_on_latest_observation_and_is_permanent():
    c = NoPositiveResampling(threshold=0.9)
    assert c.update(["a", "b", 3], [0.5, 0.875, 0.9375]) == [3]
    assert not c.is_retired("a") and not c.is_retired("b") and c.is_retired(3)
    # The running mean of "a" stays below 0.9, but its latest rate reaches it: retired.
    assert c.update(["a"], [1.0]) == ["a"]
    assert c.mean_pass_rate("a") == pytest.approx(0.75)
    assert c.latest_pass_rate("a") == 1.0
    # In-flight groups of a retired prompt are recorded but never un-retire it.
    assert c.update(["a", 3], [0.0, 0.0]) == []
    assert c.is_retired("a") and c.is_retired(3)
    assert c.filter(["a", "b", 3, "never-seen"]) == ["b", "never-seen"]
    assert c.num_seen == 3 and c.num_retired == 2
    assert c.latest_pass_rate("never-seen") is None


def test_fp32_rates_at_the_threshold_count():
    c = NoPositiveResampling(threshold=0.9)
    rate = np.float32(9) / np.float32(10)  # 0.89999998 in fp32
    assert float(rate) < 0.9
    assert c.update(np.array([7]), np.array([rate])) == [7]
    assert c.update([8], [0.8999]) == []


def test_json_round_trip_keeps_id_types_and_state():
    c = NoPositiveResampling(threshold=0.85)
    c.update([1, "1", "x", np.int64(2)], [0.9, 0.1, 0.5, 0.86])
    c.update(["x"], [0.25])
    restored = NoPositiveResampling.from_dict(json.loads(json.dumps(c.to_dict())))
    assert restored == c
    assert restored.is_retired(1) and not restored.is_retired("1") and restored.is_retired(2)
    assert restored.mean_pass_rate("x") == pytest.approx(0.375)
    assert restored.threshold == 0.85
    assert NoPositiveResampling.from_dict(NoPositiveResampling().to_dict()).num_seen == 0


def test_bad_input_is_a_clear_error():
    c = NoPositiveResampling()
    with pytest.raises(ValueError, match="2 prompt ids but 1 pass rates"):
        c.update(["a", "b"], [0.5])
    with pytest.raises(ValueError, match="pass rate of prompt 'a' is 1.5"):
        c.update(["a"], [1.5])
    with pytest.raises(TypeError, match="must be int or str"):
        c.update([1.5], [0.5])
    assert c.num_seen == 0  # a rejected update records nothing
    with pytest.raises(ValueError, match="threshold=0"):
        NoPositiveResampling(threshold=0)
    state = c.to_dict()
    state["count"] = [1]
    with pytest.raises(ValueError, match="differ in length"):
        NoPositiveResampling.from_dict(state)
    with pytest.raises(ValueError, match="format"):
        NoPositiveResampling.from_dict({"threshold": 0.9})
