#!/usr/bin/env python3
"""AMLS per image: patjax's `rare_pr` evaluator against Webb et al.'s own loop (oval-group/
statistical-robustness's `multilevel_uniform`, transcribed in tests/webb_reference.py) on the same
network, images, radius, rho, particles and MH steps, each arm in a process of its own, the arms
alternating round by round, the machine's load average recorded before and after each.

  python benchmarks/speed/amls_speed.py --images 4 --eps 0.1 --particles 1000 --mh-steps 100 --rounds 3

The network is the committed small CNN of `torch_arms` (docs/results/table1_cpu/runs/cifar10_small_cnn/
clean_s0) in both frameworks; the images are the first CIFAR-10 test images it classifies correctly.
patjax's arm: the `rare_pr` evaluator's compiled pass (`rare_pr.make_batch_fn`, what `python -m
patjax.evaluate --evaluators=rare_pr` runs per batch: the uniform law, Webb et al.'s proposal width,
`--chunk` images at a time, one JAX device per core), its depth set to what their 500 levels can
reach so that both loops stop alike. Their arm: for each image,
multilevel_uniform(prop, x, sigma=eps, rho, count_particles, count_mh_steps) with prop the PyTorch
copy's margin on the batch of particles, PyTorch on every core. Each arm's process times its own
work twice: once from a cold start (patjax's includes compiling the pass) and once more warm; the
parent records the process's wall time and the load average before and after it. Both arms'
median log10 p over the images are printed: their runs are independent, so they agree within
AMLS's spread only. Needs PyTorch (`pip install torch==2.13.0`).

`python benchmarks/speed/amls_speed.py --smoke` runs it at a tiny size (2 images, 50 particles,
2 MH steps, one round), to check that it runs.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--images", type=int, default=4, help="CIFAR-10 test images per arm and round")
    p.add_argument("--eps", type=float, default=0.1, help="the uniform law's L-inf radius")
    p.add_argument("--rho", type=float, default=0.1)
    p.add_argument("--particles", type=int, default=1000, help="their count_particles")
    p.add_argument("--mh-steps", type=int, default=100, help="their count_mh_steps")
    p.add_argument("--chunk", type=int, default=0, help="patjax: images run at once (default: all, one vmap)")
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds (patjax, theirs) timed")
    p.add_argument("--smoke", action="store_true", help="a tiny run that checks the script works")
    p.add_argument("--json", action="store_true", help="print one JSON line instead of a summary")
    p.add_argument("--arm", choices=("patjax", "theirs"), help=argparse.SUPPRESS)  # a child process
    args = p.parse_args(argv)
    if args.smoke:
        args.images, args.particles, args.mh_steps, args.rounds = 2, 50, 2, 1
    args.chunk = args.chunk or args.images
    return args


def run_arm(argv: list) -> dict:
    """Runs one arm as a process of its own (this script with `argv`): its wall time, the load
    average (1 min) just before and just after, and what the arm printed (its JSON line)."""
    before = os.getloadavg()[0]
    start = time.perf_counter()
    done = subprocess.run([sys.executable, os.path.abspath(__file__), *argv], capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = os.getloadavg()[0]
    if done.returncode:
        raise SystemExit(f"arm {argv} failed:\n{done.stderr[-2000:]}")
    return {"process_wall_s": round(wall, 2), "load_before": round(before, 2), "load_after": round(after, 2),
            **json.loads(done.stdout.strip().splitlines()[-1])}  # fmt: skip


def correct_images(model_fns, state, n: int):
    """The first n CIFAR-10 test images the committed model classifies correctly (an image it
    misclassifies has p = 1, which both loops find at their first level)."""
    import numpy as np
    import torch_arms

    from patjax.data import cifar

    split = torch_arms.first_test_images(10 * n + 50)
    logits = model_fns.infer(state.params, state.batch_stats, cifar.to_float(split.images))
    chosen = np.flatnonzero(np.argmax(np.asarray(logits), -1) == split.labels)[:n]
    return cifar.Split(split.images[chosen], split.labels[chosen])


def patjax_arm(args) -> list:
    """Times the rare_pr evaluator's compiled pass twice in this process (the first call compiles
    it); returns [(seconds, median log10 p)]."""
    from patjax.core import devices

    devices.use_cpu_cores_as_devices()  # before JAX starts, as every patjax command line does
    import numpy as np
    import torch_arms

    from patjax import evaluators
    from patjax.evaluators import batches, rare_pr
    from patjax.pat import amls
    from patjax.run import config as config_lib

    model_fns, state, _ = torch_arms.committed_small_cnn()
    split = correct_images(model_fns, state, args.images)
    # Their loop stops at L >= 0 or after 500 levels: so does this one (depth = what 500 levels reach).
    depth = math.floor(amls.reachable_depth(args.rho, args.particles, 500))
    overrides = {
        "rare_pr.epsilons": (args.eps,),
        "rare_pr.rho": args.rho,
        "rare_pr.particles": args.particles,
        "rare_pr.mh_steps": args.mh_steps,
        "rare_pr.chunk_size": args.chunk,
        "rare_pr.decades": (2,),
        "rare_pr.depth": float(depth),
    }
    settings = config_lib.default_evaluation_settings("cifar10", overrides, evaluators="rare_pr")
    view = settings.evaluator_settings.view(evaluators.REGISTRY["rare_pr"])
    # The pass as the evaluation runs it: one batch of every image, split over the cores' devices.
    fn = batches.checking_logits(rare_pr.make_batch_fn(model_fns, view, "rare_pr"), model_fns)
    n = len(split.labels)
    out = []
    for _ in range(2):
        start = time.perf_counter()
        r, _ = batches.evaluate_pass(fn, state, split, n, n, "rare_pr", False)
        seconds = time.perf_counter() - start
        out.append((seconds, float(np.median(r["log10_p"]))))
    return out


def their_arm(args) -> list:
    """Times Webb et al.'s loop over the images twice in this process; returns [(seconds, median log10 p)]."""
    import torch
    import torch_arms

    webb_reference = torch_arms.reference("webb_reference")
    model_fns, state, net = torch_arms.committed_small_cnn()
    split = correct_images(model_fns, state, args.images)
    images = torch_arms.as_torch(split.images)

    def estimate(x, label):
        def prop(particles):
            with torch.no_grad():
                z = net(particles.view(-1, *x.shape))
            others = torch.cat([z[:, :label], z[:, label + 1 :]], -1)
            return (others.max(-1).values - z[:, label]).unsqueeze(-1)

        lg_p = webb_reference.multilevel_uniform(
            prop, x.reshape(-1), sigma=args.eps, rho=args.rho, count_particles=args.particles,
            count_mh_steps=args.mh_steps,
        )[0]  # fmt: skip
        return lg_p / math.log(10)

    out = []
    for _ in range(2):
        start = time.perf_counter()
        logs = [estimate(x, int(y)) for x, y in zip(images, split.labels)]
        out.append((time.perf_counter() - start, statistics.median(logs)))
    return out


