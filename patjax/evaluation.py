"""Evaluating trained runs: the chosen evaluators over the test split, their figures, the
workdir's eval/ files, and the paired comparison of several evaluated runs.

`evaluate_state` is the library call (a state and a split in, a results dict out);
`evaluate_workdir` evaluates a workdir's newest checkpoint (or its kept model) and writes
DIR/eval/per_image.npz (per-image outcomes and PR statistics, for paired comparisons) and then,
last, DIR/eval/results.json (strict JSON; NaN/inf as null):
  clean_accuracy      fraction of test images classified correctly
  pr                  the headline PR: {"0.1": {value, interval, n}, ...}, the mean of per-image
                      PR_i over the images the model classifies correctly, under
                      eval.pr_distribution (default uniform: the Table-1 protocol, `PROTOCOL`)
  pr_all_images       the same law's mean over every evaluated image (misclassified ones included)
  pr_protocol         what `pr` is, in words
  figures             every figure with its interval, method, number of images and settings;
                      per distribution and level: all, clean_correct (with its own prob_acc,
                      AT-PR's Prob.Acc), prob_acc, expected_loss, the lower bounds, entropic_risk
  settings            seed, number of images, checkpoint step, every evaluator's settings
  evaluator_wall_time_s, wall_time_s
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import os
import time

import numpy as np

from patjax import (
    checkpoints,
    data,
    eval_files,
    files,
    locks,
    plots,
    report,
    robustness,
    sharding,
    stats,
)
from patjax import evaluators as evaluators_lib
from patjax import workdir as workdir_lib
from patjax.errors import UserError
from patjax.evaluators import common

# The paper's Table 1 reports PR above clean accuracy for every adversarially trained model, so
# its PR is a mean over the images each model classifies correctly; the law is not stated and
# is inferred from the AT-PR code's evaluate.py (docs/evaluation.md, "The Table-1 protocol").
PROTOCOL = (
    "Table-1 protocol: per image, the fraction of N samples uniform on [max(x - eps, 0), "
    "min(x + eps, 1)] per pixel with s(x') < 0 (ties adversarial); the mean over the images the "
    "model classifies correctly"
)
SEED_LIMIT = 2**32  # PRNGKey keeps 32 bits without x64: seeds 0 and 2**32 would alias
WHOLE_SPLIT = -1  # num_examples meaning every image of the test split


def _integer(name, value, minimum, maximum=None) -> int:
    """value as an int, or a one-line UserError naming the setting."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, np.integer))
        or value < minimum
        or (maximum is not None and value > maximum)
    ):
        bound = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
        raise UserError(f"{name} must be an integer {bound}, got {value!r}")
    return int(value)


def check_run_settings(num_examples, batch_size) -> None:
    """num_examples (>= 1, or -1: the whole split) and batch_size (>= 1), before anything is
    evaluated. 0 is refused rather than read as "all": a full evaluation takes hours on a CPU."""
    _integer("batch_size", batch_size, 1)
    if num_examples == WHOLE_SPLIT and not isinstance(num_examples, bool):
        return
    if isinstance(num_examples, bool) or not isinstance(num_examples, (int, np.integer)) or num_examples < 1:
        raise UserError(
            f"num_examples must be a positive integer, or {WHOLE_SPLIT} for the whole test split, got {num_examples!r}"
        )


