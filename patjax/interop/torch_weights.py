"""A network's weights between patjax (Flax `params` and `batch_stats`) and a PyTorch state_dict.

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

Files: .safetensors (read and written with numpy alone, no pickle) or, only when the user names
one, a .pt/.pth file read with `torch.load(weights_only=True)`. Anything that does not fit the
network is a one-line `UserError` naming the first key that does not fit.
"""

from __future__ import annotations

import os
import re
from typing import Optional

import jax
import numpy as np
from flax import traverse_util
from safetensors.numpy import save_file

from patjax.core import files
from patjax.core.errors import UserError, one_line
from patjax.data import cifar
from patjax.models import networks
from patjax.run import state as state_lib
from patjax.run import workdir as workdir_lib

SAFETENSORS = ".safetensors"
PICKLED = (".pt", ".pth")  # torch.save's files; read with weights_only=True (no code runs)
FORMATS = {"safetensors": SAFETENSORS, "pt": ".pt"}
# Where a training checkpoint keeps its state_dict (torch.save({"state_dict": ..., "epoch": ...})).
CONTAINERS = ("state_dict", "model_state_dict")
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
            f"{model_name} has no PyTorch names (patjax.interop.torch_weights.MODULE_NAMES): it cannot be "
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


def _check_suffix(path: str, allowed) -> str:
    suffix = os.path.splitext(path)[1].lower()
    if suffix not in allowed:
        raise UserError(f"{path}: a PyTorch state_dict must be a {' or '.join(allowed)} file")
    return suffix


def _existing(path: str) -> str:
    """The suffix of a state_dict file to read, which must exist."""
    suffix = _check_suffix(path, (SAFETENSORS, *PICKLED))
    if not os.path.isfile(path):
        raise UserError(f"{path}: no such file")
    return suffix


def read_state_dict(path: str, containers=CONTAINERS) -> dict[str, np.ndarray]:
    """The arrays of a state_dict file: .safetensors with numpy alone (`files.read_safetensors`);
    .pt/.pth with torch.load(weights_only=True) (tensors and containers only, no code), also a
    checkpoint dict that holds the state_dict under one of `containers`, looked into in turn."""
    if _existing(path) == SAFETENSORS:
        return files.read_safetensors(path)[1]
    try:
        import torch  # here, not at the top: torch is optional (the [bench] extra), needed for .pt files only
    except ImportError:
        raise UserError(f"reading {path} needs torch (pip install torch), or a .safetensors file") from None
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # torch raises pickle, runtime and zip errors alike
        raise UserError(f"{path} is not a readable PyTorch file ({one_line(error)[:160]})") from None
    for key in containers:
        if isinstance(obj, dict) and isinstance(obj.get(key), dict):
            obj = obj[key]
    if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise UserError(f"{path} does not hold a state_dict (a dict of tensors)")
    return {k: v.detach().float().numpy() if v.is_floating_point() else v.numpy() for k, v in obj.items()}


def _held_model(path: str) -> str:
    """Which model the weights file `path` holds, from its metadata (`export` writes the network,
    dataset and step into a .safetensors file, `read_metadata`), or that it does not say. A damaged
    .safetensors file is `files.read_safetensors`' UserError."""
    if os.path.splitext(path)[1].lower() != SAFETENSORS:
        return "a .pt file, which does not record which model it holds"
    metadata = read_metadata(path)
    if "model" not in metadata:
        return "its metadata does not say which model it holds"
    # The model first, then by name: safetensors keeps the metadata unordered.
    shown = [f"{k}={v}" for k, v in sorted(metadata.items(), key=lambda kv: (kv[0] != "model", kv[0])) if v]
    return f"it holds {', '.join(shown)}"


def check_can_write(path: str, overwrite: bool) -> None:
    """Refuses, in one line naming the model it holds, to replace an existing file unless
    `overwrite`: a file of weights may be another run's model."""
    if overwrite or not os.path.lexists(path):
        return
    remedy = "pass --overwrite to replace it, or choose another --out"
    try:
        held = _held_model(path)
    except UserError as error:  # a damaged file: the reader's line, which says the file is there
        raise UserError(f"{error}; {remedy}") from None
    raise UserError(f"{path} exists ({held}); {remedy}")


