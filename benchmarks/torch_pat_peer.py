#!/usr/bin/env python3
"""PAT's training step in plain eager PyTorch: the peer patjax is compared against.

Written from the paper's Algorithm 2 (Appendix A; the Langevin sampler is its Algorithm 1)
and from patjax's conventions, so that, given the same weights, data and randomness, one
step here computes what one `patjax.train.train_step` computes for method 'pat':

- models take NCHW images in [0, 1] and normalize them per channel as their first operation
  (patjax.models.Normalize); `SmallCNN` is patjax's small CNN, `ResNet18` the kuangliu CIFAR
  ResNet-18 of patjax.models;
- BatchNorm as Flax's: momentum 0.1 on the running statistics (Flax's 0.9 is the kept
  fraction), eps 1e-5, and the running variance updated with the *biased* batch variance
  (torch.nn.BatchNorm2d would use the unbiased one);
- the sampler runs the model in inference mode (running statistics, no update), as
  patjax's default `langevin.bn_mode = 'inference'`;
- SGD with Nesterov momentum and weight decay coupled into the gradient: torch.optim.SGD's
  rule is patjax.state.make_optimizer's.

The sampler takes its start and its noise as tensors (`langevin_chain`), so that a test can
feed both implementations the same randomness; `langevin_sample` and `pat_step` draw them
with torch's generator for benchmarking. Run as a script, it times steps on random
CIFAR-shaped data and prints one JSON line:

  pip install torch==2.13.0
  python benchmarks/torch_pat_peer.py --model resnet18 --batch 32 --langevin-steps 10 --width 64 --iters 3
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from typing import Iterable, Optional, Sequence

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

# Per-channel statistics of the training splits, as patjax.models.DATASET_STATS.
DATASET_STATS = {
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "cifar100": ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
}


# ---------------------------------------------------------------------------------------
# Models


class Normalize(nn.Module):
    """(x - mean) / std per channel of an NCHW batch."""

    def __init__(self, mean: Sequence[float], std: Sequence[float]):
        super().__init__()
        self.register_buffer("mean", torch.tensor(mean).view(1, -1, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(std).view(1, -1, 1, 1), persistent=False)

    def forward(self, x):
        return (x - self.mean) / self.std


class BatchNorm(nn.BatchNorm2d):
    """BatchNorm2d with Flax's running-variance update (biased batch variance)."""

    def __init__(self, channels: int):
        super().__init__(channels, eps=1e-5, momentum=0.1)

    def forward(self, x):
        if not self.training:
            return F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias, False, 0.0, self.eps)
        with torch.no_grad():
            var, mean = torch.var_mean(x, (0, 2, 3), correction=0)
            self.running_mean.lerp_(mean, self.momentum)
            self.running_var.lerp_(var, self.momentum)
        return F.batch_norm(x, None, None, self.weight, self.bias, True, 0.0, self.eps)


def conv3x3(cin: int, cout: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(cin, cout, 3, stride, 1, bias=False)


def init_like_patjax(model: nn.Module) -> nn.Module:
    """Convolutions drawn as patjax's (Kaiming normal, fan_out, ReLU gain); the rest torch's."""
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
    return model


class SmallCNN(nn.Module):
    """patjax.models.SmallCNN: three conv3x3(no bias)+BN+ReLU+max-pool(2) stages, mean pool, linear."""

    def __init__(self, num_classes: int = 10, dataset: str = "cifar10", widths=(32, 64, 128)):
        super().__init__()
        self.normalize = Normalize(*DATASET_STATS[dataset])
        layers, cin = [], 3
        for w in widths:
            layers += [conv3x3(cin, w), BatchNorm(w), nn.ReLU(), nn.MaxPool2d(2)]
            cin = w
        self.features = nn.Sequential(*layers)
        self.linear = nn.Linear(cin, num_classes)
        init_like_patjax(self)

    def forward(self, x):
        return self.linear(self.features(self.normalize(x)).mean((2, 3)))


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1, self.bn1 = conv3x3(cin, cout, stride), BatchNorm(cout)
        self.conv2, self.bn2 = conv3x3(cout, cout), BatchNorm(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), BatchNorm(cout))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + self.shortcut(x))


class ResNet18(nn.Module):
    """patjax.models.ResNet18 (kuangliu's CIFAR form): 3x3 stem, 4 stages of 2 BasicBlocks."""

    def __init__(self, width: int = 64, num_classes: int = 10, dataset: str = "cifar10"):
        super().__init__()
        w = width
        self.normalize = Normalize(*DATASET_STATS[dataset])
        self.conv1, self.bn1 = conv3x3(3, w), BatchNorm(w)
        plan = [
            (w, w, 1),
            (w, w, 1),
            (w, 2 * w, 2),
            (2 * w, 2 * w, 1),
            (2 * w, 4 * w, 2),
            (4 * w, 4 * w, 1),
            (4 * w, 8 * w, 2),
            (8 * w, 8 * w, 1),
        ]
        self.blocks = nn.Sequential(*[BasicBlock(*p) for p in plan])
        self.linear = nn.Linear(8 * w, num_classes)
        init_like_patjax(self)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(self.normalize(x))))
        x = self.blocks(x)
        return self.linear(x.mean((2, 3)))


