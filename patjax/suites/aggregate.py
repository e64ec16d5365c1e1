"""A suite's figures: per-run figures as evaluated, means over seeds and paired differences
between methods, all on common random numbers (`stats`), as one results dict.

Intervals (95 % by default, `eval.confidence`):
- one run: its eval/results.json figures (Clopper-Pearson for accuracies; percentile
  bootstrap over test images for PR);
- the mean over seeds and every difference between two methods: percentile bootstrap over
  test images, resampling the same images for every run (paired). These intervals cover the
  evaluation's sampling error (which images, which noise draws) for the trained models at
  hand; they do not cover seed-to-seed training variance, which the per-seed rows show.
"""

from __future__ import annotations

import os
from typing import Sequence

import numpy as np

from patjax import methods
from patjax.evaluators import stats
from patjax.pat import robustness
from patjax.suites import Suite, Sweep, plan
from patjax.suites.learning_curves import matched_figures
from patjax.suites.run_outcomes import ATTACKS, RunOutcome, figure, logged_progress, pairing, run_dir

# Paired differences reported (A - B), when both methods are in the suite.
COMPARISONS = (
    ("pat", "pgd"),
    ("pat", "pat_wos"),
    ("pgd_cor", "pgd"),
    ("fgsm_cor", "fgsm"),
    ("pat", "trades"),
    ("pat", "mart"),
    ("pat", "atpr"),
    ("pat", "clean"),
    ("pgd", "clean"),
)


def own_figures(o: RunOutcome) -> dict:
    """The run's own figures, as its evaluation computed them (eval/results.json)."""
    f = o.results["figures"]
    keep = lambda fig: {k: fig[k] for k in ("value", "interval", "interval_method", "n") if k in fig}
    out = {name: keep(f[name]) for name in ("clean_accuracy",) + ATTACKS if name in f}
    out["laws"] = {
        d: {
            "pr_all": {e: keep(f["pr"][d][e]["all"]) for e in o.eps_keys},
            "pr_clean_correct": {e: keep(f["pr"][d][e]["clean_correct"]) for e in o.eps_keys},
        }
        for d in o.pr_counts
    }
    out.update(out["laws"][next(iter(o.pr_counts))])  # the headline law's, at the top
    return out


def mean_figures(outcomes: Sequence[RunOutcome], indices, confidence) -> dict:
    """Means over seeds of the same figures, with paired bootstrap intervals over images."""
    n = outcomes[0].correct.size
    ones = np.ones((len(outcomes), n))
    method = f"bootstrap over images, mean of {len(outcomes)} seeds"
    out = {}
    metrics = [("clean_accuracy", np.stack([o.correct for o in outcomes]))]
    metrics += [(a, np.stack([o.robust[a] for o in outcomes])) for a in ATTACKS if all(a in o.robust for o in outcomes)]
    for name, hits in metrics:
        v, ci = stats.ratio_interval(hits, ones, indices, confidence)
        out[name] = figure(v, ci, method, n)
    correct = np.stack([o.correct for o in outcomes]).astype(np.float64)
    out["laws"] = {}
    for d in _common_laws(outcomes):
        law = out["laws"][d] = {"pr_all": {}, "pr_clean_correct": {}}
        for j, eps in enumerate(outcomes[0].eps_keys):
            pr = np.stack([o.pr_counts[d][:, j] / o.settings["pr"]["samples"] for o in outcomes])
            v, ci = stats.ratio_interval(pr, ones, indices, confidence)
            law["pr_all"][eps] = figure(v, ci, method, n)
            v, ci = stats.ratio_interval(pr * correct, correct, indices, confidence)
            law["pr_clean_correct"][eps] = figure(v, ci, method, n)
    out.update(out["laws"][next(iter(out["laws"]))])
    return out


def _common_laws(outcomes: Sequence[RunOutcome]) -> list:
    """The laws every outcome was evaluated under, the headline law first."""
    return [d for d in outcomes[0].pr_counts if all(d in o.pr_counts for o in outcomes)]


def paired_difference(a: Sequence[RunOutcome], b: Sequence[RunOutcome], indices, confidence) -> dict:
    """A - B per metric, on the same images and noise; a[k] and b[k] share the seed.

    Accuracies: `stats.paired_difference`. PR, per law and level, under each estimand of
    `stats.pr_difference`: pr_clean_correct (each run over its own clean-correct images, the
    difference of the two Table-1 figures), pr_common_correct (the images both classify
    correctly, paired image by image), pr_all (all images). With several seeds: the mean over
    seeds of the per-seed differences, bootstrapped with the same image resamples for every seed.
    """
    n = a[0].correct.size
    method = f"paired bootstrap over images, mean of {len(a)} seed(s)"
    out = {"seeds": [o.run.seed for o in a]}
    metrics = [("clean_accuracy", [o.correct for o in a], [o.correct for o in b])]
    metrics += [
        (attack, [o.robust[attack] for o in a], [o.robust[attack] for o in b])
        for attack in ATTACKS
        if all(attack in o.robust for o in list(a) + list(b))
    ]
    for name, ha, hb in metrics:
        out[name] = figure(*stats.paired_difference(np.stack(ha), np.stack(hb), indices, confidence), method, n)
    samples = a[0].settings["pr"]["samples"]
    correct_a, correct_b = np.stack([o.correct for o in a]), np.stack([o.correct for o in b])
    names = {"clean_correct": "pr_clean_correct", "both_correct": "pr_common_correct", "all": "pr_all"}
    out["laws"] = {}
    for d in _common_laws(list(a) + list(b)):
        law = out["laws"][d] = {key: {} for key in names.values()}
        for j, eps in enumerate(a[0].eps_keys):
            diff = stats.pr_difference(
                np.stack([o.pr_counts[d][:, j] for o in a]),
                correct_a,
                np.stack([o.pr_counts[d][:, j] for o in b]),
                correct_b,
                samples,
                indices,
                confidence,
            )
            for estimand, key in names.items():
                law[key][eps] = dict(diff[estimand], interval_method=f"{method}, {estimand.replace('_', '-')}")
    out.update(out["laws"][next(iter(out["laws"]))])
    return out


