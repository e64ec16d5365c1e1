"""patjax: Probabilistic Adversarial Training (PAT) and probabilistic-robustness evaluation in JAX.

Folders are layers, bottom up, each importing only its own folder and the ones below:
`core` (glue), `data` (the CIFAR inputs), `models` (the networks), `attacks`, `pat` (the paper's
sampler and PR), `methods` (the training objectives), `evaluators`, `reporting`, `run` (one run's
settings, state, training and evaluation), `suites`; at the top the doors: `api` and the
command lines `main`, `evaluate`, `experiments`, `diagnose`, `export`, with the shipped `configs`.
"""

__version__ = "0.1.0"
