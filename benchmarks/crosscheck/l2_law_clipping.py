#!/usr/bin/env python3
"""How far the PR law `uniform_l2` is from uniform on the L2 ball intersected with [0, 1]^d, on
real images: the share of each sample's pixels that the clip to [0, 1] moves, and of its squared
L2 norm that the clip removes, at each radius (`laws.perturbed_samples`, the evaluation's
own draws).

  python benchmarks/crosscheck/l2_law_clipping.py --num_examples=1000 --samples=10 --epsilons=0.5,1,2,4,8

Where the clip moves nothing the sample is a uniform point of the ball, which lies in the box:
the two laws differ only through the clipped pixels. One JSON line per radius: the mean over
images and samples of the fraction of pixels clipped, the fraction of samples with any pixel
clipped, and the mean fraction of |delta|^2 the clip removes.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # patjax from this checkout


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--num_examples", type=int, default=1000, help="the first N CIFAR-10 test images")
    p.add_argument("--samples", type=int, default=10, help="samples per image")
    p.add_argument("--epsilons", default="0.5,1,2,4,8")
    p.add_argument("--data_dir", default=None)
    args = p.parse_args(argv)

    import jax
    import jax.numpy as jnp
    import numpy as np

    from patjax.data import cifar
    from patjax.pat import laws

    split = cifar.load_split("cifar10", "test", args.data_dir)
    epsilons = [float(e) for e in args.epsilons.split(",")]
    x_all = cifar.to_float(split.images[: args.num_examples])
    sample = jax.jit(
        lambda x, i: laws.perturbed_samples(
            jax.random.PRNGKey(0), x, i, jnp.arange(args.samples), jnp.asarray(epsilons), "uniform_l2"
        )
    )
    clipped, any_clipped, energy_lost = [], [], []
    for start in range(0, len(x_all), 100):
        x = x_all[start : start + 100]
        out = np.asarray(sample(x, jnp.arange(start, start + len(x))), np.float64)  # (E, B, S, H, W, C)
        unclipped = (
            np.asarray(x, np.float64)[None, :, None]
            + np.asarray(epsilons)[:, None, None, None, None, None]
            * (
                np.asarray(
                    laws.noise_batch(
                        jax.random.PRNGKey(0),
                        jnp.arange(start, start + len(x)),
                        jnp.arange(args.samples),
                        x.shape[1:],
                        "uniform_l2",
                    ),
                    np.float64,
                )[None]
            )
        )
        moved = np.abs(out - unclipped) > 1e-6
        clipped.append(moved.mean(axis=(3, 4, 5)))
        any_clipped.append(moved.any(axis=(3, 4, 5)))
        full = ((unclipped - np.asarray(x, np.float64)[None, :, None]) ** 2).sum(axis=(3, 4, 5))
        kept = ((out - np.asarray(x, np.float64)[None, :, None]) ** 2).sum(axis=(3, 4, 5))
        energy_lost.append(1 - kept / full)
    clipped, any_clipped, energy_lost = (np.concatenate(a, axis=1) for a in (clipped, any_clipped, energy_lost))
    for k, eps in enumerate(epsilons):
        print(
            json.dumps(
                {
                    "eps": eps,
                    "images": int(clipped.shape[1]),
                    "samples_per_image": args.samples,
                    "pixels_clipped": round(float(clipped[k].mean()), 5),
                    "samples_with_a_pixel_clipped": round(float(any_clipped[k].mean()), 5),
                    "share_of_squared_norm_removed": round(float(energy_lost[k].mean()), 5),
                }
            )
        )


if __name__ == "__main__":
    main()
