"""Probabilistic robustness (paper, Sec. 2.3): Monte-Carlo estimators, pure functions.

PR(p, s) = P_{X~p}(s(X) < 0), with the margin s(x) = max_{j != y} z_j(x) - z_y(x); a
perturbed input with s(x) >= 0 is adversarial (ties count as adversarial).

Perturbation distributions around a clean image x (pixel space, every sample in [0,1]^d):
- 'gaussian': x + eps * z, z ~ N(0, I), clipped to [0, 1] (the default; the paper's
  Gaussian p_dis family with standard deviation eps per pixel);
- 'uniform': uniform on the L-inf ball of radius eps intersected with [0,1]^d, i.e. per pixel
  x' = lo + (hi - lo) * u with lo = max(x - eps, 0), hi = min(x + eps, 1), u ~ U[0, 1]: no
  point masses on 0 or 1 (the protocol of the AT-PR code's evaluate.py,
  dist.Uniform(low=max(x - eps, 0), high=min(x + eps, 1)));
- 'uniform_l2': x + eps * v, v uniform in the unit L2 ball of R^d, clipped to [0, 1]: every
  sample lies in the L2 ball of radius eps intersected with [0,1]^d (the clip moves a pixel
  towards x), but the law is not uniform on that intersection: what the box cuts off the ball
  lands on the box's faces. The uniform law on the intersection has no cheap exact sampler
  (rejection from the ball accepts with a probability that halves with every saturated pixel,
  and CIFAR images have dozens); docs/evaluation.md states the choice;
- 'pdis' (`perturbed_samples`, `pr_statistics` only): the paper's p_dis ~ exp(-c1 ||x'-x||^2)
  on [0,1]^d, a Gaussian of variance 1/(2 c1) per pixel truncated to [0, 1].

Common random numbers: the base noise (z for 'gaussian', u for 'uniform', v for 'uniform_l2')
of sample j of image i is drawn from fold_in(fold_in(key, i), j), with i the image's index in the evaluated
split, and the same base noise is used for every eps (scaled by eps, or mapped onto every
eps's interval [lo, hi]). So every model evaluated with the same seed sees the same
perturbations, and batch size and chunk size do not change any figure.
"""

from __future__ import annotations

import math
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from patjax.attacks.logits import LogitsFn, margin, true_value

DISTRIBUTIONS = ("gaussian", "uniform", "uniform_l2")


def base_noise(key: jax.Array, image_index: jax.Array, sample_index: jax.Array, shape, distribution: str) -> jax.Array:
    """Base noise of sample `sample_index` of image `image_index` (common random numbers).

    'gaussian': z ~ N(0, I); 'uniform': u ~ U[0, 1]^d; 'uniform_l2': v uniform in the unit L2
    ball of R^d, d = prod(shape), the first d coordinates of g / |g|_2 with g ~ N(0, I_{d+2})
    (Voelker, Gosmann & Stewart 2017, "Efficiently sampling vectors and coordinates from the
    n-sphere and n-ball": dropping two coordinates of a uniform point on the sphere S^{d+1} leaves
    a uniform point of the ball B^d; one draw, no rejection, no radius drawn apart). `perturb`
    turns it into the sample of every eps; the key is fold_in(fold_in(key, image_index), sample_index).
    """
    k = jax.random.fold_in(jax.random.fold_in(key, image_index), sample_index)
    if distribution == "gaussian":
        return jax.random.normal(k, shape)
    if distribution == "uniform":
        return jax.random.uniform(k, shape)
    if distribution == "uniform_l2":
        d = math.prod(shape)
        g = jax.random.normal(k, (d + 2,))
        return (g[:d] / jnp.linalg.norm(g)).reshape(shape)
    raise ValueError(f"unknown distribution {distribution!r}; choose one of {DISTRIBUTIONS}")


def noise_batch(key: jax.Array, image_indices: jax.Array, sample_ids: jax.Array, shape, distribution: str) -> jax.Array:
    """`base_noise` of every sample of every image: (images, samples, *shape)."""
    return jax.vmap(lambda i: jax.vmap(lambda j: base_noise(key, i, j, shape, distribution))(sample_ids))(image_indices)


