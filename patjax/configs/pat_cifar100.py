"""PAT on CIFAR-100 with the paper's settings (Appendix E): ResNet-18, T = 100, 100 epochs."""

from patjax.run.config import default_config


def get_config():
    cfg = default_config()
    cfg.dataset = "cifar100"
    cfg.model = "resnet18"
    cfg.method = "pat"
    return cfg
