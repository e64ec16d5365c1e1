"""tools/gpu/gpu_paper_scale.py: what travels, the pieces that come back, and its CPU dry run."""

import hashlib
import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
from conftest import REPO

from patjax.data import cifar

SCRIPT = REPO / "tools" / "gpu" / "gpu_paper_scale.py"
# The real CIFAR-10 files where every test finds them ($PATJAX_DATA_DIR, else ../shared/data).
CIFAR = pathlib.Path(cifar.find_data_dir() or REPO.parent / "shared" / "data") / "cifar-10-batches-bin"


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


def test_a_workdir_comes_back_without_its_locks_temporaries_and_checkpoints(tmp_path):
    """What a device block packs for $OUT and `collect` unpacks: the results, none of the locks
    (a workdir's .lock, a suite run's .claim, the suite's .report.lock) nor the temporary files
    of a writer killed halfway (.NAME.RANDOM.tmp), which are no result and would come back as
    stale locks and leftovers, nor the checkpoints and caches."""
    gps = load_script()
    work = tmp_path / "work" / "suite"
    results = {
        "config.json": "{}",
        "invocations.jsonl": '{"window": 1}\n',
        "results.md": "figures\n",
        "pat_s0/metrics.jsonl": '{"step": 2}\n',
        "pat_s0/eval/results.json": '{"clean": 0.5}',
        "pat_s0/models/step_000002.safetensors": "weights",
    }
    hidden = [
        ".report.lock",
        "pat_s0/.lock",
        "pat_s0/.claim",
        "pat_s0/eval/.results.json.k3j2x9.tmp",
        "pat_s0/eval/.per_example.npz.q81w0c.tmp.npz",
        "pat_s0/models/.step_000004.safetensors.a0b1c2.tmp",
    ]
    skipped = ["pat_s0/checkpoints/checkpoint_2", "pat_s0/jax_cache/entry", "pat_s0/tensorboard/events.out"]
    for name in [*results, *hidden, *skipped]:
        (work / name).parent.mkdir(parents=True, exist_ok=True)
        (work / name).write_text(results.get(name, "not a result"))
    device = gps.Device(str(REPO), str(tmp_path / "stage"), str(tmp_path / "out"), dry_run=True, budget_s=60)
    try:
        with device.packed("suite", str(work)):
            pass
    finally:
        device.log.close()
    gps.unpack([str(tmp_path / "out")], str(tmp_path / "back"))
    back = tmp_path / "back" / "suite"
    came_back = sorted(str(p.relative_to(back)) for p in back.rglob("*") if p.is_file())
    assert came_back == sorted(results)
    assert all((back / name).read_text() == text for name, text in results.items())


