"""The five recipes of docs/architecture.md ("Adding an attack, a method, an evaluator, a model
or a noise law"), each followed once: the recipe's module is written here, registered with its one
registry line (patched for the test), and used through the public paths (training by
`run.train`, `patjax.api.evaluate`, the printed comparison). Every figure is checked against a
computation of its own in numpy or scipy."""

import dataclasses
import json
import subprocess
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import tensorflow_datasets as tfds
from conftest import REPO, train_run
from helpers import Linear, np_cross_entropy, np_softmax, tiny_config
from scipy import stats as scipy_stats

from patjax import api, evaluators, methods
from patjax.attacks.logits import margin
from patjax.core.errors import UserError
from patjax.data import cifar
from patjax.evaluators import attack, common, intervals, streams
from patjax.interop import torch_weights
from patjax.methods.common import Method
from patjax.models import networks
from patjax.pat import laws
from patjax.reporting import plots, report
from patjax.run import config as config_lib
from patjax.run import evaluation, train
from patjax.run import workdir as workdir_lib

# ---------------------------------------------------------------------------------------
# A model: a module with (num_classes, mean, std, dtype) that normalizes its input first, and
# one line in networks.MODELS. No PyTorch twin: training and evaluation work, export refuses.


class LinearNet(nn.Module):
    """logits = W normalize(x) + b, the recipe's minimal network."""

    num_classes: int
    mean: tuple | None
    std: tuple | None
    dtype: object = jnp.float32

    @nn.compact
    def __call__(self, x, train: bool = False):
        x = networks._normalized(x, self.mean, self.std, self.dtype)
        return nn.Dense(self.num_classes, dtype=self.dtype)(x.reshape(x.shape[0], -1))


def test_a_new_model_trains_evaluates_and_refuses_export_in_one_line(monkeypatch, tmp_path):
    monkeypatch.setitem(networks.MODELS, "linear_net", LinearNet)
    workdir = str(tmp_path / "run")
    cfg = tiny_config(model="linear_net", method="clean", data_dir=cifar.TFDS, num_train_steps=2)
    with tfds.testing.mock_data(num_examples=16):
        state = train_run(cfg, workdir)
        results = evaluation.evaluate_workdir(workdir, evaluators="clean", progress=False)
        split = cifar.load_split("cifar10", "test", cifar.TFDS)
    assert int(state.step) == 2
    # Clean accuracy by hand: numpy's affine map of the normalized images.
    params = jax.device_get(state.params)["Dense_0"]
    mean, std = networks.DATASET_STATS["cifar10"]
    x = (split.images[:16] / 255.0 - np.asarray(mean)) / np.asarray(std)
    logits = x.reshape(16, -1) @ np.asarray(params["kernel"], np.float64) + np.asarray(params["bias"])
    accuracy = np.mean(logits.argmax(1) == split.labels[:16])
    assert results["figures"]["clean_accuracy"]["value"] == pytest.approx(accuracy)
    with pytest.raises(UserError, match="linear_net has no PyTorch names") as refused:
        torch_weights.export(str(tmp_path / "w.safetensors"), "linear_net", state.params, {}, None)
    assert "\n" not in str(refused.value)
    assert not (tmp_path / "w.safetensors").exists()


# ---------------------------------------------------------------------------------------
# A method: a module with its loss (params, model, batch_stats, x, y, key, s), its own frozen
# settings dataclass (each field a field of the config block named after the method, its default
# written there once) and its `Method` entry, and one line in the tuple of methods/__init__.py's
# REGISTRY. The loss reads its own settings as `s.own` and the shared blocks its entry asks for
# as `s.attack`, `s.sampler` and `s.snis`.


@dataclasses.dataclass(frozen=True)
class UniformNoiseSettings:
    """The method's own setting: the config field uniform_noise.radius."""

    radius: float = 8 / 255  # the noise's half-width per pixel

    def __post_init__(self):
        if not self.radius >= 0:
            raise UserError(f"uniform_noise.radius must be >= 0, got {self.radius}")


