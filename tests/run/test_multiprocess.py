"""Two real processes over jax.distributed (CPU, gloo collectives) against one process.

Each process runs the same script, as a launcher would start it; the coordinator is on
localhost. A watchdog kills every child and fails the test if the group does not finish.
"""

import json
import os
import socket
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from conftest import REPO

WATCHDOG_S = 300

PRELUDE = """
import json, os, sys, numpy as np
from patjax.core import devices
devices.initialize_distributed()
devices.use_cpu_cores_as_devices()
import jax
sys.path.insert(0, {tests!r})
from helpers import tiny_config
from conftest import train_run
from patjax.run import train, workdir as workdir_lib
out = {{}}

def leaves(state):
    return [np.asarray(x) for x in jax.tree.leaves(jax.device_get((state.params, state.batch_stats, state.opt_state)))]

def run(workdir, steps, **overrides):
    return train_run(tiny_config(data_dir={data_dir!r}, num_train_steps=steps, **overrides), workdir)

{body}
np.savez({out!r} + f".{{jax.process_index()}}.npz", **{{k: np.asarray(v) for k, v in out.items()}})
"""


def free_port():
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def launch(processes, body, tmp_path, data_dir, name):
    out = str(tmp_path / name)
    script = PRELUDE.format(tests=str(REPO / "tests"), data_dir=data_dir, body=textwrap.dedent(body), out=out)
    # JAX_DISABLE_MOST_OPTIMIZATIONS as conftest.py does in-process: compile time dominates.
    env = dict(os.environ, JAX_PLATFORMS="cpu", PATJAX_CPU_DEVICES="1", JAX_DISABLE_MOST_OPTIMIZATIONS="1")
    env.pop("XLA_FLAGS", None)
    if processes > 1:
        env.update(PATJAX_COORDINATOR=f"localhost:{free_port()}", PATJAX_NUM_PROCESSES=str(processes))
    children = [
        subprocess.Popen(
            [sys.executable, "-c", script],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=dict(env, PATJAX_PROCESS_ID=str(i)) if processes > 1 else env,
        )
        for i in range(processes)
    ]
    deadline = time.monotonic() + WATCHDOG_S
    try:
        for child in children:
            child.wait(timeout=max(1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        for child in children:
            child.kill()
        raise AssertionError(f"{processes} processes did not finish within {WATCHDOG_S} s (killed)")
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
    for i, child in enumerate(children):
        assert child.returncode == 0, f"process {i}: {child.stderr.read()[-3000:]}"
    return [dict(np.load(f"{out}.{i}.npz")) for i in range(processes)]


def leaves_of(result, prefix):
    return [
        result[k] for k in sorted((k for k in result if k.startswith(prefix)), key=lambda k: int(k.rsplit("_", 1)[1]))
    ]


@pytest.mark.slow
def test_methods_with_batch_statistics_in_their_attack_are_refused_on_several_cpu_processes(tmp_path, data_dir):
    body = f"""
        from patjax.core.errors import UserError
        cfg = tiny_config(data_dir={data_dir!r}, method="alp")
        try:
            train_run(cfg, {str(tmp_path / "alp")!r})
        except UserError as error:
            out["refused"] = "BatchNorm on batch statistics" in str(error)
        cfg.attack.bn_mode = "inference"
        from patjax.run import config
        train.check_collectives_pair_across_processes(config.train_settings(cfg).method)  # allowed
        """
    for result in launch(2, body, tmp_path, data_dir, "alp"):
        assert bool(result["refused"])
    assert not os.path.exists(tmp_path / "alp")  # refused before anything was written


@pytest.mark.slow
@pytest.mark.long
def test_two_processes_train_as_one_and_checkpoints_move_between_process_counts(tmp_path, data_dir):
    two_dir, one_dir = str(tmp_path / "two"), str(tmp_path / "one")
    two = launch(
        2,
        f"""
        s = run({two_dir!r}, 4)
        out.update({{f"final_{{i}}": x for i, x in enumerate(leaves(s))}})
        """,
        tmp_path,
        data_dir,
        "two",
    )
    one = launch(
        1,
        f"""
        s = run({one_dir!r}, 4)
        out.update({{f"final_{{i}}": x for i, x in enumerate(leaves(s))}})
        _, fns, r = workdir_lib.restore({two_dir!r})
        out.update({{f"restored_{{i}}": x for i, x in enumerate(leaves(r))}})
        """,
        tmp_path,
        data_dir,
        "one",
    )[0]
    # Both processes hold the same replicated state.
    for a, b in zip(leaves_of(two[0], "final_"), leaves_of(two[1], "final_"), strict=True):
        np.testing.assert_array_equal(a, b)
    # The same global batch on 2 processes x 1 device as on 1 process: equal up to the order
    # of float sums (gradients and BatchNorm statistics are all-reduced across processes).
    for a, b in zip(leaves_of(two[0], "final_"), leaves_of(one, "final_"), strict=True):
        np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-6)
    # A checkpoint written by 2 processes restores exactly in 1 ...
    for a, b in zip(leaves_of(one, "restored_"), leaves_of(two[0], "final_"), strict=True):
        np.testing.assert_array_equal(a, b)
    # ... and one written by 1 process resumes in 2.
    back = launch(
        2,
        f"""
        _, fns, r = workdir_lib.restore({one_dir!r})
        out.update({{f"restored_{{i}}": x for i, x in enumerate(leaves(r))}})
        s = run({one_dir!r}, 5, lr_decay_fractions=(0.6, 0.8))  # the 4-step run's milestones 3, 4 stay
        out["step"] = int(s.step)
        """,
        tmp_path,
        data_dir,
        "back",
    )
    for a, b in zip(leaves_of(back[1], "restored_"), leaves_of(one, "final_"), strict=True):
        np.testing.assert_array_equal(a, b)
    assert int(back[0]["step"]) == 5
    # One process wrote the workdir's files: one metrics line per logging point, one event file.
    lines = [json.loads(l) for l in open(os.path.join(two_dir, "metrics.jsonl"))]
    assert [l["step"] for l in lines] == [2, 4] and lines[-1]["devices"] == 2
    assert len(os.listdir(os.path.join(two_dir, "tensorboard"))) == 1
    assert sorted(os.listdir(os.path.join(two_dir, "checkpoints"))) == ["2", "4"]
    resumed = [json.loads(l)["step"] for l in open(os.path.join(one_dir, "metrics.jsonl"))]
    assert resumed == [2, 4, 5]
