"""The default configuration (paper, Appendix E) and its validation.

Config files in configs/ start from `default_config()` and override fields; every field
can also be overridden on the command line with --config.KEY=VALUE.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
from collections.abc import Mapping
from typing import Optional

import ml_collections

from patjax import evaluators as evaluators_lib
from patjax import methods
from patjax.attacks import l2
from patjax.core.errors import (
    UserError,
    UserTypeError,
    finite_numbers,
    fraction,
    python_scalars,
)
from patjax.data import cifar
from patjax.evaluators import common as evaluators_common
from patjax.methods import common as methods_common
from patjax.run import eval_settings, state
from patjax.run import optimizer as optimizer_lib
from patjax.run.settings import WHOLE_SPLIT, EvaluationSettings, TrainSettings

# Fields a resumed run may change: they change how long the run is, what it logs and where
# the data are read from (the dataset itself is `dataset`), not what a given step computes.
# The learning-rate milestones follow the run's length; a resume that would move one the run
# has passed is refused (workdir.check_resume_compatible).
RESUMABLE_FIELDS = (
    "num_epochs",
    "num_train_steps",
    "lr_decay_fractions",
    "checkpoint_every_steps",
    "log_every_steps",
    "log_test_examples",
    "max_checkpoints_to_keep",
    "progress_bar",
    "eval",
    "data_dir",
)


DEFAULT_MODEL = "resnet18"  # the paper's network (Appendix E)


def default_config() -> ml_collections.ConfigDict:
    cfg = ml_collections.ConfigDict()
    cfg.dataset = "cifar10"  # 'cifar10' | 'cifar100'
    # A directory with the official binary archives extracted; None: found or downloaded
    # (cifar.resolve_data_dir); 'tfds': tensorflow-datasets.
    cfg.data_dir = ml_collections.config_dict.placeholder(str)
    cfg.model = DEFAULT_MODEL  # a name of patjax.models.networks.MODELS: 'resnet18', 'preact_resnet18', 'wrn28_10', ...
    cfg.model_width = 64  # stem width of resnet18, preact_resnet18, wrn50_2 (64 in the paper); WRN-d-k fix theirs
    cfg.method = "pat"
    cfg.compute_dtype = "float32"

    # Appendix E: SGD, Nesterov momentum 0.9, weight decay 5e-4 coupled into the gradient as in
    # PyTorch's SGD, lr 0.01 x0.1 at epochs 75 and 90 of 100, batch 256.
    cfg.batch_size = 256
    cfg.num_epochs = 100
    cfg.num_train_steps = -1  # > 0 overrides num_epochs; -1 (optimizer_lib.USE_EPOCHS): num_epochs sets the length
    cfg.learning_rate = 0.01
    cfg.momentum = 0.9
    cfg.nesterov = True
    cfg.weight_decay = 5e-4
    # MultiStepLR milestones as fractions of the whole run: 0.75 and 0.9 of 100 epochs are
    # epochs 75 and 90; a shortened run keeps the same shape.
    cfg.lr_decay_fractions = (0.75, 0.9)
    cfg.lr_decay_factor = 0.1
    cfg.seed = 0

    # The methods' blocks: the shared ones (`langevin`, Algorithm 1 / Appendix E, and BatchNorm
    # inside it; `pat`, the SNIS weights; `attack`, the baselines' inner attack) and each registered
    # method's own. Each block is written from its settings class's
    # defaults (`methods.blocks()`), where each field's meaning and source are said, and read back
    # field by field (`block_settings`).
    for block, settings_class in methods.blocks().items():
        cfg[block] = ml_collections.ConfigDict(_defaults(settings_class))

    cfg.checkpoint_every_steps = -1  # <= 0: every epoch
    cfg.max_checkpoints_to_keep = 3
    cfg.log_every_steps = -1  # <= 0: every epoch
    # Test images each log measures clean accuracy on (the first N); <= 0: the whole test split.
    # A smoke test's run is a few steps, and 10,000 images would cost it more than its training.
    cfg.log_test_examples = -1
    cfg.progress_bar = True

    # How a run is evaluated (`python -m patjax.evaluate`; its flags override these): the test
    # images, the batch, the evaluators (names of patjax.evaluators.REGISTRY or its aliases
    # 'apgd', 'all'), the settings every evaluator shares (`evaluators.common.SharedSettings`),
    # and a block per evaluator setting class (`evaluators.blocks()`: the threat model
    # `eval.attack`, then each registered evaluator's own), each written from its class's
    # defaults, where each field's meaning and source are said.
    cfg.eval = default_eval_block()
    cfg.config_version = CONFIG_VERSION
    return cfg


def default_eval_block() -> ml_collections.ConfigDict:
    """The config's `eval` block as the settings classes' defaults write it: the images, the batch,
    the evaluators, the shared settings, then one block per evaluator settings class (`evaluators.blocks()`).
    Its paths (pr.samples) are the names of the evaluation's settings everywhere: overrides,
    the evaluate command's --eval.pr.samples."""
    ev = ml_collections.ConfigDict()
    ev.batch_size = 500
    ev.num_examples = WHOLE_SPLIT
    ev.evaluators = ("all",)
    ev.update(_defaults(evaluators_common.SharedSettings))
    for block, settings_class in evaluators_lib.blocks().items():
        ev[block] = ml_collections.ConfigDict(_defaults(settings_class))
    return ev


