"""RobustBench's CIFAR-10 Linf zoo in patjax (patjax.interop.zoo). For each network patjax covers,
RobustBench's own definition (tests/robustbench_reference.py, copied from the robustbench wheel)
with random weights and trained-looking BatchNorm statistics is saved as that entry's checkpoint
is laid out (the state_dict in {"state_dict": ...} with `module.` prefixes, under "last", with
`model.` prefixes, or bare; without the mu and sigma buffers RobustBench's classes register) at
the path RobustBench keeps it, and patjax's logits, RobustBench's input normalization included,
must be PyTorch's on real CIFAR-10 test images."""

import functools
import importlib
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import REPO
from helpers import torch_logits, trained_looking

from patjax.core.errors import UserError
from patjax.data import cifar
from patjax.interop import zoo
from patjax.models import networks


@pytest.fixture(scope="module")
def reference():
    return importlib.import_module("robustbench_reference")


@pytest.fixture(scope="module")
def images(data_dir):
    split = cifar.load_split("cifar10", "test", data_dir)
    return np.asarray(cifar.to_float(split.images[:3]))


def save_as_robustbench_keeps_it(torch, net, model_dir, name, layout, threat_model="Linf"):
    """The entry's checkpoint at MODEL_DIR/cifar10/THREAT_MODEL/NAME.pt, laid out as `layout`;
    RobustBench's checkpoints of classes with mu and sigma buffers do not hold them."""
    state_dict = {k: v for k, v in net.state_dict().items() if k not in ("mu", "sigma")}
    checkpoint = {
        "bare": state_dict,
        "state_dict, module.": {"epoch": 99, "state_dict": {f"module.{k}": v for k, v in state_dict.items()}},
        "model.": {f"model.{k}": v for k, v in state_dict.items()},
        "last": {"last": state_dict, "best": {k: torch.zeros_like(v) for k, v in state_dict.items()}},
    }[layout]
    path = os.path.join(model_dir, "cifar10", threat_model, f"{name}.pt")
    os.makedirs(os.path.dirname(path))
    torch.save(checkpoint, path)
    return path


def check_logits(torch, net, name, images, tmp_path, layout, threat_model="Linf"):
    torch.manual_seed(0)
    net = trained_looking(torch, net, seed=1)
    expected = torch_logits(torch, net, images)
    path = save_as_robustbench_keeps_it(torch, net, str(tmp_path), name, layout, threat_model)
    model_fns, state, found = zoo.load_model(name, str(tmp_path), threat_model)
    assert found == path
    got = np.asarray(model_fns.infer(state.params, state.batch_stats, images))
    scale = max(1.0, float(np.abs(expected).max()))
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-5 * scale)


# Full size: the entries' networks as RobustBench builds them (WRN-28-10: 36.5 M parameters).
FULL = [
    ("Carmon2019Unlabeled", lambda r: r.WideResNet(depth=28, widen_factor=10, sub_block1=True), "state_dict, module."),
    ("Wong2020Fast", lambda r: r.Wong2020FastNet(), "bare"),
    ("Andriushchenko2020Understanding", lambda r: r.PreActResNet(r.PreActBlock, [2, 2, 2, 2]), "last"),
    ("Sehwag2021Proxy_R18", lambda r: r.ResNet18(), "bare"),
]


@pytest.mark.slow
@pytest.mark.parametrize("name,build,layout", FULL, ids=[c[0] for c in FULL])
def test_a_zoo_checkpoint_gives_pytorchs_logits(reference, images, tmp_path, name, build, layout):
    check_logits(torch, build(reference), name, images, tmp_path, layout)


# The WideResNets' other depths, widths and normalizations on narrow instances (RobustBench's
# classes take depth and widen_factor; the names and the graph are those of the full networks),
# patjax's network of the same depth and width standing in for the full one.
NARROW = [
    ("Zhang2019Theoretically", lambda r: r.WideResNet(depth=34, widen_factor=1, sub_block1=True), 34, 1, "bare"),
    ("Hendrycks2019Using", lambda r: r.Hendrycks2019UsingNet(depth=28, widen_factor=1), 28, 1, "state_dict, module."),
    ("Rice2020Overfitting", lambda r: r.Rice2020OverfittingNet(depth=34, widen_factor=2), 34, 2, "bare"),
    ("Chen2020Efficient", lambda r: r.Chen2020EfficientNet(depth=34, widen_factor=1), 34, 1, "model."),
]


