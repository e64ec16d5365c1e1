"""A network's weights between patjax (Flax `params` and `batch_stats`) and a PyTorch state_dict
in memory: the names and layouts (`MODULE_NAMES`, `to_state_dict`, `from_state_dict`); reading
and writing them as files is `torch_weights`.

The names are those of the reference PyTorch definitions each patjax network follows
(patjax_torch.models holds them): kuangliu's pytorch-cifar for `resnet18` and
`preact_resnet18`, RobustBench for `preact_resnet18_v1`, TRADES / RobustBench for `wrn28_10`,
`wrn34_10` and `wrn34_20`, torchvision for `wrn50_2`. The layouts:

  Conv2d.weight (O, I, H, W)          <-> Conv kernel (H, W, I, O)
  Linear.weight (out, in), .bias      <-> Dense kernel (in, out), bias
  BatchNorm2d.weight, .bias           <-> BatchNorm scale, bias (params)
  BatchNorm2d.running_mean, _var      <-> BatchNorm mean, var (batch_stats)
  BatchNorm2d.num_batches_tracked         ignored (used only by momentum=None, which none of
                                          these networks sets); optional, as in torch's
                                          load_state_dict of a dict without version metadata,
                                          and refused under any name but a BatchNorm's
  mu, sigma (1, C, 1, 1) buffers      <-> the model's input normalization (RobustBench's names)

Anything that does not fit the network is a one-line `UserError` naming the first key that does
not fit.
"""

from __future__ import annotations

import re
from typing import Optional

import jax
import numpy as np
from flax import traverse_util

from patjax.core.errors import UserError
from patjax.models import networks

# Prefixes every key of some checkpoints carries: nn.DataParallel's `module.`, a wrapper's
# `model.` (RobustBench strips both: robustbench.utils.load_model).
WRAPPER_PREFIXES = ("module.", "model.")
# TRADES' WideResNet builds a `sub_block1` its forward never calls (RobustBench's
# `sub_block1=True` exists only to load those checkpoints): its weights are not part of the network.
UNUSED_PREFIXES = {"wrn28_10": ("sub_block1.",), "wrn34_10": ("sub_block1.",), "wrn34_20": ("sub_block1.",)}
BLOCK, SUB_BLOCK = "block1.", "sub_block1."  # the copy has block1's layout
_IGNORED_SUFFIX = ".num_batches_tracked"
_NORMALIZATION_KEYS = ("mu", "sigma")
_AUTO = re.compile(r"^([A-Za-z]+)_(\d+)$")  # Flax's automatic names: Conv_3, BasicBlock_7


def _numbered(name: str) -> str:
    """Flax's Conv_i / BatchNorm_i -> the references' conv{i+1} / bn{i+1}."""
    kind, index = _AUTO.match(name).groups()
    return f"{ {'Conv': 'conv', 'BatchNorm': 'bn'}[kind] }{int(index) + 1}"


def _resnet_module(head: str, shortcut: str, stage_blocks: tuple):
    """Names of patjax.models.networks' ResNet18 (kuangliu's: head `linear`, `shortcut`) and WideResNet50_2
    (torchvision's: head `fc`, `downsample`), whose Flax names are automatic (BasicBlock_7)."""
    ends = np.cumsum(stage_blocks)

    def name(path: tuple) -> str:
        if path == ("Dense_0",):
            return head
        if len(path) == 1:
            return _numbered(path[0])
        block = int(_AUTO.match(path[0]).group(2))
        stage = int(np.searchsorted(ends, block, side="right"))
        index = block - (int(ends[stage - 1]) if stage else 0)
        inner = {"shortcut_conv": f"{shortcut}.0", "shortcut_bn": f"{shortcut}.1"}.get(path[1]) or _numbered(path[1])
        return f"layer{stage + 1}.{index}.{inner}"

    return name


def _small_cnn_module(path: tuple) -> str:
    """patjax.models.networks.SmallCNN -> patjax_torch.models.SmallCNN's Sequential (conv, BN, ReLU, pool)."""
    if path == ("Dense_0",):
        return "linear"
    kind, stage = _AUTO.match(path[0]).groups()
    return f"features.{4 * int(stage) + (kind == 'BatchNorm')}"


def _mirrored_module(path: tuple) -> str:
    """Networks whose Flax names mirror the PyTorch attributes ("layer1_0" is `layer1.0`)."""
    return ".".join(part.replace("_", ".") for part in path)


# The networks with a PyTorch twin in patjax_torch/models.py (tests/test_registries.py checks
# that the two lists agree), each with its Flax path -> PyTorch module name map.
MODULE_NAMES = {
    "small_cnn": _small_cnn_module,
    "resnet18": _resnet_module("linear", "shortcut", (2, 2, 2, 2)),
    "wrn50_2": _resnet_module("fc", "downsample", (3, 4, 6, 3)),
    "preact_resnet18": _mirrored_module,
    "preact_resnet18_v1": _mirrored_module,
    "wrn28_10": _mirrored_module,
    "wrn34_10": _mirrored_module,
    "wrn34_20": _mirrored_module,
}


