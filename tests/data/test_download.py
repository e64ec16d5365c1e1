"""patjax.data.download against a real HTTP server on the loopback address: success, the failures a
network and an archive can produce, and what each leaves in the cache (nothing partial)."""

import fcntl
import hashlib
import http.server
import io
import os
import pathlib
import shutil
import subprocess
import sys
import tarfile
import threading
import time

import numpy as np
import pytest
from conftest import train_run

from patjax.core.errors import UserError
from patjax.data import cifar, download

REPO = pathlib.Path(__file__).resolve().parents[2]


class Served:
    """What the test server serves (path -> (behaviour, body)) and the requests it received."""

    def __init__(self, httpd):
        self.routes = {}
        self.requests = []
        self.stop = threading.Event()
        self._httpd = httpd

    def add(self, path, body, behaviour="ok"):
        self.routes[path] = (behaviour, body)
        return f"http://127.0.0.1:{self._httpd.server_address[1]}{path}"


@pytest.fixture
def server(monkeypatch):
    for var in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("no_proxy", "*")

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            served.requests.append(self.path)
            behaviour, body = served.routes.get(self.path, ("missing", b""))
            if behaviour == "missing":
                self.send_error(404, "Not Found")
                return
            if behaviour == "hang":  # accepts the connection, never answers (until teardown)
                served.stop.wait(10)
                return
            if behaviour == "stall":  # answers, sends part of the body, then goes silent
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body[: len(body) // 2])
                self.wfile.flush()
                served.stop.wait(10)
                return
            self.send_response(200)
            # "truncated": announces more than it sends, then closes the connection.
            extra = 1000 if behaviour == "truncated" else 0
            self.send_header("Content-Length", str(len(body) + extra))
            self.end_headers()
            if behaviour == "slow":  # long enough for a second downloader to arrive meanwhile
                for start in range(0, len(body), max(1, len(body) // 8)):
                    self.wfile.write(body[start : start + max(1, len(body) // 8)])
                    self.wfile.flush()
                    time.sleep(0.1)
            else:
                self.wfile.write(body)

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    served = Served(httpd)
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield served
    served.stop.set()
    httpd.shutdown()
    httpd.server_close()
    thread.join(5)


def records(dataset, labels, images):
    """The official binary records: [coarse label,] label, then the R, G and B planes."""
    out = b""
    for label, image in zip(labels, images):
        head = bytes([label]) if dataset == "cifar10" else bytes([label % 20, label])
        out += head + image.transpose(2, 0, 1).tobytes()
    return out


def synthetic(dataset, seed=0):
    """{archive member: bytes} in the official layout, and the test split's labels and images."""
    rng = np.random.default_rng(seed)
    top_dir = download.ARCHIVES[dataset][3]
    files, test = {}, None
    for name in download.EXPECTED_FILES[dataset]:
        labels = rng.integers(0, cifar.NUM_CLASSES[dataset], 3).tolist()
        images = rng.integers(0, 256, (3, 32, 32, 3), dtype=np.uint8)
        files[f"{top_dir}/{name}"] = records(dataset, labels, images)
        if name.startswith("test"):
            test = (labels, images)
    files[f"{top_dir}/batches.meta.txt" if dataset == "cifar10" else f"{top_dir}/fine_label_names.txt"] = b"a\nb\n"
    return files, test


def tar_gz(files, extra=()):
    """A .tar.gz of `files` ({name: bytes}, under a directory entry) then the TarInfos in `extra`."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for top in sorted({name.split("/")[0] for name in files}):
            info = tarfile.TarInfo(top)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
        for name, body in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(body)
            tar.addfile(info, io.BytesIO(body))
        for info, body in extra:
            tar.addfile(info, io.BytesIO(body) if body is not None else None)
    return buffer.getvalue()


def md5(blob):
    return hashlib.md5(blob).hexdigest()


def assert_clean(cache_dir, *allowed):
    """No partial dataset directory, no .part file, no temporary directory: at most the lock."""
    left = set(os.listdir(cache_dir)) if os.path.isdir(cache_dir) else set()
    assert left <= {download.LOCK_NAME, *allowed}, left


def one_line_error(call, *fragments):
    with pytest.raises(UserError) as info:
        call()
    message = str(info.value)
    assert "\n" not in message, message
    for fragment in fragments:
        assert fragment in message, message
    return message


def everything_under(path):
    return sorted(str(p) for p in pathlib.Path(path).rglob("*"))


@pytest.mark.parametrize("dataset", ["cifar10", "cifar100"])
def test_download_extracts_the_official_layout_and_the_loader_reads_it(
    server, tmp_path, capsys, dataset, records_per_file
):
    records_per_file(3)  # synthetic archives: 3 records a file
    files, (labels, images) = synthetic(dataset)
    blob = tar_gz(files)
    url = server.add("/archive.tar.gz", blob)
    cache = str(tmp_path / "cache")
    assert download.ensure_dataset(dataset, cache, url=url, md5=md5(blob), timeout=5) == cache
    top_dir = download.ARCHIVES[dataset][3]
    for name, body in files.items():
        assert (tmp_path / "cache" / name).read_bytes() == body
    assert_clean(cache, top_dir)
    split = cifar.load_split(dataset, "test", cache)
    np.testing.assert_array_equal(split.labels, labels)
    np.testing.assert_array_equal(split.images, images)
    stderr = capsys.readouterr().err
    assert f"downloading {download.DISPLAY_NAMES[dataset]}" in stderr
    assert f"{download.DISPLAY_NAMES[dataset]} is in {os.path.join(cache, top_dir)}" in stderr
    # Present: no network at all, whatever the URL.
    assert download.ensure_dataset(dataset, cache, url=server.add("/gone", b"", "missing")) == cache
    assert server.requests == ["/archive.tar.gz"]


def test_wrong_checksum_is_refused(server, tmp_path):
    files, _ = synthetic("cifar10")
    url = server.add("/archive.tar.gz", tar_gz(files))
    cache = str(tmp_path / "cache")
    one_line_error(
        lambda: download.ensure_dataset("cifar10", cache, url=url, md5="0" * 32, progress=False),
        "md5",
        "0" * 32,
        "download it yourself into DIR (holding cifar-10-batches-bin/) and pass --data_dir=DIR to patjax-evaluate",
    )
    assert_clean(cache)


def test_truncated_transfer_is_refused(server, tmp_path):
    files, _ = synthetic("cifar10")
    blob = tar_gz(files)
    url = server.add("/archive.tar.gz", blob, "truncated")
    cache = str(tmp_path / "cache")
    one_line_error(
        lambda: download.ensure_dataset("cifar10", cache, url=url, md5=md5(blob), progress=False),
        "cut short",
        f"{len(blob)} of {len(blob) + 1000} bytes",
    )
    assert_clean(cache)


def test_http_404_is_one_line(server, tmp_path):
    url = server.add("/nothing-here.tar.gz", b"", "missing")
    cache = str(tmp_path / "cache")
    one_line_error(
        lambda: download.ensure_dataset("cifar10", cache, url=url, progress=False),
        f"could not download CIFAR-10 from {url} (HTTP Error 404: Not Found)",
        "PATJAX_DATA_DIR",
    )
    assert_clean(cache)


@pytest.mark.parametrize("behaviour", ["hang", "stall"])
def test_a_server_that_hangs_times_out(server, tmp_path, behaviour):
    url = server.add("/archive.tar.gz", tar_gz(synthetic("cifar10")[0]), behaviour)
    cache = str(tmp_path / "cache")
    start = time.monotonic()
    one_line_error(
        lambda: download.ensure_dataset("cifar10", cache, url=url, timeout=1, progress=False),
        "timed out",
        "1 s timeout",
    )
    assert time.monotonic() - start < 5
    assert_clean(cache)


def test_nothing_listens_is_one_line(tmp_path):
    import socket

    with socket.socket() as probe:  # a port that was free a moment ago, and nobody listens on it
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    cache = str(tmp_path / "cache")
    one_line_error(
        lambda: download.ensure_dataset(
            "cifar10", cache, url=f"http://127.0.0.1:{port}/a.tar.gz", timeout=2, progress=False
        ),
        "could not download CIFAR-10",
    )
    assert_clean(cache)


def evil_member(kind, outside):
    """A TarInfo (and body) that would write outside the extraction directory if extracted."""
    if kind == "dotdot":
        info = tarfile.TarInfo("../../evil.bin")
    elif kind == "dotdot-inside-top-dir":
        info = tarfile.TarInfo("cifar-10-batches-bin/../../../evil.bin")
    elif kind == "absolute":
        info = tarfile.TarInfo(str(outside / "evil.bin"))
    elif kind == "outside-top-dir":
        info = tarfile.TarInfo("elsewhere/evil.bin")
    elif kind == "symlink":  # a link out, then a file written through it
        link = tarfile.TarInfo("cifar-10-batches-bin/out")
        link.type, link.linkname = tarfile.SYMTYPE, str(outside)
        through = tarfile.TarInfo("cifar-10-batches-bin/out/evil.bin")
        through.size = 4
        return [(link, None), (through, b"evil")]
    elif kind == "hardlink":
        info = tarfile.TarInfo("cifar-10-batches-bin/hard")
        info.type, info.linkname = tarfile.LNKTYPE, str(outside / "victim.txt")
        return [(info, None)]
    info.size = 4
    return [(info, b"evil")]


@pytest.mark.parametrize(
    "kind", ["dotdot", "dotdot-inside-top-dir", "absolute", "outside-top-dir", "symlink", "hardlink"]
)
def test_an_archive_member_escaping_the_cache_is_refused(server, tmp_path, kind):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim.txt").write_bytes(b"keep me")
    cache_parent = tmp_path / "deep" / "er"  # so that ../../ from the extraction lands in tmp_path
    cache_parent.mkdir(parents=True)
    cache = str(cache_parent / "cache")
    files, _ = synthetic("cifar10")
    blob = tar_gz(files, evil_member(kind, outside))
    url = server.add("/archive.tar.gz", blob)
    before = everything_under(tmp_path)
    one_line_error(lambda: download.ensure_dataset("cifar10", cache, url=url, md5=md5(blob), progress=False), "refused")
    assert_clean(cache)
    after = [p for p in everything_under(tmp_path) if not p.startswith(cache)]
    assert after == [p for p in before if not p.startswith(cache)]
    assert not list(tmp_path.rglob("evil.bin"))
    assert (outside / "victim.txt").read_bytes() == b"keep me"


def test_an_archive_without_the_expected_files_is_refused(server, tmp_path):
    files, _ = synthetic("cifar10")
    del files["cifar-10-batches-bin/test_batch.bin"]
    blob = tar_gz(files)
    url = server.add("/archive.tar.gz", blob)
    cache = str(tmp_path / "cache")
    one_line_error(
        lambda: download.ensure_dataset("cifar10", cache, url=url, md5=md5(blob), progress=False),
        "lacks cifar-10-batches-bin/test_batch.bin",
    )
    assert_clean(cache)


def test_an_interrupt_removes_the_temporary_files_and_propagates(server, tmp_path, monkeypatch):
    files, _ = synthetic("cifar10")
    blob = tar_gz(files)
    url = server.add("/archive.tar.gz", blob)

    class InterruptedBar:  # Ctrl-C arrives while the archive streams in
        def __init__(self, **kwargs):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def update(self, n):
            raise KeyboardInterrupt

    monkeypatch.setattr(download, "tqdm", InterruptedBar)
    cache = str(tmp_path / "cache")
    with pytest.raises(KeyboardInterrupt):
        download.ensure_dataset("cifar10", cache, url=url, md5=md5(blob))
    assert_clean(cache)


def test_leftovers_of_a_killed_download_are_removed(server, tmp_path):
    files, _ = synthetic("cifar10")
    blob = tar_gz(files)
    url = server.add("/archive.tar.gz", blob)
    cache = tmp_path / "cache"
    (cache / ".download-x1.extract" / "cifar-10-batches-bin").mkdir(parents=True)
    (cache / ".download-x2.part").write_bytes(b"partial")
    download.ensure_dataset("cifar10", str(cache), url=url, md5=md5(blob), progress=False)
    assert_clean(str(cache), "cifar-10-batches-bin")


def test_an_incomplete_dataset_directory_is_not_touched(server, tmp_path):
    cache = tmp_path / "cache"
    (cache / "cifar-10-batches-bin").mkdir(parents=True)
    (cache / "cifar-10-batches-bin" / "test_batch.bin").write_bytes(b"mine")
    url = server.add("/archive.tar.gz", b"")
    one_line_error(
        lambda: download.ensure_dataset("cifar10", str(cache), url=url, progress=False), "remove it and run again"
    )
    assert server.requests == []
    assert (cache / "cifar-10-batches-bin" / "test_batch.bin").read_bytes() == b"mine"


@pytest.mark.slow
def test_two_processes_share_one_download(server, tmp_path, records_per_file):
    records_per_file(3)  # synthetic archives: 3 records a file
    files, _ = synthetic("cifar10")
    blob = tar_gz(files)
    url = server.add("/archive.tar.gz", blob, "slow")
    cache = tmp_path / "cache"
    cache.mkdir()
    code = (
        "import sys; from patjax.data import download; "
        "print(download.ensure_dataset('cifar10', sys.argv[1], url=sys.argv[2], md5=sys.argv[3], "
        "progress=False))"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    # The test holds the lock until both processes wait on it, so that they contend for certain.
    lock_fd = os.open(cache / download.LOCK_NAME, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX)
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", code, str(cache), url, md5(blob)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(2)
        ]
        for proc in procs:
            assert proc.stderr.readline().startswith("waiting for another process downloading into")
    finally:
        os.close(lock_fd)
    outputs = [p.communicate(timeout=60) for p in procs]
    for proc, (out, err) in zip(procs, outputs):
        assert proc.returncode == 0, err
        assert out.strip() == str(cache)
    assert sorted("downloading CIFAR-10" in err for _, err in outputs) == [False, True]
    assert server.requests == ["/archive.tar.gz"]
    assert cifar.load_split("cifar10", "train", str(cache)).labels.shape == (15,)
    assert_clean(str(cache), "cifar-10-batches-bin")


def test_without_tarfile_data_filter_the_own_checks_still_guard(server, tmp_path, monkeypatch, records_per_file):
    """Python < 3.10.12 / 3.11.4 has no tarfile.data_filter."""
    records_per_file(3)  # synthetic archives: 3 records a file
    monkeypatch.delattr(tarfile, "data_filter")
    files, (labels, _) = synthetic("cifar10")
    blob = tar_gz(files)
    download.ensure_dataset(
        "cifar10", str(tmp_path / "good"), url=server.add("/good", blob), md5=md5(blob), progress=False
    )
    np.testing.assert_array_equal(cifar.load_split("cifar10", "test", str(tmp_path / "good")).labels, labels)
    outside = tmp_path / "outside"
    outside.mkdir()
    evil = tar_gz(files, evil_member("symlink", outside))
    one_line_error(
        lambda: download.ensure_dataset(
            "cifar10", str(tmp_path / "bad"), url=server.add("/bad", evil), md5=md5(evil), progress=False
        ),
        "is a link; refused",
    )
    assert_clean(str(tmp_path / "bad"))
    assert list(outside.iterdir()) == []


def test_a_lock_file_that_cannot_be_opened_is_one_line(tmp_path):
    (tmp_path / download.LOCK_NAME).mkdir()  # a directory: os.open fails even for root
    one_line_error(
        lambda: download.ensure_dataset("cifar10", str(tmp_path), url="http://127.0.0.1:9/none", progress=False),
        "cannot open",
        download.LOCK_NAME,
        "PATJAX_CACHE_DIR",
    )


def test_unknown_dataset_is_one_line(tmp_path):
    one_line_error(lambda: download.ensure_dataset("mnist", str(tmp_path)), "unknown dataset 'mnist'")


def test_every_dataset_has_an_archive_and_the_files_the_loader_reads():
    assert set(download.ARCHIVES) == set(download.SPLIT_FILES) == set(cifar.NUM_CLASSES)
    for dataset, (url, digest, size, top_dir) in download.ARCHIVES.items():
        assert url.startswith("https://") and len(digest) == 32 and size > 100e6
    # The official archives' layouts (https://www.cs.toronto.edu/~kriz/cifar.html), by hand.
    assert download.ARCHIVES["cifar10"][3] == "cifar-10-batches-bin"
    assert download.ARCHIVES["cifar100"][3] == "cifar-100-binary"
    assert {k: list(v) for k, v in download.SPLIT_FILES["cifar10"].items()} == {
        "train": [f"data_batch_{i}.bin" for i in range(1, 6)],
        "test": ["test_batch.bin"],
    }
    assert {k: list(v) for k, v in download.SPLIT_FILES["cifar100"].items()} == {
        "train": ["train.bin"],
        "test": ["test.bin"],
    }


def test_default_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("PATJAX_CACHE_DIR", str(tmp_path / "explicit"))
    assert download.default_cache_dir() == str(tmp_path / "explicit")
    monkeypatch.delenv("PATJAX_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert download.default_cache_dir() == str(tmp_path / "xdg" / "patjax" / "data")
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert download.default_cache_dir() == str(tmp_path / "home" / ".cache" / "patjax" / "data")


@pytest.mark.slow
def test_training_with_no_data_folder_downloads_into_the_cache_and_finds_it_after(
    server, tmp_path, monkeypatch, records_per_file
):
    """The quickstart's path with no data_dir: nothing beside the checkout, nothing cached, so
    the first load downloads (here from the loopback server); the next run finds the cache."""
    records_per_file(3)  # synthetic archives: 3 records a file
    from patjax.run import config as config_lib

    files, _ = synthetic("cifar10")
    # Enough training records for a batch: every data_batch gets 3, so 15 in all.
    blob = tar_gz(files)
    url = server.add("/cifar-10-binary.tar.gz", blob)
    monkeypatch.setitem(download.ARCHIVES, "cifar10", (url, md5(blob), len(blob), "cifar-10-batches-bin"))
    monkeypatch.delenv("PATJAX_DATA_DIR", raising=False)
    monkeypatch.setenv("PATJAX_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(cifar, "_search_roots", lambda: [str(tmp_path / "checkout" / "repo")])
    assert cifar.find_data_dir() is None
    cfg = config_lib.default_config()
    cfg.model, cfg.batch_size, cfg.num_train_steps, cfg.langevin.steps = "small_cnn", 4, 1, 1
    cfg.log_test_examples, cfg.eval.batch_size, cfg.progress_bar = 3, 3, False
    train_run(cfg, str(tmp_path / "run"))
    assert server.requests == ["/cifar-10-binary.tar.gz"]
    assert cifar.find_data_dir() == str(tmp_path / "cache")  # found there from now on
    train_run(cfg, str(tmp_path / "run2"))
    assert server.requests == ["/cifar-10-binary.tar.gz"]  # not downloaded again


@pytest.mark.slow
def test_the_command_line_without_data_or_network_ends_in_one_line(server, tmp_path):
    """main.py from a checkout with no data beside it and an empty cache: the download it tries
    (a mirror on the loopback address serving an archive that is not the official one) fails,
    and the run ends in one line that says what to do, leaving no partial cache or workdir."""
    files, _ = synthetic("cifar10")
    mirror = server.add("/cifar-10-binary.tar.gz", tar_gz(files)).rsplit("/", 1)[0]
    checkout = tmp_path / "elsewhere" / "checkout"
    shutil.copytree(REPO / "patjax", checkout / "patjax", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "configs", checkout / "configs")
    shutil.copy(REPO / "main.py", checkout / "main.py")
    env = {k: v for k, v in os.environ.items() if k not in ("PATJAX_DATA_DIR",) and "proxy" not in k.lower()}
    env.update(
        PATJAX_CACHE_DIR=str(tmp_path / "cache"), PATJAX_CIFAR_MIRROR=mirror, PYTHONPATH=str(checkout), no_proxy="*"
    )
    out = subprocess.run(
        [sys.executable, "main.py", "--config=configs/quickstart.py", "--workdir=runs/quickstart"],
        cwd=checkout,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 2, out.stderr
    errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in out.stderr, out.stderr
    assert "could not download CIFAR-10" in errors[0] and "expected c32a1d4ab5d03f1284b67883e8d87530" in errors[0]
    assert "--config.data_dir=DIR" in errors[0] and "PATJAX_DATA_DIR" in errors[0]
    assert_clean(str(tmp_path / "cache"))
    assert not (checkout / "runs" / "quickstart").exists()  # no workdir was left behind
