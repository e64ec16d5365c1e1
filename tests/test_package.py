"""What a non-editable install ships: the console commands pyproject.toml declares resolve to the
command-line functions of the modules the README runs with `python -m`, the shipped configs are
package data that load and that `--config` can name, and the root configs/ files are the same
configs. No wheel is built here (that takes minutes and the package index): this checks what
the wheel is made from."""

import importlib
import os
import subprocess
import sys

import pytest
import setuptools
from conftest import REPO

from patjax import configs
from patjax import main as main_lib
from patjax.run import config

# tomllib from Python 3.11; before, pytest itself depends on tomli, the same parser.
tomllib = importlib.import_module("tomllib" if sys.version_info >= (3, 11) else "tomli")
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
# Each console command and the `python -m` module it stands for (README, "Commands").
COMMANDS = {
    "patjax-train": "patjax.main",
    "patjax-evaluate": "patjax.evaluate",
    "patjax-experiments": "patjax.experiments",
    "patjax-diagnose": "patjax.diagnose",
    "patjax-export": "patjax.export",
}


def test_every_console_command_is_declared_and_resolves_to_its_modules_cli():
    scripts = PYPROJECT["project"]["scripts"]
    assert scripts == {name: f"{module}:cli" for name, module in COMMANDS.items()}
    for target in scripts.values():
        module, attribute = target.split(":")
        assert callable(getattr(importlib.import_module(module), attribute)), target


def test_the_package_with_its_configs_is_what_setuptools_finds():
    include = PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]
    found = setuptools.find_packages(str(REPO), include=include)
    assert {"patjax", "patjax.configs", "patjax.evaluators"} <= set(found)
    shipped = sorted(
        f[:-3] for f in os.listdir(REPO / "patjax" / "configs") if f.endswith(".py") and f != "__init__.py"
    )
    assert sorted(configs.NAMES) == shipped


@pytest.mark.parametrize("name", configs.NAMES)
def test_each_shipped_config_loads_and_the_checkout_file_is_the_same_config(name):
    shipped = importlib.import_module(f"patjax.configs.{name}").get_config()
    config.train_settings(shipped)  # a valid config: every field checked
    spec = importlib.util.spec_from_file_location(f"root_{name}", REPO / "configs" / f"{name}.py")
    root = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(root)
    assert root.get_config().to_dict() == shipped.to_dict()
    assert os.path.isfile(configs.path(name))


def test_config_names_a_shipped_config_unless_a_file_of_that_name_exists(tmp_path, monkeypatch):
    quickstart = str(REPO / "patjax" / "configs" / "quickstart.py")
    assert main_lib.shipped_config(["x", "--config=quickstart", "--workdir=w"]) == [
        "x",
        f"--config={quickstart}",
        "--workdir=w",
    ]
    assert main_lib.shipped_config(["x", "--config", "quickstart"]) == ["x", "--config", quickstart]
    unchanged = ["x", "--config=configs/quickstart.py", "--config.num_train_steps=3", "--workdir=quickstart"]
    assert main_lib.shipped_config(unchanged) == unchanged
    monkeypatch.chdir(tmp_path)
    (tmp_path / "quickstart").write_text("")
    assert main_lib.shipped_config(["x", "--config=quickstart"]) == ["x", "--config=quickstart"]


def test_a_workdir_named_like_a_shipped_config_leaves_the_name_to_the_config(tmp_path, monkeypatch):
    """`--config=quickstart --workdir=quickstart` run a second time, to resume: the folder the
    first run made does not stand for the config (ml_collections would load the folder)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "quickstart").mkdir()
    argv = ["x", "--config=quickstart", "--workdir=quickstart"]
    assert main_lib.shipped_config(argv) == ["x", f"--config={configs.path('quickstart')}", "--workdir=quickstart"]


@pytest.mark.slow
def test_the_training_command_reads_a_shipped_config_by_name(tmp_path):
    """From a folder outside the checkout: the name loads the shipped file, whose fields the
    command line then checks (a bad override fails in one line, before any training)."""
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "patjax.main",
            "--config=quickstart",
            "--config.dataset=mnist",
            f"--workdir={tmp_path}/w",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 2 and "unknown dataset 'mnist'" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr
