"""Serve plotly.js from the installed plotly package as static/vendor/plotly.min.js.

GPU datacenters are often air-gapped, so no page may load a script from a CDN; and the
4+ MB bundle is not committed. This finder makes `{% static 'vendor/plotly.min.js' %}`
work in development, under the ASGI static handler, in tests and with collectstatic.
"""
import importlib.util
from pathlib import Path

from django.contrib.staticfiles.finders import BaseFinder
from django.core.checks import Error
from django.core.files.storage import FileSystemStorage

PLOTLY_STATIC_PATH = "vendor/plotly.min.js"
_PREFIX, _NAME = PLOTLY_STATIC_PATH.rsplit("/", 1)


def plotly_js_path() -> Path | None:
    """The bundle shipped in plotly's package_data, found without importing plotly."""
    spec = importlib.util.find_spec("plotly")
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / "package_data" / _NAME
    return path if path.is_file() else None


class PlotlyFinder(BaseFinder):
    def check(self, **kwargs):
        if plotly_js_path() is None:
            return [
                Error(
                    "plotly.min.js was not found in the installed plotly package",
                    hint="Install the project's dependencies (pip install -e .): plotly ships the bundle.",
                    id="core.E001",
                )
            ]
        return []

    def find(self, path, find_all=False, **kwargs):
        found = plotly_js_path() if path == PLOTLY_STATIC_PATH else None
        if found is None:
            return []  # what Django's own finders answer for "not here"
        return [str(found)] if find_all else str(found)

    def list(self, ignore_patterns):
        found = plotly_js_path()
        if found is None:
            return
        storage = FileSystemStorage(location=found.parent)
        storage.prefix = _PREFIX  # collectstatic writes it under vendor/
        yield _NAME, storage
