#!/usr/bin/env python3
"""PAT's training step in PyTorch, eager or compiled: the peers patjax is compared against.

Written from the paper's Algorithm 2 (Appendix A; the Langevin sampler is its Algorithm 1)
and from patjax's conventions, so that, given the same weights, data and randomness, one
step here computes what one `patjax.run.train.train_step` computes for method 'pat':

- models take NCHW images in [0, 1] and normalize them per channel as their first operation
  (patjax.models.networks.Normalize); they are patjax_torch.models' small CNN and kuangliu CIFAR
  ResNet-18 (the PyTorch definitions of patjax.models.networks), weights copied by patjax.interop.torch_names;
- BatchNorm as Flax's: momentum 0.1 on the running statistics (Flax's 0.9 is the kept
  fraction), eps 1e-5, and the running variance updated with the *biased* batch variance
  (torch.nn.BatchNorm2d would use the unbiased one), the statistics taken in float32;
- the sampler runs the model in inference mode (running statistics, no update), as
  patjax's default `langevin.bn_mode = 'inference'`;
- SGD with Nesterov momentum and weight decay coupled into the gradient: torch.optim.SGD's
  rule is patjax.run.optimizer_lib.make_optimizer's.

Two ways to run the same step (`Execution`, the flags of the command line):

- eager (the default): what a user writes first; the sampler's input gradient comes from
  torch.autograd.grad, every kernel is issued from Python;
- compiled (`--compile`): the strongest PyTorch a user would write today (the recipe of the
  fastest CIFAR trainers): `torch.compile` of one sampler step as one graph (noise, projection,
  the energy's input gradient by torch.func.grad, clipped descent), of the update's forward
  pass and SNIS-weighted loss (its backward compiled with it by AOTAutograd), and of the
  optimizer step; `--compile-mode` is torch.compile's mode (reduce-overhead: CUDA graphs).

Either takes `--channels-last` (model and images NHWC in memory, the layout cuDNN's tensor-core
kernels want) and `--compute-dtype bfloat16` (the model under bf16 autocast, where patjax's
compute_dtype=bfloat16 runs its model in bf16; the logits are cast to float32 as patjax's
models cast theirs, and the sampler's iterate stays float32 in both).

`Peer` takes the sampler's start and noise as tensors (`Peer.chain`), so that a test can feed
both implementations the same randomness; `Peer.sample` and `Peer.step` draw them with
torch's generator for benchmarking. Run as a script, it times steps on random CIFAR-shaped
data and prints one JSON line:

  pip install torch==2.13.0
  python benchmarks/speed/torch_pat_peer.py --model resnet18 --batch 32 --langevin-steps 10 --width 64 --iters 3
  python benchmarks/speed/torch_pat_peer.py --batch 32 --langevin-steps 10 --iters 3 --compile --channels-last
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import json
import os
import sys
import time
from typing import Iterable, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(
    0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
)  # this checkout's packages
from patjax.interop import torch_names  # noqa: E402
from patjax.models.networks import DATASET_STATS  # noqa: E402
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
            var, mean = torch.var_mean(x.float(), (0, 2, 3), correction=0)  # Flax reduces in float32
            self.running_mean.lerp_(mean, self.momentum)
            self.running_var.lerp_(var, self.momentum)
        return F.batch_norm(x, None, None, self.weight, self.bias, True, 0.0, self.eps)


def create_model(name: str, num_classes: int = 10, width: int = 64, dataset: str = "cifar10") -> nn.Module:
    """patjax_torch.models' network (the PyTorch definitions of patjax.models.networks) with this BatchNorm."""
    if name not in ("small_cnn", "resnet18"):
        raise ValueError(f"unknown model {name!r}; choose 'small_cnn' or 'resnet18'")
    kwargs = {} if name == "small_cnn" else {"width": width}
    return torch_models.create_model(name, num_classes, DATASET_STATS[dataset], norm_layer=BatchNorm, **kwargs)


def load_patjax_weights(model, params, batch_stats):
    """Copies patjax parameters and BatchNorm statistics into the model (patjax.interop.torch_names'
    names and layouts), keeping the model's own input normalization."""
    tensors = torch_names.to_state_dict(model.patjax_name, params, batch_stats)
    own = {k: v for k, v in model.state_dict().items() if k in ("mu", "sigma")}
    model.load_state_dict({**own, **{k: torch.from_numpy(v) for k, v in tensors.items()}}, strict=True)


