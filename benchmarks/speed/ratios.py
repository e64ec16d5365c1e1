#!/usr/bin/env python3
"""Every published ratio of patjax to another tool, measured in one run under
benchmarks/timing.py's discipline, written as JSON and as a markdown table.

  python benchmarks/speed/ratios.py --out docs/results/speed_quiet/

Refused unless the 1-minute load average is at most --max-load (default: half the usable
cores) when it starts; --force runs it anyway with every row marked "not a figure". Each item
is one timing.measure: every arm in a process of its own, --rounds alternating rounds (at least
3), patjax cold (no compilation cache) and warm (a cache its untimed first run filled), the load
before and after every arm. The gate is checked once, at the start: the arms' own processes load
the machine from then on. Results are written after every item, so an interrupted run keeps
what it finished.

Items (`--items`, default DEFAULT_ITEMS; `--items=all` adds the optional ones). At the default
sizes the default items should take about 15 minutes on a quiet 2-core CPU: an estimate from
single quiet runs at 100 images (AutoAttack 50-77 s an arm), scaled, with each arm's process
start-up and patjax's warm arms' untimed first runs added; the optional items about 3.5 minutes
each (ResNet-18 more):
- aa_individual: each attack of standard AutoAttack alone on every image (APGD-CE, APGD-T, FAB-T,
  Square), patjax's `aa` passes against the reference (`pyautoattack` 0.2.0, the authors' code),
  the committed table1_cpu PAT small CNN (`pat_s0`), L-inf 8/255, --aa-images images
  (crosscheck/autoattack_reference.py --individual; the four attacks one after the other in each
  arm's process, each timed as a part);
- aa_sequence_pat_linf: the standard sequence, same model and images;
- aa_sequence_pgd_linf, aa_sequence_pat_l2, aa_sequence_pgd_l2 (optional): the PGD model
  (`pgd_s0`), and L2 0.5;
- pr: PR under PRBench's protocol against PRBench's loop (pr_speed.py), --pr-images images;
- certify: certification against Cohen et al.'s loop (certify_speed.py), --certify-images
  images, n0 = 100, n = --certify-n;
- train_step: the train step (PAT, small CNN, --train-batch, T = --train-t) against the eager and
  the compiled PyTorch peer (epoch_throughput.py, torch_small_cnn_peer.py), median step seconds;
- train_step_resnet18 (optional): the same on ResNet-18, batch 32, T = 10.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import torch_arms  # noqa: E402
from compare_torch import step_timing  # noqa: E402
from torch_arms import timing  # noqa: E402

RUNS = os.path.join(REPO, "docs/results/table1_cpu/runs/cifar10_small_cnn")
AA_SCRIPT = os.path.join(REPO, "benchmarks/crosscheck/autoattack_reference.py")
ATTACKS = ("apgd_ce", "apgd_t", "fab_t", "square")
AA_SEQUENCES = {
    "aa_sequence_pat_linf": ("pat_s0", "Linf"),
    "aa_sequence_pgd_linf": ("pgd_s0", "Linf"),
    "aa_sequence_pat_l2": ("pat_s0", "L2"),
    "aa_sequence_pgd_l2": ("pgd_s0", "L2"),
}
DEFAULT_ITEMS = ("aa_individual", "aa_sequence_pat_linf", "pr", "certify", "train_step")
ALL_ITEMS = (*DEFAULT_ITEMS[:2], *list(AA_SEQUENCES)[1:], *DEFAULT_ITEMS[2:], "train_step_resnet18")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="directory for ratios.json and ratios.md")
    p.add_argument("--items", default=",".join(DEFAULT_ITEMS), help=f"comma-separated, or all: {', '.join(ALL_ITEMS)}")
    p.add_argument("--aa-images", type=int, default=32, help="first CIFAR-10 test images for AutoAttack")
    p.add_argument("--aa-attacks", default=",".join(ATTACKS), help="aa_individual's attacks")
    p.add_argument("--pr-images", type=int, default=100)
    p.add_argument("--certify-images", type=int, default=16)
    p.add_argument("--certify-n", type=int, default=1000)
    p.add_argument("--train-batch", type=int, default=128)
    p.add_argument("--train-t", type=int, default=20)
    p.add_argument("--train-iters", type=int, default=3, help="timed steps per train-step run")
    timing.add_arguments(p)
    args = p.parse_args(argv)
    args.items = ALL_ITEMS if args.items == "all" else tuple(args.items.split(","))
    unknown = set(args.items) - set(ALL_ITEMS)
    if unknown:
        p.error(f"unknown items {sorted(unknown)}; choose from {', '.join(ALL_ITEMS)}")
    return args


def aa_arms(run: str, exported: str, norm: str, images: int, individual: bool, attacks) -> list:
    command = [sys.executable, AA_SCRIPT, f"--workdir={os.path.join(RUNS, run)}", f"--num_examples={images}"]
    command += [f"--norm={norm}"]
    if individual:
        command += ["--individual", *[f"--attacks={a}" for a in attacks]]
    return [
        timing.Arm("reference", (*command, "--only=reference", f"--torch_weights={exported}")),
        timing.Arm("patjax", (*command, "--only=patjax"), compiles=True),
    ]


def train_arms(model: str, batch: int, steps: int, iters: int) -> list:
    size = ["--batch", str(batch), "--langevin-steps", str(steps), "--iters", str(iters)]
    if model == "small_cnn":
        peer = [sys.executable, os.path.join(HERE, "torch_small_cnn_peer.py"), *size, "--warmup", "2"]
    else:
        peer = [sys.executable, os.path.join(HERE, "torch_pat_peer.py"), "--width", "64", *size, "--warmup", "2"]
    patjax = [sys.executable, os.path.join(HERE, "epoch_throughput.py"), "--json", "--no-flops", "--model", model]
    patjax += size
    return [
        timing.Arm("eager peer", tuple(peer), extract=step_timing),
        timing.Arm("compiled peer", (*peer, "--compile", "--channels-last"), extract=step_timing),
        timing.Arm("patjax", tuple(patjax), extract=step_timing),
    ]


def export(run: str, directory: str) -> str:
    """The committed run exported to PyTorch, for the reference arms (a process of its own)."""
    path = os.path.join(directory, f"{run}.safetensors")
    if not os.path.exists(path):
        subprocess.run(
            [sys.executable, "-m", "patjax.export", f"--workdir={os.path.join(RUNS, run)}", f"--out={path}"],
            check=True,
            capture_output=True,
            cwd=REPO,
        )
    return path


def rows(item: str, measured: dict, size: str) -> list:
    """The table's rows of one measured item. Attacks, PR, certification: (what, size, reference,
    patjax cold, patjax warm, ratio cold, ratio warm); the train step: (what, size, peer, patjax,
    ratio). Times 'median (min)' seconds; ratios the other tool's seconds over patjax's."""
    arms = measured["arms"]
    if item.startswith("train_step"):
        return [
            (f"{item} against the {peer}", size, _cell(arms[peer]), _cell(arms["patjax"]))
            + (_r(timing.ratio(measured, peer, "patjax")),)
            for peer in ("eager peer", "compiled peer")
        ]
    reference = "reference" if "reference" in arms else "theirs"  # torch_arms' name
    out = []
    for part in list(arms[reference].get("parts") or {}) or [None]:
        cells = [arms[n] if part is None else arms[n]["parts"][part] for n in (reference, "patjax cold", "patjax warm")]
        ratios = [timing.ratio(measured, reference, f"patjax {s}", part) for s in ("cold", "warm")]
        name = item if part is None else f"{item}: {part}"
        out.append((name, size, *map(_cell, cells), *map(_r, ratios)))
    return out


def _cell(arm: dict) -> str:
    wall, compile_s = arm["wall_s"], arm.get("compile_s") or {}
    text = f"{wall['median']:.2f} ({wall['min']:.2f})"
    return text + (f", compiling {compile_s['median']:.2f}" if compile_s else "")


def _r(ratio: dict) -> str:
    return f"**{ratio['median']:.2f}** ({ratio['min']:.2f})"


def _loads(measured: dict) -> str:
    records = [r for arm in measured["arms"].values() for r in arm["records"]]
    loads = [v for r in records for v in (r["load_before"], r["load_after"])]
    return f"{min(loads):.1f}-{max(loads):.1f}"


def markdown(report: dict) -> str:
    lines = [
        f"# Ratios under benchmarks/timing.py ({report['date']})",
        "",
        f"Machine: {report['machine']}. Command: `{report['command']}`.",
        f"Gate: 1-minute load average {report['start_load']} at the start, limit {report['max_load']}, "
        f"{report['rounds']} alternating rounds: "
        + ("**a figure**." if report["figure"] else "**not a figure** (a start above the limit, or under 3 rounds)."),
        "Seconds: median (minimum) over the rounds, each arm in a process of its own; ratio: the other tool's seconds"
        " over patjax's (above 1: patjax faster), of the medians (of the minimums). Cold: no compilation cache; warm:"
        " the cache its own first, untimed run filled. Loads: the 1-minute load average before and after its arms.",
        "",
        "| what | size | reference s | patjax cold s | patjax warm s | ratio cold | ratio warm | loads |",
        "|---|---|---|---|---|---|---|---|",
    ]
    steps = []
    for item, entry in report["items"].items():
        for row in rows(item, entry["measured"], entry["size"]):
            line = "| " + " | ".join(row) + f" | {_loads(entry['measured'])} |"
            (steps if item.startswith("train_step") else lines).append(line)
    if steps:
        lines += [
            "",
            "The train step (median step seconds of each run, compilation outside it):",
            "",
            "| what | size | peer s | patjax s | ratio | loads |",
            "|---|---|---|---|---|---|",
            *steps,
        ]
    lines += ["", "The command of every arm: ratios.json (`items.*.measured.arms.*.command`)."]
    return "\n".join(lines) + "\n"


def main(argv=None):
    args = parse_args(argv)
    gate = timing.check_quiet(args.max_load, args.force)
    os.makedirs(args.out, exist_ok=True)
    report = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{_cpu()}, {len(os.sched_getaffinity(0))} cores, Python {platform.python_version()}",
        "command": "python benchmarks/speed/ratios.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        **gate,
        "figure": gate["figure"] and args.rounds >= timing.MIN_ROUNDS,
        "rounds": args.rounds,
        "items": {},
    }
    opts = argparse.Namespace(rounds=args.rounds, max_load=args.max_load, force=args.force)
    with tempfile.TemporaryDirectory() as exports:
        for item in args.items:
            print(f"== {item}", file=sys.stderr, flush=True)
            if item == "aa_individual":
                attacks = args.aa_attacks.split(",")
                arms = aa_arms("pat_s0", export("pat_s0", exports), "Linf", args.aa_images, True, attacks)
                size = f"pat_s0, L-inf 8/255, {args.aa_images} images"
            elif item in AA_SEQUENCES:
                run, norm = AA_SEQUENCES[item]
                arms = aa_arms(run, export(run, exports), norm, args.aa_images, False, ())
                size = f"{run}, {'L-inf 8/255' if norm == 'Linf' else 'L2 0.5'}, {args.aa_images} images"
            elif item == "pr":
                flags = [f"--images={args.pr_images}", f"--batch={args.pr_images}"]
                measured = torch_arms.measure(os.path.join(HERE, "pr_speed.py"), flags, opts, gate)
                size = f"clean_s0, PRBench's radii, N = 100, {args.pr_images} images"
            elif item == "certify":
                flags = [f"--images={args.certify_images}", "--n0=100", f"--n={args.certify_n}"]
                measured = torch_arms.measure(os.path.join(HERE, "certify_speed.py"), flags, opts, gate)
                size = f"clean_s0, sigma 0.25, n0 = 100, n = {args.certify_n}, {args.certify_images} images"
            elif item == "train_step":
                arms = train_arms("small_cnn", args.train_batch, args.train_t, args.train_iters)
                size = f"PAT small CNN, batch {args.train_batch}, T = {args.train_t}"
            else:
                arms = train_arms("resnet18", 32, 10, args.train_iters)
                size = "PAT ResNet-18, batch 32, T = 10"
            if item not in ("pr", "certify"):
                measured = timing.measure(arms, rounds=args.rounds, gate=gate)
            report["items"][item] = {"size": size, "measured": measured}
            write(report, args.out)
    print(markdown(report))


def write(report: dict, out: str) -> None:
    with open(os.path.join(out, "ratios.json"), "w") as f:
        json.dump(report, f, indent=1, default=float)
        f.write("\n")
    with open(os.path.join(out, "ratios.md"), "w") as f:
        f.write(markdown(report))


def _cpu() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


if __name__ == "__main__":
    main()
