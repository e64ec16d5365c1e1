"""A user's Flax module as the objectives, attacks and evaluation take it: Linen or NNX.

The objectives of `patjax.methods` take two forwards (docs/api.md): the training-mode forward
the update differentiates, `train_fn(x, state) -> (logits, state)`, and the forward of the inner
problem, `attack_fn(x) -> logits`. Here they are built from a Linen module and its variables
(`linen_forwards`, the functions patjax's own loop uses, `ModelFns`) or from an NNX module
(`nnx_forwards`), and an NNX module becomes the `ModelFns` and variables that evaluation and
patjax's training loop read (`nnx_model_fns`).

NNX's conventions: the module updates its BatchStat variables itself when called in training
mode (inside `nnx.value_and_grad`), so its `train_fn` threads `state` = None; the attack forward
and evaluation run a detached copy (`nnx.merge(..., copy=True)`) set as `model.eval()` sets it,
so the user's module keeps its mode and statistics.
"""

from __future__ import annotations

import inspect
from typing import Any

import jax
from flax import nnx

from patjax.core.errors import UserError
from patjax.models.networks import BN_MODES, ModelFns


def check_images_alone(fn, what: str) -> None:
    """A UserError unless `fn` (a module's __call__) can be called with the images alone."""
    try:
        parameters = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # no signature to read (a builtin): called with the images alone
        return
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    if not parameters or parameters[0].kind not in (*positional, inspect.Parameter.VAR_POSITIONAL):
        raise UserError(f"{what} must take the images as its first positional argument")
    required = [
        p.name for p in parameters[1:] if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]
    if required:
        raise UserError(
            f"{what} must take the images alone, but it requires {required}; wrap it in an nnx.Module whose "
            f"__call__(x) supplies them"
        )


def _batch_norm_modes(model: nnx.Module) -> set:
    """{True, False}: the use_running_average of every BatchNorm the module holds."""
    return {m.use_running_average for _, m in nnx.iter_modules(model) if isinstance(m, nnx.BatchNorm)}


def _check_nnx(model) -> None:
    if not isinstance(model, nnx.Module):
        raise UserError(f"expected a flax.nnx.Module, got {type(model).__name__}")
    check_images_alone(model.__call__, f"{type(model).__name__}.__call__")


# The variables a module updates in training mode and a run checkpoints (BatchStat and any other
# of the user's), apart from its parameters and its random layers' key state.
_STATS = nnx.Not(nnx.Any(nnx.Param, nnx.RngState))


def _split(model: nnx.Module):
    """(graphdef, params, statistics, key state): the parameters and statistics as pure dicts of
    arrays (what a checkpoint, a sharding and the evaluators' pytrees hold); the random layers'
    keys (nnx.Rngs, which inference mode does not draw from) kept as the module's State."""
    graphdef, params, rngs, rest = nnx.split(model, nnx.Param, nnx.RngState, ...)
    return graphdef, nnx.to_pure_dict(params), nnx.to_pure_dict(rest), rngs


def _merged(graphdef, params, rest, rngs, train: bool) -> nnx.Module:
    """A new module from the variables, in training or inference mode: `copy=True` gives it
    Variables of the current trace, so its BatchNorm may update them inside jax transforms
    without touching the module they came from."""
    model = nnx.merge(graphdef, nnx.State(params), rngs, nnx.State(rest), copy=True)
    if train:
        model.train()
    else:
        model.eval()
    return model


def nnx_logits_fn(model: nnx.Module, bn_mode: str = "inference"):
    """x -> logits of a detached copy of `model`: BatchNorm on its running statistics
    (bn_mode 'inference', as `model.eval()` sets it) or on the batch's ('train', the update of
    the running statistics discarded). The user's module is not changed. For the attacks, the
    sampler and the estimators, which differentiate with respect to the input only."""
    _check_nnx(model)
    if bn_mode not in BN_MODES:
        raise UserError(f"bn_mode must be one of {BN_MODES}, got {bn_mode!r}")
    graphdef, params, rest, rngs = _split(model)
    params, rest = jax.lax.stop_gradient((params, rest))
    return lambda x: _merged(graphdef, params, rest, rngs, bn_mode == "train")(x)


def nnx_forwards(model: nnx.Module, attack_bn_mode: str = "inference"):
    """(train_fn, attack_fn) of an NNX module for the objectives, inside the user's
    `nnx.value_and_grad` of the module: train_fn(x, state) = (model(x), state), the module in
    training mode updating its own BatchStat variables pass after pass (state stays None), and
    attack_fn `nnx_logits_fn(model, attack_bn_mode)`, a copy of the module as it is before the
    update. A module in inference mode is refused: its BatchNorm would train on the running
    statistics without a word."""
    _check_nnx(model)
    if True in _batch_norm_modes(model):
        raise UserError(
            f"{type(model).__name__} is in inference mode (BatchNorm use_running_average=True) where the training "
            f"forward is meant; call model.train() before the train step"
        )
    return (lambda x, state: (model(x), state)), nnx_logits_fn(model, attack_bn_mode)


def linen_forwards(module, params, batch_stats: Any = None, attack_bn_mode: str = "inference"):
    """(train_fn, attack_fn) of a Linen module whose __call__ takes (x, train=...): train_fn
    threads batch_stats through `module.apply(..., train=True, mutable=["batch_stats"])`, and
    attack_fn is the detached model with BatchNorm as attack_bn_mode says; the functions patjax's
    own training loop hands the objectives (`ModelFns`)."""
    fns = ModelFns(module.apply)
    return fns.train_fn(params), fns.attack_logits_fn(params, batch_stats or {}, attack_bn_mode)


def nnx_model_fns(model: nnx.Module):
    """(ModelFns, params, batch_stats) of an NNX module, Linen's apply convention over its
    variables as pure dicts (params: its nnx.Param variables; batch_stats: the others but its
    random layers' keys, BatchStat among them), for evaluation and patjax's training loop;
    `nnx_module` puts trained variables back into a module."""
    _check_nnx(model)
    graphdef, params, rest, rngs = _split(model)

    def apply(variables, x, train: bool = False, mutable=None):
        copy = _merged(graphdef, variables["params"], variables.get("batch_stats", rest), rngs, train)
        logits = copy(x)
        if not mutable:
            return logits
        return logits, {"batch_stats": nnx.to_pure_dict(nnx.state(copy, _STATS))}

    return ModelFns(apply), params, rest


def has_random_layers(model: nnx.Module) -> bool:
    """Whether the module holds key state (nnx.Rngs: Dropout and the like)."""
    return bool(jax.tree.leaves(nnx.state(model, nnx.RngState)))


def nnx_module(model: nnx.Module, params, batch_stats) -> nnx.Module:
    """A new module of `model`'s structure holding these variables (as `nnx_model_fns` returns
    them), in inference mode."""
    graphdef, _, _, rngs = _split(model)
    return _merged(graphdef, params, batch_stats, rngs, train=False)
