"""The perturbation laws of PR (paper, Sec. 2.3), registered by name: one module per law, each
declaring its `common.Law` (its base noise, how it perturbs, what its level is, its definition).

`REGISTRY` is the only list of laws; everything that names laws (the settings' check, the command
lines' help, results.json's definitions, the reports) reads it. Its order is the order results.json
records the definitions in.
"""

from __future__ import annotations

import jax

from patjax.pat.laws import common, gaussian, pdis, uniform, uniform_l2
from patjax.pat.laws.common import Law

REGISTRY: dict[str, Law] = {law.name: law for law in (pdis.LAW, gaussian.LAW, uniform.LAW, uniform_l2.LAW)}


def get(name: str) -> Law:
    """The registered law `name`; ValueError for another name (the settings refuse it first)."""
    if name not in REGISTRY:
        raise ValueError(f"unknown distribution {name!r}; choose one of {names()}")
    return REGISTRY[name]


def of_eps() -> tuple:
    """The laws whose levels are the radii eps of `eval.pr.epsilons`, in the registry's order."""
    return tuple(name for name, law in REGISTRY.items() if law.levels is None)


def names() -> tuple:
    """Every registered law: those of eps first (a headline law is one of them), then the others."""
    return of_eps() + tuple(name for name, law in REGISTRY.items() if law.levels is not None)


def definitions(laws) -> dict:
    """{law: its definition} for the laws listed, in the registry's order: what an evaluation that
    computes these laws records (a law it does not compute has no bearing on its figures)."""
    return {name: law.definition for name, law in REGISTRY.items() if name in laws}


def noise_batch(key: jax.Array, image_indices: jax.Array, sample_ids: jax.Array, shape, name: str) -> jax.Array:
    """The law of eps `name`'s base noise of every sample of every image: (images, samples, *shape)."""
    return common.noise_batch(get(name).noise, key, image_indices, sample_ids, shape)


def perturbed_samples(
    key: jax.Array, x: jax.Array, image_indices: jax.Array, sample_ids: jax.Array, levels: jax.Array, name: str
) -> jax.Array:
    """Perturbed images of shape (levels, batch, samples, H, W, C), all in [0, 1], under the law
    `name` at each of its `levels` (eps, or the law's own); sample j of image i from
    fold_in(fold_in(key, i), j) (`common.sample_key`)."""
    return get(name).sample(key, x, image_indices, sample_ids, levels)
