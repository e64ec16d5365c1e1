"""The Langevin sampler of adversarial examples (paper, Algorithm 1; batched as in Algorithm 2, lines 7-14).

x_adv starts uniform in [0,1]^d and runs T projected Langevin steps on the energy

    untargeted (Sec. 3):  E(x_adv) = sum_i c1 ||x_adv_i - x_i||^2 - c2 f(x_adv_i, y_i)
    targeted (Sec. 2.2):  E(x_adv) = sum_i c1 ||x_adv_i - x_i||^2 + c2 f(x_adv_i, y_tar_i)

with f the cross-entropy. The targeted energy is -log p_dis - log p_vic of Zhang et al.
(2024), p_vic(x; y_tar) ~ exp(-c2 f(x, y_tar)): descending it pulls x_adv toward the target
label; the untargeted energy pushes it away from the true label.

Randomness is drawn per example from `fold_in(key, i)`, so sample i depends only on
(x_i, y_i), its index and the key -- not on the other images of the batch, nor on the
batch size or on how the batch is split over devices.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Optional

import jax
import jax.numpy as jnp
import optax

LogitsFn = Callable[[jax.Array], jax.Array]


@dataclasses.dataclass(frozen=True)
class LangevinSettings:
    """Hyperparameters of Algorithm 1; defaults are Appendix E's."""

    steps: int = 100          # T
    step_size: float = 0.3    # eta
    noise_scale: float = 0.001  # sigma
    grad_clip: float = 1.0    # rho
    c1: float = 0.3
    c2: float = 0.42

    @classmethod
    def from_config(cls, cfg) -> "LangevinSettings":
        return cls(steps=int(cfg.steps), step_size=float(cfg.step_size),
                   noise_scale=float(cfg.noise_scale), grad_clip=float(cfg.grad_clip),
                   c1=float(cfg.c1), c2=float(cfg.c2))


def per_example_keys(key: jax.Array, batch_size: int, offset: jax.Array | int = 0) -> jax.Array:
    """One key per example, `fold_in(key, offset + i)`: independent of batch size and split."""
    return jax.vmap(lambda i: jax.random.fold_in(key, i))(jnp.arange(batch_size) + offset)


def langevin_energy(logits_fn: LogitsFn, x_adv, x, labels, c1: float, c2: float,
                    targeted: bool = False) -> jax.Array:
    """Batch energy of Algorithm 2, line 11 (a scalar: the sum over examples)."""
    cross_entropy = optax.softmax_cross_entropy_with_integer_labels(logits_fn(x_adv), labels)
    squared_distance = jnp.sum(jnp.square(x_adv - x), axis=tuple(range(1, x.ndim)))
    sign = 1.0 if targeted else -1.0
    return jnp.sum(c1 * squared_distance + sign * c2 * cross_entropy)


def langevin_sample(logits_fn: LogitsFn, key: jax.Array, x: jax.Array, y: jax.Array,
                    settings: LangevinSettings, target: Optional[jax.Array] = None,
                    index_offset: jax.Array | int = 0) -> jax.Array:
    """Draws x_adv ~ p_adv(. ; x, y) with T projected Langevin steps (Algorithm 1).

    Args:
      logits_fn: x -> logits, a pure function of the input only (the caller closes over the
        model variables; the training step passes BatchNorm in inference mode).
      key: PRNG key; example i uses `fold_in(key, index_offset + i)`.
      x: clean images in [0, 1], shape (B, H, W, C).
      y: true labels (B,).
      settings: T, eta, sigma, rho, c1, c2.
      target: if given, target labels (B,) for the targeted attack of Zhang et al. (2024).
      index_offset: global index of x[0], for per-example randomness.
    Returns:
      x_adv in [0, 1]^d with the shape and dtype of x, under stop_gradient.
    """
    s = settings
    keys = per_example_keys(key, x.shape[0], index_offset)
    init_keys, noise_keys = jnp.moveaxis(jax.vmap(lambda k: jax.random.split(k))(keys), 1, 0)
    sample_shape = x.shape[1:]
    # Algorithm 1, "Initialize": x_adv ~ Uniform[0,1]^d.
    x_adv = jax.vmap(lambda k: jax.random.uniform(k, sample_shape, x.dtype))(init_keys)
    labels = y if target is None else target
    energy_grad = jax.grad(
        lambda xa: langevin_energy(logits_fn, xa, x, labels, s.c1, s.c2, target is not None))

    def step(t, x_adv):
        noise = jax.vmap(lambda k: jax.random.normal(jax.random.fold_in(k, t), sample_shape, x.dtype))(
            noise_keys)
        x_adv = jnp.clip(x_adv + s.noise_scale * noise, 0.0, 1.0)    # line 10: apply noise
        v = jnp.clip(energy_grad(x_adv), -s.grad_clip, s.grad_clip)  # lines 11-12
        return jnp.clip(x_adv - s.step_size * v, 0.0, 1.0)           # line 13

    x_adv = jax.lax.fori_loop(0, s.steps, step, x_adv)
    return jax.lax.stop_gradient(x_adv)
