"""patjax.api: any classifier in, results.json's figures out. The example runs as documented, and
its figures are checked against independent computations: clean accuracy is the argmax of the
module's logits, and a logits function gives the figures of the (module, variables) pair."""

import runpy

import flax.linen as nn
import jax
import numpy as np
import pytest
from conftest import REPO

from patjax import api
from patjax.core.errors import UserError
from patjax.data import cifar


@pytest.fixture(scope="module")
def example():
    return runpy.run_path(str(REPO / "examples" / "evaluate_own_model.py"))


@pytest.mark.slow
def test_the_example_runs_and_its_clean_accuracy_is_the_argmax_of_the_logits(example, data_dir):
    results = example["main"](num_images=32)
    module = example["networks"].create_model("small_cnn", "cifar10", num_classes=10)
    variables = example["traverse_util"].unflatten_dict(example["load_file"](example["WEIGHTS"]), sep="/")
    split = cifar.load_split("cifar10", "test", data_dir)
    logits = module.apply(variables, np.asarray(cifar.to_float(split.images[:32])))
    correct = np.asarray(logits).argmax(1) == split.labels[:32]
    assert results["figures"]["clean_accuracy"]["value"] == pytest.approx(correct.mean())
    np.testing.assert_array_equal(results["per_image"]["clean.correct"], correct)
    assert set(results["pr"]) == {"0.1", "0.12", "0.15", "0.2"}

    # The same network as a plain logits function: the same figures, image by image.
    as_function = api.evaluate(
        lambda x: module.apply(variables, x),
        split.images[:32],
        split.labels[:32],
        evaluators="clean,pr",
        pr={"samples": 20},
    )
    np.testing.assert_array_equal(as_function["per_image"]["clean.correct"], correct)
    assert as_function["pr"] == results["pr"]


def test_images_that_are_not_8_bit_are_refused():
    with pytest.raises(UserError, match="8-bit values"):
        api.as_split(np.full((2, 32, 32, 3), 0.3001, np.float32), np.zeros(2, int))
    split = api.as_split(np.full((2, 32, 32, 3), 77 / 255, np.float32), np.zeros(2, int))
    assert split.images.dtype == np.uint8 and (split.images == 77).all()


class Tiny(nn.Module):
    """A Flax module as a user writes it: `train` switches BatchNorm to batch statistics."""

    @nn.compact
    def __call__(self, x, train: bool = False):
        x = nn.Conv(4, (3, 3))(x)
        x = nn.relu(nn.BatchNorm(use_running_average=not train)(x))
        return nn.Dense(10)(x.mean(axis=(1, 2)))


class TinyWithoutTrain(nn.Module):
    """The same layers with one mode (BatchNorm's running statistics) and no `train` argument."""

    @nn.compact
    def __call__(self, x):
        x = nn.Conv(4, (3, 3))(x)
        x = nn.relu(nn.BatchNorm(use_running_average=True)(x))
        return nn.Dense(10)(x.mean(axis=(1, 2)))


@pytest.fixture(scope="module")
def tiny():
    """Variables with moved BatchNorm statistics, 12 images, and labels that the network gets
    right on the first 7 images only (from its own logits, computed here with numpy's argmax)."""
    rng = np.random.default_rng(0)
    variables = Tiny().init(jax.random.PRNGKey(0), np.zeros((1, 32, 32, 3), np.float32))
    variables = {
        "params": variables["params"],
        "batch_stats": {
            "BatchNorm_0": {
                "mean": rng.normal(0, 0.1, 4).astype(np.float32),
                "var": rng.uniform(0.5, 2, 4).astype(np.float32),
            }
        },
    }
    images = rng.integers(0, 256, (12, 32, 32, 3), dtype=np.uint8)
    logits = np.asarray(Tiny().apply(variables, images.astype(np.float32) / 255))
    predicted = logits.argmax(1)
    labels = np.where(np.arange(12) < 7, predicted, (predicted + 1) % 10)
    return variables, images, labels


