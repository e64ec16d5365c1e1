"""Invalid input, from the input's side: each class ends in a one-line error and a non-zero exit
(or a UserError from the library) with nothing in the workdir changed. docs/inputs.md lists
what every flag and argument accepts and refuses."""

import hashlib
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest
from conftest import REPO, find_data_dir, train_run
from helpers import tiny_config

from patjax import api, evaluate
from patjax.configs import suites as shipped_suites
from patjax.core.errors import UserError
from patjax.run import checkpoints, comparison, train
from patjax.run import config as config_lib
from patjax.run import optimizer as optimizer_lib
from patjax.run import state as state_lib
from patjax.run import workdir as workdir_lib
from patjax.suites import runner


def tree_hash(root) -> str:
    """A hash of every path and file content under root (empty folders included), but for the
    contents of lock files: every process that takes a lock writes its holder line there."""
    digest = hashlib.sha256()
    for folder, dirs, names in sorted(os.walk(root)):
        dirs.sort()
        digest.update(os.path.relpath(folder, root).encode() + b"/\0")
        for name in sorted(names):
            path = os.path.join(folder, name)
            digest.update(os.path.relpath(path, root).encode() + b"\0")
            if name == ".lock":
                continue
            with open(path, "rb") as f:
                digest.update(hashlib.sha256(f.read()).digest())
    return digest.hexdigest()


def run_cli(*args, cwd=REPO):
    env = dict(os.environ, PYTHONPATH=str(REPO), PATJAX_CPU_DEVICES="1")
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=300, env=env)


def commands_at_once(commands, env=None, cwd=REPO, at_once=4) -> list:
    """Each command line (python's arguments) in its own process, `at_once` at a time, since each
    spends its seconds importing JAX (and a few hundred MB doing it); their outcomes, in order, with
    stderr as text."""
    outcomes = []
    for start in range(0, len(commands), at_once):
        wave = commands[start : start + at_once]
        procs = [
            subprocess.Popen([sys.executable, *args], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            for args in wave
        ]
        for proc, args in zip(procs, wave):
            _, stderr = proc.communicate(timeout=300)
            outcomes.append(subprocess.CompletedProcess(args, proc.returncode, "", stderr.decode()))
    return outcomes


def one_error_line(proc) -> str:
    """The one error line of a refused command (exit 2, no traceback; progress bars aside)."""
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, proc.stderr
    return lines[0]


def images_and_labels(n=6, size=4, classes=10, seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (n, size, size, 3), dtype=np.uint8), rng.integers(0, classes, n).astype(np.int32)


# ---------------------------------------------------------------------------------------
# Non-finite values stop the figure.


def linear_logits(x):
    """Finite logits: ten pixel values of each image."""
    return x.reshape(x.shape[0], -1)[:, :10]


def test_nan_logits_are_refused_naming_the_pass_and_the_images():
    images, labels = images_and_labels()
    images[:, 0, 0, 0] = 0
    images[[1, 4], 0, 0, 0] = 255  # in two batches of 4

    def nan_on_two(x):  # NaN logits on the images whose first pixel is white
        return jnp.where(x[:, :1, 0, 0] == 1.0, jnp.nan, linear_logits(x))

    with pytest.raises(UserError) as error:
        api.evaluate(nan_on_two, images, labels, evaluators="clean", batch_size=4)
    assert str(error.value) == (
        "the model's logits are not finite on 2 of 6 images in the clean pass; no figure is computed from them"
    )


def test_logits_finite_at_the_images_but_not_at_their_perturbations_are_refused_in_that_pass():
    images, labels = images_and_labels()

    def nan_off_the_8_bit_grid(x):  # finite at every image (k / 255), NaN at PR's noisy samples
        on_grid = jnp.all(jnp.abs(x * 255 - jnp.round(x * 255)) < 1e-3, axis=(1, 2, 3))
        return jnp.where(on_grid[:, None], linear_logits(x), jnp.inf)

    with pytest.raises(UserError, match=r"not finite on 6 of 6 images in the pr_uniform pass"):
        api.evaluate(
            nan_off_the_8_bit_grid,
            images,
            labels,
            evaluators="clean,pr",
            pr={"samples": 4, "chunk_size": 4},
            batch_size=8,
        )
    # The same function at the images alone is fine: the clean figure is computed.
    clean = api.evaluate(nan_off_the_8_bit_grid, images, labels, evaluators="clean", batch_size=8)
    assert clean["figures"]["clean_accuracy"]["n"] == 6


def nan_checkpoint_workdir(workdir, change=lambda params: jax.tree.map(lambda p: p * jnp.nan, params)):
    """A workdir whose one checkpoint (step 1) is the small CNN with `change`d parameters (default:
    NaN weights, as a diverged run leaves it); and the .lock every trained workdir has."""
    cfg = config_lib.default_config()
    cfg.model = "small_cnn"
    settings = config_lib.train_settings(cfg)
    tx = optimizer_lib.make_optimizer(settings.optimizer, optax.constant_schedule(0.1))
    _, state = state_lib.create_train_state(settings.model, 0, tx)
    state = state.replace(step=jnp.ones((), jnp.int32), params=change(state.params))
    workdir_lib.save_config(settings.record, workdir)
    manager = checkpoints.checkpoint_manager(workdir)
    manager.save(1, args=ocp.args.StandardSave(state))
    manager.wait_until_finished()
    manager.close()
    open(os.path.join(workdir, ".lock"), "w").close()


@pytest.mark.slow
def test_a_checkpoint_with_nan_weights_evaluates_to_one_line_and_no_results(tmp_path):
    workdir = str(tmp_path / "run")
    nan_checkpoint_workdir(workdir)
    before = tree_hash(tmp_path)
    proc = run_cli(
        "-m", "patjax.evaluate", f"--workdir={workdir}", "--num_examples=5", "--batch_size=5", "--evaluators=clean"
    )
    # Refused where the model is restored, before the logits check of the evaluation would.
    assert one_error_line(proc) == (
        f"error: the model of step 1 restored from {workdir} has non-finite values in params/BatchNorm_0/bias; "
        "no figure or file is made from it"
    )
    assert tree_hash(tmp_path) == before


def set_first(params, module, name, value):
    """`params` with `value` at the first entry of `module`'s array `name`."""

    def change(path, leaf):
        names = [getattr(k, "key", None) for k in path]
        return leaf.at[(0,) * leaf.ndim].set(value) if names[-2:] == [module, name] else leaf

    return jax.tree_util.tree_map_with_path(change, params)


def minus_inf_bias(params):
    """The small CNN's params with -inf in the first channel's bias of its first BatchNorm. NaN
    propagates through XLA's ReLU and max-pool, but -inf there becomes 0 after the ReLU: the
    logits stay finite, and only a check of the weights themselves finds it."""
    return set_first(params, "BatchNorm_0", "bias", -jnp.inf)


def run_all(cases, cwd=REPO):
    """[(command line, expected stderr line)]: every command at once (each spends its seconds
    importing JAX), each refused with exactly its one line."""
    env = dict(os.environ, PYTHONPATH=str(REPO), PATJAX_CPU_DEVICES="1")
    for done, (args, message) in zip(commands_at_once([args for args, _ in cases], env, cwd), cases):
        assert one_error_line(done) == message, (args, done.stderr)


@pytest.mark.slow
def test_a_checkpoint_with_infinite_weights_but_finite_logits_is_neither_evaluated_nor_exported(tmp_path):
    workdir = str(tmp_path / "run")
    nan_checkpoint_workdir(workdir, minus_inf_bias)
    out = tmp_path / "model.safetensors"
    before = tree_hash(tmp_path)
    refused = (
        f"error: the model of step 1 restored from {workdir} has non-finite values in params/BatchNorm_0/bias; "
        "no figure or file is made from it"
    )
    evaluate = ("-m", "patjax.evaluate", f"--workdir={workdir}", "--num_examples=5", "--batch_size=5")
    run_all(
        [
            ((*evaluate, "--evaluators=clean"), refused),
            (("-m", "patjax.export", f"--workdir={workdir}", f"--out={out}"), refused),
        ]
    )
    assert tree_hash(tmp_path) == before and not out.exists()


@pytest.mark.slow
def test_a_torch_checkpoint_with_a_non_finite_weight_or_normalization_is_refused_naming_it(tmp_path):
    from patjax.interop import torch_weights
    from patjax.models import networks

    net = networks.create_model("small_cnn", "cifar10", 10)
    params, batch_stats = jax.jit(lambda: networks.init_variables(net, jax.random.PRNGKey(0)))()
    stats = networks.DATASET_STATS["cifar10"]
    variants = {
        "nan_weight": (set_first(params, "Conv_0", "kernel", jnp.nan), stats, "features.0.weight"),
        "inf_bias": (minus_inf_bias(params), stats, "features.1.bias"),  # finite logits: the ReLU clips it
        "inf_sigma": (params, (stats[0], (np.inf, 1.0, 1.0)), "sigma"),  # every image's red channel becomes 0
    }
    cases = []
    for name, (weights, normalize, key) in variants.items():
        file = tmp_path / f"{name}.safetensors"
        torch_weights.export(str(file), "small_cnn", weights, batch_stats, normalize)
        command = ("-m", "patjax.evaluate", f"--torch_checkpoint={file}", "--num_examples=5", "--evaluators=clean")
        cases.append((command, f"error: {file} has non-finite values in {key}; no figure is computed from it"))
    before = tree_hash(tmp_path)
    run_all(cases)
    assert tree_hash(tmp_path) == before


def test_the_api_refuses_variables_with_a_non_finite_value_before_compiling(monkeypatch):
    from patjax.models import networks

    net = networks.create_model("small_cnn", "cifar10", 10)
    params, batch_stats = jax.jit(lambda: networks.init_variables(net, jax.random.PRNGKey(0)))()
    variables = {"params": minus_inf_bias(params), "batch_stats": batch_stats}
    images, labels = images_and_labels(n=4, size=32)
    monkeypatch.setattr(jax, "jit", lambda *a, **k: pytest.fail("compiled"))
    message = (
        "the model passed with its variables has non-finite values in params/BatchNorm_0/bias; "
        "no figure is computed from it"
    )
    for model in ((net, variables), net.bind(variables)):
        with pytest.raises(UserError) as error:
            api.evaluate(model, images, labels, evaluators="clean")
        assert str(error.value) == message
    # An infinite BatchNorm variance: the channel is normalized to 0, the logits stay finite.
    stats = set_first(batch_stats, "BatchNorm_0", "var", jnp.inf)
    with pytest.raises(UserError, match=r"non-finite values in batch_stats/BatchNorm_0/var;"):
        api.evaluate((net, {"params": params, "batch_stats": stats}), images, labels, evaluators="clean")


@pytest.mark.slow
@pytest.mark.parametrize(
    "learning_rate, message, kept",
    [
        # float32's largest rate: step 1's loss and gradient are finite, its update is not, and the
        # checkpoint of step 1 would hold it.
        (
            3.4e38,
            "training stopped: the model after step 1 has non-finite values in params/Conv_0/kernel; "
            "no checkpoint was saved",
            [],
        ),
        # Step 1's update stays finite and step 2's loss does not: found before step 2's
        # checkpoint, not at the logging step 3.
        (
            1e38,
            "training stopped: loss nan and grad_norm nan at step 2; the newest checkpoint, step 1, precedes them",
            ["1"],
        ),
    ],
    ids=["update-overflows", "loss-turns-nan"],
)
def test_training_that_turns_non_finite_keeps_only_the_checkpoints_before_it(tmp_path, learning_rate, message, kept):
    workdir = str(tmp_path / "run")
    cfg = tiny_config(
        data_dir=find_data_dir(),
        method="clean",
        learning_rate=learning_rate,
        num_train_steps=6,
        checkpoint_every_steps=1,
        log_every_steps=3,
        log_test_examples=8,
    )
    with pytest.raises(UserError) as error:
        train_run(cfg, workdir)
    assert str(error.value) == message
    assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == kept
    if kept:
        _, _, state = workdir_lib.restore(workdir)
        assert all(np.isfinite(leaf).all() for leaf in jax.tree.leaves(jax.device_get(state.params)))


# ---------------------------------------------------------------------------------------
# Data that are not the data set.

RECORD = 3073  # bytes of a CIFAR-10 record: the label, then 3 x 32 x 32 pixels


@pytest.mark.parametrize(
    "records, shown",
    [
        (9_999, "has 30,726,927 bytes (9,999.00 records of 3073)"),  # a record missing
        (10_001, "has 30,733,073 bytes (10,001.00 records of 3073)"),  # a record more
        (10_000.5, "has 30,731,536 bytes (10,000.50 records of 3073)"),  # a record cut short
    ],
)
@pytest.mark.slow
def test_a_cifar_file_of_the_wrong_length_is_refused_before_the_workdir_is_written(tmp_path, records, shown):
    folder = tmp_path / "data" / "cifar-10-batches-bin"
    folder.mkdir(parents=True)
    official = 10_000 * RECORD
    for name in ("data_batch_1.bin", "data_batch_2.bin", "data_batch_3.bin", "data_batch_4.bin", "data_batch_5.bin"):
        (folder / name).write_bytes(bytes(official))  # label 0, black images: the right length
    (folder / "test_batch.bin").write_bytes(bytes(int(records * RECORD)))
    workdir = tmp_path / "run"
    before = tree_hash(tmp_path)
    with pytest.raises(UserError) as error:
        train_run(tiny_config(data_dir=str(tmp_path / "data"), method="clean"), str(workdir))
    assert str(error.value) == (
        f"{folder / 'test_batch.bin'} {shown}; the official file has 10,000 records, 30,730,000 bytes: "
        "not the cifar10 data set"
    )
    assert tree_hash(tmp_path) == before and not workdir.exists()


# ---------------------------------------------------------------------------------------
# Labels and images at the API: refused before anything is compiled.


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda x, y: (x, y + 7), "labels must be classes of the model, in [0, 9], got values in [7, 16]"),
        (lambda x, y: (x, y - 3), "labels must be class indices >= 0, got values in [-3, 6]"),
        (lambda x, y: (x, y.astype(np.float32)), "labels must be integers (class indices), got dtype float32"),
        (lambda x, y: (x, y[:-1]), "images must be (N, H, W, C) and labels (N,), N >= 1, got (6, 4, 4, 3) and (5,)"),
        (
            lambda x, y: (x.transpose(0, 3, 1, 2), y),
            "images of shape (6, 3, 4, 4) look channels-first (N, C, H, W); pass (N, H, W, C)",
        ),
        (lambda x, y: (x.astype(np.int64), y), "images must be uint8 (0-255) or floats in [0, 1], got dtype int64"),
        (
            lambda x, y: (x.astype(np.float32), y),
            "float images must lie in [0, 1], got values in [0, 255]; pass uint8 for values 0-255",
        ),
        (lambda x, y: (x[:0], y[:0]), "images: no images (N = 0), got shape (0, 4, 4, 3); pass at least one"),
    ],
)
def test_the_api_refuses_labels_and_images_it_cannot_evaluate_before_compiling(change, message, monkeypatch):
    images, labels = images_and_labels()
    images[0, 0, 0, 0], images[1, 0, 0, 0] = 0, 255
    images, labels = change(images, labels)
    compiled = []
    monkeypatch.setattr(jax, "jit", lambda *a, **k: compiled.append(a) or pytest.fail("compiled"))
    with pytest.raises(UserError) as error:
        api.evaluate(linear_logits, images, labels, evaluators="clean")
    assert message in str(error.value) and "\n" not in str(error.value)
    assert not compiled


