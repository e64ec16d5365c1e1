"""End to end: train, checkpoint, resume (bitwise), evaluate; bad input fails cleanly."""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest
import tensorflow_datasets as tfds
from conftest import REPO, train_run
from helpers import tiny_config

from patjax.configs import quickstart
from patjax.core.errors import UserError
from patjax.data import cifar
from patjax.run import config, evaluation, train


def params_of(state):
    return jax.device_get(state.params), jax.device_get(state.batch_stats), jax.device_get(state.opt_state)


def assert_trees_equal(a, b):
    jax.tree.map(np.testing.assert_array_equal, a, b)


@pytest.mark.slow
def test_quickstart_on_mock_tfds_trains_checkpoints_resumes_and_evaluates(tmp_path):
    workdir = str(tmp_path / "run")
    with tfds.testing.mock_data(num_examples=24):
        state = train_run(tiny_config(data_dir=cifar.TFDS), workdir)
        assert int(state.step) == 4
        assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == ["2", "4"]
        # Resume with a longer run: continues from step 4, not from scratch. The 4-step run's
        # learning-rate milestones (steps 3 and 4) are kept where they were (a longer run with the
        # same fractions would move them, which is refused).
        with pytest.raises(UserError, match="milestones"):
            train_run(tiny_config(data_dir=cifar.TFDS, num_train_steps=6), workdir)
        longer = tiny_config(data_dir=cifar.TFDS, num_train_steps=6, lr_decay_fractions=(0.5, 4 / 6))
        state = train_run(longer, workdir)
        assert int(state.step) == 6
        results = evaluation.evaluate_workdir(workdir, progress=False)
    lines = [json.loads(l) for l in open(os.path.join(workdir, "metrics.jsonl"))]
    assert [l["step"] for l in lines] == [2, 4, 6]
    # The rate of each window's last step (0-based 1, 3, 5): milestones at 3 and 4 passed before
    # the run was extended and kept; none after, so the rate never goes back up.
    lr = tiny_config().learning_rate
    np.testing.assert_allclose([l["learning_rate"] for l in lines], [lr, lr * 0.1, lr * 0.01], rtol=1e-6)
    for key in (
        "loss",
        "adv_accuracy",
        "snis_weight_mean",
        "snis_weight_max",
        "learning_rate",
        "images_per_s",
        "test_clean_accuracy",
    ):
        assert np.isfinite(lines[-1][key]), key
    assert os.listdir(os.path.join(workdir, "tensorboard"))
    saved = json.load(open(os.path.join(workdir, "eval", "results.json")))
    assert saved == json.loads(json.dumps(results))
    assert 0.0 <= saved["clean_accuracy"] <= 1.0
    assert set(saved["pr"]) == {"0.1", "0.12", "0.15", "0.2"}
    assert saved["settings"]["pr"]["samples"] == 4 and saved["settings"]["num_examples"] == 16


@pytest.mark.slow
def test_interrupted_then_resumed_equals_uninterrupted_bitwise(tmp_path, fake_data_dir):
    cfg = tiny_config(data_dir=fake_data_dir)
    straight = train_run(cfg, str(tmp_path / "a"))
    first = train_run(cfg, str(tmp_path / "b"), stop_after_steps=2)
    assert int(first.step) == 2
    resumed = train_run(cfg, str(tmp_path / "b"))
    assert int(resumed.step) == 4
    assert_trees_equal(params_of(straight), params_of(resumed))
    # A time limit already passed: the step under way ends the invocation, with a checkpoint.
    timed = train_run(cfg, str(tmp_path / "c"), stop_at=0.0)
    assert int(timed.step) == 1 and os.listdir(os.path.join(tmp_path, "c", "checkpoints")) == ["1"]
    assert_trees_equal(params_of(straight), params_of(train_run(cfg, str(tmp_path / "c"))))
    # Each sitting logs the windows it trained: over all sittings, every step once.
    for name in ("a", "b", "c"):
        with open(tmp_path / name / train.METRICS_FILE) as f:
            assert sum(json.loads(line)["window_steps"] for line in f) == 4, name


