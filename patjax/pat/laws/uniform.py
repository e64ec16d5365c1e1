"""The uniform law of eps, the Table-1 protocol's (docs/evaluation.md): uniform on the L-inf ball of
radius eps intersected with [0,1]^d, per pixel x' = lo + (hi - lo) * u with lo = max(x - eps, 0),
hi = min(x + eps, 1), u ~ U[0, 1]: no point masses on 0 or 1 (the AT-PR code's evaluate.py,
dist.Uniform(low=max(x - eps, 0), high=min(x + eps, 1)))."""

import jax
import jax.numpy as jnp

from patjax.pat.laws.common import of_eps


def noise(key, shape):
    return jax.random.uniform(key, shape)


def perturb(x, eps, u):
    lo = jnp.maximum(x - eps, 0.0)
    hi = jnp.minimum(x + eps, 1.0)
    return jnp.clip(lo + (hi - lo) * u, 0.0, 1.0)  # the clip only guards rounding


LAW = of_eps(
    "uniform",
    "U[max(x - eps, 0), min(x + eps, 1)] per pixel (uniform on the Linf ball and [0,1]^d)",
    "eps (L-inf radius)",
    noise,
    perturb,
    per_pixel=True,
)
