"""Probabilistic robustness PR(x, eps) (Section 2.3), with the Theorem 2 lower bound and the
entropic risk, from one pass of N perturbations per image and level.

One pass per perturbation distribution (`eval.pr_distributions`: gaussian, uniform at every
eps of `eval.pr_epsilons`; pdis at its sigma = 1/sqrt(2 c1)). Per image and level the pass
returns the counts of non-adversarial samples and the loss statistics of
`robustness.pr_statistics`; the figures are means over images with bootstrap intervals, over
all images and over the clean-correct ones (the paper's convention, AT-PR's Prob.Acc).
"""

from __future__ import annotations

import jax
import numpy as np

from patjax.data import cifar
from patjax.evaluators import common, stats
from patjax.pat import robustness


def levels(s, distribution):
    """(perturbation levels, their result keys): eps for gaussian/uniform, sigma of p_dis for pdis."""
    if distribution == robustness.PDIS:
        return (s.pdis_sigma,), [f"c1={s.pdis_c1:g}"]
    return s.pr_epsilons, [robustness.level_key(e) for e in s.pr_epsilons]


def passes(s) -> tuple:
    return tuple(f"pr_{d}" for d in s.pr_distributions)


def make_batch_fn(model_fns, s, pass_name):
    distribution = pass_name[len("pr_") :]
    level_values, _ = levels(s, distribution)
    root = jax.random.PRNGKey(s.seed)

    def fn(params, batch_stats, images, labels, indices):
        logits_fn = model_fns.attack_logits_fn(params, batch_stats)
        pr_stats = robustness.pr_statistics(
            logits_fn,
            root,
            cifar.to_float(images),
            labels,
            indices,
            level_values,
            s.pr_samples,
            s.pr_chunk_size,
            distribution,
            s.entropic_lambda,
        )
        return {k: v.T for k, v in pr_stats.items()}  # (batch, levels)

    return jax.jit(fn)


def level_figures(counts, sum_loss, lse_loss, correct, s) -> dict:
    """Figures of one perturbation level from per-image statistics (arrays over images)."""
    n_samples = s.pr_samples
    per_image = np.asarray(counts, np.float64) / n_samples
    lam = s.entropic_lambda
    mean_loss = np.asarray(sum_loss, np.float64) / n_samples
    risk = robustness.entropic_risk(lse_loss, n_samples, lam, sum_loss)
    cp_lo, cp_hi = stats.clopper_pearson(counts, n_samples, s.confidence)
    out = {}
    clean_correct = np.asarray(correct, bool)
    for subset, mask in (("all", np.ones_like(clean_correct)), ("clean_correct", clean_correct)):
        fig = common.mean_with_interval(per_image, s, mask)
        if mask.sum() > 1:
            fig.update({k: float(v) for k, v in robustness.variance_decomposition(per_image[mask], n_samples).items()})
        out[subset] = fig
    # ProbAcc_q: fraction of images with PR_i > 1 - q, over all images (`prob_acc`) and over
    # clean-correct images (`clean_correct.prob_acc`, AT-PR's Prob.Acc convention).
    out["prob_acc"] = {robustness.level_key(q): common.mean_with_interval(per_image > 1 - q, s) for q in s.prob_acc_q}
    out["clean_correct"]["prob_acc"] = {
        robustness.level_key(q): common.mean_with_interval(per_image > 1 - q, s, clean_correct) for q in s.prob_acc_q
    }
    out["expected_loss"] = common.mean_with_interval(mean_loss, s)
    bound = robustness.lower_bound(mean_loss)
    out["lower_bound"] = common.mean_with_interval(bound, s)
    # PR_i >= max(0, bound_i) too, so the mean of the positive parts is a (tighter) valid bound;
    # its Monte-Carlo estimate is biased up, though (E max(0, B-hat) >= max(0, E B-hat)).
    out["lower_bound_positive_part"] = common.mean_with_interval(np.maximum(bound, 0.0), s)
    out["entropic_risk"] = common.mean_with_interval(risk, s)
    # Biased high for finite N (the Monte-Carlo R_lambda is biased low, Jensen).
    out["lower_bound_entropic"] = common.mean_with_interval(robustness.lower_bound(risk), s)
    out["per_image_clopper_pearson_mean_width"] = float(np.mean(cp_hi - cp_lo)) if per_image.size else None
    return out


def figures(per_image, s) -> dict:
    correct = per_image["clean"]["correct"]
    out = {}
    for d in s.pr_distributions:
        _, keys = levels(s, d)
        st = per_image[f"pr_{d}"]
        out[d] = {
            k: level_figures(st["counts"][:, j], st["sum_loss"][:, j], st["lse_loss"][:, j], correct, s)
            for j, k in enumerate(keys)
        }
    return {"pr": out}


EVALUATOR = common.Evaluator("pr", passes, make_batch_fn, figures, needs_clean=True)