def create_model(name: str, num_classes: int = 10, width: int = 64, dataset: str = "cifar10") -> nn.Module:
    if name == "small_cnn":
        return SmallCNN(num_classes, dataset)
    if name == "resnet18":
        return ResNet18(width, num_classes, dataset)
    raise ValueError(f"unknown model {name!r}; choose 'small_cnn' or 'resnet18'")


def layer_pairs(model):
    """[(patjax module path, torch module)] for the peer's SmallCNN or ResNet18."""
    if isinstance(model, SmallCNN):
        convs = [m for m in model.features if isinstance(m, torch.nn.Conv2d)]
        norms = [m for m in model.features if isinstance(m, torch.nn.BatchNorm2d)]
        pairs = [((f"Conv_{i}",), m) for i, m in enumerate(convs)]
        pairs += [((f"BatchNorm_{i}",), m) for i, m in enumerate(norms)]
    else:
        pairs = [(("Conv_0",), model.conv1), (("BatchNorm_0",), model.bn1)]
        for i, block in enumerate(model.blocks):
            names = {"Conv_0": block.conv1, "BatchNorm_0": block.bn1, "Conv_1": block.conv2, "BatchNorm_1": block.bn2}
            if len(block.shortcut):
                names.update(shortcut_conv=block.shortcut[0], shortcut_bn=block.shortcut[1])
            pairs += [((f"BasicBlock_{i}", name), m) for name, m in names.items()]
    return pairs + [(("Dense_0",), model.linear)]


def subtree(tree, path):
    for name in path:
        tree = tree[name]
    return tree


def load_patjax_weights(model, params, batch_stats):
    """Copies patjax parameters and BatchNorm statistics (Flax names, HWIO kernels) into the model."""

    def t(a):
        return torch.from_numpy(np.array(a, np.float32))

    with torch.no_grad():
        for path, m in layer_pairs(model):
            p = subtree(params, path)
            if isinstance(m, torch.nn.Conv2d):
                m.weight.copy_(t(p["kernel"]).permute(3, 2, 0, 1))  # HWIO -> OIHW
            elif isinstance(m, torch.nn.Linear):
                m.weight.copy_(t(p["kernel"]).T)  # (in, out) -> (out, in)
                m.bias.copy_(t(p["bias"]))
            else:
                stats = subtree(batch_stats, path)
                m.weight.copy_(t(p["scale"]))
                m.bias.copy_(t(p["bias"]))
                m.running_mean.copy_(t(stats["mean"]))
                m.running_var.copy_(t(stats["var"]))


def make_optimizer(
    model: nn.Module, lr: float = 0.01, momentum: float = 0.9, weight_decay: float = 5e-4
) -> torch.optim.Optimizer:
    """Appendix E: SGD, Nesterov momentum 0.9, weight decay 5e-4 added to the gradient."""
    return torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum, nesterov=True, weight_decay=weight_decay)


# ---------------------------------------------------------------------------------------
# Phase 1: the Langevin sampler (Algorithm 2, lines 7-14)


@dataclasses.dataclass(frozen=True)
class LangevinSettings:
    """T, eta, sigma, rho, c1, c2 (Appendix E defaults; names as patjax.samplers')."""

    steps: int = 100
    step_size: float = 0.3
    noise_scale: float = 0.001
    grad_clip: float = 1.0
    c1: float = 0.3
    c2: float = 0.42


def langevin_energy(model: nn.Module, x_adv, x, y, c1: float, c2: float):
    """Batch energy, line 11: sum_i c1 ||x_adv_i - x_i||^2 - c2 CE(f(x_adv_i), y_i)."""
    squared_distance = (x_adv - x).square().sum((1, 2, 3))
    cross_entropy = F.cross_entropy(model(x_adv), y, reduction="none")
    return (c1 * squared_distance - c2 * cross_entropy).sum()


def langevin_step(model: nn.Module, x_adv, x, y, noise, s: LangevinSettings):
    """One step, lines 9-13: noise, projection, clipped energy gradient, projected descent."""
    noisy = (x_adv + s.noise_scale * noise).clamp(0.0, 1.0).requires_grad_(True)  # line 10
    (grad,) = torch.autograd.grad(langevin_energy(model, noisy, x, y, s.c1, s.c2), noisy)
    v = grad.clamp(-s.grad_clip, s.grad_clip)  # line 12
    return (noisy.detach() - s.step_size * v).clamp(0.0, 1.0)  # line 13


