"""The suites that run on CPUs: the small CNN on real CIFAR-10, from seconds per run (`smoke_cpu`)
to 30 epochs near convergence (`convergence_cpu`); `patjax.configs.suites` lists them.
"""

from __future__ import annotations

import copy
from typing import Optional

import ml_collections

from patjax.configs.suites.protocols import (
    CHEAP_SAMPLER,
    GAUSSIAN_ONLY,
    STEPS_PER_EPOCH,
    TABLE1_CURVE_EVAL,
    TABLE1_EVAL,
    TABLE1_SUITE_EVAL,
)
from patjax.run import config as config_lib
from patjax.suites import Group, Suite, Sweep, SweepPoint, set_field

# The CPU suite's scale (see ablation_cpu_suite and docs/reproduction.md).
CPU_TRAIN_STEPS = 100
CPU_BATCH_SIZE = 128
CPU_LANGEVIN_STEPS = 5
CPU_PGD_STEPS = 5
CPU_EVAL_EXAMPLES = 500


def _cpu_config(
    data_dir: Optional[str],
    *,
    batch_size: int,
    train_steps: int,
    langevin_steps: int,
    eval_examples: int,
    eval_batch_size: int,
    pr: dict,
) -> ml_collections.ConfigDict:
    """The base config of the CPU suites: real CIFAR-10, the small CNN, lr 0.05 with the paper's
    MultiStepLR shape, PR with the suite's laws (`pr`: eval settings by their paths, pr.distributions)."""
    cfg = config_lib.default_config()
    cfg.dataset = "cifar10"
    cfg.data_dir = data_dir
    cfg.model = "small_cnn"
    cfg.batch_size = batch_size
    cfg.num_train_steps = train_steps
    cfg.learning_rate = 0.05
    cfg.langevin.steps = langevin_steps
    cfg.eval.num_examples = eval_examples
    cfg.eval.batch_size = eval_batch_size
    return config_lib.with_eval_overrides(cfg, pr)


def ablation_cpu_suite(data_dir: Optional[str]) -> Suite:
    """Real CIFAR-10, small CNN, T = 5, a fraction of an epoch; 5 methods x 2 seeds."""
    cfg = _cpu_config(
        data_dir,
        batch_size=CPU_BATCH_SIZE,
        train_steps=CPU_TRAIN_STEPS,
        langevin_steps=CPU_LANGEVIN_STEPS,
        eval_examples=CPU_EVAL_EXAMPLES,
        eval_batch_size=250,
        pr=GAUSSIAN_ONLY,
    )
    cfg.attack.steps = CPU_PGD_STEPS  # PGD / PGD-COR: the same number of inner gradient steps as T
    cfg.checkpoint_every_steps = 25
    cfg.log_every_steps = CPU_TRAIN_STEPS  # each log also measures accuracy on the 10,000 test images
    group = Group("cifar10_small_cnn", cfg, methods=("clean", "pgd", "pgd_cor", "pat_wos", "pat"), seeds=(0, 1))
    return Suite(
        name="ablation_cpu",
        description="CPU-scale test of Tables 1-2 on real CIFAR-10 (small CNN, scaled-down training)",
        groups=(group,),
        num_eval_examples=CPU_EVAL_EXAMPLES,
        eval_batch_size=250,
        evaluators=("clean", "pgd20", "cw20", "pr"),
        eval_overrides={**GAUSSIAN_ONLY, "seed": 0},
        keep_models=False,
        scaled_down=(
            "model: small CNN (3 conv stages 32/64/128) instead of ResNet-18 / WRN-50-2",
            f"training: {CPU_TRAIN_STEPS} steps of batch {CPU_BATCH_SIZE} "
            f"({CPU_TRAIN_STEPS * CPU_BATCH_SIZE} images, {CPU_TRAIN_STEPS * CPU_BATCH_SIZE / 50000:.2f} epochs of "
            f"the full 50,000-image training set) instead of 100 epochs of batch 256; lr 0.05 (paper 0.01) "
            f"with the paper's MultiStepLR shape (x0.1 at 75 % and 90 % of the run)",
            f"PAT / PAT(WOS): T = {CPU_LANGEVIN_STEPS} Langevin steps instead of 100 "
            f"(other sampler settings as the paper)",
            f"PGD / PGD-COR training attack: {CPU_PGD_STEPS} steps (paper: 10) of alpha 2/255 in the 8/255 "
            f"L-inf ball, so that PGD and PAT take the same number of inner gradient steps",
            f"evaluation: the first {CPU_EVAL_EXAMPLES} CIFAR-10 test images instead of 10,000; PGD-20 and CW-20 "
            f"as the paper (eps 8/255, alpha 2/255); PR with Gaussian noise, N = 100, eps 0.1/0.12/0.15/0.2",
            "seeds: 2 per method",
        ),
    )