def write_state_dict(
    path: str, tensors: dict[str, np.ndarray], metadata: Optional[dict] = None, overwrite: bool = False
) -> str:
    """Writes the state_dict atomically: .safetensors (metadata kept as strings) or .pt
    (torch.save of torch tensors; needs torch). Returns the path. An existing file is replaced
    only with `overwrite` (`check_can_write`), also one that another writer creates meanwhile."""
    suffix = _check_suffix(path, (SAFETENSORS, ".pt"))
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise UserError(f"cannot write {path}: the folder {folder} does not exist")
    check_can_write(path, overwrite)
    if suffix == SAFETENSORS:

        def write(tmp):
            save_file(tensors, tmp, metadata={k: str(v) for k, v in (metadata or {}).items()})

    else:
        try:
            import torch  # optional, as in read_state_dict
        except ImportError:
            raise UserError("writing a .pt file needs torch (pip install torch); use .safetensors") from None

        def write(tmp):
            torch.save({k: torch.from_numpy(np.array(v)) for k, v in tensors.items()}, tmp)

    try:
        files.atomic(path, write, replace=overwrite)
    except FileExistsError:  # created by another writer since the check above
        check_can_write(path, overwrite=False)
        raise
    return path


def _mean_std(normalize, dataset: str):
    """(mean, std) of a normalization name (`networks.normalization`) or of an explicit (mean, std)
    pair; (None, None) for raw [0, 1] inputs."""
    if isinstance(normalize, str):
        return networks.normalization(normalize, dataset)
    return normalize if normalize is not None else (None, None)


def matching_normalization(found, normalize, dataset: str, source: str):
    """The (mean, std) a loaded network uses, or None for raw [0, 1] inputs: the file's own
    (`found`, from mu and sigma), which a given `normalize` (a name, or an explicit (mean, std)
    pair) must agree with; without one in the file, `normalize` must be given (a model fed
    inputs normalized the wrong way gives wrong numbers without any error)."""
    if found is None:
        if normalize is None:
            raise UserError(
                f"{source} does not record its input normalization (no mu and sigma): pass "
                f"normalize='none' for a network that takes [0, 1] inputs (RobustBench's), or "
                f"'{networks.DATASET_NORMALIZATION}' / a dataset name for one that expects normalized inputs"
            )
        mean, std = _mean_std(normalize, dataset)
        return None if mean is None else (tuple(mean), tuple(std))
    if normalize is not None:
        mean, std = _mean_std(normalize, dataset)
        if mean is None or not (np.allclose(mean, found[0], atol=1e-6) and np.allclose(std, found[1], atol=1e-6)):
            raise UserError(f"{source} normalizes its inputs with mu={found[0]}, sigma={found[1]}, not {normalize!r}")
    return found


def read_metadata(path: str) -> dict[str, str]:
    """The metadata a .safetensors file holds (`export` writes the network, its width and dataset
    there, `files.read_safetensors`); {} for a .pt/.pth file, which has none."""
    if _existing(path) != SAFETENSORS:
        return {}
    return files.read_safetensors(path, arrays=False)[0]


def network(path: str, model_name: Optional[str] = None, dataset: Optional[str] = None, width: Optional[int] = None):
    """(model_name, dataset, width) of the network a state_dict file holds: each one given, else
    the file's metadata (`read_metadata`), else (for dataset and width) the default; a given one
    that the metadata contradicts is a one-line UserError, since loading the weights of one network
    into another either fails or, worse, fits with another meaning. A given model is checked
    before the file is read."""
    if model_name is not None:
        networks.check_model(model_name)
    meta = read_metadata(path)  # only names patjax knows are read as its own (other tools write metadata too)
    recorded = {
        "model": meta.get("model") if meta.get("model") in networks.MODELS else None,
        "dataset": meta.get("dataset") if meta.get("dataset") in cifar.NUM_CLASSES else None,
        "width": int(meta["width"]) if meta.get("width", "").isdigit() else None,
    }
    given = {"model": model_name, "dataset": dataset, "width": width}
    for key, value in given.items():
        if value is not None and recorded[key] is not None and value != recorded[key]:
            raise UserError(f"{path} holds a {key} {recorded[key]!r} (its metadata), not {value!r}")
    model_name = model_name or recorded["model"]
    if model_name is None:
        raise UserError(
            f"{path} does not name its network (no metadata): pass the model ({', '.join(networks.MODELS)})"
        )
    return model_name, dataset or recorded["dataset"] or "cifar10", width if width is not None else recorded["width"]


