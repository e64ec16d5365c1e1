"""Clean accuracy: the fraction of test images classified correctly (BatchNorm in inference mode)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from patjax.data import cifar
from patjax.evaluators import batches, common, intervals


def passes(s) -> tuple:
    return ("clean",)


def make_batch_fn(model_fns, s, pass_name):
    def fn(params, batch_stats, images, labels, indices):
        logits = model_fns.attack_logits_fn(params, batch_stats)(cifar.to_float(images))
        return {"correct": jnp.argmax(logits, -1) == labels}

    return jax.jit(fn)


def figures(per_image, s) -> dict:
    return {"clean_accuracy": intervals.proportion(per_image["clean"]["correct"], s.shared.confidence)}


EVALUATOR = common.Evaluator("clean", passes, make_batch_fn, figures)


def accuracy_fn(model_fns, batch_size: int):
    """fn(state, split, num_examples=None) -> clean accuracy, for the training log (this
    process's devices, no mesh: the log's accuracy is a progress signal, the evaluation's is
    the figure)."""
    batch_fn = make_batch_fn(model_fns, None, "clean")

    def accuracy(state, split, num_examples=None):
        n = len(split) if not num_examples or num_examples <= 0 else min(num_examples, len(split))
        hits = [
            batch_fn(state.params, state.batch_stats, images, labels, indices)["correct"][mask]
            for images, labels, indices, mask in batches.padded_batches(split, np.arange(n), batch_size)
        ]
        return float(np.sum(np.concatenate(jax.device_get(hits)))) / n

    return accuracy
