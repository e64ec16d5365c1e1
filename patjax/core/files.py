"""Files that a reader (a person, another worker, a later command) sees whole or not at all:
atomic writes, strict JSON (NaN and inf as null), JSON, .npz and safetensors reads whose damage
is one line, and a file's content hash."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import tempfile
import zipfile
import zlib
from typing import Any, Callable, Optional

import numpy as np
from safetensors import SafetensorError, safe_open

from patjax.core.errors import UserError, one_line


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


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# The mode an ordinary open() gives a new file. Read once, at import, before any thread runs:
# reading the umask sets it for a moment, which would change the mode of files that other
# threads create meanwhile.
_FILE_MODE = 0o666 & ~_umask()
TEMP_SUFFIX = ".tmp"


def temporary_path(path: str, suffix: str = TEMP_SUFFIX) -> str:
    """A new empty file beside `path` whose name no other writer holds (`tempfile.mkstemp`):
    `.NAME.RANDOM` + suffix, hidden, so that a listing or a glob of the folder's data (`*.png`,
    kept models' `step_N.safetensors`) never takes a leftover for data."""
    folder, name = os.path.split(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{name}.", suffix=suffix)
    os.close(fd)
    return tmp


def atomic(path: str, write: Callable[[str], None], suffix: str = TEMP_SUFFIX, replace: bool = True) -> None:
    """write(temporary path), then rename it to path: a reader (a person, another worker) sees
    the old file or the new one whole, never a half-written one.

    Every writer has a temporary file of its own (`temporary_path`), so two writers of one path
    never write into one file: the last rename wins, and the file is one writer's whole. A
    temporary file left by a writer that was killed is never written again and never blocks
    the next writer; one that fails otherwise is removed. `suffix`: what `write` needs the name
    to end with (numpy adds .npz to a name without it). replace=False: never replace an
    existing file, also one that another writer creates meanwhile (the rename is then a hard
    link, which fails if the name exists): FileExistsError, and nothing is written.
    """
    tmp = temporary_path(path, suffix)
    try:
        write(tmp)
        os.chmod(tmp, _FILE_MODE)  # mkstemp's file is private (0600); the result is an ordinary file
        if replace:
            os.replace(tmp, path)
        else:
            _publish_without_replacing(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)
        raise


def _publish_without_replacing(tmp: str, path: str) -> None:
    """Moves tmp to path unless path exists (then FileExistsError), as one step where the
    filesystem has hard links; where it has none, checked first and renamed."""
    try:
        os.link(tmp, path)
    except FileExistsError:
        raise
    except OSError:  # no hard links on this filesystem (some FUSE and FAT mounts)
        if os.path.lexists(path):
            raise FileExistsError(errno.EEXIST, "file exists", path) from None
        os.replace(tmp, path)
        return
    os.remove(tmp)


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


def read_npz(path: str, remedy: str) -> Optional[dict[str, np.ndarray]]:
    """The arrays of a .npz file, all read now, or None if there is no such file. A damaged file
    (cut short, another format, a member whose checksum fails, unreadable) is one line naming it
    and `remedy`. Nothing is unpickled: a .npz that patjax writes holds no objects."""
    if not os.path.isfile(path):
        return None
    try:
        archive = np.load(path, allow_pickle=False)
        if not isinstance(archive, np.lib.npyio.NpzFile):
            raise ValueError("a single array, not an archive of named arrays")
        with archive:
            return {k: archive[k] for k in archive.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as error:
        raise UserError(f"{path} is damaged (not a readable .npz: {one_line(error)[:120]}); {remedy}") from None


def read_safetensors(path: str, arrays: bool = True) -> tuple[dict[str, str], dict[str, np.ndarray]]:
    """(metadata, arrays) of a .safetensors file; arrays=False reads its header alone (arrays {}).
    A file that is damaged (truncated, not safetensors, a dtype numpy lacks) or cannot be read is
    one line naming it, the same wherever patjax reads such a file."""
    try:
        with safe_open(path, framework="numpy") as f:
            metadata = dict(f.metadata() or {})
            tensors = {k: f.get_tensor(k) for k in f.keys()} if arrays else {}
    except (SafetensorError, OSError, ValueError, TypeError) as error:  # TypeError: bfloat16 in numpy
        raise UserError(f"{path} is not a readable safetensors file ({one_line(error)[:160]})") from None
    return metadata, tensors


def sha256(path: str) -> str:
    """The hex sha256 of a file's bytes: what it holds, wherever it lies and whatever its name."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


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
