"""Randomized smoothing (`evaluators.certify`, `robustness.class_counts`) checked against its
authors' work, not against itself: (a) a transcription of locuslab/smoothing's `Smooth.certify`
and `predict` (tests/smoothing_reference.py) on the same counts, and on a patjax model exported
to PyTorch fed the same noise; (b) the authors' published CIFAR-10 table from their own
per-image logs (tests/evaluators/data/smoothing/PROVENANCE.md); (c) closed forms on a linear
classifier, where p_A and the smoothed classifier are known exactly."""

import json
import math
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import smoothing_reference
import torch
from conftest import REPO, train_run
from helpers import eval_config, tiny_config
from scipy.stats import beta, binom, norm

from patjax.data import cifar
from patjax.evaluators import certify, streams
from patjax.interop import torch_names
from patjax.models import networks
from patjax.pat import laws, robustness
from patjax.run import config as config_lib
from patjax.run import evaluation
from patjax.run import workdir as workdir_lib

LOGS = Path(__file__).parent / "data" / "smoothing"
SIGMAS = ("0.12", "0.25", "0.50", "1.00")


# ---------------------------------------------------------------------------------------
# (b) The published table from the authors' per-image logs.


def read_log(path) -> dict:
    """Their certify.py's output: a header `idx label predict radius correct time`, tab-separated."""
    lines = Path(path).read_text().splitlines()
    assert lines[0].split("\t") == ["idx", "label", "predict", "radius", "correct", "time"]
    rows = [line.split("\t") for line in lines[1:]]
    return {
        "label": np.array([int(r[1]) for r in rows]),
        "predict": np.array([int(r[2]) for r in rows]),
        "radius": np.array([float(r[3]) for r in rows]),
        "correct": np.array([int(r[4]) for r in rows]),
    }


def read_table(path):
    """Their markdown table: (radii, {sigma: [cells as written, two decimals]})."""
    lines = Path(path).read_text().splitlines()
    radii = [float(cell.split("=")[1]) for cell in lines[0].split("|")[2:] if cell.strip()]
    table = {}
    for line in lines[2:]:
        head, *cells = line.split("|")
        sigma = head.split("=")[1].replace("</b>", "").strip()
        table[sigma] = [c.replace("<b>*</b>", "").strip() for c in cells if c.strip()]
    return radii, table


def test_patjax_aggregates_the_authors_logs_into_their_published_table():
    radii, table = read_table(LOGS / "vary_noise_cifar10.md")
    assert radii == [0.25, 0.5, 0.75, 1.0, 1.25, 1.5]
    assert list(table) == list(SIGMAS)
    # The figures quoted for the table: sigma = 0.25 and 1.00.
    assert table["0.25"][:3] == ["0.60", "0.43", "0.27"]
    assert table["1.00"] == ["0.39", "0.34", "0.28", "0.22", "0.17", "0.14"]
    for sigma in SIGMAS:
        log = read_log(LOGS / f"cifar10/resnet110/noise_{sigma}/test/sigma_{sigma}")
        assert len(log["label"]) == 500
        # Their `correct` column is prediction == label; abstentions (-1) are never correct.
        np.testing.assert_array_equal(log["correct"], log["predict"] == log["label"])
        ours = certify.certified_at(log["predict"], log["label"], log["radius"], radii).mean(axis=1)
        assert [f"{v:.2f}" for v in ours] == table[sigma], sigma


# ---------------------------------------------------------------------------------------
# (a) The authors' CERTIFY and PREDICT on the same counts.


def count_cases(rng):
    """(selection, estimation, alpha) batches covering the decisions: skewed and flat class laws,
    n0 and n from 1 to 10,000, ties at the top of either draw, p_A's bound at and around 1/2."""
    cases = []
    for n0, n in ((1, 1), (1, 10), (10, 100), (100, 1000), (100, 10_000), (5, 7)):
        for concentration in (0.05, 0.5, 5.0):
            p = rng.dirichlet(np.full(10, concentration), size=40)
            sel = np.stack([rng.multinomial(n0, q) for q in p])
            est = np.stack([rng.multinomial(n, q) for q in p])
            for alpha in (0.001, 0.05, 0.4):
                cases.append((sel, est, alpha))
    ties = np.zeros((4, 10), int)
    ties[:, 3] = ties[:, 7] = 50  # a tie at the top of either draw: argmax takes class 3
    ties[1, 3] = 51
    ties[2, :] = 10
    ties[3] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 100]
    cases.append((ties, ties, 0.001))
    # Around p_A's bound of 1/2: every count of class 0 out of n = 40, the rest on class 1.
    k = np.arange(41)
    est = np.stack([k, 40 - k] + [np.zeros_like(k)] * 8, axis=1)
    cases.append((np.tile([[1] + [0] * 9], (41, 1)), est, 0.05))
    return cases


