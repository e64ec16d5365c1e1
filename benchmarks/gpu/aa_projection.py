#!/usr/bin/env python3
"""How long patjax's standard AutoAttack (`--evaluators=aa`) would take on a GPU: a projection.

XLA counts the FLOPs of one forward pass (f) and of one input gradient (g: forward and backward
to the input, what every gradient attack step computes) of the model, per image. The attacks'
settings give how many of each an image costs in each pass, as patjax runs them (every image
of a pass through every iteration of its attack, finished ones masked, since a batch advances
together):

  APGD-CE   every image            steps x g
  APGD-T    robust after APGD-CE   targets x steps x g
  FAB-T     robust after APGD-T    targets x fab_steps x (g + f)
  Square    robust after FAB-T     queries x f
  masking   Square alone on every clean-correct image (queries x f) and APGD-CE at each
            larger eps on every image (factors x steps x g)

The fractions of images reaching each pass are inputs (`--fractions`): their default is the
upper bound 1, 1, 1, 1 (every image robust through the whole sequence); `--fractions` with a
model's measured fractions gives its expected cost. Time = FLOPs / (peak x utilization): the
H100 SXM's dense TF32 peak and, by default, the utilization range that PGD-20 and the PR pass
reached on one H100 (docs/performance.md, GPU section); AutoAttack itself has not been timed
on a GPU.

  python benchmarks/gpu/aa_projection.py --model resnet18 --num_images 10000
  python benchmarks/gpu/aa_projection.py --model resnet18 --fractions 0.82 0.44 0.43 0.43
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # patjax from this checkout, also where it is not installed


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="resnet18")
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--num_images", type=int, default=10_000)
    p.add_argument("--batch", type=int, default=256, help="batch at which XLA counts the FLOPs")
    p.add_argument(
        "--fractions",
        type=float,
        nargs=4,
        default=(1.0, 1.0, 1.0, 1.0),
        metavar=("CLEAN", "AFTER_APGD_CE", "AFTER_APGD_T", "AFTER_FAB_T"),
        help="fractions of the images classified correctly, and robust after APGD-CE, APGD-T and FAB-T",
    )
    p.add_argument("--peak_tflops", type=float, default=494.7, help="H100 SXM dense TF32")
    p.add_argument("--utilization", type=float, nargs=2, default=(0.30, 0.35))
    return p.parse_args(argv)


def model_flops(model_name: str, width: int, batch: int) -> tuple[float, float]:
    """(forward, input gradient) FLOPs per image, from XLA's cost analysis on this backend."""
    import jax
    import jax.numpy as jnp

    from patjax.models import networks

    model = networks.create_model(model_name, "cifar10", 10, **({"width": width} if model_name != "small_cnn" else {}))
    params, batch_stats = networks.init_variables(model, jax.random.PRNGKey(0))
    variables = {"params": params, "batch_stats": batch_stats}
    x = jnp.zeros((batch, 32, 32, 3), jnp.float32)

    def forward(v, x):
        return model.apply(v, x, train=False)

    def input_grad(v, x):
        return jax.grad(lambda z: jnp.sum(jax.nn.log_softmax(forward(v, z))[:, 0]))(x)

    def flops(fn):
        cost = jax.jit(fn).lower(variables, x).cost_analysis()
        cost = cost[0] if isinstance(cost, (list, tuple)) else cost
        return float(cost["flops"]) / batch

    return flops(forward), flops(input_grad)


def evaluations(s, fractions) -> dict:
    """(forwards, input gradients) per image of the data set, for each pass of `aa`."""
    clean, robust_ce, robust_t, robust_fab = fractions
    aa, apgd_steps = s["aa"], s["apgd"].steps
    factors = len(aa.masking_eps_factors)
    return {
        "apgd_ce": (0.0, 1.0 * apgd_steps),
        "apgd_t": (0.0, robust_ce * aa.target_classes * apgd_steps),
        "fab_t": (robust_t * aa.target_classes * aa.fab_steps,) * 2,
        "square": (robust_fab * aa.square_queries, 0.0),
        "masking": (clean * aa.square_queries, factors * apgd_steps),
    }


def main(argv=None):
    args = parse_args(argv)
    from patjax.run import config

    s = config.evaluation_settings(config.default_config()).evaluator_settings
    f, g = model_flops(args.model, args.width, args.batch)
    per_pass = {name: (fw * f + gr * g) * args.num_images for name, (fw, gr) in evaluations(s, args.fractions).items()}
    attacks_flop = sum(v for k, v in per_pass.items() if k != "masking")
    total_flop = attacks_flop + per_pass["masking"]
    rate = [args.peak_tflops * 1e12 * u for u in args.utilization]
    out = {
        "model": args.model,
        "forward_gflop_per_image": round(f / 1e9, 4),
        "input_grad_gflop_per_image": round(g / 1e9, 4),
        "fractions": list(args.fractions),
        "num_images": args.num_images,
        "pflop_per_pass": {k: round(v / 1e15, 3) for k, v in per_pass.items()},
        "pflop_attacks": round(attacks_flop / 1e15, 3),
        "pflop_with_masking_checks": round(total_flop / 1e15, 3),
        "assumed_peak_tflops": args.peak_tflops,
        "assumed_utilization": list(args.utilization),
        "projected_minutes_attacks": [round(attacks_flop / r / 60, 1) for r in reversed(rate)],
        "projected_minutes_with_masking_checks": [round(total_flop / r / 60, 1) for r in reversed(rate)],
    }
    print(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
