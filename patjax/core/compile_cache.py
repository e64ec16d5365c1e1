"""JAX's persistent compilation cache, on by default for every command line.

An evaluation compiles each of its passes (AutoAttack's four attacks at a few batch widths, PGD,
PR), and on a CPU that compilation is a large share of a small evaluation's wall time; a second
evaluation of the same model shapes (another workdir of the same network, the same workdir at
another step) compiles the same programs again unless XLA's executables are kept on disk. JAX
keys its cache on the program, the devices, the flags and its own version, so an entry is reused
only where it is the same executable.

PATJAX_COMPILATION_CACHE=off turns it off (a cold measurement, benchmarks/timing.py);
PATJAX_COMPILATION_CACHE_DIR names the directory; a directory JAX was already given
(JAX_COMPILATION_CACHE_DIR, or jax.config) is left alone. Default: $XDG_CACHE_HOME/patjax/jax,
else ~/.cache/patjax/jax. JAX's own thresholds decide what is kept (programs that took at
least a second to compile), so the many tiny programs of a test run do not fill the disk.
"""

from __future__ import annotations

import os
from typing import Optional

import jax

OFF = ("off", "0", "false", "no")


def default_dir() -> str:
    cache_home = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache_home, "patjax", "jax")


def enable() -> Optional[str]:
    """Points JAX's persistent compilation cache at patjax's directory unless it is switched off
    or JAX already has one; returns the directory in use (None: no cache). Must run before the
    process's first compilation: JAX reads the setting once."""
    if os.environ.get("PATJAX_COMPILATION_CACHE", "").strip().lower() in OFF:
        jax.config.update("jax_compilation_cache_dir", None)
        jax.config.update("jax_enable_compilation_cache", False)
        return None
    if jax.config.jax_compilation_cache_dir:
        return jax.config.jax_compilation_cache_dir
    path = os.path.expanduser(os.environ.get("PATJAX_COMPILATION_CACHE_DIR") or default_dir())
    try:
        os.makedirs(path, exist_ok=True)
    except OSError:  # an unwritable home: compile as without a cache rather than fail the command
        return None
    jax.config.update("jax_compilation_cache_dir", path)
    return path
