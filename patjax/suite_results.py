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
import os
from typing import Optional, Sequence

import numpy as np

from patjax import eval_files, evaluators, methods, robustness, stats
from patjax.files import read_json
from patjax.suites import Run, Suite, Sweep, plan, run_name

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
ATTACKS = evaluators.TABLE_ATTACKS
RECORD_FILE = "suite_run.json"  # in each run's directory: its training step and wall times


def run_dir(workdir: str, run: Run) -> str:
    return os.path.join(workdir, "runs", *run.name.split("/"))


@dataclasses.dataclass
class RunOutcome:
    """Per-image outcomes of one evaluated run (arrays over the same test images)."""

    run: Run
    correct: np.ndarray  # (n,) bool, clean
    robust: dict  # {'pgd20': (n,) bool, 'cw20': ...}
    pr_counts: dict  # {law: (n, levels) non-adversarial samples}, the headline law first
    results: dict  # eval/results.json
    record: dict  # suite_run.json

    @property
    def settings(self) -> dict:
        return self.results["settings"]

    @property
    def eps_keys(self) -> list:
        return [robustness.level_key(e) for e in self.settings["pr_epsilons"]]


def read_record(directory: str) -> Optional[dict]:
    """A run's suite_run.json, or None before its training finished."""
    return read_json(
        os.path.join(directory, RECORD_FILE),
        "delete it and run the suite again (training resumes from the run's checkpoints)",
    )


def load_outcome(workdir: str, run: Run, pr_distribution: str) -> Optional[RunOutcome]:
    """The run's outcomes if it was trained and evaluated (its record says so), else None; PR
    counts for `pr_distribution` (the suite's headline law) and every other law with levels eps."""
    directory = run_dir(workdir, run)
    record = read_record(directory)
    if record is None or "eval_wall_s" not in record or not eval_files.has_evaluation(directory):
        return None
    results, per_image = eval_files.load_results(directory)  # the two files of one evaluation
    robust = {a: per_image[f"{a}.robust"].astype(bool) for a in ATTACKS if f"{a}.robust" in per_image}
    laws = [pr_distribution] + [d for d in robustness.DISTRIBUTIONS if d != pr_distribution]
    counts = {d: per_image[f"pr_{d}.counts"].astype(np.int64) for d in laws if f"pr_{d}.counts" in per_image}
    return RunOutcome(
        run=run,
        correct=per_image["clean.correct"].astype(bool),
        robust=robust,
        pr_counts=counts,
        results=results,
        record=record,
    )


def _figure(value, interval, method, n):
    return {"value": value, "interval": list(interval), "interval_method": method, "n": int(n)}


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
        out[name] = _figure(v, ci, method, n)
    correct = np.stack([o.correct for o in outcomes]).astype(np.float64)
    out["laws"] = {}
    for d in _common_laws(outcomes):
        law = out["laws"][d] = {"pr_all": {}, "pr_clean_correct": {}}
        for j, eps in enumerate(outcomes[0].eps_keys):
            pr = np.stack([o.pr_counts[d][:, j] / o.settings["pr_samples"] for o in outcomes])
            v, ci = stats.ratio_interval(pr, ones, indices, confidence)
            law["pr_all"][eps] = _figure(v, ci, method, n)
            v, ci = stats.ratio_interval(pr * correct, correct, indices, confidence)
            law["pr_clean_correct"][eps] = _figure(v, ci, method, n)
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
        out[name] = _figure(*stats.paired_difference(np.stack(ha), np.stack(hb), indices, confidence), method, n)
    samples = a[0].settings["pr_samples"]
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


def _pairing(outcomes: Sequence[RunOutcome]):
    """(bootstrap indices, confidence) shared by runs that may be paired; raises if they were not
    evaluated on the same images with the same noise."""
    first = outcomes[0]
    for o in outcomes[1:]:
        eval_files.check_comparable(first.settings, o.settings, first.run.name, o.run.name)
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
    out = {
        "name": sweep.name,
        "axis": sweep.axis,
        "epsilon": robustness.level_key(sweep.epsilon),
        "points": [],
        "baselines": [],
    }
    done = [outcomes[p.run_name] for p in named if outcomes[p.run_name] is not None]
    if done:
        indices, confidence = _pairing(done)
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
            entry.update(figures=own_figures(o), train_wall_s=o.record.get("train_wall_s"))
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


def load_curve(workdir: str, outcome: RunOutcome, law: str) -> list[dict]:
    """The run's learning curve: its curve points' evaluations (curve/step_N/) and its final
    evaluation, in training order: [{step, correct (n,), pr (n, levels) per-image PR_i under `law`}].
    Every point must be on the final evaluation's images and noise (`eval_files.check_comparable`)."""
    directory = run_dir(workdir, outcome.run)
    points = []
    for step in eval_files.curve_steps(directory):
        results, per_image = eval_files.load_results(directory, step)
        eval_files.check_comparable(outcome.settings, results["settings"], outcome.run.name, f"{directory} step {step}")
        points.append(
            {
                "step": step,
                "correct": per_image["clean.correct"].astype(bool),
                "pr": per_image[f"pr_{law}.counts"] / results["settings"]["pr_samples"],
            }
        )
    points.append(
        {
            "step": int(outcome.settings["step"]),
            "correct": outcome.correct,
            "pr": outcome.pr_counts[law] / outcome.settings["pr_samples"],
        }
    )
    return points


