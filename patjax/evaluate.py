"""Evaluation of trained runs: clean accuracy, PGD-20, CW-20, APGD, probabilistic robustness.

  python -m patjax.evaluate --workdir=runs/pat_c10 [--num_examples=1000] [--batch_size=500]
      [--evaluators=clean,pgd20,cw20,apgd,pr] [--pr_samples=100] [--pr_distributions=gaussian,uniform,pdis]
  python -m patjax.evaluate --workdir=runs/A --workdir=runs/B   # one comparison table + PNG plot

Checks every workdir (config, checkpoint, settings) first, then restores the latest
checkpoint and the workdir's config (eval fields missing from an older config take today's
defaults), evaluates the test split and writes DIR/eval/per_image.npz (per-image outcomes
and PR statistics, for paired comparisons, with the evaluation's identity under meta.*) and
then, last, DIR/eval/results.json (strict JSON; NaN/inf as null):
  clean_accuracy      fraction of test images classified correctly
  pr                  {"0.1": mean per-image PR over all evaluated images, ...} (pr_distribution)
  pr_clean_correct    the same mean over clean-correct images only (AT-PR's convention)
  figures             every figure with its interval, method, number of images and settings;
                      per distribution and level: all, clean_correct (with its own prob_acc,
                      AT-PR's Prob.Acc), prob_acc, expected_loss, the lower bounds, entropic_risk
  settings            seed, number of images, checkpoint step, every evaluator's settings
  evaluator_wall_time_s, wall_time_s

Each evaluator is one jitted function over a batch; every batch has the same shape (the
last one is padded and masked), so each is compiled once. Randomness is keyed by the image's
index in the test split (and the sample's index for PR): batch size and chunk size change no
figure, and two models evaluated with the same seed see the same perturbations (common
random numbers), which makes paired comparisons much tighter than unpaired ones.
"""
from __future__ import annotations

import contextlib
import functools
import json
import os
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from patjax import attacks, config as config_lib
from patjax import cli as cli_lib
from patjax import data, robustness, sharding, state as state_lib, stats
from patjax import workdir as workdir_lib
from patjax.errors import UserError

EVALUATORS = ("clean", "pgd20", "cw20", "apgd_ce", "apgd_dlr", "pr")
EVALUATOR_ALIASES = {"apgd": ("apgd_ce", "apgd_dlr"), "all": EVALUATORS}
WORST_CASE_ATTACKS = ("pgd20", "cw20", "apgd_ce", "apgd_dlr")
# Independent key streams of the attacks' random starts (PR uses PRNGKey(seed) itself, as the
# spine did, so `pr` keeps its values): jax.random.split(PRNGKey(seed), 5)[1:].
_ATTACK_STREAM = {"pgd20": 1, "cw20": 2, "apgd_ce": 3, "apgd_dlr": 4}


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


# ---------------------------------------------------------------------------------------
# Settings.

def eval_settings(cfg) -> ml_collections.ConfigDict:
    """cfg.eval completed with today's defaults (older workdirs lack the newer fields)."""
    return ml_collections.ConfigDict({**config_lib.default_config().eval.to_dict(), **cfg.eval.to_dict()})


def parse_evaluators(spec) -> tuple:
    """'clean,pgd20,apgd' or a sequence -> the evaluators in canonical order."""
    names = [s.strip() for s in spec.split(",")] if isinstance(spec, str) else list(spec)
    chosen = set()
    for name in names:
        if not name:
            continue
        if name in EVALUATOR_ALIASES:
            chosen.update(EVALUATOR_ALIASES[name])
        elif name in EVALUATORS:
            chosen.add(name)
        else:
            raise UserError(f"unknown evaluator {name!r}; choose from "
                            f"{', '.join(EVALUATORS + tuple(EVALUATOR_ALIASES))}")
    if not chosen:
        raise UserError("no evaluator chosen")
    return tuple(e for e in EVALUATORS if e in chosen)


SEED_LIMIT = 2 ** 32  # PRNGKey keeps 32 bits without x64: seeds 0 and 2**32 would alias


