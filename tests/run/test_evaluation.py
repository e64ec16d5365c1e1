"""The evaluation driver: batch/chunk invariance, intervals against scipy, the comparison table,
paired differences and the plot, and clean CLI errors."""

import inspect
import json
import os
import re
import subprocess
import sys

import jax
import numpy as np
import pytest
from conftest import REPO
from helpers import eval_config, evaluate, tiny_setup
from scipy import stats

from patjax import api, evaluators
from patjax.core import files
from patjax.core.errors import UserError
from patjax.data import cifar
from patjax.evaluators import stats as patjax_stats
from patjax.evaluators import streams
from patjax.models import networks
from patjax.pat import laws as pr_laws
from patjax.pat import robustness
from patjax.reporting import report
from patjax.run import checkpoints, comparison, eval_files, eval_settings, evaluation
from patjax.run import config as config_lib
from patjax.run import workdir as workdir_lib
from patjax.suites import aggregate, run_outcomes


def figures_close(a, b, path=""):
    if isinstance(a, dict):
        assert set(a) == set(b), path
        for k in a:
            figures_close(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            figures_close(x, y, f"{path}[{i}]")
    elif isinstance(a, float):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=path)
    else:
        assert a == b, path


@pytest.mark.slow
def test_batch_size_and_chunk_size_change_no_figure():
    model_fns, state, split = tiny_setup()
    runs = []
    for batch_size, chunk in ((4, 4), (3, 5)):
        per_image = {}
        results = evaluate(
            eval_config(pr={"chunk_size": chunk}),
            model_fns,
            state,
            split,
            batch_size=batch_size,
            progress=False,
            per_image_out=per_image,
        )
        runs.append((results, per_image))
    (a, pa), (b, pb) = runs
    figures_close(a["figures"], b["figures"])
    assert a["pr"] == b["pr"] and a["clean_accuracy"] == b["clean_accuracy"]
    assert set(pa) == set(pb)
    for key in pa:
        if key.endswith(("counts", "robust", "correct")):
            np.testing.assert_array_equal(pa[key], pb[key], err_msg=key)
        else:
            np.testing.assert_allclose(pa[key], pb[key], rtol=1e-5, err_msg=key)
    lo, hi = stats.beta.ppf(0.025, 3, 4), stats.beta.ppf(0.975, 4, 3)  # Clopper-Pearson of 3 of 6, by hand
    k = pa["pr_gaussian.counts"]
    assert (k == 3).any()
    np.testing.assert_allclose(pa["pr_gaussian.cp_lower"][k == 3], lo)
    np.testing.assert_allclose(pa["pr_gaussian.cp_upper"][k == 3], hi)
    np.testing.assert_array_equal(pa["pr_gaussian.pr"], k / 6)
    # Every PR figure of every distribution and level is there, with its interval and size.
    assert set(a["figures"]["pr"]) == {"gaussian", "uniform", "pdis"}
    assert list(a["figures"]["pr"]["pdis"]) == ["c1=0.3"]
    level = a["figures"]["pr"]["gaussian"]["0.12"]
    for name in ("all", "clean_correct", "lower_bound", "lower_bound_entropic", "entropic_risk"):
        lo, hi = level[name]["interval"]
        assert lo <= level[name]["value"] <= hi and level[name]["n"] > 0, name
    assert set(level["prob_acc"]) == {"0.2", "0.1", "0.05", "0.01"}
    for d, levels in a["figures"]["pr"].items():
        for eps, f in levels.items():  # the bounds, from the same samples, never exceed PR
            assert (
                f["lower_bound_entropic"]["value"]
                <= f["lower_bound"]["value"] + 1e-9
                <= f["lower_bound_positive_part"]["value"] + 2e-9
                <= f["all"]["value"] + 3e-9
            ), (d, eps)
    assert a["settings"]["pr"]["entropic_lambda"] == pytest.approx(0.42 - 0.001)
    assert set(a["evaluator_wall_time_s"]) == {
        "clean",
        "pgd20",
        "cw20",
        "apgd_ce",
        "apgd_dlr",
        "pr_gaussian",
        "pr_uniform",
        "pr_pdis",
    }


@pytest.mark.slow
def test_accuracies_have_exact_binomial_intervals_and_worst_case_is_per_example():
    model_fns, state, split = tiny_setup()
    per_image = {}
    results = evaluate(
        eval_config(pr={"distributions": ("gaussian",)}),
        model_fns,
        state,
        split,
        batch_size=4,
        progress=False,
        per_image_out=per_image,
        evaluators="clean,pgd20,apgd",
    )
    fig = results["figures"]
    correct = per_image["clean.correct"]
    ci = stats.binomtest(int(correct.sum()), len(correct)).proportion_ci(0.95, method="exact")
    np.testing.assert_allclose(fig["clean_accuracy"]["interval"], [ci.low, ci.high], rtol=1e-7, atol=1e-12)
    worst = correct & per_image["pgd20.robust"] & per_image["apgd_ce.robust"] & per_image["apgd_dlr.robust"]
    assert fig["worst_case"]["value"] == worst.mean()
    assert fig["worst_case"]["attacks"] == ["pgd20", "apgd_ce", "apgd_dlr"]
    assert "pr" not in results and "cw20" not in fig


def write_eval(workdir, scale, model_seed=0):
    model_fns, state, split = tiny_setup(scale, num_images=12, model_seed=model_seed)
    per_image = {}
    results = evaluate(
        eval_config(pr={"distributions": ("gaussian",)}),
        model_fns,
        state,
        split,
        batch_size=4,
        progress=False,
        per_image_out=per_image,
        evaluators="clean,pr",
    )
    os.makedirs(os.path.join(workdir, "eval"))
    with open(os.path.join(workdir, "eval", "results.json"), "w") as f:
        json.dump(results, f)
    np.savez(os.path.join(workdir, "eval", "per_image.npz"), **per_image)
    return per_image


