"""Model shapes, parameter counts against the reference architectures, normalization."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from patjax.core.errors import UserError
from patjax.models import networks


def count(params):
    return sum(int(np.prod(p.shape)) for p in jax.tree.leaves(params))


def abstract_params(model):
    return jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), jnp.zeros((1, 32, 32, 3))))


@pytest.mark.parametrize("dataset,classes", [("cifar10", 10), ("cifar100", 100)])
def test_resnet18_matches_kuangliu_parameter_count(dataset, classes):
    # kuangliu/pytorch-cifar ResNet18: 11,173,962 parameters with 10 classes (BN affine included);
    # the head adds 513 per class.
    variables = abstract_params(networks.create_model("resnet18", dataset, classes))
    assert count(variables["params"]) == 11_173_962 + 513 * (classes - 10)


def test_wrn50_2_matches_torchvision_with_cifar_stem():
    # torchvision wide_resnet50_2: 68,883,240 parameters (7x7 stem, 1000-class head). CIFAR form:
    # 3x3 stem (-7*7*3*64 + 3*3*3*64) and a 10-class head (-2048*1000-1000 + 2048*10+10).
    expected = 68_883_240 - 7 * 7 * 3 * 64 + 3 * 3 * 3 * 64 - (2048 * 1000 + 1000) + (2048 * 10 + 10)
    variables = abstract_params(networks.create_model("wrn50_2", "cifar10", 10))
    assert count(variables["params"]) == expected


@pytest.mark.parametrize(
    "name,expected",
    [
        # kuangliu's PreActResNet18 (11,171,146) with its final BatchNorm before the head (2 x 512),
        # RobustBench's PreActResNet(PreActBlockV2, [2, 2, 2, 2], bn_before_fc=True).
        ("preact_resnet18", 11_171_146 + 2 * 512),
        # RobustBench's PreActResNet(PreActBlock, [2, 2, 2, 2]): kuangliu's layers, no final BatchNorm.
        ("preact_resnet18_v1", 11_171_146),
        # TRADES / RobustBench WideResNet(depth, widen_factor=10), without TRADES' unused sub_block1.
        ("wrn28_10", 36_479_194),
        ("wrn34_10", 46_160_474),
        ("wrn34_20", 184_531_674),  # RobustBench WideResNet(34, 20) (Rice et al. 2020's network)
    ],
)
def test_robustness_networks_match_the_reference_parameter_counts(name, expected):
    assert count(abstract_params(networks.create_model(name, "cifar10", 10))["params"]) == expected


@pytest.mark.slow
def test_normalize_none_feeds_the_network_raw_inputs():
    x = jax.random.uniform(jax.random.PRNGKey(0), (2, 32, 32, 3))
    raw = networks.create_model("small_cnn", "cifar10", 10, normalize="none")
    identity = networks.SmallCNN(num_classes=10, mean=(0.0,) * 3, std=(1.0,) * 3)
    variables = raw.init(jax.random.PRNGKey(1), x)
    np.testing.assert_array_equal(raw.apply(variables, x), identity.apply(variables, x))
    assert (
        networks.create_model("small_cnn", "cifar10", 10, normalize="cifar100").mean
        == networks.DATASET_STATS["cifar100"][0]
    )
    with pytest.raises(networks.UserError, match="unknown normalize 'imagenet'"):
        networks.create_model("small_cnn", "cifar10", 10, normalize="imagenet")


@pytest.mark.parametrize("name", sorted(networks.MODELS))
def test_logit_shape_and_dtype(name):
    kwargs = {"width": 4} if name in networks.TAKES_WIDTH else {}
    model = networks.create_model(name, "cifar100", 100, **kwargs)
    x = jnp.zeros((2, 32, 32, 3))
    out = jax.eval_shape(lambda: model.apply(model.init(jax.random.PRNGKey(0), x), x))
    assert out.shape == (2, 100) and out.dtype == jnp.float32


def test_normalization_is_inside_the_model():
    model = networks.create_model("small_cnn", "cifar10", 10)
    x = jax.random.uniform(jax.random.PRNGKey(0), (2, 32, 32, 3))
    variables = model.init(jax.random.PRNGKey(1), x)
    mean, std = networks.DATASET_STATS["cifar10"]
    # A model without normalization fed pre-normalized images gives the same logits.
    plain = networks.SmallCNN(num_classes=10, mean=(0.0,) * 3, std=(1.0,) * 3)
    normalized = (x - jnp.asarray(mean)) / jnp.asarray(std)
    np.testing.assert_allclose(model.apply(variables, x), plain.apply(variables, normalized), rtol=1e-5, atol=1e-5)


def test_an_unknown_network_name_is_one_line_from_create_model():
    with pytest.raises(UserError, match="unknown model 'resnet1000'; choose one of"):
        networks.create_model("resnet1000", "cifar10", 10)