def test_certify_and_predict_equal_the_authors_on_the_same_counts():
    decisions = 0
    for sel, est, alpha in count_cases(np.random.default_rng(0)):
        sigma = 0.37
        ours = certify.certify(sel, est, alpha, sigma)
        ours_predict = certify.predict(est, alpha)
        theirs = smoothing_reference.smooth_on_counts(sel, est, alpha, sigma)
        np.testing.assert_array_equal(ours["class"], [t[0] for t in theirs])
        np.testing.assert_allclose(ours["radius"], [t[1] for t in theirs], rtol=1e-12, atol=0)
        np.testing.assert_array_equal(ours_predict, [t[2] for t in theirs])
        decisions += len(theirs)
        assert np.all((ours["radius"] > 0) | (ours["class"] == certify.ABSTAIN) | (ours["p_a_lower"] == 0.5))
    assert decisions > 2000


# ---------------------------------------------------------------------------------------
# (a) A patjax model exported to PyTorch, the authors' CERTIFY on the same counts and noise.

# A small CNN of the committed table1_cpu suite (clean training, 800 steps on CIFAR-10).
KEPT_RUN = REPO / "docs/results/table1_cpu/runs/cifar10_small_cnn/clean_s0"


@pytest.fixture(scope="module")
def exported(data_dir):
    """(model_fns, state, the same network in PyTorch, CIFAR-10's test split)."""
    _, model_fns, state = workdir_lib.restore(str(KEPT_RUN))
    normalize = networks.DATASET_STATS["cifar10"]
    net = networks_torch().create_model("small_cnn", 10, normalize)
    state_dict = torch_names.to_state_dict("small_cnn", state.params, state.batch_stats, normalize)
    net.load_state_dict({k: torch.from_numpy(v) for k, v in state_dict.items()}, strict=True)
    return model_fns, state, net.eval(), cifar.load_split("cifar10", "test", data_dir)


def networks_torch():
    from patjax_torch import models

    return models


def certify_images(model_fns, state, split, num_images, **settings):
    """patjax's certify evaluator on the first images: its per-image outputs."""
    cfg = eval_config(certify=settings)
    s = config_lib.evaluation_settings(cfg, evaluators="certify", num_examples=num_images, batch_size=16)
    per_image = {}
    evaluation.evaluate_state(s, model_fns, state, split, progress=False, per_image_out=per_image)
    return per_image, s.evaluator_settings


@pytest.mark.slow
def test_the_exported_model_under_the_same_noise_gives_the_authors_certificates(exported, monkeypatch):
    """Their `_sample_noise`, verbatim, fed patjax's Gaussian draws through `torch.randn_like`."""
    model_fns, state, net, split = exported
    n0, n, sigma, alpha, images = 8, 56, 0.25, 0.05, 6
    per_image, s = certify_images(
        model_fns, state, split, images, selection_samples=n0, samples=n, sigma=sigma, alpha=alpha
    )
    key = streams.attack_key(s.shared.seed, "certify")
    draws = []

    def given_randn_like(batch):
        z = draws.pop(0)
        assert z.shape == tuple(batch.shape)
        return z

    monkeypatch.setattr(smoothing_reference.torch, "randn_like", given_randn_like)
    for i in range(images):
        z = np.asarray(laws.noise_batch(key, jnp.array([i]), jnp.arange(n0 + n), (32, 32, 3), "gaussian"))[0]
        z = torch.from_numpy(z.transpose(0, 3, 1, 2).copy())
        # Their loop's batches of 16 in order: the selection's, the estimation's, and PREDICT's
        # (which draws n samples again: the estimation's, as patjax's PREDICT reads them).
        batches = lambda a, b: [z[j : min(j + 16, b)] for j in range(a, b, 16)]
        draws += batches(0, n0) + batches(n0, n0 + n) * 2
        x = torch.from_numpy(np.asarray(cifar.to_float(split.images[i])).transpose(2, 0, 1).copy())
        smooth = smoothing_reference.Smooth(net, 10, sigma)
        cls, radius = smooth.certify(x, n0, n, alpha, batch_size=16)
        assert cls == per_image["certify.class"][i]
        assert radius == pytest.approx(per_image["certify.radius"][i], rel=1e-12, abs=0)
        assert smooth.predict(x, n, alpha, batch_size=16) == per_image["certify.predict"][i]
    assert not draws


