#!/usr/bin/env python3
"""The paper-scale GPU run, prepared so that a GPU window is spent on no debugging.

Here (the machine with the repository and the data), before the window:
  python tools/gpu/gpu_paper_scale.py travel untrack   # docs/results/ leaves the index: it does not travel
  python tools/gpu/gpu_paper_scale.py wheels           # the wheels the GPU machine lacks, into .gpu/whl (once)
  python tools/gpu/gpu_paper_scale.py stage --data 1   # CIFAR-10 batches 1-3, encoded, and the wheels: .gpu/carry1
  python tools/gpu/gpu_paper_scale.py stage --data 2   # batches 4-5 and the test batch: .gpu/carry2
On the device machine (call K carries [".gpu/carryK"]):
  python3 tools/gpu/gpu_paper_scale.py device setup smoke rates     # call 1
  python3 tools/gpu/gpu_paper_scale.py device setup pair             # call 2
  (also: main-job [--epochs N] [--compute_dtypes float32,bfloat16] [--no_evaluate], send --name NAME --first K)
Here, after the calls:
  python tools/gpu/gpu_paper_scale.py collect FILES_AT [FILES_AT ...]  # check the pieces' hashes, unpack
  python tools/gpu/gpu_paper_scale.py travel retrack   # docs/results/ back in the index, the tree as before

Why each piece (limits of the device tool, /work/.library/device/README.md):
- What travels is the tracked and untracked-not-ignored tree plus the carried paths, 64 MiB in
  all, and docs/results/ alone is about 55 MiB. `travel untrack` takes docs/results/ out of this
  checkout's index (`git rm --cached`: no file on disk and no commit is touched) and ignores it
  through a marked block appended to .gitignore; `travel retrack` resets the index from HEAD and
  removes that block, and checks that the tree's status is what it was. It refuses to start on
  staged changes or a docs/results/ that is not clean, so the reset restores exactly what was there.
- The six CIFAR-10 files are 175.8 MiB, three calls raw; encoded losslessly (`encode_cifar`) they
  take two. Both calls' carried folders are staged before the window, so that the next call is
  made at once: a machine left idle for 30 s is given back, with the data laid down on it.
- Files written under ignored paths on the device machine stay there while it is held, but a
  carried path is replaced by each call's copy: `device setup` therefore decodes the carried files
  into .gpu/data/, checking each against the official file's size and md5 taken here.
- What comes back is at most 8 files of 16 MiB, 64 MiB together, from $OUT: each result is one
  tar, split into pieces just under 16 MiB with their sha256 in a manifest (a ResNet-18 model is
  44.7 MB: three pieces); pieces that do not fit stay in .gpu/outbox/ for `device send --name
  NAME --first K`.

--dry_run runs the same steps on the CPU with a tiny stand-in (the small CNN, a few steps, a few
images), with --stage and --out as local folders
standing in for the device machine's .gpu/ (its data folder) and $OUT (tests/test_gpu_paper_scale.py).
Run the steps here in the checkout the device tool sends (the session's own), not a helper's.
Nothing here imports patjax: the device steps run patjax's own command lines (main.py,
patjax.export, patjax.evaluate) and benchmarks/speed/epoch_throughput.py.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import lzma
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MIB = 1 << 20
TRAVEL_LIMIT = 64 * MIB  # the device tool's working tree, carried paths included
OUT_FILES, OUT_BYTES = 8, 64 * MIB  # what comes back from $OUT
PIECE_BYTES = 16 * MIB - 64 * 1024  # under the 16 MiB a file from $OUT may have
LOG_RESERVE = 2 * MIB  # $OUT room kept for log.txt and the JSON files
PACK_S = 30  # a call's seconds kept for packing and copying the results into $OUT
STAGE = ".gpu"  # ignored (.gitignore); everything this script writes lives under it
INBOX = "inbox"  # .gpu/carryK/inbox/ holds carried pieces; `device setup` gathers them in .gpu/inbox/
CARRY = "carry"  # .gpu/carryK: what call K carries (the data of DATA_PARTS[K]; the wheels with the first)
UNTRACKED = "docs/results"
IGNORE_BLOCK = (
    "# gpu_paper_scale travel untrack: docs/results is out of the index until `travel retrack`\n/docs/results/\n"
)

# CIFAR-10's binary files and their sizes in the official layout (cifar-10-binary.tar.gz): 10,000
# records of 3,073 bytes each. Their md5s are taken where they are staged (`stage`: the copy this
# project uses, ../shared/data, holds the same images in another order than the archive, so
# its md5s are its own) and checked again where they are laid down.
CIFAR_DIR = "cifar-10-batches-bin"
CIFAR_SIZES = {
    **{f"data_batch_{i}.bin": 30_730_000 for i in range(1, 6)},
    "test_batch.bin": 30_730_000,
    "batches.meta.txt": None,  # the class names: any size
}
MD5_FILE = "md5.json"  # beside the data (STAGE/carry*/ and STAGE/data/): {file: md5 of the official file}
# Two calls carry the six files, each file losslessly encoded (`encode_cifar`: 61 % of its size,
# 17.8 MiB), so that a call carries three beside the ~1 MiB tree; the raw files would take three.
DATA_PARTS = {
    1: ("data_batch_1.bin", "data_batch_2.bin", "data_batch_3.bin"),
    2: ("data_batch_4.bin", "data_batch_5.bin", "test_batch.bin", "batches.meta.txt"),
}
ENCODED = ".pjxz"  # an encoded CIFAR file: NAME.bin.pjxz
ENCODING_MAGIC = b"PJXZ1\n"
CIFAR_RECORD = 3073  # a label byte, then 32x32 red, green and blue planes
# What the GPU machine's image lacks of pyproject.toml's dependencies (KINDS.md's package list;
# tensorflow-datasets is read only with data_dir='tfds'). Pure-Python wheels, the versions here.
WHEELS = ("ml-collections==1.1.0", "tensorboardX==2.6.5")
PIP_DOWNLOAD = (
    "-m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "
    "--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 "
    "--platform manylinux2014_x86_64 --platform manylinux1_x86_64"
).split()

# The main job: the paper's configuration (ResNet-18, T = 100, batch 256, fp32), one epoch is
# 50,000 // 256 = 195 steps. Two epochs: the first window holds the compilation, the second is
# an epoch of the loop as it runs (its checkpoint and per-epoch evaluation included).
STEPS_PER_EPOCH = 50_000 // 256
MAIN_JOB_CONFIG = "configs/pat_cifar10.py"
DRY_MAIN_JOB = [
    "--config.model=small_cnn",
    "--config.batch_size=32",
    "--config.langevin.steps=2",
    "--config.log_every_steps=2",
    "--config.log_test_examples=64",
]
DRY_MAIN_JOB_STEPS = 2  # per "epoch" in the dry run
DRY_EVALUATE = [
    "--num_examples=16",
    "--batch_size=16",
    "--evaluators=clean,pgd20,pr",
    "--pr_samples=4",
    "--pr_chunk_size=4",
    "--pr_distributions=uniform",
]
# The windows' two runs (docs/reproduction.md, "Table 1 at the paper's model scale"): ResNet-18,
# batch 256, bf16 compute, PGD-10 and PAT with the cheaper sampler. Their step rates, on random
# data, alone and both at once (two processes sharing the GPU), decide what the `pair` call runs.
RATE_FLAGS = {
    "pgd": ["--method", "pgd", "--model", "resnet18", "--batch", "256", "--compute-dtype", "bfloat16"],
    "pat": [
        *("--method", "pat", "--model", "resnet18", "--batch", "256", "--compute-dtype", "bfloat16"),
        *("--langevin-steps", "20", "--langevin-init", "clean"),
    ],
}
# Timed steps: alone, and at once. Together, both processes load their programs from the
# persistent cache the alone runs filled, but one may still start seconds before the other and
# each ends alone, so a rate "together" is the median over the steps inside the span where both
# were stepping (`overlap_medians`), and needs at least MIN_OVERLAP_STEPS of each there. At once
# on an H100, PAT's step took 0.105 s and PGD-10's 0.080 s: these counts take about 16 s each.
RATE_ITERS = {"alone": 20, "together": {"pat": 150, "pgd": 200}}
MIN_OVERLAP_STEPS = 20
DRY_RATES = ["--model", "small_cnn", "--batch", "16", "--langevin-steps", "2"]
DRY_RATE_ITERS = {"alone": 1, "together": {"pat": 2, "pgd": 2}}
# Two processes on one GPU: each takes this share of its memory instead of XLA's default 75 %.
SHARED_MEMORY_FRACTION = "0.45"

# The pair: main.py with the paper's config and table1_gpu's settings as overrides (30 epochs,
# the schedule's x0.1 at 75 % and 90 %, seed 0), both methods in bf16 compute, each model then
# exported and evaluated in fp32 (`--torch_checkpoint`: the exported weights in the default fp32
# model) on the 10,000 test images under the Table-1 protocol.
PAIR_EPOCHS = 30
PAIR_TRAIN = [
    f"--config.num_epochs={PAIR_EPOCHS}",
    "--config.seed=0",
    "--config.compute_dtype=bfloat16",
    "--config.progress_bar=False",
    f"--config.log_every_steps={STEPS_PER_EPOCH}",  # clean accuracy on the 10,000 test images each epoch
    "--config.log_test_examples=10000",
    f"--config.checkpoint_every_steps={5 * STEPS_PER_EPOCH}",
]
PAIR_METHOD = {
    "pat": ["--config.method=pat", "--config.langevin.init=clean", "--config.langevin.steps=20"]
    + ["--config.langevin.tolerance=0.0003"],  # the cheaper sampler (protocols.CHEAP_SAMPLER)
    "pgd": ["--config.method=pgd"],
}
DRY_PAIR_TRAIN = [
    *("--config.model=small_cnn", "--config.batch_size=32", "--config.num_train_steps=4"),
    *("--config.log_every_steps=2", "--config.log_test_examples=64", "--config.checkpoint_every_steps=2"),
]
DRY_PAIR_METHOD = {"pat": ["--config.langevin.steps=2"], "pgd": ["--config.attack.steps=2"]}
PAIR_EVALUATE = ["--evaluators=clean,pgd20,cw20,pr", "--num_examples=10000", "--batch_size=500"]
PAIR_EVALUATE += ["--pr_distribution=uniform", "--seed=0"]  # the Table-1 estimand; every model on the same noise
DRY_PAIR_EVALUATE = ["--num_examples=16", "--batch_size=16", "--pr_samples=4", "--pr_chunk_size=4"]
PAIR_LAWS = ("uniform", "gaussian", "pdis")
# What the plan counts beside the measured step rates (projections from docs/performance.md's H100
# figures: a PR law on 10,000 images at 4 eps and N = 100 took 23 s in fp32): per training process
# its start, compilation, 30 clean accuracies on 10,000 images and 6 checkpoints; per model the
# export, the evaluation's start, its compilation and the clean, PGD-20 and CW-20 passes; per law.
TRAIN_FIXED_S = 75
EVAL_FIXED_S = 60
EVAL_LAW_S = 25
PLAN_SPARE_S = 30  # beside PACK_S: the projections' error
# Left out of a result's tar: what resumes training or speeds compilation, not what it computed.
SKIP_DIRS = {"checkpoints", "damaged_checkpoints", "jax_cache", "tensorboard"}
# and every hidden file: the locks (.lock, .claim, .report.lock) and a killed writer's temporary
# file (.NAME.RANDOM.tmp, or .tmp.npz for an .npz: patjax.core.files.temporary_path).


class Failure(Exception):
    """A one-line reason to stop; printed without a traceback, exit status 1."""


# --------------------------------------------------------------------------------------------
# Hashes, pieces, manifests.


def file_hash(path: str, algorithm: str = "sha256") -> str:
    h = hashlib.new(algorithm)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(MIB), b""):
            h.update(block)
    return h.hexdigest()


def pack(
    name: str, base: str, members: list, outbox: str, into: str | None = None, piece_bytes: int | None = None
) -> dict:
    """Tars `members` (paths relative to `base`) as INTO/... (default NAME/...), splits the tar into pieces of
    `piece_bytes` (what comes back from $OUT takes PIECE_BYTES) in outbox/NAME/ and writes its manifest
    there; returns the manifest."""
    folder = os.path.join(outbox, name)
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    tar_path = os.path.join(folder, f"{name}.tar")
    with tarfile.open(tar_path, "w") as tar:
        for member in sorted(members):
            tar.add(os.path.join(base, member), arcname=f"{into or name}/{member}", recursive=False)
    pieces = []
    with open(tar_path, "rb") as f:
        for index in range(10_000):
            block = f.read(piece_bytes or PIECE_BYTES)
            if not block:
                break
            piece = f"{name}.tar.{index:03d}"
            with open(os.path.join(folder, piece), "wb") as out:
                out.write(block)
            pieces.append({"file": piece, "bytes": len(block), "sha256": hashlib.sha256(block).hexdigest()})
    manifest = {
        "name": name,
        "into": into or name,
        "tar_bytes": os.path.getsize(tar_path),
        "tar_sha256": file_hash(tar_path),
        "pieces": pieces,
        "members": sorted(members),
    }
    os.remove(tar_path)
    with open(os.path.join(folder, f"{name}.manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    return manifest


def send(name: str, outbox: str, out: str, first: int = 0) -> list:
    """Copies NAME's manifest and its pieces from index `first` on into `out`, as many as $OUT's
    limits leave room for (LOG_RESERVE kept for the logs); returns the pieces left behind."""
    folder = os.path.join(outbox, name)
    manifest_file = os.path.join(folder, f"{name}.manifest.json")
    if not os.path.isfile(manifest_file):
        raise Failure(f"no packed result {name!r} in {outbox}")
    with open(manifest_file) as f:
        manifest = json.load(f)
    os.makedirs(out, exist_ok=True)
    present = os.listdir(out)
    reserved = len({"log.txt", "env.json", "timings.json"} - set(present))
    if len(present) + reserved + 2 > OUT_FILES:  # no room for the manifest and a piece
        left = list(range(first, len(manifest["pieces"])))
        print(
            f"{name}: no room in $OUT; the next call brings it: "
            f"python3 tools/gpu/gpu_paper_scale.py device send --name {name} --first {first}",
            flush=True,
        )
        return left
    shutil.copyfile(manifest_file, os.path.join(out, os.path.basename(manifest_file)))
    left = []
    for index, piece in enumerate(manifest["pieces"][first:], first):
        present = [os.path.join(out, n) for n in os.listdir(out)]
        used = sum(os.path.getsize(p) for p in present if os.path.isfile(p))
        # log.txt, env.json and timings.json may appear after this: room for all three.
        reserved = len({"log.txt", "env.json", "timings.json"} - set(os.listdir(out)))
        if left or len(present) + reserved + 1 > OUT_FILES or used + LOG_RESERVE + piece["bytes"] > OUT_BYTES:
            left.append(index)
            continue
        shutil.copyfile(os.path.join(folder, piece["file"]), os.path.join(out, piece["file"]))
    if left:
        print(
            f"{name}: {len(left)} piece(s) did not fit in $OUT; the next call brings them: "
            f"python3 tools/gpu/gpu_paper_scale.py device send --name {name} --first {left[0]}",
            flush=True,
        )
    return left


def unpack(folders: list, into: str) -> list:
    """Every manifest found in `folders`: checks each piece's and the whole tar's sha256 and
    extracts it into `into` (members under the manifest's folder only, regular files only); returns the names."""
    found = {}
    for folder in folders:
        for entry in sorted(os.listdir(folder)):
            found.setdefault(entry, os.path.join(folder, entry))
    manifests = [n for n in found if n.endswith(".manifest.json")]
    if not manifests:
        raise Failure(f"no *.manifest.json in {', '.join(folders)}")
    done = []
    for manifest_name in manifests:
        with open(found[manifest_name]) as f:
            manifest = json.load(f)
        name = manifest["name"]
        missing = [p["file"] for p in manifest["pieces"] if p["file"] not in found]
        if missing:
            first = manifest["pieces"].index(next(p for p in manifest["pieces"] if p["file"] == missing[0]))
            raise Failure(
                f"{name}: {len(missing)} piece(s) missing ({', '.join(missing)}); bring them with "
                f"`python3 tools/gpu/gpu_paper_scale.py device send --name {name} --first {first}` there"
            )
        whole = hashlib.sha256()
        os.makedirs(into, exist_ok=True)
        joined = os.path.join(into, f".{name}.tar.part")
        try:
            with open(joined, "wb") as out:
                for piece in manifest["pieces"]:
                    with open(found[piece["file"]], "rb") as f:
                        block = f.read()
                    if len(block) != piece["bytes"] or hashlib.sha256(block).hexdigest() != piece["sha256"]:
                        raise Failure(f"{piece['file']} does not match its manifest (size or sha256): fetch it again")
                    whole.update(block)
                    out.write(block)
            if whole.hexdigest() != manifest["tar_sha256"]:
                raise Failure(f"{name}: the joined pieces do not match the manifest's sha256")
            with tarfile.open(joined) as tar:
                members = tar.getmembers()
                for m in members:
                    parts = m.name.split("/")
                    if (
                        parts[0] != manifest.get("into", name)
                        or ".." in parts
                        or m.name.startswith("/")
                        or not (m.isfile() or m.isdir())
                    ):
                        raise Failure(f"{name}: unexpected tar member {m.name!r}")
                # A suite's log of invocations spans machines: a later window's copy lacks the
                # earlier windows' lines, so the two are merged rather than replaced.
                kept = {}
                for m in members:
                    target = os.path.join(into, m.name)
                    if m.name.endswith("/invocations.jsonl") and os.path.isfile(target):
                        with open(target) as f:
                            kept[target] = f.read().splitlines()
                tar.extractall(into, members=members, filter="data")
                for target, lines in kept.items():
                    with open(target) as f:
                        new = [line for line in f.read().splitlines() if line not in lines]
                    with open(target, "w") as f:
                        f.write("".join(line + "\n" for line in lines + new))
        finally:
            if os.path.exists(joined):
                os.remove(joined)
        done.append(name)
        folder = manifest.get("into", name)
        print(f"{name}: {len(manifest['pieces'])} piece(s), sha256 checked, {len(members)} entries -> {into}/{folder}")
    return done


# --------------------------------------------------------------------------------------------
# Here: what travels.


def git(root: str, *args: str, check: bool = True) -> str:
    result = subprocess.run(["git", "-C", root, *args], capture_output=True, text=True)
    if check and result.returncode:
        raise Failure(f"git {' '.join(args)}: {result.stderr.strip() or result.stdout.strip()}")
    return result.stdout


def carry_name(part: int) -> str:
    return f"{CARRY}{part}"


def travelling_bytes(root: str, stage: str | None = None) -> tuple:
    """(bytes of the tracked and untracked-not-ignored files, {carried folder of `stage` (default
    ROOT/STAGE): its bytes})."""
    listed = git(root, "ls-files", "-z", "--cached", "--others", "--exclude-standard").split("\0")
    tree = sum(os.path.getsize(os.path.join(root, p)) for p in listed if p and os.path.isfile(os.path.join(root, p)))
    carried = {}
    stage = stage or os.path.join(root, STAGE)
    for name in sorted(os.listdir(stage)) if os.path.isdir(stage) else ():
        top = os.path.join(stage, name)
        if name.startswith(CARRY) and os.path.isdir(top):  # the data's and a carried run's (gpu_carried_run.py)
            carried[name] = sum(
                os.path.getsize(os.path.join(folder, n)) for folder, _, names in os.walk(top) for n in names
            )
    return tree, carried


def travel_check(root: str, stage: str | None = None) -> None:
    """Each call carries one .gpu/carryK beside the tree: each pair must be under the limit."""
    tree, carried = travelling_bytes(root, stage)
    for name, carry in sorted(carried.items()) or [("(nothing carried)", 0)]:
        total = tree + carry
        print(
            f"travels with {STAGE}/{name}: tree {tree / MIB:.1f} MiB + {carry / MIB:.1f} MiB = {total / MIB:.1f} MiB "
            f"(limit {TRAVEL_LIMIT / MIB:.0f} MiB)"
        )
        if total > TRAVEL_LIMIT:
            raise Failure(
                f"{total / MIB:.1f} MiB would travel with {STAGE}/{name}, over the limit: `travel untrack` takes "
                f"{UNTRACKED}/ out"
            )


def _status(root: str) -> str:
    return git(root, "status", "--porcelain", "--", UNTRACKED, ".gitignore")


def travel_untrack(root: str) -> None:
    gitignore = os.path.join(root, ".gitignore")
    with open(gitignore) as f:
        if IGNORE_BLOCK in f.read():
            print(f"{UNTRACKED}/ is already out of the index (`travel retrack` puts it back)")
            return
    if git(root, "diff", "--cached", "--name-only"):
        raise Failure("the index holds staged changes: commit or unstage them first (retrack resets it from HEAD)")
    if _status(root):
        raise Failure(f"{UNTRACKED}/ or .gitignore has changes: commit them first (retrack must restore them exactly)")
    count = len(git(root, "ls-files", "-z", "--", UNTRACKED).split("\0")) - 1
    with open(gitignore, "a") as f:
        f.write(IGNORE_BLOCK)
    git(root, "rm", "-r", "-q", "--cached", "--", UNTRACKED)
    print(f"{UNTRACKED}/: {count} files out of the index (still on disk); commit nothing until `travel retrack`")
    travel_check(root)


def travel_retrack(root: str) -> None:
    gitignore = os.path.join(root, ".gitignore")
    with open(gitignore) as f:
        text = f.read()
    if IGNORE_BLOCK not in text:
        print(f"{UNTRACKED}/ was not untracked by this script: nothing to do")
        return
    git(root, "reset", "-q", "HEAD", "--", UNTRACKED)
    with open(gitignore, "w") as f:
        f.write(text.replace(IGNORE_BLOCK, "", 1))
    left = [line for line in _status(root).splitlines() if not line.startswith("??")]
    if left:
        raise Failure(f"after retrack the tree differs from HEAD under {UNTRACKED}/: {left[:3]}")
    count = len(git(root, "ls-files", "-z", "--", UNTRACKED).split("\0")) - 1
    print(f"{UNTRACKED}/: {count} files back in the index; the tree's status is as before")


# --------------------------------------------------------------------------------------------
# Here: what is carried.


def default_data_source(root: str) -> str:
    for candidate in (os.environ.get("PATJAX_DATA_DIR"), os.path.join(os.path.dirname(root), "shared", "data")):
        if candidate and os.path.isdir(os.path.join(candidate, CIFAR_DIR)):
            return os.path.join(candidate, CIFAR_DIR)
    raise Failure(f"no {CIFAR_DIR}/ in $PATJAX_DATA_DIR or ../shared/data: give --data_src")


def encode_cifar(raw: bytes, level: int = 9) -> bytes:
    """A CIFAR binary file, losslessly smaller: within each record's planes every pixel is replaced
    by its difference from its left neighbour (PNG's Sub filter), the red and blue differences by
    their difference from the green one, all mod 256, then xz. Neighbouring pixels and the three
    colours of a pixel are alike, so the residuals are mostly near 0 and compress well (61 % of the
    file at level 9, 81 % at level 0; xz alone 76 %). No image library does this on raw planes."""
    records = _records(raw)
    planes = records[:, 1:].reshape(len(records), 3, 32, 32)
    residual = planes.copy()
    residual[..., 1:] = planes[..., 1:] - planes[..., :-1]  # uint8 arithmetic: mod 256
    residual[:, 0] -= residual[:, 1]
    residual[:, 2] -= residual[:, 1]
    body = records[:, 0].tobytes() + residual.tobytes()
    return ENCODING_MAGIC + lzma.compress(body, preset=level)


def decode_cifar(blob: bytes) -> bytes:
    """`encode_cifar`'s inverse."""
    if not blob.startswith(ENCODING_MAGIC):
        raise Failure("not a file encode_cifar wrote (no PJXZ1 header)")
    try:
        body = np.frombuffer(lzma.decompress(blob[len(ENCODING_MAGIC) :]), np.uint8)
    except lzma.LZMAError as error:
        raise Failure(f"the encoded file is damaged: {error}") from None
    if body.size % CIFAR_RECORD:
        raise Failure(f"the decoded file holds {body.size} bytes, not whole records of {CIFAR_RECORD}")
    count = body.size // CIFAR_RECORD
    residual = body[count:].reshape(count, 3, 32, 32).copy()
    residual[:, 0] += residual[:, 1]
    residual[:, 2] += residual[:, 1]
    planes = np.cumsum(residual, axis=-1, dtype=np.uint8)  # undoes the Sub filter, mod 256
    records = np.empty((count, CIFAR_RECORD), np.uint8)
    records[:, 0] = body[:count]
    records[:, 1:] = planes.reshape(count, -1)
    return records.tobytes()


def _records(raw: bytes) -> np.ndarray:
    if len(raw) % CIFAR_RECORD:
        raise Failure(f"{len(raw)} bytes are not whole CIFAR records of {CIFAR_RECORD}")
    return np.frombuffer(raw, np.uint8).reshape(-1, CIFAR_RECORD)


def stage_data(stage: str, part: int, source: str, level: int = 9) -> None:
    """Replaces STAGE/carryK (K = part) with the files of DATA_PARTS[part], the CIFAR records
    encoded (`encode_cifar`), the official files' md5s in STAGE/carryK/md5.json, and, with the
    first part, the wheels (`wheels` downloads them once into STAGE/whl)."""
    top = os.path.join(stage, carry_name(part))
    shutil.rmtree(top, ignore_errors=True)
    folder = os.path.join(top, "data")
    os.makedirs(folder)
    sums = {}
    for name in DATA_PARTS[part]:
        path = os.path.join(source, name)
        sums[name] = file_hash(path, "md5")
        check_cifar_file(path, sums[name])
        if CIFAR_SIZES[name] is None:  # the class names: a few bytes, carried as they are
            shutil.copyfile(path, os.path.join(folder, name))
            continue
        with open(path, "rb") as f:
            raw = f.read()
        blob = encode_cifar(raw, level)
        if decode_cifar(blob) != raw:  # checked here, where the source is, before it travels
            raise Failure(f"{name}: the encoding does not round-trip")
        with open(os.path.join(folder, name + ENCODED), "wb") as f:
            f.write(blob)
    with open(os.path.join(top, MD5_FILE), "w") as f:
        json.dump(sums, f, indent=1)
    wheels = os.path.join(stage, "whl")
    if part == 1 and os.path.isdir(wheels):
        shutil.copytree(wheels, os.path.join(top, "whl"))
    print(f"staged {', '.join(DATA_PARTS[part])} in {top}")


def download_wheels(stage: str) -> None:
    folder = os.path.join(stage, "whl")
    os.makedirs(folder, exist_ok=True)
    subprocess.run([sys.executable, *PIP_DOWNLOAD, "-d", folder, *WHEELS], check=True)
    print(f"wheels in {folder} (`stage --data 1` carries them): {', '.join(sorted(os.listdir(folder)))}")


def check_cifar_file(path: str, md5: str | None) -> None:
    name = os.path.basename(path)
    size = CIFAR_SIZES[name]
    if size is not None and os.path.getsize(path) != size:
        raise Failure(f"{path} is not in the official layout ({os.path.getsize(path)} bytes, expected {size})")
    if md5 is None or file_hash(path, "md5") != md5:
        raise Failure(f"{path}: its md5 is not the staged file's ({md5}): the copy was damaged, stage it again")


# --------------------------------------------------------------------------------------------
# On the device machine.


class Device:
    """The device steps, each logged to $OUT/log.txt with its wall time in $OUT/timings.json."""

    def __init__(self, root: str, stage: str, out: str, dry_run: bool, budget_s: float):
        self.root, self.stage, self.out, self.dry_run = root, os.path.abspath(stage), out, dry_run
        # The device call's own limit (its timeout_s): no step may run past it, so that the
        # results are packed and in $OUT before the call is killed.
        self.deadline = time.time() + budget_s
        self.data = os.path.join(self.stage, "data")  # where `setup` lays the carried files down
        self.outbox = os.path.join(self.stage, "outbox")
        self.inbox = os.path.join(self.stage, INBOX)  # what calls carried in pieces, gathered across calls
        self.site = os.path.join(self.stage, "site")
        os.makedirs(out, exist_ok=True)
        self.log = open(os.path.join(out, "log.txt"), "a")
        self.timings_file = os.path.join(out, "timings.json")
        self.env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.env["PYTHONPATH"] = os.pathsep.join(p for p in (root, self.site, os.environ.get("PYTHONPATH")) if p)

    def seconds_left(self) -> float:
        return self.deadline - time.time()

    def say(self, message: str) -> None:
        line = f"[{time.strftime('%H:%M:%S')}] {message}"
        print(line, flush=True)
        self.log.write(line + "\n")
        self.log.flush()

    def record(self, entry: dict) -> None:
        timings = []
        if os.path.isfile(self.timings_file):
            with open(self.timings_file) as f:
                timings = json.load(f)
        timings.append({"dry_run": self.dry_run, **entry})
        with open(self.timings_file, "w") as f:
            json.dump(timings, f, indent=1)

    def run(self, label: str, command: list, limit_s: float, env: dict | None = None) -> tuple:
        """Runs a command line in the repository root, its output streamed into log.txt (so that
        it comes back even if the device call is killed); returns (wall time, its output)."""
        limit_s = min(limit_s, self.seconds_left() - PACK_S)
        if limit_s <= 0:
            raise Failure(f"{label}: no time left in this call's budget (--budget_s)")
        self.say(f"{label}: {' '.join(command)} (limit {limit_s:.0f} s)")
        start_offset = self.log.tell()
        start = time.perf_counter()
        try:
            result = subprocess.run(
                command, cwd=self.root, env=env or self.env, stdout=self.log, stderr=subprocess.STDOUT, timeout=limit_s
            )
        except subprocess.TimeoutExpired:
            raise Failure(f"{label}: over its limit of {limit_s:.0f} s (log.txt)") from None
        wall = time.perf_counter() - start
        with open(os.path.join(self.out, "log.txt")) as f:
            f.seek(start_offset)
            output = f.read()
        self.say(f"{label}: exit {result.returncode} after {wall:.1f} s")
        if result.returncode:
            print("\n".join(output.splitlines()[-15:]), flush=True)
            raise Failure(f"{label} failed (exit {result.returncode}); log.txt has its output")
        return wall, output

    # The steps ------------------------------------------------------------------------------

    def setup(self) -> None:
        """Installs the carried wheels, lays down the carried data (decoded, sizes and md5s
        checked), records the machine."""
        carried = sorted(n for n in os.listdir(self.stage) if n.startswith(CARRY)) if os.path.isdir(self.stage) else []
        found = []
        for name in carried:
            wheels = os.path.join(self.stage, name, "whl")
            if os.path.isdir(wheels):
                found += [os.path.join(wheels, n) for n in sorted(os.listdir(wheels)) if n.endswith(".whl")]
        if found:
            self.run(
                "wheels",
                [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile"]
                + ["--no-cache-dir", "--upgrade", "--target", self.site]
                + found,
                300,
            )
        else:
            self.say("wheels: none carried")
        target = os.path.join(self.data, CIFAR_DIR)
        sums_file = os.path.join(self.data, MD5_FILE)
        sums = {}
        if os.path.isfile(sums_file):
            with open(sums_file) as f:
                sums = json.load(f)
        os.makedirs(target, exist_ok=True)
        for name in carried:
            folder = os.path.join(self.stage, name, "data")
            if not os.path.isdir(folder):
                continue
            with open(os.path.join(self.stage, name, MD5_FILE)) as f:
                sums.update(json.load(f))
            for entry in sorted(os.listdir(folder)):
                source = os.path.join(folder, entry)
                if entry.endswith(ENCODED):
                    with open(source, "rb") as f:
                        blob = f.read()
                    decoded = os.path.join(target, entry[: -len(ENCODED)])
                    try:
                        raw = decode_cifar(blob)
                    except Failure as failure:
                        raise Failure(f"{source}: {failure}") from None
                    with open(decoded, "wb") as f:
                        f.write(raw)
                    os.remove(source)
                else:
                    shutil.move(source, os.path.join(target, entry))
        with open(sums_file, "w") as f:
            json.dump(sums, f, indent=1)
        for name in carried:  # a carried run's pieces (gpu_carried_run.py): kept beyond this call
            folder = os.path.join(self.stage, name, INBOX)
            if os.path.isdir(folder):
                os.makedirs(self.inbox, exist_ok=True)
                for entry in sorted(os.listdir(folder)):
                    shutil.move(os.path.join(folder, entry), os.path.join(self.inbox, entry))
                self.say(f"setup: the pieces carried in {name} moved to {self.inbox}")
        present = sorted(n for n in CIFAR_SIZES if os.path.isfile(os.path.join(target, n)))
        for name in present:
            check_cifar_file(os.path.join(target, name), sums.get(name))
        self.say(f"data: {len(present)} of {len(CIFAR_SIZES)} CIFAR-10 files in {target}, sizes and md5 checked")
        self.record({"step": "data", "present": present, "md5": {n: sums[n] for n in present}})
        env = self.describe()
        with open(os.path.join(self.out, "env.json"), "w") as f:
            json.dump(env, f, indent=1)
        self.say(f"machine: {json.dumps(env)}")

    def describe(self) -> dict:
        """The device, driver and package versions that go with every figure."""
        env = {"python": platform.python_version(), "host_cpus": os.cpu_count()}
        smi = shutil.which("nvidia-smi")
        if smi:
            env["nvidia_smi_L"] = subprocess.run([smi, "-L"], capture_output=True, text=True).stdout.strip()
            query = [smi, "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"]
            env["gpu"] = subprocess.run(query, capture_output=True, text=True).stdout.strip()
        probe = (
            "import importlib.metadata as md, json, jax\n"
            "names = ('jax', 'jaxlib', 'jax-cuda13-plugin', 'jax-cuda12-plugin', 'flax', 'optax', "
            "'orbax-checkpoint', 'torch', 'ml-collections', 'tensorboardX', 'numpy')\n"
            "v = {}\n"
            "for n in names:\n"
            "    try:\n"
            "        v[n] = md.version(n)\n"
            "    except md.PackageNotFoundError:\n"
            "        pass\n"
            "print(json.dumps({'versions': v, 'jax_devices': [str(d) for d in jax.devices()]}))\n"
        )
        result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=self.env)
        env.update(json.loads(result.stdout) if result.returncode == 0 else {"probe_error": result.stderr[-500:]})
        return env

    def smoke(self) -> None:
        """Two compiled steps of the pair's PAT (ResNet-18, batch 256, bf16, the cheaper sampler) on
        random data: JAX, the GPU, patjax's imports and the bf16 program, in well under a minute;
        its compilation is cached for `rates`."""
        flags = ["--method", "pat", *DRY_RATES] if self.dry_run else RATE_FLAGS["pat"]
        command = [
            sys.executable,
            "benchmarks/speed/epoch_throughput.py",
            *flags,
            "--iters",
            "2",
            "--no-flops",
            "--json",
        ]
        wall, output = self.run("smoke", command, 180, self.cached_env())
        self.record({"step": "smoke", "wall_s": round(wall, 1), "result": _last_json_line(output)})

    def cached_env(self, **extra) -> dict:
        """The environment with JAX's persistent compilation cache under STAGE (a program compiled
        by one benchmark process loads in the next)."""
        cache = os.path.join(self.stage, "jax_cache")
        return dict(self.env, JAX_COMPILATION_CACHE_DIR=cache, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0", **extra)

    def rate_command(self, method: str, iters: int) -> list:
        flags = ["--method", method, *DRY_RATES] if self.dry_run else RATE_FLAGS[method]
        return [
            sys.executable,
            "benchmarks/speed/epoch_throughput.py",
            *flags,
            "--iters",
            str(iters),
            "--no-flops",
            "--json",
        ]

    def rates(self) -> None:
        """Each pair method's step time alone, then both at once (two processes, each with its
        share of the GPU's memory); written to STAGE/rates.json for `pair` and to timings.json."""
        counts = DRY_RATE_ITERS if self.dry_run else RATE_ITERS
        rates = {"alone": {}, "together": {}}
        for method in RATE_FLAGS:
            wall, output = self.run(
                f"rate {method}", self.rate_command(method, counts["alone"]), 240, self.cached_env()
            )
            result = _last_json_line(output)
            rates["alone"][method] = result["median_step_s"]
            self.record({"step": f"rate {method}", "wall_s": round(wall, 1), "result": result})
        commands = {m: self.rate_command(m, counts["together"][m]) for m in RATE_FLAGS}
        env = self.cached_env(XLA_PYTHON_CLIENT_MEM_FRACTION=SHARED_MEMORY_FRACTION)
        walls, outputs = self.run_together("rates together", commands, 240, env)
        results = {method: _last_json_line(output) for method, output in outputs.items()}
        medians, counts = overlap_medians(results, 1 if self.dry_run else MIN_OVERLAP_STEPS)
        for method, result in results.items():
            rates["together"][method] = medians[method]
            entry = {"step": f"rate {method} together", "wall_s": round(walls[method], 1)}
            self.record({**entry, "overlap_steps": counts[method], "result": result})
        with open(os.path.join(self.stage, "rates.json"), "w") as f:
            json.dump(rates, f, indent=1)
        self.say(f"rates (s/step): {json.dumps(rates)}")

    def run_together(self, label: str, commands: dict, limit_s: float, env: dict) -> tuple:
        """Runs named command lines at once, each into its own log under STAGE/logs/ (appended to
        log.txt when all have ended); returns ({name: wall time}, {name: output}). A failure or a
        time-out of one ends the others."""
        limit_s = min(limit_s, self.seconds_left() - PACK_S)
        if limit_s <= 0:
            raise Failure(f"{label}: no time left in this call's budget (--budget_s)")
        logs = os.path.join(self.stage, "logs")
        os.makedirs(logs, exist_ok=True)
        start, processes, walls = time.perf_counter(), {}, {}
        for name, command in commands.items():
            self.say(f"{label}, {name}: {' '.join(command)} (limit {limit_s:.0f} s)")
            log = open(os.path.join(logs, f"{_safe(label)}_{name}.log"), "w")
            processes[name] = (
                subprocess.Popen(command, cwd=self.root, env=env, stdout=log, stderr=subprocess.STDOUT),
                log,
            )
        failed = []
        while len(walls) < len(processes):
            time.sleep(0.2)
            for name, (process, log) in processes.items():
                if name not in walls and process.poll() is not None:
                    walls[name] = time.perf_counter() - start
                    log.close()
                    if process.returncode:
                        failed.append(f"{name} (exit {process.returncode})")
            if failed or time.perf_counter() - start > limit_s:
                for name, (process, log) in processes.items():
                    if process.poll() is None:
                        process.kill()
                        process.wait()
                        log.close()
                        walls.setdefault(name, time.perf_counter() - start)
                if not failed:
                    failed.append(f"over the limit of {limit_s:.0f} s")
                break
        outputs = {}
        for name in processes:
            with open(os.path.join(logs, f"{_safe(label)}_{name}.log")) as f:
                outputs[name] = f.read()
            self.log.write(f"--- {label}, {name} ---\n{outputs[name]}")
        self.log.flush()
        self.say(f"{label}: " + ", ".join(f"{n} {w:.1f} s" for n, w in walls.items()))
        if failed:
            for name in processes:
                print("\n".join(outputs[name].splitlines()[-8:]), flush=True)
            raise Failure(f"{label}: {', '.join(failed)}; log.txt has the output")
        return walls, outputs

    def main_job(self, epochs: int, dtypes: tuple = ("float32",), evaluate: bool = True) -> None:
        """main.py with the paper's config for `epochs` epochs in each compute dtype, each packed
        as `main_job_DTYPE` (results, metrics and config; no checkpoint), then patjax.evaluate on
        it unless `evaluate` is False (window C measures the loop's s/epoch only)."""
        for dtype in dtypes:
            label = f"main job {dtype}"
            workdir = os.path.join(self.stage, "work", f"main_job_{dtype}")
            steps = epochs * (DRY_MAIN_JOB_STEPS if self.dry_run else STEPS_PER_EPOCH)
            train = [sys.executable, "main.py", f"--config={MAIN_JOB_CONFIG}", f"--workdir={workdir}"]
            train += [f"--config.data_dir={self.data}", "--config.progress_bar=False", f"--stop_after_steps={steps}"]
            train += [f"--config.compute_dtype={dtype}", *(DRY_MAIN_JOB if self.dry_run else [])]
            # --overwrite: a rerun on a warm machine resumes the training, so its evaluation is of a later step.
            evaluate_command = [sys.executable, "-m", "patjax.evaluate", f"--workdir={workdir}", "--overwrite"]
            with self.packed(f"main_job_{dtype}", workdir):
                wall, _ = self.run(f"{label}: train", train, 540)
                windows = _windows(workdir)
                steady = windows[1:]  # the first window holds the compilation
                mean = round(sum(w["s_per_epoch"] for w in steady) / len(steady), 1) if steady else None
                entry = {"step": f"{label}: train", "steps": steps, "process_wall_s": round(wall, 1)}
                self.record({**entry, "windows": windows, "s_per_epoch_after_compile": mean})
                self.say(f"{label}: {steps} steps in {wall:.1f} s, s/epoch after the compilation {mean}")
                if not evaluate:
                    continue
                command = evaluate_command + (DRY_EVALUATE if self.dry_run else [])
                wall, _ = self.run(f"{label}: evaluate", command, 540)
                with open(os.path.join(workdir, "eval", "results.json")) as f:
                    per_evaluator = json.load(f).get("evaluator_wall_time_s")
                entry = {"step": f"{label}: evaluate", "process_wall_s": round(wall, 1)}
                self.record({**entry, "evaluators_s": per_evaluator})

    def plan_pair(self, methods: tuple) -> dict:
        """The largest part of the pair that fits what is left of this call, from the measured
        rates (STAGE/rates.json): both methods at once with every law, then with the Table-1 law
        alone, then each method alone (in the order given) likewise. Refuses when none fits."""
        rates_file = os.path.join(self.stage, "rates.json")
        if not os.path.isfile(rates_file):
            raise Failure("pair: no measured rates on this machine: run `device rates` first (same machine)")
        with open(rates_file) as f:
            rates = json.load(f)
        steps = 4 if self.dry_run else PAIR_EPOCHS * STEPS_PER_EPOCH
        candidates = [(methods, laws) for laws in (len(PAIR_LAWS), 1)] if len(methods) == 2 else []
        candidates += [((m,), laws) for m in methods for laws in (len(PAIR_LAWS), 1)]
        left = self.seconds_left()
        if len(methods) == 2 and None in rates["together"].values():
            self.say("pair: the rates together were not measured (the two processes hardly overlapped)")
            candidates = [c for c in candidates if len(c[0]) == 1]
        for chosen, laws in candidates:
            step_s = max(rates["together" if len(chosen) == 2 else "alone"][m] for m in chosen)
            train_s = steps * step_s + TRAIN_FIXED_S
            eval_s = len(chosen) * (EVAL_FIXED_S + laws * EVAL_LAW_S)
            if train_s + eval_s + PACK_S + PLAN_SPARE_S <= left:
                plan = {"methods": list(chosen), "laws": list(PAIR_LAWS[:laws]), "steps": steps, "step_s": step_s}
                plan.update(train_s=round(train_s), eval_s=round(eval_s), seconds_left=round(left))
                self.say(f"pair plan: {json.dumps(plan)}")
                self.record({"step": "pair plan", **plan})
                return plan
            self.say(f"pair: {'+'.join(chosen)} with {laws} law(s) does not fit ({train_s + eval_s:.0f} s + packing)")
        raise Failure(f"pair: nothing fits the {left:.0f} s left (rates {json.dumps(rates)})")

    def pair(self, methods: tuple) -> None:
        """What `plan_pair` chose: main.py trains each method (both at once when both), each final
        model is exported and evaluated in fp32 on the test images, the two compared; then the
        training workdirs' own evaluation (bf16, clean) if time is left. Packed as `pair` (the
        results and the first method's model) and `pair_model_M` (the other's model)."""
        plan = self.plan_pair(methods)
        root = os.path.join(self.stage, "work", "pair")
        workdirs = {m: os.path.join(root, f"{m}_s0") for m in plan["methods"]}
        finals = {m: os.path.join(root, "final", f"{m}_s0.safetensors") for m in plan["methods"]}
        fp32 = {m: os.path.join(root, "fp32", f"{m}_s0") for m in plan["methods"]}
        train_flags = DRY_PAIR_TRAIN if self.dry_run else []
        commands = {
            m: [sys.executable, "main.py", f"--config={MAIN_JOB_CONFIG}", f"--workdir={workdirs[m]}"]
            + [f"--config.data_dir={self.data}", *PAIR_TRAIN, *PAIR_METHOD[m], *train_flags]
            + (DRY_PAIR_METHOD[m] if self.dry_run else [])
            for m in plan["methods"]
        }
        env = dict(self.env, PATJAX_DATA_DIR=self.data)
        if len(commands) > 1:
            env["XLA_PYTHON_CLIENT_MEM_FRACTION"] = SHARED_MEMORY_FRACTION
        evaluate = [*PAIR_EVALUATE, f"--pr_distributions={','.join(plan['laws'])}"]
        evaluate += DRY_PAIR_EVALUATE if self.dry_run else []
        try:
            walls, _ = self.run_together("pair: train", commands, self.seconds_left() - PACK_S - plan["eval_s"], env)
            for m in plan["methods"]:
                windows = _windows(workdirs[m])
                steady = [w["s_per_epoch"] for w in windows[1:]]  # the first window holds the compilation
                mean = round(sum(steady) / len(steady), 2) if steady else None
                self.record(
                    {
                        "step": f"pair: train {m}",
                        "process_wall_s": round(walls[m], 1),
                        "windows": windows,
                        "s_per_epoch_after_compile": mean,
                        "together": len(commands) > 1,
                    }
                )
                self.say(f"pair: {m} trained in {walls[m]:.1f} s, s/epoch after the compilation {mean}")
            for m in plan["methods"]:
                os.makedirs(os.path.dirname(finals[m]), exist_ok=True)
                export = [sys.executable, "-m", "patjax.export", f"--workdir={workdirs[m]}", f"--out={finals[m]}"]
                self.run(f"pair: export {m}", export + ["--overwrite"], 120, env)
            for m in plan["methods"]:
                command = [sys.executable, "-m", "patjax.evaluate", f"--torch_checkpoint={finals[m]}"]
                command += [f"--out_dir={fp32[m]}", "--overwrite", *evaluate]
                wall, _ = self.run(f"pair: evaluate {m} (fp32)", command, 400, env)
                with open(os.path.join(fp32[m], "eval", "results.json")) as f:
                    per_evaluator = json.load(f).get("evaluator_wall_time_s")
                self.record(
                    {"step": f"pair: evaluate {m}", "process_wall_s": round(wall, 1), "evaluators_s": per_evaluator}
                )
            if len(plan["methods"]) == 2:
                compare = [sys.executable, "-m", "patjax.evaluate", "--compare_only"]
                compare += [f"--workdir={fp32[m]}" for m in plan["methods"]]
                _, output = self.run("pair: compare", compare, 60, env)
                with open(os.path.join(root, "compare.txt"), "w") as f:
                    f.write(output)
            for m in plan["methods"]:  # the main job's own evaluation path: its workdir, in its bf16
                if self.seconds_left() - PACK_S < 60:
                    self.say(f"pair: no time left for {m}'s workdir evaluation (bf16, clean)")
                    continue
                command = [sys.executable, "-m", "patjax.evaluate", f"--workdir={workdirs[m]}", "--overwrite"]
                command += ["--evaluators=clean", "--num_examples=16" if self.dry_run else "--num_examples=10000"]
                self.run(f"pair: evaluate {m}'s workdir (bf16, clean)", command, 60, env)
        finally:
            if os.path.isdir(root):
                logs = os.path.join(self.stage, "logs")
                if os.path.isdir(logs):
                    shutil.copytree(logs, os.path.join(root, "logs"), dirs_exist_ok=True)
                models = [os.path.relpath(finals[m], root) for m in plan["methods"]]
                members = [f for f in _result_files(root) if f not in models[1:]]
                manifest = pack("pair", root, members, self.outbox)
                self.say(f"pair: packed {len(members)} files, {manifest['tar_bytes'] / MIB:.1f} MiB")
                send("pair", self.outbox, self.out)
                for m, model in zip(plan["methods"][1:], models[1:]):
                    if os.path.isfile(os.path.join(root, model)):
                        pack(f"pair_model_{m}", root, [model], self.outbox, into="pair")
                        send(f"pair_model_{m}", self.outbox, self.out)

    @contextlib.contextmanager
    def packed(self, name: str, workdir: str):
        """Packs the workdir's results for $OUT when the block ends, also when it failed: what a
        run wrote before it stopped comes back with the log."""
        try:
            yield
        finally:
            if os.path.isdir(workdir):
                members = _result_files(workdir)
                manifest = pack(name, workdir, members, self.outbox)
                self.say(f"{name}: packed {len(members)} files, {manifest['tar_bytes'] / MIB:.1f} MiB")
                send(name, self.outbox, self.out)


def _safe(label: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in label)


def overlap_medians(results: dict, min_steps: int) -> tuple:
    """({name: median step time}, {name: steps counted}) over the steps each benchmark ran while
    every other was stepping too: from the latest first-step start to the earliest last-step end
    (each step's start is its end less its duration). A median is None where fewer than
    `min_steps` of its steps lie in that span."""
    spans = {}
    for name, result in results.items():
        ends, times = result["step_end_unix"], result["step_times_s"]
        spans[name] = [(end - t, end, t) for end, t in zip(ends, times)]
    lo = max(steps[0][0] for steps in spans.values())
    hi = min(steps[-1][1] for steps in spans.values())
    medians, counts = {}, {}
    for name, steps in spans.items():
        inside = [t for start, end, t in steps if start >= lo and end <= hi]
        counts[name] = len(inside)
        medians[name] = round(float(np.median(inside)), 4) if len(inside) >= min_steps else None
    return medians, counts


def _last_json_line(text: str):
    for line in reversed(text.splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                continue
    return None


def _windows(workdir: str) -> list:
    """Each logging window of a run's metrics.jsonl: its steps, seconds and seconds per epoch
    (the training set's 50,000 images, the last partial batch dropped, as the loop runs it)."""
    with open(os.path.join(workdir, "config.json")) as f:
        batch = json.load(f)["batch_size"]
    windows = []
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        for line in f:
            entry = json.loads(line)
            rate = entry["images_per_s"]
            windows.append(
                {
                    "step": entry["step"],
                    "window_steps": entry["window_steps"],
                    "seconds": round(entry["window_steps"] * batch / rate, 2),
                    "s_per_epoch": round((50_000 // batch) * batch / rate, 2),
                    "test_clean_accuracy": entry.get("test_clean_accuracy"),
                }
            )
    return windows


def _result_files(workdir: str) -> list:
    """The files under a workdir that a commit needs: everything but checkpoints, caches, event
    files and hidden files (the locks and a killed writer's temporary file)."""
    members = []
    for folder, dirs, names in os.walk(workdir):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS)
        members += [os.path.relpath(os.path.join(folder, n), workdir) for n in sorted(names) if not n.startswith(".")]
    return members


# --------------------------------------------------------------------------------------------
# Command line.


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--root", default=REPO, help="the repository root (the device steps run its command lines)")
    p.add_argument("--stage", default=None, help=f"the staging folder (default: ROOT/{STAGE})")
    sub = p.add_subparsers(dest="command", required=True)
    travel = sub.add_parser("travel", help="what travels to the device machine")
    travel.add_argument("action", choices=("check", "untrack", "retrack"))
    sub.add_parser("wheels", help=f"download {', '.join(WHEELS)} into STAGE/{CARRY}/whl")
    stage = sub.add_parser("stage", help=f"CIFAR-10 files, encoded, into STAGE/{CARRY}K (K = --data)")
    stage.add_argument("--data", type=int, required=True, choices=sorted(DATA_PARTS), help=f"{DATA_PARTS}")
    stage.add_argument("--data_src", default=None, help=f"the {CIFAR_DIR}/ folder (default: ../shared/data's)")
    stage.add_argument("--no_check", action="store_true", help="skip the travel check (a stage outside a checkout)")
    stage.add_argument("--level", type=int, default=9, choices=range(10), help="xz preset (9: smallest; 0: fastest)")
    collect = sub.add_parser("collect", help="check and unpack the pieces brought back")
    collect.add_argument("folders", nargs="+", help="files_at folder(s) of the device calls")
    collect.add_argument("--into", default=None, help="where NAME/ is unpacked (default: ROOT/docs/results)")
    device = sub.add_parser("device", help="steps on the device machine (or their dry run here)")
    device.add_argument("steps", nargs="+", choices=("setup", "smoke", "rates", "pair", "main-job", "send"))
    device.add_argument("--out", default=os.environ.get("OUT"), help="$OUT (default: the environment's)")
    device.add_argument("--dry_run", action="store_true", help="tiny stand-ins on the same path (CPU)")
    device.add_argument("--epochs", type=int, default=2, help="main job: epochs of the paper's config")
    device.add_argument(
        "--compute_dtypes", default="float32", help="main job: one run per dtype, in order (float32,bfloat16)"
    )
    device.add_argument("--no_evaluate", action="store_true", help="main job: train only (the loop's s/epoch)")
    device.add_argument(
        "--budget_s", type=float, default=570, help="this call's seconds (under its timeout_s): no step runs past them"
    )
    device.add_argument(
        "--methods",
        default=None,
        help="pair: which of pat,pgd (default both, PAT first)",
    )
    device.add_argument("--name", default=None, help="send: the packed result (main_job, table1_gpu)")
    device.add_argument("--first", type=int, default=0, help="send: the first piece to send")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    root = os.path.abspath(args.root)
    stage = os.path.abspath(args.stage or os.path.join(root, STAGE))
    try:
        if args.command == "travel":
            {"check": travel_check, "untrack": travel_untrack, "retrack": travel_retrack}[args.action](root)
        elif args.command == "wheels":
            download_wheels(stage)
        elif args.command == "stage":
            stage_data(stage, args.data, args.data_src or default_data_source(root), args.level)
            if not args.no_check:
                travel_check(root)
        elif args.command == "collect":
            unpack(args.folders, args.into or os.path.join(root, "docs", "results"))
        else:
            if not args.out:
                raise Failure("device steps write to $OUT: set OUT or give --out")
            # Checked before any step runs, so that a bad flag costs no device time.
            dtypes = tuple(args.compute_dtypes.split(","))
            if "main-job" in args.steps and args.epochs < 1:
                raise Failure(f"main-job takes --epochs of at least 1, got {args.epochs}")
            if "main-job" in args.steps and any(d not in ("float32", "bfloat16") for d in dtypes):
                raise Failure(f"main-job takes --compute_dtypes from float32, bfloat16, got {args.compute_dtypes!r}")
            device = Device(root, stage, args.out, args.dry_run, args.budget_s)
            for step in args.steps:
                if step == "setup":
                    device.setup()
                elif step == "smoke":
                    device.smoke()
                elif step == "rates":
                    device.rates()
                elif step == "pair":
                    methods = tuple(args.methods.split(",")) if args.methods else tuple(PAIR_METHOD)
                    if not methods or any(m not in PAIR_METHOD for m in methods) or len(set(methods)) != len(methods):
                        raise Failure(f"pair takes --methods from {', '.join(PAIR_METHOD)}, got {args.methods!r}")
                    device.pair(methods)
                elif step == "main-job":
                    device.main_job(args.epochs, dtypes, not args.no_evaluate)
                else:
                    if not args.name:
                        raise Failure("send takes --name (and --first)")
                    send(args.name, device.outbox, device.out, args.first)
    except Failure as failure:
        print(f"gpu_paper_scale: {failure}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
