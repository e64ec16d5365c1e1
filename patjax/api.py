"""The evaluation as a library call: any classifier and any 8-bit images in, the figures of
results.json out, with no run, config file or workdir.

  results = patjax.api.evaluate(nnx_model, images, labels, evaluators="clean,pgd20,pr")
  results = patjax.api.evaluate(logits_fn, images, labels)
  results = patjax.api.evaluate((module, variables), images, labels, pr={"samples": 100})
  results = patjax.api.evaluate(module.bind(variables), images, labels)

`model` is a Flax NNX module (evaluated as `model.eval()` sets it, BatchNorm on its running
statistics, on a copy: the module passed keeps its mode; its __call__ takes the images alone), a
function from (N, H, W, C) float32 images in [0, 1] to (N, classes) logits (jax
traceable: the attacks differentiate it), or a Flax Linen module with its variables
({"params": ..., "batch_stats": ...}), as a (module, variables) pair or bound
(`module.bind(variables)`); its __call__ takes the images and, optionally, `train` (then called
with train=False: BatchNorm in inference mode). The settings are the default config's eval
settings (docs/evaluation.md) with the keyword arguments replacing fields of `config.eval`. The
results dict is `patjax.run.evaluation.evaluate_state`'s (what results.json holds) with the per-image
arrays of per_image.npz under "per_image".

`evaluate_torch_checkpoint` does the same for a PyTorch state_dict file of a network of
`patjax.models.networks` (`python -m patjax.evaluate --torch_checkpoint=FILE`) and writes eval/ files;
`evaluate_robustbench` for an entry of RobustBench's CIFAR-10 Linf zoo (`--robustbench=NAME`);
`evaluate_models` evaluates and compares the models a `Models` names, from any of these sources
and workdirs. They live below the doors, in `patjax.interop.sources`, and are named here.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any, Callable, Union

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from patjax.core.errors import UserError, UserTypeError, one_line
from patjax.data import cifar
from patjax.interop.sources import (
    MODEL_FIELDS,
    Models,
    evaluate_models,
    evaluate_robustbench,
    evaluate_torch_checkpoint,
    first_settings,
)
from patjax.models import forwards, networks
from patjax.run import config as config_lib
from patjax.run import evaluation
from patjax.run import settings as settings_lib
from patjax.run import state as state_lib
from patjax.run import train as train_lib

__all__ = [
    "MODEL_FIELDS",
    "Model",
    "Models",
    "as_model",
    "as_split",
    "check_classes",
    "evaluate",
    "evaluate_models",
    "evaluate_robustbench",
    "evaluate_torch_checkpoint",
    "first_settings",
    "train_model",
]

Model = Union[Callable[[Any], Any], tuple]


def _inputs_and_train(fn, what: str) -> bool:
    """Whether `fn` (a logits function or a module's __call__) takes `train`, read off its
    signature; a UserError if it needs anything beside the images and `train`."""
    try:
        parameters = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # no signature to read (a builtin): called with the images alone
        return False
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    if not parameters or parameters[0].kind not in (*positional, inspect.Parameter.VAR_POSITIONAL):
        raise UserError(f"{what} must take the images as its first positional argument")
    required = [
        p.name
        for p in parameters[1:]
        if p.default is p.empty and p.name != "train" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]
    if required:
        raise UserError(f"{what} must take the images alone (and optionally train=), but it requires {required}")
    return any(p.name == "train" for p in parameters[1:])


def _without_train_mode(logits):
    """An apply function for a model that has one mode: `logits(variables, x)`."""

    def apply(variables, x, train=False, mutable=None):
        if train:
            raise UserError(
                "this model has no training mode (no train= argument); evaluate with BatchNorm in inference"
            )
        return logits(variables, x)

    return apply


def as_model(model: Model):
    """(model_fns, state) for `evaluation.evaluate_state` from an NNX module
    (`forwards.nnx_model_fns`), a logits function, a Flax Linen module with its variables, or a
    bound Linen module (`module.bind(variables)`). Whether the module's
    __call__ takes `train` is read off its signature: the evaluation calls it with train=False
    (BatchNorm's running statistics) if it does, with the images alone if it does not. Variables
    that hold a NaN or an infinity are a one-line UserError (`networks.check_finite`); a logits
    function's own weights are out of reach, and only its logits are checked."""
    if isinstance(model, nnx.Module):
        # Evaluated as model.eval() sets it, on a copy: the user's module keeps its mode.
        model_fns, params, batch_stats = forwards.nnx_model_fns(model)
        networks.check_finite({"params": params, "batch_stats": batch_stats}, f"the {type(model).__name__} passed")
        return model_fns, state_lib.inference_state(params, batch_stats)
    if isinstance(model, nn.Module):
        if model.scope is None:
            raise UserError("a Flax module needs its variables: pass (module, variables) or module.bind(variables)")
        model = model.unbind()
    if isinstance(model, tuple) and len(model) == 2 and isinstance(model[0], nn.Module):
        module, variables = model
        if not isinstance(variables, Mapping) or "params" not in variables:
            raise UserError("the variables of a (module, variables) pair must be a dict holding 'params'")
        other = sorted(set(variables) - {"params", "batch_stats"})
        if other:
            raise UserError(f"the variables may hold 'params' and 'batch_stats' only, not {other}")
        params, batch_stats = variables["params"], variables.get("batch_stats", {})
        networks.check_finite({"params": params, "batch_stats": batch_stats}, "the model passed with its variables")
        if _inputs_and_train(module.__call__, f"{type(module).__name__}.__call__"):
            apply = module.apply
        else:
            apply = _without_train_mode(module.apply)
    elif callable(model) and not isinstance(model, tuple):
        takes_train = _inputs_and_train(model, "the logits function")
        params, batch_stats = {}, {}
        apply = _without_train_mode(lambda variables, x: model(x, train=False) if takes_train else model(x))
    else:
        raise UserTypeError(
            "model must be a logits function, an nnx.Module, a (linen module, variables) pair or a bound linen module"
        )
    return networks.ModelFns(apply), state_lib.inference_state(params, batch_stats)


def as_split(images, labels) -> cifar.Split:
    """The images as the evaluators read them (uint8 NHWC; they divide by 255): uint8 as they are,
    floats in [0, 1] only if they are 8-bit values (k / 255), since anything else would be
    rounded without a word; labels as int32, from integers only. A UserError names what is wrong."""
    images, labels = np.asarray(images), np.asarray(labels)
    if images.ndim and not images.shape[0]:
        # Nothing to evaluate: an images problem, whatever the model (checked after this).
        raise UserError(f"images: no images (N = 0), got shape {images.shape}; pass at least one")
    if images.ndim != 4 or labels.shape != images.shape[:1] or not len(labels):
        raise UserError(f"images must be (N, H, W, C) and labels (N,), N >= 1, got {images.shape} and {labels.shape}")
    if 0 in images.shape[1:]:  # no pixels: the model would read nothing and return NaN or fail
        raise UserError(f"images of shape {images.shape} have no pixels (height, width or channels 0)")
    if images.shape[1] in (1, 3) and images.shape[3] not in (1, 3):
        raise UserError(f"images of shape {images.shape} look channels-first (N, C, H, W); pass (N, H, W, C)")
    if images.dtype != np.uint8 and not np.issubdtype(images.dtype, np.floating):
        raise UserError(f"images must be uint8 (0-255) or floats in [0, 1], got dtype {images.dtype}")
    if images.dtype != np.uint8:
        scaled = np.asarray(images, np.float64) * 255
        if not np.all((scaled >= 0) & (scaled <= 255)):
            raise UserError(
                f"float images must lie in [0, 1], got values in [{np.nanmin(images):g}, {np.nanmax(images):g}]"
                f"{' (NaN too)' if np.isnan(scaled).any() else ''}; pass uint8 for values 0-255"
            )
        if not np.all(np.abs(scaled - np.round(scaled)) < 1e-3):
            raise UserError("float images must be 8-bit values k / 255 in [0, 1]; pass uint8 images otherwise")
        images = np.round(scaled).astype(np.uint8)
    if not np.issubdtype(labels.dtype, np.integer):
        raise UserError(f"labels must be integers (class indices), got dtype {labels.dtype}")
    if labels.min() < 0 or labels.max() > np.iinfo(np.int32).max:
        raise UserError(f"labels must be class indices >= 0, got values in [{labels.min()}, {labels.max()}]")
    return cifar.Split(images=images, labels=labels.astype(np.int32))


def _first_kernel_channels(record: list):
    """A Flax method interceptor that appends to `record` the input channels of the first
    convolution kernel (4-D, HWIO) held by a module the model calls: the channels it was built
    for, whatever the images broadcast to before it (a (3,) mean turns (N, H, W, 1) into 3)."""

    def interceptor(next_fun, args, kwargs, context):
        if not record:
            try:
                kernel = context.module.variables.get("params", {}).get("kernel")
            except Exception:  # a module without a scope (not bound): it holds no kernel yet
                kernel = None
            if getattr(kernel, "ndim", 0) == 4:
                record.append(int(kernel.shape[2]))
        return next_fun(*args, **kwargs)

    return interceptor


def check_classes(model_fns, state, split: cifar.Split, dataset: str = "cifar10") -> None:
    """The model's logits for these images are (N, classes) and every label is a class: its
    output shape is traced (`jax.eval_shape`), nothing is compiled or run. The images must have
    the channels the model takes, its first convolution's input channels read in the same trace,
    or, for a model without a Flax convolution, the dataset's."""
    taken: list = []
    try:
        with nn.intercept_methods(_first_kernel_channels(taken)):
            logits = jax.eval_shape(
                lambda x: model_fns.infer(state.params, state.batch_stats, x),
                jax.ShapeDtypeStruct((2,) + split.images.shape[1:], np.float32),
            )
    except Exception as error:  # the model's own error for inputs it cannot take (e.g. channels)
        failure = error
    else:
        failure = None
    # Before the model's own error: a kernel built for other channels is why it failed, and a
    # model whose normalization broadcasts the images to its channels does not fail at all.
    have, takes = split.images.shape[3], taken[0] if taken else cifar.CHANNELS[dataset]
    if have != takes:
        whose = "the model's first convolution takes" if taken else f"the dataset's ({dataset}) have"
        raise UserError(f"images have {have} channel(s), but {whose} {takes}; pass (N, H, W, {takes}) images")
    if failure is not None:
        raise UserError(
            f"the model cannot take images of shape (N, {', '.join(map(str, split.images.shape[1:]))}): "
            f"{type(failure).__name__}: {one_line(failure)[:300]}"
        ) from None
    # Traced at 2 images, so that a batch dimension the model drops or fixes shows.
    if len(logits.shape) != 2 or logits.shape[0] != 2 or logits.shape[1] < 2:
        raise UserError(
            f"the model must return (N, classes) logits with classes >= 2, got shape {logits.shape} for N = 2 images"
        )
    if not jnp.issubdtype(logits.dtype, jnp.floating):
        # Integer logits have no gradient for the attacks and tie at every margin PR counts.
        raise UserTypeError(f"the model must return floating-point logits, got dtype {logits.dtype}")
    classes = logits.shape[1]
    if split.labels.max() >= classes:
        raise UserError(
            f"labels must be classes of the model, in [0, {classes - 1}], got values in "
            f"[{split.labels.min()}, {split.labels.max()}]"
        )


def evaluate(
    model: Model,
    images,
    labels,
    *,
    evaluators="clean,pgd20,pr",
    dataset: str = "cifar10",
    batch_size: int = 500,
    progress: bool = False,
    **settings,
) -> dict:
    """Every chosen evaluator on every image: results.json's figures with their intervals, and
    the per-image arrays under "per_image". `dataset` is recorded with the figures; `settings`
    replace fields of the default config's `eval` block, a block's as a dict (pr={"samples": 100}, seed=...)."""
    chosen = config_lib.default_evaluation_settings(
        dataset, settings, evaluators=evaluators, num_examples=settings_lib.WHOLE_SPLIT, batch_size=batch_size
    )
    # The images first: what is wrong with them is not blamed on the model.
    split = as_split(images, labels)
    model_fns, state = as_model(model)
    check_classes(model_fns, state, split, dataset)
    per_image = {}
    results = evaluation.evaluate_state(chosen, model_fns, state, split, progress=progress, per_image_out=per_image)
    return {**results, "per_image": per_image}


def train_model(model, settings: settings_lib.TrainSettings, workdir: str, **kwargs):
    """A user's module trained by patjax's loop (`train.train_run(..., model=)`): the method,
    optimizer, data and schedule of `settings` (`patjax.train_settings(cfg)`; its model name is
    not read, its dataset is), checkpoints and the training log in `workdir`, resumed from its
    newest checkpoint when run again with the same module. `model`: a flax.nnx.Module or a
    (linen module, variables) pair, trained from its own variables and left unchanged; returns
    the trained model in the same form (an NNX module in inference mode, or (module, variables)),
    for `evaluate`. kwargs: train_run's stop_after_steps and stop_at."""
    state = train_lib.train_run(settings, workdir, model=model, **kwargs)
    variables = {"params": state.params, "batch_stats": state.batch_stats}
    if isinstance(model, nnx.Module):
        return forwards.nnx_module(model, variables["params"], variables["batch_stats"])
    return model[0], variables
