"""Signals of the scheduler, sent after the transaction that caused them commits.

placements_approved(placement_ids: list[int]) — these placements are approved and their
    GPUs are held: dispatch sends them to their agents.
job_state_changed(job_ids: list[int], to_state: str) — these jobs moved to `to_state`
    (live views push the change).
placements_stop_requested(placement_ids: list[int]) — these running placements belong to
    cancelled jobs: their agents must stop the work (dispatch sends the DELETE).
"""
from django.dispatch import Signal

placements_approved = Signal()
job_state_changed = Signal()
placements_stop_requested = Signal()
