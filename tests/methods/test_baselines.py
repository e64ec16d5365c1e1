"""The baseline methods: losses against numpy transcriptions of the reference formulas, their
gradients against finite differences, BatchNorm statistics against the closed-form momentum
chain, the COR variants at beta = 0, and two training steps of every method."""

import copy
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tensorflow_datasets as tfds
from conftest import train_run
from helpers import Linear, np_cross_entropy, np_softmax, tiny_config

from patjax import methods
from patjax.attacks import inner, pgd
from patjax.core.errors import UserError
from patjax.data import cifar
from patjax.methods import atpr
from patjax.models import networks
from patjax.models.networks import SmallCNN
from patjax.run import config as config_lib
from patjax.run.config import default_config, train_settings

K = 4


def baseline_config(**overrides):
    cfg = default_config()
    cfg.attack.steps = 3
    cfg.atpr.num_candidates = 3
    cfg.atpr.steps_above = 2
    cfg.atpr.refine_max_iters = 4
    for key, value in overrides.items():
        section, field = key.split(".")
        cfg[section][field] = value
    return cfg


def linear_setup(batch=6):
    model = Linear(K)
    x = jax.random.uniform(jax.random.PRNGKey(0), (batch, 3, 3, 2))
    y = jnp.arange(batch) % K
    params = model.init(jax.random.PRNGKey(1), x)["params"]
    params = jax.tree.map(lambda p: 4.0 * p, params)  # spread the per-example losses
    return model, x, y, params


def method_loss(name, cfg):
    """The loss the train step differentiates for method `name` with cfg's settings."""
    cfg = copy.deepcopy(cfg)
    cfg.method = name
    return methods.make_method(config_lib.method_settings(cfg))


def adversarial_batch(name, logits_fn, x, y, key, cfg):
    """The batch each method trains on, from the attacks module (the method must use it)."""
    eps, steps = cfg.attack.epsilon, cfg.attack.steps
    if name in ("pgd", "pgd_cor", "alp", "clp"):
        return pgd.pgd(logits_fn, key, x, y, eps=eps, step_size=cfg.attack.step_size, steps=steps)
    if name in ("fgsm", "fgsm_cor"):
        if cfg.fgsm.random_start:
            return pgd.fgsm_random_point(logits_fn, key, x, y, eps)
        return pgd.fgsm(logits_fn, x, y, eps)
    if name == "trades":
        return inner.trades_kl_attack(logits_fn, key, x, eps=eps, step_size=cfg.trades.step_size, steps=steps)
    if name == "mart":
        return inner.mart_attack(logits_fn, key, x, y, eps=eps, step_size=cfg.mart.step_size, steps=steps)
    if name == "atpr":
        return atpr.atpr_search(logits_fn, key, x, y, config_lib.block_settings(cfg)["atpr"]).x_adv
    if name == "gaussian":  # locuslab/smoothing train.py: inputs + randn_like(inputs) * noise_sd, unclipped
        return x + cfg.gaussian.sigma * jax.random.normal(key, x.shape)
    return x  # clean


# Numpy transcriptions of the reference losses (float64), from logits of the clean and the
# adversarial batch.
def np_kl(p, q_logits_or_probs, eps_in_log=0.0):
    return np.sum(p * (np.log(p) - np.log(q_logits_or_probs + eps_in_log)), axis=1)


