"""Layer 9, other tools' models: a network's weights as a PyTorch state_dict and back, RobustBench's zoo.
Imports `run`, `reporting`, `evaluators`, `methods`, `pat`, `attacks`, `models`, `data` and `core`."""
