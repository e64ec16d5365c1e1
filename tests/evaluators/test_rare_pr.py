"""The `rare_pr` evaluator (log10 P(violation) by AMLS, `patjax.pat.amls`): its settings' one check,
its figures against a computation by hand on made-up estimates, and a whole evaluation on a tiny
model beside PR. The estimator itself is checked in tests/pat/test_amls.py."""

import math

import numpy as np
import pytest
from helpers import eval_config, evaluate, tiny_setup

from patjax.core.errors import UserError
from patjax.evaluators import common, rare_pr
from patjax.pat import amls

R, C, D, N = amls.REACHED, amls.CENSORED, amls.DIED_OUT, amls.NOT_REACHED


@pytest.mark.parametrize(
    "fields,words",
    [
        ({"rho": 0.0}, "rho must lie in (0, 1)"),
        ({"rho": 1.0}, "rho must lie in (0, 1)"),
        ({"particles": 1}, "eval.rare_pr.particles must be an integer in [2,"),
        ({"mh_steps": 0}, "eval.rare_pr.mh_steps must be an integer in [1,"),
        ({"epsilons": (8,)}, "did you mean 8/255"),
        ({"epsilons": (0.0,)}, "must be non-empty, finite and > 0"),
        ({"distribution": "pdis"}, "must be one of uniform, gaussian"),
        ({"max_levels": 10}, "depth=30 cannot be reached: 10 levels at rho=0.1 with 1000 particles reach 10^-10"),
        ({"decades": (40,)}, "decades must lie in (0, depth=30]"),
        ({"depth": 0.0}, "depth must be > 0"),
    ],
)
def test_rare_pr_settings_refuse_bad_input_in_one_line(fields, words):
    with pytest.raises(UserError) as err:
        rare_pr.RarePRSettings(**fields)
    assert words in str(err.value) and "\n" not in str(err.value)


def test_rare_pr_settings_default_to_webb_et_al_and_reach_their_depth():
    s = rare_pr.RarePRSettings()
    assert (s.rho, s.particles, s.mh_steps, s.max_levels) == (0.1, 1000, 100, 500)
    assert s.epsilons == (8 / 255, 0.1, 0.12, 0.15, 0.2) and s.width is None
    assert amls.reachable_depth(s.rho, s.particles, 30) == pytest.approx(30)
    rare_pr.RarePRSettings(max_levels=30)  # exactly deep enough


def test_pooled_estimate_is_the_log_of_the_mean_p_hat_and_says_when_it_is_not_one():
    log10_p = np.array([[-3.0, -5.0], [-40.0, -2.0], [-np.inf, -4.0], [-7.0, -9.0]])
    outcome = np.array([[R, R], [C, R], [D, R], [N, R]])
    value, estimated = rare_pr.pooled(log10_p, outcome)
    assert value[0] == pytest.approx(math.log10((1e-3 + 1e-5) / 2))
    assert value[2] == pytest.approx(math.log10(1e-4 / 2))  # a run that died out is p-hat = 0
    assert estimated.tolist() == [True, False, False, False]
    ordered = rare_pr.ordered(value, estimated, outcome, 30.0)
    # below the depth; died out (the stall rule, not a small p) and not reached: no value, unordered
    assert ordered[1] == -np.inf and np.isnan(ordered[2]) and np.isnan(ordered[3])
    assert rare_pr.spread(log10_p, outcome)[0] == pytest.approx(np.std([-3.0, -5.0], ddof=1))


def test_rare_pr_figures_against_a_hand_count():
    # Six clean-correct images and one misclassified, one radius, one run each.
    log10_p = np.array([-1.0, -3.0, -6.0, -12.0, -25.0, -50.0, 0.0])[:, None, None]
    outcome = np.array([R, R, R, R, R, C, R])[:, None, None]
    shared = common.SharedSettings(bootstrap_resamples=200)
    own = rare_pr.RarePRSettings(epsilons=(0.1,), repetitions=1)
    view = common.View(shared, common.ThreatModelSettings(), own, "rare_pr", {})
    per_image = {"rare_pr": {"log10_p": log10_p, "outcome": outcome, "levels": np.full((7, 1, 1), 3)}}
    per_image["rare_pr"] = rare_pr.combine(per_image, view)
    per_image["clean"] = {"correct": np.array([True] * 6 + [False])}
    fig = rare_pr.figures(per_image, view)["rare_pr"]["by_radius"]["0.1"]
    # The clean-correct images, in order: -50 (censored: below 1e-30), -25, -12, -6, -3, -1.
    assert fig["median_log10_p"]["value"] == pytest.approx((-12.0 + -6.0) / 2)
    assert fig["median_log10_p"]["n"] == 6
    lo, hi = fig["median_log10_p"]["interval"]
    assert lo is None or lo <= -9.0 <= hi
    below = {k: v["value"] for k, v in fig["below"].items()}
    assert below == {"1e-2": 5 / 6, "1e-5": 4 / 6, "1e-10": 3 / 6, "1e-20": 2 / 6}
    assert fig["outcomes"] == {"reached": 5, "died_out": 0, "censored": 1, "not_reached": 0}


