"""The dashboard pages show the numbers of an imported fabric, escape what discovery
brings in, filter links by state, and stay within a fixed number of queries whatever
the size of the fabric. plotly.js is served by the project itself."""
import html
import re
from pathlib import Path

import pytest
from asgiref.sync import async_to_sync
from django.contrib.auth.models import Group, User
from django.contrib.staticfiles import finders
from django.db.models import Q
from django.templatetags.static import static

from fabric.importer import import_file
from fabric.models import ChannelAdapter, Link, Switch
from fabric.summary import fabric_summary

LAB = "ibnetdiscover_nvidia_ufm_lab_hdr_fdr_edr_sharp.txt"
LAB_SX6036 = "0002c903007b78b0"  # the FDR switch: 10 adapters, 1 ISL, 2 loopback cables
LAB_QM8700 = "b8599f0300fc6de4"
TEMPLATES = Path(__file__).resolve().parent.parent / "templates"

pytestmark = pytest.mark.django_db


@pytest.fixture
def viewer(client):
    user = User.objects.create_user("vera", password="unused-password-1")
    user.groups.add(Group.objects.get(name="viewer"))
    client.force_login(user)
    return user


@pytest.fixture
def lab(sample):
    return import_file(sample(LAB), "lab", source_name=LAB).fabric


def take_down(switch_guid, port, reason):
    """Mark the cable on a switch port down, as the health check will."""
    at = Q(port_a__switch__guid=switch_guid, port_a__number=port) | Q(port_b__switch__guid=switch_guid, port_b__number=port)
    assert Link.objects.filter(at).update(state=Link.State.DOWN, state_reason=reason) == 1


def text(response) -> str:
    return response.content.decode()


def link_for(page: str, label: str) -> str:
    """The href of the number whose accessible label is `label`."""
    match = re.search(rf'<a href="([^"]+)" aria-label="{re.escape(label)}"', page)
    assert match, f"no link labelled {label!r}"
    return html.unescape(match.group(1))


def table_rows(page: str) -> list[str]:
    body = page.split("<tbody>", 1)[1].split("</tbody>", 1)[0] if "<tbody>" in page else ""
    return re.findall(r"<tr[ >].*?</tr>", body, flags=re.S)


def test_overview_numbers_match_the_import_and_link_to_their_lists(client, viewer, lab):
    summary = fabric_summary(lab)
    page = text(client.get("/"))
    assert summary["switches"]["leaf"] == 2 and summary["adapters"] == 13 and summary["hosts"] == 5
    assert link_for(page, "2 leaf switches in lab") == "/fabric/lab/?tier=leaf#switches"
    assert link_for(page, "0 spine switches in lab") == "/fabric/lab/?tier=spine#switches"
    assert link_for(page, "2 switches in lab") == "/fabric/lab/#switches"
    adapters_url = link_for(page, "13 adapters in lab")
    assert link_for(page, "5 hosts in lab") == adapters_url
    links = Link.objects.filter(fabric=lab).count()
    assert link_for(page, f"{links} links up in lab") == "/fabric/lab/links/?state=up"
    assert link_for(page, "0 links down in lab") == "/fabric/lab/links/?state=down"

    # The list behind each number has that many rows.
    assert len(table_rows(text(client.get(adapters_url)))) == 13
    assert len(table_rows(text(client.get("/fabric/lab/links/?state=up")))) == links
    assert "No links in state down" in text(client.get("/fabric/lab/links/?state=down"))


def test_overview_counts_pool_hosts_and_gpus(client, viewer, lab):
    from pool.models import Gpu, Host

    host = Host.objects.create(name="r-dcs96", fabric=lab, state=Host.State.UP)
    Host.objects.create(name="r-dmz-ufm128", fabric=lab, state=Host.State.DRAINING)
    Gpu.objects.bulk_create([Gpu(host=host, index=i, model="A100") for i in range(8)])
    page = text(client.get("/"))
    assert link_for(page, "2 hosts") == "/pool/"
    assert link_for(page, "8 GPUs") == "/pool/"
    assert "aria-label=\"1 hosts draining\"" in page
    assert "2 hosts, 8 GPUs" in text(client.get("/pool/"))


