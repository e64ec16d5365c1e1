"""patjax's networks (patjax.models.networks) in PyTorch: the same layers, the same state_dict names as the
reference definitions they follow, NCHW images in [0, 1].

- `SmallCNN`: patjax's small CNN (three conv3x3 + BN + ReLU + max-pool(2) stages, mean pool, linear).
- `ResNet18`: kuangliu's pytorch-cifar ResNet-18 (also RobustBench's `ResNet18`): names conv1,
  bn1, layer1.0.conv1, ..., layerN.0.shortcut.{0,1}, linear.
- `PreActResNet18`: Wong et al.'s / Rice et al.'s (RobustBench's `PreActResNet(PreActBlockV2,
  [2, 2, 2, 2], bn_before_fc=True)`; kuangliu's blocks plus a final BatchNorm, which kuangliu's
  own PreActResNet18 lacks): conv1, layerN.M.{bn1,conv1,bn2,conv2,shortcut.0}, bn, linear; with
  v1=True RobustBench's `PreActResNet(PreActBlock, [2, 2, 2, 2])` (`preact_resnet18_v1`: the
  shortcut reads the raw block input, no `bn`).
- `WideResNet`: the TRADES / RobustBench WideResNet (dropout 0, `sub_block1=False`): conv1,
  blockN.layer.M.{bn1,conv1,bn2,conv2,convShortcut}, bn1, fc.
- `WideResNet50_2`: torchvision's wide_resnet50_2 with patjax's CIFAR stem (3x3 stride-1 conv, no
  max-pool): conv1, bn1, layerN.M.{conv1..3,bn1..3,downsample.{0,1}}, fc.

`normalize`: (mean, std) per channel, kept as the persistent buffers `mu` and `sigma` (the
names RobustBench gives a model's own normalization) and applied first; None: the network takes
[0, 1] inputs as they are, as RobustBench's models do. Because the buffers are in the
state_dict, a normalizing model's weights do not load silently into a network that does not
normalize (load_state_dict reports unexpected keys mu and sigma).

`norm_layer`: the BatchNorm class (torchvision's convention); torch.nn.BatchNorm2d by default.
In inference mode every BatchNorm computes what Flax's does (eps 1e-5, running statistics);
benchmarks/speed/torch_pat_peer.py passes its own class for Flax's training-mode update.
"""

from __future__ import annotations

import functools
from typing import Callable, Optional, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

NormLayer = Callable[[int], nn.Module]


class _Classifier(nn.Module):
    """The input normalization every network here shares (or none)."""

    patjax_name: str

    def __init__(self, normalize: Optional[tuple[Sequence[float], Sequence[float]]]):
        super().__init__()
        if normalize is not None:
            mean, std = normalize
            self.register_buffer("mu", torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1))
            self.register_buffer("sigma", torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1))

    def inputs(self, x):
        return (x - self.mu) / self.sigma if hasattr(self, "mu") else x