def uniform_noise(params, model, batch_stats, x, y, key, s):
    """Mean cross-entropy at x + U(-r, r) per pixel, clipped to [0, 1]: noise, no weights."""
    r = s.own.radius
    noisy = jnp.clip(x + jax.random.uniform(key, x.shape, minval=-r, maxval=r), 0.0, 1.0)
    logits, new_batch_stats = model.train(params, batch_stats, noisy)
    loss = jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, y))
    batch = y.shape[0]
    metrics = {
        "loss": loss,
        "adv_accuracy": jnp.mean(jnp.argmax(logits, -1) == y),
        "snis_weight_mean": jnp.float32(1 / batch),
        "snis_weight_max": jnp.float32(1 / batch),
        "noise_linf": jnp.max(jnp.abs(noisy - x)),
    }
    return loss, (new_batch_stats, metrics)


UNIFORM_NOISE = Method("uniform_noise", uniform_noise, "Uniform noise", settings=UniformNoiseSettings)


def register_method(monkeypatch, method):
    """What one more line in REGISTRY's tuple gives: the registry and the names derived from it."""
    monkeypatch.setitem(methods.REGISTRY, method.name, method)
    for name, value in methods.derived_names(methods.REGISTRY).items():
        monkeypatch.setattr(methods, name, value)


@pytest.mark.slow
def test_a_new_method_with_a_setting_of_its_own_has_the_hand_computed_loss_and_gradient_and_trains(
    monkeypatch, tmp_path
):
    register_method(monkeypatch, UNIFORM_NOISE)
    # Its block, written from the dataclass's default, is a config field as any other.
    assert config_lib.default_config().uniform_noise.to_dict() == {"radius": 8 / 255}
    with pytest.raises(UserError, match="uniform_noise.radius must be >= 0"):
        config_lib.train_settings(tiny_config(**{"uniform_noise.radius": -0.1}))
    radius = 0.1
    cfg = tiny_config(
        method="uniform_noise",
        data_dir=cifar.TFDS,
        num_train_steps=2,
        log_every_steps=1,
        **{"uniform_noise.radius": radius},
    )
    settings = config_lib.train_settings(cfg)
    assert settings.method == methods.MethodSettings("uniform_noise", own=UniformNoiseSettings(radius))
    loss_fn = methods.make_method(settings.method)

    model = Linear(num_classes=3)
    x = jax.random.uniform(jax.random.PRNGKey(1), (5, 4, 4, 3))
    y = jnp.array([0, 1, 2, 1, 0])
    params = model.init(jax.random.PRNGKey(2), x)["params"]
    key = jax.random.PRNGKey(3)
    (loss, (_, metrics)), grads = jax.value_and_grad(loss_fn, has_aux=True)(
        params, networks.ModelFns(model.apply), {}, x, y, key
    )
    # By hand: the same noise (jax's draw for this key), clipping, the linear logits, mean CE, and
    # the closed-form gradient of mean CE for a linear map: X^T (softmax - onehot) / B.
    noise = np.asarray(jax.random.uniform(key, x.shape, minval=-radius, maxval=radius), np.float64)
    noisy = np.clip(np.asarray(x, np.float64) + noise, 0, 1).reshape(5, -1)
    kernel, bias = (np.asarray(params["Dense_0"][k], np.float64) for k in ("kernel", "bias"))
    logits = noisy @ kernel + bias
    assert float(loss) == pytest.approx(np_cross_entropy(logits, np.asarray(y)).mean(), rel=1e-5)
    onehot = np.eye(3)[np.asarray(y)]
    np.testing.assert_allclose(grads["Dense_0"]["kernel"], noisy.T @ (np_softmax(logits) - onehot) / 5, atol=1e-6)
    assert 8 / 255 < float(metrics["noise_linf"]) <= radius + 1e-7  # the set radius, not the default

    with tfds.testing.mock_data(num_examples=16):
        state = train_run(cfg, str(tmp_path / "run"))
    assert int(state.step) == 2
    lines = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
    assert [line["step"] for line in lines] == [1, 2]
    assert all(np.isfinite(line["loss"]) and 0 < line["noise_linf"] <= radius + 1e-7 for line in lines)
    saved = json.load(open(tmp_path / "run" / "config.json"))
    assert saved["uniform_noise"] == {"radius": radius}


