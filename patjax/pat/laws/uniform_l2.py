"""The L2 law of eps: x + eps * v, v uniform in the unit L2 ball of R^d, clipped to [0, 1].

Every sample lies in the L2 ball of radius eps intersected with [0,1]^d (the clip moves a pixel
towards x), but the law is not uniform on that intersection: what the box cuts off the ball lands
on the box's faces. The uniform law on the intersection has no cheap exact sampler (rejection from
the ball accepts with a probability that halves with every saturated pixel, and CIFAR images have
dozens); docs/evaluation.md states the choice."""

import math

import jax
import jax.numpy as jnp

from patjax.pat.laws.common import of_eps


def noise(key, shape):
    """v uniform in the unit L2 ball of R^d, d = prod(shape): the first d coordinates of g / |g|_2
    with g ~ N(0, I_{d+2}) (Voelker, Gosmann & Stewart 2017, "Efficiently sampling vectors and
    coordinates from the n-sphere and n-ball": dropping two coordinates of a uniform point on the
    sphere S^{d+1} leaves a uniform point of the ball B^d; one draw, no rejection)."""
    d = math.prod(shape)
    g = jax.random.normal(key, (d + 2,))
    return (g[:d] / jnp.linalg.norm(g)).reshape(shape)


def perturb(x, eps, v):
    return jnp.clip(x + eps * v, 0.0, 1.0)


LAW = of_eps(
    "uniform_l2",
    "x + eps * v, v uniform in the unit L2 ball, clipped to [0,1] (not uniform on the ball and [0,1]^d)",
    "eps (L2 radius)",
    noise,
    perturb,
)
