#!/usr/bin/env python3
"""Paired differences of log10 P(violation) between two evaluations with `rare_pr` of the same
images and seed (common random numbers), per radius: the median over the images both models
classify correctly of log10 p(A) - log10 p(B), with its bootstrap interval
(`rare_pr.paired_median_difference`), and how many images each side has below the depth.

  python benchmarks/crosscheck/rare_pr_paired.py EVAL_DIR_A EVAL_DIR_B

An EVAL_DIR is where `python -m patjax.evaluate` wrote results.json and per_image.npz (it prints it).
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np


def main(argv=None):
    a_dir, b_dir = (argv or sys.argv[1:])[:2]
    from patjax.evaluators import common, rare_pr

    a, b = (np.load(os.path.join(d, "per_image.npz")) for d in (a_dir, b_dir))
    with open(os.path.join(a_dir, "results.json")) as f:
        settings = json.load(f)["settings"]
    both = a["clean.correct"] & b["clean.correct"]
    shared = common.SharedSettings(seed=settings["seed"], bootstrap_resamples=settings["bootstrap_resamples"])
    out = {}
    for j, eps in enumerate(settings["rare_pr"]["epsilons"]):
        va, vb = a["rare_pr.ordered"][:, j], b["rare_pr.ordered"][:, j]
        fig = rare_pr.paired_median_difference(va, vb, both, shared)
        fig["both_correct"] = int(both.sum())
        fig["below_depth"] = {"a": int(np.sum(both & (va == -np.inf))), "b": int(np.sum(both & (vb == -np.inf)))}
        fig["no_value"] = {"a": int(np.sum(both & np.isnan(va))), "b": int(np.sum(both & np.isnan(vb)))}
        out[f"{eps:g}"] = fig
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
