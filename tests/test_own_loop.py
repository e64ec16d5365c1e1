"""The objectives in a user's own training loop (docs/api.md): the examples run; patjax's small CNN
in NNX and in Linen with the same weights gives the same figures; a Linen train step calling the
public PAT loss makes main.py's parameters; every public objective computes what main.py's method
does, for a Linen and for an NNX module; bad input is one line."""

import runpy

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import REPO
from flax import nnx, traverse_util
from helpers import tiny_config
from safetensors.numpy import load_file

import patjax
from patjax import methods
from patjax.core.errors import UserError
from patjax.data import cifar
from patjax.models import forwards, networks
from patjax.run import config as config_lib
from patjax.run import train as train_lib

TINY = dict(steps=2, batch_size=8, langevin_steps=2, eval_images=16, pr_samples=4, log_every=1)
WEIGHTS = REPO / "docs/results/table1_cpu/runs/cifar10_small_cnn/pgd_s0/models/step_000800.safetensors"


@pytest.fixture(scope="module")
def nnx_example():
    return runpy.run_path(str(REPO / "examples" / "nnx_pat_own_loop.py"))


@pytest.fixture(scope="module")
def linen_example():
    return runpy.run_path(str(REPO / "examples" / "linen_pat_own_loop.py"))


def linen_small_cnn(variables=None):
    module = networks.create_model("small_cnn", "cifar10", num_classes=10)
    if variables is None:
        variables = traverse_util.unflatten_dict(load_file(str(WEIGHTS)), sep="/")
    return module, variables


def nnx_twin(nnx_example, variables) -> nnx.Module:
    """The example's NNX small CNN holding the Linen small CNN's variables."""
    model = nnx_example["SmallCNN"](rngs=nnx.Rngs(0))
    p, s = variables["params"], variables["batch_stats"]
    for i in range(3):
        model.kernels[i][...] = p[f"Conv_{i}"]["kernel"]
        norm = model.norms[i]
        norm.scale[...], norm.bias[...] = p[f"BatchNorm_{i}"]["scale"], p[f"BatchNorm_{i}"]["bias"]
        norm.mean[...], norm.var[...] = s[f"BatchNorm_{i}"]["mean"], s[f"BatchNorm_{i}"]["var"]
    model.head.kernel[...], model.head.bias[...] = p["Dense_0"]["kernel"], p["Dense_0"]["bias"]
    return model


def linen_variables_of(model: nnx.Module) -> dict:
    """The NNX twin's variables under the Linen small CNN's names."""
    params = {f"Conv_{i}": {"kernel": model.kernels[i][...]} for i in range(3)}
    params.update({f"BatchNorm_{i}": {"scale": n.scale[...], "bias": n.bias[...]} for i, n in enumerate(model.norms)})
    params["Dense_0"] = {"kernel": model.head.kernel[...], "bias": model.head.bias[...]}
    stats = {f"BatchNorm_{i}": {"mean": n.mean[...], "var": n.var[...]} for i, n in enumerate(model.norms)}
    return {"params": params, "batch_stats": stats}


@pytest.mark.slow
def test_the_nnx_example_runs_tiny_and_prints_the_table(nnx_example, data_dir, capsys):
    results = nnx_example["main"](**TINY)
    out = capsys.readouterr().out
    assert "step 2: PAT loss" in out and "nnx own loop" in out and "PGD (L∞, ε = 8/255)" in out
    assert set(results["figures"]) >= {"clean_accuracy", "pgd20"} and results["pr"]


@pytest.mark.slow
def test_the_linen_example_runs_tiny_and_prints_the_table(linen_example, data_dir, capsys):
    results = linen_example["main"](**TINY)
    out = capsys.readouterr().out
    assert "step 2: PAT loss" in out and "linen own loop" in out and "PGD (L∞, ε = 8/255)" in out
    assert set(results["figures"]) >= {"clean_accuracy", "pgd20"} and results["pr"]


