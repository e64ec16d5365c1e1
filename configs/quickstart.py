"""The shipped config patjax/configs/quickstart.py under the path the checkout's commands name:
python main.py --config=configs/quickstart.py (installed: patjax-train --config=quickstart)."""

from patjax.configs.quickstart import get_config  # noqa: F401