@pytest.mark.slow
def test_comparison_table_paired_differences_and_plot(tmp_path):
    a, b = str(tmp_path / "run_a"), str(tmp_path / "run_b")
    pa, pb = write_eval(a, 1.0), write_eval(b, 0.3, model_seed=5)
    plot = str(tmp_path / "plot.png")
    text = comparison.compare([a, b], plot)
    for column in ("Acc %", "PR(0.1) %", "PR(0.12) %", "PR(0.15) %", "PR(0.2) %", "dPR(0.1) pp"):
        assert column in text
    assert "PGD %" not in text and "CW %" not in text  # neither run was attacked: no column of dashes
    assert open(plot, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    diffs = json.load(open(str(tmp_path / "plot_paired_differences.json")))
    counts_a, counts_b = pa["pr_gaussian.counts"], pb["pr_gaussian.counts"]
    correct_a, correct_b = pa["clean.correct"], pb["clean.correct"]
    both = correct_a & correct_b
    assert correct_a.sum() != correct_b.sum() and 0 < both.sum()  # the three estimands differ
    for j, eps in enumerate(("0.1", "0.12", "0.15", "0.2")):
        figs = diffs[0]["distributions"]["gaussian"][eps]
        pr_a, pr_b = counts_a[:, j] / 6, counts_b[:, j] / 6
        expected = {
            "all": np.mean(pr_b - pr_a),
            "both_correct": np.mean((pr_b - pr_a)[both]),
            "clean_correct": pr_b[correct_b].mean() - pr_a[correct_a].mean(),
        }
        for estimand, value in expected.items():
            fig = figs[estimand]
            assert fig["value"] == pytest.approx(value), (eps, estimand)
            assert fig["interval"][0] <= fig["value"] <= fig["interval"][1]
    # The CLI prints the same comparison without re-evaluating.
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "patjax.evaluate",
            f"--workdir={a}",
            f"--workdir={b}",
            "--compare_only",
            f"--plot={plot}",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "dPR(0.2) pp" in out.stdout and "run_b" in out.stdout
    # A run evaluated under another definition of a distribution (here 'uniform' as clipped
    # x + eps U[-1,1]) does not share its perturbations: refused.
    results_b = os.path.join(b, "eval", "results.json")
    old = json.load(open(results_b))
    old["settings"]["uniform"] = "x + eps * U[-1,1]^d, clipped to [0,1]"
    json.dump(old, open(results_b, "w"))
    with pytest.raises(UserError, match=r"different settings \(uniform\)"):
        comparison.compare([a, b], plot)


def test_a_comparison_pairs_log10_p_image_by_image_and_counts_where_only_a_sign_is_known():
    from patjax.reporting import report

    settings = {"seed": 0, "confidence": 0.95, "bootstrap_resamples": 200,
                "rare_pr": {"epsilons": [0.1, 0.2], "depth": 20.0, "distribution": "uniform"}}  # fmt: skip
    inf = np.inf
    # Five images; the fifth is misclassified by the run (left out of the pairing).
    run = {
        "clean.correct": np.array([1, 1, 1, 1, 0], bool),
        "rare_pr.ordered": np.array([[-4.0, -2.0], [-6.0, -3.0], [-inf, -5.0], [-3.0, np.nan], [-1.0, -1.0]]),
    }
    base = {
        "clean.correct": np.ones(5, bool),
        "rare_pr.ordered": np.array([[-2.0, -1.0], [-3.0, -2.0], [-7.0, -4.0], [-inf, -inf], [-9.0, -9.0]]),
    }
    figs = comparison.rare_pr_differences(settings, run, base)
    assert set(figs) == {"0.1", "0.2"}
    # At 0.1: differences -2 and -3 on images 0 and 1; image 2 only the run below the depth, image 3 only the base.
    assert figs["0.1"]["value"] == pytest.approx(-2.5) and figs["0.1"]["n"] == 2
    assert (figs["0.1"]["a_lower"], figs["0.1"]["b_lower"], figs["0.1"]["both_below"]) == (1, 1, 0)
    # At 0.2: -1, -1, -1 on images 0-2; image 3 the run has no value.
    assert figs["0.2"]["value"] == pytest.approx(-1.0) and figs["0.2"]["n"] == 3 and figs["0.2"]["no_value"] == 1
    lines = "\n".join(report.rare_pr_difference_lines([{"run": "pat", "baseline": "pgd", "rare_pr": figs}], settings))
    assert "both < 1e-20" in lines and "-2.50 [" in lines and "-1.00 [-1.00, -1.00]" in lines
    assert comparison.rare_pr_differences(settings, {"clean.correct": run["clean.correct"]}, base) == {}


def test_paired_evaluations_share_one_resampling_of_their_images():
    s = {"num_examples": 7, "bootstrap_resamples": 100, "seed": 3, "confidence": 0.9, "pr": {"samples": 6}}
    indices, confidence = comparison.pairing([s, dict(s)], ["a", "b"])
    assert confidence == 0.9
    # The documented draw: numpy's default generator seeded with the evaluation seed, images with
    # replacement, one row per resample.
    np.testing.assert_array_equal(indices, np.random.default_rng(3).integers(0, 7, size=(100, 7)))
    with pytest.raises(UserError, match=r"'a' and 'b' were evaluated with different settings \(seed\)"):
        comparison.pairing([s, dict(s, seed=4)], ["a", "b"])


@pytest.mark.slow
def test_certify_figures_equal_cohen_et_als_procedure_recomputed_from_the_noise(tmp_path, monkeypatch):
    """The certify evaluator's per-image counts, certificates and figures against numpy and
    scipy.stats: f's classes at x + sigma z (unclipped) with z drawn from its documented stream,
    CERTIFY with the Clopper-Pearson bound as beta.ppf and Phi^-1 as norm.ppf, PREDICT with
    binomtest, certified accuracy as Cohen et al.'s analyze.py counts it."""
    sigma, n0, n, alpha, seed, radii = 0.1, 5, 40, 0.05, 2, (0.0, 0.05, 0.1)
    cfg = eval_config(
        certify={
            "sigma": sigma,
            "selection_samples": n0,
            "samples": n,
            "alpha": alpha,
            "radii": radii,
            "chunk_size": 7,
        },
        seed=seed,
    )
    workdir, state, split = fake_workdir(tmp_path, monkeypatch, cfg)
    returned = evaluation.evaluate_workdir(workdir, num_examples=7, batch_size=4, progress=False, evaluators="certify")
    z = dict(np.load(os.path.join(workdir, "eval", "per_image.npz")))
    w = np.asarray(state.params["Dense_0"]["kernel"], np.float64)
    b = np.asarray(state.params["Dense_0"]["bias"], np.float64)
    x = split.images.astype(np.float64) / 255.0
    # The evaluator's stream: fold_in(PRNGKey(seed), its name's stream), then image i, sample j;
    # samples 0..n0-1 select, n0..n0+n-1 estimate.
    key = jax.random.fold_in(jax.random.PRNGKey(seed), streams.name_stream("certify"))
    counts, outside = np.zeros((7, n0 + n, 10), int), 0
    for i in range(7):
        for j in range(n0 + n):
            noise = np.asarray(jax.random.normal(jax.random.fold_in(jax.random.fold_in(key, i), j), x.shape[1:]))
            noisy = x[i] + sigma * noise
            counts[i, j, (noisy.reshape(-1) @ w + b).argmax()] = 1
            outside += (noisy.reshape(-1) @ w + b).argmax() != (np.clip(noisy, 0, 1).reshape(-1) @ w + b).argmax()
    selection, estimation = counts[:, :n0].sum(1), counts[:, n0:].sum(1)
    np.testing.assert_array_equal(z["certify_counts.selection"], selection)
    np.testing.assert_array_equal(z["certify_counts.estimation"], estimation)
    assert outside > 0  # samples whose class clipping the noise to [0, 1] would change: it is not clipped
    guess = selection.argmax(1)
    n_a = estimation[np.arange(7), guess]
    p_lower = np.where(n_a > 0, stats.beta.ppf(alpha, n_a, n - n_a + 1), 0.0)
    cls = np.where(p_lower >= 0.5, guess, -1)
    radius = np.where(p_lower >= 0.5, sigma * stats.norm.ppf(p_lower), 0.0)
    np.testing.assert_array_equal(z["certify.class"], cls)
    np.testing.assert_allclose(z["certify.radius"], radius, rtol=1e-12)
    top2 = np.sort(estimation, 1)[:, ::-1][:, :2]
    p_test = np.array([stats.binomtest(int(a), int(a + c), 0.5).pvalue for a, c in top2])
    np.testing.assert_array_equal(z["certify.predict"], np.where(p_test > alpha, -1, estimation.argmax(1)))
    # A mix of outcomes: certified right, certified wrong, abstained.
    assert np.any(cls == -1) and np.any(cls == split.labels) and np.any((cls >= 0) & (cls != split.labels))

    figures = returned["figures"]["certify"]
    for r in radii:
        hits = (cls == split.labels) & (radius >= r)
        fig = figures["certified_accuracy"][robustness.level_key(r)]
        ci = stats.binomtest(int(hits.sum()), 7).proportion_ci(0.95, method="exact")
        assert fig["value"] == pytest.approx(hits.mean()) and fig["n"] == 7
        np.testing.assert_allclose(fig["interval"], [ci.low, ci.high], rtol=1e-7, atol=1e-12)
    assert figures["abstained"]["value"] == pytest.approx(np.mean(cls == -1))
    assert returned["settings"]["certify"]["samples"] == n and returned["settings"]["certify"]["radii"] == list(radii)
    eval_files.check_results(returned, "results.json", "re-run")
    assert {"certify.class", "certify.radius"} <= set(eval_files.per_image_arrays(returned["settings"]))
    # The comparison lays the radii out beside the other figures.
    table = report.comparison(["run"], [returned])
    assert "cert(0.05) %" in table and f"sigma = {sigma:g}, n0 = {n0}, n = {n}" in table

    # Neither the batch nor the chunk changes a count (keys come from image and sample indices).
    model_fns, state, split = tiny_setup(0.3)
    other = {}
    evaluate(
        config_lib.with_eval_overrides(cfg, {"certify.chunk_size": 45}),
        model_fns,
        state,
        split,
        evaluators="certify",
        batch_size=3,
        progress=False,
        per_image_out=other,
    )
    np.testing.assert_array_equal(other["certify_counts.estimation"], estimation)


@pytest.mark.slow
def test_certified_accuracy_differences_are_paired_over_the_same_images_and_noise():
    cfg = eval_config(
        certify={"sigma": 0.1, "selection_samples": 5, "samples": 40, "alpha": 0.05, "radii": (0.0, 0.05)}
    )
    results, per_images = [], []
    for model_seed, batch_size in ((0, 4), (1, 4), (0, 3)):  # the third: the first model again
        model_fns, state, split = tiny_setup(model_seed=model_seed)
        per_image = {}
        results.append(
            evaluate(cfg, model_fns, state, split, "certify", batch_size, progress=False, per_image_out=per_image)
        )
        per_images.append(per_image)
    diffs = comparison.paired_differences(["runs/a", "runs/b", "runs/a_again"], results, per_images)
    idx = np.random.default_rng(0).integers(0, 7, size=(200, 7))  # the documented bootstrap: seed 0, 200 resamples
    hits = [
        [(p["certify.class"] == split.labels) & (p["certify.radius"] >= r) for r in (0.0, 0.05)] for p in per_images
    ]
    for j, r in enumerate(("0.0", "0.05")):
        fig = diffs[0]["certified_accuracy"][r]
        diff = hits[1][j].astype(float) - hits[0][j]
        assert fig["value"] == pytest.approx(diff.mean()) and fig["n"] == 7
        np.testing.assert_allclose(fig["interval"], np.quantile(diff[idx].mean(1), [0.025, 0.975]), atol=1e-12)
        # The same model on the same noise (another batch): the same certificates, a difference of 0.
        assert diffs[1]["certified_accuracy"][r] == {**fig, "value": 0.0, "interval": [0.0, 0.0]}
    assert any(np.any(h[1] != h[0]) for h in zip(*hits[:2]))  # the two models differ somewhere
    assert "dcert(0.05) pp" in report.certified_difference_lines(diffs)[1]
    # Certified under other settings, the runs are not compared at all: their certificates are other figures.
    settings = results[1]["settings"]
    other = {**results[1], "settings": {**settings, "certify": {**settings["certify"], "samples": 41}}}
    with pytest.raises(UserError, match=r"\(certify.samples\): not comparable"):
        comparison.paired_differences(["a", "b"], [results[0], other], per_images)


@pytest.mark.slow
def test_bad_evaluator_is_one_line_user_error(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "patjax.evaluate", f"--workdir={tmp_path}", "--evaluators=pgd7"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        "error: unknown evaluator 'pgd7'; choose from clean, pgd20, cw20, apgd_ce, apgd_dlr, aa, pr, rare_pr, certify, "
        "apgd, all"
    ]


def strict_json(path):
    """results.json parsed as strict JSON: NaN / Infinity are refused."""

    def refuse(token):
        raise AssertionError(f"{path} holds {token}")

    with open(path) as f:
        return json.load(f, parse_constant=refuse)


def fake_workdir(tmp_path, monkeypatch, cfg, scale=1.0):
    """A workdir whose 'checkpoint' is the tiny linear model (restore and data patched)."""
    model_fns, state, split = tiny_setup(scale)
    workdir = str(tmp_path / "run")
    workdir_lib.save_config(cfg.to_dict(), workdir)
    monkeypatch.setattr(checkpoints, "latest_step", lambda w: 3)
    monkeypatch.setattr(workdir_lib, "restore", lambda w, step=None: (workdir_lib.load_settings(w), model_fns, state))
    monkeypatch.setattr(cifar, "load_split", lambda *a: split)
    return workdir, state, split


def test_results_json_equals_numpy_recomputation_from_per_image_npz(tmp_path, monkeypatch):
    lam, conf, resamples, seed = 0.5, 0.9, 300, 4
    # The defaults' headline PR is the Table-1 protocol: uniform noise, clean-correct images.
    cfg = eval_config(
        pr={"distributions": (), "entropic_lambda": lam}, confidence=conf, bootstrap_resamples=resamples, seed=seed
    )
    workdir, state, split = fake_workdir(tmp_path, monkeypatch, cfg)
    returned = evaluation.evaluate_workdir(workdir, num_examples=7, batch_size=4, progress=False, evaluators="clean,pr")
    saved = strict_json(os.path.join(workdir, "eval", "results.json"))
    assert saved == returned
    z = dict(np.load(os.path.join(workdir, "eval", "per_image.npz")))
    n, N = 7, 6

    # The npz itself, independently: clean predictions and PR counts of the linear model on
    # U[max(x - eps, 0), min(x + eps, 1)] samples from u = uniform(fold_in(fold_in(PRNGKey(seed), i), j)).
    w = np.asarray(state.params["Dense_0"]["kernel"], np.float64)
    b = np.asarray(state.params["Dense_0"]["bias"], np.float64)
    x = split.images.astype(np.float64) / 255.0
    correct = (x.reshape(n, -1) @ w + b).argmax(1) == split.labels
    np.testing.assert_array_equal(z["clean.correct"], correct)
    assert 0 < correct.sum() < n
    epsilons = [float(e) for e in cfg.eval.pr.epsilons]
    expected_counts = np.zeros((n, len(epsilons)), int)
    for i in range(n):
        for j in range(N):
            k = jax.random.fold_in(jax.random.fold_in(jax.random.PRNGKey(seed), i), j)
            u = np.asarray(jax.random.uniform(k, x.shape[1:]), np.float64)
            for e_i, e in enumerate(epsilons):
                low, high = np.maximum(x[i] - e, 0), np.minimum(x[i] + e, 1)
                logits = (low + (high - low) * u).reshape(-1) @ w + b
                expected_counts[i, e_i] += logits[split.labels[i]] > np.delete(logits, split.labels[i]).max()
    counts = z["pr_uniform.counts"]
    np.testing.assert_array_equal(counts, expected_counts)
    assert 0 < counts.sum() < counts.size * N  # not a degenerate all-or-nothing case
    for i in range(n):  # per-image exact intervals against scipy
        ci = stats.binomtest(int(counts[i, 0]), N).proportion_ci(conf, method="exact")
        np.testing.assert_allclose(
            [z["pr_uniform.cp_lower"][i, 0], z["pr_uniform.cp_upper"][i, 0]], [ci.low, ci.high], rtol=1e-7, atol=1e-12
        )
    # Identity of the evaluation, stored beside the outcomes.
    assert int(z["meta.step"]) == 3 and int(z["meta.seed"]) == seed and int(z["meta.num_examples"]) == n
    assert int(z["meta.pr.samples"]) == N and list(z["meta.pr.epsilons"]) == epsilons

    # results.json from the npz, with numpy only.
    assert saved["clean_accuracy"] == pytest.approx(correct.mean())
    pr = counts / N
    alpha = 1 - conf

    def bootstrap(values, mask=None):  # the documented percentile bootstrap over all images
        idx = np.random.default_rng(seed).integers(0, len(values), size=(resamples, len(values)))
        m = np.ones(len(values)) if mask is None else mask.astype(np.float64)
        with np.errstate(invalid="ignore"):  # a resample without a subset image is 0/0: NaN, dropped below
            ratios = (values * m)[idx].sum(axis=1) / m[idx].sum(axis=1)  # a subset is drawn anew
        return [np.nanquantile(ratios, alpha / 2), np.nanquantile(ratios, 1 - alpha / 2)]

    for j, e in enumerate(epsilons):
        key = repr(e)
        fig = saved["figures"]["pr"]["uniform"][key]
        assert saved["pr"][key]["value"] == pytest.approx(pr[correct, j].mean())
        assert saved["pr"][key]["n"] == correct.sum()
        np.testing.assert_allclose(saved["pr"][key]["interval"], bootstrap(pr[:, j], correct), rtol=1e-12)
        assert saved["pr_all_images"][key]["value"] == pytest.approx(pr[:, j].mean())
        assert fig["all"]["value"] == pytest.approx(pr[:, j].mean())
        assert fig["clean_correct"]["value"] == pytest.approx(pr[correct, j].mean())
        np.testing.assert_allclose(fig["all"]["interval"], bootstrap(pr[:, j]), rtol=1e-12)
        np.testing.assert_allclose(fig["clean_correct"]["interval"], bootstrap(pr[:, j], correct), rtol=1e-12)
        for q in (0.2, 0.1, 0.05, 0.01):
            assert fig["prob_acc"][repr(q)]["value"] == pytest.approx(np.mean(pr[:, j] > 1 - q))
            assert fig["clean_correct"]["prob_acc"][repr(q)]["value"] == pytest.approx(np.mean(pr[correct, j] > 1 - q))
            assert fig["clean_correct"]["prob_acc"][repr(q)]["n"] == correct.sum()
        mean_loss = z["pr_uniform.sum_loss"][:, j].astype(np.float64) / N
        bound = 1 - mean_loss / np.log(2)
        risk = (z["pr_uniform.lse_loss"][:, j].astype(np.float64) - np.log(N)) / lam
        for name, values in (
            ("expected_loss", mean_loss),
            ("lower_bound", bound),
            ("lower_bound_positive_part", np.maximum(bound, 0)),
            ("entropic_risk", risk),
            ("lower_bound_entropic", 1 - risk / np.log(2)),
        ):
            assert fig[name]["value"] == pytest.approx(values.mean(), rel=1e-9, abs=1e-12), (key, name)
            np.testing.assert_allclose(fig[name]["interval"], bootstrap(values), rtol=1e-9, atol=1e-12)
    # The comparison note states the configured confidence, not a hard-coded 95 %.
    # Table 1's law at its radii but N = 6, not its 100: not called the Table-1 protocol.
    assert saved["settings"]["pr"]["distribution"] == "uniform" and saved["pr_protocol"].startswith("per image")
    text = comparison.compare([workdir], str(tmp_path / "plot.png"))
    assert "[90 % intervals]" in text and "PR: per image" in text and "(not the Table-1 protocol" in text

    # One estimator per figure: the suite tables' mean over one seed, computed from the
    # per-image outcomes by another path (aggregate.mean_figures), carries the same values
    # and intervals as results.json.
    outcome = run_outcomes.RunOutcome(
        run=None,
        correct=z["clean.correct"].astype(bool),
        robust={},
        pr_counts={"uniform": counts},
        results=saved,
        record={},
        train_s=None,
    )
    table = aggregate.mean_figures([outcome], patjax_stats.bootstrap_indices(n, resamples, seed), conf)
    for key in (repr(e) for e in epsilons):
        fig = saved["figures"]["pr"]["uniform"][key]
        for subset, row in (("all", "pr_all"), ("clean_correct", "pr_clean_correct")):
            assert table[row][key]["value"] == fig[subset]["value"]
            assert list(table[row][key]["interval"]) == fig[subset]["interval"], (key, subset)


@pytest.mark.slow
def test_a_kill_between_the_two_writes_is_caught_when_comparing(tmp_path, monkeypatch):
    cfg = eval_config(pr={"distributions": ("gaussian",)}, bootstrap_resamples=100)
    workdir, _, _ = fake_workdir(tmp_path, monkeypatch, cfg)
    evaluation.evaluate_workdir(workdir, num_examples=5, batch_size=5, progress=False, evaluators="clean,pr")
    results_path = os.path.join(workdir, "eval", "results.json")
    before = open(results_path).read()
    eval_files.load_results(workdir)  # consistent: loads

    def killed(path, obj):
        raise KeyboardInterrupt

    # Re-evaluated with another seed and killed while writing: per_image.npz is written first,
    # results.json (the commit marker) is not, and the mismatch is refused, not paired.
    monkeypatch.setattr(eval_files, "write_json", killed)
    with pytest.raises(KeyboardInterrupt):
        evaluation.evaluate_workdir(
            workdir, num_examples=5, batch_size=5, progress=False, evaluators="clean,pr", overrides={"seed": 1}
        )
    assert open(results_path).read() == before
    assert int(np.load(os.path.join(workdir, "eval", "per_image.npz"))["meta.seed"]) == 1
    with pytest.raises(UserError, match=r"per_image.npz does not belong to results.json \(seed 1 vs 0\)"):
        eval_files.load_results(workdir)
    with pytest.raises(UserError, match="does not belong"):
        comparison.compare([workdir, workdir], str(tmp_path / "p.png"))
    # A file written before the identity was stored is checked on its number of images.
    np.savez(os.path.join(workdir, "eval", "per_image.npz"), image_index=np.arange(4))
    with pytest.raises(UserError, match="holds 4 images but results.json 5"):
        eval_files.load_results(workdir)


def test_results_json_is_strict_json_with_non_finite_numbers_as_null(tmp_path):
    path = str(tmp_path / "r.json")
    written = files.write_json(
        path,
        {"a": float("nan"), "b": [np.float32(np.inf), 1.5, -np.inf], "c": np.int64(3), "d": {"e": np.float64(2.0)}},
    )
    expected = {"a": None, "b": [None, 1.5, None], "c": 3, "d": {"e": 2.0}}
    assert strict_json(path) == expected and written == expected


def dummy_checkpoint(workdir):
    """A config.json and an Orbax checkpoint (of a placeholder tree): what the up-front checks look at."""
    import orbax.checkpoint as ocp

    workdir_lib.save_config(config_lib.default_config().to_dict(), workdir)
    manager = checkpoints.checkpoint_manager(workdir)
    manager.save(1, args=ocp.args.StandardSave({"w": np.zeros(2, np.float32)}))
    manager.wait_until_finished()
    manager.close()


def listing(root):
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs)


