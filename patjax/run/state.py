"""The train state (one pytree that checkpoints whole) and the model it belongs to; the optimizer
that updates it is `patjax.run.optimizer`.

The workdir that holds a run's config and checkpoints is `patjax.run.workdir`."""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import optax
from flax import nnx

from patjax.core.errors import UserError, check_counts, count
from patjax.data import cifar
from patjax.models import forwards, networks
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


def user_model(model):
    """(ModelFns, params, batch_stats, description) of a user's module to train in patjax's loop:
    an `nnx.Module` (`forwards.nnx_model_fns`: its variables as pure dicts, its own values the
    initial ones) or a Linen (module, variables) pair whose __call__ takes (x, train); the
    description (its class and every variable's shape) is what a resumed run must match."""
    if isinstance(model, nnx.Module):
        if forwards.has_random_layers(model):
            # The step hands the model no key, so Dropout would draw the same mask at every step.
            raise UserError(
                f"{type(model).__name__} has random layers (nnx.Rngs): patjax's step draws no key for them; "
                f"train it in your own loop with patjax's objectives (docs/api.md)"
            )
        fns, params, batch_stats = forwards.nnx_model_fns(model)
        kind, name = "nnx", type(model).__name__
    elif isinstance(model, tuple) and len(model) == 2 and isinstance(model[0], nn.Module):
        module, variables = model
        name = type(module).__name__
        if "train" not in inspect.signature(module.__call__).parameters:
            raise UserError(f"{name}.__call__ must take train= to be trained (BatchNorm's two modes)")
        if not isinstance(variables, dict) or "params" not in variables or set(variables) - {"params", "batch_stats"}:
            raise UserError("the variables of a (module, variables) pair must be a dict of 'params' and 'batch_stats'")
        fns, params, batch_stats = ModelFns(module.apply), variables["params"], variables.get("batch_stats", {})
        kind = "linen"
    else:
        raise UserError("model must be a flax.nnx.Module or a (flax linen module, variables) pair")
    networks.check_finite({"params": params, "batch_stats": batch_stats}, f"the {name} passed")
    shapes = {
        jax.tree_util.keystr(path): list(leaf.shape)
        for path, leaf in jax.tree_util.tree_leaves_with_path({"params": params, "batch_stats": batch_stats})
    }
    return fns, params, batch_stats, {"kind": kind, "class": name, "variables": shapes}


def user_train_state(params, batch_stats, seed: int, tx: optax.GradientTransformation) -> TrainState:
    """The train state of a user's module: its own variables, the run's key from the seed as
    `create_train_state` draws it."""
    _, rng = jax.random.split(jax.random.PRNGKey(int(seed)))
    return TrainState(
        step=jnp.zeros((), jnp.int32), params=params, batch_stats=batch_stats, opt_state=tx.init(params), rng=rng
    )