# The shape of the config: 2 gives each evaluator setting class its block of `eval` (eval.pr.samples);
# 1, written without the field, held them all at the top of `eval` under their flat names
# (eval.pr_samples). `upgrade` reads both.
CONFIG_VERSION = 2


def _from_version_1(saved: dict) -> dict:
    """A version-1 config in version 2's shape: each evaluator setting moved from the top of `eval`
    (its flat name) into its block (`eval_settings.FLAT_NAMES`)."""
    saved = copy.deepcopy(saved)
    ev = saved.get("eval")
    if isinstance(ev, dict):
        for name, (block, field) in eval_settings.FLAT_NAMES.items():
            if name in ev:
                ev.setdefault(block, {})[field] = ev.pop(name)
    saved["config_version"] = 2
    return saved


def upgrade(saved: dict) -> ml_collections.ConfigDict:
    """A config read from a workdir, in the current shape (`CONFIG_VERSION`) and completed with
    `default_config()`'s: a field missing from the saved config reads as its default, so every
    field's default is what runs saved without that field computed. The one place a workdir's
    config is completed."""
    version = saved.get("config_version", 1)
    if version not in (1, CONFIG_VERSION):
        raise UserError(f"config_version {version!r} is not one this patjax reads (1 or {CONFIG_VERSION})")
    if version == 1:
        saved = _from_version_1(saved)

    def merge(base: dict, over: dict) -> dict:
        return {
            **base,
            **{
                k: merge(base[k], v) if isinstance(v, dict) and isinstance(base.get(k), dict) else v
                for k, v in over.items()
            },
        }

    return ml_collections.ConfigDict(merge(default_config().to_dict(), saved))


def model_settings(cfg) -> state.ModelSettings:
    return state.ModelSettings(
        name=str(cfg.model), dataset=str(cfg.dataset), width=int(cfg.model_width), compute_dtype=str(cfg.compute_dtype)
    )


def optimizer_settings(cfg) -> optimizer_lib.OptimizerSettings:
    return optimizer_lib.OptimizerSettings(
        learning_rate=float(cfg.learning_rate),
        momentum=float(cfg.momentum),
        nesterov=bool(cfg.nesterov),
        weight_decay=float(cfg.weight_decay),
        decay_fractions=tuple(float(f) for f in cfg.lr_decay_fractions),
        decay_factor=float(cfg.lr_decay_factor),
        num_epochs=int(cfg.num_epochs),
        num_train_steps=int(cfg.num_train_steps),
    )


def _defaults(settings_class) -> dict:
    """A block's fields and their defaults, in the order of its settings class."""
    fields = dataclasses.fields(settings_class)
    missing = [f.name for f in fields if f.default is dataclasses.MISSING]
    assert not missing, f"{settings_class.__name__} has fields without a default: {missing}"
    return {f.name: f.default for f in fields}


# A field's type as its settings class declares it (a string under `from __future__ import
# annotations`) -> the Python type it is read as; an int is left to the class's `count` check.
_READ_AS = {"float": float, "bool": bool, "str": str, float: float, bool: bool, str: str}


