"""Probabilistic robustness (paper, Sec. 2.3): Monte-Carlo estimators, pure functions.

PR(p, s) = P_{X~p}(s(X) < 0), with the margin s(x) = max_{j != y} z_j(x) - z_y(x); a
perturbed input with s(x) >= 0 is adversarial (ties count as adversarial).

Perturbation distributions around a clean image x (pixel space, results clipped to [0,1]):
- 'gaussian': x + eps * z, z ~ N(0, I), clipped to [0, 1] (the default; the paper's
  Gaussian p_dis family with standard deviation eps per pixel);
- 'uniform': x + eps * u, u ~ U[-1, 1]^d, clipped: uniform on the L-inf ball of radius eps
  intersected with [0,1]^d up to the clipping (the protocol of the AT-PR code's evaluate.py).

Common random numbers: the base noise of sample j of image i is drawn from
fold_in(fold_in(key, i), j), with i the image's index in the evaluated split, and the same
base noise is scaled by every eps. So every model evaluated with the same seed sees the same
perturbations, and batch size and chunk size do not change any figure.
"""
from __future__ import annotations

from typing import Callable, Sequence

import jax
import jax.numpy as jnp

DISTRIBUTIONS = ("gaussian", "uniform")


def margin(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """s(x) = max_{j != y} z_j - z_y, per example."""
    true_logit = jnp.take_along_axis(logits, labels[..., None], axis=-1)[..., 0]
    others = jnp.where(jax.nn.one_hot(labels, logits.shape[-1], dtype=bool), -jnp.inf, logits)
    return jnp.max(others, axis=-1) - true_logit


def is_adversarial(logits: jax.Array, labels: jax.Array) -> jax.Array:
    return margin(logits, labels) >= 0


def base_noise(key: jax.Array, image_index: jax.Array, sample_index: jax.Array, shape,
               distribution: str) -> jax.Array:
    """Unit-scale noise of sample `sample_index` of image `image_index` (common random numbers)."""
    k = jax.random.fold_in(jax.random.fold_in(key, image_index), sample_index)
    if distribution == "gaussian":
        return jax.random.normal(k, shape)
    if distribution == "uniform":
        return jax.random.uniform(k, shape, minval=-1.0, maxval=1.0)
    raise ValueError(f"unknown distribution {distribution!r}; choose one of {DISTRIBUTIONS}")


def non_adversarial_counts(logits_fn: Callable[[jax.Array], jax.Array], key: jax.Array,
                           x: jax.Array, y: jax.Array, image_indices: jax.Array,
                           epsilons: Sequence[float], num_samples: int, chunk_size: int,
                           distribution: str = "gaussian") -> jax.Array:
    """Counts, per eps and image, the perturbed samples that are not adversarial.

    Evaluates num_samples perturbations per image, chunk_size at a time (memory is bounded by
    batch * chunk_size images), in a `lax.fori_loop` -- no Python loop over samples.
    Returns int32 counts of shape (len(epsilons), batch).
    """
    batch = x.shape[0]
    num_chunks = -(-num_samples // chunk_size)
    eps = jnp.asarray(epsilons, x.dtype)

    def chunk(c, counts):
        sample_ids = c * chunk_size + jnp.arange(chunk_size)
        noise = jax.vmap(lambda i: jax.vmap(
            lambda j: base_noise(key, i, j, x.shape[1:], distribution))(sample_ids))(image_indices)
        # (E, B, S, H, W, C): every eps scales the same base noise.
        perturbed = jnp.clip(x[None, :, None] + eps[:, None, None, None, None, None] * noise[None], 0.0, 1.0)
        logits = logits_fn(perturbed.reshape(-1, *x.shape[1:]))
        labels = jnp.broadcast_to(y[None, :, None], (len(epsilons), batch, chunk_size)).reshape(-1)
        robust = ~is_adversarial(logits, labels)
        robust = robust.reshape(len(epsilons), batch, chunk_size) & (sample_ids < num_samples)
        return counts + jnp.sum(robust, axis=-1, dtype=jnp.int32)

    return jax.lax.fori_loop(0, num_chunks, chunk, jnp.zeros((len(epsilons), batch), jnp.int32))
