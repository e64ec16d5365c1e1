"""Layer 9, other tools' models: PyTorch state_dicts and back, RobustBench's zoo, and models from any source compared.
Imports `run`, `reporting`, `evaluators`, `methods`, `pat`, `attacks`, `models`, `data` and `core`."""
