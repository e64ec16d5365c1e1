"""The suites at the paper's model scale, for GPUs: `table1_gpu` (ResNet-18, 30 epochs, one GPU)
and `paper_full` (Tables 1 and 2 at the paper's settings); `patjax.configs.suites` lists them.
"""

from __future__ import annotations

from typing import Optional

from patjax.configs.suites.protocols import (
    CHEAP_SAMPLER,
    STEPS_PER_EPOCH,
    TABLE1_CURVE_EVAL,
    TABLE1_EVAL,
    TABLE1_SUITE_EVAL,
)
from patjax.run import config as config_lib
from patjax.suites import Group, Suite

# The Table-1 GPU suite (table1_gpu_suite): convergence_cpu's comparison at the paper's scale,
# ResNet-18, sized to the measured H100 rates (docs/reproduction.md has the arithmetic).
TABLE1_GPU_EPOCHS = 30
TABLE1_GPU_CURVE_EVERY_EPOCHS = 5
TABLE1_GPU_EVAL_EXAMPLES = 10_000  # the whole CIFAR-10 test split


def table1_gpu_suite(data_dir: Optional[str]) -> Suite:
    """PGD-10 and PAT (the cheaper sampler) on ResNet-18 for 30 epochs with the paper's optimizer
    (SGD, Nesterov 0.9, weight decay 5e-4, lr 0.01, batch 256, x0.1 at 75 % and 90 % of the run),
    seed 0, evaluated on the 10,000 test images under the Table-1 protocol, with learning curves
    (clean, uniform PR) every 5 epochs (docs/reproduction.md). A GPU suite: one run of it takes
    minutes on an H100 and days on a CPU."""
    cfg = config_lib.default_config()  # Appendix E's optimizer, batch 256 and schedule shape
    cfg.dataset = "cifar10"
    cfg.model = "resnet18"
    cfg.data_dir = data_dir
    cfg.num_epochs = TABLE1_GPU_EPOCHS
    cfg = config_lib.with_eval_overrides(cfg, TABLE1_EVAL)
    cfg.eval.num_examples = TABLE1_GPU_EVAL_EXAMPLES
    curve_every = TABLE1_GPU_CURVE_EVERY_EPOCHS * STEPS_PER_EPOCH
    # A checkpoint at every curve point, each kept until its model is (the run's end, a stop at
    # --max_minutes, or `--handover`), and one more for a stop's own checkpoint.
    cfg.checkpoint_every_steps = curve_every
    cfg.max_checkpoints_to_keep = TABLE1_GPU_EPOCHS // TABLE1_GPU_CURVE_EVERY_EPOCHS + 1
    cfg.log_every_steps = STEPS_PER_EPOCH  # each epoch: clean accuracy on the 10,000 test images
    cfg.log_test_examples = TABLE1_GPU_EVAL_EXAMPLES
    cfg.progress_bar = False
    group = Group(
        "cifar10_resnet18",
        cfg,
        methods=("pgd", "pat"),
        seeds=(0,),
        method_overrides={"pat": CHEAP_SAMPLER},
    )
    return Suite(
        name="table1_gpu",
        description="PAT against PGD-10 at the paper's model scale under the Table-1 PR protocol (ResNet-18, "
        "30 epochs of CIFAR-10 with the paper's optimizer and schedule shape, one GPU)",
        groups=(group,),
        num_eval_examples=TABLE1_GPU_EVAL_EXAMPLES,
        eval_batch_size=500,
        evaluators=("clean", "pgd20", "cw20", "pr"),
        eval_overrides=TABLE1_SUITE_EVAL,
        curve_every_steps=curve_every,
        curve_evaluators=("clean", "pr"),
        curve_eval_overrides=TABLE1_CURVE_EVAL,
        curve_methods=("pgd", "pat"),
        matched=((("cifar10_resnet18", "pat"), ("cifar10_resnet18", "pgd")),),
        scaled_down=(
            f"training: {TABLE1_GPU_EPOCHS} epochs instead of 100, with Appendix E's optimizer, batch 256, lr 0.01 "
            "and MultiStepLR shape (x0.1 at 75 % and 90 % of the run: epochs 22 and 27)",
            "PAT: the cheaper sampler (start at x, T <= 20, tolerance 3e-4: docs/sampler_convergence.md) "
            "instead of Algorithm 1's uniform start with T = 100",
            "PGD: the paper's 10 steps of alpha 2/255 in the 8/255 L-inf ball",
            "evaluation: the 10,000 CIFAR-10 test images; PGD-20, CW-20; PR under the Table-1 protocol (uniform "
            "noise, N = 100, eps 0.1/0.12/0.15/0.2, clean-correct images), Gaussian and p_dis beside; learning "
            f"curves (clean, uniform PR) every {TABLE1_GPU_CURVE_EVERY_EPOCHS} epochs",
            "seeds: 1 per method",
        ),
    )


# The defenses of the paper's Tables 1 and 2, in the registry's order (the registry also holds
# methods outside the paper, such as Cohen et al.'s Gaussian augmentation).
PAPER_METHODS = (
    "clean",
    "fgsm",
    "fgsm_cor",
    "pgd",
    "pgd_cor",
    "alp",
    "clp",
    "trades",
    "mart",
    "atpr",
    "pat_wos",
    "pat",
)
PAPER_GROUPS = (("cifar10", "resnet18"), ("cifar10", "wrn50_2"), ("cifar100", "resnet18"), ("cifar100", "wrn50_2"))


def paper_full_suite(data_dir: Optional[str]) -> Suite:
    """Tables 1 and 2 at the paper's settings (Appendix E): every method, 4 dataset x model blocks."""
    groups = []
    for dataset, model in PAPER_GROUPS:
        cfg = config_lib.default_config()  # Appendix E: T = 100, 100 epochs, batch 256, ...
        cfg.dataset = dataset
        cfg.model = model
        cfg.data_dir = data_dir
        cfg.progress_bar = True
        groups.append(Group(f"{dataset}_{model}", cfg, methods=PAPER_METHODS, seeds=(0,)))
    return Suite(
        name="paper_full",
        description="Tables 1 and 2 of the paper at its settings (ResNet-18 / WRN-50-2, CIFAR-10/100, "
        "T = 100, 100 epochs, every method)",
        groups=tuple(groups),
        num_eval_examples=-1,
        eval_batch_size=500,
        evaluators=("clean", "pgd20", "cw20", "pr"),
        eval_overrides=TABLE1_SUITE_EVAL,
        scaled_down=(),
    )
