#!/usr/bin/env python3
"""Where the compiled train step spends its time: a per-op profile grouped by what each op does.

  python benchmarks/profile_step.py --model resnet18 --batch 32 --langevin-steps 10

Builds the same step as epoch_throughput.py (random CIFAR-shaped data, one JAX CPU device per
core unless --cpu-devices says otherwise), runs --warmup steps, traces one step with
`jax.profiler`, and sums the trace's per-op durations over every thread. Each op is looked up
in the compiled HLO (`compiled.as_text()`) and put in a group:

  phase      'sampler' for ops inside the Langevin loop (their op_name has `while/body`:
             the `fori_loop` of samplers.langevin_sample), 'update' for the rest;
  kind       convolutions by direction (forward, input gradient, weight gradient -- the last
             recognised by a window larger than its output: the window is the output
             gradient's spatial size and the output the kernel's)
             and by path (`library`: XLA:CPU's YNNPACK fusions; `generic`: XLA's own loop),
             then layout transposes, collectives (all-reduce between devices), elementwise
             fusions and the rest.

For convolutions it also reports FLOPs (2 x multiply-adds that touch a real input element,
padding and the zeros of a stride's transposed convolution excluded, as XLA's cost analysis
counts them: `xla_cost_analysis_gflop_per_device` is printed alongside as the check) and
GFLOP/s per op-thread: an op runs on one core, so one core's fp32 peak is the ceiling of
that figure (benchmarks/README.md, "Where the time goes", gives it for the measuring
machine). Times are per device and per step
(the trace's total divided by the device count): with N devices each runs the same program
on its share of the batch at the same time.

CPU only in its grouping (on a GPU the trace has kernel names, not HLO op names).
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import re
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--method", default="pat")
    p.add_argument("--model", default="resnet18")
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--langevin-steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--cpu-devices", type=int, default=0, help="as in epoch_throughput.py")
    p.add_argument("--top", type=int, default=12, help="also list the N slowest convolutions")
    p.add_argument("--json", action="store_true", help="print one JSON line instead of tables")
    return p.parse_args(argv)


_INSTR = re.compile(r"^\s*(?:ROOT )?%([\w.\-]+) = (.*?) ([\w\-]+)\(")
_COMPUTATION = re.compile(r"^(?:ENTRY )?%?([\w.\-]+) \(.*\{$")


def parse_hlo(text: str):
    """{instruction name: dict(opcode, shape, computation, line)} and {computation: [lines]}."""
    instructions, computations, current = {}, {}, None
    for line in text.splitlines():
        if line and not line.startswith(" "):
            m = _COMPUTATION.match(line.strip())
            current = m.group(1) if m else None
            if current:
                computations[current] = []
            continue
        if current is None:
            continue
        computations[current].append(line)
        m = _INSTR.match(line)
        if m:
            dims = re.match(r"\w+\[([\d,]*)\]", m.group(2))
            shape = [int(d) for d in dims.group(1).split(",") if d] if dims else []
            instructions[m.group(1)] = {"opcode": m.group(3), "shape": shape, "computation": current, "line": line}
    return instructions, computations


def _shape_of(name: str, lines) -> list[int]:
    for line in lines:
        m = re.match(r"^\s*(?:ROOT )?%" + re.escape(name) + r" = \w+\[([\d,]*)\]", line)
        if m:
            return [int(d) for d in m.group(1).split(",") if d]
        m = re.search(r"[(,]\s*" + re.escape(name) + r": \w+\[([\d,]*)\]", line)  # computation params
        if m:
            return [int(d) for d in m.group(1).split(",") if d]
    return []


def _window_attr(line: str, key: str, default: list[int]) -> list[int]:
    m = re.search(key + r"=([\d_x\-]+)", line)
    return [int(v) for v in m.group(1).split("x")] if m else default


def _valid_taps(
    in_size: int, out_size: int, size: int, stride: int, pad_lo: int, lhs_dilation: int, rhs_dilation: int
) -> int:
    """Window taps that land on a real input element, summed over the output positions of one
    axis (padding and the zeros of an lhs dilation are not multiplied): the count XLA's cost
    analysis uses, so that the FLOPs here and its FLOPs agree."""
    last = (in_size - 1) * lhs_dilation
    return sum(
        1
        for o in range(out_size)
        for j in range(size)
        if 0 <= (p := o * stride + j * rhs_dilation - pad_lo) <= last and p % lhs_dilation == 0
    )


def convolution_info(line: str, lines):
    """FLOPs, direction and op_name of the convolution on `line`."""
    out = [int(d) for d in re.search(r"= \w+\[([\d,]*)\]", line).group(1).split(",") if d]
    operands = [
        o.strip().split(" ")[-1].lstrip("%") for o in re.search(r"convolution\(([^)]*)\)", line).group(1).split(",")
    ]
    lhs, kernel = _shape_of(operands[0], lines), _shape_of(operands[-1], lines)
    lhs_labels, rhs_labels, out_labels = re.search(r"dim_labels=(\w+)_(\w+)->(\w+)", line).groups()
    spatial = sorted(c for c in out_labels if c.isdigit())
    size = _window_attr(line, "size", [1] * len(spatial))
    stride = _window_attr(line, "stride", [1] * len(spatial))
    lhs_dilation = _window_attr(line, "lhs_dilate", [1] * len(spatial))
    rhs_dilation = _window_attr(line, "rhs_dilate", [1] * len(spatial))
    pads = re.search(r"pad=([\d_x\-]+)", line)
    pad_lo = [int(p.split("_")[0]) for p in pads.group(1).split("x")] if pads else [0] * len(spatial)
    taps = 1
    for i, axis in enumerate(spatial):
        taps *= _valid_taps(
            lhs[lhs_labels.index(axis)],
            out[out_labels.index(axis)],
            size[i],
            stride[i],
            pad_lo[i],
            lhs_dilation[i],
            rhs_dilation[i],
        )
    flops = 2 * out[out_labels.index("b")] * out[out_labels.index("f")] * kernel[rhs_labels.index("i")] * taps
    op_name = re.search(r'op_name="([^"]*)"', line)
    op_name = op_name.group(1) if op_name else ""
    out_spatial = [out[out_labels.index(axis)] for axis in spatial]
    if any(w > o for w, o in zip(size, out_spatial)):
        # XLA writes a weight gradient as a convolution whose window is the output gradient's
        # spatial extent and whose output's spatial extent is the kernel's.
        direction = "weight-grad"
    elif "transpose(" in op_name or "lhs_dilate" in line:
        direction = "input-grad"
    else:
        direction = "forward"
    return flops, direction, op_name


def _prod(xs):
    r = 1
    for x in xs:
        r *= x
    return r


def classify(name: str, instructions, computations):
    """(phase, kind, flops) of one profiled op name."""
    ins = instructions.get(name)
    if ins is None:
        return None
    line = ins["line"]
    op_name = re.search(r'op_name="([^"]*)"', line)
    op_name = op_name.group(1) if op_name else ""
    called = re.search(r"calls=%([\w.\-]+)", line)
    body = computations.get(called.group(1), []) if called else []
    conv_lines = [l for l in ([line] if ins["opcode"] == "convolution" else body) if "convolution(" in l]
    flops = 0
    if conv_lines:
        flops, direction, conv_op_name = convolution_info(conv_lines[0], body or computations[ins["computation"]])
        op_name = op_name or conv_op_name
        path = "library" if "__ynn_fusion" in line or "__onednn" in line or "__xnn" in line else "generic"
        kind = f"conv {direction} ({path})"
    elif ins["opcode"] in (
        "all-reduce",
        "all-reduce-start",
        "all-reduce-done",
        "all-gather",
        "reduce-scatter",
        "collective-permute",
    ):
        kind = "collective (all-reduce)"
    elif "transpose" in name or ins["opcode"] in ("transpose", "copy"):
        kind = "layout transpose/copy"
    elif ins["opcode"] == "fusion":
        kind = "elementwise/reduce fusion"
    elif ins["opcode"] == "while":
        return None  # its body's ops are counted themselves
    else:
        kind = "other: " + ins["opcode"]
    phase = "sampler" if "/while/body/" in op_name else "update"
    return phase, kind, flops


def profile(args) -> dict:
    if args.cpu_devices:
        os.environ["PATJAX_CPU_DEVICES"] = str(args.cpu_devices)
    from patjax import cli

    cli.use_cpu_cores_as_devices()
    import epoch_throughput
    import jax
    from jax.profiler import ProfileData

    bench_args = epoch_throughput.parse_args(
        [
            "--method",
            args.method,
            "--model",
            args.model,
            "--width",
            str(args.width),
            "--batch",
            str(args.batch),
            "--langevin-steps",
            str(args.langevin_steps),
        ]
    )
    step, state, images, labels, permutation = epoch_throughput.build(bench_args, args.langevin_steps)
    lowered = step.lower(state, images, labels, permutation)
    compiled = lowered.compile()
    xla_gflop = epoch_throughput._flops(lowered) / 1e9  # whole batch; a while body counted once
    instructions, computations = parse_hlo(compiled.as_text())
    for _ in range(args.warmup):
        state, metrics = compiled(state, images, labels, permutation)
        jax.block_until_ready((state, metrics))
    with tempfile.TemporaryDirectory() as trace_dir:
        jax.profiler.start_trace(trace_dir)
        t0 = time.perf_counter()
        state, metrics = compiled(state, images, labels, permutation)
        jax.block_until_ready((state, metrics))
        step_s = time.perf_counter() - t0
        jax.profiler.stop_trace()
        (trace_file,) = glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True)
        data = ProfileData.from_file(trace_file)
    durations, counts = collections.Counter(), collections.Counter()
    for plane in data.planes:
        if not plane.name.startswith("/host:CPU"):
            continue
        for line in plane.lines:
            for event in line.events:
                durations[event.name] += event.duration_ns
                counts[event.name] += 1
    devices = int(state.step.sharding.num_devices)
    groups = collections.defaultdict(lambda: {"ms": 0.0, "gflop": 0.0})
    convolutions = []
    for name, ns in durations.items():
        c = classify(name, instructions, computations)
        if c is None:
            continue
        phase, kind, flops = c
        g = groups[(phase, kind)]
        g["ms"] += ns / 1e6 / devices
        g["gflop"] += flops * counts[name] / 1e9 / devices
        if flops:
            convolutions.append(
                {
                    "op": name,
                    "phase": phase,
                    "kind": kind,
                    "calls": counts[name],
                    "ms_per_call": round(ns / 1e6 / counts[name], 3),
                    "gflops_per_s": round(flops / (ns / counts[name]), 1),
                    "shape": instructions[name]["shape"],
                }
            )
    total_ms = sum(g["ms"] for g in groups.values())
    rows = []
    for (phase, kind), g in sorted(groups.items(), key=lambda kv: -kv[1]["ms"]):
        rows.append(
            {
                "phase": phase,
                "kind": kind,
                "ms_per_device": round(g["ms"], 1),
                "share": round(g["ms"] / total_ms, 4),
                "gflop_per_device": round(g["gflop"], 4),
                "gflops_per_s": round(g["gflop"] / (g["ms"] / 1e3), 1) if g["gflop"] else None,
            }
        )
    convolutions.sort(key=lambda r: -r["ms_per_call"] * r["calls"])
    return {
        "model": args.model,
        "batch": args.batch,
        "langevin_steps": args.langevin_steps,
        "devices": devices,
        "traced_step_s": round(step_s, 3),
        "op_ms_per_device": round(total_ms, 1),
        # XLA's cost analysis of the step (a while body counted once: exact at T = 1), per
        # device, to check the convolution FLOP accounting above against.
        "xla_cost_analysis_gflop_per_device": round(xla_gflop / devices, 4),
        "groups": rows,
        "slowest_convolutions": convolutions[: args.top],
        "load_average_1m": round(os.getloadavg()[0], 2),
    }


def main(argv=None):
    args = parse_args(argv)
    result = profile(args)
    if args.json:
        print(json.dumps(result))
        return
    print(
        f"{result['model']} batch {result['batch']} T={result['langevin_steps']} on "
        f"{result['devices']} device(s): traced step {result['traced_step_s']} s, "
        f"op time {result['op_ms_per_device']} ms per device (load {result['load_average_1m']})"
    )
    print(f"{'phase':8} {'kind':32} {'ms/device':>10} {'share':>7} {'GFLOP/s per op-thread':>22}")
    for r in result["groups"]:
        rate = "" if r["gflops_per_s"] is None else f"{r['gflops_per_s']:.1f}"
        print(f"{r['phase']:8} {r['kind']:32} {r['ms_per_device']:10.1f} {r['share']:7.1%} {rate:>22}")
    if result["slowest_convolutions"]:
        print("\nslowest convolutions (all calls, all devices):")
        for r in result["slowest_convolutions"]:
            print(
                f"  {r['op']:20} {r['phase']:8} {r['kind']:30} {r['calls']:3d} x {r['ms_per_call']:7.2f} ms "
                f"{r['gflops_per_s']:7.1f} GFLOP/s  out {r['shape']}"
            )


if __name__ == "__main__":
    main()