@dataclasses.dataclass(frozen=True)
class RunNoiseSettings:
    """A setting whose default depends on the run: the noise's radius, < 0 for the `attack`
    block's epsilon, doubled on ResNet-18 (a rule made up for the recipe)."""

    radius: float = -1.0

    def __post_init__(self):
        if not self.radius >= 0:
            raise UserError(f"run_noise.radius must be >= 0, got {self.radius}")

    @classmethod
    def resolve(cls, fields, r):
        if fields["radius"] < 0:
            fields = dict(fields, radius=r.blocks["attack"].epsilon * (2.0 if r.model == "resnet18" else 1.0))
        return cls(**fields)


def test_a_new_methods_default_that_depends_on_the_run_is_resolved_by_its_own_class(monkeypatch):
    register_method(monkeypatch, Method("run_noise", uniform_noise, "Run noise", settings=RunNoiseSettings))
    own = lambda **fields: config_lib.train_settings(tiny_config(method="run_noise", **fields)).method.own
    assert config_lib.default_config().run_noise.to_dict() == {"radius": -1.0}  # written unresolved
    assert tiny_config().model != "resnet18"
    assert own(**{"attack.epsilon": 0.05}) == RunNoiseSettings(0.05)
    assert own(**{"attack.epsilon": 0.05, "model": "resnet18"}) == RunNoiseSettings(0.1)
    assert own(**{"attack.epsilon": 0.05, "run_noise.radius": 0.3}) == RunNoiseSettings(0.3)


def test_an_inner_attack_needs_its_reference_bn_mode():
    """attack.bn_mode='auto' resolves to the mode a method's entry declares (`attack_bn_mode`, its
    reference code's); a method without one is handed no attack, and an attack's logits function
    refuses 'auto' by name."""
    fns = networks.ModelFns(Linear(num_classes=3).apply)
    with pytest.raises(ValueError, match="attack_bn_mode"):
        fns.attack_logits_fn({}, {}, "auto")
    assert config_lib.method_settings(tiny_config(method="pgd")).attack.bn_mode == "train"
    assert config_lib.method_settings(tiny_config(method="clean")).attack is None


def test_a_new_sampler_method_gets_the_multi_process_refusal(monkeypatch):
    """Registered with sampler=True, a new method that runs Algorithm 1 with batch statistics is
    refused on several CPU processes, as pat is (docs/multiprocess.md); without it, it is not."""
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    cfg = tiny_config(method="pat_copy", **{"langevin.bn_mode": "train"})
    register_method(monkeypatch, dataclasses.replace(methods.REGISTRY["pat"], name="pat_copy", sampler=False))
    train.check_collectives_pair_across_processes(config_lib.train_settings(cfg).method)
    register_method(monkeypatch, dataclasses.replace(methods.REGISTRY["pat"], name="pat_copy"))
    with pytest.raises(UserError, match="pat_copy's sampler runs BatchNorm on batch statistics"):
        train.check_collectives_pair_across_processes(config_lib.train_settings(cfg).method)


# ---------------------------------------------------------------------------------------
# An evaluator: a module with passes, a jitted per-batch function per pass and a figures
# function (common.Evaluator), and one line in the tuple of evaluators/__init__.py's REGISTRY.


def register(monkeypatch, evaluator):
    """What one more line in REGISTRY's tuple gives: the registry and the names derived from it."""
    registry = {**evaluators.REGISTRY, evaluator.name: evaluator}
    monkeypatch.setattr(evaluators, "REGISTRY", registry)
    for name, value in evaluators.derived_names(registry).items():
        monkeypatch.setattr(evaluators, name, value)


def _top2_batch_fn(model_fns, s, pass_name):
    def fn(params, batch_stats, images, labels, indices):
        logits = model_fns.attack_logits_fn(params, batch_stats)(cifar.to_float(images))
        second = jnp.sort(logits, axis=-1)[:, -2]
        return {"hit": jnp.take_along_axis(logits, labels[:, None], -1)[:, 0] >= second}

    return jax.jit(fn)