# The smoke suite (smoke_cpu_suite): seconds per run, for tests and for trying out workers.
SMOKE_TRAIN_STEPS = 4
SMOKE_BATCH_SIZE = 32
SMOKE_EVAL_EXAMPLES = 16
SMOKE_EVAL = {
    "pr.distributions": ("uniform",),
    "seed": 0,
    "pr.samples": 4,
    "pr.chunk_size": 4,
    "attack.steps": 2,
    "bootstrap_resamples": 200,
}


def smoke_cpu_suite(data_dir: Optional[str]) -> Suite:
    """Real CIFAR-10, small CNN, 4 steps of batch 32, T = 2; clean and PAT x 2 seeds, evaluated
    on 16 images: every piece of a suite (claims, resume, report) in seconds per run."""
    # eval batch: also the batch of the training log's test accuracy: one batch
    cfg = _cpu_config(
        data_dir,
        batch_size=SMOKE_BATCH_SIZE,
        train_steps=SMOKE_TRAIN_STEPS,
        langevin_steps=2,
        eval_examples=SMOKE_EVAL_EXAMPLES,
        eval_batch_size=500,
        pr={"pr.distributions": ("uniform",)},
    )
    cfg.attack.steps = 2
    cfg.checkpoint_every_steps = 2
    cfg.log_every_steps = SMOKE_TRAIN_STEPS
    cfg.log_test_examples = 500
    cfg.progress_bar = False
    group = Group("cifar10_small_cnn", cfg, methods=("clean", "pat"), seeds=(0, 1))
    return Suite(
        name="smoke_cpu",
        description="smoke test of the suite machinery on real CIFAR-10 (a few steps; the figures mean nothing)",
        groups=(group,),
        num_eval_examples=SMOKE_EVAL_EXAMPLES,
        eval_batch_size=SMOKE_EVAL_EXAMPLES,
        evaluators=("clean", "pgd20", "pr"),
        eval_overrides=SMOKE_EVAL,
        curve_every_steps=2,
        curve_evaluators=("clean", "pr"),
        curve_methods=("pat",),
        curve_eval_overrides=SMOKE_EVAL,
        matched=((("cifar10_small_cnn", "pat"), ("cifar10_small_cnn", "clean")),),
        scaled_down=(
            "model: small CNN (3 conv stages 32/64/128)",
            f"training: {SMOKE_TRAIN_STEPS} steps of batch {SMOKE_BATCH_SIZE}; PAT with T = 2",
            f"evaluation: the first {SMOKE_EVAL_EXAMPLES} test images; PGD with 2 steps; PR with N = 4; PAT's "
            "learning curve at step 2",
        ),
    )


# The stationary CPU suite (stationary_cpu_suite): 2 epochs of CIFAR-10, the sampler at stationarity.
STATIONARY_TRAIN_STEPS = 800  # 2.05 epochs of batch 128
STATIONARY_LANGEVIN_STEPS = 35  # the diagnostic: the uniform-start chain is at its endpoint by step 32
STATIONARY_EVAL_EXAMPLES = 1000
STATIONARY_T_SWEEP = (5, 10, 25, 100)  # plus STATIONARY_LANGEVIN_STEPS from the main group


