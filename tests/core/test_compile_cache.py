"""The persistent compilation cache every command line points JAX at (`core.compile_cache`):
where it goes, and the switches a cold measurement and a user's own JAX setting use."""

import json
import os
import subprocess
import sys

import pytest
from conftest import REPO

# One process for every case (importing JAX is the slow part): each case sets the environment and
# JAX's settings as a fresh process would find them, then asks enable().
PROBE = """
import json, os, sys, jax
from patjax.core import compile_cache
out = []
for env, jax_dir in json.loads(sys.argv[1]):
    for k in ("PATJAX_COMPILATION_CACHE", "PATJAX_COMPILATION_CACHE_DIR"):
        os.environ.pop(k, None)
    os.environ.update(env)
    jax.config.update("jax_enable_compilation_cache", True)
    jax.config.update("jax_compilation_cache_dir", jax_dir)  # JAX_COMPILATION_CACHE_DIR, read at import
    path = compile_cache.enable()
    out.append([path, jax.config.jax_compilation_cache_dir, jax.config.jax_enable_compilation_cache])
print(json.dumps(out))
"""


@pytest.mark.slow
def test_the_cache_directory_and_its_switches(tmp_path):
    xdg, mine, own = str(tmp_path / "xdg"), str(tmp_path / "mine"), str(tmp_path / "jax_own")
    cases = [
        ({}, None),  # the default
        ({"PATJAX_COMPILATION_CACHE_DIR": mine}, None),
        ({}, own),  # a directory the user gave JAX is left alone
        ({"PATJAX_COMPILATION_CACHE": "off"}, own),  # a cold measurement: nothing read, nothing written
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PATJAX_COMPILATION", "JAX_COMPILATION"))}
    env.update(PYTHONPATH=str(REPO), XDG_CACHE_HOME=xdg)
    done = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(cases)], capture_output=True, text=True, env=env, check=True
    )
    default, chosen, users, off = json.loads(done.stdout.strip().splitlines()[-1])
    assert default == [os.path.join(xdg, "patjax", "jax")] * 2 + [True] and os.path.isdir(default[0])
    assert chosen == [mine, mine, True] and os.path.isdir(mine)
    assert users == [own, own, True]
    assert off == [None, None, False]
