"""tools/gpu/gpu_carried_run.py: a run carried across GPU windows ends bitwise where one
uninterrupted run ends, through the same pieces, commits and restores a window uses."""

import json
import os
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest
from conftest import REPO
from safetensors.numpy import load_file
from test_gpu_paper_scale import CIFAR, git, stage_data

from patjax.run import workdir as workdir_lib

SCRIPT = REPO / "tools" / "gpu" / "gpu_carried_run.py"
PAPER_SCALE = REPO / "tools" / "gpu" / "gpu_paper_scale.py"


def script(path, *args):
    return subprocess.run([sys.executable, str(path), *args], capture_output=True, text=True, cwd=REPO)


def ok(done):
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


@pytest.fixture(scope="module")
def data_stage(tmp_path_factory):
    """CIFAR-10 staged once for every machine of the test (`stage_data`)."""
    stage = tmp_path_factory.mktemp("data")
    stage_data(stage)
    return stage


def small_tree(tmp_path):
    """A checkout whose tree is small: what `stage` counts beside the carried folders."""
    root = tmp_path / "tree"
    root.mkdir()
    (root / "README.md").write_text("x\n")
    git(root, "init", "-q")
    return root


def checkpoint_state(workdir, step):
    """The whole train state of the workdir's checkpoint of `step` (parameters, BatchNorm
    statistics, optimizer state, step, key), as numpy leaves by path."""
    _, _, state = workdir_lib.restore(workdir, step=step)
    return {jax.tree_util.keystr(k): np.asarray(v) for k, v in jax.tree_util.tree_leaves_with_path(state)}


def training_lines(workdir):
    """metrics.jsonl without what depends on the machine's speed."""
    lines = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in line.items() if k not in ("images_per_s", "window_steps")} for line in lines]


@pytest.mark.slow
@pytest.mark.long
def test_a_run_split_over_two_windows_ends_bitwise_as_one_run_and_brings_its_curve_and_evaluations(
    tmp_path, data_stage
):
    """The dry run (small CNN, 8 steps, a curve point every 4) trained by one main.py, and the same
    run carried over two windows, each on a fresh machine: 5 steps (past the curve point at 4,
    evaluated there and its checkpoint dropped), then the rest with the final model's
    evaluations. Between the windows the pieces come back, are unpacked as a commit would hold
    them, staged in pieces beside the data and laid down on the next machine. The state carried
    at step 5 (parameters, BatchNorm statistics, momentum, step, key) and the final model are
    bitwise those of the uninterrupted run, and so is every training figure of its log; the
    curve points at steps 4 and 8 and the fp32 evaluations come back."""
    tree = small_tree(tmp_path)
    reference = tmp_path / "reference"
    config, overrides = "configs/pgd_atpr_cifar10.py", []
    sys.path.insert(0, str(REPO / "tools" / "gpu"))
    try:
        import gpu_carried_run as carried
    finally:
        sys.path.pop(0)
    train = [f"--config={config}", f"--workdir={reference}", *carried.COMMON, *overrides, *carried.DRY_TRAIN]
    # Every step checkpointed: checkpoints do not change what a step computes.
    train += ["--config.checkpoint_every_steps=1", f"--config.data_dir={CIFAR.parent}"]
    ok(subprocess.run([sys.executable, "main.py", *train], capture_output=True, text=True, cwd=REPO))

    committed = None
    for window, steps in enumerate((5, None), 1):
        machine, out = tmp_path / f"machine{window}", tmp_path / f"out{window}"
        shutil.copytree(data_stage, machine)
        stage = ["--root", str(tree), "--stage", str(machine), "stage", "--run", "pgd_atpr", "--no_check"]
        printed = ok(script(SCRIPT, *stage, *(["--from", str(committed)] if committed else [])))
        # The small CNN's state fits beside the data: two calls, the second trains.
        assert '2. carry [".gpu/carry2"]: python3 tools/gpu/gpu_carried_run.py device --run pgd_atpr' in printed
        assert bool(committed) == (machine / "carry1" / "inbox").is_dir()
        device = ["--stage", str(machine), "device", "--run", "pgd_atpr", "--dry_run", "--out", str(out)]
        ok(script(SCRIPT, *device, "--budget_s", "1500", *(["--train_steps", str(steps)] if steps else [])))
        assert len(os.listdir(out)) <= 8
        back = tmp_path / f"committed{window}"
        ok(script(PAPER_SCALE, "collect", str(out), "--into", str(back)))
        committed = back / "pgd_atpr"
        status = json.loads((committed / "carried.json").read_text())
        assert status == {"step": 5 if window == 1 else 8, "final": 8}
        if window == 1:
            assert sorted(os.listdir(committed / "checkpoints")) == ["5"]  # the newest alone
            assert sorted(os.listdir(committed / "curve")) == ["step_000004"]
            carried_state = checkpoint_state(str(committed), 5)
            expected = checkpoint_state(str(reference), 5)
            assert carried_state.keys() == expected.keys() and len(expected) > 10
            for key, value in expected.items():
                np.testing.assert_array_equal(carried_state[key], value, err_msg=key)
    assert not (committed / "checkpoints").exists()
    exported = tmp_path / "reference.safetensors"
    ok(subprocess.run(
        [sys.executable, "-m", "patjax.export", f"--workdir={reference}", f"--out={exported}"],
        capture_output=True, text=True, cwd=REPO,
    ))  # fmt: skip
    final, expected = load_file(committed / "final" / "pgd_atpr.safetensors"), load_file(exported)
    assert final.keys() == expected.keys()
    for key in expected:
        np.testing.assert_array_equal(final[key], expected[key], err_msg=key)
    assert training_lines(committed) == training_lines(reference)
    assert sorted(os.listdir(committed / "curve")) == ["step_000004", "step_000008"]
    for step in (4, 8):
        results = json.loads((committed / "curve" / f"step_{step:06d}" / "results.json").read_text())
        assert results["settings"]["step"] == step and results["settings"]["pr"]["distribution"] == "uniform"
    for name, _, _ in carried.FINAL_EVALUATIONS:
        assert (committed / "fp32" / name / "eval" / "results.json").is_file(), name