TOP2 = common.Evaluator(
    "top2",
    passes=lambda s: ("top2",),
    make_batch_fn=_top2_batch_fn,
    figures=lambda per_image, s: {"top2_accuracy": intervals.proportion(per_image["top2"]["hit"], s.shared.confidence)},
)


@pytest.fixture(scope="module")
def linear_images():
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (40, 4, 4, 3), dtype=np.uint8)
    labels = rng.integers(0, 5, 40)
    return images, labels, rng.normal(size=(48, 5)), rng.normal(size=5)


def test_a_new_evaluator_runs_through_the_api_and_prints_with_its_figure(monkeypatch, linear_images):
    register(monkeypatch, TOP2)
    assert evaluators.parse("all") == ("clean", "pgd20", "cw20", "apgd_ce", "apgd_dlr", "pr", "top2")  # 'all' follows
    images, labels, kernel, bias = linear_images
    results = api.evaluate(
        lambda x: x.reshape(x.shape[0], -1) @ kernel + bias, images, labels, evaluators="clean,top2", batch_size=16
    )
    logits = (images / 255.0).reshape(40, -1) @ kernel + bias
    hits = int(np.sum((-logits).argsort(1)[:, :2] == labels[:, None]))
    fig = results["figures"]["top2_accuracy"]
    assert fig["value"] == pytest.approx(hits / 40) and fig["n"] == 40
    exact = scipy_stats.binomtest(hits, 40).proportion_ci(0.95, method="exact")
    np.testing.assert_allclose(fig["interval"], [exact.low, exact.high], atol=1e-9)
    np.testing.assert_array_equal(results["per_image"]["top2.hit"].sum(), hits)
    # The printed comparison shows a figure its layout does not know in a row of its own.
    printed = report.comparison(["linear"], [results])
    assert "top2_accuracy" in printed and f"{hits / 40:.4g} [{exact.low:.4g}, {exact.high:.4g}]" in printed


# ---------------------------------------------------------------------------------------
# An attack with one setting: a function (logits_fn, key, x, y, *, eps, ...) -> x_adv in
# attacks/, and an evaluator module for it with its own settings class, from
# attack.attack_evaluator; one line in REGISTRY.


def margin_sign_step(logits_fn, key, x, y, *, eps):
    """One signed step of eps up the gradient of the paper's margin s(x) = max_{j!=y} z_j - z_y
    (s >= 0: misclassified), clipped to [0, 1] (no random start: `key` is unused)."""
    grad = jax.grad(lambda v: jnp.sum(margin(logits_fn(v), y)))(x)
    return jnp.clip(x + eps * jnp.sign(grad), 0.0, 1.0)


@dataclasses.dataclass(frozen=True)
class MarginStepSettings:
    """The evaluator's own setting: the step as a fraction of the threat model's eps."""

    fraction: float = 1.0

    def __post_init__(self):
        if not 0 < self.fraction <= 1:
            raise UserError(f"eval.margin_step.fraction must be in (0, 1], got {self.fraction}")


def _step_robust(logits_fn, key, indices, x, y, s):
    eps = s.threat.eps * s.own.fraction
    attacked = lambda k, xi, yi: margin_sign_step(logits_fn, k, xi, yi, eps=eps)
    return jnp.argmax(logits_fn(streams.per_example(attacked, key, indices, x, y)), -1) == y


# Its random stream is its name's (`streams.attack_key`): no number to choose.
STEP = attack.attack_evaluator(
    "margin_step",
    "MarginStep",
    _step_robust,
    lambda s: {"eps": s.threat.eps * s.own.fraction, "steps": 1},
    MarginStepSettings,
)


