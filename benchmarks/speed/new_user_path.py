"""The new user's evaluation path on one workdir, timed command by command in separate processes:
L-inf (the workdir's own settings), then L2, then PRBench's radii, then certification, each a
fresh `python -m patjax.evaluate` as a user runs it, on a copy of a trained run without its
evaluations. One JSON line per command: its flags, wall time, exit status, the evaluation it
wrote or reused, and the load average before and after (a figure of the code only on a quiet
machine). The same script times any checkout (`--repo`), so two versions of patjax are compared
on the same run and machine:

  python main.py --config=quickstart --workdir=runs/quickstart      # once: the trained run
  python benchmarks/speed/new_user_path.py --run=runs/quickstart --repo=.             # this checkout
  python benchmarks/speed/new_user_path.py --run=runs/quickstart --repo=../before     # another one

`--dry_run` prints the commands without running them.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

# The path: each step's flags after --workdir, in the order a user meets them. The certify step
# names its evaluation: versions that named it from the attacks' and PR's settings gave it the
# first step's name and refused it, and the timing compares the same work on every version.
STEPS = (
    ("linf", ()),
    ("l2", ("--attack_norm=l2",)),
    ("prbench", ("--pr_preset=prbench",)),
    ("certify", ("--evaluators=clean,certify", "--certify_sigma=0.25", "--eval_name=certify")),
)


def commands(workdir: str, certify_samples: int, extra=()) -> list:
    """(step, argv) of every command of the path on `workdir`, `extra` flags appended to each."""
    out = []
    for step, flags in STEPS:
        flags = (*flags, f"--certify_samples={certify_samples}") if step == "certify" else flags
        out.append((step, [sys.executable, "-m", "patjax.evaluate", f"--workdir={workdir}", *flags, *extra]))
    return out


def fresh_copy(run: str, into: str) -> str:
    """A copy of the trained run `run` without its evaluations (eval/, evals/, curve/) or lock,
    so that every timing starts from the same state."""
    workdir = os.path.join(into, "run")
    shutil.copytree(run, workdir, ignore=shutil.ignore_patterns("eval", "evals", "curve", "*.lock"))
    return workdir


def kept(stdout: str) -> str:
    """The line saying what became of the evaluation (wrote or reused, and under which name)."""
    lines = [line for line in stdout.splitlines() if ": wrote " in line or ": reused " in line]
    return lines[-1] if lines else ""


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--run", required=True, help="a trained run's workdir (the quickstart's), copied, never changed")
    p.add_argument("--repo", default=".", help="the checkout whose patjax is timed (its root)")
    p.add_argument("--certify_samples", type=int, default=1000, help="n of the certify step")
    p.add_argument("--extra", default="", help="flags added to every command, space-separated (--num_examples=8)")
    p.add_argument("--out", default=None, help="also append the JSON lines to this file")
    p.add_argument("--dry_run", action="store_true", help="print the commands, run nothing")
    args = p.parse_args(argv)
    repo, run = os.path.abspath(args.repo), os.path.abspath(args.run)
    if not os.path.isfile(os.path.join(run, "config.json")):
        p.error(f"--run={args.run}: no config.json, not a trained run's workdir")
    with tempfile.TemporaryDirectory(prefix="new_user_path_") as scratch:
        workdir = fresh_copy(run, scratch) if not args.dry_run else os.path.join(scratch, "run")
        env = dict(os.environ, PYTHONPATH=repo)
        if not args.dry_run:  # which patjax the commands import: the checkout's, not an installed one
            where = [sys.executable, "-c", "import patjax; print(patjax.__file__)"]
            imported = subprocess.run(where, cwd=repo, env=env, capture_output=True, text=True).stdout.strip()
            print(json.dumps({"step": "patjax", "repo": repo, "imported": imported}), flush=True)
        total = 0.0
        for step, argv_ in commands(workdir, args.certify_samples, args.extra.split()):
            if args.dry_run:
                print(" ".join(argv_[1:]))
                continue
            load_before = os.getloadavg()
            start = time.perf_counter()
            done = subprocess.run(argv_, cwd=repo, env=env, capture_output=True, text=True)
            wall = time.perf_counter() - start
            total += wall
            line = {
                "step": step,
                "flags": argv_[4:],
                "repo": repo,
                "wall_s": round(wall, 2),
                "returncode": done.returncode,
                "kept": kept(done.stdout),
                "load_before": [round(x, 2) for x in load_before],
                "load_after": [round(x, 2) for x in os.getloadavg()],
                "error": done.stderr.strip().splitlines()[-1] if done.returncode else "",
            }
            print(json.dumps(line), flush=True)
            if args.out:
                with open(args.out, "a") as f:
                    f.write(json.dumps(line) + "\n")
            if done.returncode:
                return done.returncode
        if not args.dry_run:
            print(json.dumps({"step": "total", "repo": repo, "wall_s": round(total, 2)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
