"""A few minutes on a 2-core CPU: the small CNN, few Langevin steps, a few hundred steps.

  python main.py --config=configs/quickstart.py --workdir=runs/quickstart
"""
from patjax.config import default_config


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
    cfg.eval.num_examples = 1000
    cfg.eval.batch_size = 250
    return cfg
