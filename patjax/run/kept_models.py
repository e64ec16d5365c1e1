"""A run's kept models: the parameters and BatchNorm statistics of chosen steps, one safetensors
file each (DIR/models/step_000800.safetensors).

A checkpoint holds the whole train state (with the optimizer's momentum, for resuming) and is
not kept in a suite's committed results; a kept model is what evaluation needs and nothing
more (about 0.4 MB for the small CNN), so a suite committed with its models can be evaluated
again under any later protocol without retraining. safetensors stores named float32 arrays
without pickling; the names are the flax variable paths ("params/Conv_0/kernel").
"""

from __future__ import annotations

import os
import re
from typing import Any, Optional

import numpy as np
from flax import traverse_util
from safetensors.numpy import save_file

from patjax.core import files
from patjax.core.errors import UserError

MODELS_DIR = "models"
FORMAT = "patjax-model-1"  # the metadata's format tag; a file without it is not one of ours
_NAME = re.compile(r"^step_(\d{6,})\.safetensors$")
_COLLECTIONS = ("params", "batch_stats")


def path(workdir: str, step: int) -> str:
    return os.path.join(workdir, MODELS_DIR, f"step_{int(step):06d}.safetensors")


def steps(workdir: str) -> list[int]:
    """The steps with a kept model, ascending."""
    directory = os.path.join(workdir, MODELS_DIR)
    if not os.path.isdir(directory):
        return []
    return sorted(int(m.group(1)) for m in (_NAME.match(n) for n in os.listdir(directory)) if m)


def save(workdir: str, step: int, params: Any, batch_stats: Any, metadata: dict) -> str:
    """Writes the model of `step` atomically (`files.atomic`); returns its path."""
    tensors = {}
    for collection, tree in zip(_COLLECTIONS, (params, batch_stats)):
        for key, value in traverse_util.flatten_dict(tree, sep="/").items():
            tensors[f"{collection}/{key}"] = np.ascontiguousarray(np.asarray(value))
    target = path(workdir, step)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    metadata = {"format": FORMAT, "step": str(int(step)), **{k: str(v) for k, v in metadata.items()}}
    files.atomic(target, lambda tmp: save_file(tensors, tmp, metadata=metadata))
    return target


def load(workdir: str, step: int, abstract_params: Any, abstract_batch_stats: Any) -> tuple[Any, Any, dict]:
    """(params, batch_stats, metadata) of the kept model of `step`, checked against the model's
    abstract variables (`jax.eval_shape` of its init): every name, shape and dtype must match,
    else a one-line UserError naming the file (a damaged, truncated or foreign file never
    evaluates as if it were the run's model)."""
    file = path(workdir, step)
    metadata, tensors = files.read_safetensors(file)
    if metadata.get("format") != FORMAT or metadata.get("step") != str(int(step)):
        raise UserError(f"{file} is not a patjax model of step {step} (metadata {metadata})")
    out = []
    for collection, abstract in zip(_COLLECTIONS, (abstract_params, abstract_batch_stats)):
        expected = traverse_util.flatten_dict(abstract, sep="/")
        tree = {}
        for key, spec in expected.items():
            name = f"{collection}/{key}"
            value = tensors.pop(name, None)
            if value is None or value.shape != tuple(spec.shape) or value.dtype != spec.dtype:
                got = "missing" if value is None else f"{value.dtype}{list(value.shape)}"
                raise UserError(
                    f"{file} does not fit the run's model: {name} is {got}, expected {spec.dtype}{list(spec.shape)}"
                )
            tree[key] = value
        out.append(traverse_util.unflatten_dict(tree, sep="/"))
    if tensors:
        raise UserError(
            f"{file} does not fit the run's model: it has {len(tensors)} array(s) the model lacks "
            f"(e.g. {next(iter(tensors))})"
        )
    return out[0], out[1], metadata


def newest(workdir: str) -> Optional[int]:
    found = steps(workdir)
    return found[-1] if found else None
