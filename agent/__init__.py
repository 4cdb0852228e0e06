"""The FabricPool host agent: runs on every GPU host, no Django. See docs/agent-protocol.md."""

__version__ = "0.1.0"
