#!/usr/bin/env python3
"""Where one AutoAttack pass of patjax's `aa` spends its time once compiled: the pass run twice
(compiling, then warm), then traced by `jax.profiler` a third time; XLA:CPU's ops on the host
threads grouped by class (convolutions, fusions, layout copies, collectives, sort, ...) with
their share of the op time and their count, and the slowest ops by name.

  python benchmarks/speed/profile_attack.py --attack fab_t --images 32 [--workdir RUN] [--norm linf]

Shares and counts hold under load; the seconds do not (docs/performance.md). The op names are
the optimized HLO's (XLA_FLAGS=--xla_dump_to=DIR --xla_dump_hlo_as_text writes it, to read an
op's metadata).
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import re
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from profile_step import busy_ns, trace_events  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HLO_OP = re.compile(r"^[a-z][\w\-]*(\.\d+)*$")  # an HLO instruction's name, not a Python or runtime span


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workdir", default=os.path.join(REPO, "docs/results/table1_cpu/runs/cifar10_small_cnn/pat_s0"))
    p.add_argument("--attack", default="apgd_ce", choices=("apgd_ce", "apgd_t", "fab_t", "square"))
    p.add_argument("--images", type=int, default=32, help="the first CIFAR-10 test images")
    p.add_argument("--norm", default="linf", choices=("linf", "l2"))
    p.add_argument("--top", type=int, default=10)
    return p.parse_args(argv)


def op_class(name: str) -> str:
    base = re.sub(r"[.\d]+$", "", name)
    for key, cls in (("ynn", "conv"), ("convolution", "conv"), ("dot", "matmul"), ("sort", "sort")):
        if key in base:
            return cls
    if "transpose" in base or "copy" in base:
        return "layout"
    if base.startswith(("all-", "collective", "reduce-scatter")):
        return "collective: " + base
    return "fusion" if "fusion" in base else base


def main(argv=None):
    args = parse_args(argv)
    from patjax.core import devices

    devices.use_cpu_cores_as_devices()
    import jax
    from jax.profiler import ProfileData

    from patjax.data import cifar
    from patjax.evaluators import autoattack, batches
    from patjax.run import workdir as workdir_lib

    _, model_fns, state = workdir_lib.restore(args.workdir)
    overrides = {"attack.norm": args.norm, "attack.eps": 8 / 255 if args.norm == "linf" else 0.5}
    settings = workdir_lib.evaluation_settings(
        args.workdir, overrides, evaluators="aa", num_examples=args.images, batch_size=250
    )
    split = cifar.load_split("cifar10", "test", cifar.find_data_dir())
    split = cifar.Split(split.images[: args.images], split.labels[: args.images])
    view, name = settings.evaluator_settings.view(autoattack.EVALUATOR), f"aa_{args.attack}"
    fn, rounds = autoattack.make_batch_fn(model_fns, view, name), autoattack.make_rounds(model_fns, view, name)

    def run_pass():
        start = time.perf_counter()
        batches.evaluate_pass(fn, state, split, args.images, 250, name, False, rounds=rounds)
        return time.perf_counter() - start

    first, second = run_pass(), run_pass()
    with tempfile.TemporaryDirectory() as trace_dir:
        jax.profiler.start_trace(trace_dir)
        traced = run_pass()
        jax.profiler.stop_trace()
        trace = max(glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True), key=os.path.getmtime)
        data = ProfileData.from_file(trace)
    seconds, counts, by_op, spans = collections.Counter(), collections.Counter(), collections.Counter(), []
    for op, _, start, duration in trace_events(data):
        if not op or not HLO_OP.match(op) or op.startswith("thunk"):
            continue
        cls = op_class(op)
        seconds[cls] += duration / 1e9
        counts[cls] += 1
        by_op[op] += duration / 1e9
        spans.append((start, duration))
    total = sum(seconds.values())
    print(
        json.dumps(
            {
                "attack": args.attack,
                "images": args.images,
                "devices": jax.device_count(),
                "wall_s": {"compiling": round(first, 2), "second": round(second, 2), "traced": round(traced, 2)},
                "busy_s": round(busy_ns(spans) / 1e9, 2),
                "classes": {
                    cls: {"share": round(s / total, 3), "ops": counts[cls]} for cls, s in seconds.most_common()
                },
                "top_ops": {op: round(s / total, 3) for op, s in by_op.most_common(args.top)},
                "load_average_1m": round(os.getloadavg()[0], 2),
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
