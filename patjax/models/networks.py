"""Classifiers: inputs in [0, 1] pixel space, normalization inside the model.

Every model takes images in [0, 1] (NHWC) and normalizes them with the dataset's
per-channel mean and standard deviation as its first operation, so attacks, the
Langevin sampler and perturbation budgets all act in pixel space.

All convolutions go through `Conv`, so a change to how convolutions are computed
(e.g. a faster input gradient on one backend) reaches every model at once.

Models:
- `SmallCNN`: three conv+BN+ReLU+max-pool stages (32/64/128 channels) and a linear
  head: fast enough for CPU runs and tests.
- `ResNet18`: the CIFAR form used across adversarial-training code (kuangliu's
  pytorch-cifar, also the PyTorch peer in benchmarks/speed/torch_pat_peer.py): 3x3 stride-1 stem, no
  max-pool, four stages of two BasicBlocks, global average pool.
- `WideResNet50_2`: torchvision's `wide_resnet50_2` (Bottleneck blocks, layers
  3-4-6-3, bottleneck width doubled: 128/256/512/1024, outputs 256..2048) with the
  same CIFAR stem as ResNet18. This is the network named "WRN-50-2" by
  Zagoruyko & Komodakis (2016) for ImageNet and by torchvision; it is *not* the
  CIFAR WideResNet-depth-width family (WRN-28-10, WRN-34-10) of the TRADES/MART code.
- `PreActResNet18`: the pre-activation ResNet-18 of Wong et al. (2020, "Fast is better than
  free") and Rice et al. (2020, "Overfitting in adversarially robust deep learning"), RobustBench's
  `PreActResNet(PreActBlockV2, [2, 2, 2, 2], bn_before_fc=True)`: kuangliu's pytorch-cifar
  blocks (the 1x1 shortcut convolution, no BatchNorm, reads the block's pre-activated input)
  plus a BatchNorm + ReLU before the pooling, which kuangliu's own PreActResNet18 lacks (its
  checkpoints have no `bn.*` and are refused with one line, not loaded into another network).
  `preact_resnet18_v1` is RobustBench's other PreActResNet-18, `PreActResNet(PreActBlock, [2, 2,
  2, 2])` (its Wong2020Fast and Andriushchenko2020Understanding entries): the 1x1 shortcut reads the
  raw block input and there is no BatchNorm before the head.
- `WideResNet` (`wrn28_10`, `wrn34_10`, `wrn34_20`): the CIFAR WRN-depth-width of Zagoruyko & Komodakis
  (2016) as written in the TRADES code and RobustBench's `WideResNet` (pre-activation
  BasicBlocks, widths 16/16k/32k/64k, (depth - 4) / 6 blocks per stage, dropout 0, a final
  BatchNorm + ReLU, a linear head with bias). Its block has the reference's quirk: where
  the width changes, the 1x1 shortcut reads the pre-activated input; elsewhere the identity
  reads the raw input.

`normalize`: the per-channel mean and std the model subtracts and divides by, or None for a
network that takes [0, 1] inputs as they are (RobustBench's CIFAR models, which are
evaluated on unnormalized [0, 1] images). `create_model` names it: "dataset" (the dataset's
statistics, every model patjax trains), "none", or a key of `DATASET_STATS`.

The new networks' Flax module names mirror the reference PyTorch attribute names
("layer1_0" for `layer1.0`), which `patjax.interop.torch_names` maps to a PyTorch state_dict.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Optional, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from patjax.core.errors import UserError
from patjax.models import ops

# BatchNorm inside an attack or the sampler: running statistics, or the batch's own (checked
# where the setting enters: `methods.common.AttackSettings` and `SamplerSettings`).
BN_MODES = ("inference", "train")


@dataclasses.dataclass(frozen=True)
class ModelFns:
    """Pure apply functions of a Flax module with (optional) BatchNorm."""

    apply: Callable[..., Any]

    def infer(self, params, batch_stats, x):
        """Logits with BatchNorm in inference mode (running statistics)."""
        return self.apply({"params": params, "batch_stats": batch_stats}, x, train=False)

    def train(self, params, batch_stats, x):
        """(logits, new_batch_stats) with BatchNorm normalizing by batch statistics."""
        if not batch_stats:
            return self.apply({"params": params}, x, train=True), batch_stats
        logits, updates = self.apply(
            {"params": params, "batch_stats": batch_stats}, x, train=True, mutable=["batch_stats"]
        )
        return logits, updates["batch_stats"]

    def train_fn(self, params):
        """(x, batch_stats) -> (logits, batch_stats): the training-mode forward the objectives
        of `patjax.methods` differentiate (`methods.common.TrainFn`)."""
        return lambda x, batch_stats: self.train(params, batch_stats, x)

    def attack_logits_fn(self, params, batch_stats, bn_mode: str = "inference"):
        """x -> logits for attacks, the sampler and evaluation: detached parameters (they
        differentiate with respect to the input only), no statistics update; bn_mode one of
        `BN_MODES` ('train': batch statistics, running averages discarded)."""
        if bn_mode not in BN_MODES:  # 'auto' is resolved per method (its registry entry's attack_bn_mode)
            raise ValueError(
                f"bn_mode must be one of {BN_MODES}, got {bn_mode!r}; a method with an inner attack "
                f"resolves attack.bn_mode='auto' through its registry entry's attack_bn_mode (methods.common.Method)"
            )
        params = jax.lax.stop_gradient(params)
        batch_stats = jax.lax.stop_gradient(batch_stats)
        return {
            "inference": lambda x: self.infer(params, batch_stats, x),
            "train": lambda x: self.train(params, batch_stats, x)[0],
        }[bn_mode]


# Per-channel statistics of the training splits (pixel values / 255).
DATASET_STATS = {
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "cifar100": ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
}

# PyTorch BatchNorm2d defaults: momentum 0.1 (Flax counts the kept fraction) and eps 1e-5.
_BN = dict(momentum=0.9, epsilon=1e-5)
# torchvision's ResNet initialization: Kaiming normal, fan_out, ReLU gain.
_KAIMING = nn.initializers.variance_scaling(2.0, "fan_out", "normal")


class Conv(nn.Module):
    """2-D convolution without bias (NHWC, HWIO kernel), computed by `ops.conv2d`."""

    features: int
    kernel_size: int
    strides: int = 1
    padding: int = 0
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x):
        kernel = self.param(
            "kernel",
            _KAIMING,
            (self.kernel_size, self.kernel_size, x.shape[-1], self.features),
            jnp.float32,
        )
        return ops.conv2d(x.astype(self.dtype), kernel.astype(self.dtype), self.strides, self.padding)


class Normalize(nn.Module):
    mean: Sequence[float]
    std: Sequence[float]

    def __call__(self, x):
        return (x - jnp.asarray(self.mean, x.dtype)) / jnp.asarray(self.std, x.dtype)


def _normalized(x, mean, std, dtype):
    """x in the compute dtype, normalized per channel unless the model takes raw [0, 1] inputs
    (mean and std None)."""
    x = x.astype(dtype)
    return x if mean is None else Normalize(mean, std)(x)


def _batch_norm(train: bool, dtype, name=None):
    return nn.BatchNorm(use_running_average=not train, dtype=dtype, name=name, **_BN)


class SmallCNN(nn.Module):
    num_classes: int
    mean: Optional[Sequence[float]]
    std: Optional[Sequence[float]]
    widths: Sequence[int] = (32, 64, 128)
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x, train: bool = False):
        x = _normalized(x, self.mean, self.std, self.dtype)
        for width in self.widths:
            x = Conv(width, 3, padding=1, dtype=self.dtype)(x)
            x = nn.relu(_batch_norm(train, self.dtype)(x))
            x = ops.max_pool(x, 2)  # not nn.max_pool: its gradient is slow on XLA:CPU (ops.max_pool)
        x = jnp.mean(x, axis=(1, 2))
        return nn.Dense(self.num_classes, dtype=self.dtype)(x).astype(jnp.float32)


class BasicBlock(nn.Module):
    features: int
    strides: int
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x, train: bool):
        y = Conv(self.features, 3, self.strides, 1, self.dtype)(x)
        y = nn.relu(_batch_norm(train, self.dtype)(y))
        y = Conv(self.features, 3, 1, 1, self.dtype)(y)
        y = _batch_norm(train, self.dtype)(y)
        if self.strides != 1 or x.shape[-1] != self.features:
            x = Conv(self.features, 1, self.strides, 0, self.dtype, name="shortcut_conv")(x)
            x = _batch_norm(train, self.dtype, name="shortcut_bn")(x)
        return nn.relu(y + x)


class Bottleneck(nn.Module):
    """torchvision Bottleneck (stride on the 3x3 conv, expansion 4)."""

    width: int
    out_features: int
    strides: int
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x, train: bool):
        y = nn.relu(_batch_norm(train, self.dtype)(Conv(self.width, 1, 1, 0, self.dtype)(x)))
        y = nn.relu(_batch_norm(train, self.dtype)(Conv(self.width, 3, self.strides, 1, self.dtype)(y)))
        y = _batch_norm(train, self.dtype)(Conv(self.out_features, 1, 1, 0, self.dtype)(y))
        if self.strides != 1 or x.shape[-1] != self.out_features:
            x = Conv(self.out_features, 1, self.strides, 0, self.dtype, name="shortcut_conv")(x)
            x = _batch_norm(train, self.dtype, name="shortcut_bn")(x)
        return nn.relu(y + x)


class ResNet18(nn.Module):
    num_classes: int
    mean: Optional[Sequence[float]]
    std: Optional[Sequence[float]]
    width: int = 64
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x, train: bool = False):
        w = self.width
        x = _normalized(x, self.mean, self.std, self.dtype)
        x = nn.relu(_batch_norm(train, self.dtype)(Conv(w, 3, 1, 1, self.dtype)(x)))
        for features, strides in [
            (w, 1),
            (w, 1),
            (2 * w, 2),
            (2 * w, 1),
            (4 * w, 2),
            (4 * w, 1),
            (8 * w, 2),
            (8 * w, 1),
        ]:
            x = BasicBlock(features, strides, self.dtype)(x, train)
        x = jnp.mean(x, axis=(1, 2))
        return nn.Dense(self.num_classes, dtype=self.dtype)(x).astype(jnp.float32)


class WideResNet50_2(nn.Module):
    num_classes: int
    mean: Optional[Sequence[float]]
    std: Optional[Sequence[float]]
    width: int = 64  # stem width; bottleneck widths are 2x torchvision's ResNet-50
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x, train: bool = False):
        w = self.width
        x = _normalized(x, self.mean, self.std, self.dtype)
        x = nn.relu(_batch_norm(train, self.dtype)(Conv(w, 3, 1, 1, self.dtype)(x)))
        for stage, blocks in enumerate((3, 4, 6, 3)):
            for block in range(blocks):
                strides = 2 if (stage > 0 and block == 0) else 1
                x = Bottleneck(2 * w * 2**stage, 4 * w * 2**stage, strides, self.dtype)(x, train)
        x = jnp.mean(x, axis=(1, 2))
        return nn.Dense(self.num_classes, dtype=self.dtype)(x).astype(jnp.float32)


class PreActBlock(nn.Module):
    """kuangliu's / RobustBench's PreActBlockV2: BN-ReLU-conv3x3-BN-ReLU-conv3x3, plus the input
    or, where the shape changes, a 1x1 convolution of the pre-activated input; with
    shortcut_preactivated=False RobustBench's PreActBlock, whose 1x1 convolution reads the raw input."""

    features: int
    strides: int
    dtype: Any = jnp.float32
    shortcut_preactivated: bool = True

    @nn.compact
    def __call__(self, x, train: bool):
        out = nn.relu(_batch_norm(train, self.dtype, name="bn1")(x))
        shortcut = x
        if self.strides != 1 or x.shape[-1] != self.features:
            shortcut_input = out if self.shortcut_preactivated else x
            shortcut = Conv(self.features, 1, self.strides, 0, self.dtype, name="shortcut_0")(shortcut_input)
        out = Conv(self.features, 3, self.strides, 1, self.dtype, name="conv1")(out)
        out = nn.relu(_batch_norm(train, self.dtype, name="bn2")(out))
        return Conv(self.features, 3, 1, 1, self.dtype, name="conv2")(out) + shortcut


