"""core.live.changed_values against real Redis: only what differs from the last pushed value
comes back, None is a value like any other, small drifts add up, and thousands of keys
(more than one batch of the server-side script) keep their order and values."""
import pytest

from core import live
from core.live_receivers import _small_gpu_change

pytestmark = pytest.mark.usefixtures("live_settings")


def test_only_values_that_differ_from_the_last_pushed_come_back():
    first = {"a": 1, "b": None, "c": {"x": [1, 2]}, 7: "seven"}
    assert live.changed_values("t", first) == {"a": 1, "b": None, "c": {"x": [1, 2]}, "7": "seven"}
    assert live.changed_values("t", first) == {}  # None stays None: not a change
    assert live.changed_values("t", {"a": 2, "b": None, "d": None}) == {"a": 2, "d": None}
    assert live.changed_values("t", {}) == {}


def test_small_gpu_drifts_add_up_until_they_cross_the_threshold():
    assert live.changed_values("g", {"1": [50.0, 1000, 60.0]}, same=_small_gpu_change) == {"1": [50.0, 1000, 60.0]}
    assert live.changed_values("g", {"1": [51.0, 1100, 61.0]}, same=_small_gpu_change) == {}
    # Compared with the last pushed value (50.0), not the last seen (51.0).
    assert live.changed_values("g", {"1": [52.0, 1100, 61.0]}, same=_small_gpu_change) == {"1": [52.0, 1100, 61.0]}
    assert live.changed_values("g", {"1": [52.0, None, 61.0]}, same=_small_gpu_change) == {"1": [52.0, None, 61.0]}


def test_thousands_of_keys_in_one_call():
    n = 2500  # more than two batches of 1,000
    values = {str(i): [float(i % 100), i, None] for i in range(n)}
    assert live.changed_values("many", values) == values
    moved = {k: ([v[0] + 5, v[1], v[2]] if int(k) % 3 == 0 else v) for k, v in values.items()}
    assert live.changed_values("many", moved, same=_small_gpu_change) == {
        k: v for k, v in moved.items() if int(k) % 3 == 0}
