"""Locks: one writer per workdir, one worker per suite run, one writer of a suite's report."""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import os
import socket
import time

from patjax.core.errors import UserError


@dataclasses.dataclass(frozen=True)
class Lock:
    held: bool  # whether this process holds the lock
    holder: str  # who holds it: `role (pid P on HOST, since TIME)` as its holder wrote it


@contextlib.contextmanager
def lock(path: str, role: str, *, wait: bool = False, remedy: str = ""):
    """Yields a `Lock` on the file `path` (created if missing; `lock` never removes it).

    The lock is an flock on an open file, which the kernel releases when its process ends
    however it ends (kill -9 included), so a lock left by a dead process never blocks anyone;
    the file itself stays. Two opens of the file conflict even within one process.
    wait=False: does not wait; if another holds the lock, yields held=False and the holder's
    line. wait=True: waits until the lock is free. The holder writes its line into the file
    after locking, so that those it turns away can say who holds it.
    Removing the file would be unsafe (a process holding the old file and one locking a new
    file of the same name would both hold "the" lock), hence it stays.
    A file that cannot be opened or locked is a one-line UserError ending in `remedy`, what
    the user can do (without one: nothing for an open, a filesystem with flock for a lock).
    """
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as error:
        raise UserError(f"cannot open {path}: {error.strerror or error}" + (f"; {remedy}" if remedy else "")) from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 4096, 0).decode(errors="replace").strip() or "another process"
            yield Lock(held=False, holder=holder)
            return
        except OSError as error:  # e.g. Lustre mounted without flock support
            raise UserError(
                f"cannot lock {path}: {error.strerror or error}; "
                f"{remedy or 'the filesystem must support flock (docs/cluster.md)'}"
            ) from None
        os.ftruncate(fd, 0)
        me = f"{role} (pid {os.getpid()} on {socket.gethostname()}, since {time.strftime('%Y-%m-%d %H:%M:%S')})"
        os.pwrite(fd, (me + "\n").encode(), 0)
        yield Lock(held=True, holder=me)
    finally:
        os.close(fd)  # releases the flock


WORKDIR_LOCK = ".lock"  # in a workdir: held by the process that writes it


@contextlib.contextmanager
def exclusive(workdir: str, role: str, remedy: str = "wait for it to finish, or use another --workdir"):
    """Holds `workdir`/.lock for a process that writes, replaces or deletes the workdir's files
    (a trainer, an evaluation, a suite worker keeping models, a handover; docs/workdir.md lists
    them all).

    A second writer is refused in one line naming the holder and ending in `remedy`; a lock
    left by a dead process never blocks the resume (`lock`).
    """
    created = not os.path.isdir(workdir)
    os.makedirs(workdir, exist_ok=True)
    path = os.path.join(workdir, WORKDIR_LOCK)
    with lock(path, role) as held:
        if not held.held:
            raise UserError(f"{workdir!r} is in use by {held.holder}; {remedy}")
        try:
            yield
        finally:
            if created and os.listdir(workdir) == [WORKDIR_LOCK]:  # failed before writing anything
                os.remove(path)
                os.rmdir(workdir)
