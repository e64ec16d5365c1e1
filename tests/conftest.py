"""Shared test fixtures. Tests run on the CPU, without network, on tiny models."""

import pathlib

import jax
import numpy as np
import pytest

from patjax.data import cifar, download

# Compile time dominates a CPU test suite; numerics are unchanged by skipping XLA's
# heavier passes, which is all these tests look at.
jax.config.update("jax_disable_most_optimizations", True)

REPO = pathlib.Path(__file__).resolve().parents[1]


def pytest_collection_modifyitems(items):
    """A stress, reference, past-windows or long test is slow too, so that `-m "not slow"` (which
    replaces the default `-m` of pyproject.toml) leaves them out as the default run does."""
    for item in items:
        if any(item.get_closest_marker(m) for m in ("stress", "reference", "past_windows", "long")):
            item.add_marker(pytest.mark.slow)


def find_data_dir():
    """cifar.find_data_dir(): ../shared/data (CIFAR in the official binary layout) or $PATJAX_DATA_DIR."""
    found = cifar.find_data_dir()
    if found:
        return found
    raise RuntimeError(
        "real CIFAR data not found: set PATJAX_DATA_DIR to a directory holding "
        "cifar-10-batches-bin/ (the project's tests use ../shared/data)"
    )


@pytest.fixture(scope="session")
def data_dir():
    return find_data_dir()


def train_run(cfg, workdir, **kwargs):
    """What main.py does with a config: the typed settings built at the door, then training
    (`train.train_run`)."""
    from patjax.run import config, train

    settings = config.train_settings(cfg)
    return train.train_run(settings, workdir, **kwargs)


@pytest.fixture
def records_per_file(monkeypatch):
    """records_per_file(n): the loader reads synthetic CIFAR files of n records each where it
    expects the official files' counts (`cifar.OFFICIAL_RECORDS`, checked in test_inputs.py)."""

    def allow(n):
        counts = {dataset: dict.fromkeys(names, n) for dataset, names in cifar.OFFICIAL_RECORDS.items()}
        monkeypatch.setattr(cifar, "OFFICIAL_RECORDS", counts)

    return allow


FAKE_RECORDS = 64  # images per file of `fake_data_dir`: 320 to train on, 64 to test on


@pytest.fixture(scope="session")
def fake_cifar10(tmp_path_factory) -> str:
    """A folder of CIFAR-10's official binary files (label byte, 3,072 pixel bytes per record) of
    FAKE_RECORDS random records each, written once per session."""
    root = tmp_path_factory.mktemp("fake_data")
    folder = root / download.ARCHIVES["cifar10"][3]  # cifar-10-batches-bin
    folder.mkdir()
    rng = np.random.default_rng(0)
    for names in download.SPLIT_FILES["cifar10"].values():
        for name in names:
            labels = rng.integers(0, 10, (FAKE_RECORDS, 1), dtype=np.uint8)
            pixels = rng.integers(0, 256, (FAKE_RECORDS, 3072), dtype=np.uint8)
            np.concatenate([labels, pixels], axis=1).tofile(folder / name)
    return str(root)


@pytest.fixture
def fake_data_dir(fake_cifar10, records_per_file):
    """A data_dir of CIFAR-10's layout and shapes and random content, for the tests that need
    images of the right shape rather than CIFAR's (training and resuming a tiny run, a suite's
    bookkeeping): a fraction of a second to read instead of the real files' 180 MB."""
    records_per_file(FAKE_RECORDS)
    return fake_cifar10