def test_a_model_that_cannot_take_the_images_or_gives_no_class_scores_is_refused():
    images, labels = images_and_labels()
    with pytest.raises(UserError, match=r"the model must return \(N, classes\) logits with classes >= 2, got shape"):
        api.evaluate(lambda x: x.sum(axis=(1, 2, 3)), images, labels, evaluators="clean")
    with pytest.raises(UserError, match=r"the model cannot take images of shape \(N, 4, 4, 3\): TypeError"):
        api.evaluate(lambda x: x.reshape(x.shape[0], 10, -1).sum(-1), images, labels, evaluators="clean")


def small_cnn_variables(normalize):
    """The small CNN, built for RGB images, with its variables."""
    from patjax.models import networks

    module = networks.create_model("small_cnn", "cifar10", 10, normalize=normalize)
    params, batch_stats = networks.init_variables(module, jax.random.PRNGKey(0), (4, 4, 3))
    return module, {"params": params, "batch_stats": batch_stats}


def nn_bind(module, variables):
    return module.bind(variables)


def rgb_mean_logits(x):
    """A logits function that subtracts a per-channel RGB mean: (N, H, W, 1) broadcasts to 3."""
    return linear_logits(x - jnp.array([0.49, 0.48, 0.45]))


@pytest.mark.parametrize(
    "model, message",
    [
        # The (3,) mean broadcasts grey images to 3 channels: before, a figure came out.
        (lambda: small_cnn_variables("dataset"), "but the model's first convolution takes 3; pass (N, H, W, 3) images"),
        # No normalization: Flax's own shape error, now the images' channels instead.
        (lambda: small_cnn_variables("none"), "but the model's first convolution takes 3; pass (N, H, W, 3) images"),
        (lambda: nn_bind(*small_cnn_variables("dataset")), "but the model's first convolution takes 3"),
        (lambda: rgb_mean_logits, "but the dataset's (cifar10) have 3; pass (N, H, W, 3) images"),
    ],
    ids=["normalized-flax", "unnormalized-flax", "bound-flax", "logits-function"],
)
def test_grey_images_given_to_an_rgb_model_are_refused_before_compiling(model, message, monkeypatch):
    images, labels = images_and_labels()
    grey = images[..., :1]
    model = model()
    compiled = []
    monkeypatch.setattr(jax, "jit", lambda *a, **k: compiled.append(a) or pytest.fail("compiled"))
    with pytest.raises(UserError) as error:
        api.evaluate(model, grey, labels, evaluators="clean")
    assert str(error.value).startswith("images have 1 channel(s), but ") and message in str(error.value)
    assert "\n" not in str(error.value) and not compiled


