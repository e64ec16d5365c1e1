"""benchmarks/gpu_paper_scale.py: what travels, the pieces that come back, and its CPU dry run."""

import hashlib
import importlib.util
import json
import os
import subprocess
import sys

import pytest
from conftest import REPO

SCRIPT = REPO / "benchmarks" / "gpu_paper_scale.py"
CIFAR = REPO.parent / "shared" / "data" / "cifar-10-batches-bin"


def load_script():
    spec = importlib.util.spec_from_file_location("gpu_paper_scale", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def script(*args, cwd=None):
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, cwd=cwd)


def git(repo, *args):
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout


def travelling(repo):
    """The device tool's rule: tracked and untracked-not-ignored files."""
    return sorted(git(repo, "ls-files", "--cached", "--others", "--exclude-standard").split())


@pytest.fixture
def repo(tmp_path):
    root = tmp_path / "repo"
    (root / "docs" / "results" / "suite" / "runs").mkdir(parents=True)
    (root / "patjax").mkdir()
    (root / "docs" / "results" / "suite" / "runs" / "model.bin").write_bytes(os.urandom(3000))
    (root / "docs" / "results" / "notes.md").write_text("figures\n")
    (root / "docs" / "design.md").write_text("design\n")
    (root / "patjax" / "__init__.py").write_text("")
    (root / ".gitignore").write_text("runs/\n!/docs/results/*/runs/\n")
    git(root, "init", "-q")
    git(root, "add", "-A")
    git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "init")
    return root


def test_untrack_keeps_docs_results_from_travelling_and_retrack_restores_the_tree(repo):
    head, before = git(repo, "rev-parse", "HEAD"), travelling(repo)
    assert "docs/results/suite/runs/model.bin" in before
    done = script("--root", str(repo), "travel", "untrack")
    assert done.returncode == 0, done.stderr
    assert travelling(repo) == [".gitignore", "docs/design.md", "patjax/__init__.py"]
    assert (repo / "docs" / "results" / "suite" / "runs" / "model.bin").is_file()  # on disk all along
    assert script("--root", str(repo), "travel", "untrack").returncode == 0  # twice: nothing more happens
    done = script("--root", str(repo), "travel", "retrack")
    assert done.returncode == 0, done.stderr
    assert git(repo, "status", "--porcelain") == "" and git(repo, "rev-parse", "HEAD") == head
    assert travelling(repo) == before


def test_untrack_refuses_staged_changes_and_leaves_everything_as_it_was(repo):
    (repo / "docs" / "design.md").write_text("changed\n")
    git(repo, "add", "docs/design.md")
    status = git(repo, "status", "--porcelain")
    done = script("--root", str(repo), "travel", "untrack")
    assert done.returncode == 1 and len(done.stderr.strip().splitlines()) == 1 and "staged" in done.stderr
    assert git(repo, "status", "--porcelain") == status and "docs/results/notes.md" in travelling(repo)