def test_paired_median_difference_counts_apart_what_only_a_sign_is_known_of():
    # Images: three with both estimates (differences -1, -1, -2), one where only a is below the
    # depth (a lower), one where only b is, one where both are, one where a has no value, and one
    # outside the mask.
    a = np.array([-3.0, -5.0, -9.0, -np.inf, -4.0, -np.inf, np.nan, -1.0])
    b = np.array([-2.0, -4.0, -7.0, -6.0, -np.inf, -np.inf, -3.0, -9.0])
    mask = np.array([1, 1, 1, 1, 1, 1, 1, 0], bool)
    fig = rare_pr.paired_median_difference(a, b, mask, common.SharedSettings(bootstrap_resamples=200))
    assert fig["value"] == pytest.approx(-1.0) and fig["n"] == 3
    assert (fig["a_lower"], fig["b_lower"], fig["both_below"], fig["no_value"]) == (1, 1, 1, 1)
    lo, hi = fig["interval"]
    assert -2.0 <= lo <= -1.0 <= hi <= -1.0


@pytest.mark.slow
def test_rare_pr_evaluates_beside_pr_on_a_tiny_model():
    # A linear model on 4 x 4 x 3 images, two radii, small AMLS: every clean-correct image gets
    # a value or a censored one, and the larger radius has the larger median.
    model_fns, state, split = tiny_setup(num_images=6)
    cfg = eval_config(
        rare_pr={"epsilons": (0.02, 0.1), "particles": 64, "mh_steps": 4, "depth": 12.0, "decades": (2, 5),
                 "max_levels": 40, "repetitions": 2, "chunk_size": 2, "initial_width": 0.3},
        pr={"distributions": ("uniform",), "epsilons": (0.02, 0.1), "samples": 50},
    )  # fmt: skip
    results = evaluate(cfg, model_fns, state, split, evaluators="clean,pr,rare_pr")
    figures = results["figures"]["rare_pr"]["by_radius"]
    assert set(figures) == {"0.02", "0.1"}
    assert results["settings"]["rare_pr"]["particles"] == 64
    small, large = (figures[k]["median_log10_p"] for k in ("0.02", "0.1"))
    assert small["n"] == large["n"] == int(np.sum(results["figures"]["clean_accuracy"]["value"] * 6))
    assert large["value"] is not None and (small["value"] is None or small["value"] <= large["value"])
    assert sum(figures["0.1"]["outcomes"].values()) >= large["n"]


@pytest.mark.slow
def test_rare_pr_estimates_do_not_depend_on_the_chunk_or_the_batch():
    # Each run draws from its image's index, radius and repetition: the images run one at a time,
    # three at a time, or in another batch give the same estimates.
    import jax

    from patjax.evaluators import streams

    model_fns, state, split = tiny_setup(num_images=3)
    logits_fn = model_fns.attack_logits_fn(state.params, state.batch_stats)
    x = split.images.astype(np.float32) / 255
    key, indices = streams.attack_key(0, "rare_pr"), np.arange(3, dtype=np.int32)
    fields = dict(epsilons=(0.05, 0.1), particles=32, mh_steps=2, depth=8.0, decades=(2,), max_levels=20)
    one, three = (
        jax.jit(
            lambda x, y, i, c=c: rare_pr.estimate_batch(
                logits_fn, key, x, y, i, rare_pr.RarePRSettings(**fields, chunk_size=c)
            )
        )
        for c in (1, 3)
    )
    a, b = one(x, split.labels, indices), three(x, split.labels, indices)
    last = one(x[2:], split.labels[2:], indices[2:])
    for k in a:
        np.testing.assert_allclose(np.asarray(a[k]), np.asarray(b[k]), rtol=1e-5)
        np.testing.assert_allclose(np.asarray(a[k])[2:], np.asarray(last[k]), rtol=1e-5)
