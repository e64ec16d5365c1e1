"""RobustBench's CIFAR-10 L-infinity and L2 model zoos (`robustbench.model_zoo.cifar10.linf` and
`.l2`, robustbench 1.1.1): the entries whose networks patjax's models are, with the input
normalization RobustBench's definition of each applies, read from the checkpoint file as
RobustBench keeps it.

RobustBench's `load_model(NAME, model_dir, threat_model=T)` downloads the authors' checkpoint to
MODEL_DIR/cifar10/T/NAME.pt and loads it into its definition of the network after taking the
state_dict out of its container (`checkpoint["state_dict"]`; `["last"]` for
Andriushchenko2020Understanding) and dropping the `module.` and `model.` prefixes of its keys.
`load_model` here reads that same file the same way (`torch.load(weights_only=True)`), so a
checkpoint already there needs neither the robustbench package nor a network; a missing one is
fetched through the package when it is installed.

The normalization is RobustBench's, not the file's: most entries take [0, 1] inputs as they are;
Wong2020Fast and Chen2020Efficient register mu and sigma buffers in their classes (CIFAR-10
statistics with sigma 0.2471, not patjax's 0.2470), which the checkpoints lack
(RobustBench loads them with strict=False); Hendrycks2019Using computes 2x - 1, which is mean 0.5,
std 0.5. Entries with other networks (DMWideResNet with Swish and its own normalization, WRN-28-4
with per-image normalization, ResNet-50, WRN-34-15, WRN-70-16, ...) are not covered: patjax has no
such network, and an entry is refused rather than loaded into a network that is not its own.

The L2 zoo names some entries as the L-inf zoo does with other networks: its Rice2020Overfitting is
a PreAct ResNet-18 (PreActBlockV2, a BatchNorm before the head), not the L-inf entry's WRN-34-20.
Its normalizations are each class's own (Rony2019Decoupling's rounded statistics, Augustin's at
full precision); none of its covered entries is a TRADES WideResNet with sub_block1. Not covered:
the ResNet-50s (Augustin2020Adversarial, Engstrom2019Robustness), WRN-28-4 with per-image
normalization (Ding2020MMA), and the DMWideResNet / DMPreActResNet networks with Swish or SiLU
(Gowal, Rebuffi, Rade, Wang2023Better) and MeanSparse's.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Optional

from patjax.core.errors import UserError, one_line
from patjax.interop import torch_weights

DATASET = "cifar10"
THREAT_MODELS = ("Linf", "L2")  # RobustBench's names, its folders under MODEL_DIR/cifar10/
CONTAINER = "state_dict"  # robustbench.utils.load_model's checkpoint["state_dict"]
DEFAULT_MODEL_DIR = "models"  # robustbench.utils.load_model's default model_dir ('./models')
# The mu and sigma RobustBench's CIFAR-10 classes register (Wong2020FastNet, Chen2020EfficientNet).
CIFAR10_BUFFERS = ((0.4914, 0.4822, 0.4465), (0.2471, 0.2435, 0.2616))
TWO_X_MINUS_ONE = ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))  # Hendrycks2019UsingNet: x -> 2x - 1
RONY2019_BUFFERS = ((0.491, 0.482, 0.447), (0.247, 0.243, 0.262))  # Rony2019DecouplingNet's
AUGUSTIN2020_BUFFERS = (  # Augustin2020AdversarialWideNet's, at the precision its class writes them
    (0.4913997551666284, 0.48215855929893703, 0.4465309133731618),
    (0.24703225141799082, 0.24348516474564, 0.26158783926049628),
)


@dataclasses.dataclass(frozen=True)
class Entry:
    model: str  # a network of patjax.models.networks
    normalize: Optional[tuple] = None  # (mean, std) RobustBench's class applies; None: [0, 1] inputs
    container: Optional[str] = None  # the checkpoint key RobustBench reads the state_dict from first
    # WideResNet(..., sub_block1=True): RobustBench's network holds TRADES' unused copy of block1,
    # so its strict load_state_dict needs those weights in the file; without it, refuses them.
    sub_block1: bool = False


_WRN28, _WRN34, _WRN34_20, _R18 = Entry("wrn28_10"), Entry("wrn34_10"), Entry("wrn34_20"), Entry("resnet18")
# With RobustBench's sub_block1=True.
_WRN28_SUB, _WRN34_SUB = Entry("wrn28_10", sub_block1=True), Entry("wrn34_10", sub_block1=True)
_WRN34_20_SUB = Entry("wrn34_20", sub_block1=True)
# RobustBench's definition of each: WideResNet(depth, widen_factor[, sub_block1]) (TRADES'),
# ResNet18 (kuangliu's), PreActResNet(PreActBlock, [2, 2, 2, 2]).
LINF = {
    "Andriushchenko2020Understanding": Entry("preact_resnet18_v1", container="last"),
    "Carmon2019Unlabeled": _WRN28_SUB,
    "Sehwag2020Hydra": _WRN28_SUB,
    "Wang2020Improving": _WRN28_SUB,
    "Hendrycks2019Using": Entry("wrn28_10", TWO_X_MINUS_ONE),
    # RobustBench loads this one with strict=False (its class's mu and sigma are not in the file),
    # which would also pass keys its network lacks; patjax refuses them, as for every other entry.
    "Rice2020Overfitting": Entry("wrn34_20", CIFAR10_BUFFERS),
    "Zhang2019Theoretically": _WRN34_SUB,
    "Huang2020Self": _WRN34_SUB,
    "Wong2020Fast": Entry("preact_resnet18_v1", CIFAR10_BUFFERS),
    "Zhang2019You": _WRN34_SUB,
    "Zhang2020Attacks": _WRN34_SUB,
    "Wu2020Adversarial_extra": _WRN28_SUB,
    "Wu2020Adversarial": _WRN34,
    "Sehwag2021Proxy": _WRN34,
    "Sehwag2021Proxy_R18": _R18,
    "Sitawarin2020Improving": _WRN34_SUB,
    "Chen2020Efficient": Entry("wrn34_10", CIFAR10_BUFFERS, sub_block1=True),
    "Cui2020Learnable_34_20": _WRN34_20_SUB,
    "Cui2020Learnable_34_10": _WRN34_SUB,
    "Zhang2020Geometry": _WRN28_SUB,
    "Sridhar2021Robust": _WRN28_SUB,
    "Addepalli2021Towards_RN18": _R18,
    "Addepalli2021Towards_WRN34": _WRN34_SUB,
    "Chen2021LTD_WRN34_10": _WRN34,
    "Chen2021LTD_WRN34_20": _WRN34_20,
    "Standard": _WRN28,
    "Jia2022LAS-AT_34_10": _WRN34,
    "Addepalli2022Efficient_RN18": _R18,
    "Addepalli2022Efficient_WRN_34_10": _WRN34,
    "Cui2023Decoupled_WRN-34-10": _WRN34,
    "Chen2024Data_WRN_34_10": _WRN34,
    "Chen2024Data_WRN_34_20": _WRN34_20,
}
# robustbench 1.1.1's cifar10.l2: WideResNet(...) with sub_block1=False throughout, ResNet18,
# PreActResNet(PreActBlockV2, [2, 2, 2, 2], bn_before_fc=True). The classes with mu and sigma
# buffers are loaded by RobustBench with strict=False (the files lack them); patjax refuses any
# other missing or extra key, as for the L-inf entries.
L2 = {
    "Rice2020Overfitting": Entry("preact_resnet18", CIFAR10_BUFFERS),
    "Rony2019Decoupling": Entry("wrn28_10", RONY2019_BUFFERS),
    "Standard": _WRN28,
    "Wu2020Adversarial": _WRN34,
    "Sehwag2021Proxy": _WRN34,
    "Sehwag2021Proxy_R18": _R18,
    "Augustin2020Adversarial_34_10": Entry("wrn34_10", AUGUSTIN2020_BUFFERS),
    "Augustin2020Adversarial_34_10_extra": Entry("wrn34_10", AUGUSTIN2020_BUFFERS),
}
ZOO = {"Linf": LINF, "L2": L2}


def entry(name: str, threat_model: str = "Linf") -> Entry:
    if threat_model not in ZOO:
        raise UserError(f"{threat_model!r} is not a RobustBench threat model patjax reads; choose {', '.join(ZOO)}")
    if name not in ZOO[threat_model]:
        raise UserError(
            f"{name!r} is not a RobustBench CIFAR-10 {threat_model} entry whose network patjax has; "
            f"these are: {', '.join(ZOO[threat_model])} (docs/api.md)"
        )
    return ZOO[threat_model][name]


def checkpoint_path(name: str, model_dir: str = DEFAULT_MODEL_DIR, threat_model: str = "Linf") -> str:
    """Where RobustBench keeps the entry's checkpoint."""
    return os.path.join(model_dir, DATASET, threat_model, f"{name}.pt")