def _from_block(settings_class, block, run: Optional[methods_common.Resolution] = None):
    """The settings of one config block: each field of the class read from the block, then
    resolved by the class where a default depends on the run (`methods.common.settings_of`)."""
    fields = {f.name: _READ_AS.get(f.type, lambda v: v)(block[f.name]) for f in dataclasses.fields(settings_class)}
    return methods_common.settings_of(settings_class, fields, run)


def resolution(cfg) -> methods_common.Resolution:
    """What the blocks of run cfg resolve their run-dependent defaults from: its network and its
    shared training blocks."""
    shared = {block: _from_block(cls, cfg[block]) for block, cls in methods_common.SHARED_BLOCKS.items()}
    return methods_common.Resolution(model=str(cfg.model), blocks=shared)


def block_settings(cfg) -> dict:
    """{block: its settings} for every block the methods read (`methods.blocks()`), whichever
    method the run trains, so that a bad field of any block is refused; each resolved by its own
    class where a default depends on the run (`resolution`)."""
    run = resolution(cfg)
    return {block: _from_block(cls, cfg[block], run) for block, cls in methods.blocks().items()}


def method_settings(cfg) -> methods.MethodSettings:
    """The settings of the method cfg.method: its own block and the shared blocks its registry
    entry reads (`block_settings`); attack.bn_mode 'auto' is the mode of its reference code."""
    entry = methods.get(str(cfg.method))
    found = block_settings(cfg)
    attack = None
    if entry.attack_bn_mode is not None:
        attack = found["attack"]
        if attack.bn_mode == "auto":
            attack = dataclasses.replace(attack, bn_mode=entry.attack_bn_mode)
        if attack.norm not in entry.attack_norms:
            able = [m.name for m in methods.REGISTRY.values() if attack.norm in m.attack_norms]
            raise UserError(
                f"{entry.name}'s inner attack has no {attack.norm} form (attack.norm={attack.norm!r}); under "
                f"{attack.norm} train {', '.join(able)}"
            )
    return methods.MethodSettings(
        name=entry.name,
        own=found[entry.settings_block] if entry.settings is not None else None,
        attack=attack,
        sampler=found["langevin"] if entry.sampler else None,
        snis=found["pat"] if entry.weighted else None,
    )


def refuse_unknown_fields(cfg: ml_collections.ConfigDict) -> None:
    """A one-line UserError for a field the config does not have (a ConfigDict takes any new
    field it is given, and no setting would read it): a typo, or a config file written for
    version 1, whose evaluator settings sat at the top of `eval` (eval.pr_samples is now
    eval.pr.samples)."""
    known = default_config()

    def walk(given, expected, prefix):
        for key in given:
            if key not in expected:
                name = f"{prefix}{key}"
                moved = eval_settings.FLAT_NAMES.get(key) if prefix == "eval." else None
                hint = f"; it is eval.{'.'.join(moved)} since config version 2" if moved else ""
                raise UserError(f"{name} is not a config field{hint}")
            if isinstance(given[key], ml_collections.ConfigDict) and isinstance(
                expected[key], ml_collections.ConfigDict
            ):
                walk(given[key], expected[key], f"{prefix}{key}.")

    walk(cfg, known, "")


def train_settings(cfg: ml_collections.ConfigDict) -> TrainSettings:
    """The typed settings of a run, or a one-line UserError for a config that would fail later
    or silently compute something else. Each field is checked by the settings it belongs to; a
    field the config does not have, by `evaluation_settings`, which reads the whole config once."""
    finite_numbers(cfg.to_dict())
    record = json.loads(cfg.to_json())
    record["data_dir"] = _absolute_data_dir(record.get("data_dir"))
    return TrainSettings(
        model=model_settings(cfg),
        optimizer=optimizer_settings(cfg),
        method=method_settings(cfg),
        data_dir=record["data_dir"],
        batch_size=cfg.batch_size,
        seed=cfg.seed,
        checkpoint_every_steps=int(cfg.checkpoint_every_steps),
        max_checkpoints_to_keep=cfg.max_checkpoints_to_keep,
        log_every_steps=int(cfg.log_every_steps),
        log_test_examples=int(cfg.log_test_examples),
        progress_bar=bool(cfg.progress_bar),
        # A run's evaluation settings are checked when it starts, not after its training.
        evaluation=evaluation_settings(cfg),
        record=record,
    )


