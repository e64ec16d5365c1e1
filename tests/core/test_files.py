"""Files several writers meet on: JSON-lines files that sittings or workers append to (a line cut
short by a writer that died is dropped before the next append, a damaged line is one line naming
it), and files replaced whole by two real processes at once (one writer's whole content, no
temporary file left) or by a writer killed halfway (its leftover blocks no one and reads as no data),
and files published without replacing, which appear whole or not at all as replaced ones do."""

import contextlib
import errno
import glob
import json
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from patjax.core import files
from patjax.core.errors import UserError
from patjax.run import kept_models

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_append_after_a_cut_line_keeps_the_whole_lines(tmp_path):
    path = str(tmp_path / "log.jsonl")
    with open(path, "w") as f:
        f.write('{"a": 1}\n{"b": 2}\n{"c": 3, "d"')  # the last writer died mid-line
    files.append_json_line(path, {"e": float("nan"), "f": 5})
    with open(path) as f:
        assert f.read() == '{"a": 1}\n{"b": 2}\n{"e": null, "f": 5}\n'
    assert files.read_json_lines(path, "fix it") == [{"a": 1}, {"b": 2}, {"e": None, "f": 5}]


def test_read_skips_a_cut_last_line_that_the_next_append_drops(tmp_path):
    # A worker that died mid-append must not stop the next one's report before it appends.
    path = str(tmp_path / "log.jsonl")
    with open(path, "w") as f:
        f.write('{"a": 1}\n{"b": 2')
    assert files.read_json_lines(path, "fix it") == [{"a": 1}]
    with open(path, "w") as f:
        f.write('{"a": 1}\n{"b": 2}')  # whole JSON, but the writer had not finished the line
    assert files.read_json_lines(path, "fix it") == [{"a": 1}]


def test_read_skips_blank_lines_and_names_a_damaged_one(tmp_path):
    path = str(tmp_path / "log.jsonl")
    assert files.read_json_lines(path, "fix it") == []
    with open(path, "w") as f:
        f.write('{"a": 1}\n\n{"b": 2}\n')
    assert files.read_json_lines(path, "fix it") == [{"a": 1}, {"b": 2}]
    for damage in ('{"b": 2\n', "[1, 2]\n", "<<<<<<< HEAD\n"):
        with open(path, "w") as f:
            f.write('{"a": 1}\n' + damage + '{"c": 3}\n')
        with pytest.raises(UserError, match=r"log.jsonl line 2 is damaged .*; fix it$"):
            files.read_json_lines(path, "fix it")


