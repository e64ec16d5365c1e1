"""Comparing evaluated runs: one table of their figures, the paired PR, certified-accuracy and
log10 P(violation) differences against the first run (same images, same perturbations: common
random numbers), and the PR plot. Reads the eval/ files `evaluation` writes (`eval_files.load_results`)."""

from __future__ import annotations

import contextlib
import os

from patjax.core import files, locks
from patjax.evaluators import certify, common, rare_pr, stats
from patjax.pat import robustness
from patjax.reporting import plots, report
from patjax.run import eval_files, eval_settings


def certified_differences(settings, per_image, base_settings, base, indices, confidence) -> dict:
    """Certified accuracy (run) - (first run) at each radius both evaluated, over all images,
    paired (`stats.paired_difference`): {radius: {value, interval, n, interval_method}}; {} when
    either lacks certificates (their certify settings are the same: `pairing`)."""
    if "certify.class" not in per_image or "certify.class" not in base:
        return {}
    radii = [r for r in settings["certify"]["radii"] if r in base_settings["certify"]["radii"]]
    hits = [
        certify.certified_at(p["certify.class"], p["certify.label"], p["certify.radius"], radii)
        for p in (per_image, base)
    ]
    out = {}
    for j, radius in enumerate(radii):
        value, (low, high) = stats.paired_difference(hits[0][j], hits[1][j], indices, confidence)
        out[robustness.level_key(radius)] = {
            "value": value,
            "interval": [low, high],
            "n": int(hits[0].shape[1]),
            "interval_method": "paired percentile bootstrap over images",
        }
    return out


def rare_pr_differences(settings, per_image, base) -> dict:
    """log10 P(violation) of the run minus the first run's at each radius both estimated
    (`rare_pr.paired_median_difference`), over the images both classify correctly: {radius: figure};
    {} when either lacks rare_pr (their rare_pr settings are the same: `pairing`)."""
    key = f"{rare_pr.NAME}.ordered"
    if key not in per_image or key not in base:
        return {}
    shared = common.SharedSettings(
        seed=int(settings["seed"]),
        confidence=float(settings["confidence"]),
        bootstrap_resamples=int(settings["bootstrap_resamples"]),
    )
    both = per_image["clean.correct"] & base["clean.correct"]
    return {
        robustness.level_key(eps): rare_pr.paired_median_difference(per_image[key][:, j], base[key][:, j], both, shared)
        for j, eps in enumerate(settings[rare_pr.BLOCK]["epsilons"])
    }


def pairing(settings_list, names, aside=()) -> tuple:
    """(bootstrap indices, confidence) that evaluations (their results.json `settings`, named by
    `names` in errors) share when paired: one resampling of the same images for all of them, so
    that a difference's interval reflects the images, not independent draws. Raises a UserError
    unless they were evaluated on common random numbers (`eval_settings.check_comparable`, with the
    settings `aside` left to the caller)."""
    first = settings_list[0]
    for settings, name in zip(settings_list[1:], names[1:]):
        eval_settings.check_comparable(first, settings, names[0], name, aside=aside)
    indices = stats.bootstrap_indices(int(first["num_examples"]), int(first["bootstrap_resamples"]), int(first["seed"]))
    return indices, float(first["confidence"])


