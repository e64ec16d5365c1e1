"""SGD and its MultiStepLR schedule over the run (Appendix E), and the run's length: the optimizer
that updates the train state (`patjax.run.state`)."""

from __future__ import annotations

import dataclasses

import optax

from patjax.core.errors import INT32_MAX, UserError, check_counts, count, integer

USE_EPOCHS = -1  # num_train_steps meaning "num_epochs epochs"


@dataclasses.dataclass(frozen=True)
class OptimizerSettings:
    """SGD and its MultiStepLR schedule over the run (Appendix E), and the run's length (config:
    learning_rate, momentum, nesterov, weight_decay, lr_decay_fractions, lr_decay_factor,
    num_epochs, num_train_steps)."""

    learning_rate: float
    momentum: float
    nesterov: bool
    weight_decay: float
    decay_fractions: tuple
    decay_factor: float
    # With num_train_steps set, num_epochs is not read (but recorded), so 0 is allowed then; the
    # run's length in steps is bounded by the int32 step counter (`settings.TrainSettings`).
    num_epochs: int = count("num_epochs", 0, 1_000_000)
    # > 0 overrides num_epochs; USE_EPOCHS: num_epochs sets the length
    num_train_steps: int = count(
        "num_train_steps", 1, INT32_MAX, sentinel=USE_EPOCHS, meaning="num_epochs sets the length"
    )

    def __post_init__(self):
        check_counts(self)
        if self.num_train_steps == USE_EPOCHS:
            integer("num_epochs", self.num_epochs, 1, 1_000_000)
        # Finite in float32 is every config number's rule (`errors.finite_numbers`, applied to the whole config).
        if not self.learning_rate > 0:
            raise UserError(f"learning_rate must be > 0, got {self.learning_rate}")
        # MultiStepLR's milestones are points of the run and its gamma a positive factor: a
        # negative fraction would put a decay before step 0 (a lower rate from the start, silently).
        if any(not 0 < f < 1 for f in self.decay_fractions):
            raise UserError(
                f"lr_decay_fractions must each be in (0, 1), fractions of the run (none: no decay), "
                f"got {tuple(self.decay_fractions)}"
            )
        if not self.decay_factor > 0:
            raise UserError(f"lr_decay_factor must be > 0, got {self.decay_factor}")
        if not 0 <= self.momentum < 1 or self.weight_decay < 0:
            raise UserError(
                f"momentum must be in [0, 1) and weight_decay >= 0, got {self.momentum}, {self.weight_decay}"
            )

    def total_steps(self, steps_per_epoch: int) -> int:
        return self.num_train_steps if self.num_train_steps > 0 else self.num_epochs * steps_per_epoch

    def lr_milestones(self, steps_per_epoch: int) -> list[int]:
        """The steps at which MultiStepLR (Appendix E) multiplies the learning rate by the decay:
        the given fractions of the run; with epoch-based runs on epoch boundaries (75 and 90 of 100)."""
        if self.num_train_steps > 0:
            return sorted(int(round(f * self.num_train_steps)) for f in self.decay_fractions)
        return sorted(int(round(f * self.num_epochs)) * steps_per_epoch for f in self.decay_fractions)

    def schedule(self, steps_per_epoch: int) -> optax.Schedule:
        """MultiStepLR (Appendix E): lr x decay at each of `lr_milestones`."""
        scales = {}
        for b in self.lr_milestones(steps_per_epoch):  # coinciding milestones multiply, as in MultiStepLR
            scales[b] = scales.get(b, 1.0) * self.decay_factor
        return optax.piecewise_constant_schedule(self.learning_rate, scales)


def make_optimizer(o: OptimizerSettings, schedule: optax.Schedule) -> optax.GradientTransformation:
    """PyTorch SGD(momentum, nesterov, weight_decay): g += wd*p; b = m*b + g; step = g + m*b."""
    return optax.chain(
        optax.add_decayed_weights(o.weight_decay),
        optax.sgd(schedule, momentum=o.momentum, nesterov=o.nesterov),
    )
