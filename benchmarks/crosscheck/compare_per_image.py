#!/usr/bin/env python3
"""Two evaluations of one model, image by image: where their per-image outcomes differ.

  python benchmarks/crosscheck/compare_per_image.py A/eval/per_image.npz B/eval/per_image.npz

For the images both evaluated (matched by `image_index`), each per-image array the two share
is compared: booleans and counts (clean.correct, pgd20.robust, pr_<law>.counts, ...) exactly,
as the number of images that differ and the net change in the figure's total; float arrays
(losses) as the largest absolute difference. The use: the same model evaluated on two machines
or backends (a GPU's evaluation, which runs fp32 convolutions as TF32 by JAX's default
precision, against the CPU's fp32), where every figure is a count and any flip shows here.
Reads the files only (numpy): nothing of patjax is imported.
"""

import argparse
import sys

import numpy as np


def compare(a: dict, b: dict) -> list:
    """Rows (name, images, differing, net, max_abs) for every array both files hold per image."""
    common, ia, ib = np.intersect1d(a["image_index"], b["image_index"], return_indices=True)
    rows = []
    for name in sorted(set(a) & set(b)):
        if name == "image_index" or name.startswith("meta.") or a[name].ndim == 0:
            continue
        x, y = a[name][ia], b[name][ib]
        if x.shape != y.shape:
            rows.append((name, len(common), None, None, None))
        elif x.dtype.kind in "biu":
            per_image = (x != y).reshape(len(common), -1).any(axis=1)
            net = int(y.astype(np.int64).sum() - x.astype(np.int64).sum())
            rows.append((name, len(common), int(per_image.sum()), net, None))
        else:
            rows.append((name, len(common), None, None, float(np.max(np.abs(x - y))) if x.size else 0.0))
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("a", help="the first per_image.npz")
    p.add_argument("b", help="the second per_image.npz")
    args = p.parse_args(argv)
    try:
        a, b = dict(np.load(args.a)), dict(np.load(args.b))
    except (OSError, ValueError) as error:
        print(f"compare_per_image: {error}", file=sys.stderr)
        return 1
    if "image_index" not in a or "image_index" not in b:
        print("compare_per_image: both files need the image_index array of patjax's per_image.npz", file=sys.stderr)
        return 1
    rows = compare(a, b)
    print(f"{'array':<24} {'images':>7} {'differ':>7} {'net (B - A)':>12} {'max |B - A|':>12}")
    for name, n, differ, net, max_abs in rows:
        cells = [f"{differ:>7}" if differ is not None else f"{'':>7}", f"{net:>+12}" if net is not None else " " * 12]
        cells.append(f"{max_abs:>12.3g}" if max_abs is not None else "")
        shape_note = "" if differ is not None or max_abs is not None else "  shapes differ"
        print(f"{name:<24} {n:>7} " + " ".join(cells) + shape_note)
    return 0


if __name__ == "__main__":
    sys.exit(main())
