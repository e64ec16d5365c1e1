#!/usr/bin/env python3
"""PR at matched clean accuracy between two runs, from their learning-curve points: the comparison
row of docs/reproduction.md's rule when the two final clean accuracies are more than 3 pp apart.

  python benchmarks/crosscheck/matched_accuracy.py --a docs/results/gpu/f2/pat --b docs/results/gpu/e2/pgd_atpr
  python benchmarks/crosscheck/matched_accuracy.py --a RUNS/pat_s1 --b RUNS/pgd_s1 --final=eval   # a suite's runs

A's curve points (A/curve/step_N/, the carried runs' every 10 epochs, the final model the last) are
interpolated linearly in clean accuracy at the clean accuracy of B's final model on the same images,
and B's PR subtracted: PR under the headline law over each model's clean-correct images (Table 1's
estimand), with the paired percentile bootstrap over images (`evaluators.stats.matched_difference`,
the suites' matched rows). --final=curve (default): each run's final model is its last curve point
(the carried runs evaluate their final model as one, on the curve's images and in the run's dtype);
--final=eval: each run's eval/ (a suite run's final evaluation, on its curve points' images), which
then also ends A's curve. Every evaluation must share images, seed and noise; A's curve must span
B's accuracy, else there is no matched row (said, not extrapolated).
"""

from __future__ import annotations

import argparse
import json
import sys

from patjax.core.errors import UserError
from patjax.evaluators import stats
from patjax.run import comparison, eval_files


def load_points(run: str, final: str) -> tuple:
    """(A-style curve: [(settings, per_image)] in training order, the final model's (settings, per_image))."""
    steps = eval_files.curve_steps(run)
    points = [eval_files.load_results(run, step) for step in steps]
    if final == "eval":
        points.append(eval_files.load_results(run))
    if not points:
        raise UserError(f"{run} holds no curve points (curve/step_N/)")
    return points, points[-1]


def matched(a: str, b: str, final: str = "curve") -> dict:
    """The matched-accuracy row A − B (`stats.matched_difference`) with what it is over."""
    curve_a, _ = load_points(a, final)
    _, final_b = load_points(b, final)
    settings = [s["settings"] for s, _ in curve_a] + [final_b[0]["settings"]]
    names = [f"{a} point {i}" for i in range(len(curve_a))] + [f"{b} final"]
    indices, confidence = comparison.pairing(settings, names)
    law = settings[0]["pr"]["distribution"]

    def figures(point):
        results, per_image = point
        pr = per_image[f"pr_{law}.counts"] / results["settings"]["pr"]["samples"]
        return per_image["clean.correct"].astype(bool), pr

    row = stats.matched_difference([[figures(p) for p in curve_a]], [figures(final_b)], indices, confidence)
    eps = [str(e) for e in settings[0]["pr"]["epsilons"]]
    low, high = row["interval"] if row["interval"][0] is not None else ([None] * len(eps), [None] * len(eps))
    return {
        "a": a,
        "b": b,
        "law": law,
        "num_examples": int(settings[0]["num_examples"]),
        "curve_steps_a": [int(s["settings"]["step"]) for s, _ in curve_a],
        **{k: row[k] for k in ("matched_accuracy", "accuracy_range_a", "resamples_matched")},
        "pr_difference": {
            e: {
                "value": None if row["value"] is None else row["value"][i],
                "interval": [low[i], high[i]],
            }
            for i, e in enumerate(eps)
        },
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--a", required=True, help="the run whose curve is interpolated (the more accurate one)")
    p.add_argument("--b", required=True, help="the run whose final model sets the clean accuracy")
    p.add_argument("--final", choices=("curve", "eval"), default="curve", help="where each final model's figures are")
    args = p.parse_args(argv)
    try:
        row = matched(args.a, args.b, args.final)
    except UserError as error:
        print(f"matched_accuracy: {error}", file=sys.stderr)
        return 1
    print(json.dumps(row, indent=1))
    low, high = row["accuracy_range_a"][0]
    if row["pr_difference"][next(iter(row["pr_difference"]))]["value"] is None:
        print(
            f"no matched row: A's curve spans clean accuracy {100 * low:.1f}-{100 * high:.1f} %, B's final model is at "
            f"{100 * row['matched_accuracy']:.1f} %",
            file=sys.stderr,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
