"""Evaluation of a trained run: clean accuracy and probabilistic robustness.

  python -m patjax.evaluate --workdir=runs/pat_c10 [--num_examples=1000] [--batch_size=500]

Restores the latest checkpoint and the workdir's config, evaluates the test split and
writes DIR/eval/results.json:
  clean_accuracy      fraction of test images classified correctly
  pr                  {"0.1": mean per-image PR over all evaluated images, ...} (default distribution)
  pr_clean_correct    the same mean over clean-correct images only (AT-PR's convention)
  settings            distribution, N, seed, number of images, checkpoint step
Every batch has the same shape (the last one is padded and masked), so each compiled
function is compiled once.
"""
from __future__ import annotations

import functools
import json
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from patjax import config as config_lib
from patjax import data, robustness, state as state_lib
from patjax.errors import UserError


def _padded_batches(split: data.Split, num_examples: int, batch_size: int):
    """Yields (images uint8, labels, image indices, mask) with every batch of batch_size."""
    for start in range(0, num_examples, batch_size):
        stop = min(start + batch_size, num_examples)
        pad = batch_size - (stop - start)
        images = np.pad(split.images[start:stop], ((0, pad), (0, 0), (0, 0), (0, 0)))
        labels = np.pad(split.labels[start:stop], (0, pad))
        indices = np.arange(start, start + batch_size, dtype=np.int32)
        mask = np.arange(batch_size) < (stop - start)
        yield images, labels, indices, mask


def make_clean_accuracy_fn(model_fns, batch_size: int):
    """fn(state, split, num_examples=None) -> clean accuracy (BatchNorm in inference mode)."""

    @jax.jit
    def correct(params, batch_stats, images, labels):
        logits = model_fns.infer(params, batch_stats, data.to_float(images))
        return jnp.argmax(logits, -1) == labels

    def accuracy(state, split, num_examples=None):
        n = len(split) if not num_examples or num_examples <= 0 else min(num_examples, len(split))
        hits = [correct(state.params, state.batch_stats, im, lb)[m]
                for im, lb, _, m in _padded_batches(split, n, batch_size)]
        return float(np.sum(np.concatenate(jax.device_get(hits)))) / n

    return accuracy


def evaluate_state(cfg, model_fns, state, split: data.Split, *, num_examples: int = -1,
                   batch_size: int = 500, progress: bool = True) -> dict:
    """Clean accuracy and PR(eps) of a train state on `split` (a library call)."""
    ev = cfg.eval
    n = len(split) if num_examples <= 0 else min(num_examples, len(split))
    epsilons = tuple(float(e) for e in ev.pr_epsilons)
    distribution = ev.pr_distribution
    if distribution not in robustness.DISTRIBUTIONS:
        raise UserError(f"unknown PR distribution {distribution!r}")
    if ev.pr_samples <= 0 or ev.pr_chunk_size <= 0:
        raise UserError("eval.pr_samples and eval.pr_chunk_size must be positive")
    key = jax.random.PRNGKey(int(ev.seed))

    @jax.jit
    def evaluate_batch(params, batch_stats, images, labels, indices):
        logits_fn = functools.partial(model_fns.infer, params, batch_stats)
        x = data.to_float(images)
        correct = jnp.argmax(logits_fn(x), -1) == labels
        counts = robustness.non_adversarial_counts(
            logits_fn, key, x, labels, indices, epsilons, int(ev.pr_samples),
            int(ev.pr_chunk_size), distribution)
        return correct, counts

    correct, counts = [], []
    bar = _bar(progress, n, "evaluate")
    start_time = time.perf_counter()
    for images, labels, indices, mask in _padded_batches(split, n, batch_size):
        c, k = evaluate_batch(state.params, state.batch_stats, images, labels, indices)
        c, k = jax.device_get((c, k))
        correct.append(c[mask])
        counts.append(k[:, mask])
        if bar is not None:
            bar.update(int(mask.sum()))
            bar.set_postfix(img_s=f"{bar.n / (time.perf_counter() - start_time):.1f}")
    if bar is not None:
        bar.close()
    correct = np.concatenate(correct)
    per_image_pr = np.concatenate(counts, axis=1) / float(ev.pr_samples)  # (E, n)
    eps_keys = [_eps_key(e) for e in epsilons]
    results = {
        "clean_accuracy": float(correct.mean()),
        "pr": {k: float(v) for k, v in zip(eps_keys, per_image_pr.mean(axis=1))},
        "pr_clean_correct": {k: (float(v) if correct.any() else None) for k, v in zip(
            eps_keys, per_image_pr[:, correct].mean(axis=1) if correct.any() else [None] * len(eps_keys))},
        "settings": {
            "num_examples": int(n),
            "num_clean_correct": int(correct.sum()),
            "pr_distribution": distribution,
            "pr_samples": int(ev.pr_samples),
            "pr_epsilons": list(epsilons),
            "seed": int(ev.seed),
            "dataset": cfg.dataset,
            "split": "test",
            "step": int(state.step),
        },
        "wall_time_s": round(time.perf_counter() - start_time, 2),
    }
    return results


