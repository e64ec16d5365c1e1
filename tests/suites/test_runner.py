"""The experiment runner: a tiny suite on real CIFAR-10 trains, evaluates on common random
numbers, reports paired differences that match a hand computation, and resumes."""

import copy
import dataclasses
import io
import itertools
import json
import os
import shutil
import subprocess
import sys
import time

import jax
import numpy as np
import pytest
from conftest import REPO
from safetensors.numpy import load_file

from patjax import methods, suites
from patjax.configs import suites as shipped_suites
from patjax.configs.suites import cpu as cpu_suites
from patjax.core import locks
from patjax.core.errors import UserError
from patjax.data import download
from patjax.evaluators import stats as patjax_stats
from patjax.pat import laws
from patjax.reporting import plots
from patjax.run import config as config_lib
from patjax.run import eval_files, kept_models, train
from patjax.run import workdir as workdir_lib
from patjax.suites import (
    aggregate,
    handover,
    results_md,
    run_outcomes,
    run_status,
    runner,
    workers,
)


def tiny_suite(data_dir, seeds=(0, 1)):
    cfg = cpu_suites.ablation_cpu_suite(data_dir).groups[0].base_config
    cfg.batch_size = 8
    cfg.num_train_steps = 2
    cfg.langevin.steps = 1
    cfg.checkpoint_every_steps = 1
    cfg.log_every_steps = 2
    cfg.eval.batch_size = 16
    # A larger beta and step for PAT so that its models differ from PAT(WOS)'s after 2 steps.
    group = suites.Group(
        "tiny",
        cfg,
        methods=("pat", "pat_wos"),
        seeds=seeds,
        method_overrides={"pat": {"pat.beta": 5.0, "learning_rate": 0.5}},
    )
    return suites.Suite(
        name="tiny",
        description="test",
        groups=(group,),
        num_eval_examples=24,
        eval_batch_size=16,
        evaluators=("clean", "pgd20", "pr"),
        eval_overrides={
            "pr.distribution": "gaussian",
            "pr.distributions": ("gaussian",),
            "seed": 0,
            "pr.samples": 6,
            "pr.chunk_size": 3,
            "attack.steps": 2,
            "bootstrap_resamples": 200,
        },
    )


def load_counts(workdir, name):
    z = np.load(os.path.join(workdir, "runs", "tiny", name, "eval", "per_image.npz"))
    return z["pr_gaussian.counts"].astype(np.float64), z["clean.correct"].astype(bool)