def test_a_flax_network_built_for_grey_images_takes_grey_images():
    """The model's channels are its first convolution's: a network built for one channel is
    evaluated on one-channel images (the dataset's RGB is only the fallback)."""
    import flax.linen as nn

    class Grey(nn.Module):
        @nn.compact
        def __call__(self, x):
            return nn.Dense(10)(nn.Conv(4, (3, 3))(x).mean(axis=(1, 2)))

    images, labels = images_and_labels()
    grey = images[..., :1]
    variables = Grey().init(jax.random.PRNGKey(0), jnp.zeros((1, 4, 4, 1)))
    results = api.evaluate((Grey(), variables), grey, labels, evaluators="clean")
    assert results["figures"]["clean_accuracy"]["n"] == 6
    with pytest.raises(UserError, match=r"^images have 3 channel\(s\), but the model's first convolution takes 1;"):
        api.evaluate((Grey(), variables), images, labels, evaluators="clean")


def test_no_images_are_an_images_error_whatever_the_model():
    """N = 0 is named as the images' problem before the model is looked at: a model with NaN
    weights, or a function that needs a second argument, is not what the message is about."""
    module, variables = small_cnn_variables("dataset")
    nan_variables = {**variables, "params": jax.tree.map(lambda p: p * jnp.nan, variables["params"])}
    empty, no_labels = np.zeros((0, 32, 32, 3), np.uint8), np.zeros((0,), np.int32)
    for model in ((module, nan_variables), lambda x, y: x, linear_logits):
        with pytest.raises(UserError) as error:
            api.evaluate(model, empty, no_labels, evaluators="clean")
        assert str(error.value) == "images: no images (N = 0), got shape (0, 32, 32, 3); pass at least one"
    with pytest.raises(UserError, match=r"^images: no images \(N = 0\), got shape \(0,\); pass at least one$"):
        api.evaluate(linear_logits, [], [], evaluators="clean")


# ---------------------------------------------------------------------------------------
# Settings with a meaning patjax does not have: refused where the config becomes settings.


def test_num_epochs_is_at_least_one_when_it_sets_the_run_length():
    """num_epochs' declared range starts at 0 for runs whose length num_train_steps sets."""
    cfg = config_lib.default_config()
    cfg.num_epochs = 0
    with pytest.raises(UserError) as error:
        config_lib.train_settings(cfg)
    assert str(error.value) == "num_epochs must be an integer in [1, 1000000], got 0"


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("learning_rate", 1e39, "learning_rate must be a finite number in float32 (|x| <= 3.4e38), got 1e+39"),
        ("learning_rate", 0.0, "learning_rate must be > 0, got 0.0"),
        (
            "lr_decay_fractions",
            (-0.5, 0.9),
            "lr_decay_fractions must each be in (0, 1), fractions of the run (none: no decay), got (-0.5, 0.9)",
        ),
        (
            "lr_decay_fractions",
            (0.75, 1.5),
            "lr_decay_fractions must each be in (0, 1), fractions of the run (none: no decay), got (0.75, 1.5)",
        ),
        ("lr_decay_factor", -0.1, "lr_decay_factor must be > 0, got -0.1"),
        ("lr_decay_factor", 0.0, "lr_decay_factor must be > 0, got 0.0"),
    ],
)
def test_schedule_settings_that_would_change_the_run_silently_or_overflow_float32_are_refused(field, value, message):
    """A negative milestone fraction decays the rate before step 0, a milestone past the end never
    fires, a negative factor flips the update's sign, 1e39 is infinite in the float32 step."""
    cfg = config_lib.default_config()
    cfg[field] = value
    with pytest.raises(UserError) as error:
        config_lib.train_settings(cfg)
    assert str(error.value) == message
    cfg[field] = config_lib.default_config()[field]
    assert config_lib.train_settings(cfg).optimizer.decay_fractions == (0.75, 0.9)