@pytest.fixture(scope="module")
def reference(tiny):
    variables, images, labels = tiny
    return api.evaluate(
        (Tiny(), variables), images, labels, evaluators="clean,pgd20", attack={"steps": 3}, batch_size=6
    )


@pytest.mark.slow
@pytest.mark.parametrize("form", ["pair", "pair without train", "bound module", "logits function", "with train"])
def test_every_kind_of_model_evaluates_with_the_figures_of_its_logits(tiny, reference, form):
    variables, images, labels = tiny
    model = {
        "pair without train": (TinyWithoutTrain(), variables),
        "bound module": TinyWithoutTrain().bind(variables),
        "logits function": lambda x: Tiny().apply(variables, x),
        "with train": lambda x, train: Tiny().apply(variables, x, train=train),  # called with train=False
    }.get(form)
    settings = dict(evaluators="clean,pgd20", attack={"steps": 3}, batch_size=6)
    results = reference if form == "pair" else api.evaluate(model, images, labels, **settings)
    correct = np.arange(12) < 7  # by construction of the labels from numpy's argmax
    np.testing.assert_array_equal(results["per_image"]["clean.correct"], correct)
    assert results["figures"]["clean_accuracy"]["value"] == pytest.approx(7 / 12)
    robust = results["per_image"]["pgd20.robust"]
    assert not robust[~correct].any()  # an image the network gets wrong is not robust
    assert results["figures"]["pgd20"]["value"] == pytest.approx(robust.mean())
    # Every form is the same network under the same attack seed: the same images survive.
    np.testing.assert_array_equal(robust, reference["per_image"]["pgd20.robust"])


class NeedsMore(nn.Module):
    @nn.compact
    def __call__(self, x, dropout_rng):
        return nn.Dense(10)(x.mean(axis=(1, 2)))


@pytest.mark.parametrize(
    "model,message",
    [
        (Tiny(), "needs its variables"),
        ((NeedsMore(), {"params": {}}), r"requires \['dropout_rng'\]"),
        (lambda x, key: x, r"requires \['key'\]"),
        ((Tiny(), {"batch_stats": {}}), "holding 'params'"),
        ((Tiny(), {"params": {}, "intermediates": {}}), r"not \['intermediates'\]"),
        ("resnet18", "must be a logits function"),
    ],
)
def test_a_model_that_cannot_be_called_on_images_alone_is_refused_before_any_compile(model, message):
    with pytest.raises(UserError, match=message):
        api.as_model(model)


# Python's conventions: the library's refusals are ValueErrors (TypeErrors for a wrong type), a
# model's output is checked before any figure, numpy scalars are numbers.
_RNG = np.random.default_rng(0)
_IMAGES = _RNG.integers(0, 256, (4, 32, 32, 3), dtype=np.uint8)
_LABELS = np.array([0, 1, 2, 3])
_W = (_RNG.normal(size=(32 * 32 * 3, 10)) * 0.01).astype(np.float32)


def _linear(x):
    return x.reshape(x.shape[0], -1) @ _W


@pytest.mark.parametrize(
    "model, error, message",
    [
        (lambda x: _linear(x).astype(np.int32), TypeError, "floating-point logits"),
        (lambda x: _linear(x)[:1], ValueError, "got shape \\(1, 10\\) for N = 2"),  # a batch dimension dropped
        (lambda x: _linear(x)[:, :, None], ValueError, "got shape \\(2, 10, 1\\)"),
        (42, TypeError, "model must be a logits function"),
    ],
    ids=["integer-logits", "fixed-batch", "3d-logits", "not-a-model"],
)
def test_a_model_with_outputs_of_the_wrong_shape_or_dtype_is_refused_as_python_would(model, error, message):
    with pytest.raises(error, match=message) as raised:
        api.evaluate(model, _IMAGES, _LABELS, evaluators="clean")
    assert isinstance(raised.value, UserError) and "\n" not in str(raised.value)


