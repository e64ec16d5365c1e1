"""The Gaussian law of eps: x + eps * z, z ~ N(0, I), clipped to [0, 1] (the paper's Gaussian
p_dis family with standard deviation eps per pixel)."""

import jax
import jax.numpy as jnp

from patjax.pat.laws.common import of_eps


def noise(key, shape):
    return jax.random.normal(key, shape)


def perturb(x, eps, z):
    return jnp.clip(x + eps * z, 0.0, 1.0)


LAW = of_eps(
    "gaussian", "x + eps * N(0, I), clipped to [0,1]", "eps (std. dev. per pixel)", noise, perturb, per_pixel=True
)