def test_a_new_attack_through_its_evaluator_gives_the_closed_form_on_a_linear_model(monkeypatch, linear_images):
    register(monkeypatch, STEP)
    # Its setting is a config field, an override by its path and a recorded setting, from the registry line alone.
    assert config_lib.default_config().eval.margin_step.fraction == 1.0
    with pytest.raises(UserError, match=r"eval.margin_step.fraction must be in \(0, 1\], got 1.5"):
        config_lib.default_evaluation_settings("cifar10", {"margin_step.fraction": 1.5})
    images, labels, kernel, bias = linear_images
    kernel, bias, labels = kernel[:, :2], bias[:2], labels % 2  # two classes: s(x) is affine
    results = api.evaluate(
        lambda x: x.reshape(x.shape[0], -1) @ kernel + bias,
        images,
        labels,
        evaluators="clean,margin_step",
        batch_size=16,
        attack={"eps": 0.1},
        margin_step={"fraction": 0.5},
    )
    # By hand: the margin's gradient is w_other - w_y, so the step moves every pixel by -eps times
    # the sign of w_y - w_other, clipped; robust when the class is still y there. eps = 0.5 x 0.1.
    x = (images / 255.0).reshape(40, -1)
    direction = np.sign(kernel[:, labels] - kernel[:, 1 - labels]).T
    adv_logits = np.clip(x - 0.05 * direction, 0, 1) @ kernel + bias
    robust = adv_logits.argmax(1) == labels
    correct = (x @ kernel + bias).argmax(1) == labels
    assert 0 < robust.sum() < 40
    fig = results["figures"]["margin_step"]
    assert fig["value"] == pytest.approx(robust.mean()) and fig["settings"] == {"eps": 0.05, "steps": 1}
    assert results["settings"]["margin_step"]["fraction"] == 0.5
    worst = results["figures"]["worst_case"]
    assert worst["attacks"] == ["margin_step"] and worst["value"] == pytest.approx(np.mean(robust & correct))
    # Its column is headed with the radius it attacked at (half the threat model's), not the threat model's.
    assert "MarginStep (L∞, ε = 0.05) %" in report.comparison(["linear"], [results])


def test_each_attack_has_a_stream_of_its_own_and_the_committed_ones_are_kept():
    """The kept streams are the split keys the committed figures were drawn with, written out here
    by hand; every other name's key is fold_in of its CRC-32 (zlib's, recomputed here), distinct
    from the kept ones, from AutoAttack's (fold_in 100 + k) and from PR's (fold_in image index)."""
    import zlib

    root = jax.random.PRNGKey(7)
    split = jax.random.split(root, 5)
    for name, k in {"pgd20": 1, "cw20": 2, "apgd_ce": 3, "apgd_dlr": 4}.items():
        np.testing.assert_array_equal(streams.attack_key(7, name), split[k])
    derived = {}
    for name in ("margin_step", "fgsm", "pgd_l2", "square_l2"):
        stream = 2**24 + zlib.crc32(name.encode()) % (2**31 - 2**24)
        np.testing.assert_array_equal(streams.attack_key(7, name), jax.random.fold_in(root, stream))
        derived[name] = str(np.asarray(streams.attack_key(7, name)).tolist())
    folded = jax.vmap(lambda i: jax.random.fold_in(root, i))(jnp.arange(10_105, dtype=jnp.uint32))  # images, AA
    others = {str(k.tolist()) for k in np.asarray(jnp.concatenate([split[1:], folded]))}
    assert len(set(derived.values())) == 4 and not set(derived.values()) & others


# ---------------------------------------------------------------------------------------
# A PR noise law: a module with its base noise, its map onto each radius eps, what eps is and
# its definition for results.json (`laws.common.of_eps`), and one line in the tuple of
# pat/laws/__init__.py's REGISTRY. Written here as that module would be.


def laplace_noise(key, shape):
    """One sample's base noise: Laplace(0, 1) per pixel, drawn from the sample's own key."""
    return jax.random.laplace(key, shape)


def laplace_perturb(x, eps, z):
    """The sample at radius eps: x + eps z, clipped to [0, 1] (eps is the Laplace scale)."""
    return jnp.clip(x + eps * z, 0.0, 1.0)


LAPLACE = laws.common.of_eps(
    "laplace",
    "x + eps * Laplace(0, 1) per pixel, clipped to [0,1]",
    "eps (Laplace scale per pixel)",
    laplace_noise,
    laplace_perturb,
)


