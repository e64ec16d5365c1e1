#!/usr/bin/env python3
"""Throughput of patjax's compiled train step (the whole step of Algorithm 2: batch gather,
augmentation, T Langevin steps, SNIS-weighted loss, SGD update) on random CIFAR-shaped data.

  python benchmarks/speed/epoch_throughput.py --model resnet18 --batch 32 --langevin-steps 10 --iters 3 --json

Reports compile time separately from the timed steps (one warm-up step, then the median of
--iters steps), images/s, the projected seconds per 50,000-image epoch, FLOPs per image from
XLA's cost analysis, achieved FLOP/s (and utilization against --peak-gflops when given),
peak memory from the compiled executable's memory analysis, backend and device. Runs
unchanged on CPU and GPU; flags that overlap benchmarks/speed/torch_pat_peer.py have its
names (--batch, --langevin-steps, --width, --iters).

FLOPs: XLA's cost analysis counts a while-loop body once whatever its trip count, so the
step's FLOPs are assembled as F(T) + (T - 1) * (F'(1) - F'(0)): the step as timed, its sampler
loop counted once, plus T - 1 more sampler steps, one sampler step being the difference between
the step lowered with one and with no Langevin step from the clean start (F'; lowering only, no
extra compilation). Other loops (PGD's attack steps in the pgd method, say) stay counted once.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

EPOCH_IMAGES = 50_000


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--method", default="pat", help="a name in patjax.methods.REGISTRY")
    p.add_argument("--model", default="resnet18", help="resnet18 | small_cnn | wrn50_2")
    p.add_argument("--width", type=int, default=64, help="ResNet/WRN stem width (ignored by small_cnn)")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--langevin-steps", type=int, default=10, help="T")
    p.add_argument(
        "--iters", type=int, default=3, help="timed steps after --warmup steps; 0: compile, FLOPs and memory only"
    )
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument(
        "--langevin-init",
        default="uniform",
        choices=("uniform", "clean"),
        help="the sampler's start: 'uniform' (Algorithm 1) or 'clean' (the opt-in cheaper sampler, start at x)",
    )
    p.add_argument("--dataset", default="cifar10")
    p.add_argument("--compute-dtype", default="float32", choices=("float32", "bfloat16"))
    p.add_argument(
        "--conv-input-grad",
        default="auto",
        choices=("auto", "reordered", "autodiff"),
        help="patjax.models.ops convolution input gradient (auto: reordered kernel on CPU only)",
    )
    p.add_argument(
        "--cpu-devices",
        type=int,
        default=0,
        help="JAX CPU devices the batch is split over (0: one per usable core, as main.py "
        "does; 1: a single device, plain JAX's default)",
    )
    p.add_argument(
        "--peak-gflops",
        type=float,
        default=0.0,
        help="device peak for the utilization figure (e.g. 310 for this 2-core CPU, fp32)",
    )
    p.add_argument("--no-flops", action="store_true", help="skip the FLOP count (saves two lowerings)")
    p.add_argument("--json", action="store_true", help="print one JSON line instead of a table")
    return p.parse_args(argv)


def build(args, langevin_steps):
    """(jitted step, state, images, labels, permutation) for the benchmark config."""
    import numpy as np

    from patjax.core import sharding
    from patjax.run import config as config_lib
    from patjax.run import train

    cfg = config_lib.default_config()
    cfg.method = args.method
    cfg.model = args.model
    cfg.model_width = args.width
    cfg.dataset = args.dataset
    cfg.batch_size = args.batch
    cfg.compute_dtype = args.compute_dtype
    cfg.langevin.steps = langevin_steps
    cfg.langevin.init = args.langevin_init
    cfg.num_epochs = 1
    settings = config_lib.train_settings(cfg)

    steps_per_epoch = 4  # random data: 4 batches' worth of uint8 images
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (steps_per_epoch * args.batch, 32, 32, 3), dtype=np.uint8)
    labels = rng.integers(0, 10 if args.dataset == "cifar10" else 100, len(images)).astype(np.int32)
    mesh = sharding.make_mesh(args.batch)  # as train.train_run does
    _, state, step_fn = train.create_step(settings, steps_per_epoch, mesh)
    permutation = np.arange(len(images), dtype=np.int32)
    state, images, labels, permutation = sharding.place_on_mesh(mesh, state, images, labels, permutation)
    return step_fn, state, images, labels, permutation


def _flops(lowered) -> float:
    cost = lowered.cost_analysis()
    if isinstance(cost, (list, tuple)):
        cost = cost[0]
    return float(cost.get("flops", 0.0)) if cost else 0.0


def step_flops(args, lowered, placed) -> float:
    """FLOPs of one step at T = args.langevin_steps, `lowered` being that step lowered.

    The cost analysis counts the sampler's loop body once, so T - 1 sampler steps are added,
    each counted as the difference between the step at T = 1 and at T = 0. Those two are lowered
    from the clean start: PAT from the uniform start with no step is refused (its samples would
    not depend on x), and the start is outside the loop, so the body it adds is the same."""
    total = _flops(lowered)
    if args.langevin_steps > 1:
        clean = argparse.Namespace(**{**vars(args), "langevin_init": "clean"})
        f0, f1 = (_flops(build(clean, t)[0].lower(*placed)) for t in (0, 1))
        total += (args.langevin_steps - 1) * (f1 - f0)
    return total


def peak_memory_bytes(compiled) -> dict:
    """Peak bytes of one step from the executable's buffer assignment (arguments + outputs +
    temporaries, less donated/aliased buffers); independent of what else the process holds."""
    m = compiled.memory_analysis()
    if m is None:
        return {}
    peak = m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes - m.alias_size_in_bytes
    return {
        "peak_memory_bytes": int(peak),
        "temp_memory_bytes": int(m.temp_size_in_bytes),
        "argument_memory_bytes": int(m.argument_size_in_bytes),
    }


def run(args) -> dict:
    import jax

    from patjax.models import ops

    ops.set_conv_input_grad_mode(args.conv_input_grad)
    T = args.langevin_steps
    step_fn, state, images, labels, permutation = build(args, T)

    t0 = time.perf_counter()
    lowered = step_fn.lower(state, images, labels, permutation)
    lower_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    compiled = lowered.compile()
    compile_s = time.perf_counter() - t0

    flops_per_image = None
    if not args.no_flops:
        # The GPU backend's cost analysis of a lowered program counts no FLOPs: None, not 0; the
        # count is the program's, so the same flags with --iters 0 on a CPU give it.
        flops_per_image = step_flops(args, lowered, (state, images, labels, permutation)) / args.batch or None

    times, ends = [], []
    for i in range((args.warmup + args.iters) if args.iters > 0 else 0):
        t0 = time.perf_counter()
        state, metrics = compiled(state, images, labels, permutation)
        jax.block_until_ready((state, metrics))
        if i >= args.warmup:
            times.append(time.perf_counter() - t0)
            # The wall clock, comparable across processes: two benchmarks sharing a device are
            # compared only over the steps both ran at the same time.
            ends.append(time.time())
    median = statistics.median(times) if times else float("nan")
    images_per_s = args.batch / median
    device = jax.devices()[0]
    result = {
        "impl": "patjax",
        "method": args.method,
        "model": args.model,
        "width": args.width if args.model != "small_cnn" else None,
        "batch": args.batch,
        "langevin_steps": T,
        "langevin_init": args.langevin_init,
        "compute_dtype": args.compute_dtype,
        "conv_input_grad": ops.conv_input_grad_mode(),
        "lower_s": round(lower_s, 3),
        "compile_s": round(compile_s, 3),
        "median_step_s": round(median, 4) if times else None,
        "step_times_s": [round(t, 4) for t in times],
        "step_end_unix": [round(t, 4) for t in ends],
        "images_per_s": round(images_per_s, 3) if times else None,
        "epoch_s_projected": round(EPOCH_IMAGES / images_per_s, 1) if times else None,
        "flops_per_image": flops_per_image,
        "achieved_gflops": round(flops_per_image * images_per_s / 1e9, 2) if flops_per_image and times else None,
        "utilization": (
            round(flops_per_image * images_per_s / 1e9 / args.peak_gflops, 4)
            if flops_per_image and args.peak_gflops and times
            else None
        ),
        **peak_memory_bytes(compiled),
        "backend": jax.default_backend(),
        "device": device.device_kind,
        "device_count": jax.device_count(),
        "mesh_devices": int(state.step.sharding.num_devices),
        "jax": jax.__version__,
    }
    stats = device.memory_stats() if hasattr(device, "memory_stats") else None
    if stats and "peak_bytes_in_use" in stats:
        result["device_peak_bytes_in_use"] = int(stats["peak_bytes_in_use"])
    result["peak_memory_bytes"] = result.get("peak_memory_bytes")
    result["load_average_1m"] = round(os.getloadavg()[0], 2)
    return result


def emit(result: dict, as_json: bool) -> None:
    """One JSON line, or one `key: value` line per figure."""
    if as_json:
        print(json.dumps(result))
    else:
        for k, v in result.items():
            print(f"{k:>24}: {v}")


def main(argv=None):
    args = parse_args(argv)
    if args.cpu_devices:
        os.environ["PATJAX_CPU_DEVICES"] = str(args.cpu_devices)
    from patjax.core import devices

    devices.use_cpu_cores_as_devices()  # before JAX starts, as every patjax command line does
    emit(run(args), args.json)


if __name__ == "__main__":
    main()