def load_model(
    path: str,
    model_name: Optional[str],
    dataset: Optional[str] = None,
    normalize: Optional[str] = None,
    width: Optional[int] = None,
):
    """(model_fns, state) of a PyTorch state_dict file as a patjax network, ready for
    `patjax.run.evaluation.evaluate_state`: the state holds params and batch_stats (no optimizer).
    model_name, dataset, width: see `network` (None: the file's metadata). normalize: see
    `matching_normalization`. width: the stem width of the networks in `networks.TAKES_WIDTH`
    (default 64, the paper's and the references')."""
    model_name, dataset, width = network(path, model_name, dataset, width)
    return load_arrays(read_state_dict(path), model_name, dataset, normalize, width, source=path)


def load_arrays(
    tensors: dict,
    model_name: str,
    dataset: str,
    normalize=None,
    width=None,
    source: str = "the file",
    sub_block1: Optional[bool] = None,
):
    """(model_fns, state) of a state_dict's arrays as a patjax network, ready for
    `patjax.run.evaluation.evaluate_state`: the state holds params and batch_stats (no optimizer).
    normalize: see `matching_normalization`. width: the stem width of the networks in
    `networks.TAKES_WIDTH` (default 64, the paper's and the references'). sub_block1: see
    `from_state_dict`."""
    networks.check_model(model_name)
    cifar.check_dataset(dataset)
    if width is not None and (model_name not in networks.TAKES_WIDTH or isinstance(width, bool) or width < 1):
        raise UserError(f"a width is taken by {', '.join(networks.TAKES_WIDTH)} only, as a positive integer")
    kwargs = {"width": width} if width is not None else {}
    num_classes = cifar.NUM_CLASSES[dataset]
    shapes = networks.create_model(model_name, dataset, num_classes, normalize=networks.NO_NORMALIZATION, **kwargs)
    abstract = jax.eval_shape(lambda: networks.init_variables(shapes, jax.random.PRNGKey(0)))
    params, batch_stats, found = from_state_dict(model_name, tensors, *abstract, source=source, sub_block1=sub_block1)
    mean, std = matching_normalization(found, normalize, dataset, source) or (None, None)
    model = networks.MODELS[model_name](num_classes=num_classes, mean=mean, std=std, **kwargs)
    return networks.ModelFns(model.apply), state_lib.inference_state(params, batch_stats)


def export(
    path: str, model_name: str, params, batch_stats, normalize, metadata: Optional[dict] = None, overwrite: bool = False
) -> str:
    """Writes a patjax network as a PyTorch state_dict file (`to_state_dict`, `write_state_dict`)."""
    tensors = to_state_dict(model_name, params, batch_stats, normalize)
    return write_state_dict(path, tensors, {"model": model_name, **(metadata or {})}, overwrite=overwrite)


def export_run(workdir: str, path: str, step: Optional[int] = None, overwrite: bool = False) -> tuple[str, dict]:
    """A run's model (its newest, or the kept model / checkpoint of `step`: `workdir.restore`) as
    a PyTorch state_dict file under the reference names, with the run's input normalization as
    the buffers mu and sigma and metadata naming the network, its width and dataset and the run
    (its folder's name, method, seed and step; no path of this machine). An existing file is
    replaced only with `overwrite`, checked before the model is read; the file's folder is
    created once the model is read. Returns (path, metadata)."""
    check_can_write(path, overwrite)
    settings, _, state = workdir_lib.restore(workdir, step=step)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    model = settings.model
    params, batch_stats = jax.device_get((state.params, state.batch_stats))
    metadata = {
        "dataset": model.dataset,
        "num_classes": cifar.NUM_CLASSES[model.dataset],
        "width": model.width if model.name in networks.TAKES_WIDTH else "",
        "step": int(state.step),
        "run": os.path.basename(os.path.normpath(os.path.abspath(workdir))),
        "method": settings.method.name,
        "seed": settings.seed,
    }
    written = export(
        path, model.name, params, batch_stats, networks.DATASET_STATS[model.dataset], metadata, overwrite=overwrite
    )
    return written, {"model": model.name, **metadata}
