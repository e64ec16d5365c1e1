#!/usr/bin/env python3
"""Re-evaluate a committed suite run with today's code and compare every figure with the
committed ones: the check that a change to the code left the numbers where they were.

  python benchmarks/crosscheck/check_reevaluation.py --run=docs/results/table1_cpu/runs/cifar10_small_cnn/pgd_s0

Copies the run (its config and kept models, not its evaluation) to a temporary folder,
evaluates it with the committed evaluation's settings (the evaluators and the PR laws named, by
default clean, PGD-20, CW-20 and the headline law, which keeps it to minutes), and prints each
figure that differs; exit status 1 if any moved.

Two kinds of difference are told apart. Every figure made of counts (accuracies, robust
accuracies, PR and their intervals) must come back identical: any change is a moved figure. The
loss-based figures (expected loss, entropic risk, the Theorem 2 bounds, and their intervals) are
means of float32 per-image losses; a different XLA fusion or reduction order (another process's
compilation, another load) moves them in the last float32 digits, so a relative change under
ROUNDING there is reported as rounding, not as a moved figure.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import sys
import tempfile

from patjax.core.errors import UserError

# The committed evaluation's settings the new one takes, by their paths in `eval`.
SETTINGS = (
    "pr.distribution",
    "pr.samples",
    "pr.chunk_size",
    "cw.kappa",
    "seed",
    "bootstrap_resamples",
    "attack.steps",
    "attack.eps",
    "attack.step_size",
    "confidence",
    "pr.epsilons",
)


ROUNDING = 1e-6  # relative: a few float32 ulps (2^-23 = 1.2e-7)
# The figures computed from float32 per-image losses; every other figure is made of counts.
LOSS_BASED = ("expected_loss", "entropic_risk", "lower_bound")


def rounding_only(a, b, path: str) -> bool:
    """Whether a and b are values of a loss-based figure that differ only in float32 rounding.
    A count-based figure never qualifies: one count out of N * images can move it by less than
    1e-6 relative when N * images exceeds 1e6."""
    loss_based = any(f".{name}" in path for name in LOSS_BASED)
    floats = all(isinstance(v, float) for v in (a, b))
    return loss_based and floats and math.isclose(a, b, rel_tol=ROUNDING, abs_tol=ROUNDING * 1e-3)


def differences(a, b, path=""):
    if isinstance(a, dict) and isinstance(b, dict):
        # A setting recorded now that the committed figure did not record (a newer field, e.g. the
        # threat model's norm) is the record growing, not a figure moving.
        grown = set(b) - set(a) if path.endswith(".settings") else set()
        keys_a, keys_b = set(a), set(b) - grown
        out = [(False, f"{path}: keys {sorted(keys_a ^ keys_b)}")] if keys_a != keys_b else []
        return out + [d for k in set(a) & set(b) for d in differences(a[k], b[k], f"{path}.{k}")]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, f"{path}[{i}]")]
    return [] if a == b else [(rounding_only(a, b, path), f"{path}: {a!r} -> {b!r}")]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--run", required=True, help="a suite run directory with eval/results.json and models/")
    p.add_argument("--evaluators", default="clean,pgd20,cw20,pr")
    p.add_argument("--laws", default=None, help="PR laws to recompute (default: the headline law)")
    args = p.parse_args(argv)
    from patjax.core import devices
    from patjax.run import eval_files, eval_settings, evaluation

    devices.use_cpu_cores_as_devices()
    old = eval_files.read_results_file(os.path.join(args.run, "eval", "results.json"), "evaluate the run again")
    if old is None:
        raise UserError(f"--run must be an evaluated suite run directory (with eval/results.json), got {args.run!r}")
    s = old["settings"]
    overrides = {k: eval_settings.setting(s, k) for k in SETTINGS if eval_settings.setting(s, k) is not None}
    overrides["pr.distributions"] = tuple((args.laws or s["pr"]["distribution"]).split(","))
    with tempfile.TemporaryDirectory() as tmp:
        copy = os.path.join(tmp, "run")
        shutil.copytree(args.run, copy, ignore=shutil.ignore_patterns("eval", "curve", "checkpoints"))
        new = evaluation.evaluate_workdir(
            copy,
            num_examples=s["num_examples"],
            batch_size=s["batch_size"],
            progress=True,  # a bar per evaluator on stderr: the check takes minutes
            evaluators=args.evaluators.split(","),
            overrides=overrides,
        )
    found = []
    for key in ("clean_accuracy", "pr", "pr_all_images"):
        if key in new:
            found += differences(old[key], new[key], key)
    for name, figure in new["figures"].items():
        if name == "pr":
            for law in figure:
                found += differences(old["figures"]["pr"][law], figure[law], f"figures.pr.{law}")
        else:
            found += differences(old["figures"][name], figure, f"figures.{name}")
    moved = [line for rounding, line in found if not rounding]
    rounded = [line for rounding, line in found if rounding]
    if rounded:
        print(f"{len(rounded)} loss-based value(s) differ in float32 rounding only (relative < {ROUNDING:g}):")
        print("\n".join(f"  {line}" for line in rounded))
    if moved:
        print(f"{len(moved)} value(s) moved:")
        print("\n".join(f"  {line}" for line in moved))
    else:
        print(f"no figure moved: {', '.join(new['figures'])} ({new['wall_time_s']} s)")
    sys.exit(1 if moved else 0)


if __name__ == "__main__":
    try:
        main()
    except UserError as error:  # bad input: one line, not a traceback
        sys.exit(f"error: {error}")