class PreActResNet18(nn.Module):
    """`preact_resnet18`: RobustBench's PreActResNet(PreActBlockV2, [2, 2, 2, 2], bn_before_fc=True);
    `preact_resnet18_v1` (v1=True): its PreActResNet(PreActBlock, [2, 2, 2, 2]), whose shortcut
    convolutions read the raw block input and which has no BatchNorm before the head."""

    num_classes: int
    mean: Optional[Sequence[float]]
    std: Optional[Sequence[float]]
    width: int = 64
    dtype: Any = jnp.float32
    v1: bool = False

    @nn.compact
    def __call__(self, x, train: bool = False):
        w = self.width
        x = _normalized(x, self.mean, self.std, self.dtype)
        x = Conv(w, 3, 1, 1, self.dtype, name="conv1")(x)  # no BatchNorm or ReLU: the blocks pre-activate
        for stage in range(4):
            for block in range(2):
                strides = 2 if (stage > 0 and block == 0) else 1
                name = f"layer{stage + 1}_{block}"
                x = PreActBlock(w * 2**stage, strides, self.dtype, not self.v1, name=name)(x, train)
        if not self.v1:
            x = nn.relu(_batch_norm(train, self.dtype, name="bn")(x))
        x = jnp.mean(x, axis=(1, 2))
        return nn.Dense(self.num_classes, dtype=self.dtype, name="linear")(x).astype(jnp.float32)


