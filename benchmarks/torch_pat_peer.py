#!/usr/bin/env python3
"""PAT's training step in plain eager PyTorch: the peer patjax is compared against.

Written from the paper's Algorithm 2 (Appendix A; the Langevin sampler is its Algorithm 1)
and from patjax's conventions, so that, given the same weights, data and randomness, one
step here computes what one `patjax.train.train_step` computes for method 'pat':

- models take NCHW images in [0, 1] and normalize them per channel as their first operation
  (patjax.models.Normalize); they are patjax_torch.models' small CNN and kuangliu CIFAR
  ResNet-18 (the PyTorch definitions of patjax.models), weights copied by patjax.torch_weights;
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
import os
import sys
import time
from typing import Iterable, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this checkout's packages
from patjax import torch_weights  # noqa: E402
from patjax.models import DATASET_STATS  # noqa: E402
from patjax_torch import models as torch_models  # noqa: E402

# ---------------------------------------------------------------------------------------
# Models


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


def create_model(name: str, num_classes: int = 10, width: int = 64, dataset: str = "cifar10") -> nn.Module:
    """patjax_torch.models' network (the PyTorch definitions of patjax.models) with this BatchNorm."""
    if name not in ("small_cnn", "resnet18"):
        raise ValueError(f"unknown model {name!r}; choose 'small_cnn' or 'resnet18'")
    kwargs = {} if name == "small_cnn" else {"width": width}
    return torch_models.create_model(name, num_classes, DATASET_STATS[dataset], norm_layer=BatchNorm, **kwargs)


def load_patjax_weights(model, params, batch_stats):
    """Copies patjax parameters and BatchNorm statistics into the model (patjax.torch_weights'
    names and layouts), keeping the model's own input normalization."""
    tensors = torch_weights.to_state_dict(model.patjax_name, params, batch_stats)
    own = {k: v for k, v in model.state_dict().items() if k in ("mu", "sigma")}
    model.load_state_dict({**own, **{k: torch.from_numpy(v) for k, v in tensors.items()}}, strict=True)


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
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="torch device")
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
    net = create_model(a.model, a.classes, a.width).to(a.device)
    optimizer = make_optimizer(net)
    if a.compile:
        net = torch.compile(net)
    x = torch.rand(a.batch, 3, 32, 32, device=a.device)
    y = torch.randint(0, a.classes, (a.batch,), device=a.device)
    first, step = time_steps(net, optimizer, x, y, LangevinSettings(steps=a.langevin_steps), a.iters)
    record = {
        "impl": "torch-eager" + ("+compile" if a.compile else ""),
        "model": a.model,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "device": torch.cuda.get_device_name() if a.device.startswith("cuda") else a.device,
        "tf32_conv": torch.backends.cudnn.allow_tf32,
        "tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
        "batch": a.batch,
        "langevin_steps": a.langevin_steps,
    }
    if a.model == "resnet18":
        record["width"] = a.width
    record.update(first_step_s=round(first, 3), median_step_s=round(step, 4), images_per_s=round(a.batch / step, 2))
    print(json.dumps(record))


if __name__ == "__main__":
    main()