def _leaves(model_name: str, abstract_params, abstract_batch_stats):
    """[(torch key, collection, flax path, flax shape, to torch layout)] in the network's order;
    a network of `networks.MODELS` without an entry in `MODULE_NAMES` (no PyTorch twin) trains and
    evaluates, and only reading or writing its state_dict is a one-line UserError."""
    if model_name not in MODULE_NAMES:
        raise UserError(
            f"{model_name} has no PyTorch names (patjax.interop.torch_names.MODULE_NAMES): it cannot be "
            f"read from or written as a PyTorch state_dict; networks that can: {', '.join(MODULE_NAMES)}"
        )
    names = MODULE_NAMES[model_name]
    out = []
    for collection, tree in (("params", abstract_params), ("batch_stats", abstract_batch_stats)):
        for path, leaf in traverse_util.flatten_dict(tree).items():
            module, what = names(path[:-1]), path[-1]
            shape = tuple(leaf.shape)
            if what == "kernel" and len(shape) == 4:  # HWIO -> OIHW
                key, axes = "weight", (3, 2, 0, 1)
            elif what == "kernel":  # (in, out) -> (out, in)
                key, axes = "weight", (1, 0)
            else:
                key = {"scale": "weight", "bias": "bias", "mean": "running_mean", "var": "running_var"}[what]
                axes = None
            out.append((f"{module}.{key}", collection, path, shape, axes))
    return out


def to_state_dict(model_name: str, params, batch_stats, normalize=None) -> dict[str, np.ndarray]:
    """The PyTorch state_dict (float32 numpy arrays, reference names and layouts) of a patjax
    network; normalize: its (mean, std), stored as `mu` and `sigma`, or None."""
    params, batch_stats = jax.device_get((params, batch_stats))
    trees = {"params": params, "batch_stats": batch_stats}
    out = {}
    if normalize is not None:
        for key, values in zip(_NORMALIZATION_KEYS, normalize):
            out[key] = np.asarray(values, np.float32).reshape(1, -1, 1, 1)
    for key, collection, path, _, axes in _leaves(model_name, params, batch_stats):
        value = np.array(traverse_util.flatten_dict(trees[collection])[path], np.float32)  # writable, for torch
        out[key] = np.ascontiguousarray(value.transpose(axes) if axes else value)
    return out


def from_state_dict(
    model_name: str,
    state_dict: dict,
    abstract_params,
    abstract_batch_stats,
    source: str = "the file",
    sub_block1: Optional[bool] = None,
):
    """(params, batch_stats, normalize) of a patjax network from a PyTorch state_dict: every key
    the network needs, in its shape; normalize is the (mean, std) of `mu` and `sigma`, or None if
    the state_dict has none. A key missing, misshapen, not floating point or left over, or one the
    network uses that holds a NaN or an infinity (`networks.check_finite`), is a one-line UserError
    naming it. sub_block1, for the WideResNets of `UNUSED_PREFIXES`: whether the reference's
    network has TRADES' unused copy of block1, whose weights the file must then hold in block1's
    shapes (True) or must not hold (False), as a strict load_state_dict would; None: held or not,
    they are not read."""
    tensors = dict(state_dict)
    for prefix in WRAPPER_PREFIXES:
        if tensors and all(k.startswith(prefix) for k in tensors):
            tensors = {k[len(prefix) :]: v for k, v in tensors.items()}
    flat = {"params": {}, "batch_stats": {}}
    read = {}  # what the network uses, under the file's names, for the finite check
    leaves = _leaves(model_name, abstract_params, abstract_batch_stats)
    unused = UNUSED_PREFIXES.get(model_name, ())
    copies = []  # the reference's sub_block1: block1's layout under its name, checked and not used
    if sub_block1 and unused:
        copies = [
            (SUB_BLOCK + key[len(BLOCK) :], shape, axes) for key, _, _, shape, axes in leaves if key.startswith(BLOCK)
        ]

    def take(key, shape, axes):
        value = tensors.pop(key, None)
        expected = tuple(shape[i] for i in axes) if axes else shape
        if value is None:
            raise UserError(f"{source} does not fit {model_name}: it has no {key} (expected shape {list(expected)})")
        value = np.asarray(value)
        if value.shape != expected or not np.issubdtype(value.dtype, np.floating):
            raise UserError(
                f"{source} does not fit {model_name}: {key} is {value.dtype}{list(value.shape)}, "
                f"expected float{list(expected)}"
            )
        return value.astype(np.float32)

    for key, collection, path, shape, axes in leaves:
        read[key] = value = take(key, shape, axes)
        flat[collection][path] = np.ascontiguousarray(np.transpose(value, np.argsort(axes)) if axes else value)
    for key, shape, axes in copies:
        take(key, shape, axes)
    # A BatchNorm's step counter, under the name of a BatchNorm of the network only.
    for key in [k for k, *_ in leaves] + [k for k, *_ in copies]:
        if key.endswith(".running_mean"):
            tensors.pop(key[: -len(".running_mean")] + _IGNORED_SUFFIX, None)
    normalize = None
    if any(k in tensors for k in _NORMALIZATION_KEYS):
        if not all(k in tensors for k in _NORMALIZATION_KEYS):
            raise UserError(f"{source} has only one of mu and sigma (the input normalization)")
        mean, std = (np.asarray(tensors.pop(k), np.float64).reshape(-1) for k in _NORMALIZATION_KEYS)
        read.update(mu=mean, sigma=std)  # an infinite sigma maps every image to the same finite logits
        if mean.shape != (3,) or std.shape != (3,) or not np.all(std > 0):
            raise UserError(f"{source}: mu and sigma must hold 3 values each, sigma > 0 (got {mean}, {std})")
        normalize = (tuple(mean.tolist()), tuple(std.tolist()))
    left = [k for k in tensors if sub_block1 is not None or not k.startswith(unused)]
    if left:
        raise UserError(f"{source} does not fit {model_name}: {left[0]} is not part of it ({len(left)} such key(s))")
    # float32 values, as the network will use them: a float64 1e39 is refused as the inf it becomes.
    networks.check_finite(read, source)
    return traverse_util.unflatten_dict(flat["params"]), traverse_util.unflatten_dict(flat["batch_stats"]), normalize