@pytest.mark.slow
def test_nnx_and_linen_small_cnn_with_the_same_weights_give_identical_figures(nnx_example, data_dir):
    module, variables = linen_small_cnn()
    model = nnx_twin(nnx_example, variables)
    model.train()  # the user's module in training mode: evaluate reads it as model.eval() sets it
    before = jax.tree.map(np.asarray, nnx.state(model))
    split = cifar.load_split("cifar10", "test", data_dir)
    images, labels = split.images[:8], split.labels[:8]
    kwargs = dict(evaluators="clean,pgd20,pr", pr={"samples": 4, "distributions": ["uniform"]}, batch_size=8)
    from_nnx = patjax.evaluate_model(model, images, labels, **kwargs)
    from_linen = patjax.evaluate_model((module, variables), images, labels, **kwargs)
    assert from_nnx["figures"] == from_linen["figures"] and from_nnx["pr"] == from_linen["pr"]
    for name, array in from_linen["per_image"].items():
        np.testing.assert_array_equal(from_nnx["per_image"][name], array, err_msg=name)
    # The user's module is unchanged: still in training mode, the same statistics.
    assert all(not n.use_running_average for n in model.norms)
    jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.asarray, nnx.state(model)), before)


def main_py_step(method="pat", **overrides):
    """main.py's compiled step (`train.create_step`) for a tiny run on 64 random images, its
    initial state and the inputs one step reads."""
    cfg = tiny_config(method=method, **overrides)
    settings = config_lib.train_settings(cfg)
    model_fns, state, step_fn = train_lib.create_step(settings, steps_per_epoch=8, mesh=_single_device_mesh())
    rng = np.random.default_rng(0)
    # 16 x 16 images: the small CNN and the augmentation take any size, and compile faster.
    images = jnp.asarray(rng.integers(0, 256, (64, 16, 16, 3), dtype=np.uint8))
    labels = jnp.asarray(rng.integers(0, 10, 64, dtype=np.int32))
    return settings, state, step_fn, images, labels


def _single_device_mesh():
    from patjax.core import sharding

    return sharding.make_mesh(1)


def own_step_inputs(state, images, labels, batch_size, step):
    """The batch and method key main.py's step derives at `step` (`train.train_step`)."""
    permutation = cifar.epoch_permutation(jax.random.fold_in(state.rng, 0), 0, images.shape[0])
    indices = permutation[step * batch_size : (step + 1) * batch_size]
    augment_key, method_key = jax.random.split(jax.random.fold_in(jax.random.fold_in(state.rng, 1), step))
    return cifar.augment(augment_key, images[indices]), labels[indices], method_key, permutation


@pytest.mark.slow
def test_a_linen_own_loop_with_the_public_pat_loss_trains_to_main_py_s_parameters(linen_example):
    settings, state, step_fn, images, labels = main_py_step()
    module = settings.model.build()
    tx = train_lib.optimizer_lib.make_optimizer(settings.optimizer, settings.optimizer.schedule(8))
    own_step = linen_example["make_train_step"](
        module, tx, settings.method.sampler.langevin_settings(), settings.method.snis.beta
    )
    params, batch_stats, opt_state = state.params, state.batch_stats, state.opt_state
    for step in range(2):
        x, y, key, permutation = own_step_inputs(state, images, labels, settings.batch_size, step)
        params, batch_stats, opt_state, metrics = own_step(params, batch_stats, opt_state, x, y, key)
        state, main_metrics = step_fn(state, images, labels, permutation)
        assert float(metrics["loss"]) == float(main_metrics["loss"])
    # Bitwise: the same functions in the same order, compiled in another jit.
    jax.tree.map(np.testing.assert_array_equal, (params, batch_stats), (state.params, state.batch_stats))


def method_settings(name):
    overrides = {"attack.steps": 1, "langevin.steps": 1, "atpr.num_candidates": 2, "atpr.refine_max_iters": 1}
    return config_lib.train_settings(tiny_config(method=name, **overrides)).method