def test_training_time_is_summed_over_the_windows_of_every_sitting(tmp_path):
    lines = [
        {"step": 195, "images_per_s": 100.0},  # a log from before window_steps: 195 steps
        {"step": 300, "images_per_s": 50.0},  # stopped mid-epoch: 105 steps
        {"step": 390, "images_per_s": 90.0, "window_steps": 90},
        # a sitting killed after logging step 390 resumed from its checkpoint at 300
        {"step": 390, "images_per_s": 45.0, "window_steps": 90},
    ]
    (tmp_path / train.METRICS_FILE).write_text("".join(json.dumps(line) + "\n" for line in lines))
    expected = 195 * 256 / 100 + 105 * 256 / 50 + 90 * 256 / 90 + 90 * 256 / 45
    step, seconds = train.logged_training(str(tmp_path), 256)
    assert step == 390 and seconds == pytest.approx(expected, rel=1e-12)
    assert train.logged_training(str(tmp_path / "nothing"), 256) is None
    # A last line without its newline: one a running training is still writing (not counted
    # yet), or in a finished run's log, damage.
    log = tmp_path / train.METRICS_FILE
    with open(log, "a") as f:
        f.write('{"step": 480, "images_per')
    assert train.logged_training(str(tmp_path), 256, in_progress=True) == (step, seconds)
    with pytest.raises(UserError, match="line 5"):
        train.logged_training(str(tmp_path), 256)
    # A sitting that resumes drops the cut line before appending its own.
    writer = train._MetricWriter(str(tmp_path))
    writer.write(480, {"images_per_s": 90.0, "window_steps": 90})
    writer.close()
    assert train.logged_training(str(tmp_path), 256) == (480, pytest.approx(expected + 90 * 256 / 90, rel=1e-12))
    # A log without a complete line: not started.
    log.write_text('{"step": 1')
    assert train.logged_training(str(tmp_path), 256, in_progress=True) is None
    for bad in ('{"step": 390, "images_per_s": 45.0}\n', '{"step": 480, "images_per\n'):
        log.write_text(json.dumps(lines[0]) + "\n" + json.dumps(lines[2]) + "\n" + bad)
        with pytest.raises(UserError, match="line 3"):
            train.logged_training(str(tmp_path), 256, in_progress=True)


@pytest.mark.slow
def test_incomplete_checkpoint_is_never_restored(tmp_path, fake_data_dir):
    cfg = tiny_config(data_dir=fake_data_dir, num_train_steps=2)
    workdir = tmp_path / "run"
    train_run(cfg, str(workdir))
    # What a kill during a save leaves behind: Orbax's temporary directory for step 4.
    partial = workdir / "checkpoints" / "4.orbax-checkpoint-tmp"
    (partial / "default.orbax-checkpoint-tmp").mkdir(parents=True)
    (partial / "default.orbax-checkpoint-tmp" / "manifest.ocdbt").write_bytes(b"\0" * 10)
    longer = tiny_config(
        data_dir=fake_data_dir, num_train_steps=3, lr_decay_fractions=(2 / 3, 2 / 3)
    )  # milestones stay at 2
    state = train_run(longer, str(workdir))
    assert int(state.step) == 3  # resumed from step 2, the last complete checkpoint


@pytest.mark.slow
def test_resume_with_a_different_config_is_refused_and_leaves_the_workdir(tmp_path, fake_data_dir):
    workdir = str(tmp_path / "run")
    train_run(tiny_config(data_dir=fake_data_dir, num_train_steps=2), workdir)
    before = open(os.path.join(workdir, "config.json")).read()
    with pytest.raises(UserError, match="langevin.c1"):
        train_run(tiny_config(data_dir=fake_data_dir, **{"langevin.c1": 0.5}), workdir)
    assert open(os.path.join(workdir, "config.json")).read() == before
    assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == ["2"]


def run_cli(*args, cwd=REPO):
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize(
    "override,message",
    [  # two fast cases, one per place an error is raised (main, absl's config load); the rest slow
        pytest.param("--config.model=resnet1000", "unknown model", marks=pytest.mark.slow),
        pytest.param("--config.dataset=mnist", "unknown dataset", marks=pytest.mark.slow),
        ("--config.method=magic", "unknown method"),
        pytest.param("--config.data_dir=/nonexistent", "lacks the cifar10 train split", marks=pytest.mark.slow),
        # Values that parse but make no sense to train with: refused in one line too.
        pytest.param("--config.langevin.step_size=-0.3", "langevin.step_size", marks=pytest.mark.slow),
        pytest.param("--config.learning_rate=-0.05", "learning_rate must be > 0", marks=pytest.mark.slow),
        pytest.param(
            "--config.eval.pr.epsilons=(-0.1,0.2)",
            "eval.pr.epsilons must be non-empty and non-negative",
            marks=pytest.mark.slow,
        ),
        pytest.param(
            "--stop_after_steps=-1",
            "--stop_after_steps must be an integer in [1, 2147483647], got -1",
            marks=pytest.mark.slow,
        ),
        pytest.param(
            "--max_minutes=0",
            "--max_minutes must be a positive number of minutes, got 0.0",
            marks=pytest.mark.slow,
        ),
        pytest.param(
            "--config.num_train_steps=-5",
            "num_train_steps must be an integer in [1, 2147483647], or -1 (num_epochs sets the length)",
            marks=pytest.mark.slow,
        ),
        # Errors raised while absl loads the config, before main runs: one line, not a traceback.
        ("--config.nonexistent_field=1", "nonexistent_field"),
        pytest.param("--config.batch_size=abc", "invalid literal", marks=pytest.mark.slow),
        pytest.param(
            "--config=configs/no_such_config.py",
            "config file configs/no_such_config.py: no such file",
            marks=pytest.mark.slow,
        ),
    ],
)
def test_main_rejects_bad_input_with_one_line_and_nonzero_exit(tmp_path, override, message):
    workdir = tmp_path / "run"
    proc = run_cli("main.py", "--config=configs/quickstart.py", override, f"--workdir={workdir}")
    assert proc.returncode == 2
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr
    error_lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(error_lines) == 1 and message in error_lines[0]  # the message is one line
    assert not workdir.exists() or not (workdir / "config.json").exists()  # nothing written


