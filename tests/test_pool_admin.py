"""The pool admin: changelists in a fixed number of queries whatever the number of rows,
drain and undrain as admin actions for those with the permission only (writing events),
measured fields and states read-only, events and poll rounds view-only, and the sample
tables not registered at all."""
import pytest
from django.contrib import admin
from django.contrib.auth.models import Group, Permission, User
from django.core.management import call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext

from pool.models import Gpu, GpuRollup, GpuSample, Host, HostEvent, HostRollup, HostSample, PollRound, Pool

pytestmark = pytest.mark.django_db

CHANGELISTS = ["pool", "host", "gpu", "hostevent", "pollround"]


def staff(username, role=None, perms=()):
    user = User.objects.create_user(username, password="unused-password-1", is_staff=True)
    if role:
        user.groups.add(Group.objects.get(name=role))
    for codename in perms:
        user.user_permissions.add(Permission.objects.get(content_type__app_label="pool", codename=codename))
    return user


@pytest.fixture
def admin_client(client):
    # A superuser: what is read-only here is so for everyone, whatever the roles hold.
    client.force_login(User.objects.create_superuser("ada", password="unused-password-1"))
    return client


def build(fabric, hosts_per_leaf):
    call_command("build_fattree", "--fabric", fabric, "--spines", "2", "--leaves", "2", "--hosts-per-leaf", str(hosts_per_leaf),
                 "--gpus-per-host", "4", "--speed", "EDR", verbosity=0)
    pool = Pool.objects.create(name=f"{fabric}-pool")
    Host.objects.filter(fabric__name=fabric).update(pool=pool)
    PollRound.objects.bulk_create([PollRound(hosts=2 * hosts_per_leaf, chunks=1) for _ in range(hosts_per_leaf)])


@pytest.fixture
def hosts():
    build("t", 2)
    return Host.objects.order_by("name")


def count_queries(client, url):
    with CaptureQueriesContext(connection) as captured:
        response = client.get(url)
    assert response.status_code == 200, url
    return len(captured)


@pytest.mark.parametrize("model", CHANGELISTS)
def test_changelists_render_in_a_fixed_number_of_queries(admin_client, model, django_assert_max_num_queries):
    build("small", 2)  # 4 hosts (+ their registration events)
    small = count_queries(admin_client, f"/admin/pool/{model}/")
    build("large", 30)  # 64 hosts in all, 256 GPUs, more events, pools and poll rounds
    with django_assert_max_num_queries(12):
        response = admin_client.get(f"/admin/pool/{model}/")
    assert response.status_code == 200
    assert count_queries(admin_client, f"/admin/pool/{model}/") == small


def test_host_changelist_shows_the_present_gpus_and_filters(admin_client, hosts):
    Gpu.objects.filter(host__name="gpu0001", index=3).update(present=False)
    response = admin_client.get("/admin/pool/host/", {"q": "gpu0001"})
    rows = list(response.context["cl"].result_list)
    assert [h.name for h in rows] == ["gpu0001"] and rows[0].gpu_count == 3
    page = response.content.decode()
    for column in ("column-name", "column-state", "column-pool", "column-fabric", "column-gpu_count", "column-last_report_at",
                   "column-agent_kind", "column-in_fabric"):
        assert column in page
    for parameter in ("state__exact", "pool__id__exact", "fabric__id__exact", "agent_kind__exact", "in_fabric__exact"):
        assert parameter in page, parameter


def selected(response):
    return [h.name for h in response.context["cl"].result_list]


def test_admins_drain_and_undrain_hosts_with_the_actions_and_events_are_written(admin_client, hosts):
    names = ["gpu0001", "gpu0002"]
    ids = [str(pk) for pk in Host.objects.filter(name__in=names).values_list("id", flat=True)]
    response = admin_client.post("/admin/pool/host/", {"action": "drain", "_selected_action": ids}, follow=True)
    assert "2 hosts drained." in response.content.decode()
    assert set(Host.objects.filter(state="draining").values_list("name", flat=True)) == set(names)
    events = HostEvent.objects.filter(kind="drained").order_by("host__name")
    assert [(e.host.name, e.actor) for e in events] == [("gpu0001", "ada"), ("gpu0002", "ada")]

    # Again: nothing to do, said so.
    response = admin_client.post("/admin/pool/host/", {"action": "drain", "_selected_action": ids}, follow=True)
    assert "0 hosts drained; 2 left as they were (already draining)." in response.content.decode()
    assert HostEvent.objects.filter(kind="drained").count() == 2

    response = admin_client.post("/admin/pool/host/", {"action": "undrain", "_selected_action": ids}, follow=True)
    assert "2 hosts undrained." in response.content.decode()
    assert not Host.objects.filter(state="draining").exists()  # never reported: back to new
    assert set(Host.objects.filter(name__in=names).values_list("state", flat=True)) == {"new"}
    assert HostEvent.objects.filter(kind="undrained", actor="ada").count() == 2


