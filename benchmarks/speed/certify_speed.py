#!/usr/bin/env python3
"""Certified images per second: patjax's `certify` evaluator against Cohen et al.'s own loop
(locuslab/smoothing's `Smooth.certify`, transcribed in tests/smoothing_reference.py) on the same
network, the same images and the same n0, n, sigma and alpha, the two arms timed by
benchmarks/timing.py (each in a process of its own, alternating rounds; patjax cold and warm).

  python benchmarks/speed/certify_speed.py --images 32 --n0 100 --n 1000 --rounds 3

The network is a committed small CNN (docs/results/table1_cpu/runs/cifar10_small_cnn/clean_s0,
clean training, 800 steps) and its PyTorch copy (`torch_names.to_state_dict` into
patjax_torch's SmallCNN); the images are CIFAR-10's first test images (`cifar.find_data_dir`).
patjax: `evaluation.evaluate_state` with evaluators=certify, what `python -m patjax.evaluate`
runs (one compiled pass: `--batch` images at a time, `--chunk` samples of each per forward,
split over one JAX device per core), its compilation timed apart.
The authors' loop: for each image, `Smooth.certify(x, n0, n, alpha, batch_size=--torch-batch)`
as their certify.py calls it (their default batch 1,000), PyTorch on every core. The noise
differs (each arm draws its own), so the arms' certified accuracies (at radius 0: certified
and right) agree only within sampling; both are printed. Each arm's wall time includes its
host-side work (the Clopper-Pearson bound).
Needs PyTorch (`pip install torch==2.13.0`).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_arms  # noqa: E402
from epoch_throughput import emit  # noqa: E402
from torch_arms import timing  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--images", type=int, default=32, help="CIFAR-10 test images certified per round")
    p.add_argument("--n0", type=int, default=100, help="selection samples (their N0)")
    p.add_argument("--n", type=int, default=1000, help="estimation samples (their N)")
    p.add_argument("--sigma", type=float, default=0.25)
    p.add_argument("--alpha", type=float, default=0.001)
    p.add_argument("--batch", type=int, default=16, help="patjax: images per evaluation batch")
    p.add_argument("--chunk", type=int, default=64, help="patjax: samples per image per forward")
    p.add_argument("--torch-batch", type=int, default=1000, help="their batch_size (samples per forward)")
    p.add_argument("--json", action="store_true", help="print one JSON line instead of a summary")
    p.add_argument("--arm", choices=("patjax", "theirs"), help="run one arm once in this process (timing.py's arm)")
    p.add_argument("--torch-weights", help="with --arm=theirs: the exported network")
    timing.add_arguments(p)
    return p.parse_args(argv)


def patjax_arm(args, split) -> float:
    """patjax's certify evaluator, what `python -m patjax.evaluate --evaluators=certify` runs:
    the certified accuracy at radius 0."""
    from patjax.run import config as config_lib
    from patjax.run import evaluation

    model_fns, state = torch_arms.committed_small_cnn()
    overrides = {
        "certify.sigma": args.sigma,
        "certify.selection_samples": args.n0,
        "certify.samples": args.n,
        "certify.alpha": args.alpha,
        "certify.chunk_size": args.chunk,
        "certify.radii": (0.0, 0.25, 0.5),
    }
    settings = config_lib.default_evaluation_settings(
        "cifar10", overrides, evaluators="certify", num_examples=args.images, batch_size=args.batch
    )

    def certify():
        results = evaluation.evaluate_state(settings, model_fns, state, split, progress=False)
        return results["figures"]["certify"]["certified_accuracy"]["0.0"]["value"]

    return timing.timed_jax_call(certify)


def their_arm(args, split):
    """Cohen et al.'s loop: `Smooth.certify` image by image, as their certify.py calls it."""
    smoothing_reference = torch_arms.reference("smoothing_reference")
    smooth = smoothing_reference.Smooth(torch_arms.torch_small_cnn(args.torch_weights), 10, args.sigma)
    start = time.perf_counter()
    certified = 0
    for i, x in enumerate(torch_arms.as_torch(split.images)):
        cls, radius = smooth.certify(x, args.n0, args.n, args.alpha, args.torch_batch)
        certified += int(cls == split.labels[i])
    return certified / args.images, time.perf_counter() - start, None


def main(argv=None):
    args = parse_args(argv)
    if args.arm:
        split = torch_arms.first_test_images(args.images)
        if args.arm == "patjax":
            torch_arms.start_jax()
            accuracy, wall, compile_s = patjax_arm(args, split)
        else:
            accuracy, wall, compile_s = their_arm(args, split)
        print(timing.arm_line(wall, compile_s, certified_accuracy_at_radius_0=accuracy))
        return
    flags = [f"--{k}={getattr(args, k.replace('-', '_'))}" for k in ("images", "n0", "n", "sigma", "alpha")]
    flags += [f"--batch={args.batch}", f"--chunk={args.chunk}", f"--torch-batch={args.torch_batch}"]
    measured = torch_arms.measure(__file__, flags, args)
    out = {
        "images": args.images,
        "n0": args.n0,
        "n": args.n,
        "sigma": args.sigma,
        "alpha": args.alpha,
        "patjax_batch": args.batch,
        "patjax_chunk": args.chunk,
        "torch_batch": args.torch_batch,
        **torch_arms.summary(measured, args.images),
        "certified_accuracy_at_radius_0": {
            name: arm["records"][-1]["certified_accuracy_at_radius_0"] for name, arm in measured["arms"].items()
        },
    }
    emit(out, args.json)


if __name__ == "__main__":
    main()
