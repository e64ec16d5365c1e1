"""The shipped config files: `get_config()` modules that `--config` names by file path
(`--config=configs/quickstart.py` in a checkout) or, installed or not, by name
(`--config=quickstart`, `patjax-train --config=pat_cifar10`)."""

from __future__ import annotations

import os

NAMES = ("quickstart", "pat_cifar10", "pat_cifar100")
FOLDER = os.path.dirname(os.path.abspath(__file__))


def path(name: str) -> str:
    """The file of the shipped config `name` (one of `NAMES`)."""
    return os.path.join(FOLDER, f"{name}.py")
