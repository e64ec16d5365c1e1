"""Layer 3, tables and figures from results dicts; nothing here reads a workdir or computes a figure.
Imports `evaluators`, `compute` and `core`."""