@pytest.mark.slow
@pytest.mark.long
def test_suite_trains_evaluates_reports_and_resumes(tmp_path, fake_data_dir, monkeypatch):
    workdir = str(tmp_path / "suite")
    suite = tiny_suite(fake_data_dir)
    trained = []
    real_train = train.train_run
    monkeypatch.setattr(
        train,
        "train_run",
        lambda settings, wd, **kw: (
            trained.append((settings.method.name, settings.seed)) or real_train(settings, wd, **kw)
        ),
    )

    # An interrupted suite: leave after one run; the report lists the rest as pending.
    log = io.StringIO()
    report = runner.run_suite(suite, workdir, max_runs=1, stream=log)
    assert trained == [("pat_wos", 0)]  # paper order: PAT(WOS) before PAT
    assert (report["num_done"], report["num_runs"]) == (1, 4)
    assert "run 1/4 tiny/pat_wos_s0: training 2 steps" in log.getvalue()
    md = open(os.path.join(workdir, "results.md")).read()
    assert md.count("| pending |") == 3

    # Rerun: the finished run is reused, not retrained or re-evaluated; the rest run.
    eval_json = os.path.join(workdir, "runs", "tiny", "pat_wos_s0", "eval", "results.json")
    mtime = os.path.getmtime(eval_json)
    log = io.StringIO()
    report = runner.run_suite(suite, workdir, stream=log)
    assert trained == [("pat_wos", 0), ("pat", 0), ("pat_wos", 1), ("pat", 1)]  # seed-major
    assert os.path.getmtime(eval_json) == mtime
    assert "tiny/pat_wos_s0: reused" in log.getvalue()
    assert report["num_done"] == 4

    # Everything done: a third invocation trains and evaluates nothing.
    runner.run_suite(suite, workdir, stream=io.StringIO())
    assert len(trained) == 4

    # An evaluation made under an earlier definition of a PR distribution it computed is stale:
    # re-evaluated (not retrained). One of a law it did not compute has no bearing on it.
    stale = json.load(open(eval_json))
    assert "uniform" not in stale["settings"]  # the suite computes gaussian alone
    stale["settings"]["uniform"] = "x + eps * U[-1,1]^d, clipped to [0,1]"
    json.dump(stale, open(eval_json, "w"))
    log = io.StringIO()
    runner.run_suite(suite, workdir, stream=log)
    assert len(trained) == 4 and "tiny/pat_wos_s0: reused" in log.getvalue()
    stale["settings"]["gaussian"] = "x + eps * N(0, I), not clipped"
    json.dump(stale, open(eval_json, "w"))
    log = io.StringIO()
    runner.run_suite(suite, workdir, stream=log)
    assert len(trained) == 4 and "tiny/pat_wos_s0: reused" not in log.getvalue()
    assert json.load(open(eval_json))["settings"]["gaussian"] == laws.get("gaussian").definition

    # Outputs.
    assert open(os.path.join(workdir, "pr_vs_eps.png"), "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    saved = json.load(open(os.path.join(workdir, "results.json")))
    g = saved["groups"]["tiny"]
    assert [e["status"] for e in g["runs"]] == ["done"] * 4
    md = open(os.path.join(workdir, "results.md")).read()
    assert "### Table 2 layout" in md and "| PAT(WOS) (2 seeds) |" in md and "PAT − PAT(WOS)" in md

    # Every figure recomputed by hand from the per-image files each run's evaluation wrote.
    n_samples = 6
    per_run = {f"{m}_s{s}": load_counts(workdir, f"{m}_s{s}") for m in ("pat", "pat_wos") for s in (0, 1)}
    for entry in g["runs"]:
        counts, correct = per_run[entry["name"].split("/")[1]]
        run_results = json.load(open(os.path.join(workdir, entry["workdir"], "eval", "results.json")))
        figs = entry["figures"]
        assert figs["clean_accuracy"]["value"] == pytest.approx(run_results["clean_accuracy"])
        for j, eps in enumerate(["0.1", "0.12", "0.15", "0.2"]):
            assert figs["pr_all"][eps]["value"] == pytest.approx(run_results["pr_all_images"][eps]["value"])
            if correct.any():
                assert figs["pr_clean_correct"][eps]["value"] == pytest.approx(counts[correct, j].mean() / n_samples)
    for method in ("pat", "pat_wos"):
        mean = g["methods"][method]["mean"]
        expected = np.mean([per_run[f"{method}_s{s}"][1].mean() for s in (0, 1)])
        assert mean["clean_accuracy"]["value"] == pytest.approx(expected)
    diff = next(d for d in g["differences"] if (d["a"], d["b"]) == ("pat", "pat_wos"))
    for j, eps in enumerate(["0.1", "0.12", "0.15", "0.2"]):
        per_seed = [
            (per_run[f"pat_s{s}"][0][:, j] - per_run[f"pat_wos_s{s}"][0][:, j]).mean() / n_samples for s in (0, 1)
        ]
        assert diff["per_seed"]["0"]["pr_all"][eps]["value"] == pytest.approx(per_seed[0])
        fig = diff["mean"]["pr_all"][eps]
        assert fig["value"] == pytest.approx(np.mean(per_seed))
        assert fig["interval"][0] <= fig["value"] <= fig["interval"][1]
        both = per_run["pat_s1"][1] & per_run["pat_wos_s1"][1]
        if both.any():
            expected = (per_run["pat_s1"][0][both, j] - per_run["pat_wos_s1"][0][both, j]).mean() / n_samples
            assert diff["per_seed"]["1"]["pr_common_correct"][eps]["value"] == pytest.approx(expected)


def test_ratio_interval_against_a_hand_bootstrap():
    rng = np.random.default_rng(0)
    num = rng.random((2, 30))
    den = (rng.random((2, 30)) < 0.7).astype(float)
    idx = rng.integers(0, 30, size=(500, 30))
    value, (lo, hi) = patjax_stats.ratio_interval(num * den, den, idx, 0.9, chunk=64)
    assert value == pytest.approx(np.mean([num[s][den[s] > 0].mean() for s in (0, 1)]))
    stats = [np.mean([(num[s] * den[s])[i].sum() / den[s][i].sum() for s in (0, 1)]) for i in idx]
    assert (lo, hi) == pytest.approx((np.quantile(stats, 0.05), np.quantile(stats, 0.95)))


def assert_appendix_e_optimizer_for_30_epochs(settings):
    """SGD with Nesterov momentum 0.9, weight decay 5e-4, lr 0.01, batch 256 (195 steps per
    epoch), x0.1 at 75 % and 90 % of 30 epochs, i.e. after epochs 22 and 27; PGD-10 in 8/255."""
    o = settings.optimizer
    assert (o.learning_rate, o.momentum, o.nesterov, o.weight_decay, settings.batch_size) == (
        0.01,
        0.9,
        True,
        5e-4,
        256,
    )
    assert o.total_steps(195) == 30 * 195 and o.lr_milestones(195) == [22 * 195, 27 * 195]
    if settings.method.attack is not None:  # a method with an inner attack: PGD-10's budget
        assert settings.method.attack.steps == 10 and settings.method.attack.epsilon == pytest.approx(8 / 255)


def test_the_convergence_suite_trains_with_the_papers_optimizer_for_30_epochs():
    """Appendix E by hand: SGD with Nesterov momentum 0.9, weight decay 5e-4, lr 0.01, batch 256
    (195 steps per epoch), x0.1 at 75 % and 90 % of 30 epochs, i.e. after epochs 22 and 27."""
    suite = shipped_suites.get_suite("convergence_cpu", None)
    runs = suites.plan(suite)
    assert [(r.method, r.seed) for r in runs] == [(m, s) for s in (0, 1) for m in ("clean", "pgd", "pat")]
    for run in runs:
        settings = config_lib.train_settings(run.config)
        assert_appendix_e_optimizer_for_30_epochs(settings)
        if run.method == "pat":
            sampler = settings.method.sampler
            assert (sampler.init, sampler.steps, sampler.tolerance) == ("clean", 20, 3e-4)
    # A learning-curve point every 3 epochs, each checkpoint kept until its model is.
    assert run_status.curve_steps(suite, runs[1], 30 * 195) == [3 * 195 * k for k in range(1, 10)]
    assert runs[0].config.max_checkpoints_to_keep >= 9


def test_the_gpu_table1_suite_is_resnet18_pgd10_against_pat_for_30_epochs_on_the_whole_test_split():
    """table1_gpu by hand: ResNet-18 on CIFAR-10, Appendix E's optimizer and batch (195 steps per
    epoch), x0.1 after epochs 22 and 27 of 30; PGD-10 then PAT with the cheaper sampler, seed 0;
    the 10,000 test images under the Table-1 protocol; curves (clean, uniform PR) every 5 epochs."""
    suite = shipped_suites.get_suite("table1_gpu", None)
    runs = suites.plan(suite)
    assert [(r.group, r.method, r.seed) for r in runs] == [
        ("cifar10_resnet18", "pgd", 0),
        ("cifar10_resnet18", "pat", 0),
    ]
    for run in runs:
        settings = config_lib.train_settings(run.config)
        assert (run.config.dataset, settings.model.name, settings.model.compute_dtype) == (
            "cifar10",
            "resnet18",
            "float32",
        )
        assert_appendix_e_optimizer_for_30_epochs(settings)
        if run.method == "pat":
            sampler = settings.method.sampler
            assert (sampler.init, sampler.steps, sampler.tolerance) == ("clean", 20, 3e-4)
        # Every curve step has a checkpoint, and all of them fit in the manager's window at once.
        assert run_status.curve_steps(suite, run, 30 * 195) == [5 * 195 * k for k in range(1, 6)]
        assert (5 * 195) % run.config.checkpoint_every_steps == 0 and run.config.max_checkpoints_to_keep >= 6
    assert suite.num_eval_examples == 10_000 and suite.keep_models
    assert list(suite.evaluators) == ["clean", "pgd20", "cw20", "pr"]
    assert suite.pr_distribution == "uniform" and set(suite.eval_overrides["pr.distributions"]) == {
        "uniform",
        "gaussian",
        "pdis",
    }
    assert suite.eval_overrides["cw.kappa"] == 2.0 and set(suite.curve_methods) == {"pgd", "pat"}
    assert list(suite.curve_evaluators) == ["clean", "pr"] and suite.curve_eval_overrides["pr.distributions"] == (
        "uniform",
    )
    assert list(suite.matched) == [(("cifar10_resnet18", "pat"), ("cifar10_resnet18", "pgd"))]


@pytest.mark.slow
def test_plans_and_bad_input():
    full = suites.plan(shipped_suites.get_suite("paper_full", None))
    # Every registered method but those outside the paper's tables (Gaussian augmentation).
    assert [r.method for r in full if r.group == "cifar10_resnet18"] == [
        m for m in methods.METHOD_ORDER if m != "gaussian"
    ]
    assert len(full) == 4 * (len(methods.METHOD_ORDER) - 1)
    first = full[0].config
    assert (first.model, first.dataset, first.langevin.steps, first.num_epochs) == ("resnet18", "cifar10", 100, 100)
    assert {r.group for r in full} == {"cifar10_resnet18", "cifar10_wrn50_2", "cifar100_resnet18", "cifar100_wrn50_2"}
    cpu = suites.plan(shipped_suites.get_suite("ablation_cpu", "/data"))
    assert {r.method for r in cpu} >= {"clean", "pgd", "pgd_cor", "pat_wos", "pat"}
    assert {r.seed for r in cpu} == {0, 1}
    with pytest.raises(UserError, match="unknown suite"):
        shipped_suites.get_suite("nope", None)
    with pytest.raises(UserError, match="no group"):
        suites.plan(shipped_suites.get_suite("paper_full", None), groups=["cifar10_vgg"])
    result = subprocess.run(
        [sys.executable, "-m", "patjax.experiments", "--suite=nope", "--workdir=/tmp/x"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2 and result.stderr.strip().splitlines()[-1].startswith("error: unknown suite")


# ---------------------------------------------------------------------------------------
# Several workers on one suite directory (the smoke_cpu suite: 2 methods x 2 seeds, seconds a run).

SMOKE_RUNS = [
    "cifar10_small_cnn/clean_s0",
    "cifar10_small_cnn/pat_s0",
    "cifar10_small_cnn/clean_s1",
    "cifar10_small_cnn/pat_s1",
]
TIMEOUT_S = 300  # a hang fails the test instead of stalling the suite


def environment(**extra):
    """This process's environment without a SLURM job array's variables (the tests may run in one)."""
    return {**{k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}, **extra}


def worker(workdir, data_dir, *args, suite="smoke_cpu", command=("-m", "patjax.experiments")):
    """A suite worker process, as on a cluster node; one JAX device so that two share 2 cores, and
    XLA's light compilation, as conftest.py sets for the tests' own process."""
    return subprocess.Popen(
        [
            sys.executable,
            *command,
            f"--suite={suite}",
            f"--workdir={workdir}",
            f"--data_dir={data_dir}",
            "--progress_bars=False",
            *args,
        ],
        cwd=REPO,
        env=environment(PATJAX_CPU_DEVICES="1", JAX_DISABLE_MOST_OPTIMIZATIONS="1"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc):
    try:
        out, err = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"worker still running after {TIMEOUT_S} s:\n{out[-2000:]}\n{err[-2000:]}")
    assert proc.returncode == 0, err[-3000:]
    return out


def lines_about(log, run, what):
    return [line for line in log.splitlines() if f" {run}: {what}" in line]


@pytest.mark.slow
@pytest.mark.long
def test_two_workers_share_a_suite_and_train_each_run_once(tmp_path, data_dir):
    workdir = str(tmp_path / "suite")
    procs = [worker(workdir, data_dir) for _ in range(2)]  # no partition: the claims alone share the work
    logs = [finish(p) for p in procs]
    trained_by = {
        run: [i for i, log in enumerate(logs) if lines_about(log, run, "training 4 steps")] for run in SMOKE_RUNS
    }
    assert all(len(workers) == 1 for workers in trained_by.values()), trained_by
    for i, log in enumerate(logs):
        mine = [run for run in SMOKE_RUNS if trained_by[run] == [i]]
        assert mine, f"worker {i} trained nothing: the two did not run at once\n{log}"
        for run in set(SMOKE_RUNS) - set(mine):  # the other worker's: seen held, or found finished
            assert lines_about(log, run, "skipped: claimed by suite worker") or lines_about(log, run, "reused"), (
                f"worker {i}, {run}:\n{log}"
            )
    # The worker that leaves last has seen every run finished (the other may leave while it works).
    assert any("suite smoke_cpu: 4/4 runs done" in log.splitlines()[-1] for log in logs), logs
    for run in SMOKE_RUNS:
        record = json.load(open(os.path.join(workdir, "runs", run, "suite_run.json")))
        assert len(record["train_segments_s"]) == 1 and record["step"] == 4 and "eval_wall_s" in record
    report = json.load(open(os.path.join(workdir, "results.json")))
    assert report["num_done"] == 4
    assert [e["status"] for e in report["groups"]["cifar10_small_cnn"]["runs"]] == ["done"] * 4
    assert len(report["invocations"]) == 2
    assert "4 of 4 runs trained and evaluated." in open(os.path.join(workdir, "results.md")).read()


HOLD_CLAIM = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
os.ftruncate(fd, 0)
os.write(fd, f"a test holder (pid {os.getpid()})".encode())
print("held", flush=True)
time.sleep(600)
"""


@pytest.mark.slow
def test_a_claim_held_by_a_live_process_is_skipped_and_a_dead_ones_is_taken(tmp_path, data_dir):
    workdir = str(tmp_path / "suite")
    run = "cifar10_small_cnn/clean_s0"
    os.makedirs(os.path.join(workdir, "runs", run))
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_CLAIM, os.path.join(workdir, "runs", run, ".claim")],
        stdout=subprocess.PIPE,
        text=True,
    )
    # Worker 0 of 2 over the clean runs has clean_s0 alone to do.
    only_clean_s0 = ("--methods=clean", "--num_workers=2", "--worker_index=0")
    try:
        assert holder.stdout.readline().strip() == "held"
        log = finish(worker(workdir, data_dir, *only_clean_s0))
        assert lines_about(log, run, f"skipped: claimed by a test holder (pid {holder.pid})"), log
        assert not lines_about(log, run, "training")
        assert "0/4 runs done" in log.splitlines()[-1]
    finally:
        holder.kill()  # SIGKILL: the kernel drops the flock of a process that dies
        holder.wait()
    log = finish(worker(workdir, data_dir, *only_clean_s0))
    assert lines_about(log, run, "training 4 steps") and lines_about(log, run, "evaluated in")
    assert "1/4 runs done" in log.splitlines()[-1]
    statuses = {
        e["name"]: e["status"]
        for e in json.load(open(os.path.join(workdir, "results.json")))["groups"]["cifar10_small_cnn"]["runs"]
    }
    assert statuses == {r: "done" if r == run else "pending" for r in SMOKE_RUNS}


def head_of_cifar10(data_dir, folder, records=16):
    """A data folder in the official layout holding the first `records` records of each file of
    real CIFAR-10 (80 training images, 16 test images)."""
    os.makedirs(os.path.join(folder, "cifar-10-batches-bin"))
    for name in download.EXPECTED_FILES["cifar10"]:
        with open(os.path.join(data_dir, "cifar-10-batches-bin", name), "rb") as f:
            head = f.read(3073 * records)
        with open(os.path.join(folder, "cifar-10-batches-bin", name), "wb") as f:
            f.write(head)
    return folder


def race_suite(data_dir):
    """smoke_cpu with the tiniest training (of a `head_of_cifar10` folder): batches of 8, the
    training log's test accuracy on 16 images (its runs' evaluation is not used)."""
    suite = cpu_suites.smoke_cpu_suite(data_dir)
    cfg = copy.deepcopy(suite.groups[0].base_config)
    cfg.batch_size, cfg.log_test_examples, cfg.eval.batch_size = 8, 16, 16
    return dataclasses.replace(suite, name="race", groups=(dataclasses.replace(suite.groups[0], base_config=cfg),))


# The suite command line with the race suite, in a worker that stops after saving the checkpoint
# of step 2 (of 4), holding the run's claim and lock, until the file argv[1]/go appears (it
# creates argv[1]/paused when it waits); with argv[2] == "when_paused" (a handover), it starts
# once argv[1]/paused appears, its imports done meanwhile.
RACE_RECORDS = 16
RACE = """
import os, sys, time
sys.path[:0] = [{tests!r}, {here!r}]
import orbax.checkpoint as ocp
from patjax.data import cifar
from patjax import experiments
from patjax.configs import suites as shipped_suites
from test_runner import race_suite
signals, role = sys.argv.pop(1), sys.argv.pop(1)
# The folder holds the first {records} records of each file (`head_of_cifar10`).
cifar.OFFICIAL_RECORDS = {{d: dict.fromkeys(names, {records}) for d, names in cifar.OFFICIAL_RECORDS.items()}}
shipped_suites.SUITES["race"] = race_suite
save = ocp.CheckpointManager.save

def save_then_wait(self, step, *args, **kwargs):
    saved = save(self, step, *args, **kwargs)
    if step == 2:
        self.wait_until_finished()
        open(os.path.join(signals, "paused"), "w").close()
        while not os.path.exists(os.path.join(signals, "go")):
            time.sleep(0.05)
    return saved

if role == "paused_at_step_2":
    ocp.CheckpointManager.save = save_then_wait
else:
    deadline = time.time() + 300
    while not os.path.exists(os.path.join(signals, "paused")):
        if time.time() > deadline:
            sys.exit("the worker never paused")
        time.sleep(0.05)
experiments.cli()
""".format(tests=str(REPO / "tests"), here=str(REPO / "tests" / "suites"), records=RACE_RECORDS)


@pytest.mark.slow
def test_a_handover_is_refused_while_a_worker_trains_and_the_run_ends_as_if_undisturbed(
    tmp_path, data_dir, records_per_file
):
    data_dir = head_of_cifar10(data_dir, str(tmp_path / "data"), RACE_RECORDS)
    records_per_file(RACE_RECORDS)
    suite = race_suite(data_dir)
    run = next(r for r in suites.plan(suite) if (r.method, r.seed) == ("clean", 0))
    raced, alone, signals = (str(tmp_path / name) for name in ("raced", "alone", "signals"))
    os.makedirs(signals)
    one_run = ("--methods=clean", "--max_runs=1", "--only=train", "--compilation_cache=False")
    paused = worker(raced, data_dir, *one_run, suite="race", command=("-c", RACE, signals, "paused_at_step_2"))
    handing_over = worker(raced, data_dir, "--handover", suite="race", command=("-c", RACE, signals, "when_paused"))
    directory = run_outcomes.run_dir(raced, run)
    try:
        # The same run trained undisturbed, here meanwhile (one device, as the worker has).
        undisturbed = train.train_run(config_lib.train_settings(run.config), alone)
        out, err = handing_over.communicate(timeout=TIMEOUT_S)
        assert handing_over.returncode == 2 and out == "", (out, err)
        assert err.count("\n") == 1 and "Traceback" not in err, err
        assert err.startswith(f"error: {directory!r} is claimed by suite worker 0 of 1 (pid {paused.pid} "), err
        assert err.rstrip().endswith("wait for it to finish or stop it, then hand over again"), err
        with pytest.raises(UserError, match="is claimed by suite worker"):
            handover.handover(suite, raced)
        assert os.listdir(os.path.join(directory, "checkpoints")) == ["2"]  # nothing deleted
    finally:
        open(os.path.join(signals, "go"), "w").close()
        handing_over.kill()
    log = finish(paused)
    assert lines_about(log, run.name, "training 4 steps") and lines_about(log, run.name, "trained in"), log
    # No checkpoint lost, and the final state is bitwise that of the run trained alone.
    assert sorted(os.listdir(os.path.join(directory, "checkpoints"))) == ["2", "4"]
    _, _, raced_state = workdir_lib.restore(directory, step=4)
    leaves = [
        jax.tree.leaves(jax.device_get((s.params, s.batch_stats, s.opt_state))) for s in (raced_state, undisturbed)
    ]
    assert int(raced_state.step) == int(undisturbed.step) == 4 and len(leaves[0]) == len(leaves[1]) > 0
    for a, b in zip(*leaves):
        np.testing.assert_array_equal(a, b)
    # With the worker gone the handover goes ahead: a trained run keeps its final model.
    assert handover.handover(suite, raced) == []
    assert kept_models.steps(directory) == [4]
    kept = load_file(kept_models.path(directory, 4))
    np.testing.assert_array_equal(kept["params/Dense_0/kernel"], np.asarray(undisturbed.params["Dense_0"]["kernel"]))


def test_a_handover_is_refused_while_a_trainer_holds_a_runs_workdir_and_changes_nothing(tmp_path, data_dir):
    """A trainer started by hand on a run's directory holds its lock, not its claim."""
    suite = cpu_suites.smoke_cpu_suite(data_dir)
    first, second = (run_outcomes.run_dir(str(tmp_path), r) for r in suites.plan(suite)[:2])
    for directory in (first, second):
        os.makedirs(os.path.join(directory, "checkpoints", "2"))
    with locks.exclusive(second, "a trainer"):
        with pytest.raises(UserError) as error:
            handover.handover(suite, str(tmp_path))
        message = str(error.value)
        assert message.startswith(f"{second!r} is in use by a trainer (pid {os.getpid()} ") and "\n" not in message
        assert message.endswith("wait for it to finish or stop it, then hand over again")
    # The first run, taken before the refusal, is free again, and nothing was removed.
    with locks.lock(os.path.join(first, workers.CLAIM_FILE), "a test") as claim:
        assert claim.held
    for directory in (first, second):
        assert os.listdir(os.path.join(directory, "checkpoints")) == ["2"]


def dry_run(*args, env=None):
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "patjax.experiments",
            "--suite=ablation_cpu",
            "--workdir=/nonexistent/suite",
            "--dry_run",
            *args,
        ],
        cwd=REPO,
        env=environment(**(env or {})),
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.slow
def test_static_partition_flags_slurm_and_bad_values():
    runs = suites.plan(shipped_suites.get_suite("ablation_cpu", None))
    assert len(runs) == 10
    shares = [workers.partition(runs, 3, i) for i in range(3)]
    assert [[p for p, _ in share] for share in shares] == [[0, 3, 6, 9], [1, 4, 7], [2, 5, 8]]
    assert sorted((p, r.name) for share in shares for p, r in share) == [(p, r.name) for p, r in enumerate(runs)]

    # Flags, and a SLURM array that starts at 4 (--array=4-6): task 5 is worker 1 of 3.
    by_flags = dry_run("--num_workers=3", "--worker_index=1")
    by_slurm = dry_run(env={"SLURM_ARRAY_TASK_ID": "5", "SLURM_ARRAY_TASK_MIN": "4", "SLURM_ARRAY_TASK_COUNT": "3"})
    for proc in (by_flags, by_slurm):
        assert proc.returncode == 0, proc.stderr
        listed = [line.split()[1] for line in proc.stdout.splitlines() if line.startswith("  run ")]
        assert listed == ["2/10", "5/10", "8/10"], proc.stdout
        assert "worker 1 of 3 takes 3" in proc.stdout
    assert workers.worker_slot(environ={}) == (1, 0)
    assert workers.worker_slot(
        environ={"SLURM_ARRAY_TASK_ID": "7", "SLURM_ARRAY_TASK_MIN": "0", "SLURM_ARRAY_TASK_COUNT": "8"}
    ) == (8, 7)
    # Flags win over the array's variables: --num_workers=1 turns the static partition off.
    assert workers.worker_slot(
        1, None, environ={"SLURM_ARRAY_TASK_ID": "3", "SLURM_ARRAY_TASK_MIN": "0", "SLURM_ARRAY_TASK_COUNT": "8"}
    ) == (1, 0)

    # Bad values: one line, exit 2 (an index past K, given or from an array with gaps).
    for args, env, message in [
        (("--num_workers=2", "--worker_index=2"), None, "worker index 2 is not in 0..1"),
        (
            (),
            {"SLURM_ARRAY_TASK_ID": "6", "SLURM_ARRAY_TASK_MIN": "0", "SLURM_ARRAY_TASK_COUNT": "4"},
            "worker index 6 is not in 0..3",
        ),
    ]:
        proc = dry_run(*args, env=env)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert proc.stderr.strip().splitlines() == [proc.stderr.strip()]
        assert proc.stderr.startswith("error: ") and message in proc.stderr, proc.stderr
    for num_workers, worker_index, message in [
        (0, 0, "number of workers must be at least 1"),
        (2, None, "--num_workers=2 needs --worker_index"),
        (2, -1, "worker index -1 is not in 0..1"),
    ]:
        with pytest.raises(UserError, match=message):
            workers.worker_slot(num_workers, worker_index, environ={})
    with pytest.raises(UserError, match="worker index 3"):
        runner.run_suite(
            shipped_suites.get_suite("smoke_cpu", None), "/nonexistent/suite", num_workers=2, worker_index=3
        )
    assert not os.path.exists("/nonexistent/suite")


def _synthetic_settings(n, samples, pr=None, **extra):
    """An evaluation's settings for synthetic outcomes: n images, N = samples, Gaussian headline law."""
    return {
        "num_examples": n,
        "seed": 0,
        "dataset": "cifar10",
        "confidence": 0.95,
        "pr": {"samples": samples, "epsilons": [0.1, 0.2], "pdis_c1": 0.1, "distribution": "gaussian", **(pr or {})},
        "attack": {"eps": 8 / 255, "step_size": 2 / 255, "steps": 20, "norm": "linf"},
        "cw": {"kappa": 0.0},
        **extra,
    }


def _synthetic_outcome(run, correct, pgd_robust, counts, samples, settings):
    """A RunOutcome as load_outcome would read it, with its own figures from hand formulas."""
    figures = {
        "clean_accuracy": {"value": correct.mean(), "interval": [0.0, 1.0]},
        "pgd20": {"value": pgd_robust.mean(), "interval": [0.0, 1.0]},
        "pr": {
            "gaussian": {
                e: {
                    "all": {"value": counts[:, j].mean() / samples, "interval": [0.0, 1.0]},
                    "clean_correct": {"value": counts[correct, j].mean() / samples, "interval": [0.0, 1.0]},
                }
                for j, e in enumerate(["0.1", "0.2"])
            }
        },
    }
    return run_outcomes.RunOutcome(
        run=run,
        correct=correct,
        robust={"pgd20": pgd_robust},
        pr_counts={"gaussian": counts},
        results={"settings": settings, "figures": figures},
        record={"eval_wall_s": 1.0, "step": 2},
        train_s=60.0,
    )


def test_a_sweep_pairs_points_across_groups_with_its_baselines():
    n, samples = 400, 10
    settings = _synthetic_settings(n, samples, bootstrap_resamples=300, confidence=0.9)
    rng = np.random.default_rng(0)
    cfg = cpu_suites.smoke_cpu_suite(None).groups[0].base_config
    groups = (
        suites.Group("main", cfg, methods=("pgd", "pat"), seeds=(0,)),
        suites.Group("T5", cfg, methods=("pat",), seeds=(0,)),
        suites.Group("T9", cfg, methods=("pat",), seeds=(0,)),
    )
    sweep = suites.Sweep(
        name="T",
        axis="T",
        points=(
            suites.SweepPoint("T = 5", "T5", "pat", value=5),
            suites.SweepPoint("T = 9", "T9", "pat", value=9),
            suites.SweepPoint("T = 2", "main", "pat", value=2),
        ),
        baselines=(suites.SweepPoint("PGD", "main", "pgd"),),
    )
    suite = suites.Suite(
        name="s",
        description="",
        groups=groups,
        num_eval_examples=n,
        eval_batch_size=n,
        evaluators=("clean", "pgd20", "pr"),
        eval_overrides={},
        sweeps=(sweep,),
    )
    outcomes = {}
    for run in suites.plan(suite):
        correct = rng.random(n) < 0.6
        outcomes[run.name] = _synthetic_outcome(
            run,
            correct,
            correct & (rng.random(n) < 0.4),
            rng.integers(0, samples + 1, size=(n, 2)),
            samples,
            dict(settings),
        )
    outcomes["T9/pat_s0"] = None  # not run yet
    got = aggregate.build(suite, "/unused", outcomes, [])["sweeps"][0]

    assert [p["label"] for p in got["points"]] == ["T = 5", "T = 9", "T = 2"]
    assert [p["status"] for p in got["points"]] == ["done", "pending", "done"]
    assert "differences" not in got["points"][1]
    a, b = outcomes["T5/pat_s0"], outcomes["main/pgd_s0"]
    both = a.correct & b.correct
    diff = got["points"][0]["differences"]["PGD"]
    # Hand formulas: the mean over images both classify correctly of PR_A - PR_B at eps 0.2, and
    # the difference of robust accuracies.
    expected = (a.pr_counts["gaussian"][both, 1] - b.pr_counts["gaussian"][both, 1]).mean() / samples
    assert diff["pr_common_correct"]["0.2"]["value"] == pytest.approx(expected)
    assert diff["pr_common_correct"]["0.2"]["n"] == both.sum()
    lo, hi = diff["pr_common_correct"]["0.2"]["interval"]
    assert lo < expected < hi
    assert diff["pgd20"]["value"] == pytest.approx(a.robust["pgd20"].mean() - b.robust["pgd20"].mean())
    assert got["points"][0]["figures"]["pr_clean_correct"]["0.2"]["value"] == pytest.approx(
        a.pr_counts["gaussian"][a.correct, 1].mean() / samples
    )

    md = results_md.markdown(aggregate.build(suite, "/unused", outcomes, []))
    assert "## Sweep: T" in md and "| T = 9 | T9/pat_s0 (pending) |" in md
    assert "| T = 5 | T5/pat_s0 | 1.0 |" in md  # 60 s of training
    figure = plots.plot_sweep(got)  # its error bars say the confidence the evaluations were set to
    assert [ax.get_ylabel().endswith("(90 % interval)") for ax in figure.axes] == [True, True]

    # Points evaluated on other images or noise cannot be paired: refused, not reported.
    outcomes["T5/pat_s0"].results["settings"]["seed"] = 1
    with pytest.raises(UserError, match="not comparable"):
        aggregate.build(suite, "/unused", outcomes, [])
    # A sweep naming a run its suite does not plan is a definition error.
    bad = dataclasses.replace(
        suite, sweeps=(dataclasses.replace(sweep, baselines=(suites.SweepPoint("CW", "main", "clean"),)),)
    )
    with pytest.raises(ValueError, match="main/clean_s0"):
        aggregate.build(bad, "/unused", outcomes, [])


def test_learning_curves_report_clean_pgd20_and_pr_at_every_point_from_hand_counts(tmp_path):
    # Each run's curve: one point written as an evaluation in curve/step_N/, then its final
    # evaluation; every cell of results.md's curve table is a hand formula of those outcomes.
    n, samples = 50, 10
    settings = _synthetic_settings(
        n, samples, pr={"distributions": ["gaussian"]}, bootstrap_resamples=200, evaluators=["clean", "pgd20", "pr"]
    )
    rng = np.random.default_rng(1)
    cfg = cpu_suites.smoke_cpu_suite(None).groups[0].base_config
    suite = suites.Suite(
        name="s",
        description="",
        groups=(suites.Group("main", cfg, methods=("pgd", "pat"), seeds=(0,)),),
        num_eval_examples=n,
        eval_batch_size=n,
        evaluators=("clean", "pgd20", "pr"),
        eval_overrides={"pr.distribution": "gaussian"},
        curve_every_steps=1,
        curve_evaluators=("clean", "pgd20", "pr"),
        matched=((("main", "pat"), ("main", "pgd")),),
    )
    workdir = str(tmp_path)
    outcomes, hand = {}, {}
    for run in suites.plan(suite):
        points = []
        for step in (1, 2):
            correct = rng.random(n) < 0.3 + 0.2 * step
            robust = correct & (rng.random(n) < 0.5)
            counts = rng.integers(0, samples + 1, size=(n, 2))
            points.append((step, correct, robust, counts))
        step, correct, robust, counts = points[0]
        # The figures an evaluation writes beside its outcomes (load_results checks they are there).
        figures = _synthetic_outcome(run, correct, robust, counts, samples, settings).results["figures"]
        eval_files.write_results(
            run_outcomes.run_dir(workdir, run),
            {"settings": {**settings, "step": step}, "figures": figures},
            {"clean.correct": correct, "pgd20.robust": robust, "pr_gaussian.counts": counts},
            step=step,
        )
        step, correct, robust, counts = points[1]
        outcomes[run.name] = _synthetic_outcome(run, correct, robust, counts, samples, {**settings, "step": step})
        hand[run.name] = [
            [run.name, str(s), f"{100 * c.mean():.1f}", f"{100 * r.mean():.1f}"]
            + [f"{100 * k[c, j].mean() / samples:.1f}" for j in range(2)]
            for s, c, r, k in points
        ]
    report = aggregate.build(suite, workdir, outcomes, [])
    assert [p["step"] for p in report["curves"]["main/pat_s0"]] == [1, 2]
    md = results_md.markdown(report)
    table = md.split("### Learning curves (clean accuracy, PGD-20 and PR over clean-correct images)")[1]
    assert "| run | step | Acc. % | PGD-20 % | PR(·, 0.1) % | PR(·, 0.2) % |" in table
    rows = [line.strip("| ").split(" | ") for line in table.strip().splitlines()[2:]]
    assert rows == hand["main/pgd_s0"] + hand["main/pat_s0"]

    # Curve points attacked with another PGD, or not attacked: no PGD-20 column (the final
    # evaluation's alone would be one point of another curve), the rest unchanged.
    for run in suites.plan(suite):
        directory = run_outcomes.run_dir(workdir, run)
        results, per_image = eval_files.load_results(directory, 1)
        results["settings"]["attack"]["steps"] = 10
        eval_files.write_results(directory, results, {k: v for k, v in per_image.items() if "meta." not in k}, step=1)
    md = results_md.markdown(aggregate.build(suite, workdir, outcomes, []))
    table = md.split("### Learning curves (clean accuracy and PR over clean-correct images)")[1]
    rows = [line.strip("| ").split(" | ") for line in table.strip().splitlines()[2:]]
    assert rows == [row[:3] + row[4:] for row in hand["main/pgd_s0"] + hand["main/pat_s0"]]


def test_runs_table_shows_how_far_a_pending_run_trained_from_its_log(tmp_path):
    cfg = cpu_suites.smoke_cpu_suite(None).groups[0].base_config
    group = suites.Group("main", cfg, methods=("pgd", "pat"), seeds=(0,))
    suite = suites.Suite(
        "s", "", (group,), num_eval_examples=8, eval_batch_size=8, evaluators=("clean",), eval_overrides={}
    )
    pgd, pat = suites.plan(suite)
    directory = run_outcomes.run_dir(str(tmp_path), pgd)
    os.makedirs(directory)
    lines = [{"step": 4, "images_per_s": 2.0 * cfg.batch_size, "window_steps": 4}]
    lines.append({"step": 10, "images_per_s": 0.5 * cfg.batch_size, "window_steps": 6})
    with open(os.path.join(directory, train.METRICS_FILE), "w") as f:
        f.write("".join(json.dumps(line) + "\n" for line in lines) + '{"step": 1')  # a line being written
    md = results_md.markdown(aggregate.build(suite, str(tmp_path), {pgd.name: None, pat.name: None}, []))
    # 4 steps at 2 batches/s and 6 at half a batch per second: 14 s, 0.2 min.
    assert f"| {pgd.name} | pending | 10 | 0.2 |  |" in md
    assert f"| {pat.name} | pending |  |  |  |" in md


def test_learning_curve_plot_keeps_methods_and_seeds_apart():
    def curve(accs, prs):
        return [
            {"step": 10 * (i + 1), "clean_accuracy": a, "pr_clean_correct": {"0.1": p}}
            for i, (a, p) in enumerate(zip(accs, prs))
        ]

    curves = {
        "g/clean_s0": curve([0.5, 0.7], [0.6, 0.5]),
        "g/pat_s0": curve([0.4, 0.6], [0.9, 0.8]),
        "g/clean_s1": curve([0.55, 0.75], [0.65, 0.55]),
    }
    fig = plots.plot_curves({"curves": curves})
    lines = {line.get_label(): line for line in fig.axes[0].get_lines()}
    assert list(lines["g/pat_s0"].get_xdata()) == [40.0, 60.0] and list(lines["g/pat_s0"].get_ydata()) == [90.0, 80.0]
    style = {n: (line.get_color(), line.get_linestyle(), line.get_marker()) for n, line in lines.items()}
    assert style["g/clean_s0"][0] == style["g/clean_s1"][0] != style["g/pat_s0"][0]  # a colour per method
    assert style["g/clean_s0"][1:] == style["g/pat_s0"][1:] != style["g/clean_s1"][1:]  # a style per seed
    fig.clf()


def test_every_defined_sweep_names_runs_of_its_suite():
    for name, make in shipped_suites.SUITES.items():
        suite = make(None)
        planned = {r.name for r in suites.plan(suite)}
        for sweep in suite.sweeps:
            for p in list(sweep.points) + list(sweep.baselines):
                assert p.run_name in planned, (name, p.run_name)


class Clock:
    """A module's clock whose time() returns the given times in turn (train calls it once per step
    when stop_at is set, the runner before each run and after its training); the rest is the
    time module's."""

    def __init__(self, times):
        self.times = iter(times)

    def time(self):
        return float(next(self.times))

    def __getattr__(self, name):
        return getattr(time, name)


@pytest.mark.slow
@pytest.mark.long
def test_an_unfinished_run_carried_in_git_resumes_bitwise_on_a_clean_copy(tmp_path, data_dir, monkeypatch):
    # smoke_cpu: 4 steps, a checkpoint every 2, PAT's learning curve at step 2, models kept.
    suite = cpu_suites.smoke_cpu_suite(data_dir)
    run = next(r for r in suites.plan(suite) if (r.method, r.seed) == ("pat", 0))
    straight = str(tmp_path / "straight")
    runner.run_suite(suite, straight, methods=["pat"], max_runs=1, stream=io.StringIO())

    # The same run stopped by its time limit after 3 steps on one machine (checkpoints 2 and
    # 3), handed over, and continued from what git would carry: the suite's tracked files and
    # the one checkpoint `handover` names (tensorboard/, locks and claims stay behind).
    late = io.StringIO()
    runner.run_suite(suite, str(tmp_path / "late"), methods=["pat"], stream=late, stop_at=0.0)
    assert "left for the next invocation (its time is up)" in late.getvalue()
    assert "worked on 0 run(s)" in late.getvalue()
    here = str(tmp_path / "here")
    monkeypatch.setattr(train, "time", Clock(itertools.count(1)))  # one tick per step: stops after step 3
    monkeypatch.setattr(runner, "time", Clock(itertools.repeat(-1e6)))  # the run starts: its time is not up
    log = io.StringIO()
    runner.run_suite(suite, here, methods=["pat"], stream=log, stop_at=3.0)
    monkeypatch.undo()
    directory = run_outcomes.run_dir(here, run)
    assert "stopped at step 3 with a checkpoint" in log.getvalue()
    assert run_outcomes.read_record(directory)["step"] == 3 and not os.path.isdir(os.path.join(directory, "eval"))
    # The stop's checkpoint may push the curve step's out of the manager's window: its model is kept.
    assert kept_models.steps(directory) == [2]
    log = io.StringIO()
    runner.run_suite(suite, here, methods=["pat"], stream=log, only="evaluate")  # unfinished: not evaluated
    assert "not trained yet" in log.getvalue() and not os.path.isdir(os.path.join(directory, "eval"))
    paths = handover.handover(suite, here)
    assert paths == [os.path.join(os.path.abspath(directory), "checkpoints", "3")]
    assert sorted(os.listdir(os.path.join(directory, "checkpoints"))) == ["3"]
    assert kept_models.steps(directory) == [2]  # the curve's step, kept before its checkpoint went
    clone = str(tmp_path / "clone")
    shutil.copytree(here, clone, ignore=shutil.ignore_patterns("tensorboard", ".lock", ".claim", "jax_cache"))
    # On the clone the run finishes its training as the time limit passes: no evaluation starts.
    monkeypatch.setattr(runner, "time", Clock(itertools.chain([-1e6], itertools.repeat(1e12))))
    log = io.StringIO()
    runner.run_suite(suite, clone, methods=["pat"], max_runs=1, stream=log, stop_at=1e10)
    monkeypatch.undo()
    assert "resuming from its latest checkpoint" in log.getvalue()
    assert "its evaluation is left for the next invocation (its time is up)" in log.getvalue()
    assert not os.path.isdir(os.path.join(run_outcomes.run_dir(clone, run), "eval"))
    assert len(run_outcomes.read_record(run_outcomes.run_dir(clone, run))["train_segments_s"]) == 2
    # Evaluated by a worker whose time passes during the final evaluation: the curve point is
    # left for the next invocation, and the run keeps its checkpoint until it is evaluated.
    monkeypatch.setattr(runner, "time", Clock(itertools.chain([-1e6], itertools.repeat(1e12))))
    log = io.StringIO()
    runner.run_suite(suite, clone, methods=["pat"], stream=log, only="evaluate", stop_at=1e10)
    monkeypatch.undo()
    directory = run_outcomes.run_dir(clone, run)
    assert "curve points from step 2 on are left for the next invocation" in log.getvalue()
    assert os.path.isfile(os.path.join(directory, "eval", "results.json"))
    assert eval_files.curve_steps(directory) == [] and os.path.isdir(os.path.join(directory, "checkpoints"))
    runner.run_suite(suite, clone, methods=["pat"], max_runs=1, stream=io.StringIO())
    assert eval_files.curve_steps(directory) == [2]

    for name in ("straight", "clone"):
        d = run_outcomes.run_dir(str(tmp_path / name), run)
        assert kept_models.steps(d) == [2, 4] and not os.path.exists(os.path.join(d, "checkpoints"))
    a, b = (run_outcomes.run_dir(str(tmp_path / name), run) for name in ("straight", "clone"))
    for step in (2, 4):
        ta, tb = load_file(kept_models.path(a, step)), load_file(kept_models.path(b, step))
        assert set(ta) == set(tb)
        for key in ta:
            np.testing.assert_array_equal(ta[key], tb[key])  # bitwise: same steps, same device count
    assert (
        json.load(open(os.path.join(a, "eval", "results.json")))["figures"]
        == json.load(open(os.path.join(b, "eval", "results.json")))["figures"]
    )


@pytest.mark.parametrize("name", ["table1_cpu", "convergence_cpu", "stationary_cpu"])
def test_every_committed_run_counts_as_finished_under_todays_code(name):
    """Each committed run's config.json (config version 1) read, upgraded and checked against the
    suite's current config as a resume is (`workdir.check_resume_compatible`), its evaluation
    matching the suite's settings and its kept models and curve points there: a suite run on the
    committed folder would have nothing to do, so nothing is retrained or re-evaluated."""
    from patjax.configs.suites import get_suite
    from patjax.suites import plan, run_outcomes, run_status

    workdir = REPO / "docs" / "results" / name
    suite = get_suite(name, None)
    runs = [r for r in plan(suite) if os.path.isdir(run_outcomes.run_dir(str(workdir), r))]
    assert len(runs) >= 6
    for run in runs:
        assert run_status.finished(suite, run, run_outcomes.run_dir(str(workdir), run)), run.name