@pytest.mark.slow
def test_certificates_on_three_hundred_images_equal_the_authors_on_the_same_counts(exported):
    model_fns, state, _, split = exported
    per_image, _ = certify_images(model_fns, state, split, 300, selection_samples=20, samples=200, alpha=0.001)
    sel, est = per_image["certify_counts.selection"], per_image["certify_counts.estimation"]
    theirs = smoothing_reference.smooth_on_counts(sel, est, 0.001, 0.25)
    np.testing.assert_array_equal(per_image["certify.class"], [t[0] for t in theirs])
    np.testing.assert_allclose(per_image["certify.radius"], [t[1] for t in theirs], rtol=1e-12, atol=0)
    np.testing.assert_array_equal(per_image["certify.predict"], [t[2] for t in theirs])
    # Every kind of outcome occurs: certified right, certified wrong, abstained.
    cls, label = per_image["certify.class"], split.labels[:300]
    assert min(np.sum(cls == label), np.sum((cls != label) & (cls >= 0)), np.sum(cls < 0)) >= 10


# ---------------------------------------------------------------------------------------
# (c) Closed forms on a linear classifier.


def linear_problem(num_images=24):
    """A two-class linear classifier f(x) = [w.x + b > 0 ? 0 : 1] on images with saturated pixels
    (0 and 1: clipping the noise would change p_A there). Under x + sigma z, w.x + sigma w.z + b is
    N(w.x + b, sigma^2 |w|^2), so p_0 = Phi((w.x + b) / (sigma |w|)) and the smoothed classifier's
    exact radius is |w.x + b| / |w|, the distance to the hyperplane."""
    rng = np.random.default_rng(3)
    shape = (4, 4, 3)
    w = rng.normal(size=math.prod(shape)).astype(np.float32)
    x = rng.choice([0.0, 1.0, 0.3], size=(num_images, *shape)).astype(np.float32)
    margin = x.reshape(num_images, -1) @ w
    b = np.float32(-np.median(margin))
    logits_fn = lambda z: jnp.stack([z.reshape(z.shape[0], -1) @ w + b, jnp.zeros(z.shape[0])], axis=-1)
    return logits_fn, x, np.float64(w), float(b)


def test_linear_counts_follow_the_exact_law_of_unclipped_noise():
    logits_fn, x, w, b = linear_problem()
    sigma, n = 0.8, 4000
    counts = jax.jit(
        lambda x: robustness.class_counts(logits_fn, jax.random.PRNGKey(5), x, jnp.arange(len(x)), 0, n, 500, sigma)
    )(x)
    counts = np.asarray(counts)
    np.testing.assert_array_equal(counts.sum(1), n)
    p0 = norm.cdf((x.reshape(len(x), -1) @ w + b) / (sigma * np.linalg.norm(w)))
    lo, hi = binom.ppf(1e-6, n, p0), binom.isf(1e-6, n, p0)
    assert np.all((counts[:, 0] >= lo) & (counts[:, 0] <= hi)), np.c_[counts[:, 0], n * p0]
    # Standardized residuals: as a standard normal sample's, not one law's shifted by clipping.
    z = (counts[:, 0] - n * p0) / np.sqrt(n * p0 * (1 - p0) + 1e-12)
    assert abs(z.mean()) < 4 / np.sqrt(len(z))


