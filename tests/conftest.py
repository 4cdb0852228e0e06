import gzip
from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data"


def read_sample(name: str) -> bytes:
    """Bytes of a sample under tests/data (gzipped samples are unpacked)."""
    path = DATA / name
    if path.suffix == ".gz":
        return gzip.open(path).read()
    return path.read_bytes()


@pytest.fixture
def sample():
    return read_sample