def langevin_chain(model: nn.Module, x, y, start, noises: Iterable[torch.Tensor], s: LangevinSettings):
    """x_adv after one step per tensor of `noises` from `start`, BatchNorm in inference mode.

    The model's training flag is restored afterwards; running statistics are not touched.
    """
    was_training = model.training
    model.eval()
    try:
        x_adv = start.detach()
        for noise in noises:
            x_adv = langevin_step(model, x_adv, x, y, noise, s)
    finally:
        model.train(was_training)
    return x_adv.detach()


def langevin_sample(model: nn.Module, x, y, s: LangevinSettings, generator: Optional[torch.Generator] = None):
    """The sampler with torch's draws: start ~ Uniform[0,1]^d (line 7), z_t ~ N(0, I) (line 9)."""
    draw = dict(generator=generator, dtype=x.dtype, device=x.device)
    start = torch.rand(x.shape, **draw)
    noises = (torch.randn(x.shape, **draw) for _ in range(s.steps))
    return langevin_chain(model, x, y, start, noises, s)


# ---------------------------------------------------------------------------------------
# Phase 2: the SNIS-weighted update (Algorithm 2, lines 16-20)


def snis_weights(losses, beta: float):
    """Lines 17-18: softmax over the batch of Detach(-beta * l)."""
    return torch.softmax(-beta * losses.detach(), dim=0)


def weighted_loss(losses, beta: float):
    """(sum_i w_i l_i, w), line 19."""
    weights = snis_weights(losses, beta)
    return (weights * losses).sum(), weights


def pat_update(model: nn.Module, optimizer: torch.optim.Optimizer, x_adv, y, beta: float):
    """Training-mode pass on x_adv (one running-statistics update), weighted loss, one SGD step."""
    model.train()
    losses = F.cross_entropy(model(x_adv), y, reduction="none")  # line 16
    loss, _ = weighted_loss(losses, beta)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()  # line 20
    return loss.detach()


def pat_step_from(model, optimizer, x, y, start, noises, settings: LangevinSettings, beta: float = 0.001):
    """One PAT step with the sampler's start and noise given; returns the weighted loss."""
    x_adv = langevin_chain(model, x, y, start, noises, settings)
    return pat_update(model, optimizer, x_adv, y, beta)


def pat_step(
    model, optimizer, x, y, settings: LangevinSettings, beta: float = 0.001, generator: Optional[torch.Generator] = None
):
    """One PAT step with the sampler's randomness drawn from torch's generator."""
    x_adv = langevin_sample(model, x, y, settings, generator)
    return pat_update(model, optimizer, x_adv, y, beta)


# ---------------------------------------------------------------------------------------
# Benchmark


def time_steps(model, optimizer, x, y, settings: LangevinSettings, iters: int):
    """(first step's seconds, median seconds of `iters` further steps)."""
    t0 = time.perf_counter()
    pat_step(model, optimizer, x, y, settings).item()
    first = time.perf_counter() - t0
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        pat_step(model, optimizer, x, y, settings).item()
        times.append(time.perf_counter() - t0)
    times.sort()
    return first, times[len(times) // 2]


def parse_args(argv=None, model: Optional[str] = None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    if model is None:
        p.add_argument("--model", default="resnet18", choices=("resnet18", "small_cnn"))
        p.add_argument("--width", type=int, default=64, help="ResNet-18 stem width")
        p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--batch", type=int, default=32 if model is None else 128)
    p.add_argument("--langevin-steps", type=int, default=10 if model is None else 20)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--iters", type=int, default=3, help="timed steps after one warm-up step")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch default)")
    a = p.parse_args(argv)
    if model is not None:
        a.model, a.width, a.compile = model, 64, False
    return a


def main(argv=None, model: Optional[str] = None):
    """Times `pat_step` on random CIFAR-shaped data and prints one JSON line."""
    a = parse_args(argv, model)
    if a.threads:
        torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    net = create_model(a.model, a.classes, a.width)
    optimizer = make_optimizer(net)
    if a.compile:
        net = torch.compile(net)
    x = torch.rand(a.batch, 3, 32, 32)
    y = torch.randint(0, a.classes, (a.batch,))
    first, step = time_steps(net, optimizer, x, y, LangevinSettings(steps=a.langevin_steps), a.iters)
    record = {
        "impl": "torch-eager" + ("+compile" if a.compile else ""),
        "model": a.model,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "batch": a.batch,
        "langevin_steps": a.langevin_steps,
    }
    if a.model == "resnet18":
        record["width"] = a.width
    record.update(first_step_s=round(first, 3), median_step_s=round(step, 4), images_per_s=round(a.batch / step, 2))
    print(json.dumps(record))


if __name__ == "__main__":
    main()