def test_fabric_page_groups_switches_by_tier_with_link_health(client, viewer, lab):
    take_down(LAB_SX6036, 3, "port 3 flapping")
    page = text(client.get("/fabric/lab/"))
    assert '<h3 id="tier-leaf">leaf</h3>' in page
    rows = {row.split("</a>")[0].rsplit(">", 1)[1]: row for row in table_rows(page.split('id="switches"')[1])}
    sx = rows["MF0;r-ufm-sw226:SX6036/U1"]
    cells = re.findall(r'<td class="num">(.*?)</td>', sx, flags=re.S)
    # LID, ports, links, then up/degraded/down/missing.
    assert cells[:3] == ["19", "36", "13"]
    assert "12 up" in cells[3] and "1 down" in cells[5]
    qm = rows["MF0;r-ufm-sw95:MQM8700/U1"]
    assert re.findall(r'<td class="num">(.*?)</td>', qm)[2] == "4"
    assert "first import: 2 switches, 13 adapters, 16 links" in page  # recent events


def test_recent_events_link_to_their_switch(client, viewer, lab):
    from fabric.models import FabricEvent

    switch = Switch.objects.get(guid=LAB_QM8700)
    FabricEvent.objects.create(fabric=lab, kind=FabricEvent.Kind.SWITCH_CHANGED, severity=FabricEvent.Severity.WARNING,
                               message="switch MF0;r-ufm-sw95:MQM8700/U1: lid 13 → 14", switch=switch)
    page = text(client.get("/fabric/lab/"))
    assert f'<a href="/fabric/lab/switches/{LAB_QM8700}/">switch MF0;r-ufm-sw95:MQM8700/U1: lid 13 → 14</a>' in page
    assert page.index("lid 13 → 14") < page.index("first import")  # newest first


def test_tier_filter_and_bad_tier(client, viewer, lab):
    assert "No switches in tier spine" in text(client.get("/fabric/lab/?tier=spine"))
    response = client.get("/fabric/lab/?tier=attic")
    assert response.status_code == 400
    assert "Unknown tier &#x27;attic&#x27;: choose one of leaf, spine, core, unknown." in text(response)


def test_switch_page_lists_ports_with_far_end_speed_and_state(client, viewer, lab):
    take_down(LAB_SX6036, 3, "port 3 flapping")
    page = text(client.get(f"/fabric/lab/switches/{LAB_SX6036}/"))
    rows = table_rows(page)
    assert len(rows) == 15  # 11 cables to other nodes, and each loopback cable on both of its ports
    first = rows[0]
    assert f'href="/fabric/lab/switches/{LAB_QM8700}/">MF0;r-ufm-sw95:MQM8700/U1</a>[3]' in first
    assert "4x" in first and "FDR" in first and "54.56" in first
    down = next(row for row in rows if "r-dmz-ufm128 HCA-1[1]" in row)
    assert "state-down" in down and "port 3 flapping" in down
    loop = [row for row in rows if "SX6036/U1</a>[26]" in row or "SX6036/U1</a>[25]" in row]
    assert len(loop) == 2 and all("FDR10" in row for row in loop)


def test_switch_page_accepts_any_guid_spelling_and_rejects_garbage(client, viewer, lab):
    response = client.get("/fabric/lab/switches/0x2c903007b78b0/")
    assert response.status_code == 302 and response["Location"] == f"/fabric/lab/switches/{LAB_SX6036}/"
    assert client.get("/fabric/lab/switches/not-a-guid/").status_code == 404
    assert client.get("/fabric/lab/switches/0000000000000001/").status_code == 404
    assert client.get("/fabric/elsewhere/switches/0002c903007b78b0/").status_code == 404


def test_links_filter_by_state_and_reject_unknown_state(client, viewer, lab):
    take_down(LAB_SX6036, 3, "port 3 flapping")
    down = text(client.get("/fabric/lab/links/?state=down"))
    rows = table_rows(down)
    assert len(rows) == 1 and "port 3 flapping" in rows[0] and "r-dmz-ufm128 HCA-1[1]" in rows[0]
    assert '<option value="down" selected>' in down
    up = text(client.get("/fabric/lab/links/?state=up"))
    assert "port 3 flapping" not in up and len(table_rows(up)) == 15
    response = client.get("/fabric/lab/links/?state=broken")
    assert response.status_code == 400
    assert "Unknown link state &#x27;broken&#x27;" in text(response)
    assert len(table_rows(text(client.get("/fabric/lab/links/?kind=loopback")))) == 2


