#!/usr/bin/env python3
"""patjax vs the plain PyTorch peer, run alternately (A B A B ...) in one run; prints the ratio of medians.

Timed by benchmarks/timing.py: each round runs every arm once, one after the other, each in a
fresh process, the load gated at the start and recorded around every arm, and the figure
quoted is median(images/s of patjax) / median(images/s of the peer) over the rounds (each
run's own median step; compilation is outside it and reported apart).

  python benchmarks/speed/compare_torch.py --model resnet18 --batch 32 --langevin-steps 10 --iters 3 --rounds 3

Arms: the peer -- benchmarks/speed/torch_pat_peer.py (Algorithm 2 in eager PyTorch, the step
patjax computes) for resnet18, benchmarks/speed/torch_small_cnn_peer.py (the same step on its
SmallCNN) for small_cnn; $PATJAX_TORCH_REFERENCE, if set, replaces the resnet18 peer by another
script taking --width --batch --langevin-steps --iters [--threads] and printing a JSON line
with images_per_s -- and one patjax arm per --patjax-variant (extra flags for
epoch_throughput.py; default: none), e.g.
--patjax-variant=--conv-input-grad=reordered --patjax-variant=--conv-input-grad=autodiff
measures the convolution input-gradient switch against the same peer runs. A variant may
start with environment assignments (--patjax-variant='PJRT_NPROC=2 --cpu-devices 2'). Peer
arms likewise: one per --peer-variant (extra flags for the peer script; default: none, the
eager peer), e.g. --peer-variant= --peer-variant='--compile --channels-last' runs the eager
and the compiled peer (torch_pat_peer.py's `Execution`) in the same rounds; their warm-up
steps (--peer-warmup, default 2) absorb torch.compile's compilation. With --no-peer only the
patjax arms run, and ratios are to the first one.
"""

import argparse
import json
import math
import os
import shlex
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import timing  # noqa: E402

REFERENCE = os.environ.get("PATJAX_TORCH_REFERENCE", os.path.join(HERE, "torch_pat_peer.py"))


def arm_record(arm, env):
    """One run of an arm (timing.run_arm) timed by its median step; an arm that fails (an XLA
    flag this build lacks, say) is reported and marked, and leaves the rest."""
    try:
        return timing.run_arm(arm, env)
    except RuntimeError as error:
        print(str(error).splitlines()[0] + "\n" + "\n".join(str(error).splitlines()[-5:]))
        return {"wall_s": float("nan"), "failed": True}


def step_timing(result: dict) -> dict:
    """An arm's JSON as timing.py reads it: the wall is its median step (compilation, which
    patjax reports as compile_s and the peers within their first step, is outside it)."""
    out = {k: v for k, v in result.items() if k != "compile_s"}
    return {**out, "wall_s": result["median_step_s"], "setup_compile_s": result.get("compile_s")}


