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

from patjax.attacks.logits import LogitsFn, check_inference_mode
from patjax.core.errors import UserError, check_counts, count

INITS = ("uniform", "clean")


@dataclasses.dataclass(frozen=True)
class LangevinSettings:
    """Hyperparameters of Algorithm 1; defaults are Appendix E's.

    `init` and `tolerance` are opt-in departures that make the sampler cheaper; their
    defaults are exactly Algorithm 1 (uniform start, T steps):
      init='clean' starts the chain at x instead of Uniform[0,1]^d;
      tolerance > 0 freezes each chain once its drift -- the mean over pixels of
        |x_{t+1} - (x_t + noise)|, the gradient step after projection, without the injected
        noise whose size never shrinks -- falls below it, and leaves the loop when every
        chain of the batch is frozen; T stays the maximum.
    """

    steps: int = count("langevin.steps", 0, 100_000, default=100)  # T; 1,000 times the paper's bound
    step_size: float = 0.3  # eta
    noise_scale: float = 0.001  # sigma
    grad_clip: float = 1.0  # rho
    c1: float = 0.3
    c2: float = 0.42
    init: str = "uniform"
    tolerance: float = 0.0

    def __post_init__(self):
        """The one check of these fields, wherever the settings come from (a config, a flag)."""
        check_counts(self)
        # Algorithm 1: eta, sigma, c1, c2 >= 0 and rho > 0; a negative step or weight would turn
        # the sampler's descent on the energy into an ascent and still train without complaint.
        if min(self.step_size, self.noise_scale, self.c1, self.c2) < 0 or not self.grad_clip > 0:
            raise UserError(
                "langevin.step_size, noise_scale, c1 and c2 must be >= 0 and langevin.grad_clip > 0, "
                f"got {self.step_size}, {self.noise_scale}, {self.c1}, {self.c2}, {self.grad_clip}"
            )
        if self.init not in INITS:
            raise UserError(f"langevin.init must be one of {', '.join(INITS)}, got {self.init!r}")
        if not self.tolerance >= 0:
            raise UserError(f"langevin.tolerance must be >= 0 (0: always T steps), got {self.tolerance}")


def per_example_keys(key: jax.Array, batch_size: int, offset: jax.Array | int = 0) -> jax.Array:
    """One key per example, `fold_in(key, offset + i)`: independent of batch size and split."""
    return jax.vmap(lambda i: jax.random.fold_in(key, i))(jnp.arange(batch_size) + offset)


def langevin_energy(logits_fn: LogitsFn, x_adv, x, labels, c1: float, c2: float, targeted: bool = False) -> jax.Array:
    """Batch energy of Algorithm 2, line 11 (a scalar: the sum over examples)."""
    return jnp.sum(per_example_energy(logits_fn, x_adv, x, labels, c1, c2, targeted))


def per_example_energy(
    logits_fn: LogitsFn, x_adv, x, labels, c1: float, c2: float, targeted: bool = False
) -> jax.Array:
    """E(x_adv_i) of each example (B,): c1 ||x_adv_i - x_i||^2 -+ c2 CE(x_adv_i)."""
    cross_entropy = optax.softmax_cross_entropy_with_integer_labels(logits_fn(x_adv), labels)
    squared_distance = jnp.sum(jnp.square(x_adv - x), axis=tuple(range(1, x.ndim)))
    sign = 1.0 if targeted else -1.0
    return c1 * squared_distance + sign * c2 * cross_entropy


@dataclasses.dataclass(frozen=True)
class Chain:
    """The pieces of Algorithm 1 for one batch, shared by the sampler and its diagnostic."""

    start: jax.Array  # x_0, (B, H, W, C)
    step: Callable[[jax.Array, jax.Array], tuple]  # (t, x_t) -> (x_{t+1}, drift (B,))


