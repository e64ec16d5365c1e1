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

import dataclasses
import json
import os
from typing import Optional, Sequence

import numpy as np

from patjax import methods, robustness, stats
from patjax import workdir as workdir_lib
from patjax.suites import PR_DISTRIBUTION, Run, Suite, Sweep, plan

# Paired differences reported (A - B), when both methods are in the suite.
COMPARISONS = (("pat", "pgd"), ("pat", "pat_wos"), ("pgd_cor", "pgd"), ("fgsm_cor", "fgsm"),
               ("pat", "trades"), ("pat", "mart"), ("pat", "atpr"), ("pat", "clean"), ("pgd", "clean"))
ATTACKS = ("pgd20", "cw20")  # the worst-case columns of the paper's tables
RECORD_FILE = "suite_run.json"  # in each run's directory: its training step and wall times


def run_dir(workdir: str, run: Run) -> str:
    return os.path.join(workdir, "runs", run.group, f"{run.method}_s{run.seed}")


def read_json(path) -> Optional[dict]:
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        return json.load(f)


@dataclasses.dataclass
class RunOutcome:
    """Per-image outcomes of one evaluated run (arrays over the same test images)."""

    run: Run
    correct: np.ndarray                 # (n,) bool, clean
    robust: dict                        # {'pgd20': (n,) bool, 'cw20': ...}
    pr_counts: np.ndarray               # (n, levels) non-adversarial samples
    results: dict                       # eval/results.json
    record: dict                        # suite_run.json

    @property
    def settings(self) -> dict:
        return self.results["settings"]

    @property
    def eps_keys(self) -> list:
        return [robustness.level_key(e) for e in self.settings["pr_epsilons"]]


def load_outcome(workdir: str, run: Run) -> Optional[RunOutcome]:
    """The run's outcomes if it was trained and evaluated (its record says so), else None."""
    directory = run_dir(workdir, run)
    record = read_json(os.path.join(directory, RECORD_FILE))
    if record is None or "eval_wall_s" not in record or not workdir_lib.has_evaluation(directory):
        return None
    results, per_image = workdir_lib.load_results(directory)  # the two files of one evaluation
    robust = {a: per_image[f"{a}.robust"].astype(bool) for a in ATTACKS if f"{a}.robust" in per_image}
    return RunOutcome(run=run, correct=per_image["clean.correct"].astype(bool), robust=robust,
                      pr_counts=per_image[f"pr_{PR_DISTRIBUTION}.counts"].astype(np.int64),
                      results=results, record=record)


def _figure(value, interval, method, n):
    return {"value": value, "interval": list(interval), "interval_method": method, "n": int(n)}


def own_figures(o: RunOutcome) -> dict:
    """The run's own figures, as its evaluation computed them (eval/results.json)."""
    f = o.results["figures"]
    keep = lambda fig: {k: fig[k] for k in ("value", "interval", "interval_method", "n") if k in fig}
    out = {name: keep(f[name]) for name in ("clean_accuracy",) + ATTACKS if name in f}
    pr = f["pr"][PR_DISTRIBUTION]
    out["pr_all"] = {e: keep(pr[e]["all"]) for e in o.eps_keys}
    out["pr_clean_correct"] = {e: keep(pr[e]["clean_correct"]) for e in o.eps_keys}
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
        out[name] = _figure(v, ci, method, n)
    correct = np.stack([o.correct for o in outcomes]).astype(np.float64)
    out["pr_all"], out["pr_clean_correct"] = {}, {}
    for j, eps in enumerate(outcomes[0].eps_keys):
        pr = np.stack([o.pr_counts[:, j] / o.settings["pr_samples"] for o in outcomes])
        v, ci = stats.ratio_interval(pr, ones, indices, confidence)
        out["pr_all"][eps] = _figure(v, ci, method, n)
        v, ci = stats.ratio_interval(pr * correct, correct, indices, confidence)
        out["pr_clean_correct"][eps] = _figure(v, ci, method, n)
    return out


def paired_difference(a: Sequence[RunOutcome], b: Sequence[RunOutcome], indices, confidence) -> dict:
    """A - B per metric (`stats.paired_difference`), on the same images and noise; a[k] and
    b[k] share the seed.

    pr_all: mean over all images of PR_A,i - PR_B,i; pr_common_correct: the same over the
    images both models classify correctly (the paper's clean-correct convention, on one
    common set so the difference stays paired). With several seeds: the mean over seeds of
    the per-seed differences, bootstrapped with the same image resamples for every seed.
    """
    n = a[0].correct.size
    method = f"paired bootstrap over images, mean of {len(a)} seed(s)"
    out = {"seeds": [o.run.seed for o in a]}
    metrics = [("clean_accuracy", [o.correct for o in a], [o.correct for o in b])]
    metrics += [(attack, [o.robust[attack] for o in a], [o.robust[attack] for o in b])
                for attack in ATTACKS if all(attack in o.robust for o in list(a) + list(b))]
    for name, ha, hb in metrics:
        out[name] = _figure(*stats.paired_difference(np.stack(ha), np.stack(hb), indices, confidence), method, n)
    both = np.stack([oa.correct & ob.correct for oa, ob in zip(a, b)])
    samples = a[0].settings["pr_samples"]
    out["pr_all"], out["pr_common_correct"] = {}, {}
    for j, eps in enumerate(a[0].eps_keys):
        counts_a = np.stack([o.pr_counts[:, j] for o in a])
        counts_b = np.stack([o.pr_counts[:, j] for o in b])
        out["pr_all"][eps] = _figure(*stats.paired_difference(counts_a, counts_b, indices, confidence,
                                                              per=samples), method, n)
        out["pr_common_correct"][eps] = _figure(
            *stats.paired_difference(counts_a, counts_b, indices, confidence, mask=both, per=samples),
            method + ", images both classify correctly", int(both.sum(axis=1).min()))
    return out


