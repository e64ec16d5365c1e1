"""What every loss, attack and estimator reads off a classifier's logits, written once.

`margin` is the paper's s(x) = max_{j != y} z_j(x) - z_y(x) (Sec. 2.3): s(x) >= 0 means
misclassified (ties count as adversarial). The CW and DLR attack losses, MART's runner-up
class and the PR estimators are all built from `true_value` and `other_values`.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
from flax import nnx

from patjax.core.errors import UserError

# A classifier as the attacks and the math above them see it: [0, 1] images (NHWC) in, logits out.
LogitsFn = Callable[[jax.Array], jax.Array]


def check_inference_mode(logits_fn) -> None:
    """A one-line UserError for an NNX module passed as a logits function while in training
    mode: the attacks and estimators mean the classifier as it predicts (BatchNorm on its running
    statistics), and a module in training mode would normalize by each attacked batch and update
    its statistics from inside the attack's trace. Read while tracing; nothing else is checked."""
    if not isinstance(logits_fn, nnx.Module):
        return
    training = sorted(
        {type(m).__name__ for _, m in nnx.iter_modules(logits_fn) if getattr(m, "use_running_average", True) is False}
    )
    if training:
        raise UserError(
            f"the {type(logits_fn).__name__} passed as the classifier is in training mode ({', '.join(training)}) "
            f"where its inference mode is meant; pass patjax.nnx_logits_fn(model) or call model.eval()"
        )


def true_value(values: jax.Array, labels: jax.Array) -> jax.Array:
    """values[..., y]: the label's logit (or probability), per example."""
    return jnp.take_along_axis(values, labels[..., None], axis=-1)[..., 0]


def other_values(values: jax.Array, labels: jax.Array) -> jax.Array:
    """values with the label's entry set to -inf, so max/argmax range over j != y."""
    return jnp.where(jax.nn.one_hot(labels, values.shape[-1], dtype=bool), -jnp.inf, values)


def max_other(values: jax.Array, labels: jax.Array) -> jax.Array:
    """max_{j != y} values_j, per example."""
    return jnp.max(other_values(values, labels), axis=-1)


def margin(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """s(x) = max_{j != y} z_j - z_y, per example (paper, Sec. 2.3)."""
    return max_other(logits, labels) - true_value(logits, labels)


def log_or_zero(p: jax.Array) -> jax.Array:
    """log p where p > 0 and 0 where p == 0, so p * log_or_zero(p) is the 0 log 0 = 0 of a KL
    divergence, with a finite gradient at p == 0."""
    return jnp.log(jnp.where(p > 0, p, 1.0))
