"""Path flags checked for their kind: each command, and a comparison of models named by their
paths (`interop.sources`), checks its paths with these before it reads or writes anything, so a
path of the wrong kind is one line naming the flag, never a traceback from deep inside or a
command that succeeds having done nothing."""

from __future__ import annotations

import os

from patjax.core.errors import UserError


def existing_folder(flag: str, path: str) -> str:
    """A folder the command reads (a workdir, a data folder): it must exist."""
    if not os.path.exists(path):
        raise UserError(f"--{flag}={path}: no such folder")
    if not os.path.isdir(path):
        raise UserError(f"--{flag}={path}: is a file, not a folder")
    return path


def data_folder(flag: str, path: str, *names: str) -> str:
    """A data folder the command reads: an existing folder, or one of `names`, the sources a loader
    reads without a folder (`tfds`)."""
    return path if path in names else existing_folder(flag, path)


def existing_file(flag: str, path: str) -> str:
    """A file the command reads: it must exist and not be a folder."""
    if not os.path.exists(path):
        raise UserError(f"--{flag}={path}: no such file")
    if os.path.isdir(path):
        raise UserError(f"--{flag}={path}: is a folder, not a file")
    return path


def output_folder(flag: str, path: str) -> str:
    """A folder the command writes into: an existing folder, or one it can create."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise UserError(f"--{flag}={path}: is a file, not a folder")
    _creatable(flag, path, path)
    return path


def output_file(flag: str, path: str) -> str:
    """A file the command writes: not a folder, in a folder that exists or can be created."""
    if os.path.isdir(path):
        raise UserError(f"--{flag}={path}: is a folder; name the file to write")
    if os.path.islink(path) and not os.path.exists(path):  # writing would replace the link, not fill its target
        raise UserError(
            f"--{flag}={path}: is a symbolic link to {os.readlink(path)}, which does not exist; "
            "remove the link or name another file"
        )
    _creatable(flag, path, os.path.dirname(os.path.abspath(path)))
    return path


def _creatable(flag: str, value: str, folder: str) -> None:
    """The folder (of flag's value) exists, or its nearest existing ancestor is a folder this
    process may write in."""
    ancestor = os.path.abspath(folder)
    while not os.path.exists(ancestor):
        ancestor = os.path.dirname(ancestor)
    if not os.path.isdir(ancestor):
        raise UserError(f"--{flag}={value}: {ancestor} is a file, so nothing can be made under it")
    if ancestor != os.path.abspath(folder) and not os.access(ancestor, os.W_OK | os.X_OK):
        raise UserError(f"--{flag}={value}: cannot create it, {ancestor} is not writable")
