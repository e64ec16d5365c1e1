"""results.md of a suite: Tables 1 and 2 in the paper's layout, PR over all images, the paired
differences, the sweeps, PR at matched clean accuracy and the learning curves, every run and its
training and evaluation times, laid out from the dict `patjax.suites.aggregate.build` returns.

Nothing here reads a workdir or computes a figure; the cells come from `patjax.reporting.report`.
"""

from __future__ import annotations

from patjax import evaluators
from patjax.methods import DISPLAY_NAMES, ordered
from patjax.pat import robustness
from patjax.reporting.report import confidence_pct, md_table, method_label, pct, signed
from patjax.suites.learning_curves import CURVE_ATTACK

TABLE1_METHODS = ("clean", "fgsm", "pgd", "alp", "clp", "trades", "mart", "atpr", "pat")
TABLE2_PAIRS = (("fgsm", "fgsm_cor"), ("pgd", "pgd_cor"), ("pat_wos", "pat"))  # (baseline, variant)


# What "train min" is (train.logged_training), said below the first table that shows it.
TRAIN_MIN_NOTE = (
    "Train min: time in training steps from the run's metrics.jsonl (each logging window's steps over its "
    "images per second), summed over every sitting of a run stopped and resumed; each sitting's "
    "compilation counts, restoring and the per-epoch test-accuracy check do not. Runs that shared cores "
    "with other jobs ran slower than alone. In the Runs table a pending run shows the last step its log "
    "reached and its training time so far."
)


def _figure_row(label, figs, eps_keys, pr_key):
    return (
        [label, pct(figs.get("clean_accuracy"))]
        + [pct(figs.get(a)) for a in evaluators.TABLE_ATTACKS]
        + [pct(figs[pr_key].get(e)) for e in eps_keys]
    )


def markdown(report: dict) -> str:
    """results.md: Tables 1 and 2 in the paper's layout, PR over all images, the paired
    differences, every run, and the runs' status and wall times."""
    out = [
        f"# Suite `{report['suite']}`: {report['description']}",
        "",
        f"{report['num_done']} of {report['num_runs']} runs trained and evaluated.",
    ]
    if report["scaled_down"]:
        out += ["", "Scaled down from the paper (Appendix E):", ""] + [f"- {line}" for line in report["scaled_down"]]
    for gname, g in report["groups"].items():
        out += ["", f"## {gname}", ""]
        if "evaluation" in g:
            out += _group_tables(g)
        else:
            out += ["No run evaluated yet.", ""]
        out += [
            "### Runs",
            "",
            md_table(
                ["Run", "status", "steps", "train min", "eval min"],
                [
                    [
                        e["name"],
                        e["status"],
                        e.get("step", ""),
                        f"{e['train_s'] / 60:.1f}" if e.get("train_s") is not None else "",
                        f"{e['eval_wall_s'] / 60:.1f}" if e.get("eval_wall_s") is not None else "",
                    ]
                    for e in g["runs"]
                ],
            ),
            "",
        ]
        if gname == next(iter(report["groups"])):  # once, below the first table that shows it
            out += [TRAIN_MIN_NOTE, ""]
    for sweep in report.get("sweeps", ()):
        out += _sweep_tables(sweep)
    if report.get("matched"):
        out += _matched_tables(report)
    if report.get("invocations"):
        total = sum(i["wall_s"] for i in report["invocations"])
        out += [
            f"Time of the suite's invocations so far: {total / 60:.1f} min summed over "
            f"{len(report['invocations'])} invocation(s) (workers that ran at once each count).",
            "",
        ]
    return "\n".join(out)


def _law_rows(g, law: str, key: str, eps_keys) -> list:
    """One row per method: its mean PR under `law` over `key`'s images ("pr_clean_correct" or
    "pr_all"), "-" where the method has none under that law; results written before figures were
    kept per law have the headline law's at the top of "mean" only."""
    headline = g["evaluation"]["pr"]["distribution"]
    rows = []
    for m in g["methods"]:
        mean = g["methods"][m]["mean"]
        figs = mean["laws"].get(law) if "laws" in mean else (mean if law == headline else None)
        rows.append([method_label(m, g)] + [pct((figs or {}).get(key, {}).get(e)) for e in eps_keys])
    return rows


