#!/usr/bin/env python3
"""The paper-scale GPU run, prepared so that a GPU window is spent on no debugging.

Here (the machine with the repository and the data), before each device call:
  python benchmarks/gpu_paper_scale.py travel untrack   # docs/results/ leaves the index: it does not travel
  python benchmarks/gpu_paper_scale.py wheels           # the wheels the GPU machine lacks, into .gpu/carry/whl
  python benchmarks/gpu_paper_scale.py stage --data 1   # CIFAR-10 files 1-2 (then 2: 3-4, 3: 5 + test) into .gpu/carry
  python benchmarks/gpu_paper_scale.py travel check     # what the next call sends, against the 64 MiB limit
On the device machine (a call with carry [".gpu/carry"]):
  python3 benchmarks/gpu_paper_scale.py device setup [smoke] [rates] [main-job] [suite --methods=pgd]
Here, after the calls:
  python benchmarks/gpu_paper_scale.py collect FILES_AT [FILES_AT ...]  # check the pieces' hashes, unpack
  python benchmarks/gpu_paper_scale.py travel retrack   # docs/results/ back in the index, the tree as before

Why each piece (limits of the device tool, /work/.library/device/README.md):
- What travels is the tracked and untracked-not-ignored tree plus the carried paths, 64 MiB in
  all, and docs/results/ alone is about 55 MiB; two CIFAR-10 files are 58.6 MiB. `travel
  untrack` takes docs/results/ out of this checkout's index (`git rm --cached`: no file on disk
  and no commit is touched) and ignores it through a marked block appended to .gitignore;
  `travel retrack` resets the index from HEAD and removes that block, and checks that the tree's
  status is what it was. It refuses to start on staged changes or a docs/results/ that is not
  clean, so the reset restores exactly what was there.
- Files written under ignored paths on the device machine stay there while it is held, but a
  carried path is replaced by each call's copy: the data therefore travel in .gpu/carry/data and
  `device setup` moves them to .gpu/data/, where three calls lay down the six files.
- What comes back is at most 8 files of 16 MiB, 64 MiB together, from $OUT: each result is one
  tar, split into pieces of 15 MiB with their sha256 in a manifest (a ResNet-18 model is 44.7 MB:
  three pieces); pieces that do not fit stay in .gpu/outbox/ for `device send --name NAME --first K`.

--dry_run runs the same steps on the CPU with a tiny stand-in (the small CNN, a few steps, a few
images; the suite smoke_cpu instead of table1_gpu), with --stage and --out as local folders
standing in for the device machine's .gpu/ (its data folder) and $OUT (tests/test_gpu_paper_scale.py).
Run the steps here in the checkout the device tool sends (the session's own), not a helper's.
Nothing here imports patjax: the device steps run patjax's own command lines (main.py,
patjax.evaluate, patjax.experiments).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MIB = 1 << 20
TRAVEL_LIMIT = 64 * MIB  # the device tool's working tree, carried paths included
OUT_FILES, OUT_BYTES = 8, 64 * MIB  # what comes back from $OUT
PIECE_BYTES = 15 * MIB  # under the 16 MiB a file may have, with room for the tar's headers
LOG_RESERVE = 2 * MIB  # $OUT room kept for log.txt and the JSON files
PACK_S = 30  # a call's seconds kept for packing and copying the results into $OUT
# A suite's evaluation under way when its --max_minutes passes runs to its end: a curve point
# (clean and uniform PR on 10,000 images, about 30 s on an H100) then ends inside the call. A
# final evaluation (about 1.8 min) that starts late is cut off by the call's budget and redone by
# the next call; the results are packed either way (docs/reproduction.md has the figures).
SUITE_EVAL_S = 60
STAGE = ".gpu"  # ignored (.gitignore); everything this script writes lives under it
CARRY = "carry"  # .gpu/carry: the one carried path
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
MD5_FILE = "md5.json"  # beside the data (STAGE/carry/ and STAGE/data/): {file: md5}
# Two files of 29.3 MiB per call, beside the ~1 MiB tree and the wheels.
DATA_PARTS = {
    1: ("data_batch_1.bin", "data_batch_2.bin"),
    2: ("data_batch_3.bin", "data_batch_4.bin"),
    3: ("data_batch_5.bin", "test_batch.bin", "batches.meta.txt"),
}
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
DRY_SUITE = ("smoke_cpu", ["--max_runs=1"])
# The step rates that size table1_gpu's runs (docs/reproduction.md): PGD-10 and PAT with the
# cheaper sampler, ResNet-18, batch 256, fp32, random data.
RATES = {
    "pgd10": ["--method", "pgd", "--model", "resnet18", "--batch", "256", "--iters", "4"],
    "pat_cheaper_sampler": [
        *("--method", "pat", "--model", "resnet18", "--batch", "256", "--iters", "4"),
        *("--langevin-steps", "20", "--langevin-init", "clean"),
    ],
}
DRY_RATES = ["--model", "small_cnn", "--batch", "16", "--langevin-steps", "2", "--iters", "1"]
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


def pack(name: str, base: str, members: list, outbox: str) -> dict:
    """Tars `members` (paths relative to `base`) as NAME/..., splits the tar into pieces of
    PIECE_BYTES in outbox/NAME/ and writes its manifest there; returns the manifest."""
    folder = os.path.join(outbox, name)
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    tar_path = os.path.join(folder, f"{name}.tar")
    with tarfile.open(tar_path, "w") as tar:
        for member in sorted(members):
            tar.add(os.path.join(base, member), arcname=f"{name}/{member}", recursive=False)
    pieces = []
    with open(tar_path, "rb") as f:
        for index in range(10_000):
            block = f.read(PIECE_BYTES)
            if not block:
                break
            piece = f"{name}.tar.{index:03d}"
            with open(os.path.join(folder, piece), "wb") as out:
                out.write(block)
            pieces.append({"file": piece, "bytes": len(block), "sha256": hashlib.sha256(block).hexdigest()})
    manifest = {
        "name": name,
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
            f"python3 benchmarks/gpu_paper_scale.py device send --name {name} --first {left[0]}",
            flush=True,
        )
    return left


def unpack(folders: list, into: str) -> list:
    """Every manifest found in `folders`: checks each piece's and the whole tar's sha256 and
    extracts it into `into` (members under NAME/ only, regular files only); returns the names."""
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
                f"`python3 benchmarks/gpu_paper_scale.py device send --name {name} --first {first}` there"
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
                    if parts[0] != name or ".." in parts or m.name.startswith("/") or not (m.isfile() or m.isdir()):
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
        print(f"{name}: {len(manifest['pieces'])} piece(s), sha256 checked, {len(members)} entries -> {into}/{name}")
    return done


# --------------------------------------------------------------------------------------------
# Here: what travels.


def git(root: str, *args: str, check: bool = True) -> str:
    result = subprocess.run(["git", "-C", root, *args], capture_output=True, text=True)
    if check and result.returncode:
        raise Failure(f"git {' '.join(args)}: {result.stderr.strip() or result.stdout.strip()}")
    return result.stdout


def travelling_bytes(root: str) -> tuple:
    """(bytes of the tracked and untracked-not-ignored files, bytes under the carried path)."""
    listed = git(root, "ls-files", "-z", "--cached", "--others", "--exclude-standard").split("\0")
    tree = sum(os.path.getsize(os.path.join(root, p)) for p in listed if p and os.path.isfile(os.path.join(root, p)))
    carry = 0
    for folder, _, names in os.walk(os.path.join(root, STAGE, CARRY)):
        carry += sum(os.path.getsize(os.path.join(folder, n)) for n in names)
    return tree, carry


def travel_check(root: str) -> None:
    tree, carry = travelling_bytes(root)
    total = tree + carry
    print(
        f"travels: tree {tree / MIB:.1f} MiB + {STAGE}/{CARRY} {carry / MIB:.1f} MiB = {total / MIB:.1f} MiB "
        f"(limit {TRAVEL_LIMIT / MIB:.0f} MiB)"
    )
    if total > TRAVEL_LIMIT:
        raise Failure(
            f"{total / MIB:.1f} MiB would travel, over the limit: `travel untrack` takes {UNTRACKED}/ "
            "out, and `stage` carries two data files at a time"
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


def stage_data(stage: str, part: int, source: str) -> None:
    """Replaces STAGE/carry/data with the files of DATA_PARTS[part], their md5s in STAGE/carry/md5.json."""
    folder = os.path.join(stage, CARRY, "data")
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    sums = {}
    for name in DATA_PARTS[part]:
        shutil.copyfile(os.path.join(source, name), os.path.join(folder, name))
        sums[name] = file_hash(os.path.join(folder, name), "md5")
        check_cifar_file(os.path.join(folder, name), sums[name])
    with open(os.path.join(stage, CARRY, MD5_FILE), "w") as f:
        json.dump(sums, f, indent=1)
    print(f"staged {', '.join(DATA_PARTS[part])} in {folder}")


def download_wheels(stage: str) -> None:
    folder = os.path.join(stage, CARRY, "whl")
    os.makedirs(folder, exist_ok=True)
    subprocess.run([sys.executable, *PIP_DOWNLOAD, "-d", folder, *WHEELS], check=True)
    print(f"wheels in {folder}: {', '.join(sorted(os.listdir(folder)))}")


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

    def run(self, label: str, command: list, limit_s: float) -> tuple:
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
                command, cwd=self.root, env=self.env, stdout=self.log, stderr=subprocess.STDOUT, timeout=limit_s
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
        """Installs the carried wheels, lays down the carried data, records the machine."""
        wheels = os.path.join(self.stage, CARRY, "whl")
        found = sorted(n for n in os.listdir(wheels) if n.endswith(".whl")) if os.path.isdir(wheels) else []
        if found:
            self.run(
                "wheels",
                [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile"]
                + ["--no-cache-dir", "--upgrade", "--target", self.site]
                + [os.path.join(wheels, n) for n in found],
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
        carried = os.path.join(self.stage, CARRY, "data")
        if os.path.isdir(carried):
            with open(os.path.join(self.stage, CARRY, MD5_FILE)) as f:
                sums.update(json.load(f))
            os.makedirs(target, exist_ok=True)
            for name in sorted(os.listdir(carried)):
                shutil.move(os.path.join(carried, name), os.path.join(target, name))
            with open(sums_file, "w") as f:
                json.dump(sums, f, indent=1)
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
        """One compiled PAT step of the small CNN on random data: JAX, the GPU and patjax's imports."""
        command = [sys.executable, "benchmarks/epoch_throughput.py", "--model", "small_cnn", "--batch", "32"]
        command += ["--langevin-steps", "2", "--iters", "1", "--no-flops", "--json"]
        wall, output = self.run("smoke", command, 180)
        self.record({"step": "smoke", "wall_s": round(wall, 1), "result": _last_json_line(output)})

    def rates(self) -> None:
        """The step time of table1_gpu's two runs (ResNet-18, batch 256, fp32, random data)."""
        for name, flags in RATES.items():
            flags = flags[:2] + DRY_RATES if self.dry_run else flags
            command = [sys.executable, "benchmarks/epoch_throughput.py", *flags, "--no-flops", "--json"]
            wall, output = self.run(f"rate {name}", command, 240)
            self.record({"step": f"rate {name}", "wall_s": round(wall, 1), "result": _last_json_line(output)})

    def main_job(self, epochs: int) -> None:
        """main.py with the paper's config for `epochs` epochs, then patjax.evaluate on it."""
        workdir = os.path.join(self.stage, "work", "main_job")
        steps = epochs * (DRY_MAIN_JOB_STEPS if self.dry_run else STEPS_PER_EPOCH)
        train = [sys.executable, "main.py", f"--config={MAIN_JOB_CONFIG}", f"--workdir={workdir}"]
        train += [f"--config.data_dir={self.data}", "--config.progress_bar=False", f"--stop_after_steps={steps}"]
        # --overwrite: a rerun on a warm machine resumes the training, so its evaluation is of a later step.
        evaluate = [sys.executable, "-m", "patjax.evaluate", f"--workdir={workdir}", "--overwrite"]
        with self.packed("main_job", workdir, None):
            wall, _ = self.run("main job: train", train + (DRY_MAIN_JOB if self.dry_run else []), 540)
            windows = _windows(workdir)
            steady = windows[1:]  # the first window holds the compilation
            mean = round(sum(w["s_per_epoch"] for w in steady) / len(steady), 1) if steady else None
            entry = {"step": "main job: train", "steps": steps, "process_wall_s": round(wall, 1), "windows": windows}
            self.record({**entry, "s_per_epoch_after_compile": mean})
            self.say(f"main job: {steps} steps in {wall:.1f} s, s/epoch after the compilation {mean}")
            wall, _ = self.run("main job: evaluate", evaluate + (DRY_EVALUATE if self.dry_run else []), 540)
            with open(os.path.join(workdir, "eval", "results.json")) as f:
                per_evaluator = json.load(f).get("evaluator_wall_time_s")
            self.record({"step": "main job: evaluate", "process_wall_s": round(wall, 1), "evaluators_s": per_evaluator})

    @contextlib.contextmanager
    def packed(self, name: str, workdir: str, model_methods: list | None):
        """Packs the workdir's results for $OUT when the block ends, also when it failed: what a
        run wrote before it stopped comes back with the log."""
        try:
            yield
        finally:
            if os.path.isdir(workdir):
                members = _result_files(workdir, model_methods)
                manifest = pack(name, workdir, members, self.outbox)
                self.say(f"{name}: packed {len(members)} files, {manifest['tar_bytes'] / MIB:.1f} MiB")
                send(name, self.outbox, self.out)

    def suite(self, name: str, methods: str | None, max_minutes: float | None) -> None:
        """A suite's runs (python -m patjax.experiments) on the laid-down data; then its results,
        with the final model of each run of `methods` (all: None) but no checkpoint or curve
        model, packed for $OUT. Without max_minutes, training stops (with a checkpoint) early
        enough for an evaluation under way to end inside the call (SUITE_EVAL_S)."""
        suite, extra = DRY_SUITE if self.dry_run else (name, [])
        if methods:
            extra = [*extra, f"--methods={methods}"]
        if max_minutes is None:
            max_minutes = (self.seconds_left() - PACK_S - SUITE_EVAL_S) / 60
        if max_minutes <= 0:
            raise Failure(f"suite {suite}: no time left for training in this call's budget (--budget_s)")
        workdir = os.path.join(self.stage, "work", suite)
        command = [sys.executable, "-m", "patjax.experiments", f"--suite={suite}", f"--workdir={workdir}"]
        command += [f"--data_dir={self.data}", "--progress_bars=false", f"--max_minutes={max_minutes:.2f}", *extra]
        with self.packed(suite, workdir, methods.split(",") if methods else None):
            wall, _ = self.run(f"suite {suite}", command, 600)
            entry = {"step": f"suite {suite}", "args": extra, "max_minutes": round(max_minutes, 2)}
            self.record({**entry, "wall_s": round(wall, 1)})


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