def sweep_figures(sweep: Sweep, outcomes: dict) -> dict:
    """A sweep's points: each one's own figures and its paired differences to each baseline
    (`paired_difference`, one seed), from the outcomes of the suite's finished runs."""
    named = list(sweep.points) + list(sweep.baselines)
    unknown = [p.run_name for p in named if p.run_name not in outcomes]
    if unknown:
        raise ValueError(f"sweep {sweep.name!r} names runs the suite does not have: {', '.join(unknown)}")
    out = {
        "name": sweep.name,
        "axis": sweep.axis,
        "epsilon": robustness.level_key(sweep.epsilon),
        "points": [],
        "baselines": [],
    }
    done = [outcomes[p.run_name] for p in named if outcomes[p.run_name] is not None]
    if done:
        indices, confidence = pairing(done)
        out["confidence"] = confidence
    for p in named:
        o = outcomes[p.run_name]
        entry = {
            "label": p.label,
            "run": p.run_name,
            "value": p.value,
            "series": p.series,
            "status": "done" if o else "pending",
        }
        if o is not None:
            entry.update(figures=own_figures(o), train_s=o.train_s)
        if p in sweep.baselines:
            out["baselines"].append(entry)
            continue
        if o is not None:
            entry["differences"] = {
                b.label: paired_difference([o], [outcomes[b.run_name]], indices, confidence)
                for b in sweep.baselines
                if outcomes[b.run_name] is not None and b.run_name != p.run_name
            }
        out["points"].append(entry)
    return out


def build(suite: Suite, workdir: str, outcomes: dict, invocations: list) -> dict:
    """The suite's results dict (DIR/results.json) from the outcomes of its finished runs
    ({run name: RunOutcome or None})."""
    runs = plan(suite)
    done = [o for o in outcomes.values() if o is not None]
    out = {
        "suite": suite.name,
        "description": suite.description,
        "scaled_down": list(suite.scaled_down),
        "num_runs": len(runs),
        "num_done": len(done),
        "groups": {},
        "invocations": invocations,
    }
    for group in suite.groups:
        group_runs = [r for r in runs if r.group == group.name]
        group_done = [outcomes[r.name] for r in group_runs if outcomes[r.name] is not None]
        g = {"runs": [], "methods": {}, "differences": []}
        out["groups"][group.name] = g
        for r in group_runs:
            o = outcomes[r.name]
            g["runs"].append(
                {
                    "name": r.name,
                    "method": r.method,
                    "seed": r.seed,
                    "status": "done" if o else "pending",
                    "workdir": os.path.relpath(run_dir(workdir, r), workdir),
                    **(
                        {
                            "train_s": o.train_s,
                            "eval_wall_s": o.record.get("eval_wall_s"),
                            "step": o.record.get("step"),
                        }
                        if o
                        else logged_progress(run_dir(workdir, r), r, in_progress=True)  # how far it got
                    ),
                }
            )
        if not group_done:
            continue
        indices, confidence = pairing(group_done)
        s = group_done[0].settings
        # What results.md says the group's figures were made with, in results.json's shape.
        g["evaluation"] = {
            **{k: s.get(k) for k in ("num_examples", "seed", "confidence", "bootstrap_resamples", "dataset")},
            "pr": {k: s["pr"].get(k) for k in ("samples", "epsilons", "distribution")},
            "attack": {k: s["attack"].get(k) for k in ("eps", "step_size", "steps")},
            "cw": {"kappa": s.get("cw", {}).get("kappa")},
        }
        by_method = {}
        for o in group_done:
            by_method.setdefault(o.run.method, {})[o.run.seed] = o
        for entry in g["runs"]:
            o = outcomes[entry["name"]]
            if o is not None:
                entry["figures"] = own_figures(o)
        for method in methods.ordered(by_method):
            seeds = sorted(by_method[method])
            g["methods"][method] = {
                "seeds": seeds,
                "mean": mean_figures([by_method[method][k] for k in seeds], indices, confidence),
            }
        for ma, mb in COMPARISONS:
            common = sorted(set(by_method.get(ma, {})) & set(by_method.get(mb, {})))
            if not common:
                continue
            g["differences"].append(
                {
                    "a": ma,
                    "b": mb,
                    "seeds": common,
                    "mean": paired_difference(
                        [by_method[ma][k] for k in common], [by_method[mb][k] for k in common], indices, confidence
                    ),
                    "per_seed": {
                        str(k): paired_difference([by_method[ma][k]], [by_method[mb][k]], indices, confidence)
                        for k in common
                    },
                }
            )
    out["sweeps"] = [sweep_figures(sweep, outcomes) for sweep in suite.sweeps]
    out["curves"], out["matched"] = matched_figures(suite, workdir, outcomes)
    return out
