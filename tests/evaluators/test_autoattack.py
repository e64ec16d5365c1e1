"""The aa evaluator (standard AutoAttack): on a linear model the exact L-inf robustness within
[0, 1]^d is a closed form, and the exact L2 one a small convex problem, which AutoAttack must
reach; each attack runs only on the images the ones before it left robust; the masking checks are
reported."""

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import Linear, eval_config, evaluate, tiny_setup
from scipy import stats

from patjax.attacks import apgd, fab
from patjax.data import cifar
from patjax.evaluators import autoattack, batches
from patjax.models.networks import ModelFns
from patjax.reporting import report
from patjax.run import config as config_lib

EPS = 0.03


def worst_case_margin(W, b, x, y, eps):
    """min over j != y and z in the eps-ball ∩ [0,1]^d of (w_y - w_j).z + b_y - b_j: separable, so
    each coordinate sits at the end of its interval that the sign of its coefficient picks."""
    lo, hi = np.maximum(x - eps, 0.0), np.minimum(x + eps, 1.0)
    margins = [
        (W[:, y] - W[:, j]) @ np.where(W[:, y] - W[:, j] > 0, lo, hi) + b[y] - b[j] for j in range(W.shape[1]) if j != y
    ]
    return min(margins)


@pytest.fixture(scope="module")
def evaluated():
    model_fns, state, split = tiny_setup(scale=0.3, num_images=40)
    cfg = eval_config(attack={"eps": EPS}, apgd={"steps": 20}, aa={"fab_steps": 20, "square_queries": 300})
    per_image = {}
    results = evaluate(
        cfg, model_fns, state, split, batch_size=8, progress=False, evaluators="aa", per_image_out=per_image
    )
    return state, split, results, per_image


@pytest.mark.slow
def test_autoattack_reaches_the_exact_robustness_of_a_linear_model(evaluated):
    state, split, results, per_image = evaluated
    W = np.asarray(state.params["Dense_0"]["kernel"], np.float64)
    b = np.asarray(state.params["Dense_0"]["bias"], np.float64)
    x = np.asarray(cifar.to_float(split.images), np.float64).reshape(len(split), -1)
    truth = np.array([worst_case_margin(W, b, x[i], split.labels[i], EPS) > 0 for i in range(len(split))])
    assert 0 < truth.sum() < len(split)
    np.testing.assert_array_equal(per_image["aa.robust"], truth)
    fig = results["figures"]["aa"]
    assert fig["value"] == pytest.approx(truth.mean())
    assert fig["interval"][0] <= fig["value"] <= fig["interval"][1]
    assert results["figures"]["worst_case"]["attacks"] == ["aa"]
    # APGD-CE alone misses images the targeted attacks find: the sequence is needed.
    assert fig["broken_by"]["apgd_t"] + fig["broken_by"]["fab_t"] + fig["broken_by"]["square"] > 0


def test_each_attack_runs_only_on_the_images_left_robust(evaluated):
    _, split, results, per_image = evaluated
    clean = np.asarray(per_image["aa_apgd_ce.clean_correct"])
    robust = clean & per_image["aa_apgd_ce.robust"]
    for stage, k in (("apgd_t", 2), ("fab_t", 3), ("square", 4)):
        np.testing.assert_array_equal(per_image[f"aa_{stage}.attacked"], robust)
        after = robust & per_image[f"aa_{stage}.robust"]
        np.testing.assert_array_equal(per_image["aa.broken_by"] == k, robust & ~after)
        robust = after
    np.testing.assert_array_equal(per_image["aa.broken_by"] == 0, ~clean)
    np.testing.assert_array_equal(per_image["aa.broken_by"] == -1, per_image["aa.robust"])
    counts = results["figures"]["aa"]["broken_by"]
    assert sum(counts.values()) == len(split)
    after = results["figures"]["aa"]["after"]
    values = [after[s]["value"] for s in ("apgd_ce", "apgd_t", "fab_t", "square")]
    assert values == sorted(values, reverse=True) and values[-1] == results["figures"]["aa"]["value"]


def test_masking_checks_are_reported(evaluated):
    _, _, results, per_image = evaluated
    masking = results["figures"]["aa"]["masking"]
    np.testing.assert_array_equal(per_image["aa_square_alone.attacked"], per_image["aa_apgd_ce.clean_correct"])
    by_eps = masking["apgd_ce_by_eps"]
    assert list(by_eps) == [f"{EPS * f:.6g}" for f in (1, 2, 4, 8, 16)]
    assert by_eps[f"{EPS * 16:.6g}"]["value"] == 0.0  # a linear model has no masked gradient
    assert masking["masking_signs"] == []
    assert results["figures"]["aa"]["settings"]["square_queries"] == 300


@pytest.mark.parametrize("wins, losses", [(0, 0), (0, 5), (1, 0), (3, 1), (10, 2), (20, 15), (7, 7), (40, 3)])
def test_the_masking_sign_test_is_the_exact_one_sided_binomial_test(wins, losses):
    expected = stats.binomtest(wins, wins + losses, 0.5, "greater").pvalue if wins + losses else 1.0
    assert autoattack.sign_test_p_value(wins, losses) == pytest.approx(expected, rel=1e-12)