def langevin_chain(
    logits_fn: LogitsFn,
    key: jax.Array,
    x: jax.Array,
    y: jax.Array,
    settings: LangevinSettings,
    target: Optional[jax.Array] = None,
    index_offset: jax.Array | int = 0,
) -> Chain:
    """The start and the step of Algorithm 1 (arguments as `langevin_sample`)."""
    check_inference_mode(logits_fn)
    s = settings
    keys = per_example_keys(key, x.shape[0], index_offset)
    init_keys, noise_keys = jnp.moveaxis(jax.vmap(lambda k: jax.random.split(k))(keys), 1, 0)
    sample_shape = x.shape[1:]
    if s.init == "uniform":  # Algorithm 1, "Initialize": x_adv ~ Uniform[0,1]^d.
        start = jax.vmap(lambda k: jax.random.uniform(k, sample_shape, x.dtype))(init_keys)
    else:
        start = x
    labels = y if target is None else target
    energy_grad = jax.grad(lambda xa: langevin_energy(logits_fn, xa, x, labels, s.c1, s.c2, target is not None))
    pixel_axes = tuple(range(1, x.ndim))

    def step(t, x_adv):
        noise = jax.vmap(lambda k: jax.random.normal(jax.random.fold_in(k, t), sample_shape, x.dtype))(noise_keys)
        noisy = jnp.clip(x_adv + s.noise_scale * noise, 0.0, 1.0)  # line 10: apply noise
        v = jnp.clip(energy_grad(noisy), -s.grad_clip, s.grad_clip)  # lines 11-12
        new = jnp.clip(noisy - s.step_size * v, 0.0, 1.0)  # line 13
        return new, jnp.mean(jnp.abs(new - noisy), axis=pixel_axes)

    return Chain(start=start, step=step)


def langevin_sample(
    logits_fn: LogitsFn,
    key: jax.Array,
    x: jax.Array,
    y: jax.Array,
    settings: LangevinSettings,
    target: Optional[jax.Array] = None,
    index_offset: jax.Array | int = 0,
) -> jax.Array:
    """Draws x_adv ~ p_adv(. ; x, y) with T projected Langevin steps (Algorithm 1).

    Args:
      logits_fn: x -> logits, a pure function of the input only (the caller closes over the
        model variables; the training step passes BatchNorm in inference mode).
      key: PRNG key; example i uses `fold_in(key, index_offset + i)`.
      x: clean images in [0, 1], shape (B, H, W, C).
      y: true labels (B,).
      settings: T, eta, sigma, rho, c1, c2 (and the opt-in init and tolerance).
      target: if given, target labels (B,) for the targeted attack of Zhang et al. (2024).
      index_offset: global index of x[0], for per-example randomness.
    Returns:
      x_adv in [0, 1]^d with the shape and dtype of x, under stop_gradient.
    """
    return langevin_sample_with_steps(logits_fn, key, x, y, settings, target, index_offset)[0]


def langevin_sample_with_steps(
    logits_fn: LogitsFn,
    key: jax.Array,
    x: jax.Array,
    y: jax.Array,
    settings: LangevinSettings,
    target: Optional[jax.Array] = None,
    index_offset: jax.Array | int = 0,
):
    """(x_adv, steps (B,) int32): `langevin_sample` and the steps each chain took."""
    s = settings
    chain = langevin_chain(logits_fn, key, x, y, s, target, index_offset)
    batch = x.shape[0]
    if s.tolerance <= 0:
        x_adv = jax.lax.fori_loop(0, s.steps, lambda t, xa: chain.step(t, xa)[0], chain.start)
        return jax.lax.stop_gradient(x_adv), jnp.full((batch,), s.steps, jnp.int32)

    # Convergence exit: a frozen chain keeps its sample, so example i's result depends only on
    # its own chain; the rest of the batch decides only when the compiled loop ends.
    def cond(carry):
        t, _, active, _ = carry
        return (t < s.steps) & jnp.any(active)

    def body(carry):
        t, x_adv, active, steps = carry
        new, drift = chain.step(t, x_adv)
        keep = active.reshape((batch,) + (1,) * (x.ndim - 1))
        x_adv = jnp.where(keep, new, x_adv)
        steps = steps + active.astype(jnp.int32)
        return t + 1, x_adv, active & (drift >= s.tolerance), steps

    carry = (jnp.int32(0), chain.start, jnp.ones((batch,), bool), jnp.zeros((batch,), jnp.int32))
    _, x_adv, _, steps = jax.lax.while_loop(cond, body, carry)
    return jax.lax.stop_gradient(x_adv), steps