def test_staging_refuses_a_tree_that_leaves_no_room_and_a_folder_without_a_run(tmp_path):
    tree = small_tree(tmp_path)
    (tree / "big.bin").write_bytes(b"\0" * (63 << 20))
    machine = tmp_path / "machine"
    for part in (1, 2):  # where the data would be
        (machine / f"carry{part}" / "data").mkdir(parents=True)
    source = tmp_path / "run"
    source.mkdir()
    done = script(SCRIPT, "--root", str(tree), "--stage", str(machine), "stage", "--run", "pat", "--from", str(source))
    assert done.returncode == 1 and "no run" in done.stderr and len(done.stderr.strip().splitlines()) == 1
    (source / "config.json").write_text("{}")
    done = script(SCRIPT, "--root", str(tree), "--stage", str(machine), "stage", "--run", "pat", "--from", str(source))
    assert done.returncode == 1 and "travel untrack" in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert not (machine / "carry3").exists()


def test_pieces_fill_the_room_the_data_leave_then_a_call_of_their_own_and_join_back_whole(tmp_path):
    """Carried folders of 61 and 49 MiB (sparse files: sizes only) beside a small tree: the
    manifest rides with carry1, 4 MiB pieces fill carry2's room, the rest take carry3, each
    folder with the tree under the travel limit; the pieces, gathered as the device's setup
    gathers them, unpack to the run's files, byte for byte."""
    sys.path.insert(0, str(REPO / "tools" / "gpu"))
    try:
        import gpu_carried_run as carried
        import gpu_paper_scale as gps
    finally:
        sys.path.pop(0)
    tree, machine, source = small_tree(tmp_path), tmp_path / "machine", tmp_path / "run"
    for part, mib in ((1, 61), (2, 49)):
        (machine / f"carry{part}" / "data").mkdir(parents=True)
        with open(machine / f"carry{part}" / "data" / "batch.bin", "wb") as f:
            f.truncate(mib << 20)
    (source / "checkpoints" / "7").mkdir(parents=True)
    (source / "config.json").write_text("{}")
    state = os.urandom(20 << 20)
    (source / "checkpoints" / "7" / "state").write_bytes(state)
    folders = carried.stage_run(str(tree), str(machine), "pgd_atpr", str(source))
    assert folders == ["carry1", "carry2", "carry3"]
    held = {name: sorted(os.listdir(machine / name / "inbox")) for name in folders}
    assert held["carry1"] == ["run_pgd_atpr.manifest.json"]
    # 64 - 2 (margin) - 49 leaves 13 MiB in carry2: three pieces; 20 MiB and the tar's headers: six.
    assert len(held["carry2"]) == 3 and len(held["carry3"]) == 3
    gps.travel_check(str(tree), str(machine))  # raises over the limit
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    for name in folders:
        for entry in held[name]:
            shutil.copy(machine / name / "inbox" / entry, inbox)
    gps.unpack([str(inbox)], str(tmp_path / "back"))
    assert (tmp_path / "back" / "pgd_atpr" / "checkpoints" / "7" / "state").read_bytes() == state
    calls = carried.window_calls(folders, "pgd_atpr")
    assert [c for c, _ in calls] == ['[".gpu/carry1"]', '[".gpu/carry2"]', '[".gpu/carry3"]']
    assert calls[0][1].endswith("device setup smoke") and calls[1][1].endswith("device setup")
    assert "gpu_carried_run.py device --run pgd_atpr" in calls[2][1]
