"""Tables from evaluations' results dicts (eval/results.json: several runs side by side, paired
differences) and the cells every table shares (a figure with its interval, a signed difference,
a markdown table, a method's label); a suite's results.md is `patjax.suites.results_md`, the figures
drawn from the same dicts `patjax.reporting.plots`.

Nothing here reads a workdir or computes a figure: every value and interval shown was computed
by `patjax.run.evaluation`, `patjax.suites.aggregate` or `patjax.suites.learning_curves`; this module only lays
them out, in the paper's order and names.
"""

from __future__ import annotations

import re

from patjax import evaluators
from patjax.data import download
from patjax.evaluators.common import NORM_SYMBOLS, headline_first, radius, threat_model
from patjax.methods import DISPLAY_NAMES


def level_label(key: str) -> str:
    """A level of results.json (`robustness.level_key`) as a column names it: a radius as it is
    published (`radius`: 8/255, 0.1), a level that is not a number (a law's own) as it is."""
    try:
        return radius(float(key))
    except ValueError:
        return key


def pct(fig, digits=1) -> str:
    """'value [low, high]' in percent; '-' for a missing figure."""
    if not fig or fig.get("value") is None:
        return "-"
    lo, hi = fig["interval"]
    return f"{100 * fig['value']:.{digits}f} [{100 * lo:.{digits}f}, {100 * hi:.{digits}f}]"


def signed(fig, digits=2, scale=100) -> str:
    """The same with signs, for differences: in percentage points (scale 100), or as they are (1)."""
    if not fig or fig.get("value") is None:
        return "-"
    lo, hi = fig["interval"]
    return f"{scale * fig['value']:+.{digits}f} [{scale * lo:+.{digits}f}, {scale * hi:+.{digits}f}]"


VACUOUS = "≤ 0 (vacuous)"


def bound_cell(fig, digits=1) -> str:
    """A lower bound on a probability: `pct`, or VACUOUS where its value is at most 0, since a
    probability is at least 0 anyway (results.json keeps the value)."""
    if fig and fig.get("value") is not None and fig["value"] <= 0:
        return VACUOUS
    return pct(fig, digits)


def text_table(header, rows) -> str:
    widths = [max(len(str(r[i])) for r in [header] + rows) for i in range(len(header))]
    line = lambda cells: "  ".join(str(c).rjust(w) for c, w in zip(cells, widths))
    return "\n".join([line(header)] + [line(r) for r in rows])


def md_table(header, rows) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def norm_radii_line(norm_flag: str, norm: str, filled: dict) -> str:
    """The line a command prints where a norm given without its radius or step took the norm's
    standard ones (`l2.with_norm_radii`): `filled` is {the flag that would set it: value}."""
    given = ", ".join(f"{flag}={radius(value, norm)}" for flag, value in filled.items())
    return f"{norm_flag}={norm}: {given}, the standard {NORM_SYMBOLS.get(norm, norm)} radius and step on CIFAR-10"


def pr_law(settings) -> str:
    """'uniform law at ε = 0.1, 0.12, 0.15, 0.2 (the Table-1 protocol), N = 100 per image': the
    headline PR's law, radii and samples of a results.json settings record."""
    return evaluators.pr.law_words(settings)


def confidence_pct(settings) -> str:
    return f"{100 * float(settings.get('confidence', 0.95)):g} %"  # 0.95 -> "95 %", 0.9 -> "90 %"


# ---------------------------------------------------------------------------------------
# Evaluated runs side by side (python -m patjax.evaluate with several workdirs).


def images_sentence(names, results_list) -> str:
    """Which images every figure of `comparison` is over, in words."""
    s = results_list[0]["settings"]
    n = s["num_examples"]
    dataset = download.DISPLAY_NAMES.get(s.get("dataset"), s.get("dataset", ""))
    attacked = any(a in r.get("figures", {}) for r in results_list for a in evaluators.WORST_CASE)
    measured = "accuracies and attacks" if attacked else "accuracies"
    text = f"Images: the first {n} {dataset} test images; {measured} over all {n} of them"
    if any("pr" in r.get("figures", {}) for r in results_list):
        counts = ", ".join(f"{name} {r['settings'].get('num_clean_correct')}" for name, r in zip(names, results_list))
        text += f"; PR(eps) over the images each run classifies correctly ({counts}) unless a table says all images"
    return text + "."