@pytest.mark.slow
def test_cli_checks_every_workdir_before_evaluating_any(tmp_path):
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    dummy_checkpoint(a)
    workdir_lib.save_config(config_lib.default_config().to_dict(), b)  # a config but no checkpoint
    before = listing(tmp_path)
    # A is fine (it would be evaluated first; its placeholder checkpoint would then fail to
    # restore with a traceback): B's missing checkpoint must be reported first, in one line.
    out = subprocess.run(
        [sys.executable, "-m", "patjax.evaluate", f"--workdir={a}", f"--workdir={b}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip().splitlines() == [f"error: no checkpoint and no kept model in {b!r}; train first"]
    assert listing(tmp_path) == before  # nothing written
    assert not os.path.exists(os.path.join(a, "eval"))


def test_bad_numeric_settings_fail_before_anything_is_restored_or_evaluated(tmp_path):
    a = str(tmp_path / "a")
    dummy_checkpoint(a)
    before = listing(tmp_path)
    cases = [
        ({"overrides": {"seed": -1}}, "eval.seed must be an integer in [0, 4294967295], got -1"),
        ({"overrides": {"seed": 2**32}}, "eval.seed must be an integer in [0, 4294967295]"),
        ({"overrides": {"pr.samples": 0}}, "eval.pr.samples must be an integer in [1, 1000000], got 0"),
        ({"overrides": {"pr.chunk_size": -2}}, "eval.pr.chunk_size must be an integer in [1, 10000]"),
        ({"batch_size": 0}, "eval.batch_size must be an integer in [1, 10000], got 0"),
        ({"num_examples": 2.5}, "eval.num_examples must be an integer in [1, 1000000], or -1 (the whole test split)"),
        (
            {"num_examples": 0},
            "eval.num_examples must be an integer in [1, 1000000], or -1 (the whole test split), got 0",
        ),
        ({"num_examples": -2}, "eval.num_examples must be an integer in [1, 1000000], or -1"),
        ({"overrides": {"confidence": 1.0}}, "eval.confidence must be in (0, 1)"),
        ({"overrides": {"certify.sigma": 0.0}}, "eval.certify.sigma must be > 0, got 0.0"),
        ({"overrides": {"certify.alpha": 1.0}}, "eval.certify.alpha must lie in (0, 1), got 1.0"),
        ({"overrides": {"certify.selection_samples": 0}}, "eval.certify.selection_samples must be an integer in"),
        ({"overrides": {"certify.samples": 0}}, "eval.certify.samples must be an integer in"),
        ({"overrides": {"certify.radii": (0.5, -1.0)}}, "eval.certify.radii must be non-empty, finite and >= 0"),
    ]
    for kwargs, message in cases:
        with pytest.raises(UserError) as error:
            evaluation.evaluate_workdir(a, progress=False, **kwargs)  # the placeholder checkpoint is never restored
        assert message in str(error.value) and "\n" not in str(error.value), kwargs
    assert listing(tmp_path) == before


def test_prob_acc_is_strict_at_the_threshold():
    # ProbAcc_q counts images with PR_i > 1 - q (AT-PR's Prob.Acc, strict). With N = 100 an
    # image at exactly 80/90/95/99 non-adversarial samples sits on a threshold and must not
    # count; counted by hand in integers: #{counts > 100 (1 - q)}.
    counts = np.array([80, 81, 90, 91, 95, 96, 99, 100])
    correct = np.array([True] * 7 + [False])  # the 100/100 image is not clean-correct
    s = config_lib.default_evaluation_settings(
        "cifar10",
        {
            "pr.samples": 100,
            "pr.entropic_lambda": 0.5,
            "confidence": 0.95,
            "bootstrap_resamples": 100,
            "seed": 0,
            "pr.prob_acc_q": (0.2, 0.1, 0.05, 0.01),
        },
    ).evaluator_settings
    figs = evaluators.pr.level_figures(
        counts, np.full(8, 10.0), np.full(8, 3.0), correct, s.view(evaluators.pr.EVALUATOR)
    )
    for q, above in (("0.2", 7), ("0.1", 5), ("0.05", 3), ("0.01", 1)):
        assert figs["prob_acc"][q]["value"] == pytest.approx(above / 8)
        assert figs["clean_correct"]["prob_acc"][q]["value"] == pytest.approx((above - 1) / 7)


def eval_files_bytes(eval_dir):
    return {f: open(os.path.join(eval_dir, f), "rb").read() for f in sorted(os.listdir(eval_dir))}


@pytest.mark.slow
def test_an_evaluation_made_otherwise_is_refused_unless_overwrite_and_the_first_stays_byte_identical(
    tmp_path, monkeypatch
):
    cfg = eval_config(pr={"distributions": ("gaussian",)}, bootstrap_resamples=100)
    workdir, _, _ = fake_workdir(tmp_path, monkeypatch, cfg)
    evaluation.evaluate_workdir(workdir, num_examples=5, batch_size=5, progress=False, evaluators="clean,pr")
    comparison.compare([workdir], None)  # draws eval/pr_vs_eps.png
    eval_dir = os.path.join(workdir, "eval")
    before = eval_files_bytes(eval_dir)
    assert "pr_vs_eps.png" in before
    # The command line's default (overwrite=False): another number of images, seed or N, or
    # fewer evaluators, would replace the first evaluation's figures -> refused, files untouched.
    refused = [
        ({"num_examples": 6, "evaluators": "clean,pr"}, "num_examples 5 there, 6 now"),
        ({"num_examples": 5, "evaluators": "clean,pr", "overrides": {"seed": 1}}, "seed 0 there, 1 now"),
        ({"num_examples": 5, "evaluators": "clean,pr", "overrides": {"pr.samples": 7}}, "pr.samples 6 there, 7 now"),
        ({"num_examples": 5, "evaluators": "clean"}, "evaluators clean,pr there, clean now, dropping pr"),
    ]
    for kwargs, message in refused:
        with pytest.raises(UserError) as error:
            evaluation.evaluate_workdir(workdir, batch_size=5, progress=False, overwrite=False, **kwargs)
        assert message in str(error.value) and "--overwrite" in str(error.value), kwargs
        assert "\n" not in str(error.value)
        assert eval_files_bytes(eval_dir) == before, kwargs
    # The same settings (another batch size changes no figure), or more evaluators beside the
    # same ones, may replace it: its figures come back identical.
    evaluation.evaluate_workdir(
        workdir, num_examples=5, batch_size=2, progress=False, evaluators="clean,pr", overwrite=False
    )
    evaluation.evaluate_workdir(
        workdir, num_examples=5, batch_size=5, progress=False, evaluators="clean,pgd20,pr", overwrite=False
    )
    again = json.loads(before["results.json"])
    assert eval_files.load_results(workdir)[0]["pr"] == again["pr"]
    # --overwrite replaces it (and removes the plot drawn from the replaced figures).
    evaluation.evaluate_workdir(
        workdir, num_examples=6, batch_size=5, progress=False, evaluators="clean", overwrite=True
    )
    assert sorted(os.listdir(eval_dir)) == ["per_image.npz", "results.json"]
    settings = eval_files.load_results(workdir)[0]["settings"]
    assert settings["evaluators"] == ["clean"] and settings["num_examples"] == 6


@pytest.mark.slow
def test_the_command_line_refuses_to_replace_an_evaluation_made_otherwise_in_one_line(tmp_path):
    a = str(tmp_path / "a")
    dummy_checkpoint(a)  # step 1
    # An evaluation of step 1 on the first 7 images with seed 0, as an older results.json records it
    # (the settings it lacks are not compared; its figures do not matter here), under the name
    # the default settings give; the check happens before the (placeholder) checkpoint is restored.
    os.makedirs(os.path.join(a, "eval"))
    made = {"num_examples": 7, "step": 1, "seed": 0, "evaluators": ["clean", "pgd20", "pr"]}
    made.update(attack_eps=8 / 255, pr_distribution="uniform", pr_epsilons=[0.1, 0.12, 0.15, 0.2])
    files.write_json(eval_files.results_path(a), {"figures": {}, "settings": made})
    before = eval_files_bytes(os.path.join(a, "eval"))
    out = subprocess.run(
        [sys.executable, "-m", "patjax.evaluate", f"--workdir={a}", "--num_examples=7", "--seed=1"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "seed 0 there, 1 now" in lines[0] and "--overwrite" in lines[0], lines
    assert "--eval_name" in lines[0]
    assert eval_files_bytes(os.path.join(a, "eval")) == before


def test_default_pr_pass_takes_at_most_10000_images_a_forward():
    # One forward pass of the PR pass takes len(eps) x batch x chunk images, and its memory grows
    # with them: 10,000 fit a 24 GB GPU for ResNet-18, 50,000 did not fit under 36 GiB
    # (docs/evaluation.md). The library call's default batch is the config's.
    cfg = config_lib.default_config()
    ev = cfg.eval
    assert len(ev.pr.epsilons) * ev.batch_size * ev.pr.chunk_size <= 10_000
    assert inspect.signature(api.evaluate).parameters["batch_size"].default == ev.batch_size


def test_the_pr_presets_are_the_papers_and_prbenchs_settings():
    """Written out by hand from each source: Appendix E (N = 100, eps 0.1 ... 0.2, the Table-1
    law, the default config's headline) and PRBench's evaluate.py (radius = [round(8/255, 2),
    0.08, 0.1, 0.12], uniform, 100 samples, and no other law)."""
    assert evaluators.pr.PRESETS["prbench"] == {
        "pr.distribution": "uniform",
        "pr.distributions": ("uniform",),
        "pr.epsilons": (0.03, 0.08, 0.1, 0.12),
        "pr.samples": 100,
    }
    default = config_lib.default_config().eval.pr
    assert evaluators.pr.PRESETS["table1"] == {
        "pr.distribution": default.distribution,
        "pr.epsilons": tuple(default.epsilons),
        "pr.samples": default.samples,
    }


def test_the_l2_preset_is_the_l2_law_alone_at_l2_radii():
    """Written out by hand: uniform_l2 the headline and the only law (the L-inf laws at L2 radii
    would be other figures under the same name), N = 100, radii from AutoAttack's 0.5 to 8."""
    assert evaluators.pr.PRESETS["l2"] == {
        "pr.distribution": "uniform_l2",
        "pr.distributions": ("uniform_l2",),
        "pr.epsilons": (0.5, 1.0, 2.0, 4.0, 8.0),
        "pr.samples": 100,
    }


def test_an_evaluation_with_the_l2_law_is_comparable_with_a_committed_one_on_the_laws_both_computed():
    """A law one evaluation computed and the other did not has no definition to agree on; a law both
    computed must have the same definition (results.json records one per law computed)."""
    committed = json.loads(
        (REPO / "docs/results/table1_cpu/runs/cifar10_small_cnn/pgd_s0/eval/results.json").read_text()
    )["settings"]
    committed = eval_settings.nested_settings(committed)  # written with flat names
    assert "uniform_l2" not in committed
    laws = ["uniform", "gaussian", "pdis", "uniform_l2"]
    settings = config_lib.default_evaluation_settings("cifar10", {"pr.distributions": tuple(laws)})
    new = evaluation.settings_record(settings, committed["num_examples"], committed["step"])
    assert [k for k in new if k in pr_laws.REGISTRY] == ["pdis", "gaussian", "uniform", "uniform_l2"]
    new = {**committed, "pr": {**committed["pr"], "distributions": laws}, "uniform_l2": new["uniform_l2"]}
    eval_settings.check_comparable(committed, new, "committed", "new")
    eval_settings.check_comparable(new, committed, "new", "committed")
    with pytest.raises(UserError, match=r"\(uniform\): not comparable"):
        eval_settings.check_comparable(committed, {**new, "uniform": "clip(x + eps U[-1, 1])"}, "committed", "new")
    # An evaluation of the L-inf laws alone records their definitions only, as every committed one does.
    only_linf = evaluation.settings_record(config_lib.default_evaluation_settings("cifar10", {}), 10, 0)
    assert [k for k in only_linf if k in pr_laws.REGISTRY] == ["pdis", "gaussian", "uniform"]


@pytest.mark.slow
def test_the_command_line_takes_the_l2_preset_and_its_radii_from_a_flag(tmp_path):
    """--pr_preset=l2 gives the headline under uniform_l2 at the L2 radii, --pr_epsilons others;
    a radius that is not a number is one line and no evaluation."""
    from patjax.interop import torch_weights

    model = networks.create_model("resnet18", "cifar10", 10, width=4)
    params, batch_stats = networks.init_variables(model, jax.random.PRNGKey(0))
    file = str(tmp_path / "r18.safetensors")
    meta = {"dataset": "cifar10", "num_classes": 10, "width": 4}
    torch_weights.export(file, "resnet18", params, batch_stats, networks.DATASET_STATS["cifar10"], metadata=meta)

    def evaluate_with(*flags):
        command = [sys.executable, "-m", "patjax.evaluate", f"--torch_checkpoint={file}", "--num_examples=8"]
        return subprocess.run(
            [*command, "--evaluators=clean,pr", "--pr_samples=4", "--overwrite", *flags],
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=300,
        )

    run = evaluate_with("--pr_preset=l2", "--pr_epsilons=1,3")
    assert run.returncode == 0, run.stderr
    results = json.load(open(tmp_path / "r18" / "eval" / "results.json"))
    settings = results["settings"]
    assert (settings["pr"]["distribution"], settings["pr"]["distributions"]) == ("uniform_l2", ["uniform_l2"])
    assert settings["pr"]["epsilons"] == [1.0, 3.0]  # the flag beside the preset wins
    assert set(results["pr"]) == {"1.0", "3.0"} and set(results["figures"]["pr"]) == {"uniform_l2"}
    assert settings["uniform_l2"] == pr_laws.get("uniform_l2").definition and "uniform" not in settings
    bad = evaluate_with("--pr_epsilons=0.1,big")
    assert bad.returncode != 0
    assert bad.stderr.strip() == "error: --pr_epsilons takes comma-separated numbers or fractions, got '0.1,big'"


@pytest.mark.slow
def test_the_command_line_takes_the_prbench_preset_and_an_l2_threat_model(tmp_path):
    """--pr_preset=prbench gives the headline at PRBench's radii (a flag beside it wins);
    --attack_norm=l2 with its radius and step evaluates PGD-20 in the L2 ball."""
    from patjax.interop import torch_weights

    model = networks.create_model("resnet18", "cifar10", 10, width=4)
    params, batch_stats = networks.init_variables(model, jax.random.PRNGKey(0))
    file = str(tmp_path / "r18.safetensors")
    meta = {"dataset": "cifar10", "num_classes": 10, "width": 4}
    torch_weights.export(file, "resnet18", params, batch_stats, networks.DATASET_STATS["cifar10"], metadata=meta)
    flags = ["--evaluators=clean,pgd20,pr", "--pr_preset=prbench", "--pr_samples=4", "--pr_distributions=uniform"]
    flags += ["--attack_norm=l2", "--attack_eps=0.5", "--attack_step_size=0.125"]
    run = subprocess.run(
        [sys.executable, "-m", "patjax.evaluate", f"--torch_checkpoint={file}", *flags, "--num_examples=8"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    results = json.load(open(tmp_path / "r18" / "eval" / "results.json"))
    settings = results["settings"]
    assert (settings["pr"]["epsilons"], settings["pr"]["distribution"]) == ([0.03, 0.08, 0.1, 0.12], "uniform")
    assert settings["pr"]["samples"] == 4  # the flag beside the preset wins
    assert set(results["pr"]) == {"0.03", "0.08", "0.1", "0.12"}
    assert settings["attack"] == {"eps": 0.5, "step_size": 0.125, "steps": 20, "norm": "l2"}
    assert results["figures"]["pgd20"]["settings"]["norm"] == "l2"


def binary_linear_images(n=60, seed=0):
    """A two-class linear model on 4x4x3 images whose pixels stay in [0.25, 0.75], where an L2 step of
    0.2 never meets the box: the closed form below holds."""
    rng = np.random.default_rng(seed)
    images = rng.integers(64, 193, (n, 4, 4, 3), dtype=np.uint8)
    kernel, bias = rng.normal(size=(48, 2)), rng.normal(size=2)
    logits = (images / 255.0).reshape(n, -1) @ kernel + bias
    return images, logits.argmax(1).astype(np.int32), kernel, bias


@pytest.mark.slow
def test_pgd_l2_and_apgd_l2_find_the_closed_form_attack_of_a_linear_model():
    """For two classes the loss gradient points along w_other - w_y at every point, so PGD-L2 (and
    APGD-CE in L2) ends
    at x + eps d, d that unit direction (each projected step shrinks the random start's component
    across d; 20 steps of eps/4 leave under 1 % of it): an image is robust iff its margin
    z_y - z_other exceeds eps |w_y - w_other|_2. Images within 5 % of that threshold are left out."""
    images, labels, kernel, bias = binary_linear_images()
    eps = 0.2
    results = api.evaluate(
        lambda x: x.reshape(x.shape[0], -1) @ kernel + bias,
        images,
        labels,
        evaluators="clean,pgd20,cw20,apgd_ce",
        batch_size=16,
        attack={"norm": "l2", "eps": eps, "step_size": eps / 4},
    )
    x = (images / 255.0).reshape(len(images), -1)
    z = x @ kernel + bias
    w_gap = np.linalg.norm(kernel[:, 0] - kernel[:, 1])
    margin = z[np.arange(len(labels)), labels] - z[np.arange(len(labels)), 1 - labels]
    robust = margin > eps * w_gap
    clear = np.abs(margin - eps * w_gap) > 0.05 * eps * w_gap
    assert 10 < robust[clear].sum() < clear.sum() - 10  # both outcomes occur
    for name in ("pgd20", "cw20", "apgd_ce"):
        np.testing.assert_array_equal(results["per_image"][f"{name}.robust"][clear], robust[clear])
        assert results["figures"][name]["settings"]["norm"] == "l2"
    assert results["settings"]["attack"]["norm"] == "l2" and results["settings"]["attack"]["eps"] == eps


def test_an_unknown_threat_model_is_refused():
    with pytest.raises(UserError, match="eval.attack.norm must be one of linf, l2, got 'l1'"):
        config_lib.default_evaluation_settings("cifar10", {"attack.norm": "l1"})


def test_an_l2_evaluation_does_not_replace_an_linf_one_recorded_before_the_norm_was(tmp_path):
    """A results.json written before the norm was recorded was L-inf (`IMPLICIT_BEFORE_RECORDED`),
    as its reader says."""
    previous = eval_settings.nested_settings({"attack_eps": 0.5, "seed": 0})
    assert previous == {"attack": {"eps": 0.5, "norm": "linf"}, "seed": 0}
    assert eval_settings.lost_settings(previous, {"attack": {"eps": 0.5, "norm": "linf"}}) == []
    assert eval_settings.lost_settings(previous, {"attack": {"eps": 0.5, "norm": "l2"}}) == [
        "attack.norm 'linf' there, 'l2' now"
    ]


def test_labels_tell_the_sources_apart():
    """A workdir and the file exported from it (both 'quickstart' by their stems) read apart; two
    workdirs of one name in different folders are named by their paths."""
    assert comparison.labels(["runs/quickstart/", "runs/quickstart.safetensors", "Carmon2019Unlabeled"]) == [
        "quickstart",
        "quickstart.safetensors",
        "Carmon2019Unlabeled",
    ]
    assert comparison.labels(["a/pgd", "b/pgd/"]) == ["a/pgd", "b/pgd"]


def test_a_files_evaluation_goes_beside_it_and_never_into_a_run_of_its_name(tmp_path):
    file = str(tmp_path / "quickstart.safetensors")
    assert eval_files.default_out_dir(file) == str(tmp_path / "quickstart")  # the documented default
    (tmp_path / "quickstart").mkdir()
    assert eval_files.default_out_dir(file) == str(tmp_path / "quickstart")  # a folder, but no run
    (tmp_path / "quickstart" / "config.json").write_text("{}")
    assert eval_files.default_out_dir(file) == str(tmp_path / "quickstart_safetensors")


@pytest.mark.slow
def test_a_long_evaluation_says_what_runs_its_estimate_and_the_time_left_and_its_figures_do_not_change(capsys):
    """Eight batches a pass (`evaluation.ANNOUNCE_BATCHES`) or more: a line of what runs, one of the
    estimate from a timed batch of each pass, one per pass with the time left; the timed batches
    change no figure. Fewer batches: nothing printed but the bars."""
    model_fns, state, split = tiny_setup(num_images=8)
    cfg = eval_config(pr={"distributions": ()})
    quiet = evaluate(cfg, model_fns, state, split, evaluators="clean,pgd20,pr", batch_size=1, progress=False)
    assert capsys.readouterr().out == ""
    said = evaluate(cfg, model_fns, state, split, evaluators="clean,pgd20,pr", batch_size=1, progress=True)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("evaluating clean, pgd20, pr on 8 images of cifar10's test split, 8 batches of 1 a pass")
    assert "attacks L∞, ε = 0.05" in lines[0] and "PR uniform law at ε = 0.1, 0.12, 0.15, 0.2" in lines[0]
    assert re.fullmatch(r"estimate: \d+ s in all \(clean \d+ s, pgd20 \d+ s, pr_uniform \d+ s; .*\)", lines[1])
    assert [line.split(" done")[0] for line in lines[2:]] == ["clean", "pgd20", "pr_uniform"]
    assert lines[2].endswith("left (pgd20, pr_uniform)") and lines[4].endswith("; the figures next")
    assert said["figures"] == quiet["figures"]
    evaluate(cfg, model_fns, state, split, evaluators="clean", batch_size=2, progress=True)
    assert capsys.readouterr().out == ""
