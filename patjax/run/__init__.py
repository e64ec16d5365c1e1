"""Layer 8, one run: its settings, train state, checkpoints and files, its training and its evaluation.
Imports `reporting`, `evaluators`, `methods`, `pat`, `attacks`, `models`, `data` and `core`."""