def paired_differences(workdirs, results_list, per_images, names=None) -> list:
    """PR(run) - PR(first run) per distribution, level and estimand (`pr_difference`), and the
    certified accuracy's and log10 P(violation)'s differences where both were evaluated: same
    images, same perturbations; the runs named by `names` (default: `labels(workdirs)`)."""
    names = names or labels(workdirs)
    base_res, base = results_list[0], per_images[0]
    st = base_res["settings"]
    indices, confidence = pairing([r["settings"] for r in results_list], workdirs)
    out = []
    for name, res, pi in zip(names[1:], results_list[1:], per_images[1:]):
        row = {"run": name, "baseline": names[0], "distributions": {}}
        for d in res["settings"]["pr"]["distributions"]:
            key = f"pr_{d}.counts"
            if key not in pi or key not in base or "clean.correct" not in pi or "clean.correct" not in base:
                continue
            row["distributions"][d] = {
                level: stats.pr_difference(
                    pi[key][:, j],
                    pi["clean.correct"],
                    base[key][:, j],
                    base["clean.correct"],
                    st["pr"]["samples"],
                    indices,
                    confidence,
                )
                for j, level in enumerate(res["figures"]["pr"][d])
            }
        certified = certified_differences(res["settings"], pi, st, base, indices, confidence)
        if certified:
            row["certified_accuracy"] = certified
        rare = rare_pr_differences(res["settings"], pi, base)
        if rare:
            row["rare_pr"] = rare
        out.append(row)
    return out


def labels(sources) -> list:
    """Each model's label in the table, the plot's legend and the paired lines, from what the user
    named: a workdir by its folder's name, a file by its file name (quickstart.safetensors, not
    the quickstart of the run it was exported from), a RobustBench entry by its name; where two
    would still read alike (runs/a/pgd, runs/b/pgd), every one by its path as given."""
    short = [os.path.basename(os.path.normpath(s)) for s in sources]
    return short if len(set(short)) == len(short) else [os.path.normpath(s) for s in sources]


def kept_line(label, outcome, written_to) -> str:
    """What became of a model's evaluation: written (a learning-curve point's results, to
    `written_to`), or kept under its name (`evaluation.Kept`): written, or a saved one reused."""
    if isinstance(outcome, dict):
        return f"{label}: wrote {written_to} (wall time per evaluator, s: {outcome['evaluator_wall_time_s']})"
    path, name = os.path.join(outcome.folder, "results.json"), outcome.name
    if outcome.reused:
        return (
            f"{label}: reused {path} ({name}: made with this evaluation's settings and images; --overwrite redoes it)"
        )
    taken = outcome.results.get(eval_files.REUSED_KEY) or {}
    sources = sorted(set(taken.values()))
    reused = "".join(f"; {', '.join(e for e in taken if taken[e] == s)} taken from {s}" for s in sources)
    walls = outcome.results["evaluator_wall_time_s"]
    return f"{label}: wrote {path} ({name}; wall time per evaluator, s: {walls}{reused})"


def compare(workdirs, plot_path=None, plot_over="clean_correct", names=None, evals=None) -> str:
    """Table, paired differences (against the first workdir) and PNG plot (PR over `plot_over`'s
    images, `plots.plot_pr`) of evaluated workdirs (the folders holding eval/; each workdir's
    evaluation named in `evals`, where one is given), labelled by `names` (default:
    `labels(workdirs)`); writes the plot and PLOT_paired_differences.json beside the first
    evaluation, returns the text to print."""
    evals = evals or [None] * len(workdirs)
    loaded = [eval_files.load_results(w, name=e) for w, e in zip(workdirs, evals)]
    results_list = [r for r, _ in loaded]
    names = names or labels(workdirs)
    text = report.comparison(names, results_list)
    # The default plot is a file of the first run's evaluation: written under its lock, as its evaluation is.
    into_run = plot_path is None
    drawn = plots.drawn(results_list)
    plot_path = plot_path or eval_files.plot_path(workdirs[0], evals[0], plots.plot_file(results_list))
    with locks.exclusive(workdirs[0], "a comparison plot") if into_run else contextlib.nullcontext():
        if drawn:
            plots.save_figure(plots.plot_pr(names, results_list, plot_over), plot_path)
            text += f"\nplot: {plot_path}"
        if len(workdirs) > 1:
            diffs = paired_differences(workdirs, results_list, [p for _, p in loaded], names)
            paired = report.differences(diffs, results_list[0]["settings"])
            text += "\n\n" + paired if paired else ""
            files.write_json(os.path.splitext(plot_path)[0] + "_paired_differences.json", diffs)
    return text
