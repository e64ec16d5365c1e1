#!/usr/bin/env python3
"""PyTorch peer for the small CNN: ../shared/bench/torch_pat_reference.py with models.SmallCNN.

The PAT step (`pat_step`), optimizer, timing and JSON line are the reference script's own,
imported from it; only the network differs: three conv3x3(no bias)+BatchNorm+ReLU+max-pool(2)
stages with 32/64/128 channels, a global average pool and a linear head, as patjax's
`models.SmallCNN` (which also normalizes its input; that elementwise op is left out here).

  python benchmarks/torch_small_cnn_peer.py --batch 128 --langevin-steps 20 --iters 5
"""
import argparse
import importlib.util
import json
import os
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
REFERENCE = os.environ.get("PATJAX_TORCH_REFERENCE",
                           os.path.join(HERE, "..", "..", "shared", "bench", "torch_pat_reference.py"))


def load_reference():
    spec = importlib.util.spec_from_file_location("torch_pat_reference", REFERENCE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class SmallCNN(nn.Module):
    def __init__(self, widths=(32, 64, 128), num_classes=10):
        super().__init__()
        layers, cin = [], 3
        for w in widths:
            layers += [nn.Conv2d(cin, w, 3, 1, 1, bias=False), nn.BatchNorm2d(w), nn.ReLU(), nn.MaxPool2d(2)]
            cin = w
        self.features = nn.Sequential(*layers)
        self.linear = nn.Linear(cin, num_classes)

    def forward(self, x):
        return self.linear(self.features(x).mean((2, 3)))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--langevin-steps", type=int, default=20)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--iters", type=int, default=3, help="timed steps after one warm-up step")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch default)")
    a = p.parse_args()
    reference = load_reference()
    if a.threads:
        torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = SmallCNN(num_classes=a.classes)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, nesterov=True, weight_decay=5e-4)
    x = torch.rand(a.batch, 3, 32, 32)
    y = torch.randint(0, a.classes, (a.batch,))
    t0 = time.perf_counter()
    reference.pat_step(model, opt, x, y, a.langevin_steps)
    first = time.perf_counter() - t0
    times = []
    for _ in range(a.iters):
        t0 = time.perf_counter()
        reference.pat_step(model, opt, x, y, a.langevin_steps)
        times.append(time.perf_counter() - t0)
    times.sort()
    step = times[len(times) // 2]
    print(json.dumps({"impl": "torch-eager", "model": "small_cnn", "torch": torch.__version__,
                      "threads": torch.get_num_threads(), "batch": a.batch, "langevin_steps": a.langevin_steps,
                      "first_step_s": round(first, 3), "median_step_s": round(step, 4),
                      "images_per_s": round(a.batch / step, 2)}))


if __name__ == "__main__":
    main()
