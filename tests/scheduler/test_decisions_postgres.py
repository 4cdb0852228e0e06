"""Twenty operators decide on the same proposal at the same moment, half approving it and
half overriding it onto other GPUs: exactly one wins, every other one is told the proposal
changed under them (or is no longer decidable), all twenty attempts are in the audit log,
and no GPU ends up in two active placements."""
import threading

import pytest
from django.db import connection, connections
from django.db.models import Count

from scheduler import cycle, services
from scheduler.models import AuditEvent, Job, Placement, PlacementGpu, PoolPolicy

from .conftest import build_cluster, make_user

THREADS = 20


@pytest.fixture
def require_postgres():
    if connection.vendor != "postgresql":
        pytest.skip("needs PostgreSQL row locks (SELECT ... FOR UPDATE); SQLite serialises whole transactions instead")


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_twenty_operators_decide_at_once_and_exactly_one_wins(require_postgres, no_dispatch):
    cluster = build_cluster()
    PoolPolicy.objects.create(pool=cluster.pool, mode=PoolPolicy.Mode.MANUAL)
    from scheduler.models import Tenant

    tenant = Tenant.objects.create(name="physics")
    job = services.submit_job(None, tenant=tenant, pool="main", gpus=4, command=["train"])
    assert cycle.run_cycle().ok
    p = Placement.objects.get(job=job, state=Placement.State.PROPOSED)
    proposed = set(PlacementGpu.objects.filter(placement=p, active=True).values_list("gpu_id", flat=True))
    others = [h.name for h in cluster.hosts() if not proposed & set(cluster.gpus(h.name))]
    users = [make_user(f"op{i:02d}", "operator") for i in range(THREADS)]

    barrier = threading.Barrier(THREADS)
    wins, losses, crashes = [], [], []

    def decide(i):
        try:
            barrier.wait()
            if i % 2:
                services.approve(p.pk, users[i], expected_version=1)
            else:
                services.override(p.pk, users[i], cluster.gpus(others[i % len(others)]), expected_version=1)
            wins.append(i)
        except (services.ChangedUnderYou, services.NotDecidable) as exc:
            losses.append(str(exc))
        except Exception as exc:  # noqa: BLE001 - the test reports any other failure
            crashes.append(repr(exc))
        finally:
            connections.close_all()

    threads = [threading.Thread(target=decide, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)

    assert crashes == []
    assert len(wins) == 1 and len(losses) == THREADS - 1
    winner = users[wins[0]].username
    assert all("changed under you" in m or "not decidable" in m for m in losses)
    assert all(winner in m for m in losses)  # each loser is told who decided
    p.refresh_from_db()
    assert p.state == Placement.State.APPROVED and p.decided_by_name == winner and p.is_override == (wins[0] % 2 == 0)
    assert Job.objects.get(pk=job.pk).state == Job.State.APPROVED

    # All twenty attempts are in the audit log: one accepted, nineteen refused.
    attempts = AuditEvent.objects.filter(placement=p, action__in=["approve", "override"])
    assert attempts.filter(refused=True).count() == THREADS - 1
    assert set(attempts.filter(refused=True).values_list("actor", flat=True)) == {u.username for u in users} - {winner}
    assert attempts.filter(refused=False, actor=winner).exists()
    # The invariant, asked of the data: no GPU in two active placements.
    assert not PlacementGpu.objects.filter(active=True).values("gpu").annotate(n=Count("id")).filter(n__gt=1).exists()
    assert PlacementGpu.objects.filter(placement=p, active=True).count() == 4