@pytest.mark.slow
def test_a_damaged_invocation_log_is_one_line_from_the_suite_command(tmp_path):
    """A suite's report reads DIR/invocations.jsonl: a damaged line there is an error of one line
    and exit 2 (no traceback), and the report files are left as they were."""
    workdir = tmp_path / "suite"
    workdir.mkdir()
    with open(workdir / "invocations.jsonl", "w") as f:
        f.write(json.dumps({"wall_s": 1.0}) + "\n" + '{"wall_s": 2.0, "fini\n')
    result = subprocess.run(
        [sys.executable, "-m", "patjax.experiments", "--suite=smoke_cpu", f"--workdir={workdir}", "--report_only"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr
    assert lines[-1].startswith("error: ") and "invocations.jsonl line 2 is damaged" in lines[-1]
    assert "Traceback" not in result.stderr
    assert not os.path.exists(workdir / "results.md") and not os.path.exists(workdir / "results.json")


# A writer of PATH through files.atomic that writes half of its content, waits at a file barrier
# until every writer has written half (so that all their temporary files exist at once), then
# writes the rest. argv: path, barrier folder, writers, its letter, replace (1/0).
HALF_AND_WAIT = """
import os, sys, time
from patjax.core import files
path, barrier, writers, me, replace = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5] == "1"
content = (me * 1_000_000).encode()

def write(tmp):
    with open(tmp, "wb") as f:
        f.write(content[:500_000])
        f.flush()
        open(os.path.join(barrier, me), "w").close()
        deadline = time.time() + 60
        while len(os.listdir(barrier)) < writers:
            if time.time() > deadline:
                sys.exit("barrier: the other writer never came")
            time.sleep(0.01)
        f.write(content[500_000:])

try:
    files.atomic(path, write, replace=replace)
except FileExistsError:
    print("refused: exists", flush=True)
    sys.exit(3)
print("wrote", flush=True)
"""


def writer(path, barrier, writers, me, replace=True):
    env = {**os.environ, "PYTHONPATH": REPO}
    return subprocess.Popen(
        [sys.executable, "-c", HALF_AND_WAIT, path, barrier, str(writers), me, "1" if replace else "0"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def umask():
    mask = os.umask(0)
    os.umask(mask)
    return mask


@pytest.mark.slow
@pytest.mark.parametrize("replace", [True, False])
def test_two_writers_of_one_path_at_once_leave_one_whole_file_and_no_temporary(tmp_path, replace):
    folder, barrier = tmp_path / "out", tmp_path / "barrier"
    folder.mkdir()
    barrier.mkdir()
    path = str(folder / "results.json")
    procs = {me: writer(path, str(barrier), 2, me, replace) for me in "AB"}
    outcomes = {}
    for me, proc in procs.items():
        out, err = proc.communicate(timeout=120)
        outcomes[me] = (proc.returncode, out.strip(), err[-2000:])
    assert sorted(os.listdir(barrier)) == ["A", "B"]  # both were halfway at once
    with open(path, "rb") as f:
        final = f.read()
    assert final in (b"A" * 1_000_000, b"B" * 1_000_000)  # one writer's whole content, never a mix
    assert os.listdir(folder) == ["results.json"], os.listdir(folder)  # no temporary file left
    assert os.stat(path).st_mode & 0o777 == 0o666 & ~umask()  # an ordinary file, as open() makes
    if replace:  # both succeed; the last rename wins
        assert [outcomes[me][:2] for me in "AB"] == [(0, "wrote")] * 2, outcomes
    else:  # exactly one creates the file, the other is refused and writes nothing
        winner = final[:1].decode()
        loser = "B" if winner == "A" else "A"
        assert outcomes[winner][:2] == (0, "wrote"), outcomes
        assert outcomes[loser][:2] == (3, "refused: exists"), outcomes


def no_hard_links(monkeypatch):
    """The filesystem of some FUSE and FAT mounts: os.link fails (EPERM) whatever the names."""

    def refuse(src, dst, *args, **kwargs):
        raise PermissionError(errno.EPERM, "Operation not permitted", src)

    monkeypatch.setattr(os, "link", refuse)


@pytest.mark.parametrize("hard_links", [True, False])
def test_publishing_without_replacing_moves_the_written_file_itself(tmp_path, monkeypatch, hard_links):
    """replace=False publishes the very file that `write` filled, by a name operation (a hard
    link or a rename): the final name appears with all of its content at once. A copy into the
    final name, even one that refuses an existing file, is a new file that a reader sees grow."""
    if not hard_links:
        no_hard_links(monkeypatch)
    path = str(tmp_path / "results.json")
    written = {}

    def write(tmp):
        with open(tmp, "wb") as f:
            f.write(b"x" * 100_000)
        written["inode"] = os.stat(tmp).st_ino

    files.atomic(path, write, replace=False)
    st = os.stat(path)
    assert (st.st_ino, st.st_nlink) == (written["inode"], 1)  # the written file, its temporary name gone
    with open(path, "rb") as f:
        assert f.read() == b"x" * 100_000
    assert os.listdir(tmp_path) == ["results.json"]


@pytest.mark.parametrize("hard_links", [True, False])
def test_an_existing_file_is_left_as_it_was_when_replacing_is_refused(tmp_path, monkeypatch, hard_links):
    if not hard_links:
        no_hard_links(monkeypatch)
    path = tmp_path / "results.json"
    path.write_bytes(b"old")
    before = os.stat(path)
    with pytest.raises(FileExistsError):
        files.atomic(str(path), lambda tmp: open(tmp, "wb").write(b"new content"), replace=False)
    assert path.read_bytes() == b"old" and os.stat(path).st_ino == before.st_ino
    assert os.listdir(tmp_path) == ["results.json"]  # the refused writer's temporary is removed


@pytest.mark.parametrize("replace", [True, False])
def test_a_write_that_fails_halfway_publishes_nothing_and_leaves_no_temporary(tmp_path, replace):
    """A writer whose write fails after half its content (a full disk) leaves the folder as it
    found it: no final file holding the half, and no temporary file."""

    def write(tmp):
        with open(tmp, "wb") as f:
            f.write(b"half of it")
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        files.atomic(str(tmp_path / "results.json"), write, replace=replace)
    assert os.listdir(tmp_path) == []


def test_a_reader_never_sees_part_of_a_file_published_without_replacing(tmp_path):
    """A reader watching the final name while a large file is published (replace=False) finds
    no file or the whole file, never one that is still growing."""
    path, size = str(tmp_path / "big.bin"), 32 << 20
    sizes, done = set(), threading.Event()

    def watch():
        while not done.is_set():
            with contextlib.suppress(FileNotFoundError):
                sizes.add(os.stat(path).st_size)

    def write(tmp):
        with open(tmp, "wb") as f:
            f.write(b"\0" * size)

    reader = threading.Thread(target=watch)
    reader.start()
    try:
        files.atomic(path, write, replace=False)
        time.sleep(0.05)  # the reader sees the published file too
    finally:
        done.set()
        reader.join()
    assert sizes == {size}, sorted(sizes)[:5]


@pytest.mark.slow
def test_a_writer_killed_halfway_leaves_a_hidden_leftover_that_blocks_no_one(tmp_path):
    """A writer of a kept model killed in the middle (kill -9): its temporary file stays, is not
    read as a kept model, and the next writer of the same path writes it whole."""
    workdir, barrier = str(tmp_path / "run"), tmp_path / "barrier"
    os.makedirs(os.path.join(workdir, kept_models.MODELS_DIR))
    barrier.mkdir()
    path = kept_models.path(workdir, 2)
    killed = writer(path, str(barrier), 2, "K")  # waits for a second writer that never comes
    try:
        deadline = time.time() + 60
        while not (barrier / "K").exists():
            assert killed.poll() is None and time.time() < deadline, killed.communicate()
            time.sleep(0.01)
    finally:
        killed.send_signal(signal.SIGKILL)
        killed.wait()
    leftovers = os.listdir(os.path.join(workdir, kept_models.MODELS_DIR))
    assert len(leftovers) == 1 and leftovers[0].startswith(".step_000002.safetensors."), leftovers
    assert kept_models.steps(workdir) == []  # the half-written file is not a kept model
    assert glob.glob(os.path.join(workdir, kept_models.MODELS_DIR, "*")) == []
    params = {"Dense_0": {"kernel": np.arange(6, dtype=np.float32).reshape(2, 3)}}
    kept_models.save(workdir, 2, params, {}, {"model": "linear"})
    assert kept_models.steps(workdir) == [2]
    loaded, _, metadata = kept_models.load(workdir, 2, params, {})
    np.testing.assert_array_equal(loaded["Dense_0"]["kernel"], params["Dense_0"]["kernel"])
    assert metadata["model"] == "linear"
    assert sorted(os.listdir(os.path.join(workdir, kept_models.MODELS_DIR))) == sorted(
        [*leftovers, "step_000002.safetensors"]
    )