def fetch(name: str, model_dir: str = DEFAULT_MODEL_DIR, threat_model: str = "Linf") -> str:
    """The entry's checkpoint file: the one already in model_dir, else downloaded there by the
    robustbench package (its load_model), which needs the package and internet access."""
    entry(name, threat_model)
    path = checkpoint_path(name, model_dir, threat_model)
    if os.path.isfile(path):
        return path
    try:
        from robustbench.utils import load_model as robustbench_load  # optional: only to download
    except ModuleNotFoundError as error:
        if (error.name or "").split(".")[0] != "robustbench":
            raise UserError(_broken_robustbench(path, error)) from None
        raise UserError(
            f"{path} does not exist; fetching {name} needs the robustbench package "
            "(pip install robustbench) and internet access"
        ) from None
    except Exception as error:  # installed, but its own import fails (its dependencies are many and pinned)
        raise UserError(_broken_robustbench(path, error)) from None
    try:
        robustbench_load(name, model_dir=model_dir, dataset=DATASET, threat_model=threat_model)
    except Exception as error:  # downloads fail in many ways (HTTP, quota, disk)
        raise UserError(f"robustbench could not fetch {name}: {one_line(error)[:200]}") from None
    if not os.path.isfile(path):
        raise UserError(f"robustbench fetched {name} but {path} does not exist")
    return path


def _broken_robustbench(path: str, error: BaseException) -> str:
    return (
        f"{path} does not exist, and the robustbench package that would fetch it is installed but cannot be "
        f"imported ({type(error).__name__}: {one_line(error)[:200]}); repair its installation, or put the "
        "checkpoint file there"
    )


def load_model(name: str, model_dir: str = DEFAULT_MODEL_DIR, threat_model: str = "Linf"):
    """(model_fns, state, path) of the zoo entry `name` of `threat_model` as its patjax network,
    with RobustBench's input normalization; a file that records its own mu and sigma must agree
    with it."""
    zoo_entry = entry(name, threat_model)
    path = fetch(name, model_dir, threat_model)
    # RobustBench looks under the entry's key, then under "state_dict" only.
    containers = ((zoo_entry.container,) if zoo_entry.container else ()) + (CONTAINER,)
    tensors = torch_weights.read_state_dict(path, containers)
    normalize = zoo_entry.normalize or (None, None)
    model_fns, state = torch_weights.load_arrays(
        tensors, zoo_entry.model, DATASET, normalize, source=path, sub_block1=zoo_entry.sub_block1
    )
    return model_fns, state, path
