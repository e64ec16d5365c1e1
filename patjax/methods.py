"""Training objectives ("methods"), registered by name.

A method is a pure function

    method(params, model, batch_stats, x, y, key, cfg) -> (loss, (new_batch_stats, metrics))

differentiated with respect to `params` by the train step, so the compiled step is the same
for every method and `--config.method=NAME` selects one. `model` is a `ModelFns` pair of
pure apply functions (inference mode / training mode); `cfg` is the full ConfigDict (static).

Conventions shared by all methods:
- Inner attacks/samplers see the parameters under `stop_gradient` and run BatchNorm in
  inference mode (running statistics, nothing updated) unless `cfg.langevin.bn_mode` says
  'train' -- the PyTorch reference calls `model.eval()` before the sampler.
- The outer loss runs the model in training mode on the adversarial batch: batch statistics
  normalize it and the running statistics are updated from it (Algorithm 2, line 16).
- Reductions over the batch are over the *global* batch: the step is written on global
  arrays, so under `jax.sharding` the SNIS softmax still normalizes over every example.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax

from patjax import samplers
from patjax.errors import UserError


@dataclasses.dataclass(frozen=True)
class ModelFns:
    """Pure apply functions of a Flax module with (optional) BatchNorm."""

    apply: Callable[..., Any]

    def infer(self, params, batch_stats, x):
        """Logits with BatchNorm in inference mode (running statistics)."""
        return self.apply({"params": params, "batch_stats": batch_stats}, x, train=False)

    def train(self, params, batch_stats, x):
        """(logits, new_batch_stats) with BatchNorm normalizing by batch statistics."""
        if not batch_stats:
            return self.apply({"params": params}, x, train=True), batch_stats
        logits, updates = self.apply({"params": params, "batch_stats": batch_stats}, x,
                                     train=True, mutable=["batch_stats"])
        return logits, updates["batch_stats"]

    def attack_logits_fn(self, params, batch_stats, bn_mode: str = "inference"):
        """x -> logits for inner attacks: detached parameters, no statistics update."""
        params = jax.lax.stop_gradient(params)
        batch_stats = jax.lax.stop_gradient(batch_stats)
        if bn_mode == "inference":
            return lambda x: self.infer(params, batch_stats, x)
        if bn_mode == "train":  # batch statistics, running averages discarded
            return lambda x: self.train(params, batch_stats, x)[0]
        raise UserError(f"unknown bn_mode {bn_mode!r}; choose 'inference' or 'train'")


def snis_weights(losses: jax.Array, beta: float) -> jax.Array:
    """Self-normalized importance weights over the batch (Algorithm 2, lines 17-18; Eq. 1).

    w = softmax(Detach(-beta * l)): beta = 0 gives uniform weights (PAT(WOS)).
    """
    return jax.nn.softmax(jax.lax.stop_gradient(-beta * losses), axis=0)


def weighted_loss(losses: jax.Array, beta: float):
    """(sum_i w_i l_i, w) with the SNIS weights (Algorithm 2, line 19)."""
    weights = snis_weights(losses, beta)
    return jnp.sum(weights * losses), weights


def _accuracy(logits, y):
    return jnp.mean(jnp.argmax(logits, axis=-1) == y)


def _weighted_update(params, model: ModelFns, batch_stats, x_adv, y, beta):
    """Phase 2 of Algorithm 2 on a given adversarial batch."""
    logits, new_batch_stats = model.train(params, batch_stats, x_adv)
    losses = optax.softmax_cross_entropy_with_integer_labels(logits, y)   # line 16
    loss, weights = weighted_loss(losses, beta)
    metrics = {
        "loss": loss,
        "adv_accuracy": _accuracy(logits, y),
        "snis_weight_mean": jnp.mean(weights),
        "snis_weight_max": jnp.max(weights),
    }
    return loss, (new_batch_stats, metrics)


def langevin_adversarial_batch(params, model: ModelFns, batch_stats, x, y, key, cfg):
    """Phase 1 of Algorithm 2: x_adv from the Langevin sampler, lines 7-14."""
    logits_fn = model.attack_logits_fn(params, batch_stats, cfg.langevin.get("bn_mode", "inference"))
    settings = samplers.LangevinSettings.from_config(cfg.langevin)
    return samplers.langevin_sample(logits_fn, key, x, y, settings)


def pat(params, model, batch_stats, x, y, key, cfg):
    """PAT (Algorithm 2): Langevin samples, SNIS-weighted cross-entropy with beta = cfg.pat.beta."""
    x_adv = langevin_adversarial_batch(params, model, batch_stats, x, y, key, cfg)
    return _weighted_update(params, model, batch_stats, x_adv, y, float(cfg.pat.beta))


def pat_wos(params, model, batch_stats, x, y, key, cfg):
    """PAT(WOS), the ablation without the importance weight: beta = 0 (mean loss)."""
    x_adv = langevin_adversarial_batch(params, model, batch_stats, x, y, key, cfg)
    return _weighted_update(params, model, batch_stats, x_adv, y, 0.0)


METHODS: dict[str, Callable[..., Any]] = {
    "pat": pat,
    "pat_wos": pat_wos,
}


def get_method(name: str):
    if name not in METHODS:
        raise UserError(f"unknown method {name!r}; choose one of {sorted(METHODS)}")
    return METHODS[name]
