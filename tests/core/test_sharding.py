"""The step on a batch split over two devices equals the single-device step, and so does
the evaluation of the resulting checkpoint.

The SNIS softmax of Algorithm 2 must normalize over the whole global batch, not per device:
per-device normalization would change the weights (each device's weights would sum to 1)
and hence the update. BatchNorm statistics likewise. Evaluation batches are split over the
devices too; every evaluator is per example, so the split must change nothing. Devices are
faked on the CPU in a subprocess, since the device count is fixed when JAX starts.
"""

import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import REPO

SCRIPT = r"""
import sys, numpy as np, jax
sys.path.insert(0, {tests!r})
from helpers import tiny_config
from conftest import train_run
from patjax.run import eval_files, evaluation, train, workdir as workdir_lib
from patjax.core import sharding
cfg = tiny_config(data_dir={data_dir!r}, num_train_steps=2, **{{"pat.beta": 2.0}})
state = train_run(cfg, {workdir!r})
assert jax.device_count() == {devices}, jax.devices()
assert sharding.make_mesh(cfg.eval.batch_size).size == {devices}
leaves = jax.tree.leaves(jax.device_get((state.params, state.batch_stats)))
results = evaluation.evaluate_workdir({workdir!r}, progress=False, evaluators=["clean", "pr"])
_, per_image = eval_files.load_results({workdir!r})
leaves += [per_image["pr_uniform.sum_loss"], per_image["clean.correct"], per_image["pr_uniform.counts"]]
np.savez({out!r}, *leaves)
"""


def run_training(tmp_path, data_dir, devices):
    out = tmp_path / f"params_{devices}.npz"
    env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}", JAX_PLATFORMS="cpu")
    script = SCRIPT.format(
        tests=str(REPO / "tests"),
        data_dir=data_dir,
        workdir=str(tmp_path / f"run{devices}"),
        devices=devices,
        out=str(out),
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True, timeout=400
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    loaded = np.load(out)
    return [loaded[k] for k in sorted(loaded.files, key=lambda k: int(k.split("_")[1]))]


@pytest.mark.slow
def test_two_device_data_parallel_step_and_evaluation_equal_single_device(tmp_path, data_dir):
    single = run_training(tmp_path, data_dir, 1)
    split = run_training(tmp_path, data_dir, 2)
    assert len(single) == len(split)
    for a, b in zip(single[:-3], split[:-3]):  # parameters and BatchNorm statistics
        np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-6)
    # Per image: sum over the PR samples of the cross-entropy (a continuous check), clean
    # correctness and non-adversarial counts (exact).
    np.testing.assert_allclose(single[-3], split[-3], rtol=1e-4)
    assert split[-3].shape[0] == 16 and np.all(split[-3] > 0)
    for a, b in zip(single[-2:], split[-2:]):
        np.testing.assert_array_equal(a, b)


RESUME_SCRIPT = r"""
import sys, numpy as np, jax
sys.path.insert(0, {tests!r})
from helpers import tiny_config
from conftest import train_run
from patjax.run import train
assert jax.device_count() == 2, jax.devices()
cfg = tiny_config(data_dir={data_dir!r}, num_train_steps=4)
whole = train_run(cfg, {workdir!r} + "/whole")
train_run(cfg, {workdir!r} + "/split", stop_after_steps=2)
resumed = train_run(cfg, {workdir!r} + "/split")
a = jax.tree.leaves(jax.device_get((whole.params, whole.batch_stats, whole.opt_state, whole.step)))
b = jax.tree.leaves(jax.device_get((resumed.params, resumed.batch_stats, resumed.opt_state, resumed.step)))
assert len(a) == len(b)
unequal = [i for i, (x, y) in enumerate(zip(a, b)) if not np.array_equal(x, y)]
assert not unequal, f"leaves differ after resume: {{unequal}}"
"""


@pytest.mark.slow
@pytest.mark.long
def test_two_device_run_resumes_bitwise(tmp_path, data_dir):
    """Every command line splits the batch over one CPU device per core, so the README's
    'an interrupted run resumes to the same parameters, bitwise' must hold on two devices."""
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2", JAX_PLATFORMS="cpu")
    script = RESUME_SCRIPT.format(tests=str(REPO / "tests"), data_dir=data_dir, workdir=str(tmp_path))
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True, timeout=400
    )
    assert proc.returncode == 0, proc.stderr[-3000:]


PR_SCRIPT = r"""
import re, jax, jax.numpy as jnp, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
from patjax.models import networks
from patjax.pat import robustness
model = networks.create_model("small_cnn", "cifar10", 10, widths=(4,))
variables = model.init(jax.random.PRNGKey(0), jnp.zeros((1, 32, 32, 3)), train=False)
mesh = jax.make_mesh((2,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
split = NamedSharding(mesh, P("data"))
x, y, idx = jax.device_put((jnp.full((8, 32, 32, 3), 0.5), jnp.zeros(8, jnp.int32), jnp.arange(8)), split)
fn = lambda x, y, idx: robustness.pr_statistics(
    lambda v: model.apply(variables, v, train=False), jax.random.PRNGKey(1), x, y, idx, (0.1, 0.2), 6, 3)
hlo = jax.jit(fn).lower(x, y, idx).compile().as_text()
print(len(re.findall(r"all-gather", hlo)), sorted(set(re.findall(r"f32\[(\d+),32,32,4\]\S* convolution\(", hlo))))
"""


@pytest.mark.slow
def test_pr_statistics_keeps_each_devices_images_on_that_device():
    # 8 images split over 2 devices, 2 levels x 3 samples per chunk: each device must run the
    # model on its own 4 x 2 x 3 = 24 perturbed images, with nothing gathered across devices
    # (a sample layout that mixed the split axis into the flattened batch made XLA gather the
    # whole chunk, 48 images, onto both devices).
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2", JAX_PLATFORMS="cpu")
    proc = subprocess.run(
        [sys.executable, "-c", PR_SCRIPT], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split("\n")[-2] == "0 ['24']", proc.stdout
