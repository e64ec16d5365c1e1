"""The experiment runner: a tiny suite on real CIFAR-10 trains, evaluates on common random
numbers, reports paired differences that match a hand computation, and resumes."""
import io
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from patjax import experiments, train
from patjax.errors import UserError
from conftest import REPO


def tiny_suite(data_dir, seeds=(0, 1)):
    cfg = experiments.ablation_cpu_suite(data_dir).groups[0].base_config
    cfg.batch_size = 8
    cfg.num_train_steps = 2
    cfg.langevin.steps = 1
    cfg.checkpoint_every_steps = 1
    cfg.log_every_steps = 2
    cfg.eval.batch_size = 16
    # A larger beta and step for PAT so that its models differ from PAT(WOS)'s after 2 steps.
    group = experiments.Group("tiny", cfg, methods=("pat", "pat_wos"), seeds=seeds,
                              method_overrides={"pat": {"pat.beta": 5.0, "learning_rate": 0.5}})
    return experiments.Suite(
        name="tiny", description="test", groups=(group,), num_eval_examples=24, eval_batch_size=16,
        evaluators=("clean", "pgd20", "pr"),
        eval_overrides={"pr_distributions": ("gaussian",), "seed": 0, "pr_samples": 6, "pr_chunk_size": 3,
                        "attack_steps": 2, "bootstrap_resamples": 200})


def load_counts(workdir, name):
    z = np.load(os.path.join(workdir, "runs", "tiny", name, "eval", "per_image.npz"))
    return z["pr_gaussian.counts"].astype(np.float64), z["clean.correct"].astype(bool)


def test_suite_trains_evaluates_reports_and_resumes(tmp_path, data_dir, monkeypatch):
    workdir = str(tmp_path / "suite")
    suite = tiny_suite(data_dir)
    trained = []
    real_train = train.train_and_evaluate
    monkeypatch.setattr(train, "train_and_evaluate",
                        lambda cfg, wd, **kw: trained.append((cfg.method, cfg.seed)) or real_train(cfg, wd, **kw))

    # An interrupted suite: leave after one run; the report lists the rest as pending.
    log = io.StringIO()
    report = experiments.run_suite(suite, workdir, max_runs=1, stream=log)
    assert trained == [("pat_wos", 0)]  # paper order: PAT(WOS) before PAT
    assert (report["num_done"], report["num_runs"]) == (1, 4)
    assert "run 1/4 tiny/pat_wos_s0: training 2 steps" in log.getvalue()
    md = open(os.path.join(workdir, "results.md")).read()
    assert md.count("| pending |") == 3

    # Rerun: the finished run is reused, not retrained or re-evaluated; the rest run.
    eval_json = os.path.join(workdir, "runs", "tiny", "pat_wos_s0", "eval", "results.json")
    mtime = os.path.getmtime(eval_json)
    log = io.StringIO()
    report = experiments.run_suite(suite, workdir, stream=log)
    assert trained == [("pat_wos", 0), ("pat", 0), ("pat_wos", 1), ("pat", 1)]  # seed-major
    assert os.path.getmtime(eval_json) == mtime
    assert "tiny/pat_wos_s0: reused" in log.getvalue()
    assert report["num_done"] == 4

    # Everything done: a third invocation trains and evaluates nothing.
    experiments.run_suite(suite, workdir, stream=io.StringIO())
    assert len(trained) == 4

    # An evaluation made under an earlier definition of a PR distribution is stale: re-evaluated
    # (not retrained).
    stale = json.load(open(eval_json))
    stale["settings"]["uniform"] = "x + eps * U[-1,1]^d, clipped to [0,1]"
    json.dump(stale, open(eval_json, "w"))
    log = io.StringIO()
    experiments.run_suite(suite, workdir, stream=log)
    assert len(trained) == 4 and "tiny/pat_wos_s0: reused" not in log.getvalue()
    assert json.load(open(eval_json))["settings"]["uniform"].startswith("U[max(x - eps, 0)")

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
            assert figs["pr_all"][eps]["value"] == pytest.approx(run_results["pr"][eps])
            if correct.any():
                assert figs["pr_clean_correct"][eps]["value"] == pytest.approx(
                    counts[correct, j].mean() / n_samples)
    for method in ("pat", "pat_wos"):
        mean = g["methods"][method]["mean"]
        expected = np.mean([per_run[f"{method}_s{s}"][1].mean() for s in (0, 1)])
        assert mean["clean_accuracy"]["value"] == pytest.approx(expected)
    diff = next(d for d in g["differences"] if (d["a"], d["b"]) == ("pat", "pat_wos"))
    for j, eps in enumerate(["0.1", "0.12", "0.15", "0.2"]):
        per_seed = [(per_run[f"pat_s{s}"][0][:, j] - per_run[f"pat_wos_s{s}"][0][:, j]).mean() / n_samples
                    for s in (0, 1)]
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
    value, (lo, hi) = experiments.ratio_interval(num * den, den, idx, 0.9, chunk=64)
    assert value == pytest.approx(np.mean([num[s][den[s] > 0].mean() for s in (0, 1)]))
    stats = [np.mean([(num[s] * den[s])[i].sum() / den[s][i].sum() for s in (0, 1)]) for i in idx]
    assert (lo, hi) == pytest.approx((np.quantile(stats, 0.05), np.quantile(stats, 0.95)))


def test_plans_and_bad_input():
    full = experiments.plan(experiments.get_suite("paper_full", None))
    assert len(full) == 4 * len(experiments.METHOD_ORDER)
    first = full[0].config
    assert (first.model, first.dataset, first.langevin.steps, first.num_epochs) == ("resnet18", "cifar10", 100, 100)
    assert {r.group for r in full} == {"cifar10_resnet18", "cifar10_wrn50_2", "cifar100_resnet18", "cifar100_wrn50_2"}
    cpu = experiments.plan(experiments.get_suite("ablation_cpu", "/data"))
    assert {r.method for r in cpu} >= {"clean", "pgd", "pgd_cor", "pat_wos", "pat"}
    assert {r.seed for r in cpu} == {0, 1}
    with pytest.raises(UserError, match="unknown suite"):
        experiments.get_suite("nope", None)
    with pytest.raises(UserError, match="no group"):
        experiments.plan(experiments.get_suite("paper_full", None), groups=["cifar10_vgg"])
    result = subprocess.run([sys.executable, "-m", "patjax.experiments", "--suite=nope", "--workdir=/tmp/x"],
                            cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 2 and result.stderr.strip().splitlines()[-1].startswith("error: unknown suite")
