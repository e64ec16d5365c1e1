#!/usr/bin/env python3
"""Single-op rates of ResNet-18's 3x3 convolutions written different ways (the search for
a faster convolution on XLA:CPU). One JAX device; pin it to one core to compare with that
core's fp32 peak (benchmarks/README.md, "Where the time goes", gives the measuring machine's):

  taskset -c 0 python benchmarks/speed/conv_variants.py --batch 16

For each ResNet-18 stage (32x32x64, 16x16x128, 8x8x256, 4x4x512; a 3x3, stride-1, same-padded
convolution) it prints GFLOP/s of (FLOPs per pass counted as XLA's cost analysis and
profile_step.py count them: multiply-adds on real input elements, padding excluded, i.e.
2 x B x C x C x (3H - 2) x (3W - 2), so that the rates compare with profile_step.py's)
  lib           patjax.models.ops.conv2d forward (XLA's convolution, a YNNPACK fusion on CPU)
  shift         the same convolution as one matmul x @ [K_00 .. K_22] followed by a sum of
                the nine shifted slices of the product (no im2col buffer)
  lib_loop      forward + input gradient of ops.conv2d inside a 3-step fori_loop (the
                sampler's situation; counted as 2 passes per step)
  shift_loop    the same for the shifted-matmul form (plain autodiff)
  wgrad_lib     weight gradient by autodiff of ops.conv2d (what the update runs)
  wgrad_rows    weight gradient as three matmuls over (row-shifted, H-major) input columns
  wgrad_im2col  weight gradient as one matmul over a full im2col buffer
and, for scale, XLA's rate on the weight gradient's matmul shape (576 x 16384 x 64) with the
long axis contracted in place or pre-transposed.
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from patjax.models import ops


def seconds(fn, *args, reps=15):
    fn = jax.jit(fn)
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def conv_lib(x, k):
    return ops.conv2d(x, k, 1, 1)


def conv_shift(x, k):
    b, h, w, c = x.shape
    o = k.shape[-1]
    z = (x.reshape(b * h * w, c) @ k.transpose(2, 0, 1, 3).reshape(c, 9 * o)).reshape(b, h, w, 9, o)
    z = jnp.pad(z, ((0, 0), (1, 1), (1, 1), (0, 0), (0, 0)))
    return sum(z[:, i : i + h, j : j + w, 3 * i + j, :] for i in range(3) for j in range(3))


def in_loop(conv):
    def run(x, k):
        grad = jax.grad(lambda xa: jnp.sum(jnp.tanh(conv(xa, k))))
        return jax.lax.fori_loop(0, 3, lambda _, xa: xa + 1e-3 * grad(xa), x)

    return run


def wgrad_lib(x, g):
    k0 = jnp.zeros((3, 3, x.shape[-1], g.shape[-1]), x.dtype)
    return jax.vjp(lambda k: conv_lib(x, k), k0)[1](g)[0]


def wgrad_rows(x, g):
    b, h, w, c = x.shape
    o = g.shape[-1]
    xp = jnp.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))
    cols = jnp.concatenate([xp[:, :, j : j + w, :] for j in range(3)], axis=-1).transpose(1, 0, 2, 3)
    gt = g.transpose(1, 0, 2, 3).reshape(h * b * w, o)
    rows = [
        jax.lax.dot_general(cols[i : i + h].reshape(h * b * w, 3 * c), gt, (((0,), (0,)), ((), ()))) for i in range(3)
    ]
    return jnp.stack(rows).reshape(3, 3, c, o)


def wgrad_im2col(x, g):
    b, h, w, c = x.shape
    xp = jnp.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))
    cols = jnp.concatenate([xp[:, i : i + h, j : j + w, :] for i in range(3) for j in range(3)], axis=-1)
    return jax.lax.dot_general(
        cols.reshape(b * h * w, 9 * c), g.reshape(b * h * w, -1), (((0,), (0,)), ((), ()))
    ).reshape(3, 3, c, -1)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batch", type=int, default=16, help="per-device batch (32 split over 2 cores: 16)")
    a = p.parse_args(argv)
    rng = np.random.default_rng(0)
    print(f"batch {a.batch}, {jax.device_count()} device(s), GFLOP/s (padding excluded)")
    for size, channels in [(32, 64), (16, 128), (8, 256), (4, 512)]:
        x = jnp.asarray(rng.standard_normal((a.batch, size, size, channels)), jnp.float32)
        k = jnp.asarray(rng.standard_normal((3, 3, channels, channels)) * 0.05, jnp.float32)
        g = jnp.asarray(rng.standard_normal((a.batch, size, size, channels)), jnp.float32)
        # Every variant computes the same thing (checked here before it is timed).
        np.testing.assert_allclose(conv_shift(x, k), conv_lib(x, k), rtol=1e-3, atol=1e-3)
        for variant in (wgrad_rows, wgrad_im2col):
            np.testing.assert_allclose(variant(x, g), wgrad_lib(x, g), rtol=2e-3, atol=2e-2)
        # Valid taps per axis of a 3-wide same-padded window over n positions: 3n - 2.
        gflop = 2 * a.batch * channels * channels * (3 * size - 2) ** 2 / 1e9
        xla_gflop = jax.jit(conv_lib).lower(x, k).cost_analysis()["flops"] / 1e9
        assert abs(gflop - xla_gflop) <= 1e-6 * gflop, (gflop, xla_gflop)  # the same count as XLA's
        rates = {
            name: round(passes * gflop / seconds(fn, *args), 1)
            for name, fn, args, passes in [
                ("lib", conv_lib, (x, k), 1),
                ("shift", conv_shift, (x, k), 1),
                ("lib_loop", in_loop(conv_lib), (x, k), 6),
                ("shift_loop", in_loop(conv_shift), (x, k), 6),
                ("wgrad_lib", wgrad_lib, (x, g), 1),
                ("wgrad_rows", wgrad_rows, (x, g), 1),
                ("wgrad_im2col", wgrad_im2col, (x, g), 1),
            ]
        }
        print(f"{size:2d}x{size:<2d}x{channels:<3d}", "  ".join(f"{n} {r:6.1f}" for n, r in rates.items()), flush=True)
    m, kk, n = 576, 16384, 64
    lhs_long_first = jnp.ones((kk, m), jnp.float32)
    lhs = jnp.ones((m, kk), jnp.float32)
    rhs = jnp.ones((kk, n), jnp.float32)
    gflop = 2 * m * kk * n / 1e9
    in_place = gflop / seconds(lambda u, v: jax.lax.dot_general(u, v, (((0,), (0,)), ((), ()))), lhs_long_first, rhs)
    pre_t = gflop / seconds(lambda u, v: u @ v, lhs, rhs)
    print(f"matmul {m}x{kk}x{n}: long axis contracted in place {in_place:.1f}, pre-transposed {pre_t:.1f}")


if __name__ == "__main__":
    main()
