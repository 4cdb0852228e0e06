"""Benchmarks that print JSON (run as `python -m bench.<name>`)."""
