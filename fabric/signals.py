"""Signals other apps listen to (fabric imports nothing from them)."""
from django.dispatch import Signal

# Sent after an import's transaction commits, with `fabric` (Fabric) and `result`
# (importer.ImportResult). The pool registers newly discovered hosts on it.
topology_imported = Signal()
