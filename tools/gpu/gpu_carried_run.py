#!/usr/bin/env python3
"""A training run longer than one GPU window, carried from window to window in git.

A window trains the run on its clock, evaluates the learning-curve points it reached, and brings
back the newest checkpoint (the whole train state: parameters, BatchNorm statistics, optimizer
state, step and random state) in sha256-checked pieces; it is committed here and carried to the
next window, which resumes it exactly where it stopped (main.py resumes from the newest
checkpoint of its workdir). Once trained, the final model is exported and evaluated in fp32, as
much as each window has time for; the checkpoint then stays behind.

Here, before a window (after gpu_paper_scale.py's `wheels`, `stage --data 1`, `stage --data 2`):
  python tools/gpu/gpu_carried_run.py stage --run pgd_atpr --from docs/results/gpu/e1/pgd_atpr
      # the committed run, in pieces, into the room the data leave in .gpu/carry1 and carry2, then
      # .gpu/carry3, ...; prints each call of the window (the first window: no --from)
  python tools/gpu/gpu_paper_scale.py travel untrack
On the device machine, the calls `stage` printed: `gpu_paper_scale.py device setup [smoke]` for all
but the last, which runs
  python3 tools/gpu/gpu_carried_run.py device --run pgd_atpr --budget_s B
  python3 tools/gpu/gpu_paper_scale.py device send --name run_pgd_atpr --first K   # if it says so
Here, after:
  python tools/gpu/gpu_paper_scale.py collect FILES_AT... --into docs/results/gpu/WINDOW
  python tools/gpu/gpu_paper_scale.py travel retrack
  git add -f docs/results/gpu/WINDOW   # the checkpoint is ignored elsewhere; here it must travel on

What a window brings back of run R (packed as run_R, into R/): config.json, metrics.jsonl (one line
an epoch: the training figures and the clean accuracy on the 10,000 test images), the curve points
curve/step_N/ (every CURVE_EVERY_EPOCHS epochs: clean accuracy and PR under the Table-1 law on the
first CURVE_EXAMPLES test images, in the run's compute dtype), the newest checkpoint while the run
is unfinished, then final/R.safetensors and the fp32 evaluations fp32/NAME/ of FINAL_EVALUATIONS.
Nothing is rounded: the checkpoint is Orbax's, float32 as it was trained.

--dry_run runs the same path on the CPU with the small CNN and a few steps (tests/test_gpu_carried_run.py
splits a run in two windows this way and checks that it ends bitwise where one window would).
Like gpu_paper_scale.py, this imports nothing of patjax: the device runs patjax's command lines.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import sys

import gpu_paper_scale as gps

MIB = gps.MIB
CURVE_EVERY_EPOCHS = 10
CURVE_EXAMPLES = 1000
STEPS_PER_EPOCH = gps.STEPS_PER_EPOCH  # 50,000 // 256
# Every run: bf16 compute as in windows A and B (docs/reproduction.md), seed 0, the clean accuracy
# on the 10,000 test images each epoch, a checkpoint at each curve point (all of one window's kept
# until they are evaluated) and one where the window's clock stops it.
COMMON = [
    "--config.compute_dtype=bfloat16",
    "--config.seed=0",
    "--config.progress_bar=False",
    f"--config.log_every_steps={STEPS_PER_EPOCH}",
    "--config.log_test_examples=10000",
    f"--config.checkpoint_every_steps={CURVE_EVERY_EPOCHS * STEPS_PER_EPOCH}",
    "--config.max_checkpoints_to_keep=20",
]
# The runs of docs/reproduction.md's windows E and F, and the paper-literal PGD-10 beside them.
RUNS = {
    "pgd_atpr": ("configs/pgd_atpr_cifar10.py", []),  # PGD-10 as the authors' AT-PR code trains it
    "pat": ("configs/pat_cifar10.py", gps.PAIR_METHOD["pat"][1:]),  # Appendix E, the cheaper sampler
    "pat_t100": ("configs/pat_cifar10.py", []),  # Appendix E as written: Algorithm 1, uniform start, T = 100
    "pgd_lr001": ("configs/pat_cifar10.py", ["--config.method=pgd"]),  # Appendix E's lr 0.01 read literally
}
DRY_TRAIN = [
    *("--config.model=small_cnn", "--config.batch_size=32", "--config.num_train_steps=8"),
    # A line a step: a split run's log then holds the uninterrupted run's lines, each over one step.
    *("--config.log_every_steps=1", "--config.log_test_examples=64", "--config.checkpoint_every_steps=4"),
    *("--config.langevin.steps=2", "--config.attack.steps=2"),
]
DRY_CURVE_EVERY_STEPS = 4
CURVE_EVALUATE = [
    *("--evaluators=clean,pr", f"--num_examples={CURVE_EXAMPLES}", "--batch_size=500"),
    *("--pr_distribution=uniform", "--pr_distributions=uniform", "--seed=0"),
]
DRY_EVALUATE = ["--num_examples=16", "--batch_size=16", "--pr_samples=4", "--pr_chunk_size=4"]
# The final model's evaluations in fp32 (--torch_checkpoint builds the default fp32 network), in
# order, each with its projected seconds on one H100 (windows A and B: 125 s for clean, PGD-20,
# CW-20 and three PR laws on 10,000 images; AutoAttack's is a guess, its first GPU measurement).
FINAL_EVALUATIONS = (
    (
        "table1",
        [
            *("--evaluators=clean,pgd20,cw20,pr", "--num_examples=10000", "--batch_size=500", "--seed=0"),
            *("--pr_distribution=uniform", "--pr_distributions=uniform"),
        ],
        110,
    ),
    (
        "prbench",
        [
            *("--evaluators=clean,pr", "--num_examples=10000", "--batch_size=500", "--seed=0"),
            *("--pr_preset=prbench", "--pr_distribution=uniform", "--pr_distributions=uniform"),
        ],
        60,
    ),
    ("aa1000", ["--evaluators=clean,aa", "--num_examples=1000", "--batch_size=500", "--seed=0"], 240),
)
DRY_FINAL_EVALUATE = {"aa1000": ["--num_examples=8", "--batch_size=8", "--apgd_steps=2"]}
CURVE_POINT_S = 20  # one curve point's evaluation, its process start and (cached) compilation
# An epoch takes at least this long on the GPU (PGD-10 took 7.0 s on an H100 in bf16, PAT 9.8 s):
# what bounds the curve points a window's training can reach.
EPOCH_S_FLOOR = 6
EXPORT_S = 60  # the export of the final model, its process start included
TRAVEL_PIECE_BYTES = 4 * MIB  # small pieces fill the room the data leave in a call
TRAVEL_MARGIN = 2 * MIB  # under the travel limit: the tree may grow by a commit before the window
FINISHED = re.compile(r"^(trained \S+ to|stopped at) step (\d+) of (\d+)", re.M)


def pack_name(run: str) -> str:
    return f"run_{run}"


# --------------------------------------------------------------------------------------------
# Here: the committed run, in pieces, into the carried folders.


def stage_run(root: str, stage: str, run: str, source: str | None) -> list:
    """Packs the run's committed folder (every file: config, log, curve points, its newest
    checkpoint or final model, evaluations) into pieces of TRAVEL_PIECE_BYTES and lays them into
    STAGE/carryK/inbox/, K = 1, 2, ... as each call's room allows beside the tree and the data;
    returns the carried folders in call order. Without `source` (the run's first window) only the
    data travel."""
    folders = sorted(
        (n for n in os.listdir(stage) if n.startswith(gps.CARRY) and n[len(gps.CARRY) :].isdigit()),
        key=lambda n: int(n[len(gps.CARRY) :]),
    )
    for name in folders:  # a carried run staged before: replaced, as the data are
        shutil.rmtree(os.path.join(stage, name, gps.INBOX), ignore_errors=True)
        if not os.listdir(os.path.join(stage, name)):
            os.rmdir(os.path.join(stage, name))
    folders = [n for n in folders if os.path.isdir(os.path.join(stage, n))]
    if len(folders) < len(gps.DATA_PARTS):
        raise gps.Failure("stage the data first: gpu_paper_scale.py stage --data 1 and --data 2")
    if source is None:
        return folders
    if not os.path.isfile(os.path.join(source, "config.json")):
        raise gps.Failure(f"{source} holds no run (no config.json)")
    members = []
    for folder, dirs, names in os.walk(source):
        dirs.sort()
        members += [os.path.relpath(os.path.join(folder, n), source) for n in sorted(names) if not n.startswith(".")]
    outbox = os.path.join(stage, "outbox")
    manifest = gps.pack(pack_name(run), source, members, outbox, into=run, piece_bytes=TRAVEL_PIECE_BYTES)
    files = [f"{pack_name(run)}.manifest.json"] + [p["file"] for p in manifest["pieces"]]
    tree, carried = gps.travelling_bytes(root, stage)
    if tree + TRAVEL_MARGIN + TRAVEL_PIECE_BYTES > gps.TRAVEL_LIMIT:
        raise gps.Failure(f"the tree alone is {tree / MIB:.1f} MiB: `gpu_paper_scale.py travel untrack` first")
    index = 0
    while files:
        if index == len(folders):
            folders.append(gps.carry_name(index + 1))
        name = folders[index]
        room = gps.TRAVEL_LIMIT - TRAVEL_MARGIN - tree - carried.get(name, 0)
        target = os.path.join(stage, name, gps.INBOX)
        os.makedirs(target, exist_ok=True)
        while files and os.path.getsize(os.path.join(outbox, pack_name(run), files[0])) <= room:
            room -= os.path.getsize(os.path.join(outbox, pack_name(run), files[0]))
            shutil.move(os.path.join(outbox, pack_name(run), files.pop(0)), target)
        index += 1
    shutil.rmtree(os.path.join(outbox, pack_name(run)))
    return folders


def window_calls(folders: list, run: str) -> list:
    """(carry, command) of each call of the window, in order: setup (and the smoke first) for every
    carried folder but the last, whose call trains."""
    calls = []
    for index, name in enumerate(folders):
        if index < len(folders) - 1:
            command = "python3 tools/gpu/gpu_paper_scale.py device setup" + (" smoke" if index == 0 else "")
        else:
            command = f"python3 tools/gpu/gpu_carried_run.py device --run {run} --budget_s B"
        calls.append((f'[".gpu/{name}"]', command))
    return calls


# --------------------------------------------------------------------------------------------
# On the device machine.


def carried_run(device: gps.Device, run: str, dry_run: bool, train_steps: int | None) -> None:
    """The run's window: its carried pieces unpacked (sha256-checked) unless this machine has the
    run already; main.py resumes it and trains until the call's clock leaves room for the curve
    points and the packing (or `train_steps` steps, the dry run's split); the curve points it
    reached are evaluated and every checkpoint but the newest dropped; once trained, the final
    model exported and its evaluations run, each if its projected time fits; all of it packed
    as run_RUN and sent."""
    config, overrides = RUNS[run]
    work = os.path.join(device.stage, "work")
    workdir = os.path.join(work, run)
    if not os.path.isdir(workdir) and os.path.isdir(device.inbox):
        gps.unpack([device.inbox], work)
        device.say(f"{run}: carried state unpacked into {workdir}")
    env = dict(device.cached_env(), PATJAX_DATA_DIR=device.data)
    try:
        status = _train(device, run, config, overrides, workdir, env, dry_run, train_steps)
        _curve_points(device, run, workdir, env, dry_run, final=status["final"])
        if status["step"] == status["final"]:
            _evaluate_final(device, run, workdir, env, dry_run)
    finally:
        if os.path.isdir(workdir):
            members = gps._result_files(workdir) + _newest_checkpoint_files(workdir)
            manifest = gps.pack(pack_name(run), workdir, members, device.outbox, into=run)
            device.say(f"{run}: packed {len(members)} files, {manifest['tar_bytes'] / MIB:.1f} MiB")
            gps.send(pack_name(run), device.outbox, device.out)


def _train(device, run, config, overrides, workdir, env, dry_run, train_steps) -> dict:
    """main.py on the run's workdir (a resume when it holds a checkpoint), stopped by the call's
    clock or after `train_steps`; returns {"step", "final"} from its closing line."""
    command = [sys.executable, "main.py", f"--config={config}", f"--workdir={workdir}", *COMMON, *overrides]
    command += [f"--config.data_dir={device.data}", *(DRY_TRAIN if dry_run else [])]
    exported = os.path.join(workdir, "final", f"{run}.safetensors")
    if os.path.isfile(exported):  # trained in an earlier window: only its evaluations are left
        with open(os.path.join(workdir, "carried.json")) as f:
            return json.load(f)
    if train_steps is not None:
        command.append(f"--stop_after_steps={train_steps}")
    else:
        # Training of t seconds reaches at most t / (CURVE_EVERY_EPOCHS * EPOCH_S_FLOOR) curve
        # points, one more at its end: the clock leaves room for each.
        available = device.seconds_left() - gps.PACK_S - CURVE_POINT_S
        train_s = available / (1 + (0 if dry_run else CURVE_POINT_S / (CURVE_EVERY_EPOCHS * EPOCH_S_FLOOR)))
        if train_s < 60:
            raise gps.Failure(f"{run}: {device.seconds_left():.0f} s left leave under a minute of training")
        command.append(f"--max_minutes={train_s / 60:.2f}")
    wall, output = device.run(f"{run}: train", command, device.seconds_left() - CURVE_POINT_S, env)
    found = FINISHED.findall(output)
    if not found:
        raise gps.Failure(f"{run}: main.py printed no closing line (log.txt)")
    status = {"step": int(found[-1][1]), "final": int(found[-1][2])}
    with open(os.path.join(workdir, "carried.json"), "w") as f:
        json.dump(status, f)
    windows = gps._windows(workdir)
    device.record({"step": f"{run}: train", "process_wall_s": round(wall, 1), **status, "windows": windows})
    device.say(f"{run}: at step {status['step']} of {status['final']} after {wall:.1f} s")
    return status


def _checkpoint_steps(workdir: str) -> list:
    folder = os.path.join(workdir, "checkpoints")
    return sorted(int(n) for n in os.listdir(folder) if n.isdigit()) if os.path.isdir(folder) else []


def _newest_checkpoint_files(workdir: str) -> list:
    """The newest checkpoint's files, every one (Orbax's own names), or none once the run is
    exported (its checkpoints are then removed): what the next window resumes from."""
    steps = _checkpoint_steps(workdir)
    if not steps:
        return []
    top = os.path.join(workdir, "checkpoints", str(steps[-1]))
    return sorted(os.path.relpath(os.path.join(d, n), workdir) for d, _, names in os.walk(top) for n in names)


def _curve_points(device, run, workdir, env, dry_run, final: int) -> None:
    """Each checkpoint at a curve step without its evaluation, evaluated (clean and Table-1 PR on
    the first CURVE_EXAMPLES test images, the run's compute dtype); then every checkpoint but the
    newest removed: the evaluated ones are no longer needed and only the newest travels on."""
    every = DRY_CURVE_EVERY_STEPS if dry_run else CURVE_EVERY_EPOCHS * STEPS_PER_EPOCH
    for step in _checkpoint_steps(workdir):
        if step % every or os.path.isfile(os.path.join(workdir, "curve", f"step_{step:06d}", "results.json")):
            continue
        command = [sys.executable, "-m", "patjax.evaluate", f"--workdir={workdir}", f"--step={step}", "--overwrite"]
        command += CURVE_EVALUATE + (DRY_EVALUATE if dry_run else [])
        wall, _ = device.run(f"{run}: curve point {step}", command, 300, env)
        device.record({"step": f"{run}: curve point {step}", "process_wall_s": round(wall, 1)})
    steps = _checkpoint_steps(workdir)
    for step in steps[:-1]:
        shutil.rmtree(os.path.join(workdir, "checkpoints", str(step)))
    if steps and steps[-1] < final:
        device.say(f"{run}: checkpoint {steps[-1]} kept for the next window")


def _evaluate_final(device, run, workdir, env, dry_run) -> None:
    """The final model exported (then its checkpoints dropped) and evaluated in fp32, each
    evaluation of FINAL_EVALUATIONS not yet done and whose projected time fits what is left."""
    exported = os.path.join(workdir, "final", f"{run}.safetensors")
    if not os.path.isfile(exported) and device.seconds_left() - gps.PACK_S < (5 if dry_run else EXPORT_S):
        device.say(f"{run}: trained; its export and evaluations are left for the next window")
        return
    if not os.path.isfile(exported):
        os.makedirs(os.path.dirname(exported), exist_ok=True)
        command = [sys.executable, "-m", "patjax.export", f"--workdir={workdir}", f"--out={exported}", "--overwrite"]
        device.run(f"{run}: export", command, 120, env)
        shutil.rmtree(os.path.join(workdir, "checkpoints"))
    for name, flags, projected_s in FINAL_EVALUATIONS:
        out_dir = os.path.join(workdir, "fp32", name)
        if os.path.isfile(os.path.join(out_dir, "eval", "results.json")):
            continue
        if device.seconds_left() - gps.PACK_S < (5 if dry_run else projected_s):
            device.say(f"{run}: fp32 {name} and what follows are left for the next window")
            return
        command = [sys.executable, "-m", "patjax.evaluate", f"--torch_checkpoint={exported}", f"--out_dir={out_dir}"]
        command += ["--overwrite", *flags, *((DRY_EVALUATE + DRY_FINAL_EVALUATE.get(name, [])) if dry_run else [])]
        wall, _ = device.run(f"{run}: fp32 {name}", command, device.seconds_left() - gps.PACK_S, env)
        with open(os.path.join(out_dir, "eval", "results.json")) as f:
            per_evaluator = json.load(f).get("evaluator_wall_time_s")
        device.record({"step": f"{run}: fp32 {name}", "process_wall_s": round(wall, 1), "evaluators_s": per_evaluator})


# --------------------------------------------------------------------------------------------
# Command line.


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--root", default=gps.REPO, help="the repository root")
    p.add_argument("--stage", default=None, help=f"the staging folder (default: ROOT/{gps.STAGE})")
    sub = p.add_subparsers(dest="command", required=True)
    stage = sub.add_parser("stage", help="the committed run, in pieces, into the carried folders")
    stage.add_argument("--run", required=True, choices=sorted(RUNS))
    stage.add_argument("--from", dest="source", default=None, help="the committed run's folder (none: first window)")
    stage.add_argument("--no_check", action="store_true", help="skip the travel check (data staged at --level 0)")
    device = sub.add_parser("device", help="the window's last call: setup, then the run")
    device.add_argument("--run", required=True, choices=sorted(RUNS))
    device.add_argument("--out", default=os.environ.get("OUT"), help="$OUT (default: the environment's)")
    device.add_argument("--dry_run", action="store_true", help="the small CNN, a few steps (CPU)")
    device.add_argument("--budget_s", type=float, default=570, help="this call's seconds (under its timeout_s)")
    device.add_argument("--train_steps", type=int, default=None, help="train this many steps, not on the clock")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    root = os.path.abspath(args.root)
    stage = os.path.abspath(args.stage or os.path.join(root, gps.STAGE))
    try:
        if args.command == "stage":
            folders = stage_run(root, stage, args.run, args.source and os.path.abspath(args.source))
            if not args.no_check:
                gps.travel_check(root, stage)
            print("the window's calls, in order (B: budget_left_s less about 40 s; timeout_s B + 10):")
            for number, (carry, command) in enumerate(window_calls(folders, args.run), 1):
                print(f"  {number}. carry {carry}: {command}")
            print(f"  then, if call {len(folders)} says pieces were left: `device send --name {pack_name(args.run)}`")
        else:
            if not args.out:
                raise gps.Failure("the device step writes to $OUT: set OUT or give --out")
            if args.train_steps is not None and args.train_steps < 1:
                raise gps.Failure(f"--train_steps must be at least 1, got {args.train_steps}")
            if not math.isfinite(args.budget_s) or args.budget_s <= 0:
                raise gps.Failure(f"--budget_s must be a positive number of seconds, got {args.budget_s}")
            device = gps.Device(root, stage, args.out, args.dry_run, args.budget_s)
            device.setup()
            carried_run(device, args.run, args.dry_run, args.train_steps)
    except gps.Failure as failure:
        print(f"gpu_carried_run: {failure}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