def evaluation_list(directory: str, kept) -> str:
    """The evaluations a folder keeps ((name, folder, results.json) each, `eval_files.evaluations`),
    one row each with what tells them apart: evaluators, images, what the evaluators that ran
    measured (`evaluators.labels`: the attacks' threat model, the headline PR's law, radii and N,
    CERTIFY's sigma and n), the model's step, the seed."""
    if not kept:
        return f"{directory}: no evaluation"
    rows = []
    for name, folder, results in kept:
        s = results.get("settings") if isinstance(results.get("settings"), dict) else {}
        measured = "; ".join(evaluators.labels(s)[1]) or "-"
        rows.append(
            [
                name,
                folder,
                ",".join(s.get("evaluators", ())) or "?",
                s.get("num_examples", "?"),
                measured,
                s.get("step", "?"),
                s.get("seed", "?"),
            ]
        )
    header = ["evaluation", "folder", "evaluators", "images", "measured", "step", "seed"]
    return f"{directory}: {len(kept)} evaluation{'s' if len(kept) > 1 else ''}\n" + md_table(header, rows)


def comparison(names, results_list) -> str:
    """The paper's Table 1 columns (Acc, PGD, CW, PR(eps)...) with intervals, one row per run and
    PR under the headline protocol; then PR under every other law evaluated (over the same
    clean-correct images) and over all images; then APGD, the worst case (with the attacks it is
    the worst of) and the Theorem 2 bound. The first line says which images each figure is over."""
    first = results_list[0]
    s = first["settings"]
    dist = s["pr"]["distribution"]
    laws = headline_first(dist, s["pr"].get("distributions", ()))
    tables = [images_sentence(names, results_list)]
    pr_of = lambda r, d: r.get("figures", {}).get("pr", {}).get(d, {})
    eps_keys = list(pr_of(first, dist))
    # An attack no run was evaluated with gets no column: a column of dashes reads as a failure.
    evaluated = [
        a
        for a in evaluators.TABLE_ATTACKS + evaluators.OTHER_ATTACKS
        if any(a in r.get("figures", {}) for r in results_list)
    ]
    table_attacks = [a for a in evaluators.TABLE_ATTACKS if a in evaluated]
    other_attacks = [a for a in evaluators.OTHER_ATTACKS if a in evaluated]
    threat = threat_model(s)
    if evaluated and threat:
        norm, eps = s["attack"]["norm"], float(s["attack"]["eps"])
        decimal = f" = {eps:.4f}" if radius(eps, norm) != f"{eps:g}" else ""
        tables.append(
            f"Attacks: {threat}{decimal}; PGD and CW {s['attack']['steps']} steps of "
            f"{radius(s['attack']['step_size'], norm)}, APGD and AutoAttack their own."
        )
    if eps_keys:
        tables.append(f"PR: {pr_law(s)}.")
    tables.append("")

    # Every attack's column names its threat model: a figure under L2 is never read as an L-inf one,
    # and an attack run at its own radius (its figure's settings) is headed with that radius.
    def attack_header(a):
        own = next((r["figures"][a].get("settings", {}) for r in results_list if a in r.get("figures", {})), {})
        attacked = (
            threat_model({**s, "attack": {**s["attack"], "eps": own["eps"]}}) if threat and "eps" in own else threat
        )
        return f"{evaluators.REGISTRY[a].label} ({attacked}) %" if attacked else f"{evaluators.REGISTRY[a].label} %"

    rows = []
    for name, r in zip(names, results_list):
        f = r.get("figures", {})
        rows.append(
            [name, pct(f.get("clean_accuracy"), 2)]
            + [pct(f.get(a), 2) for a in table_attacks]
            + [pct(pr_of(r, dist).get(e, {}).get("clean_correct"), 2) for e in eps_keys]
        )
    if table_attacks or eps_keys or any("clean_accuracy" in r.get("figures", {}) for r in results_list):
        header = ["run", "Acc %"] + [attack_header(a) for a in table_attacks]
        header += [f"PR({level_label(e)}) %" for e in eps_keys]
        tables.append(text_table(header, rows))
    tables += [f"PR: {first.get('pr_protocol', dist)}", ""] if eps_keys else [""]
    for d in laws:
        levels = list(pr_of(first, d))
        if not levels:
            continue
        subsets = (
            (("clean_correct", "clean-correct images"), ("all", "all images"))
            if d != dist
            else (("all", "all images"),)
        )
        for subset, words in subsets:
            rows = [
                [name] + [pct(pr_of(r, d).get(e, {}).get(subset), 2) for e in levels]
                for name, r in zip(names, results_list)
            ]
            tables += [text_table([f"{d}, {words}"] + [f"PR({level_label(e)}) %" for e in levels], rows), ""]
    tables += extra_table(names, results_list, other_attacks, eps_keys, attack_header)
    tables += certified_table(names, results_list)
    tables += rare_pr_table(names, results_list)
    tables += other_figures(names, results_list)
    for name, r in zip(names, results_list):  # AutoAttack: each attack's share, the masking checks
        aa = r.get("figures", {}).get("aa")
        if aa:
            after = ", ".join(f"{k} {pct(v, 2)}" for k, v in aa["after"].items())
            signs = "; ".join(aa["masking"]["masking_signs"]) or "none"
            tables.append(
                f"{name}: AutoAttack on {aa['n']} images [{confidence_pct(s)} Clopper-Pearson intervals]: clean % "
                f"{pct(aa.get('clean_accuracy'), 2)}, robust % after {after}; signs of gradient masking: {signs}"
            )
    return re.sub(r"\n{3,}", "\n\n", "\n".join(tables))  # one blank line between tables, whichever were printed