@pytest.mark.parametrize("name,build,depth,widen,layout", NARROW, ids=[c[0] for c in NARROW])
def test_a_narrow_wide_resnet_entry_gives_pytorchs_logits(
    reference, images, tmp_path, monkeypatch, name, build, depth, widen, layout
):
    narrow = functools.partial(networks.WideResNet, depth=depth, widen_factor=widen)
    monkeypatch.setitem(networks.MODELS, zoo.entry(name).model, narrow)
    check_logits(torch, build(reference), name, images, tmp_path, layout)


# The L2 zoo (robustbench 1.1.1's cifar10.l2): its Rice2020Overfitting is a PreAct ResNet-18 with
# PreActBlockV2 and a BatchNorm before the head, not the L-inf entry's WRN-34-20; Rony's and
# Augustin's WideResNets normalize with their own statistics.
L2_FULL = [
    ("Rice2020Overfitting", lambda r: r.Rice2020OverfittingNetL2(), "bare"),
    ("Sehwag2021Proxy_R18", lambda r: r.ResNet18(), "state_dict, module."),
]
L2_NARROW = [
    ("Rony2019Decoupling", lambda r: r.Rony2019DecouplingNet(depth=28, widen_factor=1), 28, 1, "model."),
    (
        "Augustin2020Adversarial_34_10",
        lambda r: r.Augustin2020AdversarialWideNet(depth=34, widen_factor=1),
        34,
        1,
        "bare",
    ),
]


@pytest.mark.slow
@pytest.mark.parametrize("name,build,layout", L2_FULL, ids=[c[0] for c in L2_FULL])
def test_an_l2_zoo_checkpoint_gives_pytorchs_logits(reference, images, tmp_path, name, build, layout):
    check_logits(torch, build(reference), name, images, tmp_path, layout, threat_model="L2")


@pytest.mark.parametrize("name,build,depth,widen,layout", L2_NARROW, ids=[c[0] for c in L2_NARROW])
def test_a_narrow_l2_wide_resnet_entry_gives_pytorchs_logits(
    reference, images, tmp_path, monkeypatch, name, build, depth, widen, layout
):
    narrow = functools.partial(networks.WideResNet, depth=depth, widen_factor=widen)
    monkeypatch.setitem(networks.MODELS, zoo.entry(name, "L2").model, narrow)
    check_logits(torch, build(reference), name, images, tmp_path, layout, threat_model="L2")


def test_an_l2_entry_is_looked_up_in_the_l2_zoo_and_an_uncovered_one_is_named():
    """The same name is another network in each zoo; an L2 entry patjax has no network for is refused."""
    assert (zoo.entry("Rice2020Overfitting").model, zoo.entry("Rice2020Overfitting", "L2").model) == (
        "wrn34_20",
        "preact_resnet18",
    )
    with pytest.raises(UserError, match="'Engstrom2019Robustness' is not a RobustBench CIFAR-10 L2 entry"):
        zoo.entry("Engstrom2019Robustness", "L2")
    with pytest.raises(UserError, match="'L1' is not a RobustBench threat model patjax reads; choose Linf, L2"):
        zoo.entry("Standard", "L1")


def test_the_normalization_is_robustbenchs_not_the_datasets():
    """Wong2020Fast's class divides by 0.2471 (patjax's CIFAR-10 sigma is 0.2470): a model fed
    inputs normalized the wrong way gives wrong numbers without any error."""
    assert zoo.entry("Wong2020Fast").normalize == ((0.4914, 0.4822, 0.4465), (0.2471, 0.2435, 0.2616))
    assert zoo.entry("Wong2020Fast").normalize != networks.DATASET_STATS["cifar10"]
    assert zoo.entry("Carmon2019Unlabeled").normalize is None


def test_an_entry_patjax_does_not_cover_or_cannot_fetch_is_one_line(tmp_path, monkeypatch):
    with pytest.raises(UserError, match="Gowal2020Uncovering_28_10_extra' is not a RobustBench CIFAR-10 Linf entry"):
        zoo.load_model("Gowal2020Uncovering_28_10_extra", str(tmp_path))
    monkeypatch.setitem(sys.modules, "robustbench", None)  # the package not installed
    with pytest.raises(
        UserError, match=r"Carmon2019Unlabeled\.pt does not exist; fetching .*\(pip install robustbench\)"
    ):
        zoo.load_model("Carmon2019Unlabeled", str(tmp_path))