def np_loss(name, z_clean, z_adv, y, cfg):
    ce_adv = np_cross_entropy(z_adv, y).mean()
    if name in ("clean",):
        return np_cross_entropy(z_clean, y).mean()
    if name in ("fgsm", "pgd", "atpr", "gaussian"):
        return ce_adv
    if name in ("pgd_cor", "fgsm_cor"):
        losses = np_cross_entropy(z_adv, y)
        w = np.exp(-cfg.pat.beta * losses) / np.exp(-cfg.pat.beta * losses).sum()
        return np.sum(w * losses)
    pairing = np.mean(np.sqrt(np.sum((z_adv - z_clean) ** 2, axis=1)))
    if name == "alp":  # AT-PR ALP: robust_loss + 0.01 * logit_pairing_loss
        return ce_adv + cfg.alp.weight * pairing
    if name == "clp":  # AT-PR CLP: clean_loss + 0.3 * logit_pairing_loss
        return np_cross_entropy(z_clean, y).mean() + cfg.clp.weight * pairing
    if name == "trades":  # loss_natural + beta * KLDivLoss(log_softmax(adv), softmax(clean)) / B
        return np_cross_entropy(z_clean, y).mean() + cfg.trades.beta * np.mean(
            np_kl(np_softmax(z_clean), np_softmax(z_adv))
        )
    if name == "mart":  # YisenWang/MART mart.py, line by line
        adv_probs = np_softmax(z_adv)
        tmp1 = np.argsort(adv_probs, axis=1)[:, -2:]
        new_y = np.where(tmp1[:, -1] == y, tmp1[:, -2], tmp1[:, -1])
        loss_adv = ce_adv + np.mean(-np.log(1.0001 - adv_probs[np.arange(len(y)), new_y] + 1e-12))
        nat_probs = np_softmax(z_clean)
        true_probs = nat_probs[np.arange(len(y)), y]
        loss_robust = np.mean(np_kl(nat_probs, adv_probs, 1e-12) * (1.0000001 - true_probs))
        beta = cfg.mart.beta if cfg.mart.beta >= 0 else (5.0 if cfg.model == "resnet18" else 6.0)
        return loss_adv + beta * loss_robust
    raise KeyError(name)


FORMULA_CASES = [
    ("clean", {}),
    ("fgsm", {}),
    ("fgsm", {"fgsm.random_start": True}),
    ("pgd", {}),
    ("alp", {}),
    ("clp", {}),
    ("trades", {}),
    ("mart", {}),
    ("mart", {"mart.beta": 2.5}),
    ("atpr", {}),
    ("pgd_cor", {"pat.beta": 0.5}),
    ("fgsm_cor", {"pat.beta": 0.5}),
    ("gaussian", {}),
    ("gaussian", {"gaussian.sigma": 1.0}),
]


@pytest.mark.parametrize(
    "name,overrides", FORMULA_CASES, ids=[f"{n}-{'-'.join(o) or 'default'}" for n, o in FORMULA_CASES]
)
def test_loss_equals_the_reference_formula_on_the_attacks_batch(name, overrides):
    model, x, y, params = linear_setup()
    cfg = baseline_config(**overrides)
    key = jax.random.PRNGKey(7)
    loss, (_, metrics) = jax.jit(lambda p: method_loss(name, cfg)(p, networks.ModelFns(model.apply), {}, x, y, key))(
        params
    )
    logits_fn = lambda z: model.apply({"params": params}, z)
    x_adv = jax.jit(lambda: adversarial_batch(name, logits_fn, x, y, key, cfg))()
    z_clean = np.asarray(logits_fn(x), np.float64)
    z_adv = np.asarray(logits_fn(x_adv), np.float64)
    expected = np_loss(name, z_clean, z_adv, np.asarray(y), cfg)
    np.testing.assert_allclose(loss, expected, rtol=2e-5)
    np.testing.assert_allclose(metrics["adv_accuracy"], np.mean(np.argmax(z_adv, 1) == np.asarray(y)))
    if name not in ("pgd_cor", "fgsm_cor"):
        np.testing.assert_allclose(metrics["snis_weight_max"], 1 / len(y), rtol=1e-6)
    if name != "clean":
        assert np.abs(np.asarray(x_adv) - np.asarray(x)).max() > 0.5 * cfg.attack.epsilon


def test_mart_beta_defaults_to_five_for_resnet18_and_six_otherwise():
    mart_beta = lambda cfg: config_lib.block_settings(cfg)["mart"].beta
    assert mart_beta(baseline_config()) == 5.0  # default_config's model is resnet18
    cfg = baseline_config()
    cfg.model = "wrn50_2"
    assert mart_beta(cfg) == 6.0
    assert mart_beta(baseline_config(**{"mart.beta": 0.0})) == 0.0