def _integer(name, value, minimum, maximum=None) -> int:
    """value as an int, or a one-line UserError naming the setting."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum or (
            maximum is not None and value > maximum):
        bound = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
        raise UserError(f"{name} must be an integer {bound}, got {value!r}")
    return int(value)


WHOLE_SPLIT = -1  # num_examples meaning every image of the test split


def check_run_settings(num_examples, batch_size) -> None:
    """num_examples (>= 1, or -1: the whole split) and batch_size (>= 1), before anything is
    evaluated. 0 is refused rather than read as "all": a full evaluation takes hours on a CPU."""
    _integer("batch_size", batch_size, 1)
    if num_examples == WHOLE_SPLIT and not isinstance(num_examples, bool):
        return
    if isinstance(num_examples, bool) or not isinstance(num_examples, (int, np.integer)) or num_examples < 1:
        raise UserError(f"num_examples must be a positive integer, or {WHOLE_SPLIT} for the whole test "
                        f"split, got {num_examples!r}")


def _resolve(cfg, ev) -> dict:
    """Validated evaluation settings as plain Python values (static for jit).

    Every check runs before any evaluator, so a bad setting fails in a second, not after
    the evaluation (the bootstrap, say, would refuse a negative seed only at the end).
    """
    distributions = [ev.pr_distribution] + [d for d in ev.pr_distributions if d != ev.pr_distribution]
    for d in distributions:
        if d not in robustness.ALL_DISTRIBUTIONS:
            raise UserError(f"unknown PR distribution {d!r}; choose from {', '.join(robustness.ALL_DISTRIBUTIONS)}")
    if ev.pr_distribution not in robustness.DISTRIBUTIONS:
        raise UserError(f"eval.pr_distribution must be one of {robustness.DISTRIBUTIONS}")
    _integer("eval.seed", ev.seed, 0, SEED_LIMIT - 1)
    _integer("eval.pr_samples", ev.pr_samples, 1)
    _integer("eval.pr_chunk_size", ev.pr_chunk_size, 1)
    _integer("eval.attack_steps", ev.attack_steps, 0)
    _integer("eval.apgd_steps", ev.apgd_steps, 1)
    _integer("eval.bootstrap_resamples", ev.bootstrap_resamples, 100)
    if ev.attack_eps < 0 or ev.attack_step_size < 0:
        raise UserError("eval.attack_eps and eval.attack_step_size must be >= 0")
    if not 0 < ev.apgd_rho <= 1:
        raise UserError(f"eval.apgd_rho must be in (0, 1], got {ev.apgd_rho}")
    if not 0 < ev.confidence < 1:
        raise UserError(f"eval.confidence must be in (0, 1), got {ev.confidence}")
    if any(not 0 < q < 1 for q in ev.prob_acc_q):
        raise UserError(f"eval.prob_acc_q must lie in (0, 1), got {tuple(ev.prob_acc_q)}")
    c1 = float(ev.pdis_c1) if ev.pdis_c1 > 0 else float(cfg.langevin.c1)
    lam = float(ev.entropic_lambda) if ev.entropic_lambda >= 0 else float(cfg.langevin.c2) - float(cfg.pat.beta)
    epsilons = tuple(float(e) for e in ev.pr_epsilons)
    if not epsilons or min(epsilons) < 0:
        raise UserError("eval.pr_epsilons must be non-empty and non-negative")
    if robustness.PDIS in distributions and not c1 > 0:
        raise UserError(f"p_dis needs c1 > 0 (eval.pdis_c1, else langevin.c1), got {c1}")
    return {
        "epsilons": epsilons, "distributions": tuple(distributions), "pdis_c1": c1,
        "pdis_sigma": robustness.pdis_sigma(c1), "entropic_lambda": max(lam, 0.0),
        "pr_samples": int(ev.pr_samples), "pr_chunk_size": int(ev.pr_chunk_size),
        "eps": float(ev.attack_eps), "step_size": float(ev.attack_step_size),
        "steps": int(ev.attack_steps), "kappa": float(ev.cw_kappa),
        "apgd_steps": int(ev.apgd_steps), "apgd_rho": float(ev.apgd_rho),
        "prob_acc_q": tuple(float(q) for q in ev.prob_acc_q), "confidence": float(ev.confidence),
        "bootstrap_resamples": int(ev.bootstrap_resamples), "seed": int(ev.seed),
    }


def _levels(s, distribution):
    """(perturbation levels, their result keys): eps for gaussian/uniform, sigma of p_dis for pdis."""
    if distribution == robustness.PDIS:
        return (s["pdis_sigma"],), [f"c1={s['pdis_c1']:g}"]
    return s["epsilons"], [_eps_key(e) for e in s["epsilons"]]


# ---------------------------------------------------------------------------------------
# Compiled per-batch evaluators: fn(params, batch_stats, images, labels, indices) -> pytree of
# arrays whose leading axis is the batch.

def _per_example(attack, key, indices, x, y):
    """Runs `attack(key_i, x_i[None], y_i[None])` per example with key_i = fold_in(key, index_i)."""
    def one(i, xi, yi):
        out = attack(jax.random.fold_in(key, i), xi[None], yi[None])
        return jax.tree.map(lambda a: a[0], out)
    return jax.vmap(one)(indices, x, y)


def _make_batch_fn(name, model_fns, s, distribution=None):
    root = jax.random.PRNGKey(s["seed"])

    def logits_fn_of(params, batch_stats):
        return functools.partial(model_fns.infer, jax.lax.stop_gradient(params),
                                 jax.lax.stop_gradient(batch_stats))

    if name == "clean":
        def fn(params, batch_stats, images, labels, indices):
            return {"correct": jnp.argmax(logits_fn_of(params, batch_stats)(data.to_float(images)), -1) == labels}
    elif name in ("pgd20", "cw20"):
        loss_fn = attacks.cross_entropy_loss if name == "pgd20" else functools.partial(
            attacks.cw_margin_loss, kappa=s["kappa"])
        key = jax.random.split(root, 5)[_ATTACK_STREAM[name]]

        def fn(params, batch_stats, images, labels, indices):
            logits_fn = logits_fn_of(params, batch_stats)
            x = data.to_float(images)
            x_adv = _per_example(lambda k, xi, yi: attacks.pgd(
                logits_fn, k, xi, yi, eps=s["eps"], step_size=s["step_size"], steps=s["steps"],
                loss_fn=loss_fn, random_start=True), key, indices, x, labels)
            return {"robust": jnp.argmax(logits_fn(x_adv), -1) == labels}
    elif name in ("apgd_ce", "apgd_dlr"):
        loss = name.split("_")[1]
        key = jax.random.split(root, 5)[_ATTACK_STREAM[name]]

        def fn(params, batch_stats, images, labels, indices):
            logits_fn = logits_fn_of(params, batch_stats)
            result = _per_example(lambda k, xi, yi: attacks.apgd(
                logits_fn, k, xi, yi, eps=s["eps"], steps=s["apgd_steps"], loss=loss, rho=s["apgd_rho"]),
                key, indices, data.to_float(images), labels)
            return {"robust": result.robust}
    elif name == "pr":
        levels, _ = _levels(s, distribution)

        def fn(params, batch_stats, images, labels, indices):
            logits_fn = logits_fn_of(params, batch_stats)
            x = data.to_float(images)
            pr_stats = robustness.pr_statistics(
                logits_fn, root, x, labels, indices, levels, s["pr_samples"], s["pr_chunk_size"],
                distribution, s["entropic_lambda"])
            return {k: v.T for k, v in pr_stats.items()}  # (batch, levels)
    else:
        raise UserError(f"unknown evaluator {name!r}")
    return jax.jit(fn)


def _run_evaluator(batch_fn, state, split, n, batch_size, desc, progress):
    """Per-example outputs over the first n images (padding removed) and the wall time.

    Each batch is split over the devices of `sharding.make_mesh` (on a CPU host one per core,
    see cli.use_cpu_cores_as_devices): every evaluator is per example (keys from the image
    index), so the split changes which core computes an image, not what is computed.
    """
    mesh = sharding.make_mesh(batch_size)
    params, batch_stats = sharding.place_on_mesh(mesh, (state.params, state.batch_stats))[0]
    outputs = []
    bar = _bar(progress, n, desc)
    start = time.perf_counter()
    for images, labels, indices, mask in _padded_batches(split, n, batch_size):
        images, labels, indices = sharding.shard_batch(mesh, images, labels, indices)
        out = sharding.to_host(batch_fn(params, batch_stats, images, labels, indices))
        outputs.append(jax.tree.map(lambda a: np.asarray(a)[mask], out))
        if bar is not None:
            bar.update(int(mask.sum()))
            bar.set_postfix(img_s=f"{bar.n / (time.perf_counter() - start):.1f}")
    if bar is not None:
        bar.close()
    wall = time.perf_counter() - start
    return jax.tree.map(lambda *a: np.concatenate(a), *outputs), wall


# ---------------------------------------------------------------------------------------
# Figures with intervals (host side, float64).

def _proportion(hits, confidence) -> dict:
    hits = np.asarray(hits, bool)
    lo, hi = stats.clopper_pearson(hits.sum(), hits.size, confidence)
    return {"value": float(hits.mean()) if hits.size else None, "interval": [float(lo), float(hi)],
            "interval_method": "clopper-pearson", "n": int(hits.size)}


@functools.lru_cache(maxsize=1)
def _bootstrap_indices(num_items: int, num_resamples: int, seed: int) -> np.ndarray:
    """stats.bootstrap_indices over all evaluated images, drawn once per (images, resamples,
    seed): every figure resamples the same images (read-only; 80 MB at 2,000 x 10,000 as int32,
    cleared by `evaluate_state` once its figures are computed)."""
    idx = stats.bootstrap_indices(num_items, num_resamples, seed).astype(np.int32)
    idx.setflags(write=False)
    return idx


def _mean_with_interval(values, s, mask=None) -> dict:
    """Mean of per-image `values` over the images in `mask` (default: all), with the interval of
    `stats.ratio_interval`: resampling all images, so a subset such as the clean-correct images
    is drawn anew in every resample, exactly as the suite tables do."""
    values = np.asarray(values, np.float64)
    mask = np.ones(values.shape) if mask is None else np.asarray(mask, np.float64)
    if mask.sum() == 0:
        return {"value": None, "interval": [None, None], "n": 0}
    idx = _bootstrap_indices(int(values.size), int(s["bootstrap_resamples"]), int(s["seed"]))
    value, (lo, hi) = stats.ratio_interval((values * mask)[None], mask[None], idx, s["confidence"])
    return {"value": value, "interval": [lo, hi], "n": int(mask.sum()),
            "interval_method": f"percentile bootstrap over images ({s['bootstrap_resamples']} resamples)"}


def pr_figures(counts, sum_loss, lse_loss, correct, s) -> dict:
    """Figures of one perturbation level from per-image statistics (arrays over images)."""
    n_samples = s["pr_samples"]
    per_image = np.asarray(counts, np.float64) / n_samples
    lam = s["entropic_lambda"]
    mean_loss = np.asarray(sum_loss, np.float64) / n_samples
    risk = robustness.entropic_risk(lse_loss, n_samples, lam, sum_loss)
    cp_lo, cp_hi = stats.clopper_pearson(counts, n_samples, s["confidence"])
    out = {}
    clean_correct = np.asarray(correct, bool)
    for subset, mask in (("all", np.ones_like(clean_correct)), ("clean_correct", clean_correct)):
        fig = _mean_with_interval(per_image, s, mask)
        if mask.sum() > 1:
            fig.update({k: float(v) for k, v in robustness.variance_decomposition(per_image[mask], n_samples).items()})
        out[subset] = fig
    # ProbAcc_q: fraction of images with PR_i > 1 - q, over all images (`prob_acc`) and over
    # clean-correct images (`clean_correct.prob_acc`, AT-PR's Prob.Acc convention).
    out["prob_acc"] = {_eps_key(q): _mean_with_interval(per_image > 1 - q, s) for q in s["prob_acc_q"]}
    out["clean_correct"]["prob_acc"] = {_eps_key(q): _mean_with_interval(per_image > 1 - q, s, clean_correct)
                                        for q in s["prob_acc_q"]}
    out["expected_loss"] = _mean_with_interval(mean_loss, s)
    bound = robustness.lower_bound(mean_loss)
    out["lower_bound"] = _mean_with_interval(bound, s)
    # PR_i >= max(0, bound_i) too, so the mean of the positive parts is a (tighter) valid bound;
    # its Monte-Carlo estimate is biased up, though (E max(0, B-hat) >= max(0, E B-hat)).
    out["lower_bound_positive_part"] = _mean_with_interval(np.maximum(bound, 0.0), s)
    out["entropic_risk"] = _mean_with_interval(risk, s)
    # Biased high for finite N (the Monte-Carlo R_lambda is biased low, Jensen).
    out["lower_bound_entropic"] = _mean_with_interval(robustness.lower_bound(risk), s)
    out["per_image_clopper_pearson_mean_width"] = float(np.mean(cp_hi - cp_lo)) if per_image.size else None
    return out


def _summarize(per_image, evaluators, s, n) -> dict:
    conf = s["confidence"]
    figures = {}
    correct = per_image.get("clean", {}).get("correct")
    if correct is not None:
        figures["clean_accuracy"] = _proportion(correct, conf)
    attack_settings = {
        "pgd20": {"eps": s["eps"], "step_size": s["step_size"], "steps": s["steps"], "loss": "ce",
                  "random_start": "uniform"},
        "cw20": {"eps": s["eps"], "step_size": s["step_size"], "steps": s["steps"],
                 "loss": "cw_margin", "kappa": s["kappa"], "random_start": "uniform"},
        "apgd_ce": {"eps": s["eps"], "steps": s["apgd_steps"], "rho": s["apgd_rho"], "loss": "ce",
                    "restarts": 1, "departure": APGD_DEPARTURE},
        "apgd_dlr": {"eps": s["eps"], "steps": s["apgd_steps"], "rho": s["apgd_rho"], "loss": "dlr",
                     "restarts": 1, "departure": APGD_DEPARTURE},
    }
    ran_attacks = [a for a in WORST_CASE_ATTACKS if a in evaluators]
    for a in ran_attacks:
        figures[a] = dict(_proportion(per_image[a]["robust"], conf), settings=attack_settings[a])
    if ran_attacks:
        worst = np.logical_and.reduce([per_image[a]["robust"] for a in ran_attacks])
        if correct is not None:
            worst = worst & correct
        figures["worst_case"] = dict(_proportion(worst, conf), attacks=ran_attacks)
    if "pr" in evaluators:
        pr_correct = per_image["pr_correct"]
        figures["pr"] = {}
        for d in s["distributions"]:
            _, keys = _levels(s, d)
            st = per_image[f"pr_{d}"]
            figures["pr"][d] = {k: pr_figures(st["counts"][:, j], st["sum_loss"][:, j], st["lse_loss"][:, j],
                                              pr_correct, s) for j, k in enumerate(keys)}
    return figures


# attacks.apgd's one documented departure from fra31/auto-attack's attack_single_run, recorded
# with every APGD figure (docs/evaluation.md).
APGD_DEPARTURE = ("first interval: the first iterate's loss is compared with the starting loss, "
                  "where auto-attack compares it with an unfilled (zero) entry of its loss buffer")


def evaluate_state(cfg, model_fns, state, split: data.Split, *, num_examples: int = -1,
                   batch_size: int = 500, progress: bool = True, evaluators=None,
                   per_image_out: dict | None = None) -> dict:
    """Every chosen evaluator on `split` (a library call); see the module docstring.

    evaluators: names or a comma-separated string (default cfg.eval.evaluators).
    per_image_out: if a dict, receives the per-image arrays (as in per_image.npz).
    """
    ev = eval_settings(cfg)
    s = _resolve(cfg, ev)
    evaluators = parse_evaluators(ev.evaluators if evaluators is None else evaluators)
    check_run_settings(num_examples, batch_size)
    n = len(split) if num_examples == WHOLE_SPLIT else min(num_examples, len(split))
    start_time = time.perf_counter()
    per_image, walls = {}, {}
    for name in evaluators:
        if name == "pr":
            for d in s["distributions"]:
                out, walls[f"pr_{d}"] = _run_evaluator(_make_batch_fn("pr", model_fns, s, d), state, split, n,
                                                       batch_size, f"PR {d}", progress)
                per_image[f"pr_{d}"] = out
        else:
            per_image[name], walls[name] = _run_evaluator(_make_batch_fn(name, model_fns, s), state, split, n,
                                                          batch_size, name, progress)
    if "clean" not in per_image and "pr" in evaluators:  # PR's clean-correct subset needs it
        per_image["clean"], walls["clean"] = _run_evaluator(_make_batch_fn("clean", model_fns, s), state,
                                                            split, n, batch_size, "clean", progress)
    if "pr" in evaluators:
        per_image["pr_correct"] = per_image["clean"]["correct"]
    figures = _summarize(per_image, evaluators, s, n)
    _bootstrap_indices.cache_clear()

    results = {}
    if "clean" in per_image:
        results["clean_accuracy"] = float(per_image["clean"]["correct"].mean())
    if "pr" in evaluators:
        default = figures["pr"][ev.pr_distribution]
        results["pr"] = {k: v["all"]["value"] for k, v in default.items()}
        results["pr_clean_correct"] = {k: v["clean_correct"]["value"] for k, v in default.items()}
    results["figures"] = figures
    results["settings"] = {
        "num_examples": int(n),
        "num_clean_correct": int(per_image["clean"]["correct"].sum()) if "clean" in per_image else None,
        "evaluators": list(evaluators),
        "pr_distribution": ev.pr_distribution,
        "pr_distributions": list(s["distributions"]),
        "pr_samples": s["pr_samples"],
        "pr_epsilons": list(s["epsilons"]),
        "pr_chunk_size": s["pr_chunk_size"],
        "pdis_c1": s["pdis_c1"], "pdis_sigma": s["pdis_sigma"],
        **PR_DISTRIBUTION_DEFINITIONS,
        "entropic_lambda": s["entropic_lambda"],
        "attack_eps": s["eps"], "attack_step_size": s["step_size"], "attack_steps": s["steps"],
        "cw_kappa": s["kappa"], "apgd_steps": s["apgd_steps"], "apgd_rho": s["apgd_rho"],
        "prob_acc_q": list(s["prob_acc_q"]),
        "confidence": s["confidence"], "bootstrap_resamples": s["bootstrap_resamples"],
        "seed": s["seed"],
        "dataset": cfg.dataset,
        "split": "test",
        "batch_size": int(batch_size),
        # Devices each batch was split over (_run_evaluator): the figures are the same on any
        # count up to float summation order (tests/test_sharding.py).
        "devices": _mesh_size(batch_size),
        "step": int(state.step),
    }
    results["evaluator_wall_time_s"] = {k: round(v, 2) for k, v in walls.items()}
    results["wall_time_s"] = round(time.perf_counter() - start_time, 2)
    if per_image_out is not None:
        per_image_out.update(_flatten_per_image(per_image, s, n))
        per_image_out.update(_identity(results["settings"]))
    return results


def _mesh_size(batch_size: int) -> int:
    return int(sharding.make_mesh(batch_size).size)


def _flatten_per_image(per_image, s, n) -> dict:
    flat = {"image_index": np.arange(n, dtype=np.int32)}
    for name, out in per_image.items():
        if isinstance(out, dict):
            for k, v in out.items():
                flat[f"{name}.{k}"] = v
            if "counts" in out:  # per-image PR_i = counts / N and its Clopper-Pearson interval
                flat[f"{name}.pr"] = out["counts"] / s["pr_samples"]
                flat[f"{name}.cp_lower"], flat[f"{name}.cp_upper"] = stats.clopper_pearson(
                    out["counts"], s["pr_samples"], s["confidence"])
    return flat


# What each PR distribution is, recorded in results.json's settings. Results made under another
# definition are incomparable: `compare` refuses to pair them, and the experiment runner
# re-evaluates them.
PR_DISTRIBUTION_DEFINITIONS = {
    "pdis": "N(x, 1/(2 c1)) per pixel truncated to [0,1]",
    "gaussian": "x + eps * N(0, I), clipped to [0,1]",
    "uniform": "U[max(x - eps, 0), min(x + eps, 1)] per pixel (uniform on the Linf ball and [0,1]^d)",
}


# Settings that identify an evaluation, stored in per_image.npz as META_PREFIX + name and
# checked against results.json's settings wherever the two are paired (`check_per_image`).
META_PREFIX = "meta."
IDENTITY_FIELDS = ("step", "seed", "num_examples", "pr_samples", "pr_epsilons", "pr_distributions",
                   "evaluators", "dataset")


def _identity(settings) -> dict:
    return {META_PREFIX + k: np.asarray(settings[k]) for k in IDENTITY_FIELDS}


def check_per_image(results: dict, per_image: dict, where: str) -> None:
    """Raises UserError unless `per_image` (per_image.npz) was written by the evaluation that
    wrote `results` (results.json): a kill between the two writes, or a copied file, would
    otherwise pair one evaluation's figures with another's per-image outcomes.

    Files written before the identity was stored are checked on their number of images only.
    """
    if not per_image:
        return
    settings = results.get("settings", {})
    if META_PREFIX + "step" not in per_image:
        n = len(per_image.get("image_index", ()))
        if n != settings.get("num_examples"):
            raise UserError(f"{where}: per_image.npz holds {n} images but results.json "
                            f"{settings.get('num_examples')}; re-run the evaluation")
        return
    differing = []
    for k in IDENTITY_FIELDS:
        stored = np.asarray(per_image.get(META_PREFIX + k))
        expected = np.asarray(settings.get(k))
        if stored.shape != expected.shape or not np.array_equal(stored, expected):
            differing.append(f"{k} {stored.tolist()!r} vs {expected.tolist()!r}")
    if differing:
        raise UserError(f"{where}: per_image.npz does not belong to results.json ({'; '.join(differing)}); "
                        f"re-run the evaluation")


def _eps_key(eps: float) -> str:
    return repr(float(eps))  # 0.1 -> "0.1", 0.12 -> "0.12"


def _bar(enabled, total, desc):
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, unit="img", desc=desc, dynamic_ncols=True)


def _latest_checkpoint_step(workdir: str) -> int:
    """The step of the workdir's latest complete checkpoint, or a UserError."""
    step = workdir_lib.latest_step(workdir)
    if step is None:
        raise UserError(f"no checkpoint in {workdir!r}; train first")
    return step


