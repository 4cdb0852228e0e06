"""The admin: every fabric and pool model has a working changelist, GUIDs are found however
they are spelled, discovery's rows are read-only, and operators reach only what their
permissions allow."""
import re

import pytest
from django.contrib import admin
from django.contrib.auth.models import Group, User

from fabric.importer import import_file
from fabric.models import ChannelAdapter, FabricEvent, Link, Switch
from pool.models import Gpu, Host, Pool

pytestmark = pytest.mark.django_db

LAB = "ibnetdiscover_nvidia_ufm_lab_hdr_fdr_edr_sharp.txt"
SX6036 = "0002c903007b78b0"
MODELS = ["site", "fabric", "switch", "channeladapter", "port", "link", "portcounters", "fabricevent"]
POOL_MODELS = ["pool", "host", "gpu"]


@pytest.fixture
def lab(sample):
    fabric = import_file(sample(LAB), "lab", source_name=LAB).fabric
    pool = Pool.objects.create(name="training")
    host = Host.objects.create(name="r-dcs96", fabric=fabric, pool=pool)
    host.adapters.set(ChannelAdapter.objects.filter(host_name="r-dcs96"))
    Gpu.objects.bulk_create([Gpu(host=host, index=i, model="A100-SXM4-80GB", memory_mib=81920) for i in range(8)])
    Host.objects.create(name="r-dmz-ufm128", fabric=fabric, pool=Pool.objects.create(name="spare"))
    return fabric


def user_with_role(username, role, staff):
    user = User.objects.create_user(username, password="unused-password-1", is_staff=staff)
    user.groups.add(Group.objects.get(name=role))
    return user


@pytest.fixture
def admin_client(client):
    client.force_login(user_with_role("ada", "admin", staff=True))
    return client


def test_every_fabric_and_pool_model_is_registered():
    registered = {(model._meta.app_label, model._meta.model_name) for model in admin.site._registry}
    for name in MODELS:
        assert ("fabric", name) in registered
    for name in POOL_MODELS:
        assert ("pool", name) in registered


@pytest.mark.parametrize("app, model", [("fabric", m) for m in MODELS] + [("pool", m) for m in POOL_MODELS])
def test_changelists_render_for_admins(admin_client, lab, app, model, django_assert_max_num_queries):
    # Bounded: list_select_related and annotations, not one query per row.
    with django_assert_max_num_queries(12):
        response = admin_client.get(f"/admin/{app}/{model}/")
    assert response.status_code == 200


def found(client, url, term="", **filters):
    response = client.get(url, {"q": term, **filters})
    assert response.status_code == 200
    return list(response.context["cl"].result_list)


@pytest.mark.parametrize("term", ["0x2c903007b78b0", "2c903007b78b0", "0002c903007b78b0", "0x0002C903007B78B0", "00:02:c9:03:00:7b:78:b0"])
def test_switch_guid_search_takes_any_spelling(admin_client, lab, term):
    switches = found(admin_client, "/admin/fabric/switch/", term)
    assert [s.guid for s in switches] == [SX6036]


def test_guid_search_on_adapters_ports_and_links(admin_client, lab):
    adapters = found(admin_client, "/admin/fabric/channeladapter/", "0xec0d9a03007d7d0b")
    assert [a.description for a in adapters] == ["r-dcs96 HCA-2"]
    links = found(admin_client, "/admin/fabric/link/", "0x2c903007b78b0")
    assert len(links) == 13  # every cable of the SX6036, loopbacks included
    ports = found(admin_client, "/admin/fabric/port/", "0x2c903007b78b0")
    assert len(ports) == 15 and all(p.switch.guid == SX6036 for p in ports)


def test_plain_search_still_works(admin_client, lab):
    assert [s.guid for s in found(admin_client, "/admin/fabric/switch/", "MQM8700")] == ["b8599f0300fc6de4"]
    assert len(found(admin_client, "/admin/fabric/channeladapter/", "r-dmz-ufm13")) == 6
    assert found(admin_client, "/admin/fabric/switch/", "zzzz") == []


def test_filters_an_operator_uses(admin_client, lab):
    Link.objects.filter(kind=Link.Kind.LOOPBACK).update(state=Link.State.DOWN)
    assert len(found(admin_client, "/admin/fabric/link/", state__exact="down")) == 2
    assert len(found(admin_client, "/admin/fabric/switch/", tier__exact="leaf")) == 2
    assert found(admin_client, "/admin/fabric/switch/", tier__exact="spine") == []
    assert len(found(admin_client, "/admin/fabric/channeladapter/", is_aggregation_node__exact="1")) == 1


