#!/usr/bin/env python3
"""Evaluation rates (images/s) of patjax's evaluators on random CIFAR-shaped data and a randomly
initialized network, one figure per pass (clean, PGD-20, PR at each perturbation law).

  python benchmarks/speed/eval_throughput.py --model resnet18 --batch 500 --batches 1 5 --json

Each pass is the evaluation's own (`patjax.evaluators`' batch function and
`evaluators.batches.evaluate_pass`, what `python -m patjax.evaluate` runs), built once and run
on the first A batches (a warm-up that compiles it), then on A and on B batches, timed here
without rounding; its rate is the difference in images over the difference in wall time, so
that the per-call cost left after compiling cancels. With the default settings the PR pass
evaluates N = --pr-samples perturbations at each of the four epsilons of Appendix E per image
(400 forward passes at N = 100). Passes on a subset of the images (AutoAttack's) are not timed.
"""

from __future__ import annotations

import argparse
import os
import sys

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

    from patjax import api, evaluators
    from patjax.evaluators import batches
    from patjax.models import networks
    from patjax.run import config as config_lib

    a, b = args.batches
    if not 0 < a < b:
        raise SystemExit("--batches takes A < B, both positive")
    kwargs = {} if args.model == "small_cnn" else {"width": args.width}
    module = networks.create_model(args.model, "cifar10", 10, **kwargs)
    params, batch_stats = networks.init_variables(module, jax.random.PRNGKey(0))
    model_fns, state = api.as_model((module, {"params": params, "batch_stats": batch_stats}))
    rng = np.random.default_rng(0)
    split = api.as_split(
        rng.integers(0, 256, (b * args.batch, 32, 32, 3), dtype=np.uint8), rng.integers(0, 10, b * args.batch)
    )
    settings = config_lib.default_evaluation_settings(
        "cifar10",
        {"pr.samples": args.pr_samples, "pr.distributions": tuple(args.pr_distributions.split(","))},
        evaluators=args.evaluators,
        batch_size=args.batch,
    )
    rates, walls = {}, {}
    for name in settings.evaluators:
        evaluator = evaluators.REGISTRY[name]
        if evaluator.subset is not None:
            continue
        s = settings.evaluator_settings.view(evaluator)
        for pass_name in evaluator.passes(s):
            batch_fn = evaluator.make_batch_fn(model_fns, s, pass_name)
            timed = [
                batches.evaluate_pass(batch_fn, state, split, count * args.batch, args.batch, pass_name, False)[1]
                for count in (a, a, b)
            ]
            walls[pass_name] = [round(t, 4) for t in timed]
            rates[pass_name] = round((b - a) * args.batch / (timed[2] - timed[1]), 2)
    device = jax.devices()[0]
    return {
        "impl": "patjax",
        "model": args.model,
        "width": args.width if args.model != "small_cnn" else None,
        "batch": args.batch,
        "batches": [a, b],
        "pr_samples": args.pr_samples,
        "pr_epsilons": list(settings.evaluator_settings["pr"].epsilons),
        "pr_chunk_size": settings.evaluator_settings["pr"].chunk_size,
        "images_per_s": rates,
        "pass_wall_s": walls,  # per pass: warm-up (with compile), A batches, B batches
        "backend": jax.default_backend(),
        "device": device.device_kind,
        "device_count": jax.device_count(),
        "jax": jax.__version__,
        "load_average_1m": round(os.getloadavg()[0], 2),
    }


def main(argv=None):
    args = parse_args(argv)
    from patjax.core import devices

    devices.use_cpu_cores_as_devices()  # before JAX starts, as every patjax command line does
    emit(run(args), args.json)


if __name__ == "__main__":
    main()