def main(argv=None):
    args = parse_args(argv)
    if args.arm:
        sys.path.insert(0, HERE)
        cold, warm = (patjax_arm if args.arm == "patjax" else their_arm)(args)
        print(json.dumps({"cold_s": round(cold[0], 2), "warm_s": round(warm[0], 2), "median_log10_p": warm[1]}))
        return
    shared = [f"--images={args.images}", f"--eps={args.eps}", f"--rho={args.rho}", f"--particles={args.particles}",
              f"--mh-steps={args.mh_steps}", f"--chunk={args.chunk}"]  # fmt: skip
    runs = {"patjax": [], "theirs": []}
    for _ in range(args.rounds):
        for arm in runs:
            runs[arm].append(run_arm([*shared, f"--arm={arm}"]))
    median = {
        arm: {k: statistics.median(r[k] for r in rs) for k in ("process_wall_s", "warm_s")} for arm, rs in runs.items()
    }
    out = {
        "images": args.images,
        "eps": args.eps,
        "rho": args.rho,
        "particles": args.particles,
        "mh_steps": args.mh_steps,
        "runs": runs,
        "median": median,
        "warm_speedup_patjax_over_theirs": round(median["theirs"]["warm_s"] / median["patjax"]["warm_s"], 2),
        "process_speedup_patjax_over_theirs": round(
            median["theirs"]["process_wall_s"] / median["patjax"]["process_wall_s"], 2
        ),
    }
    if args.json:
        print(json.dumps(out))
    else:
        for k, v in out.items():
            print(f"{k:>34}: {v}")


if __name__ == "__main__":
    main()
