"""The train state (one pytree that checkpoints whole) and the model it belongs to; the optimizer
that updates it is `patjax.run.optimizer`.

The workdir that holds a run's config and checkpoints is `patjax.run.workdir`."""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import optax

from patjax.core.errors import UserError, check_counts, count
from patjax.data import cifar
from patjax.models import networks
from patjax.models.networks import ModelFns


@flax.struct.dataclass
class TrainState:
    step: jax.Array
    params: Any
    batch_stats: Any
    opt_state: Any
    rng: jax.Array  # raw uint32 key; the step key is fold_in(fold_in(rng, 1), step)


DEFAULT_WIDTH = 64  # config.model_width's default: the ResNets' stem width in the paper


@dataclasses.dataclass(frozen=True)
class ModelSettings:
    """Which network, for which data, in which precision (config: model, model_width, dataset,
    compute_dtype)."""

    name: str
    dataset: str
    # ResNet / WRN stem width (64 in the paper; the small CNN has none); 1,024 is 16 times it, a
    # ResNet-18 of 2.8 billion parameters.
    width: int = count("model_width", 1, 1024)
    compute_dtype: str = "float32"

    def __post_init__(self):
        cifar.check_dataset(self.dataset)
        networks.check_model(self.name)
        check_counts(self)
        if self.name not in networks.TAKES_WIDTH and self.name != "small_cnn" and self.width != DEFAULT_WIDTH:
            raise UserError(f"model {self.name!r} has its width in its name; model_width must stay {DEFAULT_WIDTH}")
        if self.compute_dtype not in ("float32", "bfloat16"):
            raise UserError(f"compute_dtype must be 'float32' or 'bfloat16', got {self.compute_dtype!r}")

    def build(self):
        kwargs = {"width": self.width} if self.name in networks.TAKES_WIDTH else {}
        dtype = jnp.bfloat16 if self.compute_dtype == "bfloat16" else jnp.float32
        return networks.create_model(self.name, self.dataset, cifar.NUM_CLASSES[self.dataset], dtype=dtype, **kwargs)


def inference_state(params, batch_stats, step=0) -> TrainState:
    """A state to evaluate, not to train: the model's variables at `step`, without optimizer
    state or random key (a kept model, a PyTorch state_dict, a model handed to `patjax.api`)."""
    return TrainState(
        step=jnp.asarray(step, jnp.int32), params=params, batch_stats=batch_stats, opt_state=None, rng=None
    )


def create_train_state(model_settings: ModelSettings, seed: int, tx: optax.GradientTransformation):
    """(ModelFns, TrainState) of the model, initialized from the seed."""
    model = model_settings.build()
    root = jax.random.PRNGKey(int(seed))
    init_key, rng = jax.random.split(root)
    params, batch_stats = networks.init_variables(model, init_key)
    state = TrainState(
        step=jnp.zeros((), jnp.int32), params=params, batch_stats=batch_stats, opt_state=tx.init(params), rng=rng
    )
    return ModelFns(model.apply), state
