"""Figures from results dicts (eval/results.json, a suite's results.json, the sampler
diagnostic's): the one module that draws (matplotlib, imported when a figure is made). Like
`patjax.reporting.report`, nothing here reads a workdir or computes a figure; callers save the returned
matplotlib figure (`save_figure`).
"""

from __future__ import annotations

import os

import numpy as np

from patjax.core import files
from patjax.data.download import DISPLAY_NAMES
from patjax.evaluators import certify as certify_lib
from patjax.evaluators import pr as pr_lib
from patjax.pat import laws, robustness
from patjax.reporting.report import confidence_pct, method_label


def _pyplot():
    # Imported here, not at the top: matplotlib takes seconds to import and only the commands
    # that draw need it. Agg draws without a display (cluster nodes have none).
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _percent(value) -> float:
    return float("nan") if value is None else 100.0 * value


# The image sets `plot_pr` can draw PR over: results.json's per-level subsets.
PR_IMAGE_SETS = {"clean_correct": "the images each run classifies correctly", "all": "all images"}


# The comparison plot's file, by what it draws (`drawn`): PR against eps, certified accuracy
# against the L2 radius, or both side by side; where it draws nothing, no plot is written and
# the name is the stem of the paired differences' file beside it.
PLOT_FILES = {
    ("pr",): "pr_vs_eps.png",
    ("certify",): "certified_accuracy.png",
    ("pr", "certify"): "pr_and_certified.png",
    (): "comparison.png",
}


def drawn(results_list) -> tuple:
    """What `plot_pr` draws of these results: ('pr',), ('certify',), both, or () for nothing."""
    has = lambda key: any(r.get("figures", {}).get(key) for r in results_list)
    return tuple(k for k in ("pr", "certify") if has(k))


def plot_file(results_list) -> str:
    """The file name of the plot of these results, for what it draws (`PLOT_FILES`)."""
    return PLOT_FILES[drawn(results_list)]