@pytest.mark.parametrize(
    "utils_source, shown",
    [
        (
            "import a_dependency_robustbench_lacks\n",
            "ModuleNotFoundError: No module named 'a_dependency_robustbench_lacks'",
        ),
        ("raise RuntimeError('built against another torch')\n", "RuntimeError: built against another torch"),
    ],
    ids=["its-dependency-missing", "its-import-fails"],
)
def test_an_installed_robustbench_that_cannot_be_imported_is_named_as_such(tmp_path, monkeypatch, utils_source, shown):
    """The package is there but its own import fails: not 'install robustbench', and no traceback."""
    package = tmp_path / "site" / "robustbench"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "utils.py").write_text(utils_source)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    for name in ("robustbench", "robustbench.utils"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    with pytest.raises(UserError) as error:
        zoo.load_model("Carmon2019Unlabeled", str(tmp_path / "models"))
    message = str(error.value)
    assert "is installed but cannot be imported" in message and shown in message and "\n" not in message
    assert "pip install robustbench" not in message


def evaluate_entry(data_dir, model_dir, *flags):
    env = {**os.environ, "PATJAX_DATA_DIR": data_dir, "PATJAX_CPU_DEVICES": "1"}
    command = [sys.executable, "-m", "patjax.evaluate", f"--robustbench_dir={model_dir}", *flags]
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_the_command_line_refuses_the_flags_an_entry_decides(data_dir, tmp_path):
    refused = evaluate_entry(
        data_dir, tmp_path, "--robustbench=Sehwag2021Proxy_R18", "--model=resnet18", "--normalize=none"
    )
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
    assert [line for line in refused.stderr.splitlines() if line.startswith("error:")] == [
        "error: --model, --normalize describe a --torch_checkpoint file: --robustbench names the network and its "
        "normalization itself"
    ]
    assert not any(tmp_path.iterdir())


@pytest.mark.slow
def test_the_command_line_evaluates_an_entry(reference, data_dir, tmp_path):
    def evaluate(*flags):
        return evaluate_entry(data_dir, tmp_path, *flags)

    torch.manual_seed(0)
    net = trained_looking(torch, reference.ResNet18(), seed=3)
    save_as_robustbench_keeps_it(torch, net, str(tmp_path), "Sehwag2021Proxy_R18", "bare")
    done = evaluate("--robustbench=Sehwag2021Proxy_R18", "--evaluators=clean", "--num_examples=8", "--batch_size=8")
    assert done.returncode == 0, done.stderr
    results = json.loads((tmp_path / "cifar10" / "Linf" / "Sehwag2021Proxy_R18" / "eval" / "results.json").read_text())
    split = cifar.load_split("cifar10", "test", data_dir)
    predicted = torch_logits(torch, net, np.asarray(cifar.to_float(split.images[:8]))).argmax(1)
    assert results["figures"]["clean_accuracy"]["value"] == pytest.approx(np.mean(predicted == split.labels[:8]))
    assert results["model"]["robustbench"] == "Sehwag2021Proxy_R18" and results["model"]["model"] == "resnet18"
    assert results["model"]["threat_model"] == "Linf"
    # The same name in the L2 zoo: its own file, its own folder.
    l2_net = trained_looking(torch, reference.ResNet18(), seed=4)
    save_as_robustbench_keeps_it(torch, l2_net, str(tmp_path), "Sehwag2021Proxy_R18", "bare", threat_model="L2")
    done = evaluate(
        "--robustbench=Sehwag2021Proxy_R18",
        "--robustbench_threat_model=L2",
        "--evaluators=clean",
        "--num_examples=8",
        "--batch_size=8",
    )
    assert done.returncode == 0, done.stderr
    results = json.loads((tmp_path / "cifar10" / "L2" / "Sehwag2021Proxy_R18" / "eval" / "results.json").read_text())
    predicted = torch_logits(torch, l2_net, np.asarray(cifar.to_float(split.images[:8]))).argmax(1)
    assert results["figures"]["clean_accuracy"]["value"] == pytest.approx(np.mean(predicted == split.labels[:8]))
    assert results["model"]["threat_model"] == "L2"


def strict_load_refuses(torch, net, checkpoint) -> bool:
    """Whether RobustBench's load refuses the checkpoint for `net`: the state_dict under
    "state_dict" if there is one, `module.` and `model.` stripped, load_state_dict(strict=True)."""
    try:
        state_dict = checkpoint["state_dict"]
    except (KeyError, TypeError):
        state_dict = checkpoint
    for prefix in ("module.", "model."):
        state_dict = {k[len(prefix) :] if prefix in k else k: v for k, v in state_dict.items()}
    try:
        net.load_state_dict(state_dict, strict=True)
    except RuntimeError:
        return True
    return False


def narrow_file(torch, reference, tmp_path, name, sub_block1, change):
    """A narrow WRN-34 checkpoint of entry `name` as RobustBench keeps it (bare), its state_dict
    made with or without TRADES' sub_block1 and then changed by `change`; and the checkpoint."""
    torch.manual_seed(0)
    net = reference.WideResNet(depth=34, widen_factor=1, sub_block1=sub_block1)
    checkpoint = change(dict(net.state_dict()))
    path = os.path.join(tmp_path, "cifar10", "Linf", f"{name}.pt")
    os.makedirs(os.path.dirname(path))
    torch.save(checkpoint, path)
    return checkpoint


def without_counters(state_dict):
    return {k: v for k, v in state_dict.items() if not k.endswith("num_batches_tracked")}


# Files RobustBench's strict load refuses for the entry's own network (a WideResNet with or without
# sub_block1, as RobustBench builds each entry); patjax refused none of them before.
STRICT = [
    # Zhang2019Theoretically's network has sub_block1: a file without it misses its keys.
    (
        "Zhang2019Theoretically",
        False,
        lambda sd: sd,
        "does not fit wrn34_10: it has no sub_block1.layer.0.bn1.bias (expected shape [16])",
    ),
    # Sehwag2021Proxy's has none: a file with it holds keys the network lacks, 5 blocks of 2 BatchNorms
    # (weight, bias, running_mean, running_var, num_batches_tracked) and 2 convolutions.
    (
        "Sehwag2021Proxy",
        True,
        lambda sd: sd,
        "does not fit wrn34_10: sub_block1.layer.0.bn1.weight is not part of it (60 such key(s))",
    ),
    # A step counter under a name no BatchNorm of the network has.
    (
        "Sehwag2021Proxy",
        False,
        lambda sd: {**sd, "conv1.num_batches_tracked": torch_zero()},
        "does not fit wrn34_10: conv1.num_batches_tracked is not part of it (1 such key(s))",
    ),
    # A container RobustBench does not look into.
    (
        "Sehwag2021Proxy",
        False,
        lambda sd: {"model_state_dict": sd, "epoch": torch_zero()},
        "does not hold a state_dict (a dict of tensors)",
    ),
]


def torch_zero():
    import torch

    return torch.zeros((), dtype=torch.long)


@pytest.mark.parametrize(
    "name, sub_block1, change, message", STRICT, ids=["missing-sub-block", "extra-sub-block", "counter", "container"]
)
def test_a_zoo_file_robustbenchs_strict_load_refuses_is_refused_naming_the_key(
    reference, tmp_path, monkeypatch, name, sub_block1, change, message
):
    narrow = functools.partial(networks.WideResNet, depth=34, widen_factor=1)
    monkeypatch.setitem(networks.MODELS, zoo.entry(name).model, narrow)
    checkpoint = narrow_file(torch, reference, str(tmp_path), name, sub_block1, change)
    own = reference.WideResNet(depth=34, widen_factor=1, sub_block1=name == "Zhang2019Theoretically")
    assert strict_load_refuses(torch, own, checkpoint)
    with pytest.raises(UserError) as error:
        zoo.load_model(name, str(tmp_path))
    assert str(error.value) == f"{zoo.checkpoint_path(name, str(tmp_path))} {message}"


def test_a_zoo_file_without_batchnorm_counters_is_loaded_as_robustbench_loads_it(reference, tmp_path, monkeypatch):
    """RobustBench's state_dict, rebuilt without torch's version metadata, loads without the
    BatchNorms' num_batches_tracked; so does patjax."""
    name = "Zhang2019Theoretically"
    monkeypatch.setitem(networks.MODELS, "wrn34_10", functools.partial(networks.WideResNet, depth=34, widen_factor=1))
    checkpoint = narrow_file(torch, reference, str(tmp_path), name, True, without_counters)
    assert not strict_load_refuses(torch, reference.WideResNet(depth=34, widen_factor=1, sub_block1=True), checkpoint)
    _, state, _ = zoo.load_model(name, str(tmp_path))
    assert state.params["conv1"]["kernel"].shape == (3, 3, 3, 16)
