"""Two discoveries of the same fabric at once (a periodic run and an operator upload):
the fabric row lock makes them run one after the other, so neither fails on a unique
constraint and the result is one of the two files, complete."""
import threading

import pytest
from django.db import connection, connections

from fabric.importer import import_file
from fabric.models import Fabric, Link, Switch
from tests.conftest import read_sample

LAB = "ibnetdiscover_nvidia_ufm_lab_hdr_fdr_edr_sharp.txt"


@pytest.fixture
def require_postgres():
    if connection.vendor != "postgresql":
        pytest.skip("needs PostgreSQL row locks (SELECT ... FOR UPDATE); SQLite serialises whole transactions instead")


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_concurrent_imports_of_one_fabric_serialise(require_postgres):
    # An empty fabric (created by an operator): without the lock, concurrent first imports
    # would all insert the same switches and all but one fail on the unique constraint.
    Fabric.objects.create(name="lab")
    newer = read_sample(LAB).replace(b'# "r-dcs96 HCA-1" lid 9 4xEDR', b'# "r-dcs96 HCA-1" lid 9 4xHDR')
    errors = []
    barrier = threading.Barrier(8)

    def worker(data):
        try:
            barrier.wait()
            import_file(data, "lab")
        except Exception as exc:  # noqa: BLE001 - the test reports any failure
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=worker, args=(newer if i % 2 else read_sample(LAB),)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    assert Switch.objects.count() == 2
    assert Link.objects.count() == 16
    assert Link.objects.filter(speed__in=["EDR", "HDR"], port_a__adapter__description="r-dcs96 HCA-1").count() + Link.objects.filter(
        speed__in=["EDR", "HDR"], port_b__adapter__description="r-dcs96 HCA-1").count() == 1