def test_a_cable_gone_from_discovery_shows_as_missing(client, viewer, lab, sample):
    # Re-import without the cable between the QM8700 port 24 and r-dcs96 HCA-2.
    lines = sample(LAB).decode().splitlines(keepends=True)
    kept = [line for line in lines if not line.startswith("[24]\t") and '"S-b8599f0300fc6de4"[24]' not in line]
    assert len(kept) == len(lines) - 2
    import_file("".join(kept).encode(), "lab", source_name="edited")
    overview = text(client.get("/"))
    assert link_for(overview, "1 links missing in lab") == "/fabric/lab/links/?state=missing"
    rows = table_rows(text(client.get("/fabric/lab/links/?state=missing")))
    assert len(rows) == 1 and "r-dcs96 HCA-2" in rows[0] and "not in the latest discovery" in rows[0]
    switch = text(client.get(f"/fabric/lab/switches/{LAB_QM8700}/"))
    assert re.search(r"<dt>links missing</dt><dd>1</dd>", switch)


HOSTILE = b"""
vendid=0x2c9
devid=0xc738
sysimgguid=0x2c903007b78b0
switchguid=0x2c903007b78b0(2c903007b78b0)
Switch\t36 "S-0002c903007b78b0"\t\t# "<script>alert(1)</script>" enhanced port 0 lid 19 lmc 0
[3]\t"H-e41d2d03005cf34c"[1](e41d2d03005cf34c) \t\t# "<img/src=x/onerror=alert(2)> HCA-1" lid 3 4xFDR

vendid=0x2c9
devid=0x1013
sysimgguid=0xe41d2d03005cf34c
caguid=0xe41d2d03005cf34c
Ca\t1 "H-e41d2d03005cf34c"\t\t# "<img/src=x/onerror=alert(2)> HCA-1"
[1](e41d2d03005cf34c) \t"S-0002c903007b78b0"[3]\t\t# lid 3 lmc 0 "<script>alert(1)</script>" lid 19 4xFDR
"""


def test_html_in_discovered_descriptions_is_escaped(client, viewer):
    import_file(HOSTILE, "hostile", source_name="hostile")
    assert Switch.objects.get().description == "<script>alert(1)</script>"
    assert ChannelAdapter.objects.get().host_name == "<img/src=x/onerror=alert(2)>"
    for url in ["/", "/fabric/", "/fabric/hostile/", "/fabric/hostile/links/", "/fabric/hostile/adapters/",
                f"/fabric/hostile/switches/{LAB_SX6036}/"]:
        page = text(client.get(url))
        assert "<script>alert" not in page and "<img/src" not in page, url
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text(client.get("/fabric/hostile/"))
    assert "&lt;img/src=x/onerror=alert(2)&gt; HCA-1" in text(client.get("/fabric/hostile/adapters/"))


BIG = "ibnetdiscover_nvidia_selene_storage_160sw_1247ca_hdr_edr.txt"


@pytest.fixture
def big(sample):
    return import_file(sample(BIG), "storage", source_name=BIG).fabric


PAGE_QUERIES = 12  # session, user, role, plus the page's own grouped queries


@pytest.mark.parametrize("path", ["/", "/fabric/", "/fabric/{f}/", "/fabric/{f}/?tier=leaf&page=2", "/fabric/{f}/links/",
                                  "/fabric/{f}/links/?state=up&page=3", "/fabric/{f}/adapters/?page=2", "/fabric/{f}/switches/{sw}/"])
def test_pages_use_a_bounded_number_of_queries(client, viewer, lab, big, path, django_assert_max_num_queries):
    """Selene's storage fabric (160 switches, 1247 adapters, 2k links) costs no more
    queries than the lab's 2 switches: no query per row."""
    for fabric in (lab, big):
        switch = Switch.objects.filter(fabric=fabric).order_by("-num_ports", "guid").first()
        url = path.format(f=fabric.name, sw=switch.guid)
        # The overview also embeds its live view's snapshot and the utilization history.
        with django_assert_max_num_queries(PAGE_QUERIES + (1 if path == "/" else 0)):
            response = client.get(url)
        assert response.status_code == 200, url


def test_big_lists_are_paginated(client, viewer, big):
    links = Link.objects.filter(fabric=big).count()
    page = text(client.get("/fabric/storage/links/"))
    assert len(table_rows(page)) == 100
    assert f"page 1 of {(links + 99) // 100} ({links} in all)" in page
    last = text(client.get(f"/fabric/storage/links/?page={(links + 99) // 100}"))
    assert len(table_rows(last)) == (links % 100 or 100)
    second = text(client.get("/fabric/storage/links/?state=up&page=2"))
    assert 'href="?state=up&amp;page=3"' in second