def split_variant(variant: str):
    """(environment assignments, flags) of a --patjax-variant / --peer-variant string."""
    tokens = shlex.split(variant)
    env = [t for t in tokens if "=" in t and not t.startswith("-")]
    return env, [t for t in tokens if t not in env]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="resnet18", choices=("resnet18", "small_cnn"))
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--langevin-steps", type=int, default=10)
    p.add_argument("--iters", type=int, default=3, help="timed steps per run (after one warm-up)")
    p.add_argument(
        "--patjax-variant",
        action="append",
        default=None,
        help="extra flags for epoch_throughput.py; repeat for several patjax arms",
    )
    p.add_argument(
        "--peer-variant",
        action="append",
        default=None,
        help="extra flags for the peer script (e.g. '--compile --channels-last'); repeat for several peer arms",
    )
    p.add_argument("--peer-warmup", type=int, default=2, help="the peers' untimed steps (compilation)")
    p.add_argument(
        "--peer-threads",
        type=int,
        action="append",
        default=None,
        help="also run the peer with --threads N (repeatable): under load from other "
        "processes, OpenMP's default thread count can fare much worse than 1 thread",
    )
    p.add_argument("--peak-gflops", type=float, default=0.0)
    p.add_argument(
        "--cpus",
        default="",
        help="pin every arm to these CPUs with taskset (e.g. 0) and give the peer as many "
        "threads: a per-core comparison that other load on the machine disturbs less",
    )
    p.add_argument(
        "--no-peer", action="store_true", help="run only the patjax arms (ratios to the first --patjax-variant)"
    )
    p.add_argument("--json", action="store_true", help="also print one JSON line with every run")
    timing.add_arguments(p)
    a = p.parse_args()
    variants = a.patjax_variant or [""]
    common = ["--batch", str(a.batch), "--langevin-steps", str(a.langevin_steps), "--iters", str(a.iters)]
    if a.model == "resnet18":
        peer = [sys.executable, REFERENCE, "--width", str(a.width), *common]
    else:
        peer = [sys.executable, os.path.join(HERE, "torch_small_cnn_peer.py"), *common]
    if not os.environ.get("PATJAX_TORCH_REFERENCE"):
        peer += ["--warmup", str(a.peer_warmup)]
    arms = {}
    for v in [] if a.no_peer else a.peer_variant or [""]:
        env, flags = split_variant(v)
        arms[f"torch {v}".strip()] = (["env", *env] if env else []) + peer + flags
    for n in [] if a.no_peer else a.peer_threads or []:
        arms[f"torch --threads {n}"] = peer + ["--threads", str(n)]
    for v in variants:
        env, flags = split_variant(v)
        arms[f"patjax {v}".strip()] = (["env", *env] if env else []) + [
            sys.executable,
            os.path.join(HERE, "epoch_throughput.py"),
            "--json",
            "--model",
            a.model,
            "--width",
            str(a.width),
            "--peak-gflops",
            str(a.peak_gflops),
            *common,
            *flags,
        ]
    baseline = next(iter(arms))
    if a.cpus:
        ncpus = sum(len(range(int(r.split("-")[0]), int(r.split("-")[-1]) + 1)) for r in a.cpus.split(","))
        arms = {
            name: (cmd + ["--threads", str(ncpus)] if name.startswith("torch") and "--threads" not in name else cmd)
            for name, cmd in arms.items()
        }
        arms = {name: ["taskset", "-c", a.cpus, *cmd] for name, cmd in arms.items()}
    measured = timing.measure(
        [timing.Arm(name, tuple(cmd), extract=step_timing) for name, cmd in arms.items()],
        rounds=a.rounds,
        max_load=a.max_load,
        force=a.force,
        run=arm_record,
    )
    runs = {
        name: [r for r in arm["records"] if not r.get("failed")]
        for name, arm in measured["arms"].items()
        if not any(r.get("failed") or math.isnan(r["wall_s"]) for r in arm["records"])
    }
    if baseline not in runs:
        raise SystemExit(f"the baseline arm {baseline!r} failed")
    arms = {name: cmd for name, cmd in arms.items() if name in runs}
    medians = {name: statistics.median(x["images_per_s"] for x in rs) for name, rs in runs.items()}
    print(
        f"\n{a.model} batch {a.batch} T={a.langevin_steps}, {a.rounds} alternating rounds "
        f"of {a.iters} timed steps"
        + (f", pinned to CPUs {a.cpus}" if a.cpus else "")
        + f"; load average at the end {os.getloadavg()[0]:.2f}"
    )
    # Each arm against every peer arm (the baseline first): the ratio of medians, and the
    # spread of the ratios within rounds (both arms of a round ran minutes apart at most).
    references = [baseline] + [n for n in medians if n.startswith("torch") and n != baseline]
    round_ratios = {
        name: {
            ref: [x["images_per_s"] / y["images_per_s"] for x, y in zip(runs[name], runs[ref])]
            for ref in references
            if ref != name
        }
        for name in arms
    }
    for name, m in medians.items():
        print(
            f"  {name:>40}: median {m:8.2f} img/s"
            + "".join(
                f"; to {ref} {m / medians[ref]:.2f} (rounds {min(r):.2f}-{max(r):.2f})"
                for ref, r in round_ratios[name].items()
            )
        )
    if a.json:
        print(
            json.dumps(
                {
                    "model": a.model,
                    "batch": a.batch,
                    "langevin_steps": a.langevin_steps,
                    "cpus": a.cpus or None,
                    "load_average": os.getloadavg(),
                    "figure": measured["figure"],
                    "start_load": measured["start_load"],
                    "max_load": measured["max_load"],
                    "medians": medians,
                    "ratios": {n: m / medians[baseline] for n, m in medians.items()},
                    "round_ratios": round_ratios,
                    "runs": runs,
                }
            )
        )


if __name__ == "__main__":
    main()