def curve_figures(points: list[dict], eps_keys) -> list[dict]:
    """Clean accuracy and PR over clean-correct images at every point of a learning curve."""
    out = []
    for p in points:
        c = p["correct"]
        pr = {e: float(p["pr"][c, j].mean()) if c.any() else None for j, e in enumerate(eps_keys)}
        out.append({"step": p["step"], "clean_accuracy": float(c.mean()), "pr_clean_correct": pr})
    return out


def matched_figures(suite: Suite, workdir: str, outcomes: dict) -> tuple[dict, list]:
    """({run: its learning curve's figures}, [one entry per suite.matched pair]) from the finished runs."""
    law = suite.curve_eval_overrides.get("pr_distribution", suite.pr_distribution)
    runs = {r.name: r for r in plan(suite)}
    curves, entries = {}, []
    for name, o in outcomes.items():  # every finished run with learning-curve points
        if o is not None and eval_files.curve_steps(run_dir(workdir, o.run)):
            curves[name] = curve_figures(load_curve(workdir, o, law), o.eps_keys)
    for (group_a, method_a), (group_b, method_b) in suite.matched:
        pairs = []
        for name, run in runs.items():
            if run.group != group_a or run.method != method_a:
                continue
            partner = run_name(group_b, method_b, run.seed)
            if outcomes.get(name) is not None and outcomes.get(partner) is not None:
                pairs.append((outcomes[name], outcomes[partner]))
        entry = {
            "a": f"{group_a}/{method_a}",
            "b": f"{group_b}/{method_b}",
            "law": law,
            "seeds": [a.run.seed for a, _ in pairs],
        }
        entries.append(entry)
        if not pairs:
            continue
        indices, confidence = _pairing([o for pair in pairs for o in pair])
        eps_keys = pairs[0][0].eps_keys
        loaded = [(load_curve(workdir, a, law), b) for a, b in pairs]
        method = (
            f"A's PR over its clean-correct images interpolated linearly in clean accuracy between its "
            f"learning-curve points, at the clean accuracy of B's final model, minus B's; paired "
            f"percentile bootstrap over images ({len(indices)} resamples)"
        )
        per_seed = {}
        for (points, b), (a, _) in zip(loaded, pairs):
            fig = stats.matched_difference(
                [[(p["correct"], p["pr"]) for p in points]],
                [(b.correct, b.pr_counts[law] / b.settings["pr_samples"])],
                indices,
                confidence,
            )
            per_seed[str(a.run.seed)] = _by_level(fig, eps_keys, method)
        fig = stats.matched_difference(
            [[(p["correct"], p["pr"]) for p in points] for points, _ in loaded],
            [(b.correct, b.pr_counts[law] / b.settings["pr_samples"]) for _, b in pairs],
            indices,
            confidence,
        )
        entry.update(
            mean=_by_level(fig, eps_keys, method),
            per_seed=per_seed,
            nearest=_nearest(loaded, law, eps_keys, indices, confidence),
        )
    return curves, entries


def _nearest(loaded, law: str, eps_keys, indices, confidence) -> dict:
    """A − B between A's curve point nearest to B's final model in clean accuracy and that model,
    per seed and as the mean over seeds: the comparison when A's curve does not reach B's
    accuracy (no interpolation, so no extrapolation either). Each estimand of
    `stats.pr_difference`, with the two accuracies and their paired difference."""
    chosen = []
    for points, b in loaded:
        acc_b = b.correct.mean()
        chosen.append((min(points, key=lambda p: abs(p["correct"].mean() - acc_b)), b))

    def figures(pairs):
        correct_a = np.stack([p["correct"] for p, _ in pairs])
        correct_b = np.stack([b.correct for _, b in pairs])
        out = {
            "steps_a": [int(p["step"]) for p, _ in pairs],
            "clean_accuracy_a": float(correct_a.mean()),
            "clean_accuracy_b": float(correct_b.mean()),
            "clean_accuracy_difference": _figure(
                *stats.paired_difference(correct_a, correct_b, indices, confidence),
                "paired bootstrap over images",
                correct_a.shape[1],
            ),
            "pr": {},
        }
        for j, e in enumerate(eps_keys):
            out["pr"][e] = stats.pr_difference(
                np.stack([p["pr"][:, j] for p, _ in pairs]),
                correct_a,
                np.stack([b.pr_counts[law][:, j] / b.settings["pr_samples"] for _, b in pairs]),
                correct_b,
                1,
                indices,
                confidence,
            )
        return out

    return {"mean": figures(chosen), "per_seed": {str(b.run.seed): figures([(p, b)]) for p, b in chosen}}


def _by_level(fig: dict, eps_keys, method: str) -> dict:
    out = {k: fig[k] for k in ("matched_accuracy", "accuracy_range_a", "resamples_matched")}
    out["pr_clean_correct"] = {
        e: {
            "value": None if fig["value"] is None else fig["value"][j],
            "interval": [None, None] if fig["interval"][0] is None else [fig["interval"][0][j], fig["interval"][1][j]],
            "interval_method": method,
        }
        for j, e in enumerate(eps_keys)
    }
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
                            "train_wall_s": o.record.get("train_wall_s"),
                            "eval_wall_s": o.record.get("eval_wall_s"),
                            "step": o.record.get("step"),
                        }
                        if o
                        else {}
                    ),
                }
            )
        if not group_done:
            continue
        indices, confidence = _pairing(group_done)
        s = group_done[0].settings
        g["evaluation"] = {
            k: s.get(k)
            for k in (
                "num_examples",
                "pr_samples",
                "pr_epsilons",
                "pr_distribution",
                "seed",
                "confidence",
                "bootstrap_resamples",
                "attack_eps",
                "attack_step_size",
                "attack_steps",
                "cw_kappa",
                "dataset",
            )
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
