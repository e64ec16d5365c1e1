"""Gaussian data augmentation (Cohen, Rosenfeld & Kolter 2019; locuslab/smoothing code/train.py):
the training of the base classifiers that randomized smoothing certifies (`evaluators.certify`)."""

from __future__ import annotations

import dataclasses

import jax

from patjax.core.errors import UserError
from patjax.methods.common import Method, TrainFn, accuracy, mean_ce, train_passes, uniform_weights


@dataclasses.dataclass(frozen=True)
class GaussianSettings:
    """Gaussian augmentation's own setting (config block `gaussian`)."""

    # The noise's standard deviation in [0, 1] pixel units (train.py's --noise_sd); Cohen et al.
    # train and certify CIFAR-10 at the same sigma, 0.12, 0.25, 0.50 or 1.00.
    sigma: float = 0.25

    def __post_init__(self):
        if not self.sigma > 0:
            raise UserError(f"gaussian.sigma must be > 0, got {self.sigma}")


def gaussian_augmentation_loss(
    train_fn: TrainFn, key: jax.Array, x: jax.Array, y: jax.Array, *, state=None, sigma: float = GaussianSettings.sigma
):
    """Gaussian augmentation (Cohen et al. 2019): mean CE(f(x + sigma z), y), z ~ N(0, I), as
    locuslab/smoothing train.py's `inputs + randn_like(inputs) * noise_sd`: after the data
    augmentation, unclipped, before the model's normalization (the noise the smoothed classifier
    is certified under, `robustness.class_counts`); no inner problem, so no attack forward.
    adv_accuracy is the accuracy on the noisy batch. (loss, (state, metrics))."""
    GaussianSettings(sigma=sigma)
    noisy = x + sigma * jax.random.normal(key, x.shape, x.dtype)
    (logits,), state = train_passes(train_fn, state, [noisy])
    loss = mean_ce(logits, y)
    return loss, (state, {"loss": loss, "adv_accuracy": accuracy(logits, y), **uniform_weights(y.shape[0])})


def gaussian(params, model, batch_stats, x, y, key, s):
    """Gaussian augmentation: `gaussian_augmentation_loss` with sigma s.own.sigma."""
    return gaussian_augmentation_loss(model.train_fn(params), key, x, y, state=batch_stats, sigma=s.own.sigma)


GAUSSIAN = Method("gaussian", gaussian, "Gaussian aug.", settings=GaussianSettings)