def _group_tables(g) -> list:
    ev = g["evaluation"]
    eps_keys = [robustness.level_key(e) for e in ev["pr"]["epsilons"]]
    pr_cols = [f"PR(·, {e}) %" for e in eps_keys]
    head = ["Method", "Acc. %"] + [f"{evaluators.REGISTRY[a].label} %" for a in evaluators.TABLE_ATTACKS] + pr_cols
    protocol = evaluators.pr.protocol_name(ev["pr"]["distribution"], ev["pr"].get("epsilons", ()), ev["pr"]["samples"])
    out = [
        f"{ev['num_examples']} test images of {ev['dataset']}; PGD-20 / CW-20 at eps "
        f"{ev['attack']['eps']:.4f} (8/255), alpha {ev['attack']['step_size']:.4f}, CW kappa {ev['cw']['kappa']}; "
        f"PR: {ev['pr']['distribution']} noise first"
        f"{f' ({protocol})' if protocol else ''}, N = {ev['pr']['samples']} per "
        f"image, evaluation seed {ev['seed']} for every run (common random numbers). Cells: value "
        f"[{confidence_pct(ev)} interval]: in the mean-over-seeds tables a percentile bootstrap over images, which "
        f"collapses to a point at 0 % or 100 %, as do the Every-run table's PR intervals (its accuracy "
        f"intervals are Clopper-Pearson).",
        "",
    ]
    t1 = [m for m in g["methods"] if m in TABLE1_METHODS or m not in sum(TABLE2_PAIRS, ())]
    if t1:
        out += [
            "### Table 1 layout (mean over seeds; PR over clean-correct images, the paper's convention)",
            "",
            md_table(
                head,
                [
                    _figure_row(method_label(m, g), g["methods"][m]["mean"], eps_keys, "pr_clean_correct")
                    for m in ordered(t1)
                ],
            ),
            "",
        ]
    pairs = [p for p in TABLE2_PAIRS if p[0] in g["methods"] or p[1] in g["methods"]]
    if pairs:
        rows = [
            _figure_row(method_label(m, g), g["methods"][m]["mean"], eps_keys, "pr_clean_correct")
            for pair in pairs
            for m in pair
            if m in g["methods"]
        ]
        out += [
            "### Table 2 layout (ablation; mean over seeds; PR over clean-correct images)",
            "",
            md_table(head, rows),
            "",
        ]
    laws = list(next(iter(g["methods"].values()))["mean"].get("laws", {})) or [ev["pr"]["distribution"]]
    for law in laws[1:]:
        out += [
            f"### PR under {law} noise over clean-correct images (mean over seeds)",
            "",
            md_table(["Method"] + pr_cols, _law_rows(g, law, "pr_clean_correct", eps_keys)),
            "",
        ]
    for law in laws:
        out += [
            f"### PR under {law} noise over all test images (a misclassified image counts with its own PR, "
            "the share of its noisy draws classified correctly; not set to 0)",
            "",
            md_table(["Method"] + pr_cols, _law_rows(g, law, "pr_all", eps_keys)),
            "",
        ]
    if g["differences"]:
        dhead = (
            ["A − B", "seeds", "ΔAcc pp"]
            + [f"Δ{evaluators.REGISTRY[a].label} pp" for a in evaluators.TABLE_ATTACKS]
            + [f"ΔPR({e}) pp" for e in eps_keys]
        )
        estimands = (
            ("pr_clean_correct", "each run over its own clean-correct images: the difference of the Table-1 figures"),
            ("pr_common_correct", "the images both runs classify correctly, paired image by image"),
            ("pr_all", "all test images"),
        )
        for law in laws:
            for key, title in estimands:
                rows = []
                for d in g["differences"]:
                    name = f"{DISPLAY_NAMES.get(d['a'], d['a'])} − {DISPLAY_NAMES.get(d['b'], d['b'])}"
                    for label, fig in [("mean", d["mean"])] + [(f"seed {k}", v) for k, v in d["per_seed"].items()]:
                        pr = fig.get("laws", {law: fig}).get(law, {})
                        if key not in pr:
                            continue
                        rows.append(
                            [name if label == "mean" else "", label, signed(fig.get("clean_accuracy"))]
                            + [signed(fig.get(a)) for a in evaluators.TABLE_ATTACKS]
                            + [signed(pr[key].get(e)) for e in eps_keys]
                        )
                if rows:
                    out += [
                        f"### Paired differences A − B ({law} noise; percentage points; PR over {title})",
                        "",
                        md_table(dhead, rows),
                        "",
                    ]
        out += [
            f"Paired: run A and run B of a seed are evaluated on the same images with the same noise "
            f"draws; the interval is a percentile bootstrap over images ({ev['bootstrap_resamples']} "
            f"resamples, the same resamples for every seed). It covers evaluation sampling only, not "
            f"training-seed variance: compare the seed rows for that.",
            "",
        ]
    out += [
        "### Every run (PR over clean-correct images)",
        "",
        md_table(
            ["Run"] + head[1:],
            [
                _figure_row(e["name"], e["figures"], eps_keys, "pr_clean_correct")
                for e in g["runs"]
                if e["status"] == "done"
            ],
        ),
        "",
        "Per-run intervals: Clopper-Pearson for accuracies, bootstrap over images for PR.",
        "",
    ]
    return out