def test_the_drain_actions_need_the_drain_permission(client, hosts):
    host = hosts.first()
    # May change hosts (pool, agent URL) but not drain them.
    client.force_login(staff("carl", perms=["view_host", "change_host"]))
    page = client.get("/admin/pool/host/").content.decode()
    assert 'value="drain"' not in page and 'value="undrain"' not in page
    client.post("/admin/pool/host/", {"action": "drain", "_selected_action": [str(host.pk)]})
    host.refresh_from_db()
    assert host.state == "new" and not HostEvent.objects.filter(kind="drained").exists()

    # Operators hold the permission.
    client.force_login(staff("otto", "operator"))
    page = client.get("/admin/pool/host/").content.decode()
    assert 'value="drain"' in page and 'value="undrain"' in page
    client.post("/admin/pool/host/", {"action": "drain", "_selected_action": [str(host.pk)]})
    host.refresh_from_db()
    assert host.state == "draining" and HostEvent.objects.get(kind="drained").actor == "otto"


def test_state_and_measured_fields_are_read_only_and_the_agent_settings_editable(admin_client, hosts):
    host = hosts.first()
    host.missed_rounds, host.last_error, host.cpu_percent = 3, "timeout: no data for 3 s", 42.0
    host.save()
    page = admin_client.get(f"/admin/pool/host/{host.pk}/change/").content.decode()
    for field in ("state", "missed_rounds", "last_error", "cpu_percent", "ib_tx_bytes_per_s", "ib_ports"):
        assert f'name="{field}"' not in page, field
    assert "timeout: no data for 3 s" in page and 'name="ib_metrics_url"' in page and 'name="agent_url"' in page
    # GPU rows: what the agent measures is shown, not edited.
    assert 'name="gpus-0-model"' in page
    for field in ("temperature_c", "power_w", "fp64_class", "compute_capability", "present", "utilization"):
        assert f'name="gpus-0-{field}"' not in page, field

    form = {
        "name": host.name, "state": "down", "missed_rounds": "0", "pool": "", "fabric": host.fabric_id, "agent_kind": "dcgm",
        "agent_url": "http://gpu0001:9400/metrics", "ib_metrics_url": "http://gpu0001:9100/metrics", "labels": "{}",
        "in_fabric": "on", "adapters": [a.pk for a in host.adapters.all()], "gpus-TOTAL_FORMS": "0", "gpus-INITIAL_FORMS": "0",
    }
    response = admin_client.post(f"/admin/pool/host/{host.pk}/change/", form)
    assert response.status_code == 302
    host.refresh_from_db()
    assert (host.agent_kind, host.ib_metrics_url) == ("dcgm", "http://gpu0001:9100/metrics")
    assert host.state == "new" and host.missed_rounds == 3  # posted values of read-only fields are ignored


@pytest.mark.parametrize("model", ["hostevent", "pollround"])
def test_events_and_poll_rounds_are_view_only_even_for_admins(admin_client, hosts, model):
    obj = (HostEvent if model == "hostevent" else PollRound).objects.order_by("pk").first()
    assert admin_client.get(f"/admin/pool/{model}/add/").status_code == 403
    page = admin_client.get(f"/admin/pool/{model}/{obj.pk}/change/")
    assert page.status_code == 200 and 'name="_save"' not in page.content.decode()
    assert admin_client.post(f"/admin/pool/{model}/{obj.pk}/change/", {"message": "rewritten", "hosts": "0"}).status_code == 403
    assert admin_client.get(f"/admin/pool/{model}/{obj.pk}/delete/").status_code == 403
    obj.refresh_from_db()
    if model == "hostevent":
        assert obj.message.startswith("registered from discovery")
    else:
        assert obj.hosts == 4


def test_sample_and_rollup_tables_are_not_in_the_admin(admin_client):
    for model in (GpuSample, HostSample, GpuRollup, HostRollup):
        assert not admin.site.is_registered(model)
    assert admin_client.get("/admin/pool/gpusample/").status_code == 404