def extra_table(names, results_list, other_attacks, eps_keys, attack_header) -> list:
    """Lines of the table beside the headline one: the other attacks, the worst case with the
    attacks it is the worst of, the Theorem 2 bound at each radius; none where nothing of it
    was evaluated, and a note that explains only the columns there are."""
    s = results_list[0]["settings"]
    worst = any("worst_case" in r.get("figures", {}) for r in results_list)
    if not (other_attacks or worst or eps_keys):
        return []
    dist = s["pr"]["distribution"]
    rows = []
    for name, r in zip(names, results_list):
        f = r.get("figures", {})
        w = f.get("worst_case")
        rows.append(
            [name]
            + [pct(f.get(a), 2) for a in other_attacks]
            + (
                [pct(w, 2), ", ".join(evaluators.REGISTRY[a].label for a in (w or {}).get("attacks", ())) or "-"]
                if worst
                else []
            )
            + [bound_cell(f.get("pr", {}).get(dist, {}).get(e, {}).get("lower_bound"), 2) for e in eps_keys]
        )
    header = ["run"] + [attack_header(a) for a in other_attacks] + (["worst %", "worst of"] if worst else [])
    said = [f"[{confidence_pct(s)} intervals]: Clopper-Pearson for accuracies"]
    if eps_keys:
        said = [f"N={s['pr']['samples']}, seed {s['seed']}; {said[0]}, bootstrap over images for PR"]
    if worst:
        said.append("worst = robust to every attack of its row's 'worst of'")
    if eps_keys:
        said.append(
            f"LB = Theorem 2 lower bound 1 - E[f]/log 2 over all images, {dist} noise, '{VACUOUS}' where it is "
            "at most 0 and says nothing (results.json keeps its value)"
        )
    return [text_table(header + [f"LB({level_label(e)}) %" for e in eps_keys], rows), f"({'; '.join(said)})"]


def evaluation_tables(results: dict, name: str = "model") -> str:
    """The tables `python -m patjax.evaluate` prints for one model, from the dict `patjax.api.evaluate`
    returns (or a results.json): the same layout, the model's row labelled `name`."""
    return comparison([name], [results])


# The figures `comparison` lays out in its own tables (PR, AutoAttack and CERTIFY by their own layout).
LAID_OUT = ("clean_accuracy", "worst_case", "pr", "aa", "certify", "rare_pr")


