#!/usr/bin/env python3
"""Do the compiled step's convolutions run on tensor cores? One JSON line per precision setting.

  python benchmarks/gpu/gpu_convolutions.py --model resnet18 --batch 256 --langevin-steps 100

Compiles patjax's train step (benchmarks/speed/epoch_throughput.py's `build`; its flags) and reads the
optimized HLO: on a GPU each convolution is a cuDNN custom call whose backend config names the
math mode the autotuner chose, counted per (result dtype, math mode). cuDNN's DEFAULT_MATH
permits tensor cores (TF32 for float32 operands on Ampere and later) and FMA_MATH forbids them,
so the count alone may not settle it; the step time at JAX's default matmul precision against
'highest' (which turns TF32 off) does: their ratio is what the tensor cores are worth to the
whole step.
"""

from __future__ import annotations

import collections
import json
import re
import statistics
import time

RESULT_DTYPE = re.compile(r"= \(?(\w+)\[")
TARGET = re.compile(r'custom_call_target="([^"]+)"')
MATH = re.compile(r'"math_type"\s*:\s*"(\w+)"')
PRECISION = re.compile(r"operand_precision=\{([\w,]+)\}")


def convolutions(hlo_text: str) -> dict:
    """{'<dtype> <math mode> precision=<operand precision>': count} over the cuDNN convolution
    calls of an optimized HLO module; the operand precision is 'default' where the call names
    none ('highest' is what turns TF32 off for float32 operands)."""
    counts = collections.Counter()
    for line in hlo_text.splitlines():
        if 'custom_call_target="__cudnn$conv' in line:
            dtype, math, precision = RESULT_DTYPE.search(line), MATH.search(line), PRECISION.search(line)
            counts[
                f"{dtype.group(1) if dtype else 'unknown'} {math.group(1) if math else 'unknown'}"
                f" precision={precision.group(1) if precision else 'default'}"
            ] += 1
    return dict(counts)


def custom_calls(hlo_text: str) -> dict:
    """{custom-call target: count}: what else the step calls (GEMM libraries, fusions)."""
    return dict(collections.Counter(TARGET.findall(hlo_text)))


def main(argv=None):
    import os
    import sys

    import jax

    # the step it compiles is the speed benchmark's own (benchmarks/speed/epoch_throughput.py)
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "speed"))
    import epoch_throughput

    from patjax.models import ops

    # epoch_throughput's flags (--model, --width, --batch, --langevin-steps, --compute-dtype, --iters,
    # --conv-input-grad); --warmup is one step here.
    args = epoch_throughput.parse_args(argv)
    if args.iters < 1:
        raise SystemExit("--iters must be >= 1: the step is timed")
    ops.set_conv_input_grad_mode(args.conv_input_grad)
    for precision in ("default", "highest"):
        with jax.default_matmul_precision(None if precision == "default" else precision):
            step_fn, state, images, labels, permutation = epoch_throughput.build(args, args.langevin_steps)
            compiled = step_fn.lower(state, images, labels, permutation).compile()
            times = []
            for i in range(1 + args.iters):
                t0 = time.perf_counter()
                state, metrics = compiled(state, images, labels, permutation)
                jax.block_until_ready((state, metrics))
                if i:
                    times.append(time.perf_counter() - t0)
        print(
            json.dumps(
                {
                    "model": args.model,
                    "batch": args.batch,
                    "langevin_steps": args.langevin_steps,
                    "compute_dtype": args.compute_dtype,
                    "matmul_precision": precision,
                    "convolutions": convolutions(compiled.as_text()),
                    "custom_calls": custom_calls(compiled.as_text()),
                    "first_convolution": next(
                        (line.strip()[:600] for line in compiled.as_text().splitlines() if "__cudnn$conv" in line), None
                    ),
                    "median_step_s": round(statistics.median(times), 4),
                    "device": jax.devices()[0].device_kind,
                    "jax": jax.__version__,
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
