"""The train state (one pytree that checkpoints whole), the model it belongs to, and the optimizer.

The workdir that holds a run's config and checkpoints is `patjax.workdir`."""

from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import optax

from patjax import data, models
from patjax.models import ModelFns


@flax.struct.dataclass
class TrainState:
    step: jax.Array
    params: Any
    batch_stats: Any
    opt_state: Any
    rng: jax.Array  # raw uint32 key; the step key is fold_in(fold_in(rng, 1), step)


def compute_dtype(cfg):
    return jnp.bfloat16 if cfg.compute_dtype == "bfloat16" else jnp.float32


def build_model(cfg):
    kwargs = {} if cfg.model == "small_cnn" else {"width": int(cfg.model_width)}
    return models.create_model(
        cfg.model, cfg.dataset, data.NUM_CLASSES[cfg.dataset], dtype=compute_dtype(cfg), **kwargs
    )


def total_steps(cfg, steps_per_epoch: int) -> int:
    return int(cfg.num_train_steps) if cfg.num_train_steps > 0 else int(cfg.num_epochs) * steps_per_epoch


def lr_milestones(cfg, steps_per_epoch: int) -> list[int]:
    """The steps at which MultiStepLR (Appendix E) multiplies the learning rate by the decay:
    the given fractions of the run; with epoch-based runs on epoch boundaries (75 and 90 of 100)."""
    if cfg.num_train_steps > 0:
        return sorted(int(round(f * cfg.num_train_steps)) for f in cfg.lr_decay_fractions)
    return sorted(int(round(f * cfg.num_epochs)) * steps_per_epoch for f in cfg.lr_decay_fractions)


def learning_rate_schedule(cfg, steps_per_epoch: int) -> optax.Schedule:
    """MultiStepLR (Appendix E): lr x decay at each of `lr_milestones`."""
    scales = {}
    for b in lr_milestones(cfg, steps_per_epoch):  # coinciding milestones multiply, as in MultiStepLR
        scales[b] = scales.get(b, 1.0) * float(cfg.lr_decay_factor)
    return optax.piecewise_constant_schedule(float(cfg.learning_rate), scales)


def make_optimizer(cfg, schedule: optax.Schedule) -> optax.GradientTransformation:
    """PyTorch SGD(momentum, nesterov, weight_decay): g += wd*p; b = m*b + g; step = g + m*b."""
    return optax.chain(
        optax.add_decayed_weights(float(cfg.weight_decay)),
        optax.sgd(schedule, momentum=float(cfg.momentum), nesterov=bool(cfg.nesterov)),
    )


def create_train_state(cfg, tx: optax.GradientTransformation):
    """(ModelFns, TrainState) for the config, initialized from cfg.seed."""
    model = build_model(cfg)
    root = jax.random.PRNGKey(int(cfg.seed))
    init_key, rng = jax.random.split(root)
    params, batch_stats = models.init_variables(model, init_key)
    state = TrainState(
        step=jnp.zeros((), jnp.int32), params=params, batch_stats=batch_stats, opt_state=tx.init(params), rng=rng
    )
    return ModelFns(model.apply), state