class WideBasicBlock(nn.Module):
    """The TRADES / RobustBench WideResNet BasicBlock (dropout 0)."""

    features: int
    strides: int
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x, train: bool):
        pre = nn.relu(_batch_norm(train, self.dtype, name="bn1")(x))
        out = Conv(self.features, 3, self.strides, 1, self.dtype, name="conv1")(pre)
        out = nn.relu(_batch_norm(train, self.dtype, name="bn2")(out))
        out = Conv(self.features, 3, 1, 1, self.dtype, name="conv2")(out)
        if x.shape[-1] == self.features:  # the reference's equalInOut: identity of the raw input
            return x + out
        return Conv(self.features, 1, self.strides, 0, self.dtype, name="convShortcut")(pre) + out


class WideResNet(nn.Module):
    num_classes: int
    mean: Optional[Sequence[float]]
    std: Optional[Sequence[float]]
    depth: int = 28
    widen_factor: int = 10
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x, train: bool = False):
        if (self.depth - 4) % 6:
            raise UserError(f"WideResNet depth must be 6n + 4, got {self.depth}")
        blocks = (self.depth - 4) // 6
        x = _normalized(x, self.mean, self.std, self.dtype)
        x = Conv(16, 3, 1, 1, self.dtype, name="conv1")(x)
        for stage, strides in enumerate((1, 2, 2)):
            features = 16 * self.widen_factor * 2**stage
            for i in range(blocks):
                name = f"block{stage + 1}_layer_{i}"
                x = WideBasicBlock(features, strides if i == 0 else 1, self.dtype, name=name)(x, train)
        x = nn.relu(_batch_norm(train, self.dtype, name="bn1")(x))
        x = jnp.mean(x, axis=(1, 2))
        return nn.Dense(self.num_classes, dtype=self.dtype, name="fc")(x).astype(jnp.float32)