PUBLIC = {
    "clean": lambda t, a, k, x, y, st, s: patjax.clean_loss(t, x, y, state=st),
    "fgsm": lambda t, a, k, x, y, st, s: patjax.fgsm_at_loss(t, a, k, x, y, state=st, epsilon=s.attack.epsilon),
    "fgsm_cor": lambda t, a, k, x, y, st, s: patjax.fgsm_at_loss(
        t, a, k, x, y, state=st, epsilon=s.attack.epsilon, beta=s.snis.beta
    ),
    "pgd": lambda t, a, k, x, y, st, s: patjax.pgd_at_loss(t, a, k, x, y, state=st, attack=s.attack),
    "pgd_cor": lambda t, a, k, x, y, st, s: patjax.pgd_at_loss(
        t, a, k, x, y, state=st, attack=s.attack, beta=s.snis.beta
    ),
    "alp": lambda t, a, k, x, y, st, s: patjax.alp_loss(t, a, k, x, y, state=st, attack=s.attack),
    "clp": lambda t, a, k, x, y, st, s: patjax.clp_loss(t, a, k, x, y, state=st, attack=s.attack),
    "trades": lambda t, a, k, x, y, st, s: patjax.trades_loss(t, a, k, x, y, state=st, attack=s.attack),
    "mart": lambda t, a, k, x, y, st, s: patjax.mart_loss(t, a, k, x, y, state=st, attack=s.attack, mart=s.own),
    "atpr": lambda t, a, k, x, y, st, s: patjax.atpr_loss(t, a, k, x, y, state=st, search=s.own),
    "pat_wos": lambda t, a, k, x, y, st, s: patjax.pat_wos_loss(
        t, a, k, x, y, state=st, sampler=s.sampler.langevin_settings()
    ),
    "pat": lambda t, a, k, x, y, st, s: patjax.pat_loss(t, a, k, x, y, state=st, sampler=s.sampler.langevin_settings()),
    "gaussian": lambda t, a, k, x, y, st, s: patjax.gaussian_augmentation_loss(t, k, x, y, state=st),
}


def test_every_registered_method_has_a_public_objective():
    assert set(PUBLIC) == set(methods.REGISTRY)


def objective_inputs(seed=0, batch=4):
    module, variables = linen_small_cnn()
    x = jax.random.uniform(jax.random.PRNGKey(seed), (batch, 16, 16, 3))
    return module, variables, x, jnp.arange(batch) % 10, jax.random.PRNGKey(seed + 1)


@pytest.mark.slow
@pytest.mark.parametrize("name", PUBLIC)
def test_each_public_objective_on_an_nnx_module_computes_main_py_s_method(name, nnx_example):
    """main.py's method on the Linen small CNN against the public objective on its NNX twin with
    the same weights: the loss, the metrics, the gradient and the running statistics after the
    method's training-mode passes (TRADES: three, threaded through the module's own BatchStat)."""
    module, variables, x, y, key = objective_inputs()
    s = method_settings(name)
    fns = networks.ModelFns(module.apply)
    loss_fn = methods.make_method(s)
    (loss, (stats, metrics)), grads = jax.value_and_grad(loss_fn, has_aux=True)(
        variables["params"], fns, variables["batch_stats"], x, y, key
    )

    model = nnx_twin(nnx_example, variables)
    model.train()
    attack_mode = s.sampler.bn_mode if s.sampler else s.attack.bn_mode if s.attack else "inference"

    def nnx_loss(model):
        train_fn, attack_fn = patjax.nnx_forwards(model, attack_mode)
        loss, (_, metrics) = PUBLIC[name](train_fn, attack_fn, key, x, y, None, s)
        return loss, metrics

    (nnx_loss_value, nnx_metrics), nnx_grads = nnx.value_and_grad(nnx_loss, has_aux=True)(model)
    tol = dict(rtol=2e-5, atol=2e-6)  # float32: XLA may order the same sums differently
    np.testing.assert_allclose(nnx_loss_value, loss, **tol)
    assert set(nnx_metrics) == set(metrics)
    for k in metrics:
        np.testing.assert_allclose(nnx_metrics[k], metrics[k], **tol, err_msg=k)
    as_linen = linen_variables_of(nnx_twin_grads(nnx_example, nnx_grads))
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5), as_linen["params"], grads)
    after = linen_variables_of(model)["batch_stats"]
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, **tol), after, stats)


def nnx_twin_grads(nnx_example, grads):
    """The gradient State put into a twin, so its arrays read under the Linen names."""
    model = nnx_example["SmallCNN"](rngs=nnx.Rngs(0))
    nnx.update(model, grads)
    return model


