"""Layer 4, one run: its settings, train state, checkpoints and files, its training and its evaluation.
Imports `reporting`, `evaluators`, `compute` and `core`."""