def stationary_cpu_suite(data_dir: Optional[str]) -> Suite:
    """Real CIFAR-10, small CNN, 2 epochs, PAT's sampler at stationarity (T = 35 and 100),
    PGD with the paper's 10 steps; a T-sweep and the opt-in cheaper sampler, one seed each."""
    cfg = _cpu_config(
        data_dir,
        batch_size=CPU_BATCH_SIZE,
        train_steps=STATIONARY_TRAIN_STEPS,
        langevin_steps=STATIONARY_LANGEVIN_STEPS,
        eval_examples=STATIONARY_EVAL_EXAMPLES,
        eval_batch_size=250,
        pr=GAUSSIAN_ONLY,
    )
    cfg.checkpoint_every_steps = 50
    cfg.log_every_steps = 200
    cfg.progress_bar = False
    groups = [Group("cifar10_small_cnn", cfg, methods=("clean", "pgd", "pgd_cor", "pat_wos", "pat"), seeds=(0, 1))]
    for steps in STATIONARY_T_SWEEP:
        swept = copy.deepcopy(cfg)
        swept.langevin.steps = steps
        groups.append(Group(f"pat_T{steps}", swept, methods=("pat",), seeds=(0,)))
    cheap = copy.deepcopy(cfg)
    for key, value in CHEAP_SAMPLER.items():
        set_field(cheap, key, value)
    groups.append(Group("pat_clean_start_T20", cheap, methods=("pat",), seeds=(0,)))
    # PR(0.2) and PGD-20 against T (seed 0 of each), each paired with PGD and with the paper's T = 100.
    by_steps = {STATIONARY_LANGEVIN_STEPS: "cifar10_small_cnn", **{t: f"pat_T{t}" for t in STATIONARY_T_SWEEP}}
    paper = [
        SweepPoint(f"T = {t}", by_steps[t], "pat", 0, value=t, series="uniform start (Algorithm 1)")
        for t in sorted(by_steps)
    ]
    cheaper = SweepPoint(
        "start at x, T <= 20", "pat_clean_start_T20", "pat", 0, value=20, series="start at x, T <= 20, tolerance 3e-4"
    )
    sweep = Sweep(
        name="T",
        axis="Langevin steps T",
        points=(*paper, cheaper),
        baselines=(SweepPoint("PGD", "cifar10_small_cnn", "pgd", 0), SweepPoint("PAT T = 100", "pat_T100", "pat", 0)),
    )
    return Suite(
        name="stationary_cpu",
        description="CPU-scale test of the paper's claim with PAT's sampler at stationarity "
        "(small CNN, 2 epochs of CIFAR-10)",
        groups=tuple(groups),
        num_eval_examples=STATIONARY_EVAL_EXAMPLES,
        eval_batch_size=250,
        evaluators=("clean", "pgd20", "cw20", "pr"),
        eval_overrides={**GAUSSIAN_ONLY, "seed": 0},
        keep_models=False,
        scaled_down=(
            "model: small CNN (3 conv stages 32/64/128) instead of ResNet-18 / WRN-50-2",
            f"training: {STATIONARY_TRAIN_STEPS} steps of batch {CPU_BATCH_SIZE} "
            f"({STATIONARY_TRAIN_STEPS * CPU_BATCH_SIZE / 50000:.2f} epochs) instead of 100 epochs of batch 256; "
            "lr 0.05 (paper 0.01) with the paper's MultiStepLR shape",
            f"PAT / PAT(WOS): T = {STATIONARY_LANGEVIN_STEPS} (the chain is at its endpoint by then: "
            "docs/sampler_convergence.md); T = 5, 10, 25, 100 and the cheaper sampler (start at x, "
            "T = 20, tolerance 3e-4) in single-seed groups",
            "PGD / PGD-COR: the paper's 10 steps of alpha 2/255 in the 8/255 L-inf ball",
            f"evaluation: the first {STATIONARY_EVAL_EXAMPLES} CIFAR-10 test images; PGD-20, CW-20; "
            "PR with Gaussian noise, N = 100, eps 0.1/0.12/0.15/0.2",
            "seeds: 2 per method in the main group, 1 in the T-sweep groups",
        ),
        sweeps=(sweep,),
    )


