"""Worst-case attacks in L-inf pixel space, shared by training methods and evaluation: the
projection, the losses PGD ascends, FGSM (and its AT-PR form) and PGD. The training baselines'
inner maximizations are `inner`, APGD and APGD-T `apgd`, the L2 attacks `l2`.

Every attack is a pure function of a `logits_fn` (x -> logits, normalization inside the
model), a PRNG key and arrays, loops with `jax.lax`, and returns its result under
`stop_gradient`. Adversarial examples always lie in the eps-ball around x intersected
with [0, 1]^d.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from patjax.attacks.logits import LogitsFn, check_inference_mode, margin


def project_linf(x_adv: jax.Array, x: jax.Array, eps: float | jax.Array) -> jax.Array:
    """Projection onto {|x_adv - x|_inf <= eps} intersected with [0, 1]^d."""
    return jnp.clip(jnp.clip(x_adv, x - eps, x + eps), 0.0, 1.0)


def cross_entropy_loss(logits: jax.Array, y: jax.Array) -> jax.Array:
    """Per-example cross-entropy (the loss PGD ascends)."""
    return optax.softmax_cross_entropy_with_integer_labels(logits, y)


def cw_margin_loss(logits: jax.Array, y: jax.Array, kappa: float = 50.0) -> jax.Array:
    """Per-example CW loss as in the common CW-inf evaluation: -max(z_y - max_{j!=y} z_j + kappa, 0)."""
    return -jnp.maximum(kappa - margin(logits, y), 0.0)


def input_gradient(logits_fn: LogitsFn, loss_fn, x_adv: jax.Array, y: jax.Array) -> jax.Array:
    """Gradient of the summed per-example loss w.r.t. the input (per-example gradients)."""
    check_inference_mode(logits_fn)
    return jax.grad(lambda z: jnp.sum(loss_fn(logits_fn(z), y)))(x_adv)


def fgsm(logits_fn: LogitsFn, x: jax.Array, y: jax.Array, eps: float) -> jax.Array:
    """FGSM (Goodfellow et al. 2015): x + eps * sign(grad CE), no random start, clipped to [0,1]."""
    grad = input_gradient(logits_fn, cross_entropy_loss, x, y)
    return jax.lax.stop_gradient(project_linf(x + eps * jnp.sign(grad), x, eps))


def pgd(
    logits_fn: LogitsFn,
    key: jax.Array,
    x: jax.Array,
    y: jax.Array,
    *,
    eps: float,
    step_size: float,
    steps: int,
    loss_fn=cross_entropy_loss,
    random_start: bool = True,
) -> jax.Array:
    """L-inf PGD (Madry et al. 2018): sign-gradient ascent on loss_fn, projected every step.

    random_start: x + U(-eps, eps)^d (MadryLab/cifar10_challenge), else start at x.
    """
    x_adv = x
    if random_start:
        x_adv = project_linf(x + jax.random.uniform(key, x.shape, x.dtype, -eps, eps), x, eps)

    def step(_, x_adv):
        grad = input_gradient(logits_fn, loss_fn, x_adv, y)
        return project_linf(x_adv + step_size * jnp.sign(grad), x, eps)

    return jax.lax.stop_gradient(jax.lax.fori_loop(0, steps, step, x_adv))


# FGSM with its gradient taken at a random point, as in AT-PR's code (a form of the `fgsm` method).
def fgsm_random_point(logits_fn: LogitsFn, key: jax.Array, x: jax.Array, y: jax.Array, eps: float) -> jax.Array:
    """FGSM as in wellzline/AT-PR attack_algorithms.py `fgsm_loss`: the CE gradient is taken at
    clip(x + U(-eps, eps)^d, 0, 1), the step eps * sign(grad) starts from x itself."""
    x_random = jnp.clip(x + jax.random.uniform(key, x.shape, x.dtype, -eps, eps), 0.0, 1.0)
    grad = input_gradient(logits_fn, cross_entropy_loss, x_random, y)
    return jax.lax.stop_gradient(project_linf(x + eps * jnp.sign(grad), x, eps))