def test_pieces_round_trip_within_the_limits_of_what_comes_back(tmp_path, monkeypatch):
    gps = load_script()
    monkeypatch.setattr(gps, "PIECE_BYTES", 4096)
    monkeypatch.setattr(gps, "LOG_RESERVE", 0)
    source = tmp_path / "work"
    (source / "eval").mkdir(parents=True)
    payload = os.urandom(20_000)
    (source / "eval" / "model.bin").write_bytes(payload)
    (source / "record.json").write_text("{}")
    (source / "invocations.jsonl").write_text('{"window": 1}\n{"window": 2}\n')
    members = ["eval/model.bin", "record.json", "invocations.jsonl"]
    manifest = gps.pack("result", str(source), members, str(tmp_path / "outbox"))
    pieces = len(manifest["pieces"])
    assert pieces == -(-manifest["tar_bytes"] // 4096) and pieces >= 5
    # An $OUT that takes 4 more files: the manifest and 3 pieces, with room kept for the 3 logs.
    monkeypatch.setattr(gps, "OUT_FILES", 7)
    outs, first = [], 0
    while True:
        outs.append(str(tmp_path / f"out{len(outs)}"))
        left = gps.send("result", str(tmp_path / "outbox"), outs[-1], first=first)
        assert len(os.listdir(outs[-1])) == 1 + min(3, pieces - first)
        if not left:
            break
        assert left == list(range(first + 3, pieces))
        first = left[0]
        if len(outs) == 1:
            with pytest.raises(gps.Failure, match="missing"):
                gps.unpack(outs, str(tmp_path / "back"))
    assert len(outs) == -(-pieces // 3)
    # An earlier window's suite log is kept, the lines it lacks appended.
    (tmp_path / "back" / "result").mkdir(parents=True)
    (tmp_path / "back" / "result" / "invocations.jsonl").write_text('{"window": 0}\n{"window": 1}\n')
    gps.unpack(outs, str(tmp_path / "back"))
    assert (tmp_path / "back" / "result" / "eval" / "model.bin").read_bytes() == payload
    assert (tmp_path / "back" / "result" / "invocations.jsonl").read_text() == (
        '{"window": 0}\n{"window": 1}\n{"window": 2}\n'
    )
    # A piece damaged on the way is refused, and nothing is unpacked from it.
    damaged = tmp_path / outs[-1] / manifest["pieces"][-1]["file"]
    damaged.write_bytes(b"x" + damaged.read_bytes()[1:])
    with pytest.raises(gps.Failure, match="does not match"):
        gps.unpack(outs, str(tmp_path / "again"))
    assert not (tmp_path / "again" / "result").exists()


def sha256(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.slow
def test_the_dry_run_lays_the_data_down_runs_the_main_job_and_a_suite_and_brings_their_results_back(tmp_path):
    """The device sequence on the CPU: three staged calls lay CIFAR-10 down (size and md5
    checked), then main.py + patjax.evaluate and a suite run (the small CNN, a few steps), whose
    results come back in pieces that `collect` checks and unpacks."""
    stage, out = tmp_path / "stage", tmp_path / "out"
    # A file damaged between staging and laying down is refused with one line.
    done = script("--stage", str(stage), "stage", "--data", "1", "--data_src", str(CIFAR), "--no_check")
    assert done.returncode == 0, done.stderr
    damaged = stage / "carry" / "data" / "data_batch_2.bin"
    content = bytearray(damaged.read_bytes())
    content[-1] ^= 1
    damaged.write_bytes(bytes(content))
    done = script("--stage", str(stage), "device", "setup", "--out", str(out), "--dry_run")
    assert done.returncode == 1 and "data_batch_2.bin" in done.stderr and len(done.stderr.strip().splitlines()) == 1
    for part in (1, 2, 3):
        done = script("--stage", str(stage), "stage", "--data", str(part), "--data_src", str(CIFAR), "--no_check")
        assert done.returncode == 0, done.stderr
        # the staged files are those of this part only: a carried path is replaced by each call
        assert len(os.listdir(stage / "carry" / "data")) == (3 if part == 3 else 2)
        done = script("--stage", str(stage), "device", "setup", "--out", str(out), "--dry_run")
        assert done.returncode == 0, done.stdout + done.stderr
    laid = stage / "data" / "cifar-10-batches-bin"
    assert sorted(os.listdir(laid)) == sorted(os.listdir(CIFAR))
    assert all(sha256(laid / n) == sha256(CIFAR / n) for n in os.listdir(CIFAR))
    done = script(
        *("--stage", str(stage), "device", "main-job", "suite", "--methods", "pat"),
        *("--out", str(out), "--dry_run", "--budget_s", "1200"),
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    back = tmp_path / "back"
    done = script("collect", str(out), "--into", str(back))
    assert done.returncode == 0, done.stderr
    # The main job: 2 "epochs" of 2 steps, evaluated; each window's seconds from metrics.jsonl by hand.
    timings = json.loads((out / "timings.json").read_text())
    main_job = next(t for t in timings if t["step"] == "main job: train")
    metrics = [json.loads(line) for line in (back / "main_job" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [2, 4] and main_job["steps"] == 4
    assert [w["seconds"] for w in main_job["windows"]] == [round(2 * 32 / m["images_per_s"], 2) for m in metrics]
    assert json.loads((back / "main_job" / "eval" / "results.json").read_text())["settings"]["num_examples"] == 16
    assert set(next(t for t in timings if t["step"] == "main job: evaluate")["evaluators_s"]) >= {"clean", "pgd20"}
    # The suite's run: its final model comes back byte for byte, its checkpoints do not.
    run = back / "smoke_cpu" / "runs" / "cifar10_small_cnn" / "pat_s0"
    final = json.loads((run / "suite_run.json").read_text())["step"]
    model = f"step_{final:06d}.safetensors"
    assert os.listdir(run / "models") == [model]
    device_run = stage / "work" / "smoke_cpu" / "runs" / "cifar10_small_cnn" / "pat_s0"
    assert sha256(run / "models" / model) == sha256(device_run / "models" / model)
    assert (run / "eval" / "per_image.npz").is_file() and (run / "curve").is_dir()
    assert not (run / "checkpoints").exists()
    assert json.loads((out / "env.json").read_text())["versions"]["jax"]
    assert len(os.listdir(out)) <= 8