def make_optimizer(
    model: nn.Module, lr: float = 0.01, momentum: float = 0.9, weight_decay: float = 5e-4
) -> torch.optim.Optimizer:
    """Appendix E: SGD, Nesterov momentum 0.9, weight decay 5e-4 added to the gradient."""
    return torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum, nesterov=True, weight_decay=weight_decay)


# ---------------------------------------------------------------------------------------
# How the step runs


COMPUTE_DTYPES = {"float32": None, "bfloat16": torch.bfloat16}  # the model's autocast dtype


@dataclasses.dataclass(frozen=True)
class Execution:
    """Eager or compiled, memory layout, and the model's precision (the module docstring)."""

    compile: bool = False
    compile_mode: Optional[str] = None  # torch.compile's mode; None: its default
    channels_last: bool = False
    compute_dtype: str = "float32"

    def __post_init__(self):
        if self.compute_dtype not in COMPUTE_DTYPES:
            raise ValueError(f"compute_dtype must be one of {sorted(COMPUTE_DTYPES)}, got {self.compute_dtype!r}")
        if self.compile_mode is not None and not self.compile:
            raise ValueError("compile_mode needs compile=True")

    @property
    def name(self) -> str:
        """'torch-eager' or 'torch-compile', then '+<mode>', '+channels-last', '+bf16' as set."""
        parts = ["torch-compile" if self.compile else "torch-eager"]
        if self.compile_mode:
            parts.append(self.compile_mode)
        if self.channels_last:
            parts.append("channels-last")
        if self.compute_dtype == "bfloat16":
            parts.append("bf16")
        return "+".join(parts)


def logits(model: nn.Module, x, autocast_dtype=None):
    """The model's float32 logits, its body under autocast to `autocast_dtype` (None: none)."""
    context = contextlib.nullcontext() if autocast_dtype is None else torch.autocast(x.device.type, autocast_dtype)
    with context:
        return model(x).float()


# ---------------------------------------------------------------------------------------
# Phase 1: the Langevin sampler (Algorithm 2, lines 7-14)


@dataclasses.dataclass(frozen=True)
class LangevinSettings:
    """T, eta, sigma, rho, c1, c2 (Appendix E defaults; names as patjax.pat.langevin')."""

    steps: int = 100
    step_size: float = 0.3
    noise_scale: float = 0.001
    grad_clip: float = 1.0
    c1: float = 0.3
    c2: float = 0.42


def langevin_energy(model: nn.Module, x_adv, x, y, c1: float, c2: float, autocast_dtype=None):
    """Batch energy, line 11: sum_i c1 ||x_adv_i - x_i||^2 - c2 CE(f(x_adv_i), y_i)."""
    squared_distance = (x_adv - x).square().sum((1, 2, 3))
    cross_entropy = F.cross_entropy(logits(model, x_adv, autocast_dtype), y, reduction="none")
    return (c1 * squared_distance - c2 * cross_entropy).sum()


def autograd_input_gradient(energy, z):
    """d energy / d z by torch.autograd.grad: the eager way."""
    with torch.enable_grad():
        z = z.detach().requires_grad_(True)
        (grad,) = torch.autograd.grad(energy(z), z)
    return grad


def func_input_gradient(energy, z):
    """d energy / d z by torch.func.grad, which torch.compile traces into the step's one graph
    (torch.autograd.grad would break the graph there)."""
    return torch.func.grad(energy)(z)


def langevin_step(
    model: nn.Module, x_adv, x, y, noise, s: LangevinSettings, autocast_dtype=None, gradient=autograd_input_gradient
):
    """One step, lines 9-13: noise, projection, clipped energy gradient, projected descent."""
    noisy = (x_adv + s.noise_scale * noise).clamp(0.0, 1.0)  # line 10
    grad = gradient(lambda z: langevin_energy(model, z, x, y, s.c1, s.c2, autocast_dtype), noisy)  # line 11
    v = grad.clamp(-s.grad_clip, s.grad_clip)  # line 12
    return (noisy.detach() - s.step_size * v).clamp(0.0, 1.0)  # line 13


# ---------------------------------------------------------------------------------------
# Phase 2: the SNIS-weighted update (Algorithm 2, lines 16-20)