def _result_files(workdir: str, model_methods: list | None = None) -> list:
    """The files of a workdir (or a suite's) that a commit needs: everything but checkpoints,
    caches, event files and locks, and of the kept models only the final one of each run whose
    method is in `model_methods` (None: every run's; a suite's run lives in .../METHOD_sSEED)."""
    members = []
    for folder, dirs, names in os.walk(workdir):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS)
        final = None
        if os.path.basename(folder) == "models":
            record = os.path.join(os.path.dirname(folder), "suite_run.json")
            if os.path.isfile(record):
                with open(record) as f:
                    final = f"step_{int(json.load(f)['step']):06d}.safetensors"
        for n in sorted(names):
            if n.startswith("."):
                continue
            method = os.path.basename(os.path.dirname(folder)).rsplit("_s", 1)[0]
            if os.path.basename(folder) == "models" and (
                n != final or (model_methods is not None and method not in model_methods)
            ):
                continue
            members.append(os.path.relpath(os.path.join(folder, n), workdir))
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
    stage = sub.add_parser("stage", help=f"CIFAR-10 files into STAGE/{CARRY}/data")
    stage.add_argument("--data", type=int, required=True, choices=sorted(DATA_PARTS), help=f"{DATA_PARTS}")
    stage.add_argument("--data_src", default=None, help=f"the {CIFAR_DIR}/ folder (default: ../shared/data's)")
    stage.add_argument("--no_check", action="store_true", help="skip the travel check (a stage outside a checkout)")
    collect = sub.add_parser("collect", help="check and unpack the pieces brought back")
    collect.add_argument("folders", nargs="+", help="files_at folder(s) of the device calls")
    collect.add_argument("--into", default=None, help="where NAME/ is unpacked (default: ROOT/docs/results)")
    device = sub.add_parser("device", help="steps on the device machine (or their dry run here)")
    device.add_argument("steps", nargs="+", choices=("setup", "smoke", "rates", "main-job", "suite", "send"))
    device.add_argument("--out", default=os.environ.get("OUT"), help="$OUT (default: the environment's)")
    device.add_argument("--dry_run", action="store_true", help="tiny stand-ins on the same path (CPU)")
    device.add_argument("--epochs", type=int, default=2, help="main job: epochs of the paper's config")
    device.add_argument(
        "--budget_s", type=float, default=570, help="this call's seconds (under its timeout_s): no step runs past them"
    )
    device.add_argument("--suite", default="table1_gpu", help="suite: which (--dry_run: smoke_cpu)")
    device.add_argument("--methods", default=None, help="suite: --methods of patjax.experiments")
    device.add_argument("--max_minutes", type=float, default=None, help="suite: --max_minutes of patjax.experiments")
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
            stage_data(stage, args.data, args.data_src or default_data_source(root))
            if not args.no_check:
                travel_check(root)
        elif args.command == "collect":
            unpack(args.folders, args.into or os.path.join(root, "docs", "results"))
        else:
            if not args.out:
                raise Failure("device steps write to $OUT: set OUT or give --out")
            device = Device(root, stage, args.out, args.dry_run, args.budget_s)
            for step in args.steps:
                if step == "setup":
                    device.setup()
                elif step == "smoke":
                    device.smoke()
                elif step == "rates":
                    device.rates()
                elif step == "main-job":
                    device.main_job(args.epochs)
                elif step == "suite":
                    device.suite(args.suite, args.methods, args.max_minutes)
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
