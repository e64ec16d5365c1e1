"""A network's weights between patjax and a PyTorch state_dict (patjax.interop.torch_names,
patjax_torch.models): for every network, a PyTorch model with trained-looking BatchNorm
statistics gives, once loaded into patjax, the logits PyTorch computes; patjax's weights
exported back load strictly into PyTorch and give the same logits and tensors; a state_dict that
does not fit is one line naming the key. (tests/models/test_models.py checks the parameter
counts against the references'.)"""

import jax
import numpy as np
import pytest
import torch
from helpers import abstract_variables, random_images, torch_logits, trained_looking

from patjax.core.errors import UserError
from patjax.interop import torch_names, torch_weights
from patjax.models import networks

CIFAR10 = networks.DATASET_STATS["cifar10"]


# (patjax name, width or None, normalize): each network as a user would bring it; the ResNets'
# shared widths are cut to keep the test fast (the graph and the names are those of width 64).
CASES = [
    ("small_cnn", None, CIFAR10),
    ("resnet18", 16, CIFAR10),
    ("preact_resnet18", 16, None),
    ("preact_resnet18_v1", 16, CIFAR10),
    ("wrn28_10", None, None),
    ("wrn34_10", None, CIFAR10),
    ("wrn50_2", 8, CIFAR10),
]


@pytest.mark.slow
@pytest.mark.parametrize("name,width,normalize", CASES, ids=[c[0] for c in CASES])
def test_torch_to_patjax_to_torch_gives_torch_logits(tmp_path, name, width, normalize):
    from patjax_torch import models as torch_models

    images = random_images()
    kwargs = {} if width is None else {"width": width}
    torch.manual_seed(0)
    net = trained_looking(torch, torch_models.create_model(name, 10, normalize, **kwargs), seed=1)
    expected = torch_logits(torch, net, images)
    state_dict = {k: v.numpy() for k, v in net.state_dict().items()}
    file = str(tmp_path / "model.safetensors")
    torch_weights.write_state_dict(file, state_dict)

    # torch -> patjax: the file, read with numpy alone, evaluates as PyTorch does.
    model = networks.MODELS[name](num_classes=10, mean=None, std=None, **kwargs)
    abstract = jax.eval_shape(lambda: networks.init_variables(model, jax.random.PRNGKey(0)))
    params, batch_stats, found = torch_names.from_state_dict(name, torch_weights.read_state_dict(file), *abstract)
    mean, std = found or (None, None)
    model = networks.MODELS[name](num_classes=10, mean=mean, std=std, **kwargs)
    got = np.asarray(networks.ModelFns(model.apply).infer(params, batch_stats, images))
    scale = max(1.0, float(np.abs(expected).max()))
    assert np.abs(got - expected).max() <= 1e-4 * scale, (np.abs(got - expected).max(), scale)
    assert (got.argmax(1) == expected.argmax(1)).all()

    # patjax -> torch: a strict load into a fresh network, the same logits and the same tensors.
    exported = torch_names.to_state_dict(name, params, batch_stats, found)
    fresh = torch_models.create_model(name, 10, normalize, **kwargs)
    fresh.load_state_dict({k: torch.from_numpy(v) for k, v in exported.items()}, strict=True)
    fresh.eval()
    np.testing.assert_allclose(torch_logits(torch, fresh, images), expected, rtol=0, atol=1e-6 * scale)
    for key, value in exported.items():
        np.testing.assert_array_equal(value, state_dict[key], err_msg=key)


def test_a_state_dict_that_does_not_fit_is_refused_naming_its_key():
    """The fit is checked on numpy arrays (what a .safetensors file holds), so the refusals need no
    PyTorch: the names and shapes are those of patjax_torch's small CNN."""
    abstract = abstract_variables("small_cnn")
    ones = [jax.tree.map(lambda a: np.ones(a.shape, np.float32), tree) for tree in abstract]
    good = torch_names.to_state_dict("small_cnn", *ones)
    torch_names.from_state_dict("small_cnn", good, *abstract)  # the refusals below are of one change each
    wrong_shape = {**good, "features.4.weight": np.zeros((64, 32, 5, 5), np.float32)}
    expected = r"features\.4\.weight is float32\[64, 32, 5, 5\], expected float\[64, 32, 3, 3\]"
    with pytest.raises(UserError, match=expected):
        torch_names.from_state_dict("small_cnn", wrong_shape, *abstract)
    missing = {k: v for k, v in good.items() if k != "features.1.running_var"}
    with pytest.raises(UserError, match=r"no features\.1\.running_var"):
        torch_names.from_state_dict("small_cnn", missing, *abstract)
    with pytest.raises(UserError, match=r"extra\.weight is not part of it"):
        torch_names.from_state_dict("small_cnn", {**good, "extra.weight": np.ones(3, np.float32)}, *abstract)
    with pytest.raises(UserError, match="does not fit resnet18"):
        torch_names.from_state_dict("resnet18", good, *abstract_variables("resnet18"))
    # A BatchNorm's step counter is optional (torch's load of a dict without version metadata
    # fills it in) but, as every key, refused where the network has no such BatchNorm.
    counter = np.zeros((), np.int64)
    torch_names.from_state_dict("small_cnn", {k: v for k, v in good.items() if "num_batches" not in k}, *abstract)
    with pytest.raises(UserError, match=r"features\.0\.num_batches_tracked is not part of it \(1 such key"):
        torch_names.from_state_dict("small_cnn", {**good, "features.0.num_batches_tracked": counter}, *abstract)