def _eps_key(eps: float) -> str:
    return repr(float(eps))  # 0.1 -> "0.1", 0.12 -> "0.12"


def _bar(enabled, total, desc):
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, unit="img", desc=desc, dynamic_ncols=True)


def restore_for_eval(workdir: str):
    """(cfg, model_fns, state) from a workdir's config and latest checkpoint."""
    cfg = state_lib.load_workdir_config(workdir)
    config_lib.validate(cfg)
    manager = state_lib.checkpoint_manager(workdir, create=False) \
        if os.path.isdir(os.path.join(workdir, "checkpoints")) else None
    if manager is None or manager.latest_step() is None:
        raise UserError(f"no checkpoint in {workdir!r}; train first")
    tx = state_lib.make_optimizer(cfg, state_lib.learning_rate_schedule(cfg, 1))
    model_holder = {}

    def init():
        _, fns, st = state_lib.create_train_state(cfg, tx)
        model_holder["fns"] = fns
        return st

    abstract = jax.eval_shape(init)
    state = state_lib.restore_latest(manager, abstract)
    manager.close()
    return cfg, model_holder["fns"], state


def run(workdir: str, num_examples: int | None = None, batch_size: int | None = None,
        progress: bool = True) -> dict:
    cfg, model_fns, state = restore_for_eval(workdir)
    split = data.load_split(cfg.dataset, "test", cfg.data_dir)
    results = evaluate_state(
        cfg, model_fns, state, split,
        num_examples=cfg.eval.num_examples if num_examples is None else num_examples,
        batch_size=cfg.eval.batch_size if batch_size is None else batch_size,
        progress=progress)
    out_dir = os.path.join(workdir, "eval")
    os.makedirs(out_dir, exist_ok=True)
    tmp = os.path.join(out_dir, "results.json.tmp")
    with open(tmp, "w") as f:
        json.dump(results, f, indent=2)
    os.replace(tmp, os.path.join(out_dir, "results.json"))
    return results


def format_table(workdir: str, results: dict) -> str:
    eps = list(results["pr"])
    header = ["run", "Acc %"] + [f"PR({e}) %" for e in eps]
    row = [os.path.basename(os.path.normpath(workdir)), f"{100 * results['clean_accuracy']:.2f}"]
    row += [f"{100 * results['pr'][e]:.2f}" for e in eps]
    widths = [max(len(h), len(r)) for h, r in zip(header, row)]
    line = lambda cells: "  ".join(c.rjust(w) for c, w in zip(cells, widths))
    s = results["settings"]
    return "\n".join([line(header), line(row),
                      f"({s['num_examples']} test images, PR: {s['pr_distribution']} noise, "
                      f"N={s['pr_samples']}, seed {s['seed']}, step {s['step']})"])


def main(argv):
    from absl import flags

    from absl import logging

    FLAGS = flags.FLAGS
    if not FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)
    if len(argv) > 1:
        raise UserError(f"unexpected arguments: {' '.join(argv[1:])}")
    if not FLAGS.workdir:
        raise UserError("--workdir is required")
    for workdir in FLAGS.workdir:
        results = run(workdir, FLAGS.num_examples, FLAGS.batch_size)
        print(format_table(workdir, results))
        print(f"wrote {os.path.join(workdir, 'eval', 'results.json')}")


def _define_flags():
    from absl import flags

    flags.DEFINE_multi_string("workdir", None, "Workdir(s) of trained runs.")
    flags.DEFINE_integer("num_examples", None, "Test images to evaluate (default: config.eval).")
    flags.DEFINE_integer("batch_size", None, "Images per evaluation batch (default: config.eval).")


def cli():
    from absl import app

    from patjax.cli import guarded

    _define_flags()
    app.run(guarded(main))


if __name__ == "__main__":
    cli()