def eval_settings(cfg) -> common.EvalSettings:
    """The evaluators' settings from a run's config, checked and typed (static for jit): the one
    place the `eval` block is read, where the config enters (the command lines, the runner).

    Its sampler's c1, c2 and PAT's beta set p_dis and the entropic lambda by default. Every
    check runs before any evaluator, so a bad setting fails in a second, not after the
    evaluation.
    """
    ev = cfg.eval
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
    _integer("eval.aa_target_classes", ev.aa_target_classes, 1)
    _integer("eval.aa_fab_steps", ev.aa_fab_steps, 1)
    _integer("eval.aa_square_queries", ev.aa_square_queries, 1)
    if any(not f > 1 for f in ev.aa_masking_eps_factors):
        raise UserError(f"eval.aa_masking_eps_factors must be > 1, got {tuple(ev.aa_masking_eps_factors)}")
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
    return common.EvalSettings(
        pr_distributions=tuple(distributions),
        pr_epsilons=epsilons,
        pr_samples=int(ev.pr_samples),
        pr_chunk_size=int(ev.pr_chunk_size),
        pdis_c1=c1,
        pdis_sigma=robustness.pdis_sigma(c1),
        entropic_lambda=max(lam, 0.0),
        attack_eps=float(ev.attack_eps),
        attack_step_size=float(ev.attack_step_size),
        attack_steps=int(ev.attack_steps),
        cw_kappa=float(ev.cw_kappa),
        apgd_steps=int(ev.apgd_steps),
        apgd_rho=float(ev.apgd_rho),
        aa_target_classes=int(ev.aa_target_classes),
        aa_fab_steps=int(ev.aa_fab_steps),
        aa_square_queries=int(ev.aa_square_queries),
        aa_masking_eps_factors=tuple(float(f) for f in ev.aa_masking_eps_factors),
        prob_acc_q=tuple(float(q) for q in ev.prob_acc_q),
        confidence=float(ev.confidence),
        bootstrap_resamples=int(ev.bootstrap_resamples),
        seed=int(ev.seed),
    )


def check_config(cfg) -> None:
    """The config's evaluation settings and evaluators, checked when training starts so that a
    bad value fails then, not after the training time was spent."""
    eval_settings(cfg)
    evaluators_lib.parse(cfg.eval.evaluators)
    check_run_settings(cfg.eval.num_examples, cfg.eval.batch_size)


def apply_overrides(cfg, overrides: dict | None):
    """A copy of cfg with eval fields replaced (e.g. {'pr_samples': 20}); unknown fields are refused."""
    if not overrides:
        return cfg
    cfg = copy.deepcopy(cfg)
    ev = cfg.eval
    for key, value in overrides.items():
        if key not in ev:
            raise UserError(f"unknown eval setting {key!r}")
        ev[key] = value
    cfg.eval = ev
    return cfg


def evaluate_state(
    s: common.EvalSettings,
    model_fns,
    state,
    split: data.Split,
    *,
    dataset: str,
    evaluators=("all",),
    num_examples: int = -1,
    batch_size: int = 500,
    progress: bool = True,
    per_image_out: dict | None = None,
) -> dict:
    """Every chosen evaluator on the first num_examples images of `split` (-1: all of them).

    s: `eval_settings(cfg)`; dataset: the split's, recorded with the figures.
    evaluators: names or a comma-separated string (`evaluators.parse`).
    per_image_out: if a dict, receives the per-image arrays (per_image.npz holds them and the
      evaluation's identity, `workdir.identity`).
    """
    names = evaluators_lib.parse(evaluators)
    check_run_settings(num_examples, batch_size)
    n = len(split) if num_examples == WHOLE_SPLIT else min(num_examples, len(split))
    chosen = [evaluators_lib.REGISTRY[name] for name in names]
    if "clean" not in names and any(e.needs_clean for e in chosen):
        chosen.append(evaluators_lib.REGISTRY["clean"])  # for the clean-correct subset; runs last
    start_time = time.perf_counter()
    per_image, walls, figures = {}, {}, {}
    for evaluator in chosen:
        for pass_name in evaluator.passes(s):
            batch_fn = evaluator.make_batch_fn(model_fns, s, pass_name)
            subset = evaluator.subset(pass_name, per_image) if evaluator.subset else None
            per_image[pass_name], walls[pass_name] = common.evaluate_pass(
                batch_fn, state, split, n, batch_size, pass_name, progress, subset
            )
        if evaluator.combine:
            per_image[evaluator.name] = evaluator.combine(per_image, s)
    for evaluator in sorted(chosen, key=lambda e: evaluators_lib.NAMES.index(e.name)):
        figures.update(evaluator.figures(per_image, s))
    worst = evaluators_lib.worst_case(per_image, names, s)
    if worst is not None:
        figures["worst_case"] = worst
    common.bootstrap_indices.cache_clear()

    results = {}
    if "clean" in per_image:
        results["clean_accuracy"] = float(per_image["clean"]["correct"].mean())
    if "pr" in names:
        headline = figures["pr"][s.pr_distribution]
        keep = ("value", "interval", "n")
        results["pr"] = {k: {f: v["clean_correct"][f] for f in keep} for k, v in headline.items()}
        results["pr_all_images"] = {k: {f: v["all"][f] for f in keep} for k, v in headline.items()}
        results["pr_protocol"] = protocol_text(s.pr_distribution, s.pr_samples)
    results["figures"] = figures
    results["settings"] = {
        "num_examples": int(n),
        "num_clean_correct": int(per_image["clean"]["correct"].sum()) if "clean" in per_image else None,
        "evaluators": list(names),
        "pr_distribution": s.pr_distribution,
        **{k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(s).items()},
        **robustness.DEFINITIONS,
        "dataset": dataset,
        "split": "test",
        "batch_size": int(batch_size),
        # Devices each batch was split over (common.evaluate_pass): the figures are the same on any
        # count up to float summation order (tests/test_sharding.py).
        "devices": int(sharding.make_mesh(batch_size).size),
        "step": int(state.step),
    }
    results["evaluator_wall_time_s"] = {k: round(v, 2) for k, v in walls.items()}
    results["wall_time_s"] = round(time.perf_counter() - start_time, 2)
    if per_image_out is not None:
        per_image_out.update(_flatten_per_image(per_image, s, n))
    return results


