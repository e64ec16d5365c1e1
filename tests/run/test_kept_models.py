"""Kept models: a run's parameters and BatchNorm statistics as safetensors files, read back
exactly, refused in one line when damaged or foreign, and evaluated like a checkpoint."""

import os
import subprocess
import sys

import jax
import numpy as np
import pytest
from conftest import REPO
from helpers import cut_short, run_module
from safetensors.numpy import save_file

from patjax.core.errors import UserError
from patjax.run import checkpoints, kept_models
from patjax.run import config as config_lib
from patjax.run import optimizer as optimizer_lib
from patjax.run import state as state_lib
from patjax.run import workdir as workdir_lib


def small_cnn_state(seed=0):
    cfg = config_lib.default_config()
    cfg.model = "small_cnn"
    cfg.seed = seed
    settings = config_lib.train_settings(cfg)
    tx = optimizer_lib.make_optimizer(settings.optimizer, settings.optimizer.schedule(1))
    _, state = state_lib.create_train_state(settings.model, seed, tx)
    return cfg, state


@pytest.mark.slow
def test_a_kept_model_reads_back_bit_for_bit_and_refuses_what_does_not_fit(tmp_path):
    cfg, state = small_cnn_state()
    workdir = str(tmp_path)
    # Non-trivial BatchNorm statistics, so that a swap of the two collections would show.
    batch_stats = jax.tree.map(
        lambda a: np.asarray(a) + np.arange(a.size, dtype=a.dtype).reshape(a.shape), state.batch_stats
    )
    path = kept_models.save(workdir, 800, state.params, batch_stats, {"model": "small_cnn"})
    assert path.endswith(os.path.join("models", "step_000800.safetensors"))
    assert kept_models.steps(workdir) == [800] and kept_models.newest(workdir) == 800
    assert os.path.getsize(path) < 600_000  # the small CNN: about 0.4 MB
    params, stats, meta = kept_models.load(workdir, 800, state.params, state.batch_stats)
    for a, b in zip(jax.tree.leaves((state.params, batch_stats)), jax.tree.leaves((params, stats))):
        np.testing.assert_array_equal(np.asarray(a), b)
    assert jax.tree.structure(params) == jax.tree.structure(state.params)
    assert meta["format"] == kept_models.FORMAT and meta["step"] == "800" and meta["model"] == "small_cnn"

    # Another architecture's variables: refused, naming the file.
    other = config_lib.default_config()
    other.model, other.model_width = "resnet18", 8
    other_settings = config_lib.train_settings(other)
    _, resnet = state_lib.create_train_state(
        other_settings.model, 0, optimizer_lib.make_optimizer(other_settings.optimizer, lambda s: 0.1)
    )
    with pytest.raises(UserError, match="does not fit the run's model"):
        kept_models.load(workdir, 800, resnet.params, resnet.batch_stats)
    # A file cut short (a copy interrupted) and a file of the wrong step: one line each.
    with open(path, "rb") as f:
        whole = f.read()
    reason = cut_short(path)
    with pytest.raises(UserError) as error:
        kept_models.load(workdir, 800, state.params, state.batch_stats)
    assert str(error.value) == f"{path} is not a readable safetensors file ({reason})"
    os.rename(path, kept_models.path(workdir, 700))
    with open(kept_models.path(workdir, 700), "wb") as f:
        f.write(whole)
    with pytest.raises(UserError, match="not a patjax model of step 700"):
        kept_models.load(workdir, 700, state.params, state.batch_stats)


@pytest.mark.slow
def test_a_workdir_with_only_its_kept_model_restores_and_a_damaged_one_is_one_line(tmp_path):
    cfg, state = small_cnn_state(seed=3)
    workdir = str(tmp_path / "run")
    workdir_lib.save_config(cfg.to_dict(), workdir)
    with pytest.raises(UserError, match="no checkpoint and no kept model"):
        checkpoints.require_checkpoint(workdir)
    kept_models.save(workdir, 5, state.params, state.batch_stats, {})
    assert checkpoints.require_checkpoint(workdir) == 5
    _, _, restored = workdir_lib.restore(workdir)
    assert int(restored.step) == 5
    for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(restored.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    with pytest.raises(UserError, match="no model of step 4"):
        workdir_lib.restore(workdir, step=4)
    # The command lines that restore it: a damaged kept model ends them in the same one line
    # (the one every reader of a weights file gives, tests/interop/test_torch_weights.py), not a traceback.
    file = kept_models.path(workdir, 5)
    reason = cut_short(file)
    expected = f"error: {file} is not a readable safetensors file ({reason})\n"
    evaluated = run_module("patjax.evaluate", f"--workdir={workdir}", "--evaluators=clean", "--num_examples=8")
    exported = run_module("patjax.export", f"--workdir={workdir}", f"--out={tmp_path / 'out.safetensors'}")
    for out in (evaluated, exported):
        assert (out.returncode, out.stderr) == (2, expected)
    # A foreign file under a kept model's name (no patjax metadata): one line naming what it holds.
    save_file({"w": np.zeros(3, np.float32)}, file, metadata={"format": "pt"})
    exported = run_module("patjax.export", f"--workdir={workdir}", f"--out={tmp_path / 'out.safetensors'}")
    expected = f"error: {file} is not a patjax model of step 5 (metadata {{'format': 'pt'}})\n"
    assert (exported.returncode, exported.stderr) == (2, expected)
    assert not os.path.exists(tmp_path / "out.safetensors")


@pytest.mark.slow
def test_a_damaged_config_json_is_one_line_on_evaluate(tmp_path):
    cfg, state = small_cnn_state()
    workdir = str(tmp_path / "run")
    workdir_lib.save_config(cfg.to_dict(), workdir)
    kept_models.save(workdir, 5, state.params, state.batch_stats, {})
    with open(workdir_lib.config_path(workdir), "r+") as f:
        f.truncate(40)  # a copy cut short
    out = subprocess.run(
        [sys.executable, "-m", "patjax.evaluate", f"--workdir={workdir}", "--evaluators=clean"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.strip().splitlines() == [out.stderr.strip()] and "config.json is damaged" in out.stderr