def check_eval_config(cfg) -> None:
    """The config's evaluation settings and evaluators, checked when training starts so that a
    bad value fails then, not after the training time was spent."""
    ev = eval_settings(cfg)
    _resolve(cfg, ev)
    parse_evaluators(ev.evaluators)
    check_run_settings(ev.num_examples, ev.batch_size)


def check_workdir(workdir: str, num_examples=None, batch_size=None, evaluators=None,
                  overrides: dict | None = None, overwrite: bool = True):
    """Everything `run` needs that can be checked without evaluating: config.json, a
    checkpoint, the eval settings with the overrides, evaluators, num_examples and
    batch_size; with overwrite=False also that an existing eval/results.json holds no
    evaluator this run would drop. Returns the config with the overrides applied."""
    cfg = workdir_lib.load_config(workdir)
    config_lib.validate(cfg)
    cfg = apply_overrides(cfg, overrides)
    ev = eval_settings(cfg)
    _resolve(cfg, ev)
    chosen = parse_evaluators(ev.evaluators if evaluators is None else evaluators)
    check_run_settings(ev.num_examples if num_examples is None else num_examples,
                       ev.batch_size if batch_size is None else batch_size)
    _latest_checkpoint_step(workdir)
    if not overwrite:
        previous = _read_results_settings(workdir).get("evaluators") or []
        dropped = [e for e in previous if e not in chosen]
        if dropped:
            raise UserError(
                f"{workdir}: eval/results.json holds {', '.join(dropped)}, which this evaluation "
                f"({', '.join(chosen)}) would replace and lose; include them in --evaluators, or pass "
                f"--overwrite")
    return cfg


