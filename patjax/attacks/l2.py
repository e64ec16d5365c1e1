"""Worst-case attacks in L2 pixel space: the projection onto the L2 ball around x intersected with
[0, 1]^d, and PGD-L2 (Madry et al. 2018 under the L2 threat model) as torchattacks' `PGDL2` runs
it: normalized-gradient steps, the perturbation rescaled into the ball, the image clipped to
[0, 1]. The L-inf attacks are `pgd`.

Pure functions of a `logits_fn` (x -> logits), a PRNG key and arrays, loops with `jax.lax`, results
under `stop_gradient`; norms are per example, over every pixel and channel.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from patjax.attacks import pgd as pgd_lib
from patjax.attacks.logits import LogitsFn
from patjax.attacks.pgd import cross_entropy_loss, input_gradient

# torchattacks' `eps_for_division`: keeps a zero gradient's normalization finite.
EPS_FOR_DIVISION = 1e-10


def norms(v: jax.Array, keepdims: bool = True) -> jax.Array:
    """Per-example L2 norms over every pixel and channel: shaped to broadcast against v, or (B,)."""
    return jnp.sqrt(jnp.sum(jnp.square(v), axis=tuple(range(1, v.ndim)), keepdims=keepdims))


def project_l2(x_adv: jax.Array, x: jax.Array, eps: float | jax.Array) -> jax.Array:
    """x + delta with delta = x_adv - x scaled by min(1, eps / |delta|_2), then clipped to
    [0, 1]^d (torchattacks `PGDL2`: the rescaling first, the clip after; a point that is x itself
    stays x)."""
    delta = x_adv - x
    norm = norms(delta)
    factor = jnp.where(norm > 0, jnp.minimum(eps / jnp.where(norm > 0, norm, 1.0), 1.0), 1.0)
    return jnp.clip(x + delta * factor, 0.0, 1.0)


def l2_random_start(key: jax.Array, x: jax.Array, eps: float) -> jax.Array:
    """torchattacks `PGDL2`'s random start: a Gaussian direction scaled to a radius r * eps,
    r ~ U(0, 1) per example (uniform in radius, not in the ball's volume), then clipped."""
    k_direction, k_radius = jax.random.split(key)
    delta = jax.random.normal(k_direction, x.shape, x.dtype)
    radius = jax.random.uniform(k_radius, (x.shape[0],) + (1,) * (x.ndim - 1), x.dtype)
    return jnp.clip(x + delta * (radius / norms(delta) * eps), 0.0, 1.0)


def pgd_l2(
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
    """L2 PGD: x_{t+1} = project_l2(x_t + step_size * g / (|g|_2 + 1e-10)), g the gradient of the
    summed per-example loss at x_t (torchattacks `PGDL2.forward`). torchattacks differentiates the
    batch's mean loss, a gradient 1/B times this one: after the normalization the two steps differ
    only through the 1e-10, by a relative 1e-10 * (B - 1) / |g|_2 at most."""
    x_adv = l2_random_start(key, x, eps) if random_start else x

    def step(_, x_adv):
        grad = input_gradient(logits_fn, loss_fn, x_adv, y)
        return project_l2(x_adv + step_size * grad / (norms(grad) + EPS_FOR_DIVISION), x, eps)

    return jax.lax.stop_gradient(jax.lax.fori_loop(0, steps, step, x_adv))


def trades_l2_ascent(
    logits_fn: LogitsFn, x_start: jax.Array, x: jax.Array, target, *, eps, steps, loss_fn
) -> jax.Array:
    """TRADES' L2 inner maximization (yaodongyu/TRADES trades.py, distance='l_2'; MART's L2 form
    runs it on the CE loss, `inner.mart_attack`): delta from
    x_start - x, `steps` SGD steps of lr = 2 eps / steps along the loss gradient divided by its
    per-example L2 norm, then x + delta clamped to [0, 1] and delta renormed to L2 <= eps (clamp
    first, then the ball: torchattacks' PGDL2 is the other way round). Where a gradient is exactly
    0 the reference draws a random direction; here the step is 0 there (the 1e-10 of
    EPS_FOR_DIVISION), which changes nothing where the gradient is not 0."""
    step_size = 2.0 * eps / jnp.maximum(steps, 1)

    def step(_, x_adv):
        grad = input_gradient(logits_fn, loss_fn, x_adv, target)
        moved = jnp.clip(x_adv + step_size * grad / (norms(grad) + EPS_FOR_DIVISION), 0.0, 1.0)
        delta = moved - x
        norm = norms(delta)
        return x + delta * jnp.minimum(1.0, eps / jnp.where(norm > 0, norm, 1.0))

    return jax.lax.stop_gradient(jax.lax.fori_loop(0, steps, step, x_start))


# PGD under each threat model, one signature: what `attack.norm` (training) and `eval.attack.norm`
# (evaluation) choose from.
PGD_BY_NORM = {"linf": pgd_lib.pgd, "l2": pgd_l2}
NORMS = tuple(PGD_BY_NORM)
# Each norm's standard radius and PGD step on CIFAR-10 (images in [0, 1]): L-inf 8/255 with 2/255
# (Madry et al., the paper's Appendix E), L2 0.5 with 0.125 (RobustBench's and AutoAttack's L2
# radius; step eps/4 as the L-inf one), used where a norm is chosen without a radius.
RADII = {"linf": (8 / 255, 2 / 255), "l2": (0.5, 0.125)}


def with_norm_radii(given: dict, norm: str, eps: str, step: str) -> dict:
    """Settings (`given`, by name) that choose a threat model's norm (the setting `norm`) without
    its radius or step (`eps`, `step`), completed with that norm's standard ones (`RADII`): a
    config's radius belongs to the config's norm, and 8/255 read as an L2 radius is a threat
    model nobody reports. Radii given win; an unknown norm is left to the settings to refuse."""
    radii = RADII.get(given.get(norm))
    return given if radii is None else {eps: radii[0], step: radii[1], **given}
