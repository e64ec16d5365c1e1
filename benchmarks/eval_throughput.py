#!/usr/bin/env python3
"""Evaluation rates (images/s) of patjax's evaluators on random CIFAR-shaped data and a randomly
initialized network, one figure per pass (clean, PGD-20, PR at each perturbation law).

  python benchmarks/eval_throughput.py --model resnet18 --batch 500 --batches 1 5 --json

The evaluation is `patjax.api.evaluate` (what `python -m patjax.evaluate` runs) called on the
first A batches of images (a warm-up, not timed), then on A and on B batches; each pass's rate is
the difference in images over the difference in its wall time, so that the per-call cost of
building the compiled functions (a compile, or a load from JAX's persistent cache once the
warm-up has filled it), which both timed calls pay alike, cancels. With the default settings
the PR pass evaluates N = --pr-samples perturbations at each of the four epsilons of Appendix E
per image (400 forward passes at N = 100).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from epoch_throughput import emit  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="resnet18", help="resnet18 | small_cnn | wrn50_2")
    p.add_argument("--width", type=int, default=64, help="ResNet/WRN stem width (ignored by small_cnn)")
    p.add_argument("--batch", type=int, default=500, help="images per evaluation batch")
    p.add_argument(
        "--batches", type=int, nargs=2, default=(1, 3), metavar=("A", "B"), help="batches in the two calls (A < B)"
    )
    p.add_argument("--evaluators", default="clean,pgd20,pr")
    p.add_argument("--pr-samples", type=int, default=100, help="N")
    p.add_argument("--pr-distributions", default="uniform", help="comma-separated laws (uniform,gaussian,pdis)")
    p.add_argument("--json", action="store_true", help="print one JSON line instead of a table")
    return p.parse_args(argv)


def run(args) -> dict:
    import jax
    import numpy as np

    from patjax import api, models

    a, b = args.batches
    if not 0 < a < b:
        raise SystemExit("--batches takes A < B, both positive")
    kwargs = {} if args.model == "small_cnn" else {"width": args.width}
    module = models.create_model(args.model, "cifar10", 10, **kwargs)
    params, batch_stats = models.init_variables(module, jax.random.PRNGKey(0))
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (b * args.batch, 32, 32, 3), dtype=np.uint8)
    labels = rng.integers(0, 10, len(images)).astype(np.int32)
    settings = dict(pr_samples=args.pr_samples, pr_distributions=tuple(args.pr_distributions.split(",")))

    walls, totals = {}, {}
    for count in (a, a, b):  # the first call warms up the persistent compilation cache, if one is set
        n = count * args.batch
        t0 = time.perf_counter()
        results = api.evaluate(
            (module, {"params": params, "batch_stats": batch_stats}),
            images[:n],
            labels[:n],
            evaluators=args.evaluators,
            batch_size=args.batch,
            **settings,
        )
        totals[count] = time.perf_counter() - t0
        walls[count] = results["evaluator_wall_time_s"]
    rates = {
        name: round((b - a) * args.batch / (walls[b][name] - walls[a][name]), 2)
        for name in walls[b]
        if walls[b][name] > walls[a][name]
    }
    device = jax.devices()[0]
    return {
        "impl": "patjax",
        "model": args.model,
        "width": args.width if args.model != "small_cnn" else None,
        "batch": args.batch,
        "batches": [a, b],
        "pr_samples": args.pr_samples,
        "pr_epsilons": list(results["settings"]["pr_epsilons"]),
        "images_per_s": rates,
        "pass_wall_s": {str(k): v for k, v in walls.items()},
        "call_wall_s": {str(k): round(v, 2) for k, v in totals.items()},
        "backend": jax.default_backend(),
        "device": device.device_kind,
        "device_count": jax.device_count(),
        "jax": jax.__version__,
        "load_average_1m": round(os.getloadavg()[0], 2),
    }


def main(argv=None):
    args = parse_args(argv)
    from patjax import cli

    cli.use_cpu_cores_as_devices()  # before JAX starts, as every patjax command line does
    emit(run(args), args.json)


if __name__ == "__main__":
    main()