def _read_results_settings(workdir: str) -> dict:
    path = os.path.join(workdir, "eval", "results.json")
    if not os.path.isfile(path):
        return {}
    try:
        with open(path) as f:
            return json.load(f).get("settings", {})
    except (OSError, ValueError) as error:
        raise UserError(f"{path} is unreadable ({error}); move it away or pass --overwrite") from None


def restore_for_eval(workdir: str, mesh=None):
    """(cfg, model_fns, state) from a workdir's config and newest intact checkpoint.

    The state is restored replicated over `mesh` (default: every device of this process), so
    a checkpoint written on any number of devices restores here. A newest checkpoint that
    cannot be restored is skipped with a one-line warning (the workdir is not changed).
    """
    cfg = workdir_lib.load_config(workdir)
    config_lib.validate(cfg)
    _latest_checkpoint_step(workdir)
    tx = state_lib.make_optimizer(cfg, state_lib.learning_rate_schedule(cfg, 1))
    model_holder = {}

    def init():
        _, fns, st = state_lib.create_train_state(cfg, tx)
        model_holder["fns"] = fns
        return st

    abstract = jax.eval_shape(init)
    if mesh is None:
        mesh = jax.make_mesh((jax.device_count(),), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
    manager = workdir_lib.checkpoint_manager(workdir, create=False)
    try:
        state, _ = workdir_lib.restore_newest_intact(manager, sharding.replicated_target(abstract, mesh))
    finally:
        manager.close()
    return cfg, model_holder["fns"], state


def apply_overrides(cfg, overrides: dict | None):
    """cfg with eval fields replaced (e.g. {'pr_samples': 20}); unknown fields are refused."""
    if not overrides:
        return cfg
    cfg = ml_collections.ConfigDict(cfg.to_dict())
    ev = eval_settings(cfg)
    for key, value in overrides.items():
        if key not in ev:
            raise UserError(f"unknown eval setting {key!r}")
        ev[key] = value
    cfg.eval = ev
    return cfg


def run(workdir: str, num_examples: int | None = None, batch_size: int | None = None,
        progress: bool = True, evaluators=None, overrides: dict | None = None,
        overwrite: bool = True) -> dict:
    """Evaluates a workdir's latest checkpoint; writes eval/per_image.npz, then eval/results.json.

    Both are written atomically (temp file + os.replace), results.json last: it is the commit
    marker, so a kill never leaves a new results.json beside an older per_image.npz, and
    per_image.npz carries the identity of its evaluation (`check_per_image`).
    Returns the results as written (non-finite numbers as None). overwrite=False (the command
    line's default) refuses to replace a results.json holding evaluators this run lacks.
    """
    check_workdir(workdir, num_examples, batch_size, evaluators, overrides, overwrite)
    # Process 0 writes eval/ and holds the workdir's lock for the evaluation's processes.
    lock = workdir_lib.exclusive(workdir, "an evaluation") if sharding.is_writer() else contextlib.nullcontext()
    with lock:
        return _evaluate_and_write(workdir, num_examples, batch_size, progress, evaluators, overrides)


def _evaluate_and_write(workdir, num_examples, batch_size, progress, evaluators, overrides) -> dict:
    cfg, model_fns, state = restore_for_eval(workdir)
    cfg = apply_overrides(cfg, overrides)
    split = data.load_split(cfg.dataset, "test", cfg.data_dir)
    per_image = {}
    results = evaluate_state(
        cfg, model_fns, state, split,
        num_examples=cfg.eval.num_examples if num_examples is None else num_examples,
        batch_size=cfg.eval.batch_size if batch_size is None else batch_size,
        progress=progress and sharding.is_writer(), evaluators=evaluators, per_image_out=per_image)
    if not sharding.is_writer():
        return workdir_lib.json_safe(results)
    out_dir = os.path.join(workdir, "eval")
    os.makedirs(out_dir, exist_ok=True)
    tmp = os.path.join(out_dir, "per_image.tmp.npz")
    np.savez_compressed(tmp, **per_image)
    os.replace(tmp, os.path.join(out_dir, "per_image.npz"))
    written = workdir_lib.write_json(os.path.join(out_dir, "results.json"), results)
    stale_plot = os.path.join(out_dir, "pr_vs_eps.png")  # drawn from the previous results
    if "pr" not in results.get("figures", {}) and os.path.isfile(stale_plot):
        os.remove(stale_plot)
    return written


def load_results(workdir: str):
    """(results dict, per-image arrays) written by `run`."""
    out_dir = os.path.join(workdir, "eval")
    path = os.path.join(out_dir, "results.json")
    if not os.path.isfile(path):
        raise UserError(f"no evaluation in {workdir!r}; run python -m patjax.evaluate --workdir={workdir}")
    with open(path) as f:
        results = json.load(f)
    npz = os.path.join(out_dir, "per_image.npz")
    per_image = dict(np.load(npz)) if os.path.isfile(npz) else {}
    check_per_image(results, per_image, workdir)
    return results, per_image


# ---------------------------------------------------------------------------------------
# Tables, comparison and plot.

def _pct(fig) -> str:
    if not fig or fig.get("value") is None:
        return "-"
    lo, hi = fig["interval"]
    return f"{100 * fig['value']:.2f} [{100 * lo:.1f},{100 * hi:.1f}]"


def _table(header, rows) -> str:
    widths = [max(len(str(r[i])) for r in [header] + rows) for i in range(len(header))]
    line = lambda cells: "  ".join(str(c).rjust(w) for c, w in zip(cells, widths))
    return "\n".join([line(header)] + [line(r) for r in rows])


def _confidence_pct(settings) -> str:
    return f"{100 * float(settings.get('confidence', 0.95)):g}%"  # 0.95 -> "95%", 0.9 -> "90%"


def _run_name(workdir):
    return os.path.basename(os.path.normpath(workdir))


def format_table(workdir: str, results: dict) -> str:
    return format_comparison([workdir], [results])


def format_comparison(workdirs, results_list) -> str:
    """The paper's Table 1 columns (Acc, PGD, CW, PR(eps)...) with intervals, one row per run."""
    first = results_list[0]
    dist = first["settings"]["pr_distribution"]
    eps_keys = list(first.get("pr", {}))
    header = ["run", "Acc %", "PGD %", "CW %"] + [f"PR({e}) %" for e in eps_keys]
    rows = []
    for workdir, r in zip(workdirs, results_list):
        f = r.get("figures", {})
        pr = f.get("pr", {}).get(dist, {})
        rows.append([_run_name(workdir), _pct(f.get("clean_accuracy")), _pct(f.get("pgd20")), _pct(f.get("cw20"))]
                    + [_pct(pr.get(e, {}).get("all")) for e in eps_keys])
    extra_header = ["run", "APGD-CE %", "APGD-DLR %", "worst %"] + [f"LB({e}) %" for e in eps_keys]
    extra = []
    for workdir, r in zip(workdirs, results_list):
        f = r.get("figures", {})
        pr = f.get("pr", {}).get(dist, {})
        extra.append([_run_name(workdir), _pct(f.get("apgd_ce")), _pct(f.get("apgd_dlr")), _pct(f.get("worst_case"))]
                     + [_pct(pr.get(e, {}).get("lower_bound")) for e in eps_keys])
    s = first["settings"]
    note = (f"({s['num_examples']} test images; PR over all of them (clean-misclassified included): "
            f"{dist} noise, N={s['pr_samples']}, seed {s['seed']}; "
            f"[{_confidence_pct(s)} intervals]: Clopper-Pearson for accuracies, bootstrap over images for PR; "
            f"LB = Theorem 2 lower bound 1 - E[f]/log 2)")
    return "\n".join([_table(header, rows), "", _table(extra_header, extra), note])


def paired_differences(results_list, per_images, workdirs) -> list:
    """PR(run) - PR(first run) per eps with a paired bootstrap interval over images (same samples)."""
    base_res, base = results_list[0], per_images[0]
    s = _resolve_from_results(base_res)
    out = []
    for workdir, res, pi in zip(workdirs[1:], results_list[1:], per_images[1:]):
        _check_common_random_numbers(base_res, res, workdirs[0], workdir)
        row = {"run": _run_name(workdir), "baseline": _run_name(workdirs[0]), "distributions": {}}
        for d in res["settings"]["pr_distributions"]:
            key = f"pr_{d}.counts"
            if key not in pi or key not in base:
                continue
            diff = (pi[key].astype(np.float64) - base[key].astype(np.float64)) / s["pr_samples"]
            keys = list(res["figures"]["pr"][d])
            row["distributions"][d] = {k: _mean_with_interval(diff[:, j], s) for j, k in enumerate(keys)}
        out.append(row)
    return out


def _resolve_from_results(results):
    st = results["settings"]
    return {"pr_samples": st["pr_samples"], "bootstrap_resamples": st["bootstrap_resamples"],
            "seed": st["seed"], "confidence": st["confidence"]}


def _check_common_random_numbers(a, b, wa, wb):
    keys = ("num_examples", "pr_samples", "seed", "pr_epsilons", "dataset", "pdis_c1",
            *PR_DISTRIBUTION_DEFINITIONS)
    differing = [k for k in keys if a["settings"].get(k) != b["settings"].get(k)]
    if differing:
        raise UserError(f"{wa!r} and {wb!r} were evaluated with different settings "
                        f"({', '.join(differing)}): not comparable on common random numbers")


def format_differences(diffs, dist) -> str:
    if not diffs:
        return ""
    eps_keys = list(diffs[0]["distributions"].get(dist, {}))
    header = ["run - " + diffs[0]["baseline"]] + [f"dPR({e}) pp" for e in eps_keys]
    rows = []
    for row in diffs:
        cells = [row["run"]]
        for e in eps_keys:
            fig = row["distributions"].get(dist, {}).get(e)
            cells.append("-" if fig is None else
                         f"{100 * fig['value']:+.2f} [{100 * fig['interval'][0]:+.2f},{100 * fig['interval'][1]:+.2f}]")
        rows.append(cells)
    return _table(header, rows) + "\n(paired: same images and perturbations; bootstrap over images)"


def plot_pr(workdirs, results_list, path) -> None:
    """PNG: PR against eps with interval bands, one line per run, one panel per eps-distribution."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dists = [d for d in results_list[0]["settings"]["pr_distributions"] if d in robustness.DISTRIBUTIONS]
    fig, axes = plt.subplots(1, len(dists), figsize=(5 * len(dists), 4), squeeze=False)
    for ax, d in zip(axes[0], dists):
        for workdir, r in zip(workdirs, results_list):
            pr = r.get("figures", {}).get("pr", {}).get(d)
            if not pr:
                continue
            eps = [float(e) for e in pr]
            val = [100 * pr[e]["all"]["value"] for e in pr]
            lo = [100 * pr[e]["all"]["interval"][0] for e in pr]
            hi = [100 * pr[e]["all"]["interval"][1] for e in pr]
            line, = ax.plot(eps, val, marker="o", label=_run_name(workdir))
            ax.fill_between(eps, lo, hi, alpha=0.25, color=line.get_color())
        s = results_list[0]["settings"]
        ax.set_title(f"{d} noise, N={s['pr_samples']}, {s['num_examples']} images")
        ax.set_xlabel("eps")
        ax.set_ylabel(f"PR % ({_confidence_pct(s)} bootstrap interval)")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def compare(workdirs, plot_path=None) -> str:
    """Table, paired differences and PNG plot for evaluated workdirs; returns the printed text."""
    loaded = [load_results(w) for w in workdirs]
    results_list = [r for r, _ in loaded]
    text = format_comparison(workdirs, results_list)
    plot_path = plot_path or os.path.join(workdirs[0], "eval", "pr_vs_eps.png")
    if any("pr" in r.get("figures", {}) for r in results_list):
        plot_pr(workdirs, results_list, plot_path)
        text += f"\nplot: {plot_path}"
    if len(workdirs) > 1:
        diffs = paired_differences(results_list, [p for _, p in loaded], workdirs)
        dist = results_list[0]["settings"]["pr_distribution"]
        text += "\n\n" + format_differences(diffs, dist)
        workdir_lib.write_json(os.path.splitext(plot_path)[0] + "_paired_differences.json", diffs)
    return text


def main(argv):
    from absl import flags

    FLAGS = flags.FLAGS
    cli_lib.start(argv)
    if not FLAGS.workdir:
        raise UserError("--workdir is required")
    overrides = {}
    if FLAGS.pr_samples is not None:
        overrides["pr_samples"] = FLAGS.pr_samples
    if FLAGS.pr_chunk_size is not None:
        overrides["pr_chunk_size"] = FLAGS.pr_chunk_size
    if FLAGS.pr_distributions is not None:
        overrides["pr_distributions"] = tuple(d.strip() for d in FLAGS.pr_distributions.split(",") if d.strip())
    if FLAGS.seed is not None:
        overrides["seed"] = FLAGS.seed
    if FLAGS.apgd_steps is not None:
        overrides["apgd_steps"] = FLAGS.apgd_steps
    evaluators = parse_evaluators(FLAGS.evaluators) if FLAGS.evaluators else None
    if not FLAGS.compare_only:
        # Every workdir is checked (config, checkpoint, settings) before any is evaluated, so a
        # mistake in the last one does not surface after the first ones ran for hours.
        for workdir in FLAGS.workdir:
            check_workdir(workdir, FLAGS.num_examples, FLAGS.batch_size, evaluators, overrides,
                          overwrite=FLAGS.overwrite)
        for workdir in FLAGS.workdir:
            results = run(workdir, FLAGS.num_examples, FLAGS.batch_size, evaluators=evaluators,
                          overrides=overrides, overwrite=FLAGS.overwrite)
            if not sharding.is_writer():
                continue
            print(f"{_run_name(workdir)}: wrote {os.path.join(workdir, 'eval', 'results.json')} "
                  f"(wall time per evaluator, s: {results['evaluator_wall_time_s']})")
    if sharding.is_writer():
        print(compare(FLAGS.workdir, FLAGS.plot))


def _define_flags():
    from absl import flags

    flags.DEFINE_multi_string("workdir", None, "Workdir(s) of trained runs (several: one comparison).")
    flags.DEFINE_integer("num_examples", None, "Test images to evaluate, the first ones of the split; "
                         "-1: all of them (default: config.eval).")
    flags.DEFINE_integer("batch_size", None, "Images per evaluation batch (default: config.eval).")
    flags.DEFINE_string("evaluators", None, "Comma-separated: clean,pgd20,cw20,apgd (=apgd_ce,apgd_dlr),"
                        "apgd_ce,apgd_dlr,pr,all (default: config.eval.evaluators).")
    flags.DEFINE_integer("pr_samples", None, "N perturbations per image for PR.")
    flags.DEFINE_integer("pr_chunk_size", None, "Perturbations per image evaluated at once (memory).")
    flags.DEFINE_string("pr_distributions", None, "Comma-separated: gaussian,uniform,pdis.")
    flags.DEFINE_integer("seed", None, "Evaluation seed (attack starts, PR noise, bootstrap).")
    flags.DEFINE_integer("apgd_steps", None, "APGD iterations (default 100).")
    flags.DEFINE_bool("compare_only", False, "Do not evaluate; compare the existing eval/ results.")
    flags.DEFINE_bool("overwrite", False, "Replace eval/results.json even if it holds evaluators this "
                      "evaluation does not run (they are lost).")
    flags.DEFINE_string("plot", None, "PNG path of the PR-vs-eps plot (default: FIRST/eval/pr_vs_eps.png).")


def cli():
    from absl import app

    _define_flags()
    app.run(cli_lib.guarded(main), flags_parser=cli_lib.parse_flags)


if __name__ == "__main__":
    cli()
