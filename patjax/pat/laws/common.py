"""What a PR perturbation law is (`Law`), and the common random numbers every law draws from.

A law turns a batch of clean images x (B, H, W, C) in [0, 1] into perturbed images of shape
(levels, B, samples, H, W, C), all in [0, 1]. Sample j of image i is drawn from the key
fold_in(fold_in(key, i), j), with i the image's index in the evaluated split, so every model
evaluated with the same seed sees the same perturbations, and batch size and chunk size change
no figure. A law of eps (`of_eps`) draws one base noise per sample and maps it onto every eps.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional

import jax


def sample_key(key: jax.Array, image_index: jax.Array, sample_index: jax.Array) -> jax.Array:
    """The key of sample `sample_index` of image `image_index`: fold_in(fold_in(key, i), j)."""
    return jax.random.fold_in(jax.random.fold_in(key, image_index), sample_index)


@dataclasses.dataclass(frozen=True)
class Law:
    """One perturbation law of PR, as its module declares it.

    name: its name in `eval.pr.distributions`, on the command line and in results.json.
    definition: what it is, recorded under its name in results.json's "settings": evaluations
        made under another definition are not comparable (`run.eval_files`).
    level: what a level is, in words (a plot's axis).
    sample: (key, x, image_indices, sample_ids, levels) -> (levels, B, samples, H, W, C).
    levels: (the PR settings `eval.pr`) -> (level values, their keys in results.json), for a law
        whose level is not eps; None: the eps of `eval.pr.epsilons`, keyed by `level_key`.
    noise: (key, shape) -> the base noise of one sample, for a law of eps (`of_eps`); None else.
    per_pixel: whether its eps is a per-pixel scale in the units of images in [0, 1] (uniform's
        L-inf radius, gaussian's standard deviation), where eps > 1 is one written in pixel levels.
    """

    name: str
    definition: str
    level: str
    sample: Callable
    levels: Optional[Callable] = None
    noise: Optional[Callable] = None
    per_pixel: bool = False


def noise_batch(noise: Callable, key: jax.Array, image_indices: jax.Array, sample_ids: jax.Array, shape) -> jax.Array:
    """`noise` of every sample of every image, each from its `sample_key`: (images, samples, *shape)."""
    one = lambda i, j: noise(sample_key(key, i, j), shape)
    return jax.vmap(lambda i: jax.vmap(lambda j: one(i, j))(sample_ids))(image_indices)


def of_eps(name: str, definition: str, level: str, noise: Callable, perturb: Callable, per_pixel: bool = False) -> Law:
    """A law of eps from its base noise and its map: `noise(key, shape)` draws one sample's base
    noise, `perturb(x, eps, noise)` turns it into the sample at radius eps (broadcast: x
    (1, B, 1, H, W, C), eps (E, 1, 1, 1, 1, 1), noise (1, B, S, H, W, C)). Every eps uses the same
    base noise (common random numbers)."""

    def sample(key, x, image_indices, sample_ids, levels):
        z = noise_batch(noise, key, image_indices, sample_ids, x.shape[1:])
        return perturb(x[None, :, None], levels[:, None, None, None, None, None], z[None])

    return Law(name, definition, level, sample, noise=noise, per_pixel=per_pixel)