def test_the_public_pat_loss_is_main_py_s_pat_on_a_linen_module():
    module, variables, x, y, key = objective_inputs()
    s = method_settings("pat")
    params, stats = variables["params"], variables["batch_stats"]
    internal = methods.make_method(s)(params, networks.ModelFns(module.apply), stats, x, y, key)
    train_fn, attack_fn = patjax.linen_forwards(module, params, stats)
    public = patjax.pat_loss(train_fn, attack_fn, key, x, y, state=stats, sampler=s.sampler.langevin_settings())
    jax.tree.map(np.testing.assert_array_equal, public, internal)


class NeedsMask(nnx.Module):
    def __init__(self):
        self.w = nnx.Param(jnp.ones((3, 10)))

    def __call__(self, x, mask):
        return jnp.mean(x, axis=(1, 2)) @ self.w[...]


class Flat(nnx.Module):
    def __init__(self):
        self.w = nnx.Param(jnp.ones((3, 10)))
        self.norm = nnx.BatchNorm(3, rngs=nnx.Rngs(0))

    def __call__(self, x):
        return self.norm(jnp.mean(x, axis=(1, 2))) @ self.w[...]


class WithDropout(nnx.Module):
    def __init__(self):
        self.w = nnx.Param(jnp.ones((3, 10)))
        self.drop = nnx.Dropout(0.5, rngs=nnx.Rngs(0))

    def __call__(self, x):
        return self.drop(jnp.mean(x, axis=(1, 2)) @ self.w[...])


def test_a_module_with_random_layers_is_evaluated_and_not_trained_by_patjax_s_loop(fake_data_dir, tmp_path):
    model = WithDropout()  # in training mode: the evaluation runs it as model.eval() would
    results = patjax.evaluate_model(model, np.zeros((4, 8, 8, 3), np.uint8), np.arange(4), evaluators="clean")
    assert results["figures"]["clean_accuracy"]["n"] == 4
    settings = config_lib.train_settings(tiny_config(method="clean", data_dir=fake_data_dir))
    with pytest.raises(UserError, match="WithDropout has random layers .* your own loop"):
        patjax.train_model(model, settings, str(tmp_path))
    assert not (tmp_path / "config.json").exists()  # nothing written


def test_bad_input_is_one_line():
    x, y = jnp.zeros((4, 8, 8, 3)), jnp.arange(4)
    images = np.zeros((4, 8, 8, 3), np.uint8)
    with pytest.raises(UserError, match="must take the images alone, but it requires \\['mask'\\]"):
        patjax.evaluate_model(NeedsMask(), images, np.arange(4))
    with pytest.raises(UserError, match="requires \\['mask'\\]"):
        patjax.nnx_forwards(NeedsMask())
    model = Flat()
    model.eval()
    with pytest.raises(UserError, match="is in inference mode .* call model.train\\(\\)"):
        patjax.nnx_forwards(model)
    wrong = lambda x, state: (jnp.zeros((x.shape[0],)), state)  # per-example scalars, not logits
    with pytest.raises(UserError, match="must return \\(B, classes\\) logits .* got shape \\(4,\\)"):
        patjax.pgd_at_loss(wrong, lambda x: jnp.zeros((x.shape[0], 10)), jax.random.PRNGKey(0), x, y)
    with pytest.raises(UserError, match="pat.beta must be >= 0"):
        patjax.pat_loss(wrong, lambda x: jnp.zeros((4, 10)), jax.random.PRNGKey(0), x, y, beta=-1.0)
    with pytest.raises(UserError, match="bn_mode must be one of"):
        forwards.nnx_logits_fn(Flat(), bn_mode="auto")
    training = Flat()  # an NNX module in training mode handed to an attack or estimator as the classifier
    key = jax.random.PRNGKey(0)
    calls = {
        "pgd": lambda: patjax.pgd(training, key, x, y, eps=0.03, step_size=0.01, steps=1),
        "langevin": lambda: patjax.langevin_sample(training, key, x, y, patjax.LangevinSettings(steps=1)),
        "apgd": lambda: patjax.apgd(training, key, x, y, eps=0.03, steps=1),
        "pr": lambda: patjax.pr_statistics(training, key, x, y, jnp.arange(4), (0.1,), 2, 2),
        "counts": lambda: patjax.class_counts(training, key, x, jnp.arange(4), 0, 2, 2, 0.25),
    }
    for name, call in calls.items():
        with pytest.raises(UserError, match="Flat passed as the classifier is in training mode .* model.eval"):
            call()
    training.eval()
    assert patjax.pgd(training, key, x, y, eps=0.03, step_size=0.01, steps=1).shape == x.shape


