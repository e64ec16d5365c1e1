"""The shipped config files: `get_config()` modules that `--config` names by file path
(`--config=configs/quickstart.py` in a checkout) or, installed or not, by name
(`--config=quickstart`, `patjax-train --config=pat_cifar10`); and `load_file`, the one reader
of a config file that `--config` names, read defensively."""

from __future__ import annotations

import difflib
import importlib.machinery
import importlib.util
import os

import ml_collections

from patjax.core.errors import UserError, one_line
from patjax.run.config import default_config

NAMES = ("quickstart", "pat_cifar10", "pat_cifar100", "pgd_atpr_cifar10")
FOLDER = os.path.dirname(os.path.abspath(__file__))


def path(name: str) -> str:
    """The file of the shipped config `name` (one of `NAMES`)."""
    return os.path.join(FOLDER, f"{name}.py")


def load_file(value: str) -> ml_collections.ConfigDict:
    """The config of a config file as `--config` names it: PATH, or PATH:ARG for get_config(ARG),
    as ml_collections' config flags read it. A file that is missing or does not load, a
    get_config() that is missing or raises, one that returns anything but a ConfigDict or a
    ConfigDict without every field of `default_config()`: one line naming the file and what is
    wrong, before any field is read. The user's code may raise anything, hence `Exception`."""
    path, *args = value.split(":", 1)
    where = f"config file {path}"
    if not os.path.isfile(path):
        # A name that is no file is most often a shipped config's, mistyped: the names are listed.
        close = difflib.get_close_matches(os.path.basename(path).removesuffix(".py"), NAMES, n=1)
        hint = f"did you mean {close[0]}? " if close else ""
        raise UserError(
            f"{where}: {'is a folder, not a file' if os.path.isdir(path) else 'no such file'}; {hint}--config takes "
            f"a config file or a shipped config's name: {', '.join(NAMES)}"
        )
    loader = importlib.machinery.SourceFileLoader("patjax_config_file", path)
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
    try:
        loader.exec_module(module)
    except Exception as error:
        raise UserError(f"{where} does not load ({type(error).__name__}: {one_line(error)[:160]})") from None
    get_config = getattr(module, "get_config", None)
    if not callable(get_config):
        raise UserError(f"{where} defines no get_config()")
    try:
        cfg = get_config(*args)
    except Exception as error:
        raise UserError(f"{where}: get_config() raised {type(error).__name__}: {one_line(error)[:160]}") from None
    start = "start it from patjax.run.config.default_config()"
    if not isinstance(cfg, ml_collections.ConfigDict):
        kind = type(cfg).__name__
        raise UserError(f"{where}: get_config() returned a {kind}, not an ml_collections.ConfigDict; {start}")
    missing = sorted(_field_paths(default_config().to_dict()) - _field_paths(cfg.to_dict()))
    if missing:
        shown = ", ".join(missing[:6]) + (f" and {len(missing) - 6} more" if len(missing) > 6 else "")
        raise UserError(f"{where}: get_config()'s config lacks the field{'s' * (len(missing) > 1)} {shown}; {start}")
    return cfg


def _field_paths(d: dict, prefix: str = "") -> set:
    """The dotted names of a config dict's fields, blocks opened (`eval.seed`)."""
    out = set()
    for k, v in d.items():
        out |= _field_paths(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}"}
    return out
