"""Data loading (official binary layout, TFDS; the search for a folder that holds the split being
loaded, with no network) and the in-jit augmentation."""

import os
import socket

import jax
import numpy as np
import pytest
import tensorflow_datasets as tfds

from patjax import api
from patjax.core.errors import UserError
from patjax.data import cifar, download
from patjax.interop import torch_weights
from patjax.models import networks
from patjax.run import eval_files


def write_binary(path, labels, images, coarse=None):
    """Records in the official layout: [coarse], label, R plane, G plane, B plane (row-major)."""
    with open(path, "wb") as f:
        for i, (label, image) in enumerate(zip(labels, images)):
            head = bytes([label]) if coarse is None else bytes([coarse[i], label])
            f.write(
                head + bytes(image[:, :, 0].ravel()) + bytes(image[:, :, 1].ravel()) + bytes(image[:, :, 2].ravel())
            )


def test_binary_layout_is_parsed_to_nhwc(tmp_path, records_per_file):
    records_per_file(3)
    rng = np.random.default_rng(0)
    folder = tmp_path / "cifar-10-batches-bin"
    folder.mkdir()
    images = rng.integers(0, 256, (3, 32, 32, 3), dtype=np.uint8)
    write_binary(folder / "test_batch.bin", [7, 0, 9], images)
    split = cifar.load_split("cifar10", "test", str(tmp_path))
    np.testing.assert_array_equal(split.images, images)
    np.testing.assert_array_equal(split.labels, [7, 0, 9])


def test_cifar100_uses_the_fine_label(tmp_path, records_per_file):
    records_per_file(2)
    folder = tmp_path / "cifar-100-binary"
    folder.mkdir()
    images = np.zeros((2, 32, 32, 3), np.uint8)
    write_binary(folder / "test.bin", [42, 99], images, coarse=[3, 19])
    np.testing.assert_array_equal(cifar.load_split("cifar100", "test", str(tmp_path)).labels, [42, 99])


def test_missing_files_and_unknown_dataset_are_user_errors(tmp_path, data_dir):
    with pytest.raises(UserError, match="data_batch_1.bin"):
        cifar.load_split("cifar10", "train", str(tmp_path))
    with pytest.raises(UserError, match="train.bin"):  # ../shared/data has the CIFAR-100 test split only
        cifar.load_split("cifar100", "train", data_dir)
    with pytest.raises(UserError, match="unknown dataset"):
        cifar.load_split("mnist", "train", str(tmp_path))


@pytest.mark.slow
def test_real_cifar10_matches_published_statistics(data_dir):
    train = cifar.load_split("cifar10", "train", data_dir)
    test = cifar.load_split("cifar10", "test", data_dir)
    assert train.images.shape == (50000, 32, 32, 3) and test.images.shape == (10000, 32, 32, 3)
    np.testing.assert_array_equal(np.bincount(train.labels), np.full(10, 5000))
    # Published per-channel means of the CIFAR-10 training set (pixel values 0-255).
    np.testing.assert_allclose(train.images.reshape(-1, 3).mean(0), [125.31, 122.95, 113.87], atol=0.01)
    # The models' input normalization (and the PyTorch peer's, which imports it) is these pixels'
    # per-channel mean and standard deviation, to its 4 decimals.
    pixels = train.images.reshape(-1, 3).astype(np.float64) / 255
    mean, std = networks.DATASET_STATS["cifar10"]
    np.testing.assert_allclose(mean, pixels.mean(0), atol=5e-5)
    np.testing.assert_allclose(std, pixels.std(0), atol=5e-5)
    cifar100 = cifar.load_split("cifar100", "test", data_dir)
    assert cifar100.images.shape == (10000, 32, 32, 3) and cifar100.labels.max() == 99


