"""Tiny models for tests, with closed-form gradients; PyTorch networks made to look trained;
weights files cut short; a command line run as a user runs it."""

import os
import subprocess
import sys

import flax.linen as nn
import numpy as np
import pytest
from conftest import REPO
from safetensors import SafetensorError, safe_open


class Linear(nn.Module):
    """logits = flatten(x) @ W + b: gradients have closed forms."""

    num_classes: int = 3

    @nn.compact
    def __call__(self, x, train: bool = False):
        return nn.Dense(self.num_classes)(x.reshape(x.shape[0], -1))


def np_softmax(z):
    z = z - z.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


def np_cross_entropy(logits, labels):
    p = np_softmax(logits)
    return -np.log(p[np.arange(len(labels)), labels])


def trained_looking(torch, net, seed):
    """Random BatchNorm affine parameters and running statistics moved far from (0, 1) by
    train-mode passes, so that a swapped, transposed or dropped BatchNorm tensor shows."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.weight.copy_(1 + 0.3 * torch.randn(m.weight.shape, generator=gen))
                m.bias.copy_(0.2 * torch.randn(m.bias.shape, generator=gen))
                m.momentum = 0.5
            if isinstance(m, torch.nn.Linear):
                m.bias.copy_(0.1 * torch.randn(m.bias.shape, generator=gen))
        net.train()
        for _ in range(2):
            net(0.5 + 0.3 * torch.randn((8, 3, 32, 32), generator=gen))
    return net.eval()


def torch_logits(torch, net, x):
    with torch.no_grad():
        return net(torch.from_numpy(x).permute(0, 3, 1, 2).contiguous()).numpy()


def cut_short(path) -> str:
    """Truncates the .safetensors file `path` to half its bytes (a copy interrupted); returns the
    reason the safetensors library itself gives for refusing it."""
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)
    with pytest.raises(SafetensorError) as error:
        safe_open(path, framework="numpy")
    return str(error.value)


def run_module(module, *flags, timeout=300):
    """`python -m module flags...` from the repository root, its output captured."""
    return subprocess.run(
        [sys.executable, "-m", module, *flags], cwd=REPO, capture_output=True, text=True, timeout=timeout
    )