def laplace_counts(logits_of, images, labels, epsilons, num_samples, seed):
    """Non-adversarial samples per (image, eps) by hand, in float64: sample j of image i from the
    key fold_in(fold_in(PRNGKey(seed), i), j), x + eps z clipped, and a strict top logit."""
    counts = np.zeros((len(images), len(epsilons)), np.int64)
    for i, (image, label) in enumerate(zip(images / 255.0, labels)):
        for j in range(num_samples):
            key = jax.random.fold_in(jax.random.fold_in(jax.random.PRNGKey(seed), i), j)
            z = np.asarray(jax.random.laplace(key, image.shape), np.float64)
            for e, eps in enumerate(epsilons):
                logits = logits_of(np.clip(image + eps * z, 0, 1)[None])[0]
                counts[i, e] += logits[label] > np.delete(logits, label).max()
    return counts


def test_a_new_noise_law_reaches_the_settings_the_api_results_and_the_reports(monkeypatch, linear_images):
    settings = {"pr.distribution": "laplace", "pr.distributions": ("laplace",), "pr.epsilons": (0.05, 0.2)}
    with pytest.raises(UserError, match="unknown PR distribution 'laplace'"):
        config_lib.default_evaluation_settings("cifar10", settings)  # before its registry line
    monkeypatch.setitem(laws.REGISTRY, "laplace", LAPLACE)
    # The config's block takes it by name: the headline law, and a law beside the default ones.
    beside = config_lib.default_evaluation_settings("cifar10", {"pr.distributions": ("uniform", "laplace")})
    assert beside.evaluator_settings["pr"].distributions == ("uniform", "laplace")
    images, labels, kernel, bias = linear_images
    results = api.evaluate(
        lambda x: x.reshape(x.shape[0], -1) @ kernel + bias,
        images,
        labels,
        evaluators="clean,pr",
        batch_size=16,
        pr={"samples": 6, "chunk_size": 4},
        seed=3,
        **settings,
    )
    logits_of = lambda x: x.reshape(x.shape[0], -1) @ kernel + bias
    counts = laplace_counts(logits_of, images, labels, (0.05, 0.2), 6, seed=3)
    assert 0 < counts.sum() < counts.size * 6  # some samples robust, some not
    np.testing.assert_array_equal(results["per_image"]["pr_laplace.counts"], counts)
    correct = logits_of(images / 255.0).argmax(1) == labels
    for e, key in enumerate(("0.05", "0.2")):
        figure = results["figures"]["pr"]["laplace"][key]
        assert figure["clean_correct"]["value"] == pytest.approx(np.mean(counts[correct, e] / 6))
        assert figure["all"]["value"] == pytest.approx(np.mean(counts[:, e] / 6))
        assert results["pr"][key]["value"] == figure["clean_correct"]["value"]  # the headline
    # results.json records its definition and no other law's; the reports name it and its level.
    assert results["settings"]["laplace"] == LAPLACE.definition and "uniform" not in results["settings"]
    assert LAPLACE.definition in results["pr_protocol"]
    assert "laplace law at ε = 0.05, 0.2" in report.comparison(["linear"], [results])
    assert plots.plot_pr(["linear"], [results]).axes[0].get_xlabel() == LAPLACE.level


# The command line run in a second process in which the law is registered, as its registry line
# would register it: `python -m patjax.evaluate`'s own entry point.
REGISTERED_CLI = """
import sys
sys.path.insert(0, "tests")
from test_recipes import LAPLACE
from patjax.pat import laws
from patjax import evaluate
laws.REGISTRY["laplace"] = LAPLACE
sys.argv = ["patjax.evaluate", *sys.argv[1:]]
evaluate.cli()
"""


# A small CNN of the committed table1_cpu suite (clean training, 800 steps on CIFAR-10).
KEPT_RUN = REPO / "docs/results/table1_cpu/runs/cifar10_small_cnn/clean_s0"

# The same for the evaluator: its registry line, as `register` gives it.
REGISTERED_EVALUATOR_CLI = """
import sys
sys.path.insert(0, "tests")
from test_recipes import STEP
from patjax import evaluate, evaluators
registry = {**evaluators.REGISTRY, STEP.name: STEP}
evaluators.REGISTRY = registry
for name, value in evaluators.derived_names(registry).items():
    setattr(evaluators, name, value)
sys.argv = ["patjax.evaluate", *sys.argv[1:]]
evaluate.cli()
"""