def snis_weights(losses, beta: float):
    """Lines 17-18: softmax over the batch of Detach(-beta * l)."""
    return torch.softmax(-beta * losses.detach(), dim=0)


def weighted_loss(losses, beta: float):
    """(sum_i w_i l_i, w), line 19."""
    weights = snis_weights(losses, beta)
    return (weights * losses).sum(), weights


# ---------------------------------------------------------------------------------------
# The step


class Peer:
    """Algorithm 2 on one model and its optimizer, run as `execution` says.

    With `execution.channels_last` the model is converted in place. `optimizer` may be None
    for a peer that only samples.
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: Optional[torch.optim.Optimizer],
        settings: LangevinSettings,
        beta: float = 0.001,
        execution: Execution = Execution(),
    ):
        self.model, self.optimizer, self.settings, self.execution = model, optimizer, settings, execution
        autocast_dtype = COMPUTE_DTYPES[execution.compute_dtype]
        gradient = func_input_gradient if execution.compile else autograd_input_gradient
        if execution.channels_last:
            model.to(memory_format=torch.channels_last)

        def sampler_step(x_adv, x, y, noise):
            # no_grad outside: the sample is a constant to the update (Detach in Algorithm 2), so
            # the compiled graph keeps nothing for a gradient through the parameters; the input
            # gradient inside is taken all the same (func.grad ignores an outer no_grad,
            # autograd_input_gradient enables grad for it).
            with torch.no_grad():
                return langevin_step(model, x_adv, x, y, noise, settings, autocast_dtype, gradient)

        def update_loss(x_adv, y):
            losses = F.cross_entropy(logits(model, x_adv, autocast_dtype), y, reduction="none")  # line 16
            return weighted_loss(losses, beta)[0]

        optimizer_step = optimizer.step if optimizer is not None else None
        if execution.compile:
            # dynamic=False: one batch shape throughout, so specialize on it as a user would.
            sampler_step = torch.compile(sampler_step, fullgraph=True, dynamic=False, mode=execution.compile_mode)
            update_loss = torch.compile(update_loss, fullgraph=True, dynamic=False, mode=execution.compile_mode)
            if optimizer is not None:
                optimizer_step = torch.compile(optimizer.step, dynamic=False, mode=execution.compile_mode)
        self._sampler_step, self._update_loss, self._optimizer_step = sampler_step, update_loss, optimizer_step

    def layout(self, images):
        """`images` (N, C, H, W) in the execution's memory format."""
        return images.contiguous(memory_format=torch.channels_last) if self.execution.channels_last else images

    def chain(self, x, y, start, noises: Iterable[torch.Tensor]):
        """x_adv after one step per tensor of `noises` from `start`, BatchNorm in inference mode.

        The model's training flag is restored afterwards; running statistics are not touched.
        """
        was_training = self.model.training
        self.model.eval()
        try:
            x, x_adv = self.layout(x), self.layout(start.detach())
            for noise in noises:
                x_adv = self._sampler_step(x_adv, x, y, self.layout(noise))
        finally:
            self.model.train(was_training)
        return x_adv.detach()

    def sample(self, x, y, generator: Optional[torch.Generator] = None):
        """The sampler with torch's draws: start ~ Uniform[0,1]^d (line 7), z_t ~ N(0, I) (line 9)."""
        x = self.layout(x)
        start = torch.empty_like(x).uniform_(generator=generator)
        noises = (torch.empty_like(x).normal_(generator=generator) for _ in range(self.settings.steps))
        return self.chain(x, y, start, noises)

    def update(self, x_adv, y):
        """Training-mode pass on x_adv (one running-statistics update), weighted loss, one SGD
        step (line 20); returns the weighted loss."""
        self.model.train()
        loss = self._update_loss(self.layout(x_adv), y)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self._optimizer_step()
        return loss.detach()

    def step_from(self, x, y, start, noises):
        """One PAT step with the sampler's start and noise given; returns the weighted loss."""
        return self.update(self.chain(x, y, start, noises), y)

    def step(self, x, y, generator: Optional[torch.Generator] = None):
        """One PAT step with the sampler's randomness drawn from torch's generator."""
        return self.update(self.sample(x, y, generator), y)


# ---------------------------------------------------------------------------------------
# Benchmark


