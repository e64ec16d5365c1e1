"""Standard training, the first row of Table 1: no inner maximization."""

from __future__ import annotations

from patjax.methods.common import Method, accuracy, mean_ce, train_passes, uniform_weights


def clean(params, model, batch_stats, x, y, key, s):
    """Standard training: mean CE(f(x), y); adv_accuracy is the accuracy on the clean batch."""
    (logits,), new_batch_stats = train_passes(model, params, batch_stats, [x])
    loss = mean_ce(logits, y)
    return loss, (new_batch_stats, {"loss": loss, "adv_accuracy": accuracy(logits, y), **uniform_weights(y.shape[0])})


CLEAN = Method("clean", clean, "Clean")