def plot_pr(names, results_list, over: str = "clean_correct"):
    """Figure: PR against eps with interval bands, one line per run, one panel per law; PR over
    `over` (PR_IMAGE_SETS): by default the Table-1 estimand, the mean over the images each run
    classifies correctly, as every table's headline. The titles, axes and legend name the images,
    the law and the protocol."""
    if over not in PR_IMAGE_SETS:
        raise ValueError(f"over must be one of {', '.join(PR_IMAGE_SETS)}, got {over!r}")
    plt = _pyplot()
    s = results_list[0]["settings"]
    drawn = [r.get("figures", {}).get("pr", {}) for r in results_list]
    dists = [d for d in s["pr"]["distributions"] if d in laws.of_eps() and any(pr.get(d) for pr in drawn)]
    certified = any("certify" in r.get("figures", {}) for r in results_list)
    panels = len(dists) + certified
    fig, axes = plt.subplots(1, panels, figsize=(5.5 * panels, 4.4), squeeze=False)
    if certified:
        _plot_certified(axes[0][-1], names, results_list, confidence_pct(s))
    for ax, d in zip(axes[0], dists):
        for name, r in zip(names, results_list):
            pr = r.get("figures", {}).get("pr", {}).get(d)
            if not pr:
                continue
            n = next(iter(pr.values()))[over]["n"]
            _line_with_band(ax, {e: figure[over] for e, figure in pr.items()}, f"{name} (over {n} images)")
        # A published protocol is named only at its law, radii and N.
        name = pr_lib.protocol_name(d, s["pr"].get("epsilons", ()), s["pr"]["samples"])
        protocol = f" ({name})" if name and over == "clean_correct" else ""
        ax.set_title(f"{d} noise{protocol}, N={s['pr']['samples']} per image", fontsize=10)
        ax.set_xlabel(laws.get(d).level)
        images = "clean-correct" if over == "clean_correct" else "all"
        ax.set_ylabel(f"PR % over {images} images\n({confidence_pct(s)} bootstrap interval)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    dataset = DISPLAY_NAMES.get(s.get("dataset"), s.get("dataset", ""))
    what = [f"PR over {PR_IMAGE_SETS[over]}"] if dists else []
    what += ["certified accuracy of the smoothed classifiers over all images"] if certified else []
    fig.suptitle(f"First {s['num_examples']} {dataset} test images;\n{'; '.join(what)}", fontsize=10)
    fig.tight_layout()
    return fig


def _line_with_band(ax, figures: dict, label: str) -> None:
    """One run's figures {level: {"value", "interval"}} against their levels, in percent, with the
    interval as a band in the line's colour."""
    levels = [float(level) for level in figures]
    (line,) = ax.plot(levels, [_percent(f["value"]) for f in figures.values()], marker="o", label=label)
    lows, highs = zip(*(f["interval"] for f in figures.values()))
    lows, highs = [_percent(v) for v in lows], [_percent(v) for v in highs]
    ax.fill_between(levels, lows, highs, alpha=0.25, color=line.get_color())


def _plot_certified(ax, names, results_list, confidence: str) -> None:
    """The smoothed classifiers' certified accuracy against the L2 radius (`evaluators.certify`),
    one line per run that was certified, with its Clopper-Pearson band: beside PR, the same images.
    Radii above the largest that n and alpha can certify are not drawn (0 whatever the model): a
    dashed line marks that radius."""
    settings = next(r["figures"]["certify"]["settings"] for r in results_list if r.get("figures", {}).get("certify"))
    top = certify_lib.largest_radius(settings["sigma"], settings["samples"], settings["alpha"])
    for name, r in zip(names, results_list):
        figure = r.get("figures", {}).get("certify")
        if figure:  # every model of a comparison certified alike
            _line_with_band(ax, {k: v for k, v in figure["certified_accuracy"].items() if float(k) <= top}, name)
    ax.axvline(top, color="grey", linestyle="--", linewidth=1, label=f"largest certifiable radius, {top:.3f}")
    ax.set_title(
        f"randomized smoothing, sigma={settings['sigma']}: n={settings['samples']}, alpha={settings['alpha']}",
        fontsize=10,
    )
    ax.set_xlabel("L2 radius")
    ax.set_ylabel(f"certified accuracy % over all images\n({confidence} Clopper-Pearson interval)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)


def plot_curves(report: dict):
    """Figure (None without curves): PR over clean-correct images against clean accuracy along
    training, one panel per eps, one line per run, B's final models as crosses."""
    curves = report.get("curves", {})
    if not curves:
        return None
    plt = _pyplot()
    eps_keys = list(next(iter(curves.values()))[0]["pr_clean_correct"])
    cols = 2 if len(eps_keys) > 1 else 1
    rows = -(-len(eps_keys) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6 * cols, 4.2 * rows), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    # One colour per method, one line style and marker per seed: runs of one method stay apart.
    methods = list(dict.fromkeys(name.rsplit("_s", 1)[0] for name in curves))
    seeds = list(dict.fromkeys(name.rsplit("_s", 1)[-1] for name in curves))
    styles = [("-", "o"), ("--", "s"), (":", "^"), ("-.", "D")]
    fig.suptitle(
        "PR against clean accuracy along training (points in training order; the step of each "
        "final model is written beside it)",
        fontsize=9,
    )
    for ax, e in zip(axes.ravel(), eps_keys):
        for name, points in curves.items():
            color = colors[methods.index(name.rsplit("_s", 1)[0]) % len(colors)]
            linestyle, marker = styles[seeds.index(name.rsplit("_s", 1)[-1]) % len(styles)]
            ax.plot(
                [100 * p["clean_accuracy"] for p in points],
                [_percent(p["pr_clean_correct"][e]) for p in points],
                linestyle=linestyle,
                marker=marker,
                ms=3,
                color=color,
                label=name,
            )
            ax.annotate(
                str(points[-1]["step"]),
                (100 * points[-1]["clean_accuracy"], _percent(points[-1]["pr_clean_correct"][e])),
                fontsize=6,
            )
        ax.set_xlabel("clean accuracy %")
        ax.set_ylabel(f"PR(·, {e}) % over clean-correct images")
        ax.grid(alpha=0.3)
    for ax in axes.ravel()[len(eps_keys) :]:
        ax.set_visible(False)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    return fig


def plot_sweep(sweep: dict):
    """Figure (None without results): PR(eps) over clean-correct images and PGD-20 against the
    sweep's axis, one line per series, the baselines as horizontal bands."""
    done = [e for e in sweep["points"] if e["status"] == "done"]
    if not done:
        return None
    plt = _pyplot()
    eps = sweep["epsilon"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    metrics = (
        (lambda f: f["pr_clean_correct"][eps], f"PR(·, {eps}) %, clean-correct images"),
        (lambda f: f["pgd20"], "PGD-20 robust accuracy %"),
    )
    for ax, (get, title) in zip(axes, metrics):
        series = list(dict.fromkeys(e["series"] for e in done))
        for i, name in enumerate(series):
            pts = sorted((e for e in done if e["series"] == name), key=lambda e: e["value"])
            x = [e["value"] for e in pts]
            y = [_percent(get(e["figures"])["value"]) for e in pts]
            err = [
                [y_ - _percent(get(e["figures"])["interval"][0]) for y_, e in zip(y, pts)],
                [_percent(get(e["figures"])["interval"][1]) - y_ for y_, e in zip(y, pts)],
            ]
            ax.errorbar(
                x,
                y,
                yerr=err,
                marker="o" if i == 0 else "s",
                capsize=3,
                color=colors[i % len(colors)],
                ls="-" if i == 0 else "none",
                label=name,
            )
        in_points = {e["run"] for e in sweep["points"]}
        for j, b in enumerate(e for e in sweep["baselines"] if e["status"] == "done" and e["run"] not in in_points):
            fb = get(b["figures"])
            color = colors[(len(series) + j) % len(colors)]
            ax.axhline(_percent(fb["value"]), color=color, ls="--", lw=1, label=b["label"])
            ax.axhspan(_percent(fb["interval"][0]), _percent(fb["interval"][1]), color=color, alpha=0.12)
        ax.set_xscale("log")
        ticks = sorted({e["value"] for e in done})
        ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
        ax.minorticks_off()
        ax.set_xlabel(sweep["axis"])
        ax.set_ylabel(f"{title} ({confidence_pct(sweep)} interval)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_suite(report: dict):
    """Figure (None without results): PR vs eps, one panel per group and PR convention; seed
    means with bands, seeds as thin lines."""
    groups = [(n, g) for n, g in report["groups"].items() if g.get("methods")]
    if not groups:
        return None
    plt = _pyplot()
    fig, axes = plt.subplots(len(groups), 2, figsize=(11, 4.2 * len(groups)), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for row, (gname, g) in zip(axes, groups):
        eps_keys = [robustness.level_key(e) for e in g["evaluation"]["pr"]["epsilons"]]
        eps = [float(e) for e in eps_keys]
        for ax, key, title in ((row[0], "pr_clean_correct", "clean-correct images"), (row[1], "pr_all", "all images")):
            for i, method in enumerate(g["methods"]):
                color = colors[i % len(colors)]
                mean = g["methods"][method]["mean"][key]
                ax.plot(
                    eps,
                    [_percent(mean[e]["value"]) for e in eps_keys],
                    marker="o",
                    color=color,
                    label=method_label(method, g),
                )
                ax.fill_between(
                    eps,
                    [_percent(mean[e]["interval"][0]) for e in eps_keys],
                    [_percent(mean[e]["interval"][1]) for e in eps_keys],
                    color=color,
                    alpha=0.2,
                )
                for entry in g["runs"]:
                    if entry["method"] == method and entry["status"] == "done":
                        ax.plot(
                            eps,
                            [_percent(entry["figures"][key][e]["value"]) for e in eps_keys],
                            color=color,
                            lw=0.8,
                            ls=":",
                            alpha=0.8,
                        )
            ev = g["evaluation"]
            ax.set_title(
                f"{gname}: PR over {title}\n({ev['pr']['distribution']}, N={ev['pr']['samples']}, "
                f"{ev['num_examples']} images; dotted: single seeds)",
                fontsize=9,
            )
            ax.set_xlabel("eps")
            ax.set_ylabel(f"PR % ({confidence_pct(ev)} bootstrap band)")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_sampler_diagnostic(result: dict):
    """Figure of the sampler diagnostic (patjax.diagnose): the energy and the distances along the chains."""
    plt = _pyplot()
    c = result["curves"]
    t = np.arange(len(c["energy"]))
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    left.plot(t, c["energy"], label="energy E_t")
    left.set_xlabel("Langevin step t")
    left.set_ylabel("mean energy per example")
    left.set_xscale("symlog", linthresh=1)
    right.plot(t, c["mean_abs_delta"], label="mean |x_t - x|")
    right.plot(t, c["distance_to_last"], label="mean |x_t - x_T|")
    right.plot(t, c["drift"], label="drift")
    right.axhline(
        result["endpoint_margin"] * result["endpoint_spread"],
        color="gray",
        ls=":",
        label=f"{result['endpoint_margin']} x between-chain spread at T",
    )
    if result["steps_to_endpoint"] is not None:
        right.axvline(result["steps_to_endpoint"], color="gray", ls="--", lw=0.8)
    right.set_xscale("symlog", linthresh=1)
    right.set_yscale("log")
    for ax in (left, right):
        ax.set_xlim(0, t[-1])
    right.set_xlabel("Langevin step t")
    right.legend(fontsize=7)
    s = result["settings"]
    fig.suptitle(
        f"init={s['init']}, eta={s['step_size']}, c1={s['c1']}, c2={s['c2']}, sigma={s['noise_scale']}, "
        f"{s['num_examples']} images x {s['chains']} chains, checkpoint step {s['checkpoint_step']}",
        fontsize=9,
    )
    fig.tight_layout()
    return fig


def save_figure(fig, path: str, dpi: int = 120) -> None:
    """Saves a matplotlib figure as PNG atomically and closes it."""
    import matplotlib.pyplot as plt  # only once a figure exists (see _pyplot)

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    files.atomic(path, lambda tmp: fig.savefig(tmp, dpi=dpi, format="png"), suffix=".tmp.png")
    plt.close(fig)
