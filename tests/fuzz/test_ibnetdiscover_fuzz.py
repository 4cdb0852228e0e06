"""ibnetdiscover files, broken every way hypothesis can think of: the parser returns a
topology or raises TopologyError (with a line number and a message), nothing else; a
refused file changes nothing in the database, and a file the parser accepts imports
without error, into a fresh fabric and over an existing one (a re-import is a diff)."""
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fabric import ibnetdiscover as ibd
from fabric.importer import import_file
from fabric.models import ChannelAdapter, Fabric, FabricEvent, Link, Port, Switch
from tests.conftest import read_sample

from .strategies import FUZZ, FUZZ_DB, mutated

SAMPLES = ["ibnetdiscover_ibm_2ca_1sw_sdr.txt", "ibnetdiscover_manpage_voltaire_sdr.txt",
           "ibnetdiscover_nvidia_article_edr_fdr_loopbacks.txt", "ibnetdiscover_oracle_sun_dcs36_qdr.txt"]
TEXTS = {name: read_sample(name) for name in SAMPLES}
ANY_SAMPLE = st.sampled_from(SAMPLES).flatmap(lambda name: mutated(TEXTS[name], max_ops=5))
INPUTS = st.one_of(st.binary(max_size=2000), st.text(max_size=2000).map(str.encode), ANY_SAMPLE, ANY_SAMPLE)


def parse_or_refuse(data: bytes):
    """The topology, or None when refused the defined way."""
    try:
        return ibd.parse(data)
    except ibd.TopologyError as exc:
        assert exc.message and isinstance(exc.line, int) and exc.line >= 0
        assert str(exc).startswith(f"line {exc.line}: ") or exc.line == 0
        return None


@FUZZ
@given(INPUTS)
def test_the_parser_returns_a_topology_or_a_topology_error(data):
    topo = parse_or_refuse(data)
    if topo is not None:  # a file without a single node record is refused, not returned empty
        assert topo.nodes


def counts():
    return [model.objects.count() for model in (Fabric, Switch, ChannelAdapter, Port, Link, FabricEvent)]


@pytest.mark.django_db
@FUZZ_DB
@given(data=ANY_SAMPLE, over_existing=st.booleans())
def test_import_takes_what_parses_and_changes_nothing_when_refused(data, over_existing):
    fabric = "fuzz-base" if over_existing else f"fuzz-{Fabric.objects.count()}"
    if over_existing and not Fabric.objects.filter(name=fabric).exists():
        import_file(TEXTS[SAMPLES[1]], fabric)
    before = counts()
    try:
        result = import_file(data, fabric)
    except ibd.TopologyError:
        assert counts() == before  # refused before the database was touched
        return
    assert result.fabric.name == fabric
    assert Switch.objects.filter(fabric=result.fabric).count() + ChannelAdapter.objects.filter(fabric=result.fabric).count() > 0