def time_steps(peer: Peer, x, y, iters: int, warmup: int):
    """(first step's seconds, median seconds of `iters` steps after `warmup` steps); the first
    step includes torch.compile's compilation, the second a recompilation of the optimizer
    step (its momentum buffers exist from then on)."""
    times = []
    for _ in range(max(warmup, 1) + iters):
        t0 = time.perf_counter()
        peer.step(x, y).item()
        times.append(time.perf_counter() - t0)
    timed = sorted(times[max(warmup, 1) :])
    return times[0], timed[len(timed) // 2]


def disagreement_with_eager(model: nn.Module, peer: Peer, x, y, steps: int) -> float:
    """Largest |x_adv - x_adv'| between `peer`'s sampler and the eager float32 sampler on a
    copy of `model` (taken before `peer` was built from it), same start and noise, `steps`
    steps: a check on the device the timing ran on that the compiled step still computes
    the eager one (to TF32 rounding where the device uses it)."""
    generator = torch.Generator(x.device).manual_seed(1)
    start = torch.rand(x.shape, generator=generator, device=x.device)
    noises = [torch.randn(x.shape, generator=generator, device=x.device) for _ in range(steps)]
    settings = dataclasses.replace(peer.settings, steps=steps)
    eager = Peer(model, None, settings).chain(x, y, start, noises)
    return float((peer.chain(x, y, start, noises) - eager).abs().max())


def parse_args(argv=None, model: Optional[str] = None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    if model is None:
        p.add_argument("--model", default="resnet18", choices=("resnet18", "small_cnn"))
        p.add_argument("--width", type=int, default=64, help="ResNet-18 stem width")
    p.add_argument("--batch", type=int, default=32 if model is None else 128)
    p.add_argument("--langevin-steps", type=int, default=10 if model is None else 20)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--iters", type=int, default=3, help="timed steps after --warmup steps")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps first (at least 1)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch default)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="torch device")
    p.add_argument("--compile", action="store_true", help="torch.compile the sampler step, update and optimizer")
    p.add_argument("--compile-mode", default=None, help="torch.compile's mode (e.g. reduce-overhead: CUDA graphs)")
    p.add_argument("--channels-last", action="store_true", help="model and images NHWC in memory")
    p.add_argument("--compute-dtype", default="float32", choices=sorted(COMPUTE_DTYPES), help="bfloat16: autocast")
    p.add_argument(
        "--check-steps",
        type=int,
        default=0,
        help="if > 0 and not eager float32: also report the sampler's largest difference from the eager "
        "float32 sampler after this many steps on the same start and noise",
    )
    a = p.parse_args(argv)
    if model is not None:
        a.model, a.width = model, 64
    if a.compile_mode is not None and not a.compile:
        p.error("--compile-mode needs --compile")
    return a


def main(argv=None, model: Optional[str] = None):
    """Times `Peer.step` on random CIFAR-shaped data and prints one JSON line."""
    a = parse_args(argv, model)
    if a.threads:
        torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    net = create_model(a.model, a.classes, a.width).to(a.device)
    execution = Execution(a.compile, a.compile_mode, a.channels_last, a.compute_dtype)
    reference = copy.deepcopy(net) if a.check_steps > 0 and execution != Execution() else None
    settings = LangevinSettings(steps=a.langevin_steps)
    peer = Peer(net, make_optimizer(net), settings, execution=execution)
    x = torch.rand(a.batch, 3, 32, 32, device=a.device)
    y = torch.randint(0, a.classes, (a.batch,), device=a.device)
    record = {
        "impl": execution.name,
        "model": a.model,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "device": torch.cuda.get_device_name() if a.device.startswith("cuda") else a.device,
        "tf32_conv": torch.backends.cudnn.allow_tf32,
        "tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
        "batch": a.batch,
        "langevin_steps": a.langevin_steps,
        "compute_dtype": a.compute_dtype,
    }
    if a.model == "resnet18":
        record["width"] = a.width
    if reference is not None:
        # Before the timed steps change the weights the copy was taken with.
        record["max_abs_diff_from_eager_fp32_sampler"] = disagreement_with_eager(reference, peer, x, y, a.check_steps)
        record["check_steps"] = a.check_steps
    first, step = time_steps(peer, x, y, a.iters, a.warmup)
    record.update(first_step_s=round(first, 3), median_step_s=round(step, 4), images_per_s=round(a.batch / step, 2))
    print(json.dumps(record))


if __name__ == "__main__":
    main()
