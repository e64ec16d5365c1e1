"""The paper's p_dis(x'; x) proportional to exp(-c1 ||x' - x||^2) on [0,1]^d (Sec. 2.2 and 3): per
pixel a Gaussian around x with standard deviation sigma = 1/sqrt(2 c1), truncated (not clipped)
to [0, 1], since Theorem 2 needs a density on [0,1]^d. Its one level is that sigma, from
`eval.pr.pdis_c1`, not eps."""

import jax
import jax.numpy as jnp

from patjax.core.errors import UserError
from patjax.pat.laws.common import Law, sample_key


def sigma(c1: float) -> float:
    """Standard deviation of p_dis(x' ; x) ~ exp(-c1 ||x' - x||^2) (Sec. 2.2/3): 1/sqrt(2 c1)."""
    return float((2.0 * c1) ** -0.5)


def levels(pr_settings):
    """(sigma,), keyed by c1: the level of `eval.pr.pdis_c1`."""
    c1 = pr_settings.pdis_c1
    if not c1 > 0:
        raise UserError(f"p_dis needs c1 > 0 (eval.pr.pdis_c1, else langevin.c1), got {c1}")
    return (sigma(c1),), [f"c1={c1:g}"]


def sample(key, x, image_indices, sample_ids, sigmas):
    shape = x.shape[1:]

    def one_level(s):
        def one_image(i, xi):
            def one_sample(j):
                z = jax.random.truncated_normal(sample_key(key, i, j), -xi / s, (1.0 - xi) / s, shape, xi.dtype)
                return jnp.clip(xi + s * z, 0.0, 1.0)  # the clip only guards rounding

            return jax.vmap(one_sample)(sample_ids)

        return jax.vmap(one_image)(image_indices, x)

    return jax.vmap(one_level)(sigmas)


LAW = Law("pdis", "N(x, 1/(2 c1)) per pixel truncated to [0,1]", "sigma = 1/sqrt(2 c1) per pixel", sample, levels)
