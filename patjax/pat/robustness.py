"""Probabilistic robustness (paper, Sec. 2.3): Monte-Carlo estimators, pure functions.

PR(p, s) = P_{X~p}(s(X) < 0), with the margin s(x) = max_{j != y} z_j(x) - z_y(x); a
perturbed input with s(x) >= 0 is adversarial (ties count as adversarial).

The perturbation laws (gaussian, uniform, uniform_l2, pdis) are plug-ins, one module each in
`patjax.pat.laws` behind its registry. Common random numbers: sample j of image i is drawn from
fold_in(fold_in(key, i), j), with i the image's index in the evaluated split, and a law of eps
uses the same base noise for every eps. So every model evaluated with the same seed sees the same
perturbations, and batch size and chunk size do not change any figure.
"""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from patjax.attacks.logits import LogitsFn, check_inference_mode, margin, true_value
from patjax.pat import laws


def level_key(level: float) -> str:
    """The key of a perturbation level (eps, or a ProbAcc threshold q) in results files: 0.1 -> "0.1"."""
    return repr(float(level))


# ---------------------------------------------------------------------------------------
# Monte-Carlo statistics for PR, the paper's lower bound and the entropic risk.
#
# One pass over the N samples of every image gives, per perturbation level and image:
#   counts       number of non-adversarial samples (s(x) < 0)          -> PR_i
#   sum_loss     sum_j f(X_j, y), f the cross-entropy                  -> R_0 and the bound
#   lse_loss     log sum_j exp(lambda f(X_j, y))                       -> R_lambda
# from the SAME samples, so the lower bound and PR can be compared sample by sample.


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
    check_inference_mode(logits_fn)
    batch = x.shape[0]
    num_levels = len(levels)
    num_chunks = -(-num_samples // chunk_size)
    levels_arr = jnp.asarray(levels, x.dtype)
    lam = float(entropic_lambda)

    def chunk(c, carry):
        counts, sum_loss, lse_loss = carry
        sample_ids = c * chunk_size + jnp.arange(chunk_size)
        valid = sample_ids < num_samples
        perturbed = laws.perturbed_samples(key, x, image_indices, sample_ids, levels_arr, distribution)
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
    as their NormalizeLayer does after the noise). z_j is the `gaussian` law's base noise of
    sample j of the image (common random numbers), so disjoint ranges of j are independent draws
    (CERTIFY's selection and estimation samples). chunk_size samples per image at a time
    (`lax.fori_loop`); the counts do not depend on it. Ties in the logits go to the lowest class,
    as torch's and numpy's argmax do.
    """
    check_inference_mode(logits_fn)
    shape = x.shape[1:]
    num_chunks = -(-num_samples // chunk_size)
    num_classes = jax.eval_shape(logits_fn, x[:1]).shape[-1]

    def chunk(c, counts):
        offsets = c * chunk_size + jnp.arange(chunk_size)
        noise = laws.noise_batch(key, image_indices, first_sample + offsets, shape, "gaussian")
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
