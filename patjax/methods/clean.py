"""Standard training, the first row of Table 1: no inner maximization."""

from __future__ import annotations

import jax

from patjax.methods.common import Method, TrainFn, accuracy, mean_ce, train_passes, uniform_weights


def clean_loss(train_fn: TrainFn, x: jax.Array, y: jax.Array, *, state=None):
    """Standard training: mean CE(f(x), y); adv_accuracy is the accuracy on the clean batch.
    (loss, (state, metrics))."""
    (logits,), state = train_passes(train_fn, state, [x])
    loss = mean_ce(logits, y)
    return loss, (state, {"loss": loss, "adv_accuracy": accuracy(logits, y), **uniform_weights(y.shape[0])})


def clean(params, model, batch_stats, x, y, key, s):
    """Standard training: `clean_loss`."""
    return clean_loss(model.train_fn(params), x, y, state=batch_stats)


CLEAN = Method("clean", clean, "Clean")