# The Table-1 CPU suite (table1_cpu_suite): stationary_cpu's runs, kept, evaluated under the
# Table-1 protocol, with a checkpoint every CURVE_EVERY_STEPS for the matched-accuracy curves.
TABLE1_CURVE_EVERY_STEPS = 100


def table1_cpu_suite(data_dir: Optional[str]) -> Suite:
    """stationary_cpu's clean, PGD-10 and PAT (T = 35) runs and the cheaper sampler, 2 seeds each,
    evaluated under the Table-1 protocol (uniform noise headline, Gaussian and p_dis beside) with
    learning curves for the comparison at matched clean accuracy (docs/reproduction.md)."""
    cfg = _cpu_config(
        data_dir,
        batch_size=CPU_BATCH_SIZE,
        train_steps=STATIONARY_TRAIN_STEPS,
        langevin_steps=STATIONARY_LANGEVIN_STEPS,
        eval_examples=STATIONARY_EVAL_EXAMPLES,
        eval_batch_size=250,
        pr=TABLE1_EVAL,
    )
    cfg.checkpoint_every_steps = TABLE1_CURVE_EVERY_STEPS
    cfg.max_checkpoints_to_keep = STATIONARY_TRAIN_STEPS // TABLE1_CURVE_EVERY_STEPS  # every curve point
    cfg.log_every_steps = 200
    cfg.progress_bar = False
    cheap = copy.deepcopy(cfg)
    for key, value in CHEAP_SAMPLER.items():
        set_field(cheap, key, value)
    groups = (
        Group("cifar10_small_cnn", cfg, methods=("clean", "pgd", "pat"), seeds=(0, 1)),
        Group("pat_clean_start_T20", cheap, methods=("pat",), seeds=(0, 1)),
    )
    return Suite(
        name="table1_cpu",
        description="CPU-scale comparison of PAT and PGD under the Table-1 PR protocol, with learning "
        "curves for matched clean accuracy (small CNN, 2 epochs of CIFAR-10)",
        groups=groups,
        num_eval_examples=STATIONARY_EVAL_EXAMPLES,
        eval_batch_size=250,
        evaluators=("clean", "pgd20", "cw20", "pr"),
        eval_overrides=TABLE1_SUITE_EVAL,
        curve_every_steps=TABLE1_CURVE_EVERY_STEPS,
        curve_evaluators=("clean", "pr"),
        curve_methods=("pgd", "pat"),
        matched=(
            (("cifar10_small_cnn", "pat"), ("cifar10_small_cnn", "pgd")),
            (("pat_clean_start_T20", "pat"), ("cifar10_small_cnn", "pgd")),
        ),
        curve_eval_overrides=TABLE1_CURVE_EVAL,
        scaled_down=(
            "model: small CNN (3 conv stages 32/64/128) instead of ResNet-18 / WRN-50-2",
            f"training: {STATIONARY_TRAIN_STEPS} steps of batch {CPU_BATCH_SIZE} "
            f"({STATIONARY_TRAIN_STEPS * CPU_BATCH_SIZE / 50000:.2f} epochs) instead of 100 epochs of batch 256; "
            "lr 0.05 (paper 0.01) with the paper's MultiStepLR shape",
            f"PAT: T = {STATIONARY_LANGEVIN_STEPS} (the chain is at its endpoint by then: "
            "docs/sampler_convergence.md); the cheaper sampler (start at x, T = 20, tolerance 3e-4) beside it",
            "PGD: the paper's 10 steps of alpha 2/255 in the 8/255 L-inf ball",
            f"evaluation: the first {STATIONARY_EVAL_EXAMPLES} CIFAR-10 test images; PGD-20, CW-20; PR under the "
            "Table-1 protocol (uniform noise, N = 100, eps 0.1/0.12/0.15/0.2, clean-correct images), Gaussian "
            "and p_dis beside; learning curves (clean, uniform PR) every "
            f"{TABLE1_CURVE_EVERY_STEPS} steps",
            "seeds: 2 per method",
        ),
    )


