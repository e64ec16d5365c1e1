#!/usr/bin/env python3
"""A patjax-trained run exported to PyTorch and attacked by torchattacks' PGD, beside patjax's pgd20.

  pip install torch==2.13.0 torchattacks==3.5.1
  python benchmarks/crosscheck/torchattacks_pgd.py --workdir=docs/results/table1_cpu/runs/cifar10_small_cnn/pgd_s0 \
      --num_examples=500 [--norm=l2 --eps=0.5 --alpha=0.125]

The run's model is written as a PyTorch state_dict by `python -m patjax.export` (a .pt file),
loaded strictly into patjax_torch.models' network, and attacked by torchattacks.PGD (L-inf,
eps 8/255, alpha 2/255, 20 steps, random start) or, with --norm=l2, torchattacks.PGDL2 (the L2
ball of radius --eps, steps of --alpha); patjax's `pgd20` evaluator (the same budget and
threat model) runs on the same images through `patjax.api.evaluate`. Prints one JSON line: both
robust accuracies, the images on which they disagree, and each wall time. The two draw
different random starts, so a few images may differ.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
import torchattacks

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)
from patjax import api  # noqa: E402
from patjax.core.errors import UserError  # noqa: E402
from patjax.data import cifar  # noqa: E402
from patjax.models import networks  # noqa: E402
from patjax.run import workdir as workdir_lib  # noqa: E402
from patjax_torch import models as torch_models  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workdir", required=True)
    p.add_argument("--num_examples", type=int, default=500)
    p.add_argument("--batch_size", type=int, default=250)
    p.add_argument("--norm", choices=("linf", "l2"), default="linf")
    p.add_argument("--eps", type=float, default=8 / 255)
    p.add_argument("--alpha", type=float, default=2 / 255)
    p.add_argument("--steps", type=int, default=20)
    a = p.parse_args()
    run, model_fns, state = workdir_lib.restore(a.workdir)
    model = run.model
    split = cifar.load_split(model.dataset, "test", None)
    images, labels = split.images[: a.num_examples], split.labels[: a.num_examples]

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "model.pt")
        export = [sys.executable, "-m", "patjax.export", f"--workdir={a.workdir}", f"--out={out}"]
        subprocess.run(export, check=True, cwd=REPO, env={**os.environ, "PYTHONPATH": REPO})
        kwargs = {"width": model.width} if model.name in networks.TAKES_WIDTH else {}
        net = torch_models.create_model(
            model.name, cifar.NUM_CLASSES[model.dataset], networks.DATASET_STATS[model.dataset], **kwargs
        )
        net.load_state_dict(torch.load(out, weights_only=True), strict=True)
    net.eval()
    x = torch.from_numpy(np.asarray(cifar.to_float(images))).permute(0, 3, 1, 2).contiguous()
    y = torch.from_numpy(labels.astype(np.int64))

    torch.manual_seed(0)
    attack_class = torchattacks.PGD if a.norm == "linf" else torchattacks.PGDL2
    attack = attack_class(net, eps=a.eps, alpha=a.alpha, steps=a.steps, random_start=True)
    start = time.perf_counter()
    robust_torch = []
    for i in range(0, len(y), a.batch_size):
        adv = attack(x[i : i + a.batch_size], y[i : i + a.batch_size])
        with torch.no_grad():
            robust_torch.append((net(adv).argmax(1) == y[i : i + a.batch_size]).numpy())
    torch_wall = time.perf_counter() - start
    robust_torch = np.concatenate(robust_torch)

    start = time.perf_counter()
    variables = {"params": state.params, "batch_stats": state.batch_stats}
    module = networks.create_model(model.name, model.dataset, cifar.NUM_CLASSES[model.dataset], **kwargs)
    threat = {"attack.norm": a.norm, "attack.eps": a.eps, "attack.step_size": a.alpha, "attack.steps": a.steps}
    res = api.evaluate((module, variables), images, labels, evaluators="pgd20", batch_size=a.batch_size, **threat)
    patjax_wall = time.perf_counter() - start
    robust_patjax = np.asarray(res["per_image"]["pgd20.robust"], bool)
    print(
        json.dumps(
            {
                "workdir": a.workdir,
                "num_examples": len(y),
                "norm": a.norm,
                "eps": a.eps,
                "alpha": a.alpha,
                "steps": a.steps,
                "torchattacks_pgd20_robust_accuracy": float(robust_torch.mean()),
                "patjax_pgd20_robust_accuracy": float(robust_patjax.mean()),
                "patjax_pgd20_interval": res["figures"]["pgd20"]["interval"],
                "images_disagreeing": int((robust_torch != robust_patjax).sum()),
                "torchattacks_wall_s": round(torch_wall, 1),
                "patjax_wall_s_with_compile": round(patjax_wall, 1),
                "torch_threads": torch.get_num_threads(),
            }
        )
    )


if __name__ == "__main__":
    try:
        main()
    except UserError as error:  # bad input: one line, not a traceback
        sys.exit(f"error: {error}")
