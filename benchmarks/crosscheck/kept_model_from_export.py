#!/usr/bin/env python3
"""A workdir that holds an exported model as its kept model, so that workdir commands
(`patjax.diagnose`, `patjax.evaluate`) read it.

  python benchmarks/crosscheck/kept_model_from_export.py --export=FILE.safetensors --config=config.json \
      --workdir=/tmp/W [--compute_dtype=float32] [--data_dir=DIR] [--step=N]

Reads the PyTorch-layout state_dict that `patjax.export` wrote (`torch_weights.read_state_dict`,
`torch_names.from_state_dict`: every key the network needs, in its shape, finite), checks
that its input normalization is the one the config's network applies, and writes WORKDIR with
the run's config.json (compute_dtype and data_dir replaced if given) and
models/step_STEP.safetensors (`kept_models.save`, STEP from the file's metadata or --step). The parameters
are the exported ones bit for bit (float32). It refuses a WORKDIR that already exists.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import jax
import numpy as np

from patjax.data import cifar
from patjax.interop import torch_names, torch_weights
from patjax.models import networks
from patjax.run import kept_models


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--export", required=True, help="a state_dict file written by patjax.export")
    parser.add_argument("--config", required=True, help="the run's config.json")
    parser.add_argument("--workdir", required=True, help="the workdir to create (must not exist)")
    parser.add_argument("--compute_dtype", default=None, help="replaces the config's compute_dtype")
    parser.add_argument("--data_dir", default=None, help="replaces the config's data_dir")
    parser.add_argument("--step", type=int, default=None, help="the model's step (default: the file's metadata)")
    args = parser.parse_args()
    if os.path.exists(args.workdir):
        sys.exit(f"{args.workdir} exists; choose a new --workdir")
    with open(args.config) as f:
        config = json.load(f)
    metadata = torch_weights.read_metadata(args.export)
    model_name, dataset = config["model"], config["dataset"]
    if metadata.get("model") not in (None, model_name) or metadata.get("dataset") not in (None, dataset):
        held = f"{metadata.get('model')} on {metadata.get('dataset')}"
        sys.exit(f"{args.export} holds a {held}, the config a {model_name} on {dataset}")
    width = config.get("model_width")
    kwargs = {"width": width} if model_name in networks.TAKES_WIDTH and width is not None else {}
    shapes = networks.create_model(
        model_name, dataset, cifar.NUM_CLASSES[dataset], normalize=networks.NO_NORMALIZATION, **kwargs
    )
    abstract = jax.eval_shape(lambda: networks.init_variables(shapes, jax.random.PRNGKey(0)))
    tensors = torch_weights.read_state_dict(args.export)
    params, batch_stats, found = torch_names.from_state_dict(model_name, tensors, *abstract, source=args.export)
    # The workdir's network normalizes with the dataset's statistics (`networks.create_model`'s
    # default); the exported file must record the same, else its logits would differ silently.
    torch_weights.matching_normalization(found, networks.DATASET_NORMALIZATION, dataset, args.export)
    for name, value in (("compute_dtype", args.compute_dtype), ("data_dir", args.data_dir)):
        if value is not None:
            config[name] = value
    if args.step is None and "step" not in metadata:
        sys.exit(f"{args.export} does not record its step: pass --step")
    step = int(metadata["step"]) if args.step is None else args.step
    os.makedirs(args.workdir)
    with open(os.path.join(args.workdir, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    params, batch_stats = jax.tree.map(lambda a: np.asarray(a, np.float32), (params, batch_stats))
    info = {k: metadata[k] for k in ("model", "dataset", "method", "seed") if k in metadata}
    path = kept_models.save(args.workdir, step, params, batch_stats, {**info, "source": args.export})
    print(f"wrote {path} (step {step}) and {args.workdir}/config.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
