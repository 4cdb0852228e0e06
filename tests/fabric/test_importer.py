"""Importing topologies into the database: first import, unchanged re-import, diffs,
dangling links, and refusal of bad files without changing anything."""
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from fabric.importer import import_file
from fabric.models import ChannelAdapter, Fabric, FabricEvent, Link, Port, Switch
from fabric.summary import fabric_summary
from tests.conftest import read_sample
from tests.fabric.test_parser import TINY

pytestmark = pytest.mark.django_db
LAB = "ibnetdiscover_nvidia_ufm_lab_hdr_fdr_edr_sharp.txt"
ROOT = Path(__file__).resolve().parents[2]


def lab_text():
    return read_sample(LAB).decode()


def snapshot():
    """Everything an import may change, minus the last_seen timestamps."""
    return (
        sorted(Switch.objects.values_list("guid", "description", "lid", "tier", "present")),
        sorted(ChannelAdapter.objects.values_list("guid", "description", "host_name", "present")),
        sorted(Port.objects.values_list("guid", "number", "lid", "state")),
        sorted(Link.objects.values_list("key", "kind", "width", "speed", "gbps", "state")),
        FabricEvent.objects.count(),
    )


def test_first_import_creates_the_fabric_with_one_event():
    result = import_file(read_sample(LAB), "lab")
    assert result.first_import
    assert (result.switches, result.adapters, result.links) == (2, 13, 16)
    assert Switch.objects.count() == 2 and ChannelAdapter.objects.count() == 13 and Link.objects.count() == 16
    assert Port.objects.filter(switch__isnull=False).count() == 16 + 3  # 13 CA links + 1 ISL + 2 loopback cables use 19 switch ports
    assert list(FabricEvent.objects.values_list("message", flat=True)) == ["first import: 2 switches, 13 adapters, 16 links"]
    assert "first import" in result.summary()


def test_same_file_twice_changes_nothing():
    import_file(read_sample(LAB), "lab")
    before = snapshot()
    result = import_file(read_sample(LAB), "lab")
    assert not result.changed
    assert result.summary().endswith("no changes")
    assert snapshot() == before


def test_newer_file_is_a_diff_and_every_change_is_an_event():
    import_file(read_sample(LAB), "lab")
    text = lab_text()
    # 1. a cable pulled: r-dmz-ufm128 HCA-1 <-> sw226[3] disappears from both blocks
    text = "\n".join(line for line in text.split("\n") if "(e41d2d03005cf34c)" not in line or line.startswith("Ca"))
    # 2. a speed change: r-dcs96 HCA-1 <-> sw95[23] now runs HDR at both ends
    text = text.replace('# "r-dcs96 HCA-1" lid 9 4xEDR', '# "r-dcs96 HCA-1" lid 9 4xHDR')
    text = text.replace('# lid 9 lmc 0 "MF0;r-ufm-sw95:MQM8700/U1" lid 13 4xEDR', '# lid 9 lmc 0 "MF0;r-ufm-sw95:MQM8700/U1" lid 13 4xHDR')
    # 3. a LID change of an adapter port: r-dcs96 HCA-2 moves from LID 28 to 30
    text = text.replace("# lid 28 lmc 0", "# lid 30 lmc 0").replace('"r-dcs96 HCA-2" lid 28', '"r-dcs96 HCA-2" lid 30')
    result = import_file(text.encode(), "lab")

    assert dict(result.changes) == {"link_missing": 1, "link_changed": 1, "adapter_changed": 1}
    events = {e.kind: e for e in FabricEvent.objects.exclude(message__startswith="first import")}
    assert set(events) == {"link_missing", "link_changed", "adapter_changed"}
    assert "MF0;r-ufm-sw226:SX6036/U1[3] ↔ r-dmz-ufm128 HCA-1[1]" in events["link_missing"].message
    assert "4xEDR → 4xHDR" in events["link_changed"].message
    assert "LID 28 → 30" in events["adapter_changed"].message
    missing = Link.objects.get(state=Link.State.MISSING)
    assert missing.events.get().kind == "link_missing"  # nothing deleted: the row keeps its history
    assert Link.objects.get(pk=events["link_changed"].link_id).gbps == 200.0
    summary = fabric_summary(Fabric.objects.get(name="lab"))
    assert summary["links"]["missing"] == 1 and summary["links"]["adapter_switch"] == 12

    # The cable comes back.
    result = import_file(read_sample(LAB), "lab")
    assert result.changes["link_returned"] == 1
    assert not Link.objects.filter(state=Link.State.MISSING).exists()


