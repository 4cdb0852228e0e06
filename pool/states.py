"""Host states as a pure function of what polling saw. No Django: the ingest calls it per
host and records a HostEvent whenever the answer differs from the stored state.

    new ──report──▶ up ──STALE_AFTER missed──▶ stale ──UNREACHABLE_AFTER missed──▶ unreachable
     │               ▲                                                                │
     └──missed──▶ (stale, unreachable as above)      any good report ─────────────────┘

draining and down are set by an operator and left alone by polling (the host keeps being
polled and its telemetry recorded); undraining puts the host where polling says it is.
"""
from __future__ import annotations

UP = "up"
STALE = "stale"
UNREACHABLE = "unreachable"
DRAINING = "draining"
DOWN = "down"
NEW = "new"
OPERATOR_STATES = frozenset({DRAINING, DOWN})


def polled_state(*, missed_rounds: int, ever_reported: bool, stale_after: int, unreachable_after: int) -> str:
    """Where polling alone puts a host: `missed_rounds` consecutive rounds without a good report."""
    if missed_rounds >= max(unreachable_after, 1):
        return UNREACHABLE
    if missed_rounds >= max(stale_after, 1):
        return STALE
    return UP if ever_reported else NEW


def next_state(current: str, *, ok: bool, missed_rounds: int, ever_reported: bool, stale_after: int, unreachable_after: int) -> str:
    """The state after one poll of the host. `missed_rounds` already counts this poll
    (0 after a good report); `ever_reported` includes this poll."""
    if current in OPERATOR_STATES:
        return current
    if ok:
        return UP
    state = polled_state(missed_rounds=missed_rounds, ever_reported=ever_reported, stale_after=stale_after,
                         unreachable_after=unreachable_after)
    # A few missed rounds do not make an up host anything else yet; they never improve a state.
    if state in (UP, NEW):
        return current
    return state
