"""Learning curves and PR at matched clean accuracy: each run's curve points (its kept models,
evaluated on the suite's images and noise), and A − B with A's PR interpolated in clean accuracy
at B's final model (`stats.matched_difference`), or at A's nearest curve point.
"""

from __future__ import annotations

import numpy as np

from patjax.evaluators import stats
from patjax.run import eval_files, eval_settings
from patjax.suites import Suite, plan, run_name
from patjax.suites.run_outcomes import RunOutcome, figure, pairing, run_dir

CURVE_ATTACK = "pgd20"  # the attack a suite's curve points may be evaluated with (`Suite.curve_evaluators`)
ROBUST_KEY = f"{CURVE_ATTACK}.robust"
# The block of the curve points' threat model: one attack, one column.
ATTACK_BLOCK = "attack"


def _attack(settings: dict) -> dict:
    return settings.get(ATTACK_BLOCK)


def load_curve(workdir: str, outcome: RunOutcome, law: str) -> list[dict]:
    """The run's learning curve: its curve points' evaluations (curve/step_N/) and its final
    evaluation, in training order: [{step, correct (n,), robust (n,) under PGD-20 or None, pr (n, levels)
    per-image PR_i under `law`}].
    Every point must be on the final evaluation's images and noise (`eval_settings.check_comparable`).
    A point's PGD-20 outcomes are given only where the curve points were attacked, with the final
    evaluation's attack settings: the curve's PGD-20 is then one attack from start to end."""
    directory = run_dir(workdir, outcome.run)
    points = []
    for step in eval_files.curve_steps(directory):
        results, per_image = eval_files.load_results(directory, step)
        eval_settings.check_comparable(
            outcome.settings, results["settings"], outcome.run.name, f"{directory} step {step}", aside=(ATTACK_BLOCK,)
        )
        points.append(
            {
                "step": step,
                "correct": per_image["clean.correct"].astype(bool),
                "robust": (
                    per_image[ROBUST_KEY].astype(bool)
                    if ROBUST_KEY in per_image and _attack(results["settings"]) == _attack(outcome.settings)
                    else None
                ),
                "pr": per_image[f"pr_{law}.counts"] / results["settings"]["pr"]["samples"],
            }
        )
    points.append(
        {
            "step": int(outcome.settings["step"]),
            "correct": outcome.correct,
            "robust": outcome.robust.get(CURVE_ATTACK) if any(p["robust"] is not None for p in points) else None,
            "pr": outcome.pr_counts[law] / outcome.settings["pr"]["samples"],
        }
    )
    return points


def curve_figures(points: list[dict], eps_keys) -> list[dict]:
    """Clean accuracy, robust accuracy under PGD-20 (None where the point was not attacked) and PR
    over clean-correct images at every point of a learning curve."""
    out = []
    for p in points:
        c = p["correct"]
        pr = {e: float(p["pr"][c, j].mean()) if c.any() else None for j, e in enumerate(eps_keys)}
        robust = None if p.get("robust") is None else float(p["robust"].mean())
        out.append({"step": p["step"], "clean_accuracy": float(c.mean()), CURVE_ATTACK: robust, "pr_clean_correct": pr})
    return out


def matched_figures(suite: Suite, workdir: str, outcomes: dict) -> tuple[dict, list]:
    """({run: its learning curve's figures}, [one entry per suite.matched pair]) from the finished runs."""
    law = suite.curve_eval_overrides.get("pr.distribution", suite.pr_distribution)
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
        indices, confidence = pairing([o for pair in pairs for o in pair])
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
                [(b.correct, b.pr_counts[law] / b.settings["pr"]["samples"])],
                indices,
                confidence,
            )
            per_seed[str(a.run.seed)] = _by_level(fig, eps_keys, method)
        fig = stats.matched_difference(
            [[(p["correct"], p["pr"]) for p in points] for points, _ in loaded],
            [(b.correct, b.pr_counts[law] / b.settings["pr"]["samples"]) for _, b in pairs],
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
            "clean_accuracy_difference": figure(
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
                np.stack([b.pr_counts[law][:, j] / b.settings["pr"]["samples"] for _, b in pairs]),
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