def protocol_text(distribution: str, num_samples: int) -> str:
    """What the headline `pr` of results.json is: the Table-1 protocol, or the same estimand
    under another law."""
    if distribution == "uniform":
        return PROTOCOL.replace("N samples", f"N = {num_samples} samples")
    return (
        f"per image, the fraction of N = {num_samples} samples of {robustness.DEFINITIONS[distribution]} "
        f"with s(x') < 0; the mean over the images the model classifies correctly (not the Table-1 "
        f"protocol's uniform law)"
    )


def _flatten_per_image(per_image, s, n) -> dict:
    flat = {"image_index": np.arange(n, dtype=np.int32)}
    for name, out in per_image.items():
        for k, v in out.items():
            flat[f"{name}.{k}"] = v
        if "counts" in out:  # per-image PR_i = counts / N and its Clopper-Pearson interval
            flat[f"{name}.pr"] = out["counts"] / s.pr_samples
            flat[f"{name}.cp_lower"], flat[f"{name}.cp_upper"] = stats.clopper_pearson(
                out["counts"], s.pr_samples, s.confidence
            )
    return flat


def check_workdir(
    workdir: str,
    num_examples=None,
    batch_size=None,
    evaluators=None,
    overrides: dict | None = None,
    overwrite: bool = True,
):
    """Everything `evaluate_workdir` needs that can be checked without evaluating: config.json, a
    checkpoint, the eval settings with the overrides, evaluators, num_examples and
    batch_size; with overwrite=False also that an existing eval/results.json holds no
    evaluator this run would drop. Returns the config with the overrides applied."""
    cfg = apply_overrides(workdir_lib.load_config(workdir), overrides)
    ev = cfg.eval
    eval_settings(cfg)
    chosen = evaluators_lib.parse(ev.evaluators if evaluators is None else evaluators)
    check_run_settings(
        ev.num_examples if num_examples is None else num_examples, ev.batch_size if batch_size is None else batch_size
    )
    checkpoints.require_checkpoint(workdir)
    if not overwrite:
        previous = (eval_files.read_results(workdir) or {}).get("settings", {}).get("evaluators") or []
        dropped = [e for e in previous if e not in chosen]
        if dropped:
            raise UserError(
                f"{workdir}: eval/results.json holds {', '.join(dropped)}, which this evaluation "
                f"({', '.join(chosen)}) would replace and lose; include them in --evaluators, or pass "
                f"--overwrite"
            )
    return cfg


