"""Slurm topology.conf export and hostlist expressions."""
import pytest
from django.core.management import CommandError, call_command

from fabric.hostlist import compress, expand
from fabric.importer import import_file
from tests.conftest import read_sample

TOPOGRAPH = "ibnetdiscover_nvidia_topograph_dgx_h100_ndr_40sw_582ca_railopt.txt"


@pytest.mark.parametrize(
    "names, expression",
    [
        (["gpu001", "gpu002", "gpu003", "gpu005"], "gpu[001-003,005]"),
        (["node9", "node10", "node11"], "node[9-11]"),
        (["login", "gpu01"], "gpu01,login"),
        (["a1-c01", "a1-c02", "a2-c01"], "a1-c[01-02],a2-c01"),
    ],
)
def test_hostlist_compress_and_expand(names, expression):
    assert compress(names) == expression
    assert sorted(expand(expression)) == sorted(names)


def parse_conf(text):
    entries = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        fields = dict(item.split("=", 1) for item in line.split())
        name = fields.pop("SwitchName", None) or fields.pop("BlockName")
        entries[name] = {k: expand(v) for k, v in fields.items()}
    return entries


@pytest.mark.django_db
def test_tree_lists_every_leaf_with_its_hosts_and_every_spine_with_its_leaves(capsys):
    import_file(read_sample(TOPOGRAPH), "h100")
    call_command("export_slurm_topology", "--fabric", "h100")
    conf = parse_conf(capsys.readouterr().out)
    leaves = {k: v for k, v in conf.items() if "Nodes" in v}
    spines = {k: v for k, v in conf.items() if "Switches" in v}
    assert len(leaves) == 31 and len(spines) == 9
    assert all("IBLEAF" in name for name in leaves) and all("IBSPINE" in name for name in spines)
    assert set(leaves["A09-P1-IBLEAF-01-03"]["Nodes"]) == {f"a07-p1-dgx-03-c{i:02d}" for i in range(1, 19)}
    every_leaf = {leaf for spine in spines.values() for leaf in spine["Switches"]}
    assert every_leaf == set(leaves)


@pytest.mark.django_db
def test_block_groups_rail_leaves_into_one_block_per_scalable_unit(tmp_path):
    import_file(read_sample(TOPOGRAPH), "h100")
    out = tmp_path / "topology.conf"
    call_command("export_slurm_topology", "--fabric", "h100", "--format", "block", "--output", str(out))
    conf = parse_conf(out.read_text())
    hosts = [h for block in conf.values() for h in block["Nodes"]]
    assert len(hosts) == len(set(hosts)), "a host belongs to exactly one block"
    assert len(set(hosts)) == 122 - 0  # every host of the fabric
    assert any(set(block["Nodes"]) == {f"a07-p1-dgx-03-c{i:02d}" for i in range(1, 19)} for block in conf.values())


@pytest.mark.django_db
def test_unknown_fabric_is_a_clear_error():
    with pytest.raises(CommandError, match="no fabric named 'nope'"):
        call_command("export_slurm_topology", "--fabric", "nope")