def test_plotly_is_served_by_the_project_not_a_cdn():
    found = finders.find("vendor/plotly.min.js")
    assert found and Path(found).stat().st_size > 1_000_000
    assert static("vendor/plotly.min.js") == "/static/vendor/plotly.min.js"
    for template in TEMPLATES.rglob("*.html"):
        source = template.read_text()
        assert not re.search(r'(src|href)="(https?:)?//', source), f"{template} loads something from another site"


def asgi_get(path: str) -> tuple[int, bytes]:
    """GET through the project's ASGI app, static handler included, as a browser would."""
    from asgiref.testing import ApplicationCommunicator

    from config.asgi import application

    async def get():
        scope = {"type": "http", "http_version": "1.1", "method": "GET", "path": path, "raw_path": path.encode(),
                 "query_string": b"", "root_path": "", "scheme": "http", "headers": [(b"host", b"localhost")],
                 "client": ("127.0.0.1", 50000), "server": ("localhost", 80)}
        communicator = ApplicationCommunicator(application, scope)
        await communicator.send_input({"type": "http.request", "body": b""})
        start = await communicator.receive_output(30)
        body = b""
        while True:
            chunk = await communicator.receive_output(30)
            body += chunk.get("body", b"")
            if not chunk.get("more_body"):
                break
        await communicator.wait(30)
        return start["status"], body

    return async_to_sync(get)()


def test_asgi_app_serves_plotly_and_the_stylesheet():
    status, body = asgi_get("/static/vendor/plotly.min.js")
    assert status == 200
    assert len(body) > 1_000_000 and b"plotly" in body[:5000].lower()
    assert asgi_get("/static/css/fabricpool.css")[0] == 200
    assert asgi_get("/static/js/live.js")[0] == 200
    assert asgi_get("/static/vendor/nothing.js")[0] == 404


def test_charts_block_loads_the_local_plotly():
    from django.template import Context, Template

    rendered = Template("{% include 'includes/plotly.html' %}").render(Context({}))
    assert '<script src="/static/vendor/plotly.min.js" defer></script>' in rendered


def test_base_page_shows_user_role_logout_and_live_indicator(client, viewer, lab):
    page = text(client.get("/fabric/"))
    assert "vera" in page and '<span class="role" title="role">viewer</span>' in page
    assert re.search(r'<form method="post" action="/logout/"><input type="hidden" name="csrfmiddlewaretoken"', page)
    assert 'id="live-status"' in page and "/static/js/live.js" in page
    assert '<a href="/fabric/" aria-current="page">Fabric</a>' in page
    assert "/admin/" not in page  # viewers are not staff
    assert 'datetime="' in page  # last import time, localized by time.js


def test_collectstatic_copies_plotly_from_the_package(tmp_path, settings):
    from io import StringIO

    from django.core.management import call_command

    settings.STATIC_ROOT = tmp_path
    call_command("collectstatic", interactive=False, verbosity=0, stdout=StringIO())
    copied = tmp_path / "vendor" / "plotly.min.js"
    assert copied.stat().st_size == Path(finders.find("vendor/plotly.min.js")).stat().st_size
    assert (tmp_path / "js" / "live.js").exists() and (tmp_path / "css" / "fabricpool.css").exists()


def test_a_fabric_name_that_is_not_a_slug_is_refused(client, viewer, sample):
    # Names appear in URLs and Slurm files: the importer refuses one with a space.
    from fabric.models import FabricNameError

    with pytest.raises(FabricNameError):
        import_file(sample(LAB), "hall B", source_name=LAB)
    assert client.get("/fabric/hall%20B/").status_code == 404


@pytest.mark.parametrize("text_in, stored", [
    ("0x2c903007b78b0", "0002c903007b78b0"), (" 0X0002C903007B78B0 ", "0002c903007b78b0"),
    ("b8:59:9f:03:00:fc:6d:e4", "b8599f0300fc6de4"), ("0x", None), ("12345678901234567", None), ("ufm", None), ("", None),
])
def test_guid_spellings(text_in, stored):
    from fabric.models import normalize_guid

    assert normalize_guid(text_in) == stored