@pytest.mark.slow
@pytest.mark.long
def test_figures_do_not_depend_on_the_batch(evaluated):
    """Each pass packs the images it attacks into the batch widths of its batch size
    (batches.batch_widths): a batch size of 40 gives every image the same outcome as one of 8."""
    model_fns, state, split = tiny_setup(scale=0.3, num_images=40)
    cfg = eval_config(attack={"eps": EPS}, apgd={"steps": 20}, aa={"fab_steps": 20, "square_queries": 300})
    per_image = {}
    evaluate(cfg, model_fns, state, split, batch_size=40, progress=False, evaluators="aa", per_image_out=per_image)
    _, _, _, reference = evaluated
    assert set(per_image) == set(reference)
    for key in per_image:
        if key.endswith(("robust", "correct", "attacked", "broken_by", "queries")):
            np.testing.assert_array_equal(per_image[key], reference[key], err_msg=key)
        else:
            np.testing.assert_allclose(per_image[key], reference[key], rtol=1e-5, err_msg=key)


def test_an_aa_evaluation_prints_its_clean_accuracy_and_every_interval(evaluated):
    state, split, results, _ = evaluated
    W = np.asarray(state.params["Dense_0"]["kernel"], np.float64)
    b = np.asarray(state.params["Dense_0"]["bias"], np.float64)
    x = np.asarray(cifar.to_float(split.images), np.float64).reshape(len(split), -1)
    correct = (x @ W + b).argmax(1) == split.labels
    ci = stats.binomtest(int(correct.sum()), len(split)).proportion_ci(0.95, method="exact")
    fig = results["figures"]["aa"]["clean_accuracy"]
    assert fig["value"] == pytest.approx(correct.mean()) and fig["n"] == len(split)
    np.testing.assert_allclose(fig["interval"], [ci.low, ci.high], rtol=1e-9)
    line = next(x for x in report.comparison(["run"], [results]).splitlines() if "AutoAttack on" in x)
    assert f"AutoAttack on 40 images [95 % Clopper-Pearson intervals]: clean % {100 * correct.mean():.2f} " in line
    assert f"[{100 * ci.low:.2f}, {100 * ci.high:.2f}]" in line
    square = results["figures"]["aa"]["after"]["square"]
    assert f"square {report.pct(square, 2)}" in line and "[" in report.pct(square, 2)


def l2_distance_to_class(c, m, lo, hi):
    """min |d|_2 over d in [lo, hi] (the box around x) with c.d <= -m, m > 0 the margin against one
    class: KKT, d_i = clip(-lambda c_i, lo_i, hi_i) with lambda >= 0 found by bisection on the
    decreasing c.d(lambda); inf where even the box's corner does not reach the plane."""
    step = lambda lam: np.clip(-lam * c, lo, hi)
    if c @ step(1e12) > -m:
        return np.inf
    low, high = 0.0, 1.0
    while c @ step(high) > -m:
        high *= 2
    for _ in range(200):
        mid = 0.5 * (low + high)
        low, high = (mid, high) if c @ step(mid) > -m else (low, mid)
    return np.linalg.norm(step(high))


@pytest.mark.slow
def test_l2_autoattack_reaches_the_exact_l2_robustness_of_a_linear_model():
    """Under eval.attack.norm=l2 an image of a linear model is robust iff, for every other class, the
    L2 distance from x to that class's half-space within [0, 1]^d (a convex problem, solved by hand
    above) exceeds eps; images within 2 % of eps are left out (FAB's backward step lands it a
    fraction of a percent above the minimum). 8 x 8 images: L2 Square's start needs 5 rows."""
    rng = np.random.default_rng(1)
    images = rng.integers(0, 256, size=(40, 8, 8, 3), dtype=np.uint8)
    model = Linear(num_classes=10)
    params = jax.tree.map(lambda p: p * 3.0, model.init(jax.random.PRNGKey(0), jnp.zeros((1, 8, 8, 3)))["params"])
    x = np.asarray(cifar.to_float(images), np.float64).reshape(40, -1)
    W, b = np.asarray(params["Dense_0"]["kernel"], np.float64), np.asarray(params["Dense_0"]["bias"], np.float64)
    labels = (x @ W + b).argmax(1).astype(np.int32)
    labels[::5] = (labels[::5] + 1) % 10  # clean errors
    distance = np.zeros(40)
    for i, y in enumerate(labels):
        z = x[i] @ W + b
        if z.argmax() != y:
            continue
        distance[i] = min(
            l2_distance_to_class(W[:, y] - W[:, j], z[y] - z[j], -x[i], 1 - x[i]) for j in range(10) if j != y
        )
    eps = float(np.median(distance[distance > 0]))
    cfg = eval_config(
        attack={"norm": "l2", "eps": eps}, apgd={"steps": 20}, aa={"fab_steps": 30, "square_queries": 300}
    )
    per_image = {}
    state = types.SimpleNamespace(params=params, batch_stats={}, step=np.int32(1))
    results = evaluate(
        cfg,
        ModelFns(model.apply),
        state,
        cifar.Split(images, labels),
        batch_size=8,
        progress=False,
        evaluators="aa",
        per_image_out=per_image,
    )
    truth = distance > eps
    clear = np.abs(distance - eps) > 0.02 * eps
    assert 5 < truth[clear].sum() < clear.sum() - 5  # both outcomes occur
    np.testing.assert_array_equal(per_image["aa.robust"][clear], truth[clear])
    fig = results["figures"]["aa"]
    assert fig["settings"]["norm"] == "l2" and fig["settings"]["eps"] == eps
    assert per_image["aa.robust"].sum() == fig["value"] * 40