def certified_table(names, results_list) -> list:
    """Lines of the smoothed classifiers' certified accuracy at each radius (the radii of the
    first run that has it), PREDICT's accuracy and CERTIFY's abstentions, one row per run. A
    radius above the largest that n and alpha can certify (`certify.largest_radius`) is marked,
    not shown as a 0.00 that would read as the model's."""
    found = [r["figures"]["certify"] for r in results_list if "certify" in r.get("figures", {})]
    if not found:
        return []
    radii, own = list(found[0]["certified_accuracy"]), found[0]["settings"]
    top = evaluators.certify.largest_radius(own["sigma"], own["samples"], own["alpha"])
    beyond = [k for k in radii if float(k) > top]
    rows = []
    for name, r in zip(names, results_list):
        c = r.get("figures", {}).get("certify", {})
        rows.append(
            [name]
            + [BEYOND if k in beyond else pct(c.get("certified_accuracy", {}).get(k), 2) for k in radii]
            + [pct(c.get("smoothed_accuracy"), 2), pct(c.get("abstained"), 2)]
        )
    header = ["run"] + [f"cert({k}) %" for k in radii] + ["PREDICT %", "abstain %"]
    note = (
        f"(randomized smoothing, Cohen et al.: certified accuracy at L2 radius r over all images, "
        f"sigma = {own['sigma']:g}, n0 = {own['selection_samples']}, n = {own['samples']}, alpha = {own['alpha']:g}, "
        f"so that no radius above {top:.3f} can be certified"
        + (f" ('{BEYOND}' at {', '.join(beyond)}: more samples n certify further)" if beyond else "")
        + "; Clopper-Pearson intervals over images)"
    )
    return ["", text_table(header, rows), note]


BEYOND = "beyond n"  # a radius above the largest one CERTIFY's n and alpha can certify


def log10_cell(fig) -> str:
    """A median log10 p with its interval; an end below the run's depth reads '< -depth'."""
    if not fig or not fig.get("n"):
        return "-"
    below = f"<-{fig['below'][3:]}" if fig.get("below", "").startswith("1e-") else "-inf"
    show = lambda v: below if v is None else f"{v:.1f}"
    lo, hi = fig["interval"]
    return f"{show(fig['value'])} [{show(lo)}, {show(hi)}]"


def rare_pr_table(names, results_list) -> list:
    """Lines of log10 P(violation) by AMLS (`rare_pr`) at each radius of the first run that has it:
    the median over clean-correct images and the fraction below 1e-k for its largest k."""
    found = [r["figures"]["rare_pr"] for r in results_list if "rare_pr" in r.get("figures", {})]
    if not found:
        return []
    radii, own = list(found[0]["by_radius"]), found[0]["settings"]
    deepest = f"1e-{max(own['decades']):g}"
    rows = []
    for name, r in zip(names, results_list):
        by = r.get("figures", {}).get("rare_pr", {}).get("by_radius", {})
        rows.append(
            [name]
            + [log10_cell(by.get(k, {}).get("median_log10_p")) for k in radii]
            + [pct(by.get(k, {}).get("below", {}).get(deepest), 1) for k in radii]
        )
    header = ["run"] + [f"log10 p({level_label(k)})" for k in radii]
    header += [f"p<{deepest}({level_label(k)}) %" for k in radii]
    note = (
        f"(AMLS, Webb et al. 2019: log10 P(violation) under the {own['distribution']} law, median over "
        f"clean-correct images with a bootstrap interval; rho = {own['rho']:g}, {own['particles']} particles, "
        f"{own['mh_steps']} MH steps a level, {own['repetitions']} run(s) an image; '<-{own['depth']:g}': below "
        f"the depth, not estimated)"
    )
    return ["", text_table(header, rows), note]


def plain(fig) -> str:
    """'value [low, high]' as the numbers are (a figure that need not be a proportion)."""
    if not fig or fig.get("value") is None:
        return "-"
    lo, hi = fig["interval"]
    return f"{fig['value']:.4g} [{lo:.4g}, {hi:.4g}]"


