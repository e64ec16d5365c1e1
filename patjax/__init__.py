"""patjax: Probabilistic Adversarial Training (PAT) and probabilistic-robustness evaluation in JAX.

The names a user needs, here (docs/api.md): the objectives of the paper and its baselines as pure
functions for a training loop of one's own (`pat_loss`, `pat_wos_loss`, `pgd_at_loss`,
`trades_loss`, `mart_loss`, `alp_loss`, `clp_loss`, `atpr_loss`, `fgsm_at_loss`,
`gaussian_augmentation_loss`, `clean_loss`), the forwards they take from a Flax NNX or Linen
module (`nnx_forwards`, `nnx_logits_fn`, `linen_forwards`), the attacks and estimators as
functions of a logits function and arrays (`langevin_sample`, `pgd`, `cw_margin_loss`, `apgd`,
`pr_statistics`, `class_counts`, `certify`, `proportion_interval`); evaluate any classifier
(`evaluate_model`, the function `patjax.api.evaluate`, an NNX module included;
`evaluate_torch_checkpoint`, `evaluate_robustbench`) and print its result as the command's
tables (`evaluation_tables`), train a
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
from patjax.api import evaluate_robustbench, evaluate_torch_checkpoint, train_model
from patjax.attacks.apgd import apgd
from patjax.attacks.pgd import cw_margin_loss, pgd
from patjax.evaluators import REGISTRY as EVALUATORS
from patjax.evaluators.certify import certify
from patjax.evaluators.common import SharedSettings, ThreatModelSettings
from patjax.evaluators.intervals import proportion as proportion_interval
from patjax.evaluators.pr import PRSettings
from patjax.interop.torch_weights import export_run
from patjax.methods import REGISTRY as METHODS
from patjax.methods.atpr import AtprSettings, atpr_loss
from patjax.methods.clean import clean_loss
from patjax.methods.common import AttackSettings, MethodSettings, SamplerSettings, SnisSettings, snis_weights
from patjax.methods.fgsm import fgsm_at_loss
from patjax.methods.gaussian import gaussian_augmentation_loss
from patjax.methods.logit_pairing import alp_loss, clp_loss
from patjax.methods.mart import MartSettings, mart_loss
from patjax.methods.pat import pat_loss, pat_wos_loss
from patjax.methods.pgd import pgd_at_loss
from patjax.methods.trades import TradesSettings, trades_loss
from patjax.models.forwards import linen_forwards, nnx_forwards, nnx_logits_fn
from patjax.models.networks import MODELS
from patjax.pat.langevin import LangevinSettings, langevin_sample
from patjax.pat.robustness import class_counts, pr_statistics
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
    "AtprSettings",
    "AttackSettings",
    "EvaluationSettings",
    "LangevinSettings",
    "MartSettings",
    "MethodSettings",
    "ModelSettings",
    "OptimizerSettings",
    "PRSettings",
    "SamplerSettings",
    "SharedSettings",
    "SnisSettings",
    "ThreatModelSettings",
    "TradesSettings",
    "TrainSettings",
    "alp_loss",
    "apgd",
    "atpr_loss",
    "certify",
    "class_counts",
    "clean_loss",
    "clp_loss",
    "cw_margin_loss",
    "default_config",
    "evaluate_model",
    "evaluate_robustbench",
    "evaluate_torch_checkpoint",
    "evaluation_settings",
    "evaluation_tables",
    "export_run",
    "fgsm_at_loss",
    "gaussian_augmentation_loss",
    "langevin_sample",
    "linen_forwards",
    "mart_loss",
    "nnx_forwards",
    "nnx_logits_fn",
    "pat_loss",
    "pat_wos_loss",
    "pgd",
    "pgd_at_loss",
    "pr_statistics",
    "proportion_interval",
    "restore",
    "snis_weights",
    "trades_loss",
    "train_model",
    "train_run",
    "train_settings",
]
