"""CIFAR-10/100: loading into device-resident uint8 arrays, shuffling and augmentation in jit.

Where the data come from (`resolve_data_dir`, the same search for every command line):
- `config.data_dir=PATH`: a directory in the official binary layout (`cifar-10-batches-bin/`,
  `cifar-100-binary/`);
- no data_dir: `$PATJAX_DATA_DIR`, else a `shared/data` beside the checkout, else the per-user
  cache (`download.default_cache_dir()`), if one holds the split being loaded (an evaluation
  reads the test split alone: a folder without the training files serves it); otherwise the
  official archive is downloaded into the cache once (`patjax.data.download`: checksum, safe
  extraction);
- `config.data_dir=tfds`: tensorflow-datasets, whose `tfds.data_source` reads prepared
  array_record files without TensorFlow; preparing them the first time needs TensorFlow
  (the extra `[tfds-prepare]`); tensorflow-datasets itself is the extra `[tfds]`.

The whole split lives on the device as uint8 (150 MB for CIFAR training sets); each step
gathers its batch by index from a per-epoch permutation and augments it inside the compiled
step (`augment`), so no host input pipeline can become the bottleneck.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from patjax.core.errors import UserError
from patjax.data import download

NUM_CLASSES = {"cifar10": 10, "cifar100": 100}
CHANNELS = {"cifar10": 3, "cifar100": 3}  # RGB
NUM_TRAIN = {"cifar10": 50_000, "cifar100": 50_000}  # images in the official training splits

# dataset: (label byte offset, record length) of the official binary records; their files are
# `download.SPLIT_FILES`', in the archive's directory (`download.ARCHIVES`).
_RECORD_LAYOUT = {"cifar10": (0, 3073), "cifar100": (1, 3074)}  # cifar100: the fine label
# Records in each official file (the CIFAR page: five training batches and one test batch of
# 10,000 images for CIFAR-10; 50,000 and 10,000 for CIFAR-100), so each file's exact size is
# known: 30,730,000 bytes for every CIFAR-10 file, 153,700,000 and 30,740,000 for CIFAR-100's.
# The page publishes the archive's md5 (checked by `download`), no checksum per file.
OFFICIAL_RECORDS = {
    "cifar10": {name: 10_000 for split in download.SPLIT_FILES["cifar10"].values() for name in split},
    "cifar100": {"train.bin": 50_000, "test.bin": 10_000},
}


@dataclasses.dataclass(frozen=True)
class Split:
    images: np.ndarray  # (N, 32, 32, 3) uint8
    labels: np.ndarray  # (N,) int32

    def __len__(self):
        return len(self.labels)


TFDS = "tfds"  # the data_dir that selects tensorflow-datasets


def find_data_dir(dataset: str = "cifar10", split: Optional[str] = None) -> Optional[str]:
    """$PATJAX_DATA_DIR, else a shared/data beside the checkout or beside one of its parents, or
    beside the working directory, else the per-user download cache: the first that holds the
    files of the dataset's `split` (None: of both splits); None if none does. An evaluation
    asks for the test split alone, so a folder without the training files serves it."""
    candidates = [os.environ.get("PATJAX_DATA_DIR")]
    for base in _search_roots():
        while True:
            candidates.append(os.path.join(os.path.dirname(base), "shared", "data"))
            if os.path.dirname(base) == base:
                break
            base = os.path.dirname(base)
    candidates.append(download.default_cache_dir())
    for candidate in candidates:
        if candidate and download.is_present(dataset, candidate, split):
            return os.path.abspath(candidate)
    return None


def _search_roots() -> list[str]:
    """Where `find_data_dir` looks for a shared/data beside: the checkout, the working directory."""
    checkout = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # patjax/data/ -> ..
    return [checkout, os.getcwd()]


def resolve_data_dir(dataset: str, data_dir: Optional[str], split: Optional[str] = None) -> Optional[str]:
    """The directory to read `dataset`'s `split` from (None: tensorflow-datasets): data_dir as
    given, 'tfds' for tensorflow-datasets, or, with none, `find_data_dir`, else the download
    cache after downloading the dataset into it (one line on stderr says where)."""
    if data_dir == TFDS:
        return None
    if data_dir:
        return data_dir
    return find_data_dir(dataset, split) or download.ensure_dataset(dataset, download.default_cache_dir())


def check_dataset(name: str):
    if name not in NUM_CLASSES:
        raise UserError(f"unknown dataset {name!r}; choose one of {sorted(NUM_CLASSES)}")


def load_split(dataset: str, split: str, data_dir: Optional[str]) -> Split:
    """Loads 'train' or 'test' of cifar10/cifar100 as numpy uint8 images and int32 labels."""
    check_dataset(dataset)
    if split not in ("train", "test"):
        raise UserError(f"unknown split {split!r}")
    folder = resolve_data_dir(dataset, data_dir, split)
    if folder is None:
        return _load_tfds(dataset, split)
    return _load_binary(dataset, split, folder)


def _load_binary(dataset: str, split: str, data_dir: str) -> Split:
    label_offset, record = _RECORD_LAYOUT[dataset]
    folder = os.path.join(os.path.expanduser(data_dir), download.ARCHIVES[dataset][3])
    files = [os.path.join(folder, f) for f in download.SPLIT_FILES[dataset][split]]
    missing = [f for f in files if not os.path.isfile(f)]
    if missing:
        raise UserError(
            f"data_dir {data_dir!r} lacks the {dataset} {split} split: missing "
            f"{', '.join(os.path.relpath(m, data_dir) for m in missing)}"
        )
    images, labels = [], []
    for path in files:
        try:
            raw = np.fromfile(path, dtype=np.uint8)
        except OSError as error:  # a file this user may not read, say: its reason, not a traceback
            raise UserError(f"{path}: cannot be read ({error.strerror or type(error).__name__})") from None
        expected = OFFICIAL_RECORDS[dataset][os.path.basename(path)]
        if raw.size != expected * record:
            # A file cut short or grown (a copy interrupted, batches concatenated) would train or
            # evaluate on another set of images without a word.
            raise UserError(
                f"{path} has {raw.size:,} bytes ({raw.size / record:,.2f} records of {record}); the official "
                f"file has {expected:,} records, {expected * record:,} bytes: not the {dataset} data set"
            )
        raw = raw.reshape(-1, record)
        labels.append(raw[:, label_offset].astype(np.int32))
        # 1,024 red, 1,024 green, 1,024 blue bytes, each plane row-major 32x32 -> NHWC.
        images.append(raw[:, record - 3072 :].reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1))
    split_data = Split(np.ascontiguousarray(np.concatenate(images)), np.concatenate(labels))
    if split_data.labels.max() >= NUM_CLASSES[dataset]:
        raise UserError(f"{folder} holds labels >= {NUM_CLASSES[dataset]}: not {dataset}")
    return split_data


def _tensorflow_available() -> bool:
    try:
        import tensorflow  # noqa: F401  (optional: the extra patjax[tfds-prepare])
    except ImportError:
        return False
    return True


def _load_tfds(dataset: str, split: str) -> Split:
    try:
        import tensorflow_datasets as tfds  # here: slow to import, optional, read only with data_dir='tfds'
    except ImportError:
        raise UserError(
            "data_dir='tfds' needs tensorflow-datasets (the [tfds] extra: pip install tensorflow-datasets), "
            "or leave data_dir unset to read the official binary archives"
        ) from None

    try:
        source = tfds.data_source(dataset, split=split, download=False)
    except Exception as not_prepared:  # TFDS raises several types for "not prepared here"
        builder = tfds.builder(dataset, file_format="array_record")
        if builder.is_prepared():
            raise UserError(f"tensorflow-datasets could not read {dataset}: {not_prepared}")
        if not _tensorflow_available():
            raise UserError(
                f"{dataset} is not prepared in {builder.data_dir} and preparing it with "
                "tensorflow-datasets needs TensorFlow (the [tfds-prepare] extra: pip install tensorflow-cpu), "
                "or leave data_dir unset to download the official binary archives"
            )
        builder.download_and_prepare()
        source = builder.as_data_source(split=split)
    images = np.empty((len(source), 32, 32, 3), np.uint8)
    labels = np.empty((len(source),), np.int32)
    for i in range(len(source)):
        example = source[i]
        images[i] = example["image"]
        labels[i] = example["label"]
    return Split(images, labels)


# ---------------------------------------------------------------------------------------
# In-jit batch assembly.


def epoch_permutation(key: jax.Array, epoch, num_examples: int) -> jax.Array:
    """The order of the training set in `epoch`: a pure function of (key, epoch)."""
    return jax.random.permutation(jax.random.fold_in(key, epoch), num_examples)


def augment(key: jax.Array, images_uint8: jax.Array) -> jax.Array:
    """Appendix E augmentation on a uint8 batch: Pad(4, reflect), random 32x32 crop, flip p=0.5.

    Returns float32 images in [0, 1].
    """
    batch, height, width, _ = images_uint8.shape
    images = to_float(images_uint8)
    padded = jnp.pad(images, ((0, 0), (4, 4), (4, 4), (0, 0)), mode="reflect")
    crop_key, flip_key = jax.random.split(key)
    offsets = jax.random.randint(crop_key, (batch, 2), 0, 9)  # 0..8 inclusive, as RandomCrop
    flips = jax.random.bernoulli(flip_key, 0.5, (batch,))

    def crop_and_flip(image, offset, flip):
        crop = jax.lax.dynamic_slice(image, (offset[0], offset[1], 0), (height, width, image.shape[-1]))
        return jnp.where(flip, crop[:, ::-1, :], crop)

    return jax.vmap(crop_and_flip)(padded, offsets, flips)


def to_float(images_uint8: jax.Array) -> jax.Array:
    return images_uint8.astype(jnp.float32) / 255.0