def test_the_documented_sentinels_are_accepted():
    cfg = config_lib.default_config()
    cfg.num_train_steps, cfg.checkpoint_every_steps, cfg.log_every_steps, cfg.log_test_examples = -1, 0, -1, -1
    settings = config_lib.train_settings(cfg)
    assert settings.total_steps() == 100 * (50_000 // 256)  # num_epochs epochs of whole batches
    cfg.num_train_steps, cfg.num_epochs = 7, 0  # num_epochs is not read once the steps are set
    assert config_lib.train_settings(cfg).total_steps() == 7


# ---------------------------------------------------------------------------------------
# Paths: every path flag of every command is checked for its kind before anything is read or
# written (patjax.core.paths' existing_folder, existing_file, output_folder, output_file).


def path_cases(tmp):
    """(command line, the start of its one error line): each entry point's path flags go through
    patjax.core.cli's checks (their every case: the test below); tmp holds a file `f` and a folder `d`."""
    f, d, nowhere = tmp / "f", tmp / "d", tmp / "nowhere"
    ev = ("-m", "patjax.evaluate")
    return [
        (
            ("main.py", "--config=configs/quickstart.py", f"--workdir={f}/run"),
            f"--workdir={f}/run: {f} is a file, so nothing can be made under it",
        ),
        ((*ev, f"--workdir={nowhere}", "--compare_only"), f"--workdir={nowhere}: no such folder"),
        ((*ev, f"--torch_checkpoint={d}", "--model=small_cnn"), f"--torch_checkpoint={d}: is a folder, not a file"),
        (("-m", "patjax.experiments", f"--workdir={nowhere}", "--handover"), f"--workdir={nowhere}: no such folder"),
        (("-m", "patjax.diagnose", f"--workdir={d}", f"--out={f}/x"), f"--out={f}/x: {f} is a file, so nothing"),
        (("-m", "patjax.export", f"--workdir={d}", f"--out={d}"), f"--out={d}: is a folder; name the file to write"),
    ]


@pytest.mark.slow
def test_every_command_refuses_a_path_of_the_wrong_kind_in_one_line_and_writes_nothing(tmp_path):
    (tmp_path / "f").write_text("a file")
    (tmp_path / "d").mkdir()
    before = tree_hash(tmp_path)
    env = dict(os.environ, PYTHONPATH=str(REPO), PATJAX_CPU_DEVICES="1")
    cases = path_cases(tmp_path)
    for done, (args, message) in zip(commands_at_once([args for args, _ in cases], env), cases):
        assert one_error_line(done).startswith(f"error: {message}"), (args, done.stderr)
    assert tree_hash(tmp_path) == before


def test_the_path_checks_name_the_flag_and_what_is_wrong(tmp_path):
    from patjax.core import paths

    f = tmp_path / "f"
    f.write_text("x")
    dangling = tmp_path / "link.json"
    dangling.symlink_to(tmp_path / "gone" / "out.json")
    readonly = tmp_path / "ro"
    readonly.mkdir()
    readonly.chmod(0o500)
    checks = [
        (paths.existing_folder, tmp_path / "no", "no such folder"),
        (paths.existing_folder, f, "is a file, not a folder"),
        (paths.existing_file, tmp_path / "no", "no such file"),
        (paths.existing_file, tmp_path, "is a folder, not a file"),
        (paths.output_folder, f, "is a file, not a folder"),
        (paths.output_folder, f / "a" / "b", f"{f} is a file, so nothing can be made under it"),
        (paths.output_file, tmp_path, "is a folder; name the file to write"),
        (paths.output_file, f / "out.json", f"{f} is a file, so nothing can be made under it"),
        # A link whose target is gone: writing would replace the link, not make its target.
        (
            paths.output_file,
            dangling,
            f"is a symbolic link to {tmp_path / 'gone' / 'out.json'}, which does not exist; remove the link or "
            "name another file",
        ),
    ]
    if os.geteuid() != 0:  # root writes anywhere
        checks.append((paths.output_folder, readonly / "new", f"cannot create it, {readonly} is not writable"))
    for check, path, message in checks:
        with pytest.raises(UserError) as error:
            check("flag", str(path))
        assert str(error.value) == f"--flag={path}: {message}", check
    # What each accepts: the folder or file there, or a path it can create.
    assert paths.existing_folder("flag", str(tmp_path)) == str(tmp_path)
    assert paths.existing_file("flag", str(f)) == str(f)
    assert paths.output_folder("flag", str(tmp_path / "new" / "deeper"))
    assert paths.output_file("flag", str(tmp_path / "new" / "out.json"))
    assert sorted(os.listdir(tmp_path)) == ["f", "link.json", "ro"]  # the checks create nothing


def test_command_line_counts_without_a_meaning_are_refused(tmp_path):

    for value in (0, 1_000_001):
        with pytest.raises(UserError) as error:
            runner.run_suite(shipped_suites.get_suite("smoke_cpu", None), str(tmp_path / "suite"), max_runs=value)
        assert str(error.value) == f"--max_runs must be an integer in [1, 1000000], got {value}"
    assert os.listdir(tmp_path) == []  # refused before the suite folder is made
    with pytest.raises(UserError) as error:
        train.train_run(config_lib.train_settings(tiny_config()), str(tmp_path / "run"), stop_after_steps=0)
    assert str(error.value) == "--stop_after_steps must be an integer in [1, 2147483647], got 0"
    assert os.listdir(tmp_path) == []


def test_the_diagnostics_tolerance_and_chains_in_all_are_bounded():
    from patjax.pat import langevin_diagnostic

    with pytest.raises(UserError) as error:
        langevin_diagnostic.DiagnosticSettings(8, 2, 10, "uniform", tolerance=-0.1)
    assert str(error.value) == "--tolerance must be >= 0, got -0.1"
    assert langevin_diagnostic.DiagnosticSettings(10_000, 10).chains == 10  # 100,000 chains in all
    with pytest.raises(UserError) as error:
        langevin_diagnostic.DiagnosticSettings(10_000, 11)
    assert str(error.value) == "--num_examples x --chains must be at most 100,000 (they run at once), got 10000 x 11"


# ---------------------------------------------------------------------------------------
# Files patjax reads: an evaluation's files (eval/ and a learning curve's curve/step_N/), read
# by a comparison and by a suite's report, and a config file. Each is damaged in a copy of
# committed runs (docs/results/ itself is never touched); the refusal is one line naming the
# file, and nothing is written.

TABLE1 = REPO / "docs" / "results" / "table1_cpu"
CURVE_RUN = "pat_clean_start_T20/pat_s1"  # a table1_cpu run with learning-curve points


def copied_evaluations(tmp_path):
    """Two runs' eval/ folders, what --compare_only reads, copied from table1_cpu."""
    workdirs = []
    for name in ("clean_s0", "pgd_s0"):
        shutil.copytree(TABLE1 / "runs" / "cifar10_small_cnn" / name / "eval", tmp_path / name / "eval")
        workdirs.append(str(tmp_path / name))
    return workdirs


def copied_suite(tmp_path):
    """A table1_cpu folder holding one finished run with its curve points (its kept models
    aside, which no report reads)."""
    suite = tmp_path / "suite"
    shutil.copytree(TABLE1 / "runs" / CURVE_RUN, suite / "runs" / CURVE_RUN, ignore=shutil.ignore_patterns("models"))
    return suite


def cut(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def without_figures(path):
    results = json.loads(path.read_text())
    del results["figures"]
    path.write_text(json.dumps(results))


def unchanged_but_locks(root) -> str:
    """tree_hash with lock files left out: the report takes DIR/.report.lock (created if
    missing; git ignores it) before it reads the runs' files."""
    digest = hashlib.sha256()
    for folder, dirs, names in sorted(os.walk(root)):
        dirs.sort()
        for name in sorted(n for n in names if not n.endswith(".lock")):
            path = os.path.join(folder, name)
            digest.update(os.path.relpath(path, root).encode() + b"\0")
            with open(path, "rb") as f:
                digest.update(hashlib.sha256(f.read()).digest())
    return digest.hexdigest()


@pytest.mark.parametrize(
    "damage, file, problem",
    [
        (cut, "per_image.npz", "is damaged (not a readable .npz: File is not a zip file); evaluate the run again"),
        (
            without_figures,
            "results.json",
            "is damaged (no figures); move it away and evaluate again (patjax-evaluate --overwrite replaces it)",
        ),
    ],
    ids=["cut-per-image", "results-without-figures"],
)
def test_a_damaged_evaluation_file_is_refused_by_a_comparison_naming_it(tmp_path, damage, file, problem):
    a, b = copied_evaluations(tmp_path)
    damage(pathlib.Path(b, "eval", file))
    before = tree_hash(tmp_path)
    with pytest.raises(UserError) as error:
        comparison.compare([a, b])
    assert str(error.value) == f"{b}/eval/{file} {problem}"
    assert tree_hash(tmp_path) == before  # no plot, no paired differences: the plot was once drawn first


def test_a_replaced_curve_file_is_refused_by_the_suite_report_naming_it(tmp_path):
    suite = copied_suite(tmp_path)
    point = suite / "runs" / CURVE_RUN / "curve" / "step_000300" / "per_image.npz"
    np.save(point, np.zeros(3))  # np.save names it .npy: a single array where an archive was
    os.replace(f"{point}.npy", point)
    before = unchanged_but_locks(suite)
    with pytest.raises(UserError) as error:
        runner.write_report(shipped_suites.get_suite("table1_cpu", None), str(suite))
    assert str(error.value) == (
        f"{point} is damaged (not a readable .npz: a single array, not an archive of named arrays); "
        "evaluate the run again"
    )
    assert unchanged_but_locks(suite) == before  # no results.json, results.md or plot


@pytest.mark.slow
def test_the_commands_that_read_evaluations_refuse_damaged_ones_in_one_line_writing_nothing(tmp_path):
    """The cases above through the command lines: exit 2, one line, the folders unchanged."""
    a, b = copied_evaluations(tmp_path / "compare")
    cut(pathlib.Path(b, "eval", "per_image.npz"))
    suite = copied_suite(tmp_path)
    without_figures(suite / "runs" / CURVE_RUN / "curve" / "step_000500" / "results.json")
    before = unchanged_but_locks(tmp_path)
    env = dict(os.environ, PYTHONPATH=str(REPO), PATJAX_CPU_DEVICES="1")
    cases = [
        (("-m", "patjax.evaluate", f"--workdir={a}", f"--workdir={b}", "--compare_only"), f"{b}/eval/per_image.npz"),
        (
            ("-m", "patjax.experiments", "--suite=table1_cpu", f"--workdir={suite}", "--report_only"),
            f"{suite}/runs/{CURVE_RUN}/curve/step_000500/results.json is damaged (no figures)",
        ),
    ]
    for done, (args, message) in zip(commands_at_once([args for args, _ in cases], env), cases):
        assert one_error_line(done).startswith(f"error: {message}"), (args, done.stderr)
    assert unchanged_but_locks(tmp_path) == before


CONFIG_FILES = {
    "raises": (
        "def get_config():\n    raise RuntimeError('no preset')\n",
        ": get_config() raised RuntimeError: no preset",
    ),
    "imports_a_missing_module": (
        "import patjax_no_such_module\n\ndef get_config():\n    return None\n",
        " does not load (ModuleNotFoundError: No module named 'patjax_no_such_module')",
    ),
    "returns_a_dict": (
        "def get_config():\n    return {'model': 'small_cnn'}\n",
        ": get_config() returned a dict, not an ml_collections.ConfigDict; start it from "
        "patjax.run.config.default_config()",
    ),
    "lacks_a_field": (
        "from patjax.run.config import default_config\n\ndef get_config():\n"
        "    cfg = default_config()\n    del cfg.eval['seed']\n    return cfg\n",
        ": get_config()'s config lacks the field eval.seed; start it from patjax.run.config.default_config()",
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", CONFIG_FILES)
def test_a_config_file_that_fails_is_one_line_naming_it_and_no_workdir(tmp_path, case):
    source, message = CONFIG_FILES[case]
    path = tmp_path / "my_config.py"
    path.write_text(source)
    before = tree_hash(tmp_path)
    proc = run_cli("main.py", f"--config={path}", f"--workdir={tmp_path}/run")
    assert one_error_line(proc) == f"error: config file {path}{message}"
    assert tree_hash(tmp_path) == before


@pytest.mark.slow
def test_a_field_the_config_lacks_is_one_line_naming_it_and_no_workdir(tmp_path):
    """On the command line (absl's config flag raises a bare KeyError) and in a config file written
    for config version 1, whose evaluator settings sat at the top of `eval`: a ConfigDict takes the
    new field, which no setting would read (`config.refuse_unknown_fields`)."""
    path = tmp_path / "version_1.py"
    path.write_text(
        "from patjax.run.config import default_config\n\ndef get_config():\n"
        "    cfg = default_config()\n    cfg.eval.pr_samples = 20\n    return cfg\n"
    )
    before = tree_hash(tmp_path)
    main = ("main.py", "--config=quickstart", f"--workdir={tmp_path}/run")
    cases = [
        (
            (*main, "--config.eval.pr_samples=20"),
            "error: --config.eval.pr_samples: the config has no field eval.pr_samples",
        ),
        (
            (*main, "--config.langevin.stepz=2"),
            "error: --config.langevin.stepz: the config has no field langevin.stepz; "
            'Did you mean "steps" instead of "stepz"?',
        ),
        (
            ("main.py", f"--config={path}", f"--workdir={tmp_path}/run"),
            "error: eval.pr_samples is not a config field; it is eval.pr.samples since config version 2",
        ),
    ]
    env = dict(os.environ, PYTHONPATH=str(REPO), PATJAX_CPU_DEVICES="1")
    for done, (args, message) in zip(commands_at_once([args for args, _ in cases], env), cases):
        assert one_error_line(done) == message, args
    assert tree_hash(tmp_path) == before


# Every integer setting declares its range beside its field (`errors.count`); the tables below are
# derived from those declarations, so a count added without a range fails here, and so does a
# settings class the discovery below stops finding.
SETTINGS_CLASSES = {
    "AlpSettings",
    "ApgdSettings",
    "AtprSearchSettings",
    "AtprSettings",
    "AttackSettings",
    "AutoAttackSettings",
    "CertifySettings",
    "ClpSettings",
    "CWSettings",
    "DiagnosticSettings",
    "EvaluationSettings",
    "FgsmSettings",
    "GaussianSettings",
    "LangevinSettings",
    "MartSettings",
    "MethodSettings",
    "ModelSettings",
    "OptimizerSettings",
    "PRSettings",
    "RarePRSettings",
    "SamplerSettings",
    "Settings",
    "SharedSettings",
    "SnisSettings",
    "ThreatModelSettings",
    "TradesSettings",
    "TrainSettings",
}


def settings_classes() -> dict:
    """Every dataclass of the package named *Settings, found by importing each module."""
    import dataclasses
    import importlib
    import inspect
    import pkgutil

    import patjax

    found = {}
    for module in pkgutil.walk_packages(patjax.__path__, "patjax."):
        loaded = importlib.import_module(module.name)
        for name, cls in inspect.getmembers(loaded, inspect.isclass):
            if name.endswith("Settings") and dataclasses.is_dataclass(cls) and cls.__module__ == module.name:
                found[name] = cls
    return found


def declared_ranges() -> dict:
    """{setting name: its Range}, one per setting (a field copied into two classes, attack.steps,
    declares the same range in both)."""
    from patjax.core.errors import declared_counts

    ranges = {}
    for cls in settings_classes().values():
        for r in declared_counts(cls).values():
            assert ranges.setdefault(r.name, r) == r, f"{r.name} declares two ranges"
    return ranges


def test_every_integer_setting_declares_a_bounded_range():
    import dataclasses

    classes = settings_classes()
    assert set(classes) == SETTINGS_CLASSES
    for name, cls in classes.items():
        for field in dataclasses.fields(cls):
            if field.type in ("int", int):
                r = field.metadata.get("range")
                assert r is not None, f"{name}.{field.name} is an integer without a declared range"
                assert isinstance(r.maximum, int) and r.minimum <= r.maximum <= 2**32, (name, field.name, r)


def beyond_message(r, value) -> str:
    sentinel = f", or {r.sentinel} ({r.meaning})" if r.sentinel is not None else ""
    return f"{r.name} must be an integer in [{r.minimum}, {r.maximum}]{sentinel}, got {value}"


def config_with(name, value):
    """The default config with one field set, and what else the value needs to mean what it says: a
    chunk is capped at N, and num_epochs may be 0 once the steps are set (its own test)."""
    cfg = config_lib.default_config()
    cfg.model = "resnet18"  # a network that takes model_width
    if name == "eval.pr.chunk_size":
        cfg.eval.pr.samples = 1_000_000
    if name == "eval.rare_pr.max_levels":  # one level reaches 10^-1 at rho = 0.1: a depth it can reach
        cfg.eval.rare_pr.depth = 1.0
        cfg.eval.rare_pr.decades = (1,)
    if name == "num_epochs":
        cfg.num_train_steps = 7
    if name.startswith(("attack.", "atpr.")):  # a method that reads both blocks, so that they are read back
        cfg.method = "atpr"
    if name == "langevin.steps":  # T = 0 from the uniform start trains on noise (refused: its own test)
        cfg.langevin.init = "clean"
    *blocks, field = name.split(".")
    target = cfg
    for block in blocks:
        target = target[block]
    target[field] = value
    return cfg


def read_back(settings, name):
    """The value `train_settings` holds for the config field `name`."""
    where = {
        "model_width": settings.model.width,
        "num_epochs": settings.optimizer.num_epochs,
        "num_train_steps": settings.optimizer.num_train_steps,
        "eval.num_examples": settings.evaluation.num_examples,
        "eval.batch_size": settings.evaluation.batch_size,
    }
    if name in where:
        return where[name]
    if name in ("langevin.steps", "attack.steps"):  # the blocks of the method's that reads them
        return (settings.method.sampler if name == "langevin.steps" else settings.method.attack).steps
    if name.startswith("atpr."):
        return getattr(settings.method.own, name.split(".")[1])
    if name.startswith("eval."):
        return evaluator_setting(settings.evaluation, name)
    return getattr(settings, name)


def evaluator_setting(evaluation, name):
    """The value an evaluation's settings hold for the eval field `name` (eval.seed, eval.pr.samples)."""
    *block, field = name.split(".")[1:]
    handed = evaluation.evaluator_settings
    return getattr(handed[block[0]] if block else handed.shared, field)


def config_ranges() -> dict:
    """The declared counts a config holds; the others are a command's own flags, named `--flag`."""
    return {name: r for name, r in declared_ranges().items() if not name.startswith("--")}


@pytest.mark.parametrize("name", sorted(config_ranges()))
def test_each_declared_count_is_accepted_at_its_bounds_and_refused_beyond_them(name):
    """Through the config (what --config.NAME, a config file and a workdir's config.json reach) and,
    for the eval block, the API's settings path (`api.evaluate` hands its keyword arguments to it).
    Each value is checked before any model is built or compiled."""
    r = config_ranges()[name]
    accepted = [r.minimum, r.maximum] + ([r.sentinel] if r.sentinel is not None else [])
    for value in accepted:
        assert read_back(config_lib.train_settings(config_with(name, value)), name) == value
    beyond = [r.minimum - 1, r.maximum + 1]
    if r.sentinel == r.minimum - 1:  # the value below the sentinel
        beyond = [r.sentinel - 1, r.maximum + 1]
    for value in beyond:
        with pytest.raises(UserError) as error:
            config_lib.train_settings(config_with(name, value))
        assert str(error.value) == beyond_message(r, value)
    if name.startswith("eval.") and name not in ("eval.num_examples", "eval.batch_size"):
        field = name[len("eval.") :]  # its path, as the API's settings and a suite's overrides name it
        base = {"pr.samples": 1_000_000} if field == "pr.chunk_size" else {}
        if field == "rare_pr.max_levels":
            base = {"rare_pr.depth": 1.0, "rare_pr.decades": (1,)}
        for value in (r.minimum, r.maximum):
            settings = config_lib.default_evaluation_settings("cifar10", {**base, field: value})
            assert evaluator_setting(settings, name) == value
        for value in beyond:
            with pytest.raises(UserError) as error:
                config_lib.default_evaluation_settings("cifar10", {**base, field: value})
            assert str(error.value) == beyond_message(r, value)


@pytest.mark.parametrize("num_epochs, batch_size", [(1_000_000, 1), (50_000, 1)])
def test_a_run_longer_than_the_int32_step_counter_is_refused(num_epochs, batch_size):
    """Each count in its range, the run's length (num_epochs x 50,000 / batch_size steps) is not:
    the train state's int32 step would wrap. 50,000 epochs of one image are 2.5e9 steps."""
    cfg = config_lib.default_config()
    cfg.num_epochs, cfg.batch_size = num_epochs, batch_size
    with pytest.raises(UserError, match=r"more than the int32 step counter holds \(2,147,483,647\)"):
        config_lib.train_settings(cfg)
    cfg.num_epochs = 42_949  # 2,147,450,000 steps
    assert config_lib.train_settings(cfg).total_steps() == 42_949 * 50_000


def test_a_pr_chunk_beyond_the_sample_count_is_capped_at_it():
    settings = config_lib.default_evaluation_settings("cifar10", {"pr.samples": 20, "pr.chunk_size": 5000})
    pr = settings.evaluator_settings["pr"]
    assert (pr.samples, pr.chunk_size) == (20, 20)


# Every integer flag of every command, and where its range is declared: a declared count (its name)
# or a check of its own (said in words). A flag added without an entry fails the guard below.
FLAG_RANGES = {
    ("evaluate", "num_examples"): "eval.num_examples",
    ("evaluate", "batch_size"): "eval.batch_size",
    ("evaluate", "pr_samples"): "eval.pr.samples",
    ("evaluate", "pr_chunk_size"): "eval.pr.chunk_size",
    ("evaluate", "seed"): "eval.seed",
    ("evaluate", "apgd_steps"): "eval.apgd.steps",
    ("evaluate", "model_width"): "model_width",
    ("evaluate", "certify_samples"): "eval.certify.samples",
    ("evaluate", "certify_selection_samples"): "eval.certify.selection_samples",
    ("evaluate", "certify_chunk_size"): "eval.certify.chunk_size",
    ("evaluate", "step"): "a step with a checkpoint or a kept model (workdir.restore)",
    ("diagnose", "num_examples"): "--num_examples",
    ("diagnose", "steps"): "--steps",
    ("diagnose", "chains"): "--chains",
    ("diagnose", "seed"): "--seed",
    ("diagnose", "compare_steps"): "langevin.steps",
    ("experiments", "max_runs"): "[1, 1,000,000] (runner.run_suite)",
    ("experiments", "num_workers"): "K >= 1 (workers.worker_slot: positions modulo K)",
    ("experiments", "worker_index"): "[0, K - 1] (workers.worker_slot)",
    ("main", "stop_after_steps"): "[1, 2^31 - 1] (train.train_run)",
    ("export", "step"): "a step with a checkpoint or a kept model (workdir.restore)",
}


def test_every_integer_flag_of_every_command_has_its_range_declared():
    import ast

    found = set()
    for path in (REPO / "patjax").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "DEFINE_integer":
                if isinstance(node.args[0], ast.Constant):  # else a flag made from a table, below
                    found.add((path.stem, node.args[0].value))
    # The evaluate command's aliases, each an integer flag where its path's field is one.
    block = config_lib.default_eval_block()
    found |= {("evaluate", name) for name, (path, _) in evaluate.ALIASES.items() if type(block[path]) is int}
    assert found == set(FLAG_RANGES)
    for where in FLAG_RANGES.values():
        assert where in declared_ranges() or " (" in where, where


@pytest.mark.slow
@pytest.mark.long
def test_each_count_flag_is_refused_beyond_its_bound_in_one_line_naming_the_flag_writing_nothing(tmp_path):
    """Every integer flag whose range is a declared count, beyond its upper bound (and the
    evaluation's below its lower one), and the commands' own: the line names the flag the user
    typed, not the config field it sets (the API's path names the field, eval.pr.samples, which is
    what a caller there set)."""
    run = REPO / "docs" / "results" / "convergence_cpu" / "runs" / "cifar10_small_cnn" / "pat_s0"
    workdir = tmp_path / "pat_s0"
    workdir.mkdir()
    shutil.copy(run / "config.json", workdir)
    shutil.copytree(run / "models", workdir / "models", ignore=lambda d, names: [n for n in names if "005850" not in n])
    before = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    command = {
        "evaluate": ("-m", "patjax.evaluate", f"--workdir={workdir}"),
        "diagnose": ("-m", "patjax.diagnose", f"--workdir={workdir}", "--compare_tolerance=0.1"),
    }
    cases = []
    for (module, flag), name in FLAG_RANGES.items():
        if module in command and name in declared_ranges() and flag != "model_width":  # it comes with a file
            r = declared_ranges()[name]
            message = beyond_message(r, r.maximum + 1).replace(r.name, f"--{flag}", 1)
            cases.append(((*command[module], f"--{flag}={r.maximum + 1}"), f"error: {message}"))
    cases += [
        ((*command["evaluate"], "--num_examples=0"), "error: --num_examples must be an integer in [1, 1000000], or -1"),
        ((*command["evaluate"], "--batch_size=0"), "error: --batch_size must be an integer in [1, 10000], got 0"),
        (("-m", "patjax.diagnose", f"--workdir={workdir}", "--tolerance=-0.5"), "error: --tolerance must be >= 0"),
        # Checked as the compared sampler's langevin.tolerance, before the diagnostic runs.
        ((*command["diagnose"][:-1], "--compare_tolerance=-0.5"), "error: --compare_tolerance must be >= 0 (0: always"),
        (("main.py", "--config=quickstart", f"--workdir={tmp_path}/run", "--stop_after_steps=0"), "error: --stop_a"),
        (
            ("-m", "patjax.experiments", "--suite=smoke_cpu", f"--workdir={tmp_path}/s", "--max_runs=1000001"),
            "error: --m",
        ),
    ]
    assert len(cases) == 20
    env = dict(os.environ, PYTHONPATH=str(REPO), PATJAX_CPU_DEVICES="1")
    for done, (args, start) in zip(commands_at_once([args for args, _ in cases], env), cases):
        line = one_error_line(done)
        assert line.startswith(start) and "eval." not in line and "langevin." not in line, (args, line)
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == before


@pytest.mark.parametrize("field", ["attack.eps", "cw.kappa", "pr.epsilons"])
def test_a_float_setting_infinite_in_float32_is_refused(field):
    """1e39 is a finite Python float and inf in the float32 attack or noise it sets."""
    value = (1e39,) if field == "pr.epsilons" else 1e39
    with pytest.raises(UserError) as error:
        config_lib.default_evaluation_settings("cifar10", {field: value})
    assert str(error.value) == f"eval.{field} must be a finite number in float32 (|x| <= 3.4e38), got {value!r}"


def documented_bound(text: str) -> int:
    """A bound as docs/inputs.md writes it: 100,000, 2^32 - 1, -(2^31 - 1)."""
    sign = -1 if text.startswith("-") else 1
    text = text.strip("-()").replace(",", "").replace(" ", "")
    if "^" in text:
        power, minus = (text.split("-") + ["0"])[:2]
        base, exponent = power.split("^")
        return sign * (int(base) ** int(exponent) - int(minus))
    return sign * int(text)


def test_docs_inputs_states_each_declared_count_range_as_the_code_declares_it():
    """docs/inputs.md's table of configuration fields against the declarations: a bound changed
    in one place and not the other fails here, and so does a declared count with no row."""
    lines = (REPO / "docs" / "inputs.md").read_text().splitlines()
    rows = [line for line in lines if line.startswith("| `")]
    # A command's own flags (`--steps`) are rows of its part of the commands' table.
    start = next(i for i, line in enumerate(lines) if line.startswith("| `python -m patjax.diagnose`"))
    diagnose = [line for line in lines[start:] if line.startswith("| ")]
    diagnose = diagnose[: next(i for i, line in enumerate(diagnose) if i and not line.startswith("| | "))]
    for name, r in declared_ranges().items():
        table, column = (diagnose, 2) if name.startswith("--") else (rows, 1)
        row = next((row for row in table if f"`{name}`" in row.split("|")[column]), None)
        assert row is not None, f"docs/inputs.md has no row for {name}"
        row = "|".join(row.split("|")[column - 1 :])
        found = re.search(r"\[(-?\(?[\d,^ -]+?\)?), ([\d,^ -]+)\]", row.split("|")[2])
        assert found, row
        assert (documented_bound(found[1]), documented_bound(found[2])) == (r.minimum, r.maximum), row
        if r.sentinel is not None:
            assert f"or {r.sentinel}" in row.split("|")[2], row


@pytest.mark.slow
@pytest.mark.long
def test_the_training_command_refuses_each_declared_count_beyond_its_bound_in_one_line_writing_nothing(tmp_path):
    """`--config.NAME=maximum + 1` for every declared count, each in its own process (the lower
    bounds' refusals take the same path: the test above tries them through the config)."""
    ranges = config_ranges()
    names = sorted(ranges)
    commands = [
        (
            "main.py",
            "--config=configs/quickstart.py",
            f"--workdir={tmp_path / 'run'}",
            f"--config.{n}={ranges[n].maximum + 1}",
        )
        for n in names
    ]
    env = dict(os.environ, PATJAX_CPU_DEVICES="1")
    for done, name in zip(commands_at_once(commands, env=env), names):
        assert one_error_line(done) == f"error: {beyond_message(ranges[name], ranges[name].maximum + 1)}"
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------------------------
# Radii: each norm's own defaults, L-inf radii in [0, 1], fractions where a radius is typed.


@pytest.mark.parametrize(
    "overrides, eps, step",
    [
        ({"attack.norm": "l2"}, 0.5, 0.125),  # RobustBench's and AutoAttack's L2 radius, not 8/255
        ({"attack.norm": "linf"}, 8 / 255, 2 / 255),
        ({"attack.norm": "l2", "attack.eps": 1.0}, 1.0, 0.125),  # a radius given wins, the step is L2's
        ({"attack.norm": "l2", "attack.step_size": 0.1}, 0.5, 0.1),
        ({"attack.eps": 4 / 255}, 4 / 255, 2 / 255),  # no norm given: the config's
    ],
)
def test_a_norm_chosen_without_a_radius_takes_its_standard_radius_and_step(overrides, eps, step):
    threat = config_lib.default_evaluation_settings("cifar10", overrides).evaluator_settings["attack"]
    assert (threat.eps, threat.step_size) == (eps, step)


def test_a_norm_chosen_without_a_radius_replaces_the_radius_of_the_workdirs_norm():
    """A config evaluated under L2 at 0.5 and asked for L-inf gets 8/255, not 0.5 as an L-inf radius."""
    cfg = config_lib.default_config()
    cfg.eval.attack.norm, cfg.eval.attack.eps, cfg.eval.attack.step_size = "l2", 0.5, 0.125
    threat = config_lib.evaluation_settings(cfg, {"attack.norm": "linf"}).evaluator_settings["attack"]
    assert (threat.norm, threat.eps, threat.step_size) == ("linf", 8 / 255, 2 / 255)


@pytest.mark.parametrize(
    "make, message",
    [
        (
            lambda: config_lib.default_evaluation_settings("cifar10", {"attack.eps": 8.0}),
            "eval.attack.eps=8 > 1: did you mean 8/255 = 0.0314? (L-inf radii are in [0, 1])",
        ),
        (
            lambda: config_lib.default_evaluation_settings("cifar10", {"attack.step_size": 2.0}),
            "eval.attack.step_size=2 > 1: did you mean 2/255 = 0.0078? (L-inf radii are in [0, 1])",
        ),
        (
            lambda: config_lib.train_settings(tiny_config(method="pgd", **{"attack.epsilon": 8.0})),
            "attack.epsilon=8 > 1: did you mean 8/255 = 0.0314? (L-inf radii are in [0, 1])",
        ),
        (
            lambda: config_lib.train_settings(tiny_config(method="trades", **{"attack.step_size": 2.0})),
            "attack.step_size=2 > 1: did you mean 2/255 = 0.0078? (L-inf radii are in [0, 1])",
        ),
    ],
)
def test_an_linf_radius_above_one_is_refused_with_its_likely_meaning(make, message):
    with pytest.raises(UserError) as error:
        make()
    assert str(error.value) == message


# Appendix E's value of each sampler setting, written out.
APPENDIX_E = {"steps": "100", "step_size": "0.3", "c1": "0.3"}


def ignores_x(method: str, field: str) -> str:
    return (
        f"{method} trains on Algorithm 1's samples, which from langevin.init = 'uniform' with langevin.{field} = 0 do "
        "not depend on x (the chain reaches x only by its steps on the energy's c1 ||x_adv - x||^2); set "
        f"langevin.{field} > 0 (Appendix E: {APPENDIX_E[field]}) or langevin.init = 'clean'"
    )


@pytest.mark.parametrize("method", ["pat", "pat_wos"])
@pytest.mark.parametrize("field", sorted(APPENDIX_E))
def test_a_sampler_whose_samples_from_the_uniform_start_ignore_x_is_refused_for_the_methods_that_train_on_it(
    method, field
):
    """Algorithm 1 starts at Uniform[0,1]^d: with T = 0 the batch is the same noise whatever x is,
    and with a zero step size or c1 = 0 no step moves it toward x (tests/pat/test_samplers.py checks
    all three on the sampler itself), so the run would train on images unrelated to their labels. From x
    (init='clean') the samples depend on x, and a method that does not read the sampler ignores it."""
    given = {f"langevin.{field}": 0}
    with pytest.raises(UserError) as error:
        config_lib.train_settings(tiny_config(method=method, **given))
    assert str(error.value) == ignores_x(method, field)
    clean_start = tiny_config(method=method, **given, **{"langevin.init": "clean"})
    assert getattr(config_lib.train_settings(clean_start).method.sampler, field) == 0
    assert config_lib.train_settings(tiny_config(method="pgd", **given)).method.sampler is None


@pytest.mark.slow
def test_the_training_command_refuses_a_sampler_without_steps_from_noise_in_one_line_writing_nothing(tmp_path):
    before = tree_hash(tmp_path)
    done = run_cli("main.py", "--config=quickstart", f"--workdir={tmp_path}/run", "--config.langevin.steps=0")
    assert one_error_line(done) == "error: " + ignores_x("pat", "steps")
    assert tree_hash(tmp_path) == before


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            {"pr.epsilons": (8.0, 16.0)},
            "eval.pr.epsilons=8,16 > 1: did you mean 8/255 = 0.0314, 16/255 = 0.0627? "
            "(the uniform and gaussian laws' radii are per pixel, in [0, 1])",
        ),
        (
            {"pr.epsilons": (0.1, 8.0)},
            "eval.pr.epsilons=0.1,8: 8 > 1: did you mean 8/255 = 0.0314? (the uniform and gaussian laws' radii "
            "are per pixel, in [0, 1])",
        ),
        (
            {"pr.distribution": "gaussian", "pr.distributions": ("gaussian",), "pr.epsilons": (8.0,)},
            "eval.pr.epsilons=8 > 1: did you mean 8/255 = 0.0314? (the gaussian laws' radii are per pixel, in [0, 1])",
        ),
    ],
)
def test_a_pr_radius_of_a_per_pixel_law_above_one_is_refused_with_its_likely_meaning(overrides, message):
    """The rule of the attacks' L-inf radius, for PR's uniform and Gaussian laws: the settings
    class checks it, so a flag, a config file and the API meet the same line."""
    with pytest.raises(UserError) as error:
        config_lib.default_evaluation_settings("cifar10", overrides)
    assert str(error.value) == message
    cfg = config_lib.default_config()
    cfg.eval.pr.epsilons = overrides["pr.epsilons"]
    for path in ("pr.distribution", "pr.distributions"):
        if path in overrides:
            cfg.eval.pr[path.split(".")[1]] = overrides[path]
    with pytest.raises(UserError, match=re.escape(message)):
        config_lib.evaluation_settings(cfg)
    with pytest.raises(UserError, match=re.escape(message)):
        api.evaluate(
            linear_logits,
            np.zeros((2, 32, 32, 3), np.uint8),
            np.zeros(2, np.int32),
            pr=dict({k.split(".")[1]: v for k, v in overrides.items()}),
        )


def test_l2_radii_given_beside_the_per_pixel_laws_are_refused_naming_how_they_go():
    with pytest.raises(UserError) as error:
        config_lib.default_evaluation_settings("cifar10", {"pr.distribution": "uniform_l2", "pr.epsilons": (0.5, 2.0)})
    assert str(error.value) == (
        "eval.pr.epsilons=0.5,2: 2 > 1: did you mean 2/255 = 0.0078? (the uniform and gaussian laws' radii are per "
        "pixel, in [0, 1]; uniform_l2's radii: with eval.pr.distributions=uniform_l2 alone)"
    )


def test_an_l2_pr_radius_above_one_is_a_radius():
    """uniform_l2's radii are L2 norms (the L2 preset's reach 8)."""
    overrides = {"pr.distribution": "uniform_l2", "pr.distributions": ("uniform_l2",), "pr.epsilons": (0.5, 8.0)}
    assert config_lib.default_evaluation_settings("cifar10", overrides).evaluator_settings["pr"].epsilons == (0.5, 8.0)


def test_an_l2_attack_radius_the_size_of_an_linf_one_is_said_in_one_line_and_run(capsys, monkeypatch):
    from patjax.core import errors

    monkeypatch.setattr(errors, "_SAID", set())
    threat = config_lib.default_evaluation_settings("cifar10", {"attack.norm": "l2", "attack.eps": 8 / 255})
    assert threat.evaluator_settings["attack"].eps == 8 / 255
    config_lib.train_settings(tiny_config(method="pgd", **{"attack.norm": "l2", "attack.epsilon": 0.03}))
    lines = capsys.readouterr().err.splitlines()
    assert lines == [
        "warning: L2 attack radius eval.attack.eps=0.03137 (= 8/255) is below 0.05, the size of an L-inf radius; "
        "L2's standard radius on CIFAR-10 is 0.5 (run as given)",
        "warning: L2 attack radius attack.epsilon=0.03 (= 7.65/255) is below 0.05, the size of an L-inf radius; "
        "L2's standard radius on CIFAR-10 is 0.5 (run as given)",
    ]
    config_lib.default_evaluation_settings("cifar10", {"attack.norm": "l2"})  # the standard 0.5: nothing said
    assert capsys.readouterr().err == ""


def test_an_l2_radius_above_one_is_a_radius():
    """Above 1 is an L2 radius like any other (the L2 preset's PR radii reach 8)."""
    threat = config_lib.default_evaluation_settings("cifar10", {"attack.norm": "l2", "attack.eps": 2.0})
    assert threat.evaluator_settings["attack"].eps == 2.0
    assert config_lib.train_settings(tiny_config(method="pgd", **{"attack.norm": "l2", "attack.epsilon": 2.0}))


@pytest.mark.parametrize("text, value", [("8/255", 8 / 255), ("0.5", 0.5), ("1/4", 0.25), (" 3 / 2 ", 1.5)])
def test_a_radius_is_read_as_a_number_or_a_fraction(text, value):
    from patjax.core import cli

    assert cli.FractionParser().parse(text) == value


@pytest.mark.parametrize("text", ["8/0", "8/", "a/255", "1/2/3"])
def test_a_fraction_that_is_not_one_is_refused_naming_it(text):
    from patjax.core import cli

    with pytest.raises(UserError, match=f"expected a number or a fraction such as 8/255, got {re.escape(repr(text))}"):
        cli.FractionParser().parse(text)


@pytest.mark.slow
def test_the_commands_refuse_an_linf_radius_in_pixel_levels_and_take_fractions(tmp_path):
    """Evaluation and training alike: 8 meant as 8/255 is one line with that reading, before any
    model or data is read and with nothing written; 8/255 is taken (the step's refusal comes after it)."""
    models, run = tmp_path / "models", tmp_path / "run"
    evaluate = ("-m", "patjax.evaluate", "--robustbench=Carmon2019Unlabeled", f"--robustbench_dir={models}")
    train = ("main.py", "--config=configs/quickstart.py", f"--workdir={run}")
    cases = [
        ((*evaluate, "--attack_eps=8"), "--attack_eps=8 > 1: did you mean 8/255 = 0.0314?"),
        ((*evaluate, "--attack_eps=8/255", "--attack_step_size=2"), "--attack_step_size=2 > 1: did you mean 2/255"),
        ((*evaluate, "--attack_eps=8/0"), "expected a number or a fraction such as 8/255, got '8/0'"),
        ((*evaluate, "--pr_epsilons=8,16"), "--pr_epsilons=8,16 > 1: did you mean 8/255 = 0.0314, 16/255 = 0.0627?"),
        ((*evaluate, "--pr_preset=prbench", "--pr_epsilons=8"), "--pr_epsilons=8 > 1: did you mean 8/255"),
        ((*train, "--config.attack.epsilon=8"), "attack.epsilon=8 > 1: did you mean 8/255 = 0.0314?"),
        ((*train, "--config.attack.epsilon=8/255", "--config.attack.step_size=2"), "attack.step_size=2 > 1"),
    ]
    env = dict(os.environ, PYTHONPATH=str(REPO), PATJAX_CPU_DEVICES="1")
    for done, (args, message) in zip(commands_at_once([args for args, _ in cases], env), cases):
        assert one_error_line(done).startswith(f"error: {message}"), (args, done.stderr)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("shape", [(2, 0, 32, 3), (2, 32, 0, 3), (2, 0, 0, 3), (2, 32, 32, 0)])
def test_images_without_pixels_are_refused_naming_their_shape_before_the_model(shape):
    """Zero height or width used to reach the model and come back as 'logits not finite'."""
    with pytest.raises(UserError) as error:
        api.evaluate(linear_logits, np.zeros(shape, np.uint8), np.zeros(2, np.int32), evaluators="clean")
    assert str(error.value) == f"images of shape {shape} have no pixels (height, width or channels 0)"


def test_a_data_file_the_user_cannot_read_is_one_line_naming_it(tmp_path, monkeypatch):
    """Tests run as root, who reads any file: np.fromfile is made to fail as it does for a user
    without read permission."""
    from patjax.data import cifar, download

    folder = tmp_path / download.ARCHIVES["cifar10"][3]
    folder.mkdir()
    for name in download.SPLIT_FILES["cifar10"]["test"]:
        (folder / name).write_bytes(b"")

    def denied(path, dtype=None):
        raise PermissionError(13, "Permission denied", path)

    monkeypatch.setattr(np, "fromfile", denied)
    with pytest.raises(UserError) as error:
        cifar.load_split("cifar10", "test", str(tmp_path))
    assert str(error.value) == f"{folder / 'test_batch.bin'}: cannot be read (Permission denied)"


@pytest.mark.parametrize(
    "name, hint",
    [("quikstart", "did you mean quickstart? "), ("pat_cifar1O.py", "did you mean pat_cifar10? "), ("zzz", "")],
)
def test_a_mistyped_config_name_lists_the_shipped_configs(tmp_path, monkeypatch, name, hint):
    from patjax import configs

    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError) as error:
        configs.load_file(name)
    assert str(error.value) == (
        f"config file {name}: no such file; {hint}--config takes a config file or a shipped config's name: "
        f"{', '.join(configs.NAMES)}"
    )
    assert configs.NAMES[:3] == ("quickstart", "pat_cifar10", "pat_cifar100")


