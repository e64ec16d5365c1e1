"""The workdir under failure: checkpoints across device counts, damaged checkpoints, one writer.

Device counts are fixed when JAX starts, so runs on 1 and 2 CPU devices are separate
processes; each writes what it computed to an .npz that the test compares.
"""

import json
import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from conftest import REPO, train_run
from helpers import tiny_config

from patjax.core.errors import UserError
from patjax.run import evaluation
from patjax.run import workdir as workdir_lib

# As conftest.py does in-process: compile time dominates these runs, numerics are unchanged.
FAST_COMPILE = {"JAX_DISABLE_MOST_OPTIMIZATIONS": "1"}

SCRIPT = """
import json, sys, numpy as np, jax
sys.path.insert(0, {tests!r})
from helpers import tiny_config
from conftest import train_run
from patjax.run import evaluation, train, workdir as workdir_lib
assert jax.device_count() == {devices}, jax.devices()
out = {{}}

def leaves(state):
    return [np.asarray(x) for x in jax.tree.leaves(jax.device_get((state.params, state.batch_stats, state.opt_state)))]

def run(workdir, steps, stop=None):
    cfg = tiny_config(data_dir={data_dir!r}, num_train_steps=steps)
    return train_run(cfg, workdir, stop_after_steps=stop)

{body}
np.savez({out!r}, **{{k: np.asarray(v) for k, v in out.items()}})
"""


def run_on(devices, body, tmp_path, data_dir, name):
    out = str(tmp_path / f"{name}.npz")
    script = SCRIPT.format(
        tests=str(REPO / "tests"), devices=devices, data_dir=data_dir, body=textwrap.dedent(body), out=out
    )
    env = dict(os.environ, PATJAX_CPU_DEVICES=str(devices), JAX_PLATFORMS="cpu", **FAST_COMPILE)
    env.pop("XLA_FLAGS", None)
    # devices.use_cpu_cores_as_devices is what every command line runs before JAX starts.
    script = "from patjax.core import devices; devices.use_cpu_cores_as_devices()\n" + script
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True, timeout=400
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return dict(np.load(out))


def leaves_of(result, prefix):
    return [
        result[k] for k in sorted((k for k in result if k.startswith(prefix)), key=lambda k: int(k.rsplit("_", 1)[1]))
    ]


@pytest.mark.slow
@pytest.mark.long
def test_checkpoints_restore_and_resume_on_another_device_count(tmp_path, data_dir):
    a, b, c = (str(tmp_path / n) for n in "abc")
    # On 2 devices: a stops after 2 of 4 steps; c trains 4 steps straight (the reference).
    two = run_on(
        2,
        f"""
        s = run({a!r}, 4, stop=2)
        out.update({{f"a2_{{i}}": x for i, x in enumerate(leaves(s))}})
        s = run({c!r}, 4)
        out.update({{f"c4_{{i}}": x for i, x in enumerate(leaves(s))}})
        r = evaluation.evaluate_workdir({a!r}, progress=False, evaluators=("clean",))
        out["a_clean"] = r["clean_accuracy"]
        """,
        tmp_path,
        data_dir,
        "two",
    )
    # The command line a user runs: a 2-device checkpoint evaluated on 1 device.
    env = dict(os.environ, PATJAX_CPU_DEVICES="1", **FAST_COMPILE)
    proc = subprocess.run(
        [sys.executable, "-m", "patjax.evaluate", f"--workdir={a}", "--evaluators=clean", "--overwrite"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    one_device_eval = json.load(open(os.path.join(a, "eval", "results.json")))
    assert one_device_eval["settings"]["devices"] == 1
    assert one_device_eval["clean_accuracy"] == pytest.approx(float(two["a_clean"]), abs=1e-12)
    # On 1 device: the library call restores the 2-device checkpoint exactly, resumes a to 4
    # steps, and b trains 2 steps for the other direction.
    one = run_on(
        1,
        f"""
        _, fns, s = workdir_lib.restore({a!r})
        out.update({{f"restored_{{i}}": x for i, x in enumerate(leaves(s))}})
        s = run({a!r}, 4)
        out.update({{f"a4_{{i}}": x for i, x in enumerate(leaves(s))}})
        s = run({b!r}, 4, stop=2)
        """,
        tmp_path,
        data_dir,
        "one",
    )
    for restored, saved in zip(leaves_of(one, "restored_"), leaves_of(two, "a2_"), strict=True):
        np.testing.assert_array_equal(restored, saved)
    back = run_on(
        2,
        f"""
        s = run({b!r}, 4)
        out.update({{f"b4_{{i}}": x for i, x in enumerate(leaves(s))}})
        """,
        tmp_path,
        data_dir,
        "back",
    )
    reference = leaves_of(two, "c4_")
    # Equal up to the order of float sums (BatchNorm statistics, gradients over the batch): after
    # 4 steps such differences reach a few 1e-6 on entries near 0, so the absolute tolerance is
    # scaled to each leaf's magnitude.
    for resumed in (leaves_of(one, "a4_"), leaves_of(back, "b4_")):
        for x, y in zip(resumed, reference, strict=True):
            np.testing.assert_allclose(x, y, rtol=2e-4, atol=1e-4 * float(np.max(np.abs(y))))


def truncate_largest_file(step_dir):
    files = [os.path.join(d, f) for d, _, fs in os.walk(step_dir) for f in fs]
    largest = max(files, key=os.path.getsize)
    with open(largest, "r+b") as f:
        f.truncate(os.path.getsize(largest) // 2)


@pytest.mark.slow
def test_damaged_newest_checkpoint_falls_back_with_one_warning(tmp_path, fake_data_dir, capfd):
    workdir = str(tmp_path / "run")
    cfg = tiny_config(data_dir=fake_data_dir)
    train_run(cfg, workdir)  # checkpoints at steps 2 and 4
    truncate_largest_file(os.path.join(workdir, "checkpoints", "4"))
    capfd.readouterr()

    _, _, state = workdir_lib.restore(workdir)
    assert int(state.step) == 2
    warnings = capfd.readouterr().err.strip().splitlines()
    assert len(warnings) == 1 and warnings[0].startswith("warning: checkpoint step 4 in ")
    assert "skipped; restored step 2" in warnings[0]
    assert os.path.isdir(os.path.join(workdir, "checkpoints", "4"))  # evaluation changes nothing

    state = train_run(cfg, workdir)  # resumes from 2, trains 3 and 4 again
    assert int(state.step) == 4
    warnings = [l for l in capfd.readouterr().err.splitlines() if l.startswith("warning:")]
    assert len(warnings) == 1 and "moved to " in warnings[0] and "restored step 2" in warnings[0]
    assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == ["2", "4"]
    assert len(os.listdir(os.path.join(workdir, "damaged_checkpoints"))) == 1
    _, _, state = workdir_lib.restore(workdir)  # the step saved again is intact
    assert int(state.step) == 4 and "warning" not in capfd.readouterr().err

    for step in ("2", "4"):  # nothing restorable: one error, no restart from step 0
        truncate_largest_file(os.path.join(workdir, "checkpoints", step))
    with pytest.raises(UserError, match="no checkpoint in .* could be restored"):
        train_run(cfg, workdir)
    assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == ["2", "4"]


HOLD_LOCK = """
import sys, time
from patjax.core import locks
with locks.exclusive(sys.argv[1], "a trainer"):
    print("held", flush=True)
    time.sleep(600)
"""


@pytest.mark.slow
@pytest.mark.long
def test_a_live_writer_blocks_a_second_one_and_a_killed_one_does_not(tmp_path, data_dir):
    workdir = str(tmp_path / "run")
    cfg = tiny_config(data_dir=data_dir, num_train_steps=2)
    train_run(cfg, workdir)
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, workdir], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        before = sorted(os.listdir(workdir))
        with pytest.raises(UserError) as error:
            train_run(tiny_config(data_dir=data_dir, num_train_steps=3, lr_decay_fractions=(2 / 3, 2 / 3)), workdir)
        message = str(error.value)
        assert "is in use by a trainer (pid " in message and "\n" not in message
        with pytest.raises(UserError, match="is in use by a trainer"):
            evaluation.evaluate_workdir(workdir, progress=False, evaluators=("clean",))
        assert sorted(os.listdir(workdir)) == before
        # The command line says the same in one line, exit 2.
        proc = subprocess.run(
            [
                sys.executable,
                "main.py",
                "--config=configs/quickstart.py",
                f"--config.data_dir={data_dir}",
                f"--workdir={workdir}",
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1].startswith("error: ")
        assert "is in use by a trainer" in proc.stderr and "Traceback" not in proc.stderr
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    # The lock of a killed process is gone with it: the resume goes ahead.
    state = train_run(tiny_config(data_dir=data_dir, num_train_steps=3, lr_decay_fractions=(2 / 3, 2 / 3)), workdir)
    assert int(state.step) == 3
