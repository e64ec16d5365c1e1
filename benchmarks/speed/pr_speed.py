#!/usr/bin/env python3
"""PR per second under PRBench's protocol: patjax's `pr` evaluator with `--pr_preset=prbench`
against PRBench's own loop (wellzline/PRBenchmark's `evaluate_PR`, transcribed in
tests/prbench_reference.py) on the same network, the same images, the same law (uniform on the
L-inf ball and [0, 1]^d), N = 100 and PRBench's radii 0.03, 0.08, 0.1, 0.12; the arms timed
alternately.

  python benchmarks/speed/pr_speed.py --images 100 --rounds 3 --json

The network and images are torch_arms.py's (the committed small CNN in both frameworks, CIFAR-10's
first test images). patjax: `evaluation.evaluate_state` with evaluators=clean,pr and the preset's
settings, what `python -m patjax.evaluate --pr_preset=prbench` runs (one compiled pass: --batch
images at a time, --chunk samples of each per forward, split over one JAX device per core),
compiled by a warm-up run before the rounds. PRBench's loop: for each radius and image, its
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_arms  # noqa: E402
from epoch_throughput import emit  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--images", type=int, default=100, help="CIFAR-10 test images per round")
    p.add_argument("--batch", type=int, default=100, help="patjax: images per evaluation batch")
    p.add_argument("--chunk", type=int, default=5, help="patjax: samples per image per forward")
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds (patjax, theirs) timed")
    p.add_argument("--json", action="store_true", help="print one JSON line instead of a summary")
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


def prbench_counts(model_fns, state, net, split, batch: int, chunk: int):
    """(patjax arm, PRBench arm): each returns {radius: (PR over the images it keeps, per-image
    non-adversarial counts, -1 where it skips the image)}."""
    import numpy as np
    import torch

    from patjax.evaluators import pr
    from patjax.run import config as config_lib
    from patjax.run import evaluation

    prbench = torch_arms.reference("prbench_reference")
    overrides = {**pr.PRESETS["prbench"], "pr.chunk_size": chunk}
    settings = config_lib.default_evaluation_settings(
        "cifar10", overrides, evaluators="clean,pr", num_examples=len(split), batch_size=batch
    )
    radii = settings.evaluator_settings["pr"].epsilons
    assert radii == prbench.RADII and settings.evaluator_settings["pr"].samples == prbench.COUNT_PARTICLES

    def patjax_arm():
        per_image = {}
        results = evaluation.evaluate_state(settings, model_fns, state, split, progress=False, per_image_out=per_image)
        correct = per_image["clean.correct"]
        counts = np.where(correct[:, None], per_image["pr_uniform.counts"], -1)
        return {e: (results["pr"][repr(e)]["value"], counts[:, j]) for j, e in enumerate(radii)}

    images, labels = torch_arms.as_torch(split.images), torch.from_numpy(np.asarray(split.labels, np.int64))

    def their_arm():
        summary, counts = prbench.func_pr(images, labels, prbench.RADII, net)
        return {e: (summary[f"PR_{e}"][0], counts[e]) for e in prbench.RADII}

    return patjax_arm, their_arm


def main(argv=None):
    args = parse_args(argv)
    from patjax.core import devices

    devices.use_cpu_cores_as_devices()  # before JAX starts, as every patjax command line does
    import torch

    torch.manual_seed(0)  # PRBench's evaluate.py seeds torch's global generator with 0
    model_fns, state, net = torch_arms.committed_small_cnn()
    split = torch_arms.first_test_images(args.images)
    patjax_arm, their_arm = prbench_counts(model_fns, state, net, split, args.batch, args.chunk)
    outputs, timing = torch_arms.alternate(patjax_arm, their_arm, args.rounds, args.images)
    ours, theirs = outputs["patjax"], outputs["theirs"]
    kept = {e: (ours[e][1] >= 0) & (theirs[e][1] >= 0) for e in ours}
    out = {
        "images": args.images,
        "patjax_batch": args.batch,
        "patjax_chunk": args.chunk,
        **timing,
        "pr_clean_correct": {str(e): {"patjax": ours[e][0], "theirs": theirs[e][0]} for e in ours},
        "images_both_keep": int(kept[next(iter(kept))].sum()),
        "paired_z": {str(e): round(paired_z(ours[e][1][kept[e]], theirs[e][1][kept[e]], 100), 2) for e in ours},
    }
    emit(out, args.json)


if __name__ == "__main__":
    main()
