"""The shipped config patjax/configs/pat_cifar10.py under the path the checkout's commands name:
python main.py --config=configs/pat_cifar10.py (installed: patjax-train --config=pat_cifar10)."""

from patjax.configs.pat_cifar10 import get_config  # noqa: F401