def perturb(x: jax.Array, epsilons: jax.Array, noise: jax.Array, distribution: str) -> jax.Array:
    """Samples of shape (E, B, S, H, W, C) from images x (B, H, W, C), levels eps (E,) and the
    base noise (B, S, H, W, C) of `base_noise`; every eps uses the same base noise.

    'gaussian': clip(x + eps * z, 0, 1); 'uniform_l2': clip(x + eps * v, 0, 1).
    'uniform': lo + (hi - lo) * u with lo = max(x - eps, 0), hi = min(x + eps, 1): uniform on
    the L-inf ball of radius eps intersected with [0,1]^d (the final clip only guards rounding).
    """
    xb = x[None, :, None]
    eps = epsilons[:, None, None, None, None, None]
    if distribution in ("gaussian", "uniform_l2"):
        return jnp.clip(xb + eps * noise[None], 0.0, 1.0)
    if distribution == "uniform":
        lo = jnp.maximum(xb - eps, 0.0)
        hi = jnp.minimum(xb + eps, 1.0)
        return jnp.clip(lo + (hi - lo) * noise[None], 0.0, 1.0)
    raise ValueError(f"unknown distribution {distribution!r}; choose one of {DISTRIBUTIONS}")


# ---------------------------------------------------------------------------------------
# Monte-Carlo statistics for PR, the paper's lower bound and the entropic risk.
#
# One pass over the N samples of every image gives, per perturbation level and image:
#   counts       number of non-adversarial samples (s(x) < 0)          -> PR_i
#   sum_loss     sum_j f(X_j, y), f the cross-entropy                  -> R_0 and the bound
#   lse_loss     log sum_j exp(lambda f(X_j, y))                       -> R_lambda
# from the SAME samples, so the lower bound and PR can be compared sample by sample.

PDIS = "pdis"
ALL_DISTRIBUTIONS = DISTRIBUTIONS + (PDIS,)
# What each distribution is (`perturbed_samples`), recorded with every evaluation: results made
# under another definition are not comparable with these.
DEFINITIONS = {
    "pdis": "N(x, 1/(2 c1)) per pixel truncated to [0,1]",
    "gaussian": "x + eps * N(0, I), clipped to [0,1]",
    "uniform": "U[max(x - eps, 0), min(x + eps, 1)] per pixel (uniform on the Linf ball and [0,1]^d)",
    "uniform_l2": "x + eps * v, v uniform in the unit L2 ball, clipped to [0,1] (not uniform on the ball and [0,1]^d)",
}


def definitions(laws) -> dict:
    """{law: its definition} for the laws listed, in DEFINITIONS' order: what an evaluation that
    computes these laws records (a law it does not compute has no bearing on its figures)."""
    return {d: text for d, text in DEFINITIONS.items() if d in laws}


def level_key(level: float) -> str:
    """The key of a perturbation level (eps, or a ProbAcc threshold q) in results files: 0.1 -> "0.1"."""
    return repr(float(level))


def pdis_sigma(c1: float) -> float:
    """Standard deviation of p_dis(x' ; x) ~ exp(-c1 ||x' - x||^2) (Sec. 2.2/3): 1/sqrt(2 c1)."""
    return float((2.0 * c1) ** -0.5)


def perturbed_samples(
    key: jax.Array, x: jax.Array, image_indices: jax.Array, sample_ids: jax.Array, levels: jax.Array, distribution: str
) -> jax.Array:
    """Perturbed images of shape (levels, batch, samples, H, W, C), all in [0, 1].

    'gaussian' / 'uniform' / 'uniform_l2': `base_noise` (common random numbers) turned into a sample of every
    level eps by `perturb`.
    'pdis': the paper's p_dis(x'; x) proportional to exp(-c1 ||x' - x||^2) on [0,1]^d
    (Theorem 2 needs a density on [0,1]^d): per pixel a Gaussian around x with standard
    deviation sigma = 1/sqrt(2 c1) truncated (not clipped) to [0, 1]; `levels` holds the sigmas.
    Sample j of image i uses fold_in(fold_in(key, i), j) in every case.
    """
    shape = x.shape[1:]
    if distribution in DISTRIBUTIONS:
        return perturb(x, levels, noise_batch(key, image_indices, sample_ids, shape, distribution), distribution)
    if distribution == PDIS:

        def one_level(sigma):
            def one_image(i, xi):
                def one_sample(j):
                    k = jax.random.fold_in(jax.random.fold_in(key, i), j)
                    z = jax.random.truncated_normal(k, -xi / sigma, (1.0 - xi) / sigma, shape, xi.dtype)
                    return jnp.clip(xi + sigma * z, 0.0, 1.0)  # the clip only guards rounding

                return jax.vmap(one_sample)(sample_ids)

            return jax.vmap(one_image)(image_indices, x)

        return jax.vmap(one_level)(levels)
    raise ValueError(f"unknown distribution {distribution!r}; choose one of {ALL_DISTRIBUTIONS}")


