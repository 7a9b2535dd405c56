"""The benchmark harness: peers, the shape grid, tables, JSON and plots. ``python -m flashtile.bench``."""