@pytest.mark.parametrize("name", ["trades", "mart", "alp", "clp"])
def test_gradient_equals_finite_differences_of_the_formula_at_the_fixed_adversarial_batch(name):
    """Checks what is detached: TRADES's clean softmax and MART's (1 - p_y) weight are not."""
    model, x, y, params = linear_setup()
    cfg = baseline_config()
    key = jax.random.PRNGKey(3)
    grad = jax.jit(jax.grad(lambda p: method_loss(name, cfg)(p, networks.ModelFns(model.apply), {}, x, y, key)[0]))(
        params
    )
    x_adv = jax.jit(lambda: adversarial_batch(name, lambda z: model.apply({"params": params}, z), x, y, key, cfg))()
    W = np.asarray(params["Dense_0"]["kernel"], np.float64)
    b = np.asarray(params["Dense_0"]["bias"], np.float64)
    flat = lambda z: np.asarray(z, np.float64).reshape(len(y), -1)
    loss_at = lambda bias: np_loss(name, flat(x) @ W + bias, flat(x_adv) @ W + bias, np.asarray(y), cfg)
    h = 1e-6
    fd = np.array([(loss_at(b + h * e) - loss_at(b - h * e)) / (2 * h) for e in np.eye(K)])
    np.testing.assert_allclose(grad["Dense_0"]["bias"], fd, rtol=1e-3, atol=1e-5)


def cnn_setup():
    model = SmallCNN(num_classes=3, mean=(0.5,) * 3, std=(0.25,) * 3, widths=(4,))
    x = jax.random.uniform(jax.random.PRNGKey(0), (8, 8, 8, 3))
    y = jnp.arange(8) % 3
    variables = model.init(jax.random.PRNGKey(1), x)
    return model, x, y, variables["params"], variables["batch_stats"]


@pytest.mark.parametrize(
    "name,passes,attack_mode",
    [
        ("trades", "xax", "inference"),  # trades.py: model(x), model(x_adv), model(x) in train()
        ("mart", "xa", "inference"),  # mart.py: model(x), model(x_adv)
        ("alp", "aax", "train"),  # AT-PR ALP: model(x_pgd), model(x_pgd), model(x)
        ("clp", "xax", "train"),  # AT-PR CLP: model(x), model(x_pgd), model(x)
    ],
)
@pytest.mark.slow
def test_running_statistics_follow_the_references_passes(name, passes, attack_mode):
    """r_n = m^n r_0 + sum_i m^(n-i) (1 - m) s_i over the passes' batch statistics s_i."""
    model, x, y, params, stats = cnn_setup()
    fns = networks.ModelFns(model.apply)
    cfg = baseline_config()
    key = jax.random.PRNGKey(2)
    _, (new_stats, _) = jax.jit(lambda p, s: method_loss(name, cfg)(p, fns, s, x, y, key))(params, stats)
    x_adv = jax.jit(lambda p, s: adversarial_batch(name, fns.attack_logits_fn(p, s, attack_mode), x, y, key, cfg))(
        params, stats
    )
    zeros = jax.tree.map(jnp.zeros_like, stats)
    m = 0.9  # Flax momentum (kept fraction) = 1 - PyTorch's 0.1

    def batch_statistics(inputs):  # one pass from zero running statistics gives (1 - m) s
        _, upd = model.apply({"params": params, "batch_stats": zeros}, inputs, train=True, mutable=["batch_stats"])
        return jax.tree.map(lambda v: np.asarray(v, np.float64) / (1 - m), upd["batch_stats"])

    s = {"x": batch_statistics(x), "a": batch_statistics(x_adv)}
    n = len(passes)
    expected = jax.tree.map(lambda r: m**n * np.asarray(r, np.float64), stats)
    for i, p in enumerate(passes, start=1):
        expected = jax.tree.map(lambda e, si: e + m ** (n - i) * (1 - m) * si, expected, s[p])
    jax.tree.map(lambda a, e: np.testing.assert_allclose(a, e, rtol=1e-4, atol=1e-6), new_stats, expected)


