"""Files that a reader (a person, another worker, a later command) sees whole or not at all:
atomic writes, strict JSON (NaN and inf as null), and JSON reads whose damage is one line."""

from __future__ import annotations

import json
import os
from typing import Any, Callable, Optional

import numpy as np

from patjax.errors import UserError, one_line


def json_safe(obj):
    """obj with NaN and +-inf (also as numpy scalars) replaced by None, for strict JSON."""
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    if isinstance(obj, (float, np.floating)):
        return float(obj) if np.isfinite(obj) else None
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.bool_):
        return bool(obj)
    return obj


def atomic(path: str, write: Callable[[str], None], suffix: str = ".tmp") -> None:
    """write(temporary path), then rename it to path: a reader (a person, another worker) sees
    the old file or the new one whole, never a half-written one."""
    tmp = path + suffix
    write(tmp)
    os.replace(tmp, path)


def read_json(path: str, remedy: str) -> Optional[dict]:
    """The JSON object in `path`, or None if there is no such file. A damaged file (truncated,
    not JSON, not an object, unreadable) is one line naming it and `remedy`."""
    if not os.path.isfile(path):
        return None
    try:
        with open(path) as f:
            obj = json.load(f)
    except (OSError, ValueError) as error:
        raise UserError(f"{path} is damaged ({one_line(error)[:120]}); {remedy}") from None
    if not isinstance(obj, dict):
        raise UserError(f"{path} is damaged (not a JSON object); {remedy}")
    return obj


def write_json(path: str, obj) -> Any:
    """Writes strict JSON (NaN/inf as null) atomically; returns what it wrote."""
    obj = json_safe(obj)

    def write(tmp):
        with open(tmp, "w") as f:
            json.dump(obj, f, indent=2, allow_nan=False)

    atomic(path, write)
    return obj


def drop_cut_line(path: str) -> None:
    """Truncates a JSON-lines file after its last newline: a line cut short when a writer died
    while appending it would otherwise run into the next writer's first line."""
    if not os.path.isfile(path):
        return
    with open(path, "rb+") as f:
        data = f.read()
        if data and not data.endswith(b"\n"):
            f.truncate(data.rfind(b"\n") + 1)


def append_json_line(path: str, obj) -> None:
    """Appends obj as one strict-JSON line, first dropping a line a dead writer left cut short
    (`drop_cut_line`). Callers serialise writers (an flock) where several may append at once."""
    drop_cut_line(path)
    with open(path, "a") as f:
        f.write(json.dumps(json_safe(obj), allow_nan=False) + "\n")


def read_json_lines(path: str, remedy: str) -> list:
    """The JSON objects of a JSON-lines file ([] if there is no such file); blank lines are
    skipped, and so is a last line without its newline: one being appended, or cut short by a
    writer that died (`append_json_line` drops it before the next append). Any other damaged
    line is one line naming the file, the line and `remedy`."""
    if not os.path.isfile(path):
        return []
    out = []
    with open(path) as f:
        for number, line in enumerate(f, 1):
            if not line.strip() or not line.endswith("\n"):
                continue
            try:
                obj = json.loads(line)
            except ValueError:
                obj = None
            if not isinstance(obj, dict):
                raise UserError(f"{path} line {number} is damaged (not a JSON object); {remedy}")
            out.append(obj)
    return out


def write_text(path: str, text: str) -> None:
    def write(tmp):
        with open(tmp, "w") as f:
            f.write(text)

    atomic(path, write)
