"""The shipped config patjax/configs/pgd_atpr_cifar10.py under the path the checkout's commands name:
python main.py --config=configs/pgd_atpr_cifar10.py (installed: patjax-train --config=pgd_atpr_cifar10)."""

from patjax.configs.pgd_atpr_cifar10 import get_config  # noqa: F401
