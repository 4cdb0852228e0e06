"""Fifty operators approve, reject and override the same three proposals at the same moment
on PostgreSQL: exactly one decision wins each proposal, every losing attempt is told why
and who decided, the audit log has all 150 attempts, and no GPU ends in two active
placements."""
import random
import threading
from collections import Counter

import pytest
from django.db import connection, connections
from django.db.models import Count

from scheduler import cycle, services
from scheduler.models import AuditEvent, Placement, PlacementGpu, PoolPolicy, Tenant
from tests.scheduler.conftest import build_cluster, make_user
from tests.scheduler.conftest import no_dispatch  # noqa: F401 - fixture

OPERATORS = 50
ACTIONS = ("approve", "reject", "override")

pytestmark = [pytest.mark.postgres, pytest.mark.reliability]


@pytest.mark.django_db(transaction=True)
def test_fifty_operators_three_proposals_exactly_one_decision_wins_each(no_dispatch):  # noqa: F811
    if connection.vendor != "postgresql":
        pytest.skip("needs PostgreSQL row locks; SQLite serialises whole transactions")
    cluster = build_cluster()
    PoolPolicy.objects.create(pool=cluster.pool, mode=PoolPolicy.Mode.MANUAL)
    tenant = Tenant.objects.create(name="physics")
    jobs = [services.submit_job(None, tenant=tenant, pool="main", gpus=4, command=["train"]) for _ in range(3)]
    assert cycle.run_cycle().ok
    proposals = list(Placement.objects.filter(job__in=jobs, state=Placement.State.PROPOSED).order_by("id"))
    assert len(proposals) == 3
    held = set(PlacementGpu.objects.filter(active=True).values_list("gpu_id", flat=True))
    free_hosts = [h.name for h in cluster.hosts() if not held & set(cluster.gpus(h.name))]
    users = [make_user(f"op{i:02d}", "operator") for i in range(OPERATORS)]
    rng = random.Random(7)
    plans = [[(p, rng.choice(ACTIONS)) for p in rng.sample(proposals, len(proposals))] for _ in users]

    barrier = threading.Barrier(OPERATORS)
    outcomes, crashes = [], []

    def operator(i):
        try:
            barrier.wait()
            for placement, action in plans[i]:
                try:
                    if action == "approve":
                        services.approve(placement.pk, users[i], expected_version=1)
                    elif action == "reject":
                        services.reject(placement.pk, users[i], "not now", expected_version=1)
                    else:
                        gpus = cluster.gpus(free_hosts[(i + placement.pk) % len(free_hosts)])
                        services.override(placement.pk, users[i], gpus, expected_version=1)
                    outcomes.append((placement.pk, i, action, "won"))
                except (services.ChangedUnderYou, services.NotDecidable) as exc:
                    outcomes.append((placement.pk, i, action, str(exc)))
                except (services.InvalidOverride, services.GpusTaken) as exc:  # e.g. onto GPUs another override took
                    outcomes.append((placement.pk, i, action, "refused: " + str(exc)))
        except Exception as exc:  # noqa: BLE001 - reported below
            crashes.append(repr(exc))
        finally:
            connections.close_all()

    threads = [threading.Thread(target=operator, args=(i,)) for i in range(OPERATORS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)

    assert crashes == []
    assert len(outcomes) == OPERATORS * 3
    wins = Counter(pk for pk, _, _, result in outcomes if result == "won")
    assert wins == {p.pk: 1 for p in proposals}, wins
    for p in proposals:
        p.refresh_from_db()
        winner_i, action = next((i, a) for pk, i, a, r in outcomes if pk == p.pk and r == "won")
        expected = {"approve": Placement.State.APPROVED, "override": Placement.State.APPROVED,
                    "reject": Placement.State.REJECTED}[action]
        assert p.state == expected and p.decided_by_name == users[winner_i].username
        assert p.version > 1  # a decision bumps it: a stale form is refused
        attempts = AuditEvent.objects.filter(placement=p, action__in=ACTIONS)
        # Every operator's attempt is there: 49 refused, and the winner's accepted decision
        # (a winning override is audited as the override and as its approval).
        refused = attempts.filter(refused=True)
        assert refused.count() == OPERATORS - 1, f"audit has {refused.count()} refused attempts on {p}"
        assert set(refused.values_list("actor", flat=True)) == {u.username for u in users} - {users[winner_i].username}
        assert attempts.filter(refused=False, actor=users[winner_i].username).exists()
    assert not PlacementGpu.objects.filter(active=True).values("gpu").annotate(n=Count("id")).filter(n__gt=1).exists()
