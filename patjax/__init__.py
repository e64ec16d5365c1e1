"""patjax: Probabilistic Adversarial Training (PAT) and probabilistic-robustness evaluation in JAX.

The names a user needs, here (docs/api.md): evaluate any classifier (`evaluate_model`, the
function `patjax.api.evaluate`; `evaluate_torch_checkpoint`, `evaluate_robustbench`) and print
its result as the command's tables (`evaluation_tables`), train a
run (`default_config`, `train_settings`, `train_run`), load a run's model (`restore`) and export
it to PyTorch (`export_run`), the typed settings the config becomes, and the registries of
methods, evaluators and networks. Everything else is reached through its folder.

Folders are layers, bottom up, each importing only its own folder and the ones below:
`core` (glue), `data` (the CIFAR inputs), `models` (the networks), `attacks`, `pat` (the paper's
sampler and PR), `methods` (the training objectives), `evaluators`, `reporting`, `run` (one run's
settings, state, training and evaluation), `interop` (PyTorch weights, RobustBench's zoo),
`suites`; at the top the doors: `api` and the command lines `main`, `evaluate`, `experiments`,
`diagnose`, `export`, with the shipped `configs`. The command lines' modules `patjax.evaluate` and
`patjax.export` are why the functions here are named `evaluate_model` and `export_run`.
"""

from patjax.api import evaluate as evaluate_model
from patjax.api import evaluate_robustbench, evaluate_torch_checkpoint
from patjax.evaluators import REGISTRY as EVALUATORS
from patjax.evaluators.common import SharedSettings, ThreatModelSettings
from patjax.evaluators.pr import PRSettings
from patjax.interop.torch_weights import export_run
from patjax.methods import REGISTRY as METHODS
from patjax.methods.common import AttackSettings, MethodSettings, SamplerSettings, SnisSettings
from patjax.models.networks import MODELS
from patjax.reporting.report import evaluation_tables
from patjax.run.config import default_config, evaluation_settings, train_settings
from patjax.run.optimizer import OptimizerSettings
from patjax.run.settings import EvaluationSettings, TrainSettings
from patjax.run.state import ModelSettings
from patjax.run.train import train_run
from patjax.run.workdir import restore

__version__ = "0.1.0"

__all__ = [
    "EVALUATORS",
    "METHODS",
    "MODELS",
    "AttackSettings",
    "EvaluationSettings",
    "MethodSettings",
    "ModelSettings",
    "OptimizerSettings",
    "PRSettings",
    "SamplerSettings",
    "SharedSettings",
    "SnisSettings",
    "ThreatModelSettings",
    "TrainSettings",
    "default_config",
    "evaluate_model",
    "evaluate_robustbench",
    "evaluate_torch_checkpoint",
    "evaluation_settings",
    "evaluation_tables",
    "export_run",
    "restore",
    "train_run",
    "train_settings",
]
