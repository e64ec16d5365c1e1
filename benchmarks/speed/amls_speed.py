#!/usr/bin/env python3
"""AMLS per image: patjax's `rare_pr` evaluator against Webb et al.'s own loop (oval-group/
statistical-robustness's `multilevel_uniform`, transcribed in tests/webb_reference.py) on the same
network, images, radius, rho, particles and MH steps; the arms timed by benchmarks/timing.py (each
in a process of its own, alternating rounds, the load gated and recorded; patjax cold and warm).

  python benchmarks/speed/amls_speed.py --images 2 --particles 100 --mh-steps 10 --rounds 3 --json

The network is torch_arms.py's (the committed small CNN in both frameworks); the images are the
first CIFAR-10 test images it classifies correctly (an image it misclassifies has p = 1, which
both loops find at their first level), chosen once by patjax before the timing and handed to both
arms by index, so that neither arm runs the other's framework. patjax's arm: the `rare_pr`
evaluator's compiled pass (`rare_pr.make_batch_fn`, what `python -m patjax.evaluate
--evaluators=rare_pr` runs per batch: the uniform law, Webb et al.'s proposal width, --chunk
images at a time, one JAX device per core), its depth set to what their 500 levels can reach so
that both loops stop alike. Their arm: for each image, multilevel_uniform(prop, x, sigma=eps, rho,
count_particles, count_mh_steps) with prop the PyTorch copy's margin on the batch of particles,
PyTorch on every core. Both arms' median log10 p over the images are printed: their runs are
independent, so they agree within AMLS's spread only. Needs PyTorch.
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

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_arms  # noqa: E402
from epoch_throughput import emit  # noqa: E402
from torch_arms import timing  # noqa: E402

# Webb et al.'s multilevel_uniform stops after count_max_levels = 500 levels.
THEIR_MAX_LEVELS = 500


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--images", type=int, default=2, help="correctly classified CIFAR-10 test images per arm and round")
    p.add_argument("--eps", type=float, default=8 / 255, help="the uniform law's L-inf radius")
    p.add_argument("--rho", type=float, default=0.1)
    p.add_argument("--particles", type=int, default=1000, help="their count_particles")
    p.add_argument("--mh-steps", type=int, default=100, help="their count_mh_steps")
    p.add_argument(
        "--chunk", type=int, default=1, help="patjax: images run at once (eval.rare_pr.chunk_size; default 1, as its)"
    )
    p.add_argument("--json", action="store_true", help="print one JSON line instead of a summary")
    p.add_argument("--arm", choices=("select", "patjax", "theirs"), help="run one arm once in this process")
    p.add_argument("--indices", help="with --arm: the test images' indices, comma-separated")
    p.add_argument("--torch-weights", help="with --arm=theirs: the exported network")
    timing.add_arguments(p)
    args = p.parse_args(argv)
    return args


def select(n: int) -> list:
    """The indices of the first n CIFAR-10 test images the committed model classifies correctly."""
    from patjax.data import cifar

    torch_arms.start_jax()
    model_fns, state = torch_arms.committed_small_cnn()
    split = torch_arms.first_test_images(10 * n + 50)
    logits = model_fns.infer(state.params, state.batch_stats, cifar.to_float(split.images))
    return [int(i) for i in np.flatnonzero(np.argmax(np.asarray(logits), -1) == split.labels)[:n]]


def chosen_images(indices: list):
    from patjax.data import cifar

    split = torch_arms.first_test_images(max(indices) + 1)
    return cifar.Split(split.images[indices], split.labels[indices])


def patjax_estimates(model_fns, state, split, args):
    """The rare_pr evaluator's compiled pass over the images: their log10 p."""
    from patjax import evaluators
    from patjax.evaluators import batches, rare_pr
    from patjax.pat import amls
    from patjax.run import config as config_lib

    # Their loop stops at L >= 0 or after 500 levels: so does this one (depth = what 500 levels reach).
    depth = math.floor(amls.reachable_depth(args.rho, args.particles, THEIR_MAX_LEVELS))
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
    r, _ = batches.evaluate_pass(fn, state, split, n, n, "rare_pr", False)
    return [float(v) for v in np.ravel(r["log10_p"])]


def their_estimates(net, split, args):
    """Webb et al.'s loop over the images, one after another: their log10 p."""
    import torch

    webb_reference = torch_arms.reference("webb_reference")
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

    return [estimate(x, int(y)) for x, y in zip(images, split.labels)]


def run_arm(args) -> str:
    """One arm once, in this process: timing.py's line, with its per-image log10 p."""
    if args.arm == "select":
        return json.dumps({"indices": select(args.images)})
    split = chosen_images([int(i) for i in args.indices.split(",")])
    if args.arm == "patjax":
        torch_arms.start_jax()
        model_fns, state = torch_arms.committed_small_cnn()
        logs, wall, compile_s = timing.timed_jax_call(patjax_estimates, model_fns, state, split, args)
    else:
        import torch

        torch.manual_seed(0)
        net = torch_arms.torch_small_cnn(args.torch_weights)
        start = time.perf_counter()
        logs = their_estimates(net, split, args)
        wall, compile_s = time.perf_counter() - start, None
    return timing.arm_line(wall, compile_s, log10_p=logs)


def main(argv=None):
    args = parse_args(argv)
    if args.arm:
        print(run_arm(args))
        return
    chosen = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--arm=select", f"--images={args.images}"],
        capture_output=True,
        text=True,
        check=True,
    )
    indices = timing.last_json(chosen.stdout)["indices"]
    flags = [
        f"--indices={','.join(map(str, indices))}",
        f"--eps={args.eps}",
        f"--rho={args.rho}",
        f"--particles={args.particles}",
        f"--mh-steps={args.mh_steps}",
        f"--chunk={args.chunk}",
    ]
    measured = torch_arms.measure(__file__, flags, args)
    medians = {
        name: statistics.median(v for r in arm["records"] for v in r["log10_p"] if v is not None and math.isfinite(v))
        if any(v is not None and math.isfinite(v) for r in arm["records"] for v in r["log10_p"])
        else None
        for name, arm in measured["arms"].items()
    }
    out = {
        "images": len(indices),
        "indices": indices,
        "eps": args.eps,
        "rho": args.rho,
        "particles": args.particles,
        "mh_steps": args.mh_steps,
        **torch_arms.summary(measured, len(indices)),
        "median_log10_p": medians,
    }
    emit(out, args.json)


if __name__ == "__main__":
    main()
