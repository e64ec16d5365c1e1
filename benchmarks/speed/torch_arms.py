"""What the benchmarks that time a patjax evaluator against a reference PyTorch loop share
(certify_speed.py, pr_speed.py): the committed small CNN in both frameworks, CIFAR-10's first
test images, and the two arms timed alternately.

The network is docs/results/table1_cpu/runs/cifar10_small_cnn/clean_s0 (clean training, 800
steps), restored as patjax restores a run, and its PyTorch copy (`torch_names.to_state_dict`
into patjax_torch's SmallCNN, normalization inside, in eval mode). Needs PyTorch.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KEPT_RUN = os.path.join(REPO, "docs/results/table1_cpu/runs/cifar10_small_cnn/clean_s0")


def reference(name: str):
    """A transcription of a reference in tests/ (`smoothing_reference`, `prbench_reference`)."""
    sys.path.insert(0, os.path.join(REPO, "tests"))
    return __import__(name)


def committed_small_cnn():
    """(model_fns, state, net): the committed small CNN in patjax and in PyTorch, same weights."""
    import torch

    from patjax.interop import torch_names
    from patjax.models import networks
    from patjax.run import workdir as workdir_lib
    from patjax_torch import models as torch_models

    _, model_fns, state = workdir_lib.restore(KEPT_RUN)
    normalize = networks.DATASET_STATS["cifar10"]
    net = torch_models.create_model("small_cnn", 10, normalize)
    state_dict = torch_names.to_state_dict("small_cnn", state.params, state.batch_stats, normalize)
    net.load_state_dict({k: torch.from_numpy(v) for k, v in state_dict.items()}, strict=True)
    return model_fns, state, net.eval()


def first_test_images(n: int):
    """CIFAR-10's first n test images (`cifar.find_data_dir`), as a `cifar.Split`."""
    from patjax.data import cifar

    split = cifar.load_split("cifar10", "test", cifar.find_data_dir())
    return cifar.Split(split.images[:n], split.labels[:n])


def as_torch(images):
    """8-bit NHWC images as PyTorch's (n, 3, H, W) float32 in [0, 1], the way patjax reads them."""
    import numpy as np
    import torch

    from patjax.data import cifar

    return torch.from_numpy(np.asarray(cifar.to_float(images)).transpose(0, 3, 1, 2).copy())


def alternate(patjax_arm, their_arm, rounds: int, images: int):
    """patjax's arm once to compile its pass (and run it), then each arm once per round, in turn
    (patjax, theirs, patjax, ...): ({arm: what its last call returned}, the timing record:
    warm-up, walls, images per second from the median walls, their ratio, and the machine's
    load and thread counts)."""
    import jax
    import torch

    start = time.perf_counter()
    patjax_arm()
    warmup_s = time.perf_counter() - start
    arms = {"patjax": patjax_arm, "theirs": their_arm}
    walls, outputs = {name: [] for name in arms}, {}
    for _ in range(rounds):
        for name, arm in arms.items():
            start = time.perf_counter()
            outputs[name] = arm()
            walls[name].append(time.perf_counter() - start)
    medians = {name: statistics.median(w) for name, w in walls.items()}
    return outputs, {
        "jax_devices": jax.device_count(),
        "torch_threads": torch.get_num_threads(),
        "load_average": [round(v, 2) for v in os.getloadavg()],
        "patjax_warmup_s": round(warmup_s, 2),
        "walls_s": {k: [round(w, 2) for w in v] for k, v in walls.items()},
        "images_per_s": {k: round(images / m, 3) for k, m in medians.items()},
        "speedup_patjax_over_theirs": round(medians["theirs"] / medians["patjax"], 2),
    }
