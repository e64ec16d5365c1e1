"""PAT on CIFAR-10 with the paper's settings (Appendix E): ResNet-18, T = 100, 100 epochs.

patjax-train --config=pat_cifar10 --workdir=runs/pat_c10
patjax-train --config=pat_cifar10 --config.model=wrn50_2 --workdir=runs/pat_c10_wrn
"""

from patjax.run.config import default_config


def get_config():
    cfg = default_config()
    cfg.dataset = "cifar10"
    cfg.model = "resnet18"
    cfg.method = "pat"
    return cfg
