"""What the benchmarks that time a patjax evaluator against a reference PyTorch loop share
(certify_speed.py, pr_speed.py): the committed small CNN in both frameworks, CIFAR-10's first
test images, and their two arms timed by benchmarks/timing.py, each in a process of its own.

The network is docs/results/table1_cpu/runs/cifar10_small_cnn/clean_s0 (clean training, 800
steps): the patjax arm restores it as patjax restores a run; the reference arm reads its export
(`python -m patjax.export`, made once per measurement in a process of its own) into
patjax_torch's SmallCNN (normalization inside, eval mode), so that it starts no JAX. Needs PyTorch.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KEPT_RUN = os.path.join(REPO, "docs/results/table1_cpu/runs/cifar10_small_cnn/clean_s0")
sys.path.insert(0, os.path.join(REPO, "benchmarks"))
import timing  # noqa: E402


def reference(name: str):
    """A transcription of a reference in tests/ (`smoothing_reference`, `prbench_reference`)."""
    sys.path.insert(0, os.path.join(REPO, "tests"))
    return __import__(name)


def start_jax():
    """The patjax arm's process set up as every patjax command line sets itself up; then JAX's
    compile spans are listened to (`timing.timed_jax_call`)."""
    from patjax.core import compile_cache, devices

    devices.use_cpu_cores_as_devices()  # before JAX starts
    compile_cache.enable()
    timing.compile_spans()


def committed_small_cnn():
    """(model_fns, state): the committed small CNN in patjax."""
    from patjax.run import workdir as workdir_lib

    _, model_fns, state = workdir_lib.restore(KEPT_RUN)
    return model_fns, state


def export_committed_small_cnn(directory: str) -> str:
    """The committed small CNN exported to PyTorch's state_dict in `directory` (a process of its own)."""
    path = os.path.join(directory, "clean_s0.safetensors")
    subprocess.run(
        [sys.executable, "-m", "patjax.export", f"--workdir={KEPT_RUN}", f"--out={path}", "--overwrite"],
        check=True,
        capture_output=True,
        cwd=REPO,
    )
    return path


def torch_small_cnn(path: str):
    """The exported small CNN in PyTorch (patjax_torch's SmallCNN, eval mode), read without JAX."""
    import torch

    from patjax.interop import torch_weights
    from patjax_torch import models as torch_models

    arrays = torch_weights.read_state_dict(path)
    net = torch_models.create_model("small_cnn", 10, (arrays["mu"].ravel(), arrays["sigma"].ravel()))
    net.load_state_dict({k: torch.from_numpy(v) for k, v in arrays.items()}, strict=True)
    return net.eval()


def first_test_images(n: int):
    """CIFAR-10's first n test images (`cifar.find_data_dir`), as a `cifar.Split`."""
    from patjax.data import cifar

    split = cifar.load_split("cifar10", "test", cifar.find_data_dir())
    return cifar.Split(split.images[:n], split.labels[:n])


def as_torch(images):
    """8-bit NHWC images as PyTorch's (n, 3, H, W) float32 in [0, 1], the way patjax reads them."""
    import numpy as np
    import torch

    return torch.from_numpy((np.asarray(images, np.float32) / 255.0).transpose(0, 3, 1, 2).copy())


def measure(script: str, arm_flags: list, args, gate=None) -> dict:
    """The patjax arm (cold and warm) and the reference arm of `script` (run as
    `script --arm patjax|theirs ARM_FLAGS`, the reference with the export) under
    benchmarks/timing.py's discipline, with the timing flags of `args` (`gate`: see timing.measure)."""
    with tempfile.TemporaryDirectory() as directory:
        exported = export_committed_small_cnn(directory)
        command = (sys.executable, os.path.abspath(script), *arm_flags)
        arms = [
            timing.Arm("theirs", (*command, "--arm=theirs", f"--torch-weights={exported}")),
            timing.Arm("patjax", (*command, "--arm=patjax"), compiles=True),
        ]
        return timing.measure(arms, rounds=args.rounds, max_load=args.max_load, force=args.force, gate=gate)


def summary(measured: dict, images: int) -> dict:
    """The figures of a two-arm measurement: each arm's walls (minimum, median), images per
    second at the median, and how many times faster patjax ran, cold and warm."""
    arms = measured["arms"]
    return {
        "figure": measured["figure"],
        "start_load": measured["start_load"],
        "max_load": measured["max_load"],
        "rounds": measured["rounds"],
        "walls_s": {name: arm["wall_s"] for name, arm in arms.items()},
        "compile_s": {name: arm["compile_s"] for name, arm in arms.items() if arm["compile_s"]},
        "loads": {name: [(r["load_before"], r["load_after"]) for r in arm["records"]] for name, arm in arms.items()},
        "images_per_s": {name: round(images / arm["wall_s"]["median"], 3) for name, arm in arms.items()},
        "speedup_patjax_over_theirs": {
            state: timing.ratio(measured, "theirs", f"patjax {state}") for state in ("cold", "warm")
        },
    }