def _matched_tables(report) -> list:
    """PR at matched clean accuracy (learning_curves.matched_figures) and the learning curves."""
    out = ["## PR at matched clean accuracy", ""]
    for m in report["matched"]:
        if "mean" not in m:
            out += [f"{m['a']} − {m['b']}: no pair of finished runs yet.", ""]
            continue
        eps_keys = list(m["mean"]["pr_clean_correct"])
        rows = []
        for label, fig in [("mean", m["mean"])] + [(f"seed {k}", v) for k, v in m["per_seed"].items()]:
            ranges = fig["accuracy_range_a"]
            rows.append(
                [
                    label,
                    f"{100 * fig['matched_accuracy']:.1f}",
                    "; ".join(f"{100 * lo:.1f}–{100 * hi:.1f}" for lo, hi in ranges),
                    f"{100 * fig['resamples_matched']:.0f}",
                ]
                + [signed(fig["pr_clean_correct"][e]) for e in eps_keys]
            )
        out += [
            f"### {m['a']} − {m['b']} ({m['law']} noise)",
            "",
            md_table(
                ["seeds", "B's clean acc. %", "A's curve spans acc. %", "resamples matched %"]
                + [f"ΔPR({e}) pp" for e in eps_keys],
                rows,
            ),
            "",
        ]
    for m in report["matched"]:
        if "nearest" not in m:
            continue
        eps_keys = list(m["nearest"]["mean"]["pr"])
        rows = []
        for label, fig in [("mean", m["nearest"]["mean"])] + [
            (f"seed {k}", v) for k, v in m["nearest"]["per_seed"].items()
        ]:
            for estimand in ("clean_correct", "both_correct", "all"):
                rows.append(
                    [
                        label if estimand == "clean_correct" else "",
                        ", ".join(map(str, fig["steps_a"])),
                        f"{100 * fig['clean_accuracy_a']:.1f} vs {100 * fig['clean_accuracy_b']:.1f}",
                        signed(fig["clean_accuracy_difference"]),
                        estimand.replace("_", "-"),
                    ]
                    + [signed(fig["pr"][e][estimand]) for e in eps_keys]
                )
        out += [
            f"### {m['a']} − {m['b']} at the nearest clean accuracy ({m['law']} noise)",
            "",
            md_table(
                ["seeds", "A's step", "acc. A vs B %", "ΔAcc pp", "PR over"] + [f"ΔPR({e}) pp" for e in eps_keys], rows
            ),
            "",
            "A's learning-curve point whose clean accuracy is nearest to that of B's final model, against that "
            "model: no interpolation. PR over: each model's own clean-correct images (Table 1's estimand), the "
            "images both classify correctly, all images; paired percentile bootstrap over images.",
            "",
        ]
    out += [
        "A's PR over its own clean-correct images, interpolated linearly in clean accuracy between the points "
        "of its learning curve (its kept models, evaluated on the suite's images and noise), at the clean "
        "accuracy of B's final model of the same seed, minus B's PR: the Table-1 estimand with clean accuracy "
        "held equal. The interval is a paired percentile bootstrap over images that recomputes every "
        "accuracy and PR and the interpolation in each resample; resamples in which B's accuracy falls "
        "outside A's curve are dropped (their share is shown).",
        "",
    ]
    curves = report.get("curves", {})
    if curves:
        eps_keys = list(next(iter(curves.values()))[0]["pr_clean_correct"])
        percent = lambda v: "-" if v is None else f"{100 * v:.1f}"
        attacked = any(p.get(CURVE_ATTACK) is not None for points in curves.values() for p in points)
        rows = [
            [name, p["step"], percent(p["clean_accuracy"])]
            + ([percent(p.get(CURVE_ATTACK))] if attacked else [])
            + [percent(p["pr_clean_correct"][e]) for e in eps_keys]
            for name, points in curves.items()
            for p in points
        ]
        out += [
            f"### Learning curves (clean accuracy{', PGD-20' if attacked else ''} and PR over clean-correct images)",
            "",
            md_table(
                ["run", "step", "Acc. %"] + (["PGD-20 %"] if attacked else []) + [f"PR(·, {e}) %" for e in eps_keys],
                rows,
            ),
            "",
        ]
    return out


def _sweep_tables(sweep) -> list:
    eps = sweep["epsilon"]
    base = [b["label"] for b in sweep["baselines"]]
    head = [sweep["axis"], "run", "train min", "Acc. %", "PGD-20 %", f"PR(·, {eps}) %"]
    head += [f"{what} − {b} pp" for b in base for what in (f"ΔPR({eps})", "ΔPGD-20")]
    rows = []
    in_points = {e["run"] for e in sweep["points"]}
    for e in sweep["points"] + [b for b in sweep["baselines"] if b["run"] not in in_points]:
        figs = e.get("figures", {})
        diffs = e.get("differences", {})
        rows.append(
            [
                e["label"],
                e["run"] if e["status"] == "done" else f"{e['run']} (pending)",
                f"{e['train_s'] / 60:.1f}" if e.get("train_s") is not None else "",
                pct(figs.get("clean_accuracy")),
                pct(figs.get("pgd20")),
                pct(figs.get("pr_clean_correct", {}).get(eps)),
            ]
            + [
                cell
                for b in base
                for cell in (
                    signed(diffs.get(b, {}).get("pr_common_correct", {}).get(eps)),
                    signed(diffs.get(b, {}).get("pgd20")),
                )
            ]
        )
    return [
        f"## Sweep: {sweep['axis']}",
        "",
        "One seed per point. PR over the run's clean-correct images; ΔPR over the images both runs "
        "classify correctly; Δ: paired (same images, same noise draws), percentile bootstrap over images. "
        "Baselines that are not points are the last rows.",
        "",
        md_table(head, rows),
        "",
    ]