MODELS: dict[str, Callable[..., nn.Module]] = {
    "small_cnn": SmallCNN,
    "resnet18": ResNet18,
    "wrn50_2": WideResNet50_2,
    "preact_resnet18": PreActResNet18,
    "preact_resnet18_v1": functools.partial(PreActResNet18, v1=True),
    "wrn28_10": functools.partial(WideResNet, depth=28, widen_factor=10),
    "wrn34_10": functools.partial(WideResNet, depth=34, widen_factor=10),
    "wrn34_20": functools.partial(WideResNet, depth=34, widen_factor=20),
}
# The models whose stem width `width` sets (config.model_width); the others' widths are fixed
# by their definition (the small CNN) or by their name (WRN-depth-width).
TAKES_WIDTH = ("resnet18", "wrn50_2", "preact_resnet18", "preact_resnet18_v1")
NO_NORMALIZATION = "none"
DATASET_NORMALIZATION = "dataset"


def normalization(normalize: str, dataset: str):
    """(mean, std) for a `normalize` name: "dataset" (the dataset's statistics), "none" ((None,
    None): inputs in [0, 1] as they are), or a key of `DATASET_STATS`."""
    if normalize == NO_NORMALIZATION:
        return None, None
    key = dataset if normalize == DATASET_NORMALIZATION else normalize
    if key not in DATASET_STATS:
        choices = [DATASET_NORMALIZATION, NO_NORMALIZATION, *DATASET_STATS]
        raise UserError(f"unknown normalize {normalize!r}; choose one of {choices}")
    return DATASET_STATS[key]