def unpacked(model_fns, state, images, labels, s):
    """Per image, APGD-T, FAB-T and Square as one batch of every image, each run to its end (every
    target rank, every query; an image's outcome is the AND of its runs'), written from the
    attacks' own functions with the keys of the aa evaluator's streams (fold_in(PRNGKey(seed),
    100 + stream), then the image index, then the target rank)."""
    logits_fn = model_fns.attack_logits_fn(state.params, state.batch_stats)
    x, y = cifar.to_float(images), jnp.asarray(labels)
    own, threat = s["aa"], s["attack"]
    stream = lambda k: jax.random.fold_in(jax.random.PRNGKey(s.shared.seed), 100 + k)
    keys = lambda k: jax.vmap(lambda i: jax.random.fold_in(stream(k), i))(jnp.arange(len(labels)))
    clean = np.asarray(jnp.argmax(logits_fn(x), -1) == y)
    targets = fab.fab_target_classes(logits_fn(x), own.target_classes)  # (ranks, images)

    def apgd_t(key, xi, yi, target, rank):
        return apgd.apgd(
            logits_fn,
            jax.random.fold_in(key, rank),
            xi[None],
            yi[None],
            eps=threat.eps,
            steps=s["apgd"].steps,
            loss="dlr_targeted",
            rho=s["apgd"].rho,
            target=target[None],
            norm=threat.norm,
        ).robust[0]

    run_apgd_t = jax.jit(jax.vmap(apgd_t, (0, 0, 0, 0, None)))
    robust_t = clean.copy()
    for rank in range(own.target_classes):
        robust_t &= np.asarray(run_apgd_t(keys(1), x, y, targets[rank], rank))
    fab_out = jax.jit(
        lambda x, y: fab.fab_t(
            logits_fn, stream(2), x, y, eps=threat.eps, n_target_classes=own.target_classes, n_iter=own.fab_steps
        )
    )(x, y)

    def square(key, xi, yi):
        out = autoattack.SQUARE_BY_NORM[threat.norm](
            logits_fn, key, xi[None], yi[None], eps=threat.eps, n_queries=own.square_queries
        )
        return out.fooled[0], out.queries[0]

    square_fooled, square_queries = jax.jit(jax.vmap(square))(keys(3), x, y)
    return {
        "aa_apgd_t": {"robust": robust_t},
        "aa_fab_t": {"robust": ~np.asarray(fab_out.fooled), "norm": np.asarray(fab_out.norm)},
        "aa_square": {"robust": ~np.asarray(square_fooled), "queries": np.asarray(square_queries)},
    }


@pytest.mark.slow
def test_packing_changes_no_per_image_outcome():
    """APGD-T and FAB-T run one target rank per round and Square one span of queries, each on the
    images still robust packed into batches of 2 or 4 (`batches.pack`); every image's outcome is
    the one it has in a single batch of all images run to the end, while images leave the batch at
    different rounds (some fooled early, some late, some never)."""
    model_fns, state, split = tiny_setup(scale=0.3, num_images=40)
    cfg = eval_config(attack={"eps": EPS}, apgd={"steps": 10}, aa={"fab_steps": 10, "square_queries": 100})
    s = config_lib.evaluation_settings(cfg, evaluators="aa", batch_size=4).evaluator_settings
    expected = unpacked(model_fns, state, split.images, split.labels, s)
    clean = np.asarray(model_fns.infer(state.params, {}, cifar.to_float(split.images))).argmax(1) == split.labels
    view = s.view(autoattack.EVALUATOR)
    for pass_name, outputs in expected.items():
        rounds = autoattack.make_rounds(model_fns, view, pass_name)
        batch_fn = autoattack.make_batch_fn(model_fns, view, pass_name)
        packed, _ = batches.evaluate_pass(batch_fn, state, split, len(split), 4, pass_name, False, rounds=rounds)
        assert set(packed) == set(outputs), pass_name
        for key, value in outputs.items():
            if key == "norm":  # a float: its last bits follow the batch's width (XLA's summation order)
                np.testing.assert_allclose(packed[key], value, rtol=1e-5, atol=1e-6, err_msg=pass_name)
            else:
                np.testing.assert_array_equal(packed[key], value, err_msg=f"{pass_name}.{key}")
        assert 0 < packed["robust"].sum() < clean.sum(), pass_name
    queries = expected["aa_square"]["queries"][expected["aa_square"]["robust"] == 0]
    assert len(np.unique(queries[queries > 0])) > 3  # Square fools images after different spans