def conv3x3(cin: int, cout: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(cin, cout, 3, stride, 1, bias=False)


def conv1x1(cin: int, cout: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(cin, cout, 1, stride, 0, bias=False)


def init_like_patjax(model: nn.Module) -> nn.Module:
    """Convolutions drawn as patjax's and the WRN reference's (Kaiming normal, fan_out, ReLU
    gain: normal(0, sqrt(2 / (k * k * out_channels)))); the rest torch's defaults."""
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
    return model


class SmallCNN(_Classifier):
    patjax_name = "small_cnn"

    def __init__(self, num_classes=10, normalize=None, widths=(32, 64, 128), norm_layer: NormLayer = nn.BatchNorm2d):
        super().__init__(normalize)
        layers, cin = [], 3
        for w in widths:
            layers += [conv3x3(cin, w), norm_layer(w), nn.ReLU(), nn.MaxPool2d(2)]
            cin = w
        self.features = nn.Sequential(*layers)
        self.linear = nn.Linear(cin, num_classes)
        init_like_patjax(self)

    def forward(self, x):
        return self.linear(self.features(self.inputs(x)).mean((2, 3)))


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, norm_layer: NormLayer):
        super().__init__()
        self.conv1, self.bn1 = conv3x3(cin, cout, stride), norm_layer(cout)
        self.conv2, self.bn2 = conv3x3(cout, cout), norm_layer(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(conv1x1(cin, cout, stride), norm_layer(cout))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + self.shortcut(x))


def _stages(block: Callable, width: int, blocks: Sequence[int], norm_layer: NormLayer, cin: int, expansion: int = 1):
    """kuangliu's / torchvision's _make_layer: stage s has blocks[s] blocks of width * 2**s, the
    first with stride 2 (but in stage 0); returns the stages and the output channel count."""
    stages = []
    for s, n in enumerate(blocks):
        layers = []
        for i in range(n):
            layers.append(block(cin, width * 2**s, 2 if (s > 0 and i == 0) else 1, norm_layer))
            cin = width * 2**s * expansion
        stages.append(nn.Sequential(*layers))
    return stages, cin


class ResNet18(_Classifier):
    patjax_name = "resnet18"

    def __init__(self, num_classes=10, normalize=None, width=64, norm_layer: NormLayer = nn.BatchNorm2d):
        super().__init__(normalize)
        self.conv1, self.bn1 = conv3x3(3, width), norm_layer(width)
        stages, cout = _stages(BasicBlock, width, (2, 2, 2, 2), norm_layer, width)
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.linear = nn.Linear(cout, num_classes)
        init_like_patjax(self)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(self.inputs(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.linear(x.mean((2, 3)))


class PreActBlock(nn.Module):
    """kuangliu's PreActBlock (RobustBench's PreActBlockV2): the shortcut reads the pre-activation;
    with shortcut_preactivated=False RobustBench's PreActBlock, whose shortcut reads the raw input."""

    def __init__(self, cin: int, cout: int, stride: int, norm_layer: NormLayer, shortcut_preactivated: bool = True):
        super().__init__()
        self.shortcut_preactivated = shortcut_preactivated
        self.bn1, self.conv1 = norm_layer(cin), conv3x3(cin, cout, stride)
        self.bn2, self.conv2 = norm_layer(cout), conv3x3(cout, cout)
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(conv1x1(cin, cout, stride))

    def forward(self, x):
        out = F.relu(self.bn1(x))
        shortcut = self.shortcut(out if self.shortcut_preactivated else x) if hasattr(self, "shortcut") else x
        out = self.conv2(F.relu(self.bn2(self.conv1(out))))
        return out + shortcut


class PreActResNet18(_Classifier):
    """`preact_resnet18`; v1=True: `preact_resnet18_v1`, RobustBench's PreActResNet(PreActBlock,
    [2, 2, 2, 2]) (shortcuts from the raw block input, no BatchNorm before the head)."""

    def __init__(self, num_classes=10, normalize=None, width=64, norm_layer: NormLayer = nn.BatchNorm2d, v1=False):
        super().__init__(normalize)
        self.patjax_name = "preact_resnet18_v1" if v1 else "preact_resnet18"
        self.conv1 = conv3x3(3, width)
        block = functools.partial(PreActBlock, shortcut_preactivated=not v1)
        stages, cout = _stages(block, width, (2, 2, 2, 2), norm_layer, width)
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        if not v1:
            self.bn = norm_layer(cout)
        self.linear = nn.Linear(cout, num_classes)
        init_like_patjax(self)

    def forward(self, x):
        x = self.conv1(self.inputs(x))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        if hasattr(self, "bn"):
            x = F.relu(self.bn(x))
        return self.linear(x.mean((2, 3)))


class WideBasicBlock(nn.Module):
    """The TRADES / RobustBench WideResNet BasicBlock with dropRate 0."""

    def __init__(self, cin: int, cout: int, stride: int, norm_layer: NormLayer):
        super().__init__()
        self.bn1, self.conv1 = norm_layer(cin), conv3x3(cin, cout, stride)
        self.bn2, self.conv2 = norm_layer(cout), conv3x3(cout, cout)
        self.equal_in_out = cin == cout
        self.convShortcut = None if self.equal_in_out else conv1x1(cin, cout, stride)

    def forward(self, x):
        pre = F.relu(self.bn1(x))
        out = self.conv2(F.relu(self.bn2(self.conv1(pre))))
        return out + (x if self.equal_in_out else self.convShortcut(pre))


class _NetworkBlock(nn.Module):
    def __init__(self, blocks: int, cin: int, cout: int, stride: int, norm_layer: NormLayer):
        super().__init__()
        self.layer = nn.Sequential(
            *[WideBasicBlock(cin if i == 0 else cout, cout, stride if i == 0 else 1, norm_layer) for i in range(blocks)]
        )

    def forward(self, x):
        return self.layer(x)


class WideResNet(_Classifier):
    def __init__(
        self, num_classes=10, normalize=None, depth=28, widen_factor=10, norm_layer: NormLayer = nn.BatchNorm2d
    ):
        super().__init__(normalize)
        if (depth - 4) % 6:
            raise ValueError(f"WideResNet depth must be 6n + 4, got {depth}")
        self.patjax_name = f"wrn{depth}_{widen_factor}"
        n, c = (depth - 4) // 6, [16, 16 * widen_factor, 32 * widen_factor, 64 * widen_factor]
        self.conv1 = conv3x3(3, c[0])
        self.block1 = _NetworkBlock(n, c[0], c[1], 1, norm_layer)
        self.block2 = _NetworkBlock(n, c[1], c[2], 2, norm_layer)
        self.block3 = _NetworkBlock(n, c[2], c[3], 2, norm_layer)
        self.bn1 = norm_layer(c[3])
        self.fc = nn.Linear(c[3], num_classes)
        init_like_patjax(self)

    def forward(self, x):
        x = self.block3(self.block2(self.block1(self.conv1(self.inputs(x)))))
        return self.fc(F.relu(self.bn1(x)).mean((2, 3)))


class Bottleneck(nn.Module):
    """torchvision's Bottleneck (stride on the 3x3 convolution, expansion 4) at width `width`."""

    def __init__(self, cin: int, width: int, stride: int, norm_layer: NormLayer):
        super().__init__()
        cout = 2 * width  # wide_resnet50_2: bottleneck width doubled, outputs those of ResNet-50
        self.conv1, self.bn1 = conv1x1(cin, width), norm_layer(width)
        self.conv2, self.bn2 = conv3x3(width, width, stride), norm_layer(width)
        self.conv3, self.bn3 = conv1x1(width, cout), norm_layer(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(conv1x1(cin, cout, stride), norm_layer(cout))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = F.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        return F.relu(y + (x if self.downsample is None else self.downsample(x)))


class WideResNet50_2(_Classifier):
    patjax_name = "wrn50_2"

    def __init__(self, num_classes=10, normalize=None, width=64, norm_layer: NormLayer = nn.BatchNorm2d):
        super().__init__(normalize)
        self.conv1, self.bn1 = conv3x3(3, width), norm_layer(width)
        stages, cout = _stages(Bottleneck, 2 * width, (3, 4, 6, 3), norm_layer, width, expansion=2)
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.fc = nn.Linear(cout, num_classes)
        init_like_patjax(self)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(self.inputs(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(x.mean((2, 3)))


MODELS = {
    "small_cnn": SmallCNN,
    "resnet18": ResNet18,
    "preact_resnet18": PreActResNet18,
    "preact_resnet18_v1": lambda **kw: PreActResNet18(v1=True, **kw),
    "wrn28_10": lambda **kw: WideResNet(depth=28, widen_factor=10, **kw),
    "wrn34_10": lambda **kw: WideResNet(depth=34, widen_factor=10, **kw),
    "wrn34_20": lambda **kw: WideResNet(depth=34, widen_factor=20, **kw),
    "wrn50_2": WideResNet50_2,
}


def create_model(name: str, num_classes: int = 10, normalize=None, norm_layer: NormLayer = nn.BatchNorm2d, **kwargs):
    """The network patjax calls `name` (patjax.models.networks.MODELS); kwargs: `width` for the ResNets."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; choose one of {sorted(MODELS)}")
    return MODELS[name](num_classes=num_classes, normalize=normalize, norm_layer=norm_layer, **kwargs)