# The convergence CPU suite (convergence_cpu_suite): Appendix E's optimizer, batch and schedule
# shape for 30 epochs, so that PAT and PGD are compared near convergence, as Table 1 compares them.
CONVERGENCE_EPOCHS = 30
CONVERGENCE_CURVE_EVERY_EPOCHS = 3


def convergence_cpu_suite(data_dir: Optional[str]) -> Suite:
    """Clean, PGD-10 and PAT (the cheaper sampler) on the small CNN for 30 epochs with the paper's
    optimizer (SGD, Nesterov 0.9, weight decay 5e-4, lr 0.01, batch 256, x0.1 at 75 % and 90 % of
    the run), 2 seeds each, evaluated under the Table-1 protocol, with learning curves (clean,
    PGD-20, uniform PR) every 3 epochs (docs/reproduction.md). Too long for one sitting: its
    unfinished runs travel between machines in git (`--handover`)."""
    cfg = _cpu_config(
        data_dir,
        batch_size=256,
        train_steps=-1,
        langevin_steps=CHEAP_SAMPLER["langevin.steps"],
        eval_examples=STATIONARY_EVAL_EXAMPLES,
        eval_batch_size=250,
        pr=TABLE1_EVAL,
    )
    cfg.num_epochs = CONVERGENCE_EPOCHS
    cfg.learning_rate = config_lib.default_config().learning_rate  # Appendix E's 0.01
    curve_every = CONVERGENCE_CURVE_EVERY_EPOCHS * STEPS_PER_EPOCH
    # A checkpoint every epoch (a stopped worker loses at most one), all kept until the run's
    # curve models are (`--handover`, or the run's end).
    cfg.checkpoint_every_steps = STEPS_PER_EPOCH
    cfg.max_checkpoints_to_keep = CONVERGENCE_EPOCHS
    cfg.log_every_steps = STEPS_PER_EPOCH
    cfg.log_test_examples = STATIONARY_EVAL_EXAMPLES
    cfg.progress_bar = False
    # Seed-major, so that an interrupted suite holds the three methods of seed 0 first.
    group = Group(
        "cifar10_small_cnn",
        cfg,
        methods=("clean", "pgd", "pat"),
        seeds=(0, 1),
        method_overrides={"pat": CHEAP_SAMPLER},
    )
    return Suite(
        name="convergence_cpu",
        description="PAT against PGD near convergence under the Table-1 PR protocol (small CNN, 30 epochs "
        "of CIFAR-10 with the paper's optimizer and schedule shape)",
        groups=(group,),
        num_eval_examples=STATIONARY_EVAL_EXAMPLES,
        eval_batch_size=250,
        evaluators=("clean", "pgd20", "cw20", "pr"),
        eval_overrides=TABLE1_SUITE_EVAL,
        curve_every_steps=curve_every,
        curve_evaluators=("clean", "pgd20", "pr"),
        curve_eval_overrides=TABLE1_CURVE_EVAL,
        matched=((("cifar10_small_cnn", "pat"), ("cifar10_small_cnn", "pgd")),),
        scaled_down=(
            "model: small CNN (3 conv stages 32/64/128) instead of ResNet-18 / WRN-50-2",
            f"training: {CONVERGENCE_EPOCHS} epochs instead of 100, with Appendix E's optimizer, batch 256, "
            "lr 0.01 and MultiStepLR shape (x0.1 at 75 % and 90 % of the run: epochs 22 and 27)",
            "PAT: the cheaper sampler (start at x, T <= 20, tolerance 3e-4: docs/sampler_convergence.md) "
            "instead of Algorithm 1's uniform start with T = 100",
            "PGD: the paper's 10 steps of alpha 2/255 in the 8/255 L-inf ball",
            f"evaluation: the first {STATIONARY_EVAL_EXAMPLES} CIFAR-10 test images; PGD-20, CW-20; PR under the "
            "Table-1 protocol (uniform noise, N = 100, eps 0.1/0.12/0.15/0.2, clean-correct images), Gaussian "
            f"and p_dis beside; learning curves (clean, PGD-20, uniform PR) every {CONVERGENCE_CURVE_EVERY_EPOCHS} "
            "epochs",
            "seeds: 2 per method",
        ),
    )