def test_new_and_vanished_nodes():
    import_file(read_sample(LAB), "lab")
    text = lab_text()
    block_start = text.index("vendid=0x2c9\ndevid=0x1017\nsysimgguid=0xec0d9a03007d7d0a\ncaguid=0xec0d9a03007d7d0b")
    block_end = text.index("\n\n", block_start)
    without_ca = text[:block_start] + text[block_end + 2 :]
    without_ca = "\n".join(line for line in without_ca.split("\n") if "(ec0d9a03007d7d0b)" not in line)
    result = import_file(without_ca.encode(), "lab")
    assert dict(result.changes) == {"adapter_missing": 1, "link_missing": 1}
    gone = ChannelAdapter.objects.get(guid="ec0d9a03007d7d0b")
    assert not gone.present
    result = import_file(read_sample(LAB), "lab")
    assert dict(result.changes) == {"adapter_returned": 1, "link_returned": 1}
    assert ChannelAdapter.objects.get(guid="ec0d9a03007d7d0b").present


def test_dangling_link_is_imported_and_named_in_a_warning():
    result = import_file(TINY, "tiny")
    assert len(result.warnings) == 1
    dangling = Link.objects.get(kind=Link.Kind.DANGLING)
    assert dangling.port_b is None
    assert (dangling.remote_guid, dangling.remote_port, dangling.remote_description) == ("0000000000200001", 1, "spine01")
    assert FabricEvent.objects.filter(kind="import_warning", message__contains="dangling").count() == 1
    assert fabric_summary(Fabric.objects.get(name="tiny"))["links"]["dangling"] == 1


def test_sharp_aggregation_nodes_are_adapters_not_hosts():
    import_file(read_sample(LAB), "lab")
    summary = fabric_summary(Fabric.objects.get(name="lab"))
    assert (summary["adapters"], summary["aggregation_nodes"], summary["hosts"]) == (13, 1, 5)
    sw226 = next(leaf for leaf in summary["leaves"] if leaf["name"] == "MF0;r-ufm-sw226:SX6036/U1")
    assert sw226["adapters"] == 10 and sw226["downlink_gbps"] == 545.6  # 10 x 4xFDR (4 x 13.64)
    assert summary["links"]["loopback"] == 2 and summary["links"]["switch_switch"] == 1


def test_bad_file_changes_nothing():
    import_file(read_sample(LAB), "lab")
    before = snapshot()
    broken = read_sample(LAB)[:3000] + b"\n[7]\t\"S-zz"
    with pytest.raises(CommandError) as info:
        _import_bytes(broken)
    assert "line" in str(info.value) and "nothing was imported" in str(info.value)
    assert snapshot() == before


def _import_bytes(data, tmp=Path("/tmp")):
    path = tmp / "fabricpool-test-broken.txt"
    path.write_bytes(data)
    try:
        call_command("import_ibnetdiscover", str(path), "--fabric", "lab")
    finally:
        path.unlink()


def test_command_prints_the_diff_summary(tmp_path, capsys):
    path = tmp_path / "lab.txt"
    path.write_bytes(read_sample(LAB))
    call_command("import_ibnetdiscover", str(path), "--fabric", "lab")
    path.write_text(lab_text().replace('# "r-dcs96 HCA-1" lid 9 4xEDR', '# "r-dcs96 HCA-1" lid 9 1xEDR'))
    call_command("import_ibnetdiscover", str(path), "--fabric", "lab")
    out = capsys.readouterr().out
    assert "fabric lab: 2 switches, 13 adapters, 16 links (first import)" in out
    assert "1 links changed" in out and "4xEDR → 1xEDR" in out


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(CommandError, match="no such file"):
        call_command("import_ibnetdiscover", str(tmp_path / "nope.txt"))


def test_100_mb_garbage_file_is_refused_without_traceback(tmp_path):
    garbage = tmp_path / "garbage.bin"
    with open(garbage, "wb") as fh:
        block = bytes(range(256)) * 4096  # 1 MiB of every byte value
        for _ in range(100):
            fh.write(block)
    proc = subprocess.run(
        [sys.executable, "manage.py", "import_ibnetdiscover", str(garbage), "--fabric", "junk"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert "binary data" in proc.stderr and "nothing was imported" in proc.stderr


def test_fabric_name_must_be_url_safe(tmp_path):
    path = tmp_path / "lab.txt"
    path.write_bytes(read_sample(LAB))
    with pytest.raises(CommandError, match="fabric name 'hall B' must be"):
        call_command("import_ibnetdiscover", str(path), "--fabric", "hall B")
    assert not Fabric.objects.exists()
