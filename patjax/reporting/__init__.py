"""Layer 7, tables and figures from results dicts; nothing here reads a workdir or computes a figure.
Imports `evaluators`, `methods`, `pat`, `attacks`, `models`, `data` and `core`."""