@pytest.fixture
def offline(monkeypatch, tmp_path):
    """No network (any connection, a download's, fails the test loudly), an empty download cache,
    no data beside the checkout; PATJAX_DATA_DIR is the folder returned, empty."""

    def refuse(*args, **kwargs):
        raise AssertionError(f"a network connection was attempted: {args}")

    monkeypatch.setattr(socket, "getaddrinfo", refuse)  # a name looked up: a connection under way
    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(cifar, "_search_roots", lambda: [str(tmp_path / "checkout" / "repo")])
    monkeypatch.setenv("PATJAX_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("PATJAX_DATA_DIR", str(tmp_path / "data"))
    return tmp_path / "data"


def write_test_split(offline, dataset, images, labels, records_per_file):
    """Writes `dataset`'s test split alone into the offline data folder, a synthetic file of
    len(labels) records that the loader is told to expect."""
    records_per_file(len(labels))
    folder = offline / download.ARCHIVES[dataset][3]
    folder.mkdir(parents=True)
    coarse = [0] * len(labels) if dataset == "cifar100" else None
    write_binary(folder / download.SPLIT_FILES[dataset]["test"][0], labels, images, coarse)


@pytest.mark.parametrize("dataset", ["cifar10", "cifar100"])
def test_a_folder_with_the_test_split_alone_serves_an_evaluation_and_not_a_training(offline, dataset, records_per_file):
    images = np.random.default_rng(1).integers(0, 256, (5, 32, 32, 3), dtype=np.uint8)
    write_test_split(offline, dataset, images, [3, 1, 4, 1, 5], records_per_file)
    assert cifar.find_data_dir(dataset, "test") == str(offline)
    split = cifar.load_split(dataset, "test", None)  # found, and read without a download
    np.testing.assert_array_equal(split.images, images)
    np.testing.assert_array_equal(split.labels, [3, 1, 4, 1, 5])
    # Training needs the training split: the folder is not taken for it, and the download starts.
    assert cifar.find_data_dir(dataset, "train") is None and cifar.find_data_dir(dataset) is None
    with pytest.raises(AssertionError, match="a network connection was attempted"):
        cifar.load_split(dataset, "train", None)


@pytest.mark.slow
def test_cifar100_with_the_test_split_alone_evaluates_offline(offline, tmp_path, records_per_file):
    """`python -m patjax.evaluate --torch_checkpoint` (`api.evaluate_torch_checkpoint`) of a
    CIFAR-100 network with no data_dir: the test split alone, found in PATJAX_DATA_DIR."""
    rng = np.random.default_rng(2)
    images, labels = rng.integers(0, 256, (6, 32, 32, 3), dtype=np.uint8), [7, 99, 0, 42, 7, 13]
    write_test_split(offline, "cifar100", images, labels, records_per_file)
    model = networks.create_model("small_cnn", "cifar100", 100, normalize=networks.NO_NORMALIZATION)
    params, batch_stats = networks.init_variables(model, jax.random.PRNGKey(0))
    weights = str(tmp_path / "net.safetensors")
    torch_weights.export(weights, "small_cnn", params, batch_stats, normalize=None)
    out = str(tmp_path / "net")
    results = api.evaluate_torch_checkpoint(
        weights, "small_cnn", "cifar100", "none", out, evaluators=["clean"], num_examples=6, batch_size=6
    )
    assert results["settings"]["dataset"] == "cifar100" and results["settings"]["num_examples"] == 6
    logits = model.apply({"params": params, "batch_stats": batch_stats}, images.astype(np.float32) / 255)
    expected = np.argmax(np.asarray(logits), axis=1) == np.asarray(labels)
    _, per_image = eval_files.load_results(out)
    np.testing.assert_array_equal(per_image["clean.correct"], expected)
    assert not os.path.exists(tmp_path / "cache" / "cifar-100-binary")


def test_tfds_mock_data_path():
    with tfds.testing.mock_data(num_examples=12):
        split = cifar.load_split("cifar10", "train", cifar.TFDS)
    assert split.images.shape == (12, 32, 32, 3) and split.images.dtype == np.uint8
    assert split.labels.dtype == np.int32 and split.labels.max() < 10


def test_tfds_unprepared_without_tensorflow_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setenv("TFDS_DATA_DIR", str(tmp_path))
    monkeypatch.setattr(tfds.core.constants, "DATA_DIR", str(tmp_path), raising=False)
    monkeypatch.setattr(cifar, "_tensorflow_available", lambda: False)
    with pytest.raises(UserError, match=r"\[tfds-prepare\] extra"):
        cifar.load_split("cifar10", "test", cifar.TFDS)


def test_augment_returns_a_reflect_padded_crop_possibly_flipped():
    rng = np.random.default_rng(1)
    images = rng.integers(0, 256, (64, 32, 32, 3), dtype=np.uint8)
    out = np.asarray(jax.jit(cifar.augment)(jax.random.PRNGKey(0), images))
    assert out.shape == (64, 32, 32, 3) and out.dtype == np.float32
    padded = np.pad(images / 255.0, ((0, 0), (4, 4), (4, 4), (0, 0)), mode="reflect")
    flips, offsets = 0, set()
    for i in range(len(images)):
        matches = [
            (dy, dx, f)
            for dy in range(9)
            for dx in range(9)
            for f in (False, True)
            if np.allclose(out[i], (lambda c: c[:, ::-1] if f else c)(padded[i, dy : dy + 32, dx : dx + 32]))
        ]
        assert matches, f"image {i} is not a crop of its padded image"
        flips += matches[0][2]
        offsets.add(matches[0][:2])
    assert 16 <= flips <= 48  # p = 0.5 of 64 (4 sigma)
    assert len(offsets) > 20  # offsets spread over the 81 possible


def test_epoch_permutation_is_a_permutation_that_changes_per_epoch():
    key = jax.random.PRNGKey(0)
    p0 = np.asarray(cifar.epoch_permutation(key, 0, 100))
    p1 = np.asarray(cifar.epoch_permutation(key, 1, 100))
    np.testing.assert_array_equal(np.sort(p0), np.arange(100))
    assert not np.array_equal(p0, p1)
    np.testing.assert_array_equal(p0, cifar.epoch_permutation(key, 0, 100))