def evaluate_workdir(
    workdir: str,
    num_examples: int | None = None,
    batch_size: int | None = None,
    progress: bool = True,
    evaluators=None,
    overrides: dict | None = None,
    overwrite: bool = True,
    step: int | None = None,
) -> dict:
    """Evaluates a workdir's newest model (its newest checkpoint or kept model); writes
    eval/per_image.npz, then eval/results.json (`workdir.write_results`). Returns the results as
    written (non-finite numbers as None). overwrite=False (the command line's default) refuses
    to replace a results.json holding evaluators this run lacks.
    step: evaluate the kept model of that step instead, into curve/step_N/ (a learning curve's point).
    """
    check_workdir(workdir, num_examples, batch_size, evaluators, overrides, overwrite)
    # Process 0 writes eval/ and holds the workdir's lock for the evaluation's processes.
    lock = locks.exclusive(workdir, "an evaluation") if sharding.is_writer() else contextlib.nullcontext()
    with lock:
        cfg, model_fns, state = workdir_lib.restore(workdir, step=step)
        cfg = apply_overrides(cfg, overrides)
        return evaluate_and_write(cfg, model_fns, state, workdir, evaluators, num_examples, batch_size, progress, step)


def evaluate_and_write(
    cfg,
    model_fns,
    state,
    out_dir,
    evaluators=None,
    num_examples=None,
    batch_size=None,
    progress=True,
    step=None,
    record: dict | None = None,
) -> dict:
    """`evaluate_state` on cfg.dataset's test split with cfg's eval settings (the arguments given
    win), written to out_dir/eval/ (or curve/step_N/) by process 0 with `record`'s entries added;
    returns the results as written."""
    split = data.load_split(cfg.dataset, "test", cfg.data_dir)
    per_image = {}
    results = evaluate_state(
        eval_settings(cfg),
        model_fns,
        state,
        split,
        dataset=cfg.dataset,
        evaluators=cfg.eval.evaluators if evaluators is None else evaluators,
        num_examples=cfg.eval.num_examples if num_examples is None else num_examples,
        batch_size=cfg.eval.batch_size if batch_size is None else batch_size,
        progress=progress and sharding.is_writer(),
        per_image_out=per_image,
    )
    results.update(record or {})
    if not sharding.is_writer():
        return files.json_safe(results)
    return eval_files.write_results(out_dir, results, per_image, step)


def paired_differences(workdirs, results_list, per_images) -> list:
    """PR(run) - PR(first run) per distribution, level and estimand (`pr_difference`): same
    images, same perturbations."""
    names = [workdir_name(w) for w in workdirs]
    base_res, base = results_list[0], per_images[0]
    st = base_res["settings"]
    indices = common.bootstrap_indices(int(st["num_examples"]), int(st["bootstrap_resamples"]), int(st["seed"]))
    out = []
    for workdir, name, res, pi in zip(workdirs[1:], names[1:], results_list[1:], per_images[1:]):
        eval_files.check_comparable(st, res["settings"], workdirs[0], workdir)
        row = {"run": name, "baseline": names[0], "distributions": {}}
        for d in res["settings"]["pr_distributions"]:
            key = f"pr_{d}.counts"
            if key not in pi or key not in base or "clean.correct" not in pi or "clean.correct" not in base:
                continue
            row["distributions"][d] = {
                level: stats.pr_difference(
                    pi[key][:, j],
                    pi["clean.correct"],
                    base[key][:, j],
                    base["clean.correct"],
                    st["pr_samples"],
                    indices,
                    st["confidence"],
                )
                for j, level in enumerate(res["figures"]["pr"][d])
            }
        out.append(row)
    common.bootstrap_indices.cache_clear()
    return out


def workdir_name(workdir: str) -> str:
    return os.path.basename(os.path.normpath(workdir))


def compare(workdirs, plot_path=None) -> str:
    """Table, paired differences (against the first workdir) and PNG plot of evaluated workdirs;
    writes the plot and PLOT_paired_differences.json, returns the text to print."""
    loaded = [eval_files.load_results(w) for w in workdirs]
    results_list = [r for r, _ in loaded]
    names = [workdir_name(w) for w in workdirs]
    text = report.comparison(names, results_list)
    plot_path = plot_path or eval_files.plot_path(workdirs[0])
    if any("pr" in r.get("figures", {}) for r in results_list):
        plots.save_figure(plots.plot_pr(names, results_list), plot_path)
        text += f"\nplot: {plot_path}"
    if len(workdirs) > 1:
        diffs = paired_differences(workdirs, results_list, [p for _, p in loaded])
        text += "\n\n" + report.differences(diffs, results_list[0]["settings"]["pr_distribution"])
        files.write_json(os.path.splitext(plot_path)[0] + "_paired_differences.json", diffs)
    return text