@pytest.mark.slow
@pytest.mark.parametrize("cor,plain", [("pgd_cor", "pgd"), ("fgsm_cor", "fgsm")])
def test_cor_with_beta_zero_equals_the_plain_method(cor, plain):
    model, x, y, params, stats = cnn_setup()
    fns = networks.ModelFns(model.apply)
    cfg = baseline_config(**{"pat.beta": 0.0})
    key = jax.random.PRNGKey(4)
    run = lambda name: jax.jit(
        jax.value_and_grad(lambda p: method_loss(name, cfg)(p, fns, stats, x, y, key), has_aux=True)
    )(params)
    (loss_cor, (stats_cor, _)), grad_cor = run(cor)
    (loss_plain, (stats_plain, _)), grad_plain = run(plain)
    np.testing.assert_allclose(loss_cor, loss_plain, rtol=1e-6)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), grad_cor, grad_plain)
    jax.tree.map(np.testing.assert_allclose, stats_cor, stats_plain)
    # and beta > 0 changes the loss: the comparison is not vacuous
    cfg.pat.beta = 5.0
    weighted = jax.jit(lambda p: method_loss(cor, cfg)(p, fns, stats, x, y, key)[0])(params)
    assert abs(float(weighted) - float(loss_plain)) > 1e-4


def test_the_registry_holds_the_twelve_methods_of_tables_1_and_2_in_the_papers_order_then_the_others():
    assert set(methods.METHOD_ORDER) <= set(methods.REGISTRY)
    assert methods.METHOD_ORDER[12:] == ("gaussian",)  # outside the paper, after its rows
    assert set(methods.METHOD_ORDER[:12]) == {
        "clean",
        "fgsm",
        "pgd",
        "alp",
        "clp",
        "trades",
        "mart",
        "atpr",
        "pat",
        "pat_wos",
        "pgd_cor",
        "fgsm_cor",
    }
    assert set(methods.LANGEVIN_METHODS) == {"pat", "pat_wos"}
    with_attack = set(methods.METHOD_ORDER) - {"clean", "pat", "pat_wos", "gaussian"}
    assert set(methods.REFERENCE_ATTACK_BN_MODE) & set(methods.METHOD_ORDER) == with_attack
    assert set(methods.REFERENCE_ATTACK_BN_MODE) <= set(methods.REGISTRY)


@pytest.mark.parametrize(
    "field,value",
    [
        ("attack.bn_mode", "eval"),
        ("attack.steps", -1),
        ("atpr.num_candidates", 0),
        ("atpr.refine_stop_fraction", 1.5),
        ("gaussian.sigma", 0.0),
    ],
)
def test_invalid_baseline_settings_are_refused(field, value):
    cfg = baseline_config(**{field: value})
    with pytest.raises(UserError, match=field.split(".")[1]):
        train_settings(cfg)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(set(methods.REGISTRY) - {"pat"}))  # pat: tests/run/test_train.py
def test_every_method_trains_two_steps_on_mock_data(tmp_path, name):
    cfg = tiny_config(
        method=name,
        num_train_steps=2,
        data_dir=cifar.TFDS,
        **{"attack.steps": 2, "atpr.num_candidates": 2, "atpr.steps_above": 1, "atpr.refine_max_iters": 2},
    )
    with tfds.testing.mock_data(num_examples=16):
        state = train_run(cfg, str(tmp_path / name))
    assert int(state.step) == 2
    lines = open(tmp_path / name / "metrics.jsonl").read().splitlines()
    import json

    last = json.loads(lines[-1])
    for key in ("loss", "adv_accuracy", "snis_weight_mean", "snis_weight_max", "grad_norm"):
        assert np.isfinite(last[key]), key


@pytest.mark.parametrize("name", ["pgd", "pgd_cor", "alp", "clp"])
def test_under_an_l2_threat_model_the_pgd_baselines_attack_in_the_l2_ball_as_the_closed_form_says(name):
    """Two classes, a linear model, pixels in [0.25, 0.75]: the loss gradient points along
    w_other - w_y everywhere, so PGD-L2 ends at x + eps d, d that unit direction (20 steps of eps/4
    shrink the random start's part across d below 1 %); the training loss is CE there, by hand."""
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.uniform(0.25, 0.75, (6, 3, 3, 2)), jnp.float32)
    model = Linear(2)
    params = model.init(jax.random.PRNGKey(1), x)["params"]
    logits = np.asarray(model.apply({"params": params}, x))
    y = jnp.asarray(logits.argmax(1))
    eps = 0.2
    cfg = baseline_config(
        **{"attack.norm": "l2", "attack.epsilon": eps, "attack.step_size": eps / 4, "attack.steps": 20}
    )
    loss, (_, metrics) = method_loss(name, cfg)(params, networks.ModelFns(model.apply), {}, x, y, jax.random.PRNGKey(2))
    w = np.asarray(params["Dense_0"]["kernel"], np.float64)
    b = np.asarray(params["Dense_0"]["bias"], np.float64)
    yn = np.asarray(y)
    direction = (w[:, 1 - yn] - w[:, yn]).T
    direction /= np.linalg.norm(direction, axis=1, keepdims=True)
    x_adv = np.asarray(x, np.float64).reshape(6, -1) + eps * direction
    ce = np_cross_entropy(x_adv @ w + b, yn)
    if name == "pgd":
        np.testing.assert_allclose(float(loss), ce.mean(), rtol=2e-3)
    assert float(metrics["adv_accuracy"]) == np.mean((x_adv @ w + b).argmax(1) == yn)


