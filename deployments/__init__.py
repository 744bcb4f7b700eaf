"""Flint on Ray Serve: the replica and router deployments, settings and the `flint-serve` CLI."""