def eval_paths(overrides: Optional[Mapping]) -> dict:
    """Overrides of the `eval` block as {path: value}: a path as given (pr.samples, seed,
    num_examples), a nested block's fields ({"pr": {"samples": 20}}) by their paths; data_dir, the
    config's own field, as it is."""
    out = {}

    def walk(given: Mapping, prefix: str) -> None:
        for key, value in given.items():
            if isinstance(value, Mapping):
                walk(value, f"{prefix}{key}.")
            else:
                out[f"{prefix}{key}"] = value

    walk(overrides or {}, "")
    return out


def read_eval_value(path: str, value, flag: str):
    """A value the command line's `flag` gives for the `eval` field `path` (ml_collections reads
    --eval.pr.epsilons=8/255,0.1 as the string tuple ('8/255,0.1',)) as its default's type: a
    tuple field's comma-separated strings split, each element of a tuple of numbers or a number
    field read as a number or a fraction (`core.errors.fraction`). Anything else as given."""
    default = default_eval_block()[path]
    numbers = isinstance(default, float) or (
        isinstance(default, tuple)
        and bool(default)
        and all(isinstance(d, (int, float)) and not isinstance(d, bool) for d in default)
    )
    try:
        if isinstance(default, tuple) and isinstance(value, (str, tuple, list)):
            parts = [value] if isinstance(value, str) else list(value)
            # ml_collections reads --eval.X=0.1 as the tuple (0.1,) of a float: only strings are split
            split = [
                p.strip() if isinstance(p, str) else p
                for part in parts
                for p in (part.split(",") if isinstance(part, str) else [part])
            ]
            return tuple(fraction(p) if numbers and isinstance(p, str) else p for p in split if p != "")
        if numbers and isinstance(value, str):
            return fraction(value)
    except UserError:
        what = "comma-separated numbers or fractions" if isinstance(default, tuple) else "a number or a fraction"
        text = ",".join(value) if isinstance(value, (tuple, list)) else value
        raise UserError(f"--{flag} takes {what}, got {text!r}") from None
    return value


def _unknown(path: str) -> UserError:
    """The refusal of an override the `eval` block does not have; a flat name (pr_samples, which
    results.json and overrides used before the blocks) is told its path."""
    moved = eval_settings.FLAT_NAMES.get(path)
    return UserError(f"unknown eval setting {path!r}" + (f"; it is {'.'.join(moved)}" if moved else ""))


def with_eval_overrides(
    cfg: ml_collections.ConfigDict, overrides: Optional[Mapping] = None
) -> ml_collections.ConfigDict:
    """A copy of cfg with fields of its `eval` block replaced, each named by its path in the block
    ({"pr.samples": 20} or {"pr": {"samples": 20}} sets eval.pr.samples; `eval_paths`), and
    data_dir; a norm given without its radius or step takes that norm's standard ones
    (`l2.with_norm_radii`); an unknown path is refused."""
    if not overrides:
        return cfg
    paths = l2.with_norm_radii(eval_paths(overrides), *EVAL_THREAT)
    cfg = copy.deepcopy(cfg)
    for path, value in paths.items():
        if path == "data_dir":  # where the test split is read from, not what is computed on it
            cfg.data_dir = value
            continue
        *blocks, field = path.split(".")
        target = cfg.eval
        for block in blocks:
            target = target.get(block)
            if not isinstance(target, ml_collections.ConfigDict):
                raise _unknown(path)
        if field not in target or isinstance(target[field], ml_collections.ConfigDict):
            raise _unknown(path)
        value = python_scalars(value)
        try:
            target[field] = value
        except TypeError:  # ConfigDict keeps each field's type: a str where an int is, say
            expected = type(target[field]).__name__
            raise UserTypeError(f"eval setting {path} must be of type {expected}, got {value!r}") from None
    return cfg


# Each threat model's (norm, radius, step) (`l2.with_norm_radii`): paths in `eval`, then config fields.
EVAL_THREAT = ("attack.norm", "attack.eps", "attack.step_size")
CONFIG_THREATS = (
    ("attack.norm", "attack.epsilon", "attack.step_size"),
    ("eval.attack.norm", "eval.attack.eps", "eval.attack.step_size"),
)


