"""Host states from missed poll rounds (pure function; STALE_AFTER 2, UNREACHABLE_AFTER 4)."""
import pytest

from pool import states


def step(current, ok, missed, ever=True):
    return states.next_state(current, ok=ok, missed_rounds=missed, ever_reported=ever, stale_after=2, unreachable_after=4)


def test_an_up_host_turns_stale_then_unreachable_then_up_again():
    seen, state = [], "up"
    for missed in range(1, 6):
        state = step(state, False, missed)
        seen.append(state)
    assert seen == ["up", "stale", "stale", "unreachable", "unreachable"]
    assert step(state, True, 0) == "up"


def test_a_new_host_stays_new_until_it_reports_or_misses_enough():
    assert step("new", False, 1, ever=False) == "new"
    assert step("new", False, 2, ever=False) == "stale"
    assert step("new", True, 0) == "up"


@pytest.mark.parametrize("operator_state", ["draining", "down"])
def test_operator_states_are_left_alone(operator_state):
    assert step(operator_state, False, 10) == operator_state
    assert step(operator_state, True, 0) == operator_state


def test_where_undraining_puts_a_host():
    kw = dict(stale_after=2, unreachable_after=4)
    assert states.polled_state(missed_rounds=0, ever_reported=True, **kw) == "up"
    assert states.polled_state(missed_rounds=0, ever_reported=False, **kw) == "new"
    assert states.polled_state(missed_rounds=3, ever_reported=True, **kw) == "stale"
    assert states.polled_state(missed_rounds=9, ever_reported=True, **kw) == "unreachable"
