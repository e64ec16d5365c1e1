"""The evaluation as a library call: any classifier and any 8-bit images in, the figures of
results.json out, with no run, config file or workdir.

  results = patjax.api.evaluate(logits_fn, images, labels, evaluators="clean,pgd20,pr")
  results = patjax.api.evaluate((module, variables), images, labels, pr_samples=100)

`model` is a function from (N, H, W, C) float32 images in [0, 1] to (N, classes) logits (jax
traceable: the attacks differentiate it), or a Flax module with its variables ({"params": ...,
"batch_stats": ...}; BatchNorm in inference mode). The settings are the default config's eval
settings (docs/evaluation.md) with the keyword arguments replacing fields of `config.eval`. The
results dict is `patjax.evaluation.evaluate_state`'s (what results.json holds) with the per-image
arrays of per_image.npz under "per_image".

`evaluate_torch_checkpoint` does the same for a PyTorch state_dict file of a network of
`patjax.models` (`python -m patjax.evaluate --torch_checkpoint=FILE`) and writes eval/ files.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Union

import numpy as np

from patjax import config as config_lib
from patjax import data, evaluation, models, torch_weights
from patjax import state as state_lib
from patjax.errors import UserError

Model = Union[Callable[[Any], Any], tuple]


def as_model(model: Model):
    """(model_fns, state) for `evaluation.evaluate_state` from a logits function or (module, variables)."""
    if isinstance(model, tuple) and len(model) == 2:
        module, variables = model
        params, batch_stats = variables["params"], variables.get("batch_stats", {})
        apply = module.apply
    elif callable(model):
        params, batch_stats = {}, {}

        def apply(variables, x, train=False, mutable=None):
            if train:
                raise UserError("a logits function has no training mode; evaluate with langevin.bn_mode='inference'")
            return model(x)
    else:
        raise UserError("model must be a logits function or a (flax module, variables) pair")
    return models.ModelFns(apply), state_lib.inference_state(params, batch_stats)


def as_split(images, labels) -> data.Split:
    """The images as the evaluators read them (uint8 NHWC; they divide by 255): uint8 as they are,
    floats in [0, 1] only if they are 8-bit values (k / 255), since anything else would be
    rounded without a word."""
    images, labels = np.asarray(images), np.asarray(labels)
    if images.ndim != 4 or labels.shape != images.shape[:1]:
        raise UserError(f"images must be (N, H, W, C) and labels (N,), got {images.shape} and {labels.shape}")
    if images.dtype != np.uint8:
        scaled = np.asarray(images, np.float64) * 255
        if not np.all(np.abs(scaled - np.round(scaled)) < 1e-3) or scaled.min() < 0 or scaled.max() > 255:
            raise UserError("float images must be 8-bit values k / 255 in [0, 1]; pass uint8 images otherwise")
        images = np.round(scaled).astype(np.uint8)
    return data.Split(images=images, labels=labels.astype(np.int32))


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
    replace fields of the default config's `eval` block (pr_samples=..., seed=..., ...)."""
    chosen = config_lib.default_evaluation_settings(
        dataset, settings, evaluators=evaluators, num_examples=config_lib.WHOLE_SPLIT, batch_size=batch_size
    )
    model_fns, state = as_model(model)
    per_image = {}
    results = evaluation.evaluate_state(
        chosen, model_fns, state, as_split(images, labels), progress=progress, per_image_out=per_image
    )
    return {**results, "per_image": per_image}


def evaluate_torch_checkpoint(
    path,
    model_name,
    dataset,
    normalize,
    out_dir,
    evaluators=None,
    num_examples=None,
    batch_size=None,
    overrides=None,
    width=None,
    overwrite: bool = True,
) -> dict:
    """A PyTorch state_dict file (`torch_weights.load_model`) evaluated as a run is, under the
    default config's eval settings with `overrides`; results in out_dir/eval/. model_name, dataset
    and width may be None where the file's metadata names them (`torch_weights.network`). The
    results record the file, the network and its input normalization under "model".
    overwrite=False refuses to replace an evaluation of out_dir made otherwise."""
    model_name, dataset, width = torch_weights.network(path, model_name, dataset, width)
    # Every setting is checked before the weights are read.
    settings = config_lib.default_evaluation_settings(
        dataset, overrides, evaluators=evaluators, num_examples=num_examples, batch_size=batch_size
    )
    model_fns, state = torch_weights.load_model(path, model_name, dataset, normalize, width=width)
    normalization = normalize if normalize is not None else "the file's mu and sigma"
    record = {
        "model": {
            "torch_checkpoint": os.path.abspath(path),
            "model": model_name,
            "width": width,
            "normalize": normalization,
        }
    }
    return evaluation.evaluate_and_write(settings, model_fns, state, out_dir, record=record, overwrite=overwrite)