def sha256(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_encoding_of_cifar_records_is_lossless_and_a_damaged_file_is_refused():
    """Real records (a quarter of a test batch) survive encode/decode byte for byte; the residuals
    are the hand-written filter's, and a cut encoded file is one Failure, not a wrong image."""
    gps = load_script()
    raw = (CIFAR / "test_batch.bin").read_bytes()[: 2500 * 3073]
    blob = gps.encode_cifar(raw, level=0)
    assert gps.decode_cifar(blob) == raw and len(blob) < 0.85 * len(raw)
    # The first record's red plane, row 0: its first pixel, then left-neighbour differences
    # minus the green plane's, mod 256, as the docstring says.
    body = gps.lzma.decompress(blob[len(gps.ENCODING_MAGIC) :])
    count = len(raw) // 3073
    record = list(raw[1:3073])
    red, green = record[0:32], record[1024:1056]
    expected = [(red[0] - green[0]) % 256] + [
        ((red[j] - red[j - 1]) - (green[j] - green[j - 1])) % 256 for j in range(1, 32)
    ]
    assert list(body[count : count + 32]) == expected
    with pytest.raises(gps.Failure, match="damaged"):
        gps.decode_cifar(blob[:-100])
    with pytest.raises(gps.Failure, match="header"):
        gps.decode_cifar(raw)


def test_rates_together_count_only_the_steps_both_processes_ran_at_once():
    """Two benchmarks sharing a device, written out by hand: PGD steps at 0.5 s alone, 0.8 s while
    PAT (0.9 s a step) runs, then 0.5 s again. Over its whole run PGD's median is its alone step
    (the window that measured 0.039 s "together" for a 0.080 s step); over the span both ran in,
    0.8 s. Too few steps in the span give None, which the plan reads as not measured."""
    gps = load_script()

    def run(start, times):
        ends = list(np.round(start + np.cumsum(times), 4))
        return {"step_end_unix": ends, "step_times_s": times}

    pgd = run(100.0, [0.5] * 4 + [0.8] * 6 + [0.5] * 4)
    pat = run(101.9, [0.9] * 5)  # 101.9 to 106.4: PGD's 0.8 s steps from 102.0 to 106.0 lie inside
    assert np.median(pgd["step_times_s"]) == 0.5
    medians, counts = gps.overlap_medians({"pgd": pgd, "pat": pat}, 5)
    assert medians == {"pgd": 0.8, "pat": 0.9} and counts == {"pgd": 5, "pat": 5}
    medians, _ = gps.overlap_medians({"pgd": pgd, "pat": pat}, 6)
    assert medians == {"pgd": None, "pat": None}
    # One after the other: no span in common.
    medians, counts = gps.overlap_medians({"pgd": run(100.0, [0.5] * 4), "pat": run(103.0, [0.9] * 5)}, 1)
    assert medians == {"pgd": None, "pat": None} and counts == {"pgd": 0, "pat": 0}


def test_the_pair_plan_takes_the_largest_part_that_fits_the_measured_rates(tmp_path):
    """plan_pair against the budget arithmetic written out by hand: 5,850 steps at the slower
    step, the fixed costs, per-model evaluation with 3 laws or 1, packing and the spare."""
    gps = load_script()
    stage = tmp_path / "stage"
    stage.mkdir()
    rates = {"alone": {"pat": 0.050, "pgd": 0.030}, "together": {"pat": 0.060, "pgd": 0.045}}
    (stage / "rates.json").write_text(json.dumps(rates))

    def plan(budget_s, methods=("pat", "pgd")):
        device = gps.Device(str(REPO), str(stage), str(tmp_path / "out"), False, budget_s)
        return device.plan_pair(methods)

    fixed = 75 + 30 + 30  # TRAIN_FIXED_S + PACK_S + PLAN_SPARE_S
    both_3_laws = 5850 * 0.060 + fixed + 2 * (60 + 3 * 25)  # 756 s
    both_1_law = 5850 * 0.060 + fixed + 2 * (60 + 25)  # 656 s
    pat_3_laws = 5850 * 0.050 + fixed + (60 + 3 * 25)  # 562.5 s
    pat_1_law = 5850 * 0.050 + fixed + (60 + 25)  # 512.5 s
    assert plan(both_3_laws + 2) == {**plan(both_3_laws + 2), "methods": ["pat", "pgd"], "laws": list(gps.PAIR_LAWS)}
    assert plan(both_1_law + 2)["laws"] == ["uniform"] and plan(both_1_law + 2)["methods"] == ["pat", "pgd"]
    assert plan(both_1_law - 2) == {**plan(both_1_law - 2), "methods": ["pat"], "laws": list(gps.PAIR_LAWS)}
    assert plan(pat_3_laws - 2)["methods"] == ["pat"] and plan(pat_3_laws - 2)["laws"] == ["uniform"]
    # PGD alone (the next window, when PAT came back): its own rate decides.
    assert plan(5850 * 0.030 + fixed + 60 + 3 * 25 + 2, ("pgd",))["laws"] == list(gps.PAIR_LAWS)
    # Below PAT's last option, PGD alone still fits (a window that brings the PGD run).
    assert plan(pat_1_law - 2)["methods"] == ["pgd"]
    pgd_1_law = 5850 * 0.030 + fixed + (60 + 25)  # 395.5 s
    with pytest.raises(gps.Failure, match="nothing fits"):
        plan(pgd_1_law - 2)
    # Rates together not measured: only the methods alone are candidates.
    rates["together"] = {"pat": None, "pgd": None}
    (stage / "rates.json").write_text(json.dumps(rates))
    assert plan(both_3_laws + 2)["methods"] == ["pat"]


def stage_data(stage):
    """CIFAR-10 staged as a window's first two calls carry it (xz level 0: fast; --no_check: the
    real tree beside it would be over the travel limit), batches 4-5 and the test batch in carry2."""
    for part in ("1", "2"):
        args = ("--stage", str(stage), "stage", "--data", part, "--data_src", str(CIFAR), "--no_check", "--level", "0")
        done = script(*args)
        assert done.returncode == 0, done.stderr
    assert sorted(os.listdir(stage / "carry2" / "data")) == [
        "batches.meta.txt",
        "data_batch_4.bin.pjxz",
        "data_batch_5.bin.pjxz",
        "test_batch.bin.pjxz",
    ]


@pytest.mark.slow
@pytest.mark.long
def test_the_dry_run_lays_the_data_down_in_two_calls_and_runs_the_smoke(tmp_path):
    """The first calls of every window still to run (docs/maintainers.md: E and F, C2, C3), on
    the CPU: the data staged in two carried folders, a damaged file refused in one line naming
    it, `device setup smoke` with the first and `device setup` with the second, which lay
    CIFAR-10 down byte for byte (decoded, size and md5 checked) and record the versions."""
    stage = tmp_path / "stage"
    stage_data(stage)
    damaged = stage / "carry1" / "data" / "data_batch_2.bin.pjxz"
    intact = damaged.read_bytes()
    damaged.write_bytes(intact[:-1000])
    done = script("--stage", str(stage), "device", "setup", "--out", str(tmp_path / "bad"), "--dry_run")
    assert done.returncode == 1 and "data_batch_2.bin" in done.stderr and len(done.stderr.strip().splitlines()) == 1
    damaged.write_bytes(intact)
    for steps, out in ((("setup", "smoke"), tmp_path / "out1"), (("setup",), tmp_path / "out2")):
        done = script("--stage", str(stage), "device", *steps, "--out", str(out), "--dry_run", "--budget_s", "600")
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert len(os.listdir(out)) <= 8
    laid = stage / "data" / "cifar-10-batches-bin"
    assert sorted(os.listdir(laid)) == sorted(os.listdir(CIFAR))
    assert all(sha256(laid / n) == sha256(CIFAR / n) for n in os.listdir(CIFAR))
    timings = json.loads((tmp_path / "out1" / "timings.json").read_text())
    smoke = next(t for t in timings if t["step"] == "smoke")
    assert smoke["result"]["median_step_s"] > 0
    assert json.loads((tmp_path / "out1" / "env.json").read_text())["versions"]["jax"]


@pytest.mark.past_windows
def test_the_dry_run_lays_the_data_down_and_runs_the_window_and_brings_its_results_back(tmp_path):
    """Windows A, B and C1's sequence on the CPU (those windows have run: opt-in, `-m
    past_windows`): two staged calls lay CIFAR-10 down (decoded, size and md5
    checked), the smoke and the rates, then the pair (main.py for both methods at once, export,
    fp32 evaluation, comparison) and the main job (the small CNN, a few steps), whose results
    come back in pieces that `collect` checks and unpacks."""
    stage, out, out2 = tmp_path / "stage", tmp_path / "out", tmp_path / "out2"
    stage_data(stage)
    for part in (1, 2):
        steps = ("setup", "smoke", "rates") if part == 1 else ("setup", "pair")
        done = script(
            "--stage",
            str(stage),
            "device",
            *steps,
            "--out",
            str(out if part == 1 else out2),
            "--dry_run",
            "--budget_s",
            "1500",
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        if part == 1:
            # The CPU's two 2-step benchmarks may not overlap at all; call 2 must still exercise
            # the window's plan of both methods at once, so it gets rates it can plan that from.
            rates = json.loads((stage / "rates.json").read_text())
            rates["together"] = {m: rates["together"][m] or rates["alone"][m] for m in rates["alone"]}
            (stage / "rates.json").write_text(json.dumps(rates))
    laid = stage / "data" / "cifar-10-batches-bin"
    assert sorted(os.listdir(laid)) == sorted(os.listdir(CIFAR))
    assert all(sha256(laid / n) == sha256(CIFAR / n) for n in os.listdir(CIFAR))
    rates = json.loads((stage / "rates.json").read_text())
    assert set(rates["alone"]) == set(rates["together"]) == {"pat", "pgd"}
    # What does not fit call 2's $OUT (the second model) comes back with a `send` call.
    assert len(os.listdir(out2)) <= 8
    out3, out4 = tmp_path / "out3", tmp_path / "out4"
    args = ("device", "send", "main-job", "--name", "pair_model_pgd", "--epochs", "1", "--out", str(out3), "--dry_run")
    done = script("--stage", str(stage), *args, "--budget_s", "600")
    assert done.returncode == 0, done.stderr
    # Window C's main job: another compute dtype, packed on its own, trained only.
    args = ("device", "main-job", "--epochs", "1", "--compute_dtypes", "bfloat16", "--no_evaluate", "--out", str(out4))
    done = script("--stage", str(stage), *args, "--dry_run", "--budget_s", "600")
    assert done.returncode == 0, done.stderr
    back = tmp_path / "back"
    assert len(os.listdir(out3)) <= 8 and len(os.listdir(out4)) <= 8
    done = script("collect", str(out2), str(out3), str(out4), "--into", str(back))
    assert done.returncode == 0, done.stderr
    # The device's workdirs keep their locks (a workdir's .lock stays after its writer ends):
    # there was something hidden to leave out, and none of it came back.
    assert [p for p in (stage / "work").rglob(".*") if p.is_file()], "nothing hidden to leave out"
    assert sorted(str(p.relative_to(back)) for p in back.rglob(".*")) == []
    pair = back / "pair"
    # Both runs trained 4 steps in bf16 with their own methods, on the same evaluation images and noise.
    for method in ("pat", "pgd"):
        config = json.loads((pair / f"{method}_s0" / "config.json").read_text())
        assert (config["method"], config["compute_dtype"], config["seed"]) == (method, "bfloat16", 0)
        metrics = [json.loads(line) for line in (pair / f"{method}_s0" / "metrics.jsonl").read_text().splitlines()]
        assert metrics[-1]["step"] == 4
        device_model = stage / "work" / "pair" / "final" / f"{method}_s0.safetensors"
        assert sha256(pair / "final" / f"{method}_s0.safetensors") == sha256(device_model)
        assert not (pair / f"{method}_s0" / "checkpoints").exists()
    settings = [
        json.loads((pair / "fp32" / f"{m}_s0" / "eval" / "results.json").read_text())["settings"]
        for m in ("pat", "pgd")
    ]
    assert settings[0]["num_examples"] == settings[1]["num_examples"] == 16 and settings[0]["seed"] == 0
    assert "pgd_s0" in (pair / "compare.txt").read_text()
    # The main job: 1 "epoch" of 2 steps per dtype (fp32 evaluated, bf16 not); each window's
    # seconds from metrics.jsonl by hand.
    for out_k, dtype in ((out3, "float32"), (out4, "bfloat16")):
        timings = json.loads((out_k / "timings.json").read_text())
        main_job = next(t for t in timings if t["step"] == f"main job {dtype}: train")
        run = back / f"main_job_{dtype}"
        assert json.loads((run / "config.json").read_text())["compute_dtype"] == dtype
        metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        assert [m["step"] for m in metrics] == [2] and main_job["steps"] == 2
        assert [w["seconds"] for w in main_job["windows"]] == [round(2 * 32 / m["images_per_s"], 2) for m in metrics]
        assert not (run / "checkpoints").exists()
    evaluated = json.loads((back / "main_job_float32" / "eval" / "results.json").read_text())
    assert evaluated["settings"]["num_examples"] == 16
    assert not (back / "main_job_bfloat16" / "eval").exists()
    assert not any(t["step"] == "main job bfloat16: evaluate" for t in json.loads((out4 / "timings.json").read_text()))
    # A main job of no epochs or an unknown dtype is refused in one line, before anything runs.
    for bad in (("--epochs", "0"), ("--compute_dtypes", "float16")):
        done = script("--stage", str(stage), "device", "main-job", *bad, "--out", str(tmp_path / "out5"), "--dry_run")
        assert done.returncode == 1 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert json.loads((out / "env.json").read_text())["versions"]["jax"]