def test_discovered_rows_are_read_only_even_for_admins(admin_client, lab):
    switch = Switch.objects.get(guid=SX6036)
    assert admin_client.get("/admin/fabric/switch/add/").status_code == 403
    page = admin_client.get(f"/admin/fabric/switch/{switch.pk}/change/")
    assert page.status_code == 200 and 'name="_save"' not in page.content.decode()
    response = admin_client.post(f"/admin/fabric/switch/{switch.pk}/change/", {"description": "renamed"})
    assert response.status_code == 403
    assert Switch.objects.get(pk=switch.pk).description == "MF0;r-ufm-sw226:SX6036/U1"
    link = Link.objects.filter(fabric=lab).first()
    assert admin_client.get("/admin/fabric/link/add/").status_code == 403
    assert 'name="_save"' not in admin_client.get(f"/admin/fabric/link/{link.pk}/change/").content.decode()


def test_events_cannot_be_added_or_changed(admin_client, lab):
    event = FabricEvent.objects.filter(fabric=lab).first()
    assert admin_client.get("/admin/fabric/fabricevent/add/").status_code == 403
    assert admin_client.post(f"/admin/fabric/fabricevent/{event.pk}/change/", {"message": "rewritten"}).status_code == 403
    assert FabricEvent.objects.get(pk=event.pk).message == event.message


def test_admins_edit_hosts_with_gpus_inline(admin_client, lab):
    host = Host.objects.get(name="r-dcs96")
    page = admin_client.get(f"/admin/pool/host/{host.pk}/change/").content.decode()
    assert 'name="gpus-TOTAL_FORMS" value="8"' in page
    # Adapters are picked by search (autocomplete), not from a list of every adapter.
    assert 'data-ajax--url="/admin/autocomplete/"' in page
    response = admin_client.get("/admin/autocomplete/", {"app_label": "pool", "model_name": "host", "field_name": "adapters", "term": "0xec0d9a03007d7d0b"})
    assert [r["text"] for r in response.json()["results"]] == ["r-dcs96 HCA-2 (0xec0d9a03007d7d0b)"]


def test_html_in_descriptions_is_escaped_in_the_admin(admin_client, lab):
    Switch.objects.filter(guid=SX6036).update(description="<script>alert(1)</script>")
    page = admin_client.get("/admin/fabric/switch/").content.decode()
    assert "<script>alert(1)" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page


def test_operators_reach_only_what_their_permissions_allow(client, lab):
    operator = user_with_role("otto", "operator", staff=True)  # staff, to reach the admin at all
    client.force_login(operator)
    host = Host.objects.get(name="r-dcs96")
    assert client.get("/admin/fabric/switch/").status_code == 200  # view permission
    assert client.get("/admin/pool/host/").status_code == 200
    for denied in ["/admin/auth/user/", "/admin/auth/group/", "/admin/pool/host/add/", "/admin/fabric/site/add/",
                   "/admin/fabric/fabric/add/", "/admin/django_celery_beat/periodictask/", f"/admin/pool/host/{host.pk}/delete/"]:
        assert client.get(denied).status_code == 403, denied
    index = client.get("/admin/").content.decode()
    assert "/admin/auth/user/" not in index and "/admin/pool/host/" in index
    # change_host is an operator permission: the form saves.
    page = client.get(f"/admin/pool/host/{host.pk}/change/").content.decode()
    assert 'name="_save"' in page
    pool = Pool.objects.create(name="inference")
    form = {
        "name": "r-dcs96", "state": "draining", "pool": pool.pk, "fabric": lab.pk, "agent_kind": "fabricpool",
        "agent_url": "http://r-dcs96:9400", "labels": "{}", "in_fabric": "on", "adapters": [a.pk for a in host.adapters.all()],
        "gpus-TOTAL_FORMS": "0", "gpus-INITIAL_FORMS": "0",
    }
    response = client.post(f"/admin/pool/host/{host.pk}/change/", form)
    assert response.status_code == 302, re.findall(r'class="errorlist[^"]*">(.*?)</ul>', response.content.decode(), re.S)
    host.refresh_from_db()
    assert host.pool == pool and host.agent_url == "http://r-dcs96:9400"


def test_operators_and_viewers_who_are_not_staff_are_sent_to_the_admin_login(client, lab):
    for username, role in (("otto", "operator"), ("vera", "viewer")):
        client.force_login(user_with_role(username, role, staff=False))
        response = client.get("/admin/fabric/switch/")
        assert response.status_code == 302 and response["Location"].startswith("/admin/login/")
