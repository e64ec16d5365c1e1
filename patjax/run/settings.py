"""A run's and an evaluation's settings, typed and frozen: what travels below the doors once a
config has been read (`config.train_settings`, `config.evaluation_settings`, the one conversion
from a ConfigDict). Each class checks its own fields once, in `__post_init__`; nothing here reads
a config, a workdir or a command line."""

from __future__ import annotations

import dataclasses
from typing import Optional

from patjax import evaluators as evaluators_lib
from patjax import methods
from patjax.core.errors import INT32_MAX, UserError, check_counts, count
from patjax.data import cifar
from patjax.evaluators import common as evaluators_common
from patjax.run import optimizer as optimizer_lib
from patjax.run import state

WHOLE_SPLIT = -1  # eval.num_examples meaning every image of the test split


@dataclasses.dataclass(frozen=True)
class EvaluationSettings:
    """What an evaluation reads, typed and checked once from a config (`config.evaluation_settings`):
    the test split, the evaluators, how many images, and what each evaluator is handed."""

    dataset: str
    data_dir: Optional[str]
    evaluators: tuple  # names of the registry, in its order (`evaluators.parse`)
    evaluator_settings: evaluators_common.Settings
    # The first images of the split (capped at its size); 0 is refused rather than read as "all":
    # a full evaluation takes hours on a CPU.
    num_examples: int = count("eval.num_examples", 1, 1_000_000, sentinel=WHOLE_SPLIT, meaning="the whole test split")
    batch_size: int = count("eval.batch_size", 1, 10_000)  # at most the test split

    def __post_init__(self):
        check_counts(self)
        norm = self.evaluator_settings[evaluators_common.THREAT_BLOCK].norm
        chosen = [evaluators_lib.REGISTRY[name] for name in self.evaluators]
        lacking = [e.name for e in chosen if e.norms is not None and norm not in e.norms]
        if lacking:
            able = [name for name, e in evaluators_lib.REGISTRY.items() if e.norms is None or norm in e.norms]
            raise UserError(
                f"{', '.join(lacking)} cannot attack under eval.attack.norm={norm!r}; under {norm} choose from "
                f"{', '.join(able)}"
            )


@dataclasses.dataclass(frozen=True)
class TrainSettings:
    """A run's training settings, typed and checked once from its config (`config.train_settings`,
    the one place a config is turned into settings; below the command lines and the suite runner
    nothing else reads it)."""

    model: state.ModelSettings
    optimizer: optimizer_lib.OptimizerSettings  # SGD, MultiStepLR and the run's length
    method: methods.MethodSettings
    data_dir: Optional[str]  # absolute, so that evaluate may run from another directory
    # A batch is at most the training split (both CIFARs': 50,000 images), else an epoch has no step.
    batch_size: int = count("batch_size", 1, 50_000)
    seed: int = count("seed", 0, evaluators_common.SEED_LIMIT - 1)  # PRNGKey keeps 32 bits
    # The every-epoch and whole-split sentinels (<= 0) of these three counts are their whole
    # negative range; their upper bound is the step counter's.
    checkpoint_every_steps: int = count("checkpoint_every_steps", -INT32_MAX, INT32_MAX)  # <= 0: every epoch
    max_checkpoints_to_keep: int = count("max_checkpoints_to_keep", 1, 10_000)
    log_every_steps: int = count("log_every_steps", -INT32_MAX, INT32_MAX)  # <= 0: every epoch
    log_test_examples: int = count("log_test_examples", -INT32_MAX, INT32_MAX)  # <= 0: the whole test split
    progress_bar: bool
    evaluation: EvaluationSettings  # how the run is evaluated (its config's `eval` block)
    # The config as config.json holds it: what a resume is checked against, and every command's
    # record of the run.
    record: dict = dataclasses.field(compare=False, repr=False)

    def __post_init__(self):
        check_counts(self)
        # The train state's step is int32: a run longer than that would wrap its step, its
        # schedule and its keys (`state.TrainState`).
        if self.total_steps() > INT32_MAX:
            raise UserError(
                f"the run is {self.total_steps():,} steps (num_epochs x steps per epoch), more than the int32 step "
                f"counter holds ({INT32_MAX:,}); lower num_epochs or num_train_steps"
            )

    @property
    def dataset(self) -> str:
        return self.model.dataset

    def steps_per_epoch(self) -> int:
        """Batches in an epoch of the official training split (the last partial batch is dropped)."""
        return cifar.NUM_TRAIN[self.dataset] // self.batch_size

    def total_steps(self) -> int:
        """The run's length in steps: num_train_steps, else num_epochs epochs."""
        return self.optimizer.total_steps(self.steps_per_epoch())


def handed_on(first: EvaluationSettings, own: EvaluationSettings) -> EvaluationSettings:
    """A later model of a comparison evaluated as the `first` one is: `own`'s test split and data
    folder (the model's), `first`'s evaluators, images, batch and every evaluator setting as the
    first model's config resolved them (PR's p_dis c1 and entropic lambda included), handed on
    typed, so that every model sees the same images and noise and every figure is made alike."""
    return dataclasses.replace(
        own,
        evaluators=first.evaluators,
        num_examples=first.num_examples,
        batch_size=first.batch_size,
        evaluator_settings=first.evaluator_settings,
    )