def pr_statistics(
    logits_fn: LogitsFn,
    key: jax.Array,
    x: jax.Array,
    y: jax.Array,
    image_indices: jax.Array,
    levels: Sequence[float],
    num_samples: int,
    chunk_size: int,
    distribution: str = "gaussian",
    entropic_lambda: float = 0.0,
) -> dict:
    """Per-(level, image) sufficient statistics of N perturbed samples, chunk_size at a time.

    Returns {'counts': int32 (L, B) non-adversarial samples, 'sum_loss': (L, B) sum of the
    cross-entropy f(X_j, y), 'lse_loss': (L, B) log sum_j exp(entropic_lambda * f(X_j, y))}.
    Memory is bounded by len(levels) * batch * chunk_size images (with their activations); a
    `lax.fori_loop` runs over the chunks.
    """
    batch = x.shape[0]
    num_levels = len(levels)
    num_chunks = -(-num_samples // chunk_size)
    levels_arr = jnp.asarray(levels, x.dtype)
    lam = float(entropic_lambda)

    def chunk(c, carry):
        counts, sum_loss, lse_loss = carry
        sample_ids = c * chunk_size + jnp.arange(chunk_size)
        valid = sample_ids < num_samples
        perturbed = perturbed_samples(key, x, image_indices, sample_ids, levels_arr, distribution)
        # Image axis first before flattening, (B, L, S): the batch is what is split over devices,
        # so each device keeps its own images' samples. Flattening (L, B, S) made XLA gather
        # every sample onto every device, which then all evaluated the whole chunk.
        perturbed = jnp.moveaxis(perturbed, 1, 0)
        logits = logits_fn(perturbed.reshape(-1, *x.shape[1:])).astype(jnp.float32)
        labels = jnp.broadcast_to(y[:, None, None], (batch, num_levels, chunk_size)).reshape(-1)
        s = margin(logits, labels)
        robust = (s < 0).reshape(batch, num_levels, chunk_size) & valid
        # f = log sum_j exp(z_j - z_y): the differences first, so large logits do not overflow.
        # Exactly, f >= softplus(s) (>= log 2 on adversarial samples, > 0 always). XLA may
        # recompute the logits inside a fusion with other rounding (an FMA-contracted
        # scale * dot), so z_y - z_y need not be 0 there (|error| ~ 1e-4 for logits ~ 1e3) and
        # f came out ~ -1e-4; the max restores the inequality, so 1 - f/log 2 <= 1[s < 0]
        # holds sample by sample.
        loss = jax.nn.logsumexp(logits - true_value(logits, labels)[:, None], axis=-1)
        loss = jnp.maximum(loss, jax.nn.softplus(s)).reshape(batch, num_levels, chunk_size)
        counts = counts + jnp.sum(robust, axis=-1, dtype=jnp.int32)
        sum_loss = sum_loss + jnp.sum(jnp.where(valid, loss, 0.0), axis=-1)
        lse_loss = jnp.logaddexp(lse_loss, jax.nn.logsumexp(jnp.where(valid, lam * loss, -jnp.inf), axis=-1))
        return counts, sum_loss, lse_loss

    init = (
        jnp.zeros((batch, num_levels), jnp.int32),
        jnp.zeros((batch, num_levels), jnp.float32),
        jnp.full((batch, num_levels), -jnp.inf, jnp.float32),
    )
    counts, sum_loss, lse_loss = jax.lax.fori_loop(0, num_chunks, chunk, init)
    return {"counts": counts.T, "sum_loss": sum_loss.T, "lse_loss": lse_loss.T}


# ---------------------------------------------------------------------------------------
# Randomized smoothing (Cohen, Rosenfeld & Kolter 2019): the smoothed classifier
# g(x) = argmax_c P(f(x + sigma z) = c), z ~ N(0, I), is certified from counts of the base
# classifier's classes over Gaussian samples.


def class_counts(
    logits_fn: LogitsFn,
    key: jax.Array,
    x: jax.Array,
    image_indices: jax.Array,
    first_sample: int,
    num_samples: int,
    chunk_size: int,
    sigma: float,
) -> jax.Array:
    """(batch, classes) int32: how often the base classifier's argmax is each class over the
    samples x + sigma z_j, j = first_sample, ..., first_sample + num_samples - 1.

    Noise as Cohen et al.'s `Smooth._sample_noise` (locuslab/smoothing, code/core.py) draws it:
    Gaussian, added to the [0, 1] image and not clipped (the model normalizes its input itself,
    as their NormalizeLayer does after the noise). z_j is `base_noise`'s 'gaussian' draw of
    sample j of the image (common random numbers), so disjoint ranges of j are independent draws
    (CERTIFY's selection and estimation samples). chunk_size samples per image at a time
    (`lax.fori_loop`); the counts do not depend on it. Ties in the logits go to the lowest class,
    as torch's and numpy's argmax do.
    """
    shape = x.shape[1:]
    num_chunks = -(-num_samples // chunk_size)
    num_classes = jax.eval_shape(logits_fn, x[:1]).shape[-1]

    def chunk(c, counts):
        offsets = c * chunk_size + jnp.arange(chunk_size)
        noise = noise_batch(key, image_indices, first_sample + offsets, shape, "gaussian")
        noisy = x[:, None] + jnp.asarray(sigma, x.dtype) * noise  # (B, S, H, W, C): image axis first
        predictions = jnp.argmax(logits_fn(noisy.reshape(-1, *shape)), axis=-1).reshape(x.shape[0], chunk_size)
        hits = jax.nn.one_hot(predictions, num_classes, dtype=jnp.int32) * (offsets < num_samples)[None, :, None]
        return counts + jnp.sum(hits, axis=1)

    return jax.lax.fori_loop(0, num_chunks, chunk, jnp.zeros((x.shape[0], num_classes), jnp.int32))


# ---------------------------------------------------------------------------------------
# Host-side estimators and intervals (numpy/scipy, float64).


def variance_decomposition(per_image_pr, num_samples: int) -> dict:
    """Var(mean PR_i-hat) = (between-image variance + mean binomial variance) / n, estimated.

    within: mean over images of PR_i-hat (1 - PR_i-hat) / (N - 1) (unbiased binomial variance
    of one image's estimate); between: the rest of the sample variance of the PR_i-hat.
    """
    p = np.asarray(per_image_pr, np.float64)
    n = p.shape[-1]
    total = p.var(axis=-1, ddof=1) if n > 1 else np.zeros(p.shape[:-1])
    within = (p * (1 - p)).mean(axis=-1) / max(num_samples - 1, 1)
    return {
        "standard_error": np.sqrt(total / n),
        "between_image_variance": np.maximum(total - within, 0.0),
        "monte_carlo_variance": within,
    }


def entropic_risk(lse_loss, num_samples: int, entropic_lambda: float, sum_loss=None):
    """Monte-Carlo R_lambda = (1/lambda) log((1/N) sum_j exp(lambda f_j)); R_0 = mean f at lambda = 0.

    The log-sum-exp is accumulated in the compiled pass (`pr_statistics`), so no exp overflows.
    For finite N the estimate is biased low (Jensen: E log(mean) <= log E), so the bound
    `lower_bound(entropic_risk(...))` computed from it is biased high (optimistic).
    """
    if entropic_lambda <= 0:
        return np.asarray(sum_loss, np.float64) / num_samples
    return (np.asarray(lse_loss, np.float64) - np.log(num_samples)) / entropic_lambda


def lower_bound(mean_loss):
    """Theorem 2 with gamma* >= c2 log 2: PR >= 1 - E_p[f(X, y)] / log 2 (Proposition 10(ii) with R_lambda)."""
    return 1.0 - np.asarray(mean_loss, np.float64) / np.log(2.0)
