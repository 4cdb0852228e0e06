"""The FabricPool command-line client (fabricpool.cli). Standard library only."""
