"""A run short enough for a CPU (README.md, "Quickstart", has the times): the small CNN,
few Langevin steps, a few hundred steps.

patjax-train --config=quickstart --workdir=runs/quickstart
"""

from patjax.run.config import default_config


def get_config():
    cfg = default_config()
    cfg.dataset = "cifar10"
    cfg.model = "small_cnn"
    cfg.method = "pat"
    cfg.batch_size = 128
    cfg.num_train_steps = 200
    cfg.learning_rate = 0.05
    cfg.langevin.steps = 5
    cfg.checkpoint_every_steps = 100
    cfg.log_every_steps = 50
    # A smoke test of the evaluation: clean, PGD-20 and the Table-1 PR (uniform noise, N = 100)
    # on 500 test images; `python -m patjax.evaluate --full` runs everything on all 10,000.
    cfg.eval.num_examples = 500
    cfg.eval.batch_size = 250
    cfg.eval.evaluators = ("clean", "pgd20", "pr")
    cfg.eval.pr.distributions = ("uniform",)
    return cfg