def test_a_norm_set_on_the_training_command_line_without_a_radius_takes_its_standard_one(capsys):
    from patjax import main as main_lib

    cfg = tiny_config(method="pgd")
    main_lib.complete_threat_models(cfg, {"attack.norm": "l2", "eval.attack.norm": "l2", "eval.attack.eps": 1.0})
    assert (cfg.attack.epsilon, cfg.attack.step_size) == (0.5, 0.125)
    assert (cfg.eval.attack.eps, cfg.eval.attack.step_size) == (8 / 255, 0.125)  # the given radius is set later
    assert capsys.readouterr().out.splitlines() == [
        "--config.attack.norm=l2: --config.attack.epsilon=0.5, --config.attack.step_size=0.125, the standard L2 "
        "radius and step on CIFAR-10",
        "--config.eval.attack.norm=l2: --config.eval.attack.step_size=0.125, the standard L2 radius and step on "
        "CIFAR-10",
    ]
    cfg = tiny_config(method="pgd")
    main_lib.complete_threat_models(cfg, {"attack.norm": "l2", "attack.epsilon": 1.0, "attack.step_size": 0.25})
    assert (cfg.attack.epsilon, cfg.attack.step_size) == (8 / 255, 2 / 255)  # nothing filled: ml_collections sets them
    assert capsys.readouterr().out == ""


