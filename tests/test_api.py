"""patjax.api: any classifier in, results.json's figures out. The example runs as documented, and
its figures are checked against independent computations: clean accuracy is the argmax of the
module's logits, and a logits function gives the figures of the (module, variables) pair."""

import runpy

import numpy as np
import pytest
from conftest import REPO

from patjax import api, data
from patjax.errors import UserError


@pytest.fixture(scope="module")
def example():
    return runpy.run_path(str(REPO / "examples" / "evaluate_own_model.py"))


def test_the_example_runs_and_its_clean_accuracy_is_the_argmax_of_the_logits(example, data_dir):
    results = example["main"](num_images=32)
    module = example["models"].create_model("small_cnn", "cifar10", num_classes=10)
    variables = example["traverse_util"].unflatten_dict(example["load_file"](example["WEIGHTS"]), sep="/")
    split = data.load_split("cifar10", "test", data_dir)
    logits = module.apply(variables, np.asarray(data.to_float(split.images[:32])))
    correct = np.asarray(logits).argmax(1) == split.labels[:32]
    assert results["figures"]["clean_accuracy"]["value"] == pytest.approx(correct.mean())
    np.testing.assert_array_equal(results["per_image"]["clean.correct"], correct)
    assert set(results["pr"]) == {"0.1", "0.12", "0.15", "0.2"}

    # The same network as a plain logits function: the same figures, image by image.
    as_function = api.evaluate(
        lambda x: module.apply(variables, x), split.images[:32], split.labels[:32], evaluators="clean,pr", pr_samples=20
    )
    np.testing.assert_array_equal(as_function["per_image"]["clean.correct"], correct)
    assert as_function["pr"] == results["pr"]


def test_images_that_are_not_8_bit_are_refused():
    with pytest.raises(UserError, match="8-bit values"):
        api.as_split(np.full((2, 32, 32, 3), 0.3001, np.float32), np.zeros(2, int))
    split = api.as_split(np.full((2, 32, 32, 3), 77 / 255, np.float32), np.zeros(2, int))
    assert split.images.dtype == np.uint8 and (split.images == 77).all()