@pytest.mark.slow
def test_evaluate_without_checkpoint_fails_cleanly(tmp_path):
    proc = run_cli("-m", "patjax.evaluate", f"--workdir={tmp_path}")
    assert proc.returncode == 2 and "not a patjax workdir" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_config_json_holds_an_absolute_data_dir_and_a_moved_data_dir_resumes(tmp_path, fake_data_dir, monkeypatch):
    # A relative --config.data_dir is saved absolute, so patjax.evaluate run from another
    # directory finds the data; data_dir may change on resume (the data moved), other fields not.
    workdir = str(tmp_path / "run")
    monkeypatch.chdir(os.path.dirname(fake_data_dir))
    train_run(tiny_config(data_dir=os.path.basename(fake_data_dir), num_train_steps=2), workdir)
    saved = json.load(open(os.path.join(workdir, "config.json")))
    assert saved["data_dir"] == os.path.abspath(fake_data_dir)
    monkeypatch.chdir(tmp_path)
    link = str(tmp_path / "moved_data")
    os.symlink(fake_data_dir, link)
    state = train_run(tiny_config(data_dir=link, num_train_steps=3, lr_decay_fractions=(2 / 3, 2 / 3)), workdir)
    assert int(state.step) == 3


@pytest.mark.slow
def test_training_ends_saying_where_the_model_is_its_accuracy_on_which_images_and_what_to_run_next(tmp_path, data_dir):
    workdir = tmp_path / "run"
    tiny = ["batch_size=8", "num_train_steps=2", "langevin.steps=2", "log_every_steps=2", "log_test_examples=16"]
    tiny += ["checkpoint_every_steps=2", "progress_bar=False", "eval.num_examples=16", f"data_dir={data_dir}"]
    proc = run_cli(
        "main.py", "--config=configs/quickstart.py", f"--workdir={workdir}", *[f"--config.{o}" for o in tiny]
    )
    assert proc.returncode == 0, proc.stderr
    logged = json.loads(open(workdir / "metrics.jsonl").readline())["test_clean_accuracy"]
    assert proc.stdout.splitlines()[-3:] == [
        f"trained pat to step 2 of 2: {workdir / 'checkpoints' / '2'}",
        f"clean accuracy {100 * logged:.1f} % on the first 16 CIFAR-10 test images (the training log's check; "
        "metrics.jsonl), not an evaluation",
        f"next: python -m patjax.evaluate --workdir={workdir}   (clean, pgd20, pr on the first 16 test images, "
        "with intervals)",
    ]
    assert os.path.isdir(workdir / "checkpoints" / "2")
    # Stopped before the end (a preempted job), it says how to resume.
    cfg = quickstart.get_config()
    cfg.num_train_steps = 4
    message = train.closing_message(config.train_settings(cfg), str(workdir), 2)
    assert message.splitlines()[0] == (
        f"stopped at step 2 of 4 (checkpoint {workdir / 'checkpoints' / '2'}); run the same command again to resume"
    )
    assert message.splitlines()[-1].startswith(f"then: python -m patjax.evaluate --workdir={workdir}")


def test_a_damaged_training_log_costs_the_closing_message_its_accuracy_line_only(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 2, "test_clean_accuracy": 0.5}\n{"step": 2, "test_clean\n')
    cfg = quickstart.get_config()
    cfg.num_train_steps = 2
    lines = train.closing_message(config.train_settings(cfg), str(tmp_path), 2).splitlines()
    assert lines[0] == f"trained pat to step 2 of 2: {tmp_path / 'checkpoints' / '2'}"
    assert lines[1] == (
        f"no clean accuracy to report: {tmp_path / 'metrics.jsonl'} line 2 is damaged (not a JSON object); "
        "repair or remove that line"
    )
    assert lines[2].startswith(f"next: python -m patjax.evaluate --workdir={tmp_path}")