def test_a_norm_set_in_a_config_file_without_a_radius_takes_its_standard_one(capsys):
    """A config file that sets attack.norm = 'l2' and keeps the default radius and step (8/255,
    2/255: L-inf's) trains and evaluates at L2's 0.5 and 0.125, said in one line each; a radius
    the file sets is kept, and no shipped config's settings change."""
    from patjax import configs
    from patjax import main as main_lib

    cfg = tiny_config(method="pgd", **{"attack.norm": "l2", "eval.attack.norm": "l2", "eval.attack.eps": 0.25})
    main_lib.complete_threat_models(cfg, {})
    assert (cfg.attack.epsilon, cfg.attack.step_size) == (0.5, 0.125)
    assert (cfg.eval.attack.eps, cfg.eval.attack.step_size) == (0.25, 0.125)
    assert capsys.readouterr().out.splitlines() == [
        "the config's attack.norm=l2: attack.epsilon=0.5, attack.step_size=0.125, the standard L2 radius and step "
        "on CIFAR-10",
        "the config's eval.attack.norm=l2: eval.attack.step_size=0.125, the standard L2 radius and step on CIFAR-10",
    ]
    # The command line's norm is the command line's rule: the file's radius is not read as unset.
    cfg = tiny_config(method="pgd", **{"attack.norm": "l2"})
    main_lib.complete_threat_models(cfg, {"attack.norm": "l2", "attack.epsilon": 1.0})
    assert cfg.attack.step_size == 0.125 and capsys.readouterr().out.count("\n") == 1
    for name in configs.NAMES:
        shipped = configs.load_file(configs.path(name))
        before = shipped.to_dict()
        main_lib.complete_threat_models(shipped, {})
        assert shipped.to_dict() == before, name
    assert capsys.readouterr().out == ""


