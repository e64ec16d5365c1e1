"""Downloads CIFAR-10/100 in the official binary layout into a cache directory.

A new user without a data folder gets the datasets by themselves: `ensure_dataset` fetches the
official binary archive from the CIFAR page, checks its md5, and extracts it so that the cache
directory holds `cifar-10-batches-bin/` or `cifar-100-binary/`, the layout that
`patjax.data.cifar._load_binary` reads (`SPLIT_FILES`).

Why by hand: tensorflow-datasets needs TensorFlow for its first download and preparation,
and torchvision would pull in torch; the standard library (urllib, hashlib, tarfile, fcntl)
does it in about a hundred lines.

What a reader of the cache can rely on:
- `<cache_dir>/<top_dir>` appears only complete: the archive is downloaded and extracted
  beside it under temporary names and moved into place with one rename;
- the archive's md5 is checked before anything is extracted, and every member is checked
  (no absolute paths, no `..`, no links, nothing outside `<top_dir>/`);
- any failure leaves no temporary file or directory behind and raises a one-line `UserError`;
- two processes filling the same cache take turns on `<cache_dir>/.download.lock`; the second
  finds the data in place and downloads nothing.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import http.client
import os
import posixpath
import shutil
import sys
import tarfile
import tempfile
import urllib.error
import urllib.request
import zlib
from collections.abc import Iterator
from typing import BinaryIO

from tqdm import tqdm

from patjax.core import locks
from patjax.core.errors import UserError, one_line

# dataset: (url, md5, size in bytes, directory the archive extracts to). The size only sets
# the progress bar's total when the server sends no Content-Length; it never accepts a file.
ARCHIVES = {
    "cifar10": (
        "https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz",
        "c32a1d4ab5d03f1284b67883e8d87530",
        170_052_171,
        "cifar-10-batches-bin",
    ),
    "cifar100": (
        "https://www.cs.toronto.edu/~kriz/cifar-100-binary.tar.gz",
        "03b5dce01913d631647c71ecec9e9cb8",
        168_513_733,
        "cifar-100-binary",
    ),
}

# The files of each split inside the archive's directory: what `patjax.data.cifar` reads, and what a
# complete download holds (`EXPECTED_FILES`). Here rather than in patjax.data.cifar, which imports this module.
SPLIT_FILES = {
    "cifar10": {"train": tuple(f"data_batch_{i}.bin" for i in range(1, 6)), "test": ("test_batch.bin",)},
    "cifar100": {"train": ("train.bin",), "test": ("test.bin",)},
}
EXPECTED_FILES = {dataset: split["train"] + split["test"] for dataset, split in SPLIT_FILES.items()}

DISPLAY_NAMES = {"cifar10": "CIFAR-10", "cifar100": "CIFAR-100"}

LOCK_NAME = ".download.lock"
_TEMP_PREFIX = ".download-"  # temporary archive (.part) and extraction directory (.extract)
_CHUNK = 1 << 20


def default_cache_dir() -> str:
    """$PATJAX_CACHE_DIR, else $XDG_CACHE_HOME/patjax/data, else ~/.cache/patjax/data."""
    if os.environ.get("PATJAX_CACHE_DIR"):
        return os.path.expanduser(os.environ["PATJAX_CACHE_DIR"])
    cache_home = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache_home, "patjax", "data")


def is_present(dataset: str, cache_dir: str, split: str | None = None) -> bool:
    """Whether `cache_dir` holds every file of `dataset`'s `split` (None: of both splits) that the
    loader reads."""
    top_dir = ARCHIVES[dataset][3]
    wanted = EXPECTED_FILES[dataset] if split is None else SPLIT_FILES[dataset][split]
    return all(os.path.isfile(os.path.join(cache_dir, top_dir, f)) for f in wanted)


def ensure_dataset(
    dataset: str,
    cache_dir: str,
    *,
    url: str | None = None,
    md5: str | None = None,
    timeout: float = 60.0,
    progress: bool = True,
) -> str:
    """Returns `cache_dir` once it holds `dataset` in the official binary layout.

    Downloads and extracts the archive if needed, from `$PATJAX_CIFAR_MIRROR` (a directory URL
    holding the official archive names) if set, else the CIFAR page (`url`, `md5` override
    `ARCHIVES`; the md5 is the published one whatever the source); `timeout`
    bounds the wait for each network operation, not the whole transfer. Raises UserError.
    """
    if dataset not in ARCHIVES:
        raise UserError(f"cannot download unknown dataset {dataset!r}; choose one of {sorted(ARCHIVES)}")
    cache_dir = os.path.expanduser(cache_dir)
    if is_present(dataset, cache_dir):
        return cache_dir
    default_url, default_md5, size, top_dir = ARCHIVES[dataset]
    mirror = os.environ.get("PATJAX_CIFAR_MIRROR")  # a local copy of the CIFAR page's archives
    if mirror:
        default_url = f"{mirror.rstrip('/')}/{posixpath.basename(default_url)}"
    url, md5 = url or default_url, (md5 or default_md5).lower()
    try:
        os.makedirs(cache_dir, exist_ok=True)
    except OSError as error:
        raise UserError(
            f"cannot create the data cache {cache_dir!r} ({_reason(error, timeout)}); "
            "set PATJAX_CACHE_DIR to a writable directory"
        ) from None
    with _download_lock(cache_dir):
        if is_present(dataset, cache_dir):  # another process downloaded it while we waited
            return cache_dir
        target = os.path.join(cache_dir, top_dir)
        if os.path.lexists(target):
            raise UserError(
                f"{target} exists but lacks some of {', '.join(EXPECTED_FILES[dataset])}; "
                "remove it and run again to download it afresh"
            )
        _remove_leftovers(cache_dir)
        print(f"downloading {DISPLAY_NAMES[dataset]} ({size / 1e6:.0f} MB) from {url} to {cache_dir}", file=sys.stderr)
        _download_and_extract(dataset, cache_dir, url, md5, size if url == default_url else None, timeout, progress)
        print(f"{DISPLAY_NAMES[dataset]} is in {target}", file=sys.stderr)
    return cache_dir


def _download_and_extract(
    dataset: str, cache_dir: str, url: str, md5: str, size: int | None, timeout: float, progress: bool
) -> None:
    """Fills `cache_dir/<top_dir>` in one rename; removes its temporary files however it ends
    (Ctrl-C included, which propagates as KeyboardInterrupt)."""
    top_dir = ARCHIVES[dataset][3]
    archive = extracted = None
    try:
        try:
            fd, archive = tempfile.mkstemp(dir=cache_dir, prefix=_TEMP_PREFIX, suffix=".part")
            with os.fdopen(fd, "wb") as out:
                _fetch(dataset, url, md5, size, timeout, progress, out)
            extracted = tempfile.mkdtemp(dir=cache_dir, prefix=_TEMP_PREFIX, suffix=".extract")
            _extract(dataset, url, archive, extracted)
            os.replace(os.path.join(extracted, top_dir), os.path.join(cache_dir, top_dir))
        except OSError as error:  # the cache itself: permissions, a full disk
            raise UserError(
                f"could not write {DISPLAY_NAMES[dataset]} into {cache_dir} "
                f"({_reason(error, timeout)}); free space or set PATJAX_CACHE_DIR"
            ) from None
    finally:
        if archive is not None:
            with contextlib.suppress(FileNotFoundError):
                os.remove(archive)
        if extracted is not None:
            shutil.rmtree(extracted, ignore_errors=True)


def _fetch(dataset: str, url: str, md5: str, size: int | None, timeout: float, progress: bool, out: BinaryIO) -> None:
    """Streams `url` into `out`, refusing a short transfer or a wrong md5."""
    digest = hashlib.md5(usedforsecurity=False)  # an integrity check, allowed on FIPS systems
    received, expected_length = 0, None
    request = urllib.request.Request(url, headers={"User-Agent": "patjax"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            length = response.headers.get("Content-Length", "")
            expected_length = int(length) if length.isdigit() else None
            with tqdm(
                total=expected_length or size,
                unit="B",
                unit_scale=True,
                desc=DISPLAY_NAMES[dataset],
                disable=not progress,
            ) as bar:
                while chunk := response.read(_CHUNK):
                    out.write(chunk)
                    digest.update(chunk)
                    received += len(chunk)
                    bar.update(len(chunk))
    except (OSError, http.client.HTTPException) as error:  # URLError, HTTPError, timeouts, resets
        raise _download_error(dataset, url, _reason(error, timeout)) from None
    # http.client returns a short body without an error when the server closes early.
    if expected_length is not None and received != expected_length:
        raise _download_error(dataset, url, f"transfer cut short: {received} of {expected_length} bytes")
    if digest.hexdigest() != md5:
        raise _download_error(dataset, url, f"md5 {digest.hexdigest()} of {received} bytes, expected {md5}")


def _extract(dataset: str, url: str, archive: str, destination: str) -> None:
    """Extracts the archive into `destination` after checking every member."""
    top_dir = ARCHIVES[dataset][3]
    try:
        with tarfile.open(archive, "r:gz") as tar:
            members = tar.getmembers()
            for member in members:
                problem = _member_problem(member, top_dir)
                if problem:
                    raise _download_error(dataset, url, f"archive member {member.name!r} {problem}; refused")
            if hasattr(tarfile, "data_filter"):  # Python >= 3.10.12 / 3.11.4: a second safeguard
                tar.extractall(destination, members=members, filter="data")
            else:  # the checks above stand in for the filter; drop setuid and similar bits
                for member in members:
                    member.mode = 0o755 if member.isdir() else 0o644
                tar.extractall(destination, members=members)
    except (tarfile.TarError, EOFError, zlib.error) as error:
        raise _download_error(dataset, url, f"damaged archive: {_reason(error, 0)}") from None
    missing = [f for f in EXPECTED_FILES[dataset] if not os.path.isfile(os.path.join(destination, top_dir, f))]
    if missing:
        raise _download_error(dataset, url, f"archive lacks {top_dir}/{', '.join(missing)}")


def _member_problem(member: tarfile.TarInfo, top_dir: str) -> str | None:
    """Why `member` may not be extracted (None if it may): only plain files and directories
    under `top_dir/`, so an archive cannot write outside the extraction directory."""
    name = member.name
    if posixpath.isabs(name):
        return "has an absolute path"
    if ".." in name.split("/"):
        return "contains '..'"
    if member.issym() or member.islnk():
        return "is a link"
    if not (member.isfile() or member.isdir()):
        return "is not a plain file or directory"
    normalized = posixpath.normpath(name)
    if normalized != top_dir and not normalized.startswith(top_dir + "/"):
        return f"is outside {top_dir}/"
    return None


@contextlib.contextmanager
def _download_lock(cache_dir: str) -> Iterator[None]:
    """Holds `cache_dir`/.download.lock (`locks.lock`: the kernel releases it however the process
    ends, so a dead downloader never blocks the next one), saying on stderr when it waits."""
    path = os.path.join(cache_dir, LOCK_NAME)
    remedy = "set PATJAX_CACHE_DIR to a writable local directory"  # flock fails on some network filesystems
    with locks.lock(path, "a download", remedy=remedy) as held:
        if held.held:
            yield
            return
    print(f"waiting for another process downloading into {cache_dir}", file=sys.stderr)
    with locks.lock(path, "a download", wait=True, remedy=remedy):
        yield


def _remove_leftovers(cache_dir: str) -> None:
    """Removes temporary files of a downloader killed outright (kill -9, power loss); safe since
    only the holder of the lock, which we are, creates them."""
    for path in glob.glob(os.path.join(glob.escape(cache_dir), _TEMP_PREFIX + "*")):
        if path.endswith(".part") and os.path.isfile(path):
            os.remove(path)
        elif path.endswith(".extract") and os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)


def _download_error(dataset: str, url: str, reason: str) -> UserError:
    name, top_dir = DISPLAY_NAMES[dataset], ARCHIVES[dataset][3]
    return UserError(
        f"could not download {name} from {url} ({reason}); download it yourself into DIR (holding {top_dir}/) and "
        "pass --data_dir=DIR to patjax-evaluate or patjax-experiments, --config.data_dir=DIR to patjax-train, "
        "or set PATJAX_DATA_DIR=DIR for any command"
    )


def _reason(error: BaseException, timeout: float) -> str:
    """`error` on one line; a timeout says so, with its limit."""
    cause = getattr(error, "reason", None)  # URLError wraps the socket's error
    if isinstance(error, TimeoutError) or isinstance(cause, TimeoutError):
        return f"timed out: no data within the {timeout:g} s timeout"
    shown = error if isinstance(error, urllib.error.HTTPError) or cause is None else cause
    return one_line(shown) or type(error).__name__