def test_under_an_l2_threat_model_mart_ascends_the_ce_to_the_l2_sphere_as_the_closed_form_says():
    """MART's L2 form (trades.py's distance='l_2' loop on the CE): for two classes and a linear
    model the CE gradient points along d = (w_other - w_y) / |w_other - w_y| everywhere, so 10 steps
    of 2 eps / 10 end on the sphere at x + eps d, up to the 0.001 N(0, 1) start's part across d,
    which moves no logit and takes under 0.1 % of the radius (pixels in [0.25, 0.75]: no clamp).
    The boosted CE at that point by hand; mart.step_size, the L-inf step, is not read."""
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.uniform(0.25, 0.75, (6, 3, 3, 2)), jnp.float32)
    model = Linear(2)
    params = model.init(jax.random.PRNGKey(1), x)["params"]
    y = jnp.asarray(np.asarray(model.apply({"params": params}, x)).argmax(1))
    eps = 0.2
    cfg = baseline_config(**{"attack.norm": "l2", "attack.epsilon": eps, "attack.steps": 10, "mart.step_size": 0.0})
    _, (_, metrics) = method_loss("mart", cfg)(params, networks.ModelFns(model.apply), {}, x, y, jax.random.PRNGKey(2))
    w = np.asarray(params["Dense_0"]["kernel"], np.float64)
    b = np.asarray(params["Dense_0"]["bias"], np.float64)
    yn = np.asarray(y)
    direction = (w[:, 1 - yn] - w[:, yn]).T
    direction /= np.linalg.norm(direction, axis=1, keepdims=True)
    logits = (np.asarray(x, np.float64).reshape(6, -1) + eps * direction) @ w + b
    probs = np_softmax(logits)
    boosted = np_cross_entropy(logits, yn).mean() + np.mean(-np.log(1.0001 - probs[np.arange(6), 1 - yn] + 1e-12))
    np.testing.assert_allclose(float(metrics["boosted_ce"]), boosted, rtol=1e-3)
    assert float(metrics["adv_accuracy"]) == np.mean(logits.argmax(1) == yn)


@pytest.mark.parametrize("name", ["fgsm", "fgsm_cor", "atpr"])
def test_methods_whose_inner_attack_has_no_l2_form_refuse_an_l2_threat_model(name):
    cfg = baseline_config(**{"attack.norm": "l2"})
    cfg.method = name
    with pytest.raises(UserError) as error:
        train_settings(cfg)
    assert str(error.value) == (
        f"{name}'s inner attack has no l2 form (attack.norm='l2'); under l2 train pgd, pgd_cor, alp, clp, trades, mart"
    )


@pytest.mark.slow
def test_a_pgd_l2_run_trains(tmp_path, fake_data_dir):
    overrides = {"attack.norm": "l2", "attack.epsilon": 0.5, "attack.step_size": 0.125, "attack.steps": 2}
    cfg = tiny_config(method="pgd", num_train_steps=2, data_dir=fake_data_dir, **overrides)
    state = train_run(cfg, str(tmp_path / "pgd_l2"))
    assert int(state.step) == 2
    saved = json.load(open(tmp_path / "pgd_l2" / "config.json"))
    assert saved["attack"]["norm"] == "l2" and saved["attack"]["epsilon"] == 0.5
