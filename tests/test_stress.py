"""Stress: every method trains on 2 CPU devices while other processes keep the cores busy.

Not part of the default run (it takes minutes; docs/device_layer.md has its wall times); run it with

  python -m pytest -q -s -m stress tests/test_stress.py   # PATJAX_STRESS_REPEATS=2 by default;
                                                          # PATJAX_STRESS_METHODS=alp,... limits the methods

With other processes on the cores one device of the two can run ahead of the other; when
XLA's intra-op thread pool is only as large as the core count, which `PJRT_NPROC=2` sets,
XLA then aborts the process (exit 134, "Termination timeout ... all reduce RendezvousKey"),
so this can fail (docs/device_layer.md: a race, not every run loses it):
  PJRT_NPROC=2 python -m pytest -q -m stress tests/test_stress.py
Each training runs under a watchdog, so a hang fails the test instead of stalling it.
"""

import collections
import os
import subprocess
import sys

import pytest
from conftest import REPO

from patjax import methods

pytestmark = pytest.mark.stress

WATCHDOG_S = 240  # several times a 3-step run's time under load (docs/device_layer.md)


def busy_loops(count):
    return [subprocess.Popen(["sh", "-c", "while :; do :; done"]) for _ in range(count)]


def test_every_method_trains_on_two_devices_while_the_cores_are_busy(tmp_path, data_dir):
    repeats = int(os.environ.get("PATJAX_STRESS_REPEATS", "2"))
    chosen = os.environ.get("PATJAX_STRESS_METHODS", "")  # e.g. alp,trades (default: all)
    names = chosen.split(",") if chosen else sorted(methods.REGISTRY)
    env = dict(os.environ, PATJAX_CPU_DEVICES="2")
    outcomes = collections.Counter()
    failures = []
    loops = busy_loops(2)
    try:
        for r in range(repeats):
            for method in names:
                workdir = tmp_path / f"{method}-{r}"
                cmd = [
                    sys.executable,
                    "main.py",
                    "--config=configs/quickstart.py",
                    f"--config.data_dir={data_dir}",
                    f"--workdir={workdir}",
                    f"--config.method={method}",
                    "--config.num_train_steps=3",
                    "--config.batch_size=32",
                    "--config.progress_bar=False",
                ]
                try:
                    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=WATCHDOG_S)
                except subprocess.TimeoutExpired:
                    outcomes["hung"] += 1
                    failures.append(f"{method} (repeat {r}): no exit within {WATCHDOG_S} s")
                    continue
                if proc.returncode == 0:
                    outcomes["ok"] += 1
                else:
                    outcomes[f"exit {proc.returncode}"] += 1
                    tail = [l for l in proc.stderr.splitlines() if "Termination timeout" in l or "error" in l]
                    failures.append(f"{method} (repeat {r}): exit {proc.returncode}: {(tail or [''])[-1][:200]}")
    finally:
        for p in loops:
            p.kill()
            p.wait()
    print(f"\nstress outcomes over {repeats} x {len(names)} runs: {dict(outcomes)}")
    assert not failures, "\n".join(failures)
