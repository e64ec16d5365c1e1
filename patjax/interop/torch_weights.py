"""A network's weights as a PyTorch state_dict file: read (`read_state_dict`, `load_model`,
`load_arrays`), written (`write_state_dict`, `export`, `export_run`), and what a file says of the
network it holds (`read_metadata`, `network`); the names and layouts are `torch_names`'.

Files: .safetensors (read and written with numpy alone, no pickle) or, only when the user names
one, a .pt/.pth file read with `torch.load(weights_only=True)`. Anything that does not fit the
network is a one-line `UserError` naming the first key that does not fit.
"""

from __future__ import annotations

import os
from typing import Optional

import jax
import numpy as np
from safetensors.numpy import save_file

from patjax.core import files
from patjax.core.errors import UserError, one_line
from patjax.data import cifar
from patjax.interop import torch_names
from patjax.models import networks
from patjax.run import state as state_lib
from patjax.run import workdir as workdir_lib

SAFETENSORS = ".safetensors"
PICKLED = (".pt", ".pth")  # torch.save's files; read with weights_only=True (no code runs)
FORMATS = {"safetensors": SAFETENSORS, "pt": ".pt"}
# Where a training checkpoint keeps its state_dict (torch.save({"state_dict": ..., "epoch": ...})).
CONTAINERS = ("state_dict", "model_state_dict")


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
    `torch_names.from_state_dict`."""
    networks.check_model(model_name)
    cifar.check_dataset(dataset)
    if width is not None and (model_name not in networks.TAKES_WIDTH or isinstance(width, bool) or width < 1):
        raise UserError(f"a width is taken by {', '.join(networks.TAKES_WIDTH)} only, as a positive integer")
    kwargs = {"width": width} if width is not None else {}
    num_classes = cifar.NUM_CLASSES[dataset]
    shapes = networks.create_model(model_name, dataset, num_classes, normalize=networks.NO_NORMALIZATION, **kwargs)
    abstract = jax.eval_shape(lambda: networks.init_variables(shapes, jax.random.PRNGKey(0)))
    params, batch_stats, found = torch_names.from_state_dict(
        model_name, tensors, *abstract, source=source, sub_block1=sub_block1
    )
    mean, std = matching_normalization(found, normalize, dataset, source) or (None, None)
    model = networks.MODELS[model_name](num_classes=num_classes, mean=mean, std=std, **kwargs)
    return networks.ModelFns(model.apply), state_lib.inference_state(params, batch_stats)


def export(
    path: str, model_name: str, params, batch_stats, normalize, metadata: Optional[dict] = None, overwrite: bool = False
) -> str:
    """Writes a patjax network as a PyTorch state_dict file (`torch_names.to_state_dict`, `write_state_dict`)."""
    tensors = torch_names.to_state_dict(model_name, params, batch_stats, normalize)
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
