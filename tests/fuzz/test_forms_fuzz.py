"""Every form an operator can send, with whatever hypothesis types into it, through the real
views: the answer is never a server error; a refused submission (a form error, a 400, a
403 or a 409) changes nothing; the ibnetdiscover import command either imports a file or
stops with a CommandError. Form fields are read from the forms themselves, so a field
added later is fuzzed too."""
import json

import pytest
from django.contrib.auth.models import Group, User
from django.core.management import CommandError, call_command
from hypothesis import event, given, settings
from hypothesis import strategies as st

from fabric.models import Fabric, Link, Switch
from pool.models import Gpu, Host, HostEvent, Pool
from scheduler.forms import SubmitJobForm
from scheduler.models import AuditEvent, Job, Placement, PlacementGpu, Tenant
from tests.conftest import read_sample

from .strategies import FUZZ_DB, NASTY_TEXT, mutated

pytestmark = pytest.mark.django_db

FORMS = settings(FUZZ_DB, max_examples=30)  # two requests and a page render per example
TEXT = st.one_of(NASTY_TEXT, st.text(max_size=40), st.integers(-10**12, 10**12).map(str))
# Plausible values per field, so that many submissions get past the first check.
PLAUSIBLE = {"tenant": st.just("physics"), "pool": st.just("main"), "gpus": st.integers(-2, 20).map(str),
             "command": st.sampled_from(["train --epochs 1", "'unterminated", "", "a\x00b"]),
             "env": st.sampled_from(["A=1", "A=1\nB", "=x", "PATH=/bin\nA=2"]),
             "gpu_models": st.sampled_from(["H100", "", "H100,,A100"]), "max_wait": st.sampled_from(["10m", "1d", "x", "9" * 50])}


@pytest.fixture
def cluster():
    call_command("build_fattree", "--fabric", "f", "--spines", "2", "--leaves", "2", "--hosts-per-leaf", "2",
                 "--gpus-per-host", "4", "--speed", "EDR", verbosity=0)
    pool = Pool.objects.create(name="main")
    Host.objects.update(pool=pool, state=Host.State.UP)
    tenant = Tenant.objects.create(name="physics")
    job = Job.objects.create(tenant=tenant, pool=pool, gpus=2, command=["train"])
    placement = Placement.objects.create(job=job, state=Placement.State.PROPOSED)
    PlacementGpu.objects.bulk_create([PlacementGpu(placement=placement, gpu=g) for g in Gpu.objects.order_by("pk")[:2]])
    return placement


@pytest.fixture
def operator(client):
    user = User.objects.create_user("otto", password="unused-password-1")
    user.groups.add(Group.objects.get(name="operator"))
    client.force_login(user)
    return client


def state():
    """What a refused request must leave as it was. The audit log records refused decision
    attempts by design (scheduler/audit.py), marked refused: those may be added."""
    return (Job.objects.count(), AuditEvent.objects.filter(refused=False).count(), HostEvent.objects.count(),
            sorted(Placement.objects.values_list("pk", "state", "version")),
            sorted(Host.objects.values_list("pk", "state")), PlacementGpu.objects.count())


def check(response, before, accepted=(302,)):
    """No server error; anything but an acceptance changed nothing."""
    assert response.status_code < 500, response.content[:500]
    if response.status_code in accepted:
        event("accepted")
    else:
        event(f"refused {response.status_code}")
        assert state() == before, f"refused with {response.status_code} but the database changed"


def reopen(placement):
    Placement.objects.filter(pk=placement.pk).update(state=Placement.State.PROPOSED)


VALID = {"tenant": "physics", "pool": "main", "gpus": "2", "command": "train --epochs 1", "task_class": "training",
         "priority": "0", "gang": "on", "whole_hosts": "on"}