def radii_of_another_norm(cfg: ml_collections.ConfigDict, given: dict) -> dict:
    """{field: the norm's standard value} for each radius or step of a threat model (`CONFIG_THREATS`)
    whose norm the config file chose, left at another norm's standard value (a file that sets
    attack.norm = 'l2' and keeps the default 8/255): read as not given, as a norm given without
    its radius on the command line is (`l2.with_norm_radii`). A field the command line gives
    (`given`, flattened) and a norm it gives are left to that rule."""
    filled = {}
    for norm_field, *fields in CONFIG_THREATS:
        norm = cfg[norm_field]  # a ConfigDict reads a dotted name
        if norm_field in given or norm not in l2.RADII:
            continue
        for i, field in enumerate(fields):
            value = cfg[field]
            others = [radii[i] for other, radii in l2.RADII.items() if other != norm]
            if field not in given and value != l2.RADII[norm][i] and value in others:
                filled[field] = l2.RADII[norm][i]
    return filled


def evaluation_settings(
    cfg: ml_collections.ConfigDict,
    overrides: Optional[dict] = None,
    *,
    evaluators=None,
    num_examples=None,
    batch_size=None,
) -> EvaluationSettings:
    """The typed settings of an evaluation of a run with config cfg: its `eval` block with
    `overrides` replacing fields, and evaluators, num_examples and batch_size where given (the
    command line's flags). The one place the `eval` block is read; each block resolved by its own
    class where a default depends on the run (`resolution`: PR's p_dis c1 and entropic lambda)."""
    cfg = with_eval_overrides(cfg, overrides)
    refuse_unknown_fields(cfg)
    return _evaluation_of(cfg, resolution(cfg), evaluators, num_examples, batch_size)


def _evaluation_of(cfg, run: methods_common.Resolution, evaluators, num_examples, batch_size) -> EvaluationSettings:
    """The typed settings of cfg's `eval` block on its dataset and data folder, each block resolved
    from `run` where a default depends on it."""
    cifar.check_dataset(str(cfg.dataset))
    finite_numbers(cfg.eval.to_dict(), "eval.")
    ev = cfg.eval
    handed = evaluators_common.Settings(
        shared=_from_block(evaluators_common.SharedSettings, ev),
        blocks={block: _from_block(cls, ev[block], run) for block, cls in evaluators_lib.blocks().items()},
    )
    return EvaluationSettings(
        dataset=str(cfg.dataset),
        data_dir=_absolute_data_dir(cfg.data_dir),
        evaluators=evaluators_lib.parse(ev.evaluators if evaluators is None else evaluators),
        num_examples=ev.num_examples if num_examples is None else num_examples,
        batch_size=ev.batch_size if batch_size is None else batch_size,
        evaluator_settings=handed,
    )


def default_evaluation_settings(
    dataset: str, overrides: Optional[Mapping] = None, *, evaluators=None, num_examples=None, batch_size=None
) -> EvaluationSettings:
    """`evaluation_settings` of a model no run trained, on `dataset`: the `eval` block as the
    settings classes write it (`default_eval_block`) with `overrides`, the defaults that depend on
    a run resolved from the default network and the shared training blocks' classes (as
    `default_config` would write them), without building a training config."""
    cfg = ml_collections.ConfigDict(
        {"dataset": dataset, "data_dir": ml_collections.config_dict.placeholder(str), "eval": default_eval_block()}
    )
    cfg = with_eval_overrides(cfg, overrides)
    shared = {
        block: _from_block(cls, ml_collections.ConfigDict(_defaults(cls)))
        for block, cls in methods_common.SHARED_BLOCKS.items()
    }
    run = methods_common.Resolution(model=DEFAULT_MODEL, blocks=shared)
    return _evaluation_of(cfg, run, evaluators, num_examples, batch_size)


def _absolute_data_dir(data_dir: Optional[str]) -> Optional[str]:
    """Absolute, so that a command run from another directory reads the same data."""
    return os.path.abspath(data_dir) if data_dir and data_dir != cifar.TFDS else data_dir