@pytest.mark.slow
def test_linear_certificates_stay_within_the_exact_radius_and_approach_it():
    logits_fn, x, w, b = linear_problem()
    sigma, n0, n, alpha = 0.8, 100, 20_000, 0.001
    run = jax.jit(
        lambda first, num: robustness.class_counts(
            logits_fn, jax.random.PRNGKey(9), x, jnp.arange(len(x)), first, num, 1000, sigma
        ),
        static_argnums=(0, 1),
    )
    selection, estimation = np.asarray(run(0, n0)), np.asarray(run(n0, n))
    out = certify.certify(selection, estimation, alpha, sigma)
    signed = (x.reshape(len(x), -1) @ w + b) / np.linalg.norm(w)
    exact_class, exact_radius = np.where(signed > 0, 0, 1), np.abs(signed)
    p_a = norm.cdf(exact_radius / sigma)
    certified = out["class"] != certify.ABSTAIN
    # Never a wrong class, never past the exact radius: a wrong guess from the n0 samples (p_A
    # near 1/2) has a share below 1/2 of the n samples, and abstains.
    assert np.all(out["class"][certified] == exact_class[certified])
    assert np.all(out["radius"] <= exact_radius + 1e-9)
    right_guess = selection.argmax(1) == exact_class
    assert np.all(~certified[~right_guess])
    # With the right guess, within a few binomial standard errors of it (p_A's bound is about
    # 3.1 of them below p_A at alpha = 0.001).
    slack = 9 * np.sqrt(p_a * (1 - p_a) / n) + 1 / n
    sure = right_guess & (p_a - slack > 0.5)
    assert sure.sum() >= len(x) // 2
    assert np.all(certified[sure])
    assert np.all(out["radius"][sure] >= sigma * norm.ppf(p_a[sure] - slack[sure]) - 1e-9)
    # The radius is sigma Phi^-1 of the Clopper-Pearson bound of the guessed class's count.
    counts = estimation[np.arange(len(x)), out["class"].clip(0)]
    by_hand = sigma * norm.ppf(beta.ppf(alpha, counts, n - counts + 1))
    np.testing.assert_allclose(out["radius"][certified], by_hand[certified], rtol=1e-12)
    # PREDICT returns the exact smoothed class or abstains.
    predicted = certify.predict(estimation, alpha)
    assert np.all((predicted == exact_class) | (predicted == certify.ABSTAIN))
    assert np.all(predicted[p_a > 0.55] == exact_class[p_a > 0.55])


# ---------------------------------------------------------------------------------------
# The command lines: a Gaussian-augmentation run trained, then certified beside PR.


@pytest.mark.slow
@pytest.mark.long
def test_a_gaussian_augmentation_run_trains_and_is_certified_beside_pr_from_the_command_line(tmp_path, data_dir):
    cfg = tiny_config(data_dir=data_dir, method="gaussian", num_train_steps=4, **{"gaussian.sigma": 0.25})
    workdir = str(tmp_path / "run")
    train_run(cfg, workdir)

    def evaluate(*flags):
        command = [sys.executable, "-m", "patjax.evaluate", f"--workdir={workdir}", "--num_examples=16"]
        return subprocess.run(
            [*command, "--evaluators=clean,pr,certify", "--pr_samples=4", *flags],
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=300,
        )

    flags = ("--certify_sigma=0.25", "--certify_samples=64", "--certify_selection_samples=8", "--certify_radii=0,0.25")
    run = evaluate(*flags)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "cert(0.25) %" in run.stdout and "PR(0.1) %" in run.stdout
    results = json.loads((Path(workdir) / "eval" / "results.json").read_text())
    assert set(results["figures"]["certify"]["certified_accuracy"]) == {"0.0", "0.25"}
    assert results["settings"]["certify"]["sigma"] == 0.25 and results["settings"]["certify"]["samples"] == 64
    per_image = np.load(Path(workdir) / "eval" / "per_image.npz")
    assert per_image["certify.radius"].shape == (16,) and per_image["certify_counts.estimation"].sum() == 16 * 64
    bad = evaluate("--certify_sigma=0", "--overwrite")
    assert bad.returncode != 0
    assert bad.stderr.strip().splitlines()[-1] == "error: --certify_sigma must be > 0, got 0.0"