@pytest.mark.slow
def test_a_new_evaluators_setting_is_a_command_line_flag_by_its_path(tmp_path, data_dir):
    """--eval.margin_step.fraction, with no flag written for it: the evaluation records it and
    attacks at that fraction of the threat model's radius; a value its class refuses is one line
    naming the flag."""
    _, _, state = workdir_lib.restore(str(KEPT_RUN))
    weights = str(tmp_path / "net.safetensors")
    torch_weights.export(weights, "small_cnn", state.params, state.batch_stats, networks.DATASET_STATS["cifar10"])
    command = [sys.executable, "-c", REGISTERED_EVALUATOR_CLI, f"--torch_checkpoint={weights}"]
    command += [f"--data_dir={data_dir}", "--num_examples=8", "--batch_size=8", "--evaluators=clean,margin_step"]
    run = subprocess.run(
        [*command, "--eval.margin_step.fraction=0.25", "--eval.attack.eps=8/255"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    saved = json.loads((tmp_path / "net" / "eval" / "results.json").read_text())
    assert saved["settings"]["margin_step"]["fraction"] == 0.25
    assert saved["figures"]["margin_step"]["settings"] == {"eps": pytest.approx(0.25 * 8 / 255), "steps": 1}
    bad = subprocess.run([*command, "--eval.margin_step.fraction=1.5"], capture_output=True, text=True, cwd=REPO)
    assert bad.returncode == 2
    assert bad.stderr.strip() == "error: --eval.margin_step.fraction must be in (0, 1], got 1.5"


@pytest.mark.slow
def test_a_new_noise_law_runs_from_the_command_line_as_through_the_api(monkeypatch, tmp_path, data_dir):
    _, _, state = workdir_lib.restore(str(KEPT_RUN))
    weights = str(tmp_path / "net.safetensors")
    torch_weights.export(weights, "small_cnn", state.params, state.batch_stats, networks.DATASET_STATS["cifar10"])
    flags = ["--pr_distribution=laplace", "--pr_distributions=laplace,uniform", "--pr_epsilons=0.05,0.2"]
    command = [sys.executable, "-c", REGISTERED_CLI, f"--torch_checkpoint={weights}", f"--data_dir={data_dir}"]
    command += ["--num_examples=12", "--batch_size=12", "--evaluators=clean,pr", "--pr_samples=8", "--seed=5", *flags]
    run = subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "laplace law at ε = 0.05, 0.2" in run.stdout
    out = tmp_path / "net" / "eval"
    saved = json.loads((out / "results.json").read_text())
    assert saved["settings"]["pr"]["distributions"] == ["laplace", "uniform"]
    assert saved["settings"]["laplace"] == LAPLACE.definition
    # The same images, model and settings through the API, in this process: the same counts.
    monkeypatch.setitem(laws.REGISTRY, "laplace", LAPLACE)
    split = cifar.load_split("cifar10", "test", data_dir)
    results = api.evaluate(
        (networks.create_model("small_cnn", "cifar10", 10), {"params": state.params, "batch_stats": state.batch_stats}),
        split.images[:12],
        split.labels[:12],
        evaluators="clean,pr",
        batch_size=12,
        seed=5,
        pr={"samples": 8, "distribution": "laplace", "distributions": ("laplace", "uniform"), "epsilons": (0.05, 0.2)},
    )
    per_image = np.load(out / "per_image.npz")
    for law in ("laplace", "uniform"):
        np.testing.assert_array_equal(per_image[f"pr_{law}.counts"], results["per_image"][f"pr_{law}.counts"])
    for key, figure in results["figures"]["pr"]["laplace"].items():
        assert saved["figures"]["pr"]["laplace"][key]["all"]["value"] == pytest.approx(figure["all"]["value"])
    # Counts of both outcomes, and not the uniform law's on the same samples: the run drew the law it was told.
    assert 0 < per_image["pr_laplace.counts"].sum() < 12 * 8 * 2
    assert not np.array_equal(per_image["pr_laplace.counts"], per_image["pr_uniform.counts"])
