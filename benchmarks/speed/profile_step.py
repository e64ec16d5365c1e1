#!/usr/bin/env python3
"""Where the compiled train step spends its time: a per-op profile grouped by what each op does.

  python benchmarks/speed/profile_step.py --model resnet18 --batch 32 --langevin-steps 10

Builds the same step as epoch_throughput.py (random CIFAR-shaped data, one JAX CPU device per
core unless --cpu-devices says otherwise), runs --warmup steps, traces one step with
`jax.profiler`, and sums the trace's per-op durations over every thread. Each op is looked up
in the compiled HLO (`compiled.as_text()`) and put in a group:

  phase      'sampler' for ops inside the Langevin loop (their op_name has `while/body`:
             the `fori_loop` of langevin.langevin_sample), 'update' for the rest;
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

On a GPU the trace's device plane holds kernels; each carries the HLO op that launched it
(its `hlo_op` statistic; failing that, the kernel name that XLA derives from the op's name),
and is grouped the same way: convolutions are cuDNN custom calls (direction from the call
target, FLOPs counted on the forward convolution they belong to), then matmuls
(cuBLAS/Triton), layout transposes/copies, reductions, elementwise fusions, memcpy/memset.
Also reported there: the device's busy time against the traced step's wall time (the rest is
the host: launches, the sampler loop's per-iteration condition), and whether each
convolution kernel is a tensor-core kernel by its name (xmma/wgmma/hmma/cutlass/tensorop).

  python benchmarks/speed/profile_step.py --model resnet18 --batch 256 --langevin-steps 100 \
      --compute-dtype bfloat16 --trace-dir DIR --out summary.json
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
    p.add_argument("--compute-dtype", default="float32", choices=("float32", "bfloat16"))
    p.add_argument("--top", type=int, default=12, help="also list the N slowest convolutions and ops")
    p.add_argument("--trace-dir", default="", help="keep the trace here (default: a temporary directory)")
    p.add_argument("--out", default="", help="also write the summary as JSON to this file")
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


def _conv_flops(line: str, lhs, kernel, out) -> int:
    """2 x the multiply-adds of the convolution `line` describes (window, dim_labels) on input
    `lhs`, kernel `kernel` and output `out` shapes, taps on padding or dilation zeros excluded."""
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
    return 2 * out[out_labels.index("b")] * out[out_labels.index("f")] * kernel[rhs_labels.index("i")] * taps


def _operands(line: str, opcode: str) -> list[str]:
    return [o.strip().split(" ")[-1].lstrip("%") for o in re.search(opcode + r"\(([^)]*)\)", line).group(1).split(",")]


def _result_shape(line: str) -> list[int]:
    """The result's dimensions (the first element's, for a tuple result)."""
    return [int(d) for d in re.search(r"= \(?\w+\[([\d,]*)\]", line).group(1).split(",") if d]


def convolution_info(line: str, lines):
    """FLOPs, direction and op_name of the convolution on `line`."""
    out = _result_shape(line)
    operands = _operands(line, "convolution")
    lhs, kernel = _shape_of(operands[0], lines), _shape_of(operands[-1], lines)
    flops = _conv_flops(line, lhs, kernel, out)
    out_labels = re.search(r"dim_labels=\w+_\w+->(\w+)", line).group(1)
    spatial = sorted(c for c in out_labels if c.isdigit())
    size = _window_attr(line, "size", [1] * len(spatial))
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


CUDNN_CONV = re.compile(r'custom_call_target="__cudnn\$conv(\w*)"')


def cudnn_convolution_info(line: str, lines):
    """FLOPs and direction of a cuDNN convolution custom call. Its window and dim_labels are
    those of the forward convolution (input X, kernel W, output Y); the call computes Y from
    (X, W), dX from (dY, W) or dW from (X, dY), each with the forward convolution's
    multiply-adds, which are counted here."""
    target = CUDNN_CONV.search(line).group(1)
    result = _result_shape(line)
    a, b = (_shape_of(o, lines) for o in _operands(line, "custom-call")[:2])
    if target.startswith("BackwardInput"):
        direction, (x, w, y) = "input-grad", (result, b, a)
    elif target.startswith("BackwardFilter"):
        direction, (x, w, y) = "weight-grad", (a, result, b)
    else:
        direction, (x, w, y) = "forward", (a, b, result)
    return _conv_flops(line, x, w, y), direction


COLLECTIVES = (
    "all-reduce",
    "all-reduce-start",
    "all-reduce-done",
    "all-gather",
    "reduce-scatter",
    "collective-permute",
)


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
    root = next((l for l in body if l.lstrip().startswith("ROOT ")), "")
    flops = 0
    if CUDNN_CONV.search(line):
        flops, direction = cudnn_convolution_info(line, computations[ins["computation"]])
        kind = f"conv {direction} (cudnn)"
    elif conv_lines:
        flops, direction, conv_op_name = convolution_info(conv_lines[0], body or computations[ins["computation"]])
        op_name = op_name or conv_op_name
        path = "library" if "__ynn_fusion" in line or "__onednn" in line or "__xnn" in line else "generic"
        kind = f"conv {direction} ({path})"
    elif ins["opcode"] in COLLECTIVES:
        kind = "collective (all-reduce)"
    elif "__cublas" in line or ins["opcode"] == "dot" or any(" dot(" in l for l in body):
        kind = "matmul"
    elif "transpose" in name or ins["opcode"] in ("transpose", "copy") or re.search(r" (transpose|copy)\(", root):
        kind = "layout transpose/copy"
    elif ins["opcode"] == "fusion":
        kind = (
            "reduction fusion" if any(" reduce(" in l or " reduce-window(" in l for l in body) else "elementwise fusion"
        )
    elif ins["opcode"] == "while":
        return None  # its body's ops are counted themselves
    else:
        kind = "other: " + ins["opcode"]
    phase = "sampler" if "/while/body/" in op_name else "update"
    return phase, kind, flops


def op_class(kind: str) -> str:
    """The broad class of a kind: conv, matmul, layout, elementwise, reduction, collective,
    memcpy, other."""
    for prefix, cls in (
        ("conv", "conv"),
        ("matmul", "matmul"),
        ("layout", "layout"),
        ("elementwise", "elementwise"),
        ("reduction", "reduction"),
        ("collective", "collective"),
        ("memcpy", "memcpy"),
    ):
        if kind.startswith(prefix):
            return cls
    return "other"


# Tensor-core kernels by name: cuDNN/cuBLAS's xmma (sm80_/sm90_xmma_*), Hopper's wgmma/gmma,
# hmma, CUTLASS, and the *tensorop* kernels; the others (implicit_convolve_sgemm, winograd,
# fft) run on the CUDA cores.
TENSOR_CORE_KERNEL = re.compile(r"xmma|wgmma|gmma|hmma|cutlass|tensorop|s16816|s1688", re.IGNORECASE)
DERIVED_LINES = ("XLA Ops", "XLA Modules", "Steps", "Framework", "Source", "TensorFlow", "XLA TraceMe", "Launch")


def trace_events(data):
    """(HLO op name or None, kernel name or None, start ns, duration ns) of every traced op:
    kernels on a GPU's streams when the trace has a GPU, else XLA:CPU's ops on the host's
    threads (named by their HLO op)."""
    gpus = [plane for plane in data.planes if plane.name.startswith("/device:GPU")]
    if not gpus:
        for plane in data.planes:
            if plane.name.startswith("/host:CPU"):
                for line in plane.lines:
                    for event in line.events:
                        yield event.name, None, event.start_ns, event.duration_ns
        return
    for plane in gpus:
        for line in plane.lines:
            if line.name.startswith(DERIVED_LINES):  # spans derived from the kernels, not kernels
                continue
            for event in line.events:
                yield dict(event.stats).get("hlo_op"), event.name, event.start_ns, event.duration_ns


def busy_ns(intervals) -> float:
    """Length of the union of (start, duration) intervals."""
    total, end = 0.0, float("-inf")
    for start, duration in sorted(intervals):
        stop = start + duration
        if stop > end:
            total += stop - max(start, end)
            end = stop
    return total


def summarize(events, instructions, computations, devices: int, top: int) -> dict:
    """Groups, classes, top ops, slowest convolutions and (GPU) tensor-core use of the traced
    ops, per device and per traced step."""
    events = list(events)
    gpu = any(kernel is not None for _, kernel, _, _ in events)
    by_kernel = {re.sub(r"[.\-]", "_", n): n for n in instructions}  # XLA names kernels after ops
    ops = collections.defaultdict(
        lambda: {"ns": 0.0, "kernels": collections.Counter(), "ns_by_kernel": collections.Counter()}
    )
    for op, kernel, _, ns in events:
        op = op or by_kernel.get(kernel or "")
        c = classify(op, instructions, computations) if op else None
        if c is None:
            if not gpu:
                continue  # host events that are no HLO op (the Python thread, the runtime)
            low = (kernel or "").lower()
            kind = "memcpy/memset" if "memcpy" in low or "memset" in low else "other: unattributed kernel"
            op, c = f"[{kernel}]", ("unattributed", kind, 0)
        ops[op]["class"] = c
        ops[op]["ns"] += ns
        ops[op]["kernels"][kernel] += 1
        ops[op]["ns_by_kernel"][kernel] += ns
    groups = collections.defaultdict(lambda: {"ms": 0.0, "gflop": 0.0})
    rows_ops, convolutions, conv_kernels = [], [], collections.defaultdict(lambda: [0.0, 0])
    for name, o in ops.items():
        phase, kind, flops = o["class"]
        calls = max(o["kernels"].values())  # each call launches each of its kernels once
        g = groups[(phase, kind)]
        g["ms"] += o["ns"] / 1e6 / devices
        g["gflop"] += flops * calls / 1e9 / devices
        kernel = o["ns_by_kernel"].most_common(1)[0][0]
        rows_ops.append(
            {
                "op": name,
                "phase": phase,
                "kind": kind,
                "calls": calls,
                "ms": o["ns"] / 1e6 / devices,
                "gflops_per_s": round(flops * calls / o["ns"], 1) if flops and o["ns"] else None,
                "kernel": kernel,
            }
        )
        if flops:
            convolutions.append(
                {
                    "op": name,
                    "phase": phase,
                    "kind": kind,
                    "calls": calls,
                    "ms_per_call": round(o["ns"] / 1e6 / calls, 3),
                    "gflops_per_s": round(flops * calls / o["ns"], 1),
                    "shape": instructions[name]["shape"] if name in instructions else [],
                }
            )
        if gpu and op_class(kind) == "conv":
            for k, ns in o["ns_by_kernel"].items():
                conv_kernels[k][0] += ns / 1e6
                conv_kernels[k][1] += o["kernels"][k]
    total_ms = sum(g["ms"] for g in groups.values())
    rows = []
    for (phase, kind), g in sorted(groups.items(), key=lambda kv: -kv[1]["ms"]):
        rows.append(
            {
                "phase": phase,
                "kind": kind,
                "ms_per_device": round(g["ms"], 3),
                "share": round(g["ms"] / total_ms, 4),
                "gflop_per_device": round(g["gflop"], 6),
                "gflops_per_s": round(g["gflop"] / (g["ms"] / 1e3), 1) if g["gflop"] else None,
            }
        )
    classes = collections.Counter()
    for r in rows:
        classes[op_class(r["kind"])] += r["ms_per_device"]
    rows_ops.sort(key=lambda r: -r["ms"])
    for r in rows_ops:
        r["share"], r["ms"] = round(r["ms"] / total_ms, 4), round(r["ms"], 3)
    convolutions.sort(key=lambda r: -r["ms_per_call"] * r["calls"])
    result = {
        "op_ms_per_device": round(total_ms, 3),
        "class_shares": {k: round(v / total_ms, 4) for k, v in classes.most_common()},
        "groups": rows,
        "top_ops": rows_ops[:top],
        "slowest_convolutions": convolutions[:top],
    }
    if gpu:
        on_tc = sum(ms for k, (ms, _) in conv_kernels.items() if TENSOR_CORE_KERNEL.search(k or ""))
        conv_ms = sum(ms for ms, _ in conv_kernels.values())
        result["device_busy_ms"] = round(busy_ns((start, ns) for _, _, start, ns in events) / 1e6, 3)
        result["kernels"] = len(events)
        result["conv_share_on_tensor_core_kernels"] = round(on_tc / conv_ms, 4) if conv_ms else None
        result["conv_kernels"] = [
            {"kernel": k, "ms": round(ms, 3), "calls": n, "tensor_core": bool(TENSOR_CORE_KERNEL.search(k or ""))}
            for k, (ms, n) in sorted(conv_kernels.items(), key=lambda kv: -kv[1][0])[:top]
        ]
    return result


def profile(args) -> dict:
    if args.cpu_devices:
        os.environ["PATJAX_CPU_DEVICES"] = str(args.cpu_devices)
    from patjax.core import devices

    devices.use_cpu_cores_as_devices()
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
            "--compute-dtype",
            args.compute_dtype,
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
    with tempfile.TemporaryDirectory() as scratch:
        trace_dir = args.trace_dir or scratch
        jax.profiler.start_trace(trace_dir)
        t0 = time.perf_counter()
        state, metrics = compiled(state, images, labels, permutation)
        jax.block_until_ready((state, metrics))
        step_s = time.perf_counter() - t0
        jax.profiler.stop_trace()
        trace_file = max(glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True), key=os.path.getmtime)
        data = ProfileData.from_file(trace_file)
    devices = int(state.step.sharding.num_devices)
    device = jax.devices()[0]
    return {
        "model": args.model,
        "batch": args.batch,
        "langevin_steps": args.langevin_steps,
        "compute_dtype": args.compute_dtype,
        "backend": jax.default_backend(),
        "device": device.device_kind,
        "jax": jax.__version__,
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "devices": devices,
        "traced_step_s": round(step_s, 3),
        # XLA's cost analysis of the step (a while body counted once: exact at T = 1), per
        # device, to check the convolution FLOP accounting above against (none on a GPU).
        "xla_cost_analysis_gflop_per_device": round(xla_gflop / devices, 4),
        **summarize(trace_events(data), instructions, computations, devices, args.top),
        "load_average_1m": round(os.getloadavg()[0], 2),
    }


def main(argv=None):
    args = parse_args(argv)
    result = profile(args)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
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
    print("\nshare of op time by class: " + ", ".join(f"{k} {v:.1%}" for k, v in result["class_shares"].items()))
    if "device_busy_ms" in result:
        print(
            f"device busy {result['device_busy_ms']} ms of the traced step's {1e3 * result['traced_step_s']:.1f} ms "
            f"({result['kernels']} kernels); convolution time on tensor-core kernels: "
            f"{result['conv_share_on_tensor_core_kernels']}"
        )
        for r in result["conv_kernels"]:
            print(f"  {r['ms']:9.2f} ms {r['calls']:6d} calls  tensor core {r['tensor_core']!s:5}  {r['kernel'][:100]}")
    print("\ntop ops:")
    for r in result["top_ops"]:
        rate = "" if r["gflops_per_s"] is None else f"{r['gflops_per_s']:.1f} GFLOP/s"
        print(f"  {r['op'][:40]:40} {r['phase']:8} {r['kind']:30} {r['calls']:5d} calls {r['share']:7.1%} {rate}")
    if result["slowest_convolutions"]:
        print("\nslowest convolutions (all calls, all devices):")
        for r in result["slowest_convolutions"]:
            print(
                f"  {r['op']:20} {r['phase']:8} {r['kind']:30} {r['calls']:3d} x {r['ms_per_call']:7.2f} ms "
                f"{r['gflops_per_s']:7.1f} GFLOP/s  out {r['shape']}"
            )


if __name__ == "__main__":
    main()