def _pairing(outcomes: Sequence[RunOutcome]):
    """(bootstrap indices, confidence) shared by runs that may be paired; raises if they were not
    evaluated on the same images with the same noise."""
    first = outcomes[0]
    for o in outcomes[1:]:
        workdir_lib.check_comparable(first.settings, o.settings, first.run.name, o.run.name)
    s = first.settings
    indices = stats.bootstrap_indices(first.correct.size, int(s["bootstrap_resamples"]), int(s["seed"]))
    return indices, float(s["confidence"])


def sweep_figures(sweep: Sweep, outcomes: dict) -> dict:
    """A sweep's points: each one's own figures and its paired differences to each baseline
    (`paired_difference`, one seed), from the outcomes of the suite's finished runs."""
    named = list(sweep.points) + list(sweep.baselines)
    unknown = [p.run_name for p in named if p.run_name not in outcomes]
    if unknown:
        raise ValueError(f"sweep {sweep.name!r} names runs the suite does not have: {', '.join(unknown)}")
    out = {"name": sweep.name, "axis": sweep.axis, "epsilon": robustness.level_key(sweep.epsilon), "points": [],
           "baselines": []}
    done = [outcomes[p.run_name] for p in named if outcomes[p.run_name] is not None]
    if done:
        indices, confidence = _pairing(done)
    for p in named:
        o = outcomes[p.run_name]
        entry = {"label": p.label, "run": p.run_name, "value": p.value, "series": p.series,
                 "status": "done" if o else "pending"}
        if o is not None:
            entry.update(figures=own_figures(o), train_wall_s=o.record.get("train_wall_s"))
        if p in sweep.baselines:
            out["baselines"].append(entry)
            continue
        if o is not None:
            entry["differences"] = {
                b.label: paired_difference([o], [outcomes[b.run_name]], indices, confidence)
                for b in sweep.baselines if outcomes[b.run_name] is not None and b.run_name != p.run_name}
        out["points"].append(entry)
    return out


def build(suite: Suite, workdir: str, outcomes: dict, invocations: list) -> dict:
    """The suite's results dict (DIR/results.json) from the outcomes of its finished runs
    ({run name: RunOutcome or None})."""
    runs = plan(suite)
    done = [o for o in outcomes.values() if o is not None]
    out = {"suite": suite.name, "description": suite.description, "scaled_down": list(suite.scaled_down),
           "num_runs": len(runs), "num_done": len(done), "groups": {}, "invocations": invocations}
    for group in suite.groups:
        group_runs = [r for r in runs if r.group == group.name]
        group_done = [outcomes[r.name] for r in group_runs if outcomes[r.name] is not None]
        g = {"runs": [], "methods": {}, "differences": []}
        out["groups"][group.name] = g
        for r in group_runs:
            o = outcomes[r.name]
            g["runs"].append({"name": r.name, "method": r.method, "seed": r.seed, "status": "done" if o else "pending",
                              "workdir": os.path.relpath(run_dir(workdir, r), workdir),
                              **({"train_wall_s": o.record.get("train_wall_s"),
                                  "eval_wall_s": o.record.get("eval_wall_s"),
                                  "step": o.record.get("step")} if o else {})})
        if not group_done:
            continue
        indices, confidence = _pairing(group_done)
        s = group_done[0].settings
        g["evaluation"] = {k: s.get(k) for k in ("num_examples", "pr_samples", "pr_epsilons", "pr_distribution",
                                                 "seed", "confidence", "bootstrap_resamples", "attack_eps",
                                                 "attack_step_size", "attack_steps", "cw_kappa", "dataset")}
        by_method = {}
        for o in group_done:
            by_method.setdefault(o.run.method, {})[o.run.seed] = o
        for entry in g["runs"]:
            o = outcomes[entry["name"]]
            if o is not None:
                entry["figures"] = own_figures(o)
        for method in methods.ordered(by_method):
            seeds = sorted(by_method[method])
            g["methods"][method] = {"seeds": seeds,
                                    "mean": mean_figures([by_method[method][k] for k in seeds], indices, confidence)}
        for ma, mb in COMPARISONS:
            common = sorted(set(by_method.get(ma, {})) & set(by_method.get(mb, {})))
            if not common:
                continue
            g["differences"].append({
                "a": ma, "b": mb, "seeds": common,
                "mean": paired_difference([by_method[ma][k] for k in common], [by_method[mb][k] for k in common],
                                          indices, confidence),
                "per_seed": {str(k): paired_difference([by_method[ma][k]], [by_method[mb][k]], indices, confidence)
                             for k in common}})
    out["sweeps"] = [sweep_figures(sweep, outcomes) for sweep in suite.sweeps]
    return out