@FORMS
@given(data=st.data())
def test_the_submit_form(operator, cluster, data):
    """A valid submission with a few fields changed, dropped or added."""
    fields = dict(VALID)
    names = list(SubmitJobForm().fields)
    for _ in range(data.draw(st.integers(0, 3))):
        name = data.draw(st.sampled_from(names))
        if data.draw(st.integers(0, 4)) == 0:
            fields.pop(name, None)
        else:
            fields[name] = data.draw(st.one_of(PLAUSIBLE.get(name, TEXT), TEXT), label=name)
    before = state()
    response = operator.post("/scheduler/submit/", fields)
    check(response, before)
    if response.status_code != 302:
        assert "errorlist" in response.content.decode() or response.status_code in (400, 403)


@FORMS
@given(action=st.one_of(st.sampled_from(["approve", "reject", "override"]), TEXT), reason=TEXT,
       version=st.one_of(st.just("1"), TEXT), extra=st.dictionaries(st.sampled_from(["gpu", "step", "next"]), TEXT))
def test_the_decision_forms(operator, cluster, action, reason, version, extra):
    reopen(cluster)
    before = state()
    check(operator.post(f"/scheduler/placements/{cluster.pk}/", {"action": action, "reason": reason, "version": version,
                                                                  **extra}), before)
    reopen(cluster)
    before = state()
    check(operator.post(f"/scheduler/placements/{cluster.pk}/override/", {"version": version, **extra}), before)


PICK = st.fixed_dictionaries({"gpus": st.lists(st.one_of(st.integers(-5, 100), TEXT), max_size=6),
                              "version": st.one_of(st.integers(-1, 3), TEXT)})


@FORMS
@given(body=st.one_of(PICK.map(json.dumps), st.text(max_size=60), st.binary(max_size=60).map(lambda b: b.decode("latin-1"))))
def test_the_override_pick_endpoints(operator, cluster, body):
    for step in ("check", "confirm"):
        reopen(cluster)
        before = state()
        response = operator.post(f"/scheduler/placements/{cluster.pk}/override/{step}/", body,
                                 content_type="application/json")
        check(response, before, accepted=(200,))


@FORMS
@given(action=st.one_of(st.sampled_from(["drain", "undrain", "cancel"]), TEXT), reason=TEXT)
def test_the_host_and_job_action_forms(operator, cluster, action, reason):
    host = Host.objects.order_by("pk").first()
    before = state()
    check(operator.post(f"/pool/hosts/{host.name}/", {"action": action, "reason": reason}), before)
    before = state()
    check(operator.post(f"/scheduler/jobs/{cluster.job_id}/", {"action": action, "reason": reason}), before)


@FUZZ_DB
@given(data=mutated(read_sample("ibnetdiscover_ibm_2ca_1sw_sdr.txt"), max_ops=3),
       name=st.one_of(st.just("up"), NASTY_TEXT))
def test_the_import_command_imports_or_stops_with_a_clear_error(tmp_path_factory, data, name):
    path = tmp_path_factory.mktemp("topo") / "topology.txt"
    path.write_bytes(data)
    before = (Fabric.objects.count(), Switch.objects.count(), Link.objects.count())
    try:
        call_command("import_ibnetdiscover", str(path), "--fabric", name, verbosity=0)
    except CommandError as exc:
        event("refused")
        assert str(exc)
        assert (Fabric.objects.count(), Switch.objects.count(), Link.objects.count()) == before
    else:
        event("imported")


def test_a_form_encoded_pick_is_refused_not_a_server_error(cluster):
    from django.test import Client

    client = Client(enforce_csrf_checks=True, raise_request_exception=False)
    user = User.objects.create_user("otto", password="unused-password-1")
    user.groups.add(Group.objects.get(name="operator"))
    client.force_login(user)
    client.get("/")
    token = client.cookies["csrftoken"].value
    before = state()
    for step in ("check", "confirm"):
        response = client.post(f"/scheduler/placements/{cluster.pk}/override/{step}/", {"gpus": "1", "version": "1"},
                               HTTP_X_CSRFTOKEN=token)
        assert response.status_code == 400, response.status_code
    assert state() == before