@pytest.mark.slow
def test_settings_take_numpy_scalars_and_refuse_other_types_and_unknown_datasets():
    # np.int64(2) and np.float32 where 2 and a float are asked: the same figures as the Python numbers.
    numpy_args = api.evaluate(
        _linear,
        _IMAGES,
        _LABELS,
        evaluators="pr",
        pr={"samples": np.int64(2), "chunk_size": np.int64(2), "epsilons": (np.float32(0.1),)},
    )
    python_args = api.evaluate(
        _linear,
        _IMAGES,
        _LABELS,
        evaluators="pr",
        pr={"samples": 2, "chunk_size": 2, "epsilons": (float(np.float32(0.1)),)},
    )
    np.testing.assert_array_equal(
        numpy_args["per_image"]["pr_uniform.counts"], python_args["per_image"]["pr_uniform.counts"]
    )
    with pytest.raises(TypeError, match="pr.samples must be of type int, got '4'") as raised:
        api.evaluate(_linear, _IMAGES, _LABELS, evaluators="pr", pr={"samples": "4"})
    with pytest.raises(ValueError, match="unknown eval setting 'pr_samples'; it is pr.samples"):
        api.evaluate(_linear, _IMAGES, _LABELS, evaluators="pr", pr_samples=4)
    assert isinstance(raised.value, ValueError)  # a UserError all the same
    with pytest.raises(ValueError, match="unknown dataset 'imagenet'"):
        api.evaluate(_linear, _IMAGES, _LABELS, evaluators="clean", dataset="imagenet")


@pytest.mark.slow
def test_autoattack_on_images_the_model_all_misclassifies_reports_zero_robust():
    """Every image wrong at x: no attack has an image to run on, and the answer is 0 robust (the
    reference AutoAttack's too), not a KeyError."""
    always_class_0 = lambda x: _linear(x) * 0 + np.eye(10, dtype=np.float32)[0] * 10  # noqa: E731
    results = api.evaluate(
        always_class_0,
        _IMAGES,
        np.ones(4, int),
        evaluators="aa",
        apgd={"steps": 2},
        aa={"fab_steps": 2, "square_queries": 4},
    )
    aa = results["figures"]["aa"]
    assert aa["value"] == 0.0 and aa["clean_accuracy"]["value"] == 0.0
    assert aa["broken_by"]["misclassified"] == 4 and aa["broken_by"]["robust"] == 0


def test_the_public_namespace_is_the_documented_table_and_survives_the_command_lines():
    import importlib
    import re

    import patjax

    # The command lines' modules are attributes of the package once imported: the exported
    # functions must not share their names.
    importlib.import_module("patjax.evaluate")
    importlib.import_module("patjax.export")
    documented = set()
    section = (REPO / "docs" / "api.md").read_text().split("## The public namespace")[1].split("\n## ")[0]
    for line in section.splitlines():
        if line.startswith("| `"):
            documented |= set(re.findall(r"`(\w+)`", line.split(" | ")[0]))
    assert documented == set(patjax.__all__)
    assert patjax.evaluate_model is api.evaluate and callable(patjax.export_run)
    missing = [name for name in patjax.__all__ if not hasattr(patjax, name)]
    assert not missing
    assert "resnet18" in patjax.MODELS and "pat" in patjax.METHODS and "pr" in patjax.EVALUATORS


def test_the_results_dict_prints_as_the_commands_tables_of_what_ran():
    """`patjax.evaluation_tables` lays out api.evaluate's dict as the command does: its row, the
    attacks with their threat model, no PR caption where PR did not run."""
    import patjax
    from patjax.reporting import report

    results = api.evaluate(_linear, _IMAGES, _LABELS, evaluators="clean,pgd20", attack={"steps": 2})
    text = patjax.evaluation_tables(results, name="mine")
    assert text == report.comparison(["mine"], [results])
    assert "Attacks: L∞, ε = 8/255" in text and "PGD (L∞, ε = 8/255) %" in text
    assert "PR:" not in text and "PR(" not in text
    assert any(line.strip().startswith("mine ") for line in text.splitlines())
