"""JSON-lines files that several sittings or workers append to: a line cut short by a writer that
died is dropped before the next append, and a damaged line is one line naming it."""

import json
import os
import subprocess
import sys

import pytest

from patjax import files
from patjax.errors import UserError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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