@pytest.mark.slow
def test_the_training_command_says_the_radius_a_norm_took(tmp_path):
    """The command line's overrides are what decides (ml_collections' record of them): the line
    comes before the method's own refusal (fgsm has no L2 form), which ends the command."""
    run = run_cli(
        "main.py",
        "--config=configs/quickstart.py",
        f"--workdir={tmp_path}/run",
        "--config.method=fgsm",
        "--config.attack.norm=l2",
    )
    assert run.stdout.splitlines()[0] == (
        "--config.attack.norm=l2: --config.attack.epsilon=0.5, --config.attack.step_size=0.125, the standard L2 "
        "radius and step on CIFAR-10"
    )
    assert one_error_line(run).startswith("error: fgsm's inner attack has no l2 form")
    assert os.listdir(tmp_path) == []


def test_the_advice_for_a_missing_evaluation_names_the_command_that_makes_it(tmp_path):
    """A learning-curve point is made by --step (a plain evaluation would write eval/ instead)."""
    from patjax.run import eval_files

    run = str(tmp_path / "run")
    with pytest.raises(UserError) as error:
        eval_files.load_results(run)
    assert str(error.value).endswith(f"; run python -m patjax.evaluate --workdir={run}")
    with pytest.raises(UserError) as error:
        eval_files.load_results(run, 400)
    assert str(error.value).endswith(f"; run python -m patjax.evaluate --workdir={run} --step=400")