def other_figures(names, results_list) -> list:
    """Lines for the figures no table of `comparison` lays out (an evaluator's that the layout
    does not know): one row per run, the value and interval as they are, or where results.json
    holds a figure that is not one value with its interval."""
    known = set(LAID_OUT) | set(evaluators.WORST_CASE)
    other = []
    for r in results_list:
        other += [k for k in r.get("figures", {}) if k not in known and k not in other]
    cells = [k for k in other if all(_is_cell(r.get("figures", {}).get(k)) for r in results_list)]
    lines = []
    if cells:
        rows = [[name] + [plain(r.get("figures", {}).get(k)) for k in cells] for name, r in zip(names, results_list)]
        lines += ["", text_table(["run"] + cells, rows)]
    return lines + [f"{k}: see figures.{k} in results.json" for k in other if k not in cells]


def _is_cell(fig) -> bool:
    return fig is None or (isinstance(fig, dict) and "value" in fig and "interval" in fig)


ESTIMAND_WORDS = {
    "clean_correct": "each run over its own clean-correct images (Table 1)",
    "both_correct": "images both runs classify correctly",
    "all": "all images",
}


def differences(diffs, settings) -> str:
    """Paired PR differences of `comparison.paired_differences` under the headline law of
    `settings` (the baseline's results.json record), one table per estimand, under a line naming
    the law, its radii and N, where PR was evaluated; then the certified accuracy's, where CERTIFY was."""
    if not diffs:
        return ""
    dist = settings["pr"]["distribution"]
    eps_keys = next((list(row["distributions"][dist]) for row in diffs if row["distributions"].get(dist)), [])
    out = [f"Paired PR differences: {pr_law(settings)}."] if eps_keys else []
    for estimand, words in ESTIMAND_WORDS.items() if eps_keys else ():
        header = [f"run - {diffs[0]['baseline']}"] + [f"dPR({level_label(e)}) pp" for e in eps_keys]
        rows = [
            [row["run"]] + [signed(row["distributions"].get(dist, {}).get(e, {}).get(estimand)) for e in eps_keys]
            for row in diffs
        ]
        out += [f"{dist} noise, {words}:", text_table(header, rows), ""]
    out += certified_difference_lines(diffs)
    out += rare_pr_difference_lines(diffs, settings)
    if not out:
        return ""
    return "\n".join(out) + "(paired: same images and perturbations; percentile bootstrap over images)"


def certified_difference_lines(diffs) -> list:
    """Lines of the paired certified-accuracy differences of `comparison.paired_differences` at
    each radius, for the runs certified as the first was; none if no run was."""
    certified = [row for row in diffs if row.get("certified_accuracy")]
    if not certified:
        return []
    radii = list(certified[0]["certified_accuracy"])
    header = [f"run - {diffs[0]['baseline']}"] + [f"dcert({r}) pp" for r in radii]
    rows = [[row["run"]] + [signed(row["certified_accuracy"].get(r)) for r in radii] for row in certified]
    return ["certified accuracy (randomized smoothing), all images:", text_table(header, rows), ""]


def rare_pr_difference_lines(diffs, settings) -> list:
    """Lines of the paired log10 P(violation) differences of `comparison.paired_differences` at
    each radius: the median over the images both runs have an estimate on, and how many images
    only a sign is known of (one run below the depth), both are below, or either has no value."""
    rows_in = [row for row in diffs if row.get("rare_pr")]
    if not rows_in:
        return []
    depth = f"1e-{float(settings['rare_pr']['depth']):g}"
    base = diffs[0]["baseline"]
    header = [f"run - {base}", "radius", "median dlog10 p", "n", "run lower", "run higher"]
    header += [f"both < {depth}", "no value"]
    counts = ("n", "a_lower", "b_lower", "both_below", "no_value")
    rows = [
        [row["run"], level_label(at), signed(fig, scale=1), *(fig[c] for c in counts)]
        for row in rows_in
        for at, fig in row["rare_pr"].items()
    ]
    return [
        f"log10 P(violation) by AMLS ({settings['rare_pr']['distribution']} law), images both classify correctly; "
        f"median over those both have an estimate on; run lower / higher: one below {depth}, the other above it:",
        text_table(header, rows),
        "",
    ]


# ---------------------------------------------------------------------------------------
# Labels shared by a suite's markdown and its figures.


def method_label(method, g):
    seeds = g["methods"][method]["seeds"]
    return f"{DISPLAY_NAMES.get(method, method)} ({len(seeds)} seed{'s' if len(seeds) > 1 else ''})"
