#!/usr/bin/env python3
"""PR per second under PRBench's protocol: patjax's `pr` evaluator with `--pr_preset=prbench`
against PRBench's own loop (wellzline/PRBenchmark's `evaluate_PR`, transcribed in
tests/prbench_reference.py) on the same network, the same images, the same law (uniform on the
L-inf ball and [0, 1]^d), N = 100 and PRBench's radii 0.03, 0.08, 0.1, 0.12; the arms timed
by benchmarks/timing.py (each in a process of its own, alternating rounds, the load gated and
recorded; patjax cold and warm).

  python benchmarks/speed/pr_speed.py --images 100 --rounds 3 --json

The network and images are torch_arms.py's (the committed small CNN in both frameworks, CIFAR-10's
first test images). patjax: `evaluation.evaluate_state` with evaluators=clean,pr and the preset's
settings, what `python -m patjax.evaluate --pr_preset=prbench` runs (one compiled pass: --batch
images at a time, --chunk samples of each per forward, split over one JAX device per core),
its compilation timed apart. PRBench's loop: for each radius and image, its
`run_prob` (a forward of the clean image, then one of N = 100 samples of its law), eager PyTorch on
every core. The noise differs (each arm draws its own), so the arms' PR agree within sampling
only; both are printed, with the paired z statistic of the per-image counts (their difference
over the images both keep, against its binomial standard error). Needs PyTorch.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_arms  # noqa: E402
from epoch_throughput import emit  # noqa: E402
from torch_arms import timing  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--images", type=int, default=100, help="CIFAR-10 test images per round")
    p.add_argument("--batch", type=int, default=100, help="patjax: images per evaluation batch")
    p.add_argument("--chunk", type=int, default=5, help="patjax: samples per image per forward")
    p.add_argument("--json", action="store_true", help="print one JSON line instead of a summary")
    p.add_argument("--arm", choices=("patjax", "theirs"), help="run one arm once in this process (timing.py's arm)")
    p.add_argument("--torch-weights", help="with --arm=theirs: the exported network")
    timing.add_arguments(p)
    return p.parse_args(argv)


def paired_z(ours, theirs, n: int) -> float:
    """Sum over images of (our count - their count), over its standard error under one binomial
    law per image (each image's rate from the pooled counts): about N(0, 1) when both arms draw
    N samples of the same law per image."""
    total, variance = 0.0, 0.0
    for a, b in zip(ours, theirs):
        p = (a + b) / (2 * n)
        total += a - b
        variance += 2 * n * p * (1 - p)
    return float(total / math.sqrt(variance)) if variance > 0 else 0.0


def patjax_counts(model_fns, state, split, batch: int, chunk: int):
    """patjax's `pr` evaluator with the prbench preset, what `python -m patjax.evaluate
    --pr_preset=prbench` runs: {radius: (PR over the images it keeps, per-image non-adversarial
    counts, -1 where it skips the image)}."""
    from patjax.evaluators import pr
    from patjax.run import config as config_lib
    from patjax.run import evaluation

    overrides = {**pr.PRESETS["prbench"], "pr.chunk_size": chunk}
    settings = config_lib.default_evaluation_settings(
        "cifar10", overrides, evaluators="clean,pr", num_examples=len(split), batch_size=batch
    )
    radii = settings.evaluator_settings["pr"].epsilons  # PRBench's (tests/evaluators/test_pr.py)
    per_image = {}
    results = evaluation.evaluate_state(settings, model_fns, state, split, progress=False, per_image_out=per_image)
    counts = np.where(per_image["clean.correct"][:, None], per_image["pr_uniform.counts"], -1)
    return {e: (results["pr"][repr(e)]["value"], counts[:, j]) for j, e in enumerate(radii)}


def prbench_counts(net, split):
    """PRBench's loop on the PyTorch network, the same layout as `patjax_counts`."""
    import torch

    prbench = torch_arms.reference("prbench_reference")
    images, labels = torch_arms.as_torch(split.images), torch.from_numpy(np.asarray(split.labels, np.int64))
    summary, counts = prbench.func_pr(images, labels, prbench.RADII, net)
    return {e: (summary[f"PR_{e}"][0], np.asarray(counts[e])) for e in prbench.RADII}


def run_arm(args) -> str:
    """One arm once, in this process: timing.py's line, with its PR and per-image counts."""
    split = torch_arms.first_test_images(args.images)
    if args.arm == "patjax":
        torch_arms.start_jax()
        model_fns, state = torch_arms.committed_small_cnn()
        out, wall, compile_s = timing.timed_jax_call(patjax_counts, model_fns, state, split, args.batch, args.chunk)
    else:
        import torch

        torch.manual_seed(0)  # PRBench's evaluate.py seeds torch's global generator with 0
        net = torch_arms.torch_small_cnn(args.torch_weights)
        start = time.perf_counter()
        out = prbench_counts(net, split)
        wall, compile_s = time.perf_counter() - start, None
    counts = {str(e): (pr_value, [int(c) for c in per_image]) for e, (pr_value, per_image) in out.items()}
    return timing.arm_line(wall, compile_s, counts=counts)


def main(argv=None):
    args = parse_args(argv)
    if args.arm:
        print(run_arm(args))
        return
    flags = [f"--images={args.images}", f"--batch={args.batch}", f"--chunk={args.chunk}"]
    measured = torch_arms.measure(__file__, flags, args)
    last = {name: arm["records"][-1]["counts"] for name, arm in measured["arms"].items()}
    ours, theirs = last["patjax warm"], last["theirs"]
    if list(ours) != list(theirs):
        raise SystemExit(f"error: the arms' radii differ: {list(ours)} and {list(theirs)}")
    z, kept = {}, 0
    for e in ours:
        a, b = np.asarray(ours[e][1]), np.asarray(theirs[e][1])
        both = (a >= 0) & (b >= 0)
        z[e], kept = round(paired_z(a[both], b[both], 100), 2), int(both.sum())
    out = {
        "images": args.images,
        "patjax_batch": args.batch,
        "patjax_chunk": args.chunk,
        **torch_arms.summary(measured, args.images),
        "pr_clean_correct": {e: {"patjax": ours[e][0], "theirs": theirs[e][0]} for e in ours},
        "images_both_keep": kept,
        "paired_z": z,
    }
    emit(out, args.json)


if __name__ == "__main__":
    main()