# The doc's settings, made small where only the run time depends on them.
DOC_SMALLER = {
    "patjax.LangevinSettings()": "patjax.LangevinSettings(steps=1)",
    "patjax.AttackSettings()": "patjax.AttackSettings(steps=1)",
    "patjax.AtprSettings()": "patjax.AtprSettings(num_candidates=2, steps=1, refine_max_iters=1)",
    "(8, 32, 32, 3)": "(8, 16, 16, 3)",
    "steps=100).x_adv": "steps=2).x_adv",
    "steps=20": "steps=2",
    "cfg.num_train_steps = 2": "cfg.num_train_steps, cfg.batch_size, cfg.langevin.steps = 2, 8, 1\n"
    "cfg.log_test_examples, cfg.progress_bar = 8, False",
}


@pytest.mark.slow
@pytest.mark.long
def test_the_own_loop_snippets_of_docs_api_md_run_in_order(tmp_path, data_dir):
    text = (REPO / "docs" / "api.md").read_text()
    section = text.split("## Your own training loop")[1].split("\n## ")[0]
    code = "\n".join(block.split("```")[0] for block in section.split("```python\n")[1:])
    for doc, smaller in DOC_SMALLER.items():
        assert doc in code, doc
        code = code.replace(doc, smaller)
    code = code.replace('"runs/my_nnx_pat"', repr(str(tmp_path / "run")))
    namespace = {}
    exec(compile(code, "docs/api.md", "exec"), namespace)
    assert np.isfinite(float(namespace["metrics"]["loss"]))
    assert namespace["results"]["figures"]["clean_accuracy"]["n"] == 8
    assert namespace["certificates"]["radius"].shape == (8,)


@pytest.mark.slow
def test_train_model_trains_a_users_linen_module_as_main_py_trains_its_network(fake_data_dir, tmp_path, nnx_example):
    """The same network and initial variables through train_model and through main.py's
    train_run: the same parameters, bitwise; a resumed run takes the same module only, and a
    run of a user's module is not rebuilt from its config."""
    cfg = tiny_config(method="pat", data_dir=fake_data_dir, num_train_steps=2)
    settings = config_lib.train_settings(cfg)
    main_state = train_lib.train_run(settings, str(tmp_path / "main"))
    module = settings.model.build()
    params, batch_stats = networks.init_variables(module, jax.random.split(jax.random.PRNGKey(settings.seed))[0])
    variables = {"params": params, "batch_stats": batch_stats}
    _, trained = patjax.train_model((module, variables), settings, str(tmp_path / "own"))
    jax.tree.map(np.testing.assert_array_equal, trained["params"], main_state.params)
    jax.tree.map(np.testing.assert_array_equal, trained["batch_stats"], main_state.batch_stats)
    with pytest.raises(UserError, match="whose variables differ"):
        patjax.train_model(nnx_example["SmallCNN"](rngs=nnx.Rngs(0)), settings, str(tmp_path / "own"))
    with pytest.raises(UserError, match="trains a SmallCNN of the user's; resume with train_run"):
        train_lib.train_run(settings, str(tmp_path / "own"))
    with pytest.raises(UserError, match="trained a module of the user's"):
        patjax.restore(str(tmp_path / "own"))


@pytest.mark.slow
def test_train_model_returns_a_trained_nnx_module_and_leaves_the_users_unchanged(fake_data_dir, tmp_path, nnx_example):
    cfg = tiny_config(method="pgd", data_dir=fake_data_dir, num_train_steps=2, **{"attack.steps": 1})
    model = nnx_example["SmallCNN"](rngs=nnx.Rngs(0))
    before = jax.tree.map(np.asarray, nnx.state(model))
    trained = patjax.train_model(model, config_lib.train_settings(cfg), str(tmp_path))
    jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.asarray, nnx.state(model)), before)
    assert type(trained) is type(model) and all(n.use_running_average for n in trained.norms)
    assert not np.array_equal(trained.head.kernel[...], model.head.kernel[...])
    results = patjax.evaluate_model(trained, np.zeros((4, 32, 32, 3), np.uint8), np.arange(4), evaluators="clean")
    assert results["figures"]["clean_accuracy"]["n"] == 4
