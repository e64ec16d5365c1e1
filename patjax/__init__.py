"""patjax: Probabilistic Adversarial Training (PAT) and probabilistic-robustness evaluation in JAX."""

__version__ = "0.1.0"