def check_model(name: str) -> None:
    """A one-line UserError unless `name` is a network of `MODELS`; run where a name enters
    (`state.ModelSettings`, `torch_weights.load_model`)."""
    if name not in MODELS:
        raise UserError(f"unknown model {name!r}; choose one of {sorted(MODELS)}")


def create_model(
    name: str, dataset: str, num_classes: int, dtype=jnp.float32, normalize: str = DATASET_NORMALIZATION, **kwargs
) -> nn.Module:
    """The network `name` (a key of `MODELS`) for `num_classes` classes; an unknown name is a
    one-line `check_model` error here too, since library code and benchmarks call this directly."""
    check_model(name)
    mean, std = normalization(normalize, dataset)
    return MODELS[name](num_classes=num_classes, mean=mean, std=std, dtype=dtype, **kwargs)


def init_variables(model: nn.Module, key: jax.Array, image_shape=(32, 32, 3)):
    """Returns (params, batch_stats); batch_stats is {} for a model without BatchNorm."""
    variables = model.init(key, jnp.zeros((1, *image_shape), jnp.float32), train=False)
    return variables["params"], variables.get("batch_stats", {})


@jax.jit
def _finite_flags(leaves: list) -> jax.Array:
    return jnp.stack([jnp.all(jnp.isfinite(leaf)) for leaf in leaves])


def check_finite(variables: Any, source: str, consequence: str = "no figure is computed from it") -> None:
    """A one-line UserError, "{source} has non-finite values in {leaf}; {consequence}", naming the
    first leaf of `variables` (a model's parameters and BatchNorm statistics, or any pytree of
    arrays; its path joined with "/") that holds a NaN or an infinity. Run once where a model
    enters or leaves: the logits check at evaluation does not replace it, since an infinity in a
    BatchNorm bias or variance becomes finite logits after ReLU or normalization.

    One pass and one transfer: numpy's over host arrays (a file just read); else one compiled
    reduction on the arrays' devices whose per-leaf flags reach the host together, never a
    synchronization per leaf and never the weights themselves."""
    flat = jax.tree_util.tree_flatten_with_path(variables)[0]
    if not flat:
        return
    paths, leaves = zip(*flat)
    if all(isinstance(leaf, np.ndarray) for leaf in leaves):
        flags = [bool(np.isfinite(leaf).all()) for leaf in leaves]
    else:
        flags = np.asarray(_finite_flags(list(leaves)))
    for path, finite in zip(paths, flags):
        if not finite:
            name = "/".join(str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))) for k in path)
            raise UserError(f"{source} has non-finite values in {name}; {consequence}")
