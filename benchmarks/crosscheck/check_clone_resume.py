#!/usr/bin/env python3
"""Resume a suite run carried in git on a fresh clone and compare it, bitwise, with the run as it
went on where it was trained: the hand-over of docs/reproduction.md checked on a real run.

  cp -r docs/results/convergence_cpu/runs/cifar10_small_cnn/pgd_s0/checkpoints/4095 /tmp/ref_4095
  python benchmarks/crosscheck/check_clone_resume.py \
      --run=docs/results/convergence_cpu/runs/cifar10_small_cnn/pgd_s0 --reference=/tmp/ref_4095

--reference is a checkpoint directory (checkpoints/STEP) that the run's worker wrote after the
commit that carries the run; copy it aside while it exists, since the checkpoint manager
rotates it away. The script clones the repository's HEAD (committed files only, as another
machine gets them), resumes the run there from its committed newest checkpoint for exactly the
steps up to STEP (in a child process that imports the clone's code), restores the full train
state of both (parameters, BatchNorm statistics, optimizer state, random key, step) and prints
whether every number is equal; exit status 1 if any differs.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile

from patjax.core.errors import UserError

RESUME = """
import json, os, sys
import jax
from patjax.run import checkpoints, train, workdir
from patjax.core import devices
from patjax.core.errors import UserError

def resume(run, target):
    start = checkpoints.latest_step(run)
    if start is None or start >= target:
        raise UserError(f"the committed checkpoint of {run} (step {start}) is not before step {target}")
    # Float sums are ordered by the device count: resume on as many devices as the run trained on.
    if not os.path.isfile(f"{run}/metrics.jsonl"):
        raise UserError(f"{run} has no metrics.jsonl: not a run that trained")
    devices = json.loads(open(f"{run}/metrics.jsonl").read().splitlines()[-1]).get("devices")
    if devices != jax.device_count():
        raise UserError(f"the run trained on {devices} device(s), this process has {jax.device_count()}; "
                        f"set PATJAX_CPU_DEVICES={devices}")
    settings = workdir.load_settings(run)
    last = settings.total_steps()
    if target > last:
        raise UserError(f"step {target} is past the run's last step {last}")
    train.train_run(settings, run, stop_after_steps=target - start)
    print(f"resumed from step {start} to step {target}")

devices.use_cpu_cores_as_devices()
try:
    resume(sys.argv[1], int(sys.argv[2]))
except UserError as error:
    sys.exit(f"error: {error}")
"""


def equal_states(a, b) -> tuple[int, int, list]:
    """(leaves, numbers, indices of differing leaves) of two train states."""
    import jax
    import numpy as np

    la, ta = jax.tree_util.tree_flatten(a)
    lb, tb = jax.tree_util.tree_flatten(b)
    if ta != tb:
        return len(la), 0, ["tree structure"]
    differing = [i for i, (x, y) in enumerate(zip(la, lb)) if not np.array_equal(np.asarray(x), np.asarray(y))]
    return len(la), sum(np.asarray(x).size for x in la), differing


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--run", required=True, help="a suite run directory, relative to the repository root")
    p.add_argument("--reference", required=True, help="a checkpoint directory checkpoints/STEP of the same run")
    args = p.parse_args(argv)
    step = os.path.basename(os.path.normpath(args.reference))
    if not step.isdigit() or not os.path.isdir(args.reference):
        sys.exit(f"error: --reference must be a checkpoint directory named by its step, got {args.reference!r}")
    root = os.path.dirname(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    )  # the repository holding this script
    relative = os.path.relpath(os.path.abspath(args.run), root)
    if relative.startswith(".."):
        sys.exit(f"error: --run must be a run directory inside the repository {root}, got {args.run!r}")
    from patjax.run import workdir

    with tempfile.TemporaryDirectory() as tmp:
        clone = os.path.join(tmp, "clone")
        subprocess.run(["git", "clone", "-q", root, clone], check=True)
        env = {**os.environ, "PYTHONPATH": clone}
        run = os.path.join(clone, relative)
        if subprocess.run([sys.executable, "-c", RESUME, run, step], cwd=clone, env=env).returncode != 0:
            sys.exit(1)  # the child said why
        reference = os.path.join(tmp, "reference")
        os.makedirs(os.path.join(reference, "checkpoints"))
        shutil.copy(os.path.join(run, "config.json"), reference)
        shutil.copytree(args.reference, os.path.join(reference, "checkpoints", step))
        # `restore` reads a kept model instead of the checkpoint where one exists for the step;
        # neither directory has one past the committed step, and a state without its optimizer
        # would not be the train state this compares.
        _, _, resumed = workdir.restore(run, step=int(step))
        _, _, original = workdir.restore(reference, step=int(step))
    if resumed.opt_state is None or original.opt_state is None:
        sys.exit(f"error: step {step} was read from a kept model, not a checkpoint")
    leaves, numbers, differing = equal_states(resumed, original)
    print(
        f"step {step}: the clone's train state against the reference: {leaves} leaves, {numbers} numbers, "
        f"{'equal bitwise' if not differing else f'{len(differing)} leaves differ'}"
    )
    sys.exit(1 if differing else 0)


if __name__ == "__main__":
    try:
        main()
    except UserError as error:  # bad input: one line, not a traceback
        sys.exit(f"error: {error}")
