"""Reading a workdir's config.json: older workdirs upgraded in one place, damaged ones refused."""

import json

import numpy as np
import pytest

from patjax.core.errors import UserError
from patjax.run import config as config_lib
from patjax.run import workdir as workdir_lib


def write_config(tmp_path, saved) -> str:
    (tmp_path / "config.json").write_text(json.dumps(saved) if not isinstance(saved, str) else saved)
    return str(tmp_path)


def test_an_older_config_reads_with_the_behaviour_its_code_had(tmp_path):
    saved = config_lib.default_config().to_dict()
    saved["langevin"]["step_size"] = 0.25  # a value the run chose stays
    for field in ("bn_mode", "init", "tolerance"):  # fields newer than the first runs
        del saved["langevin"][field]
    del saved["eval"]["pr_distributions"]
    cfg = workdir_lib.load_config(write_config(tmp_path, saved))
    config_lib.train_settings(cfg)
    # What the code before each field did (hand-written, not read from default_config): the
    # sampler ran BatchNorm in inference mode, started uniformly in the eps-ball, ran all T steps.
    assert (cfg.langevin.bn_mode, cfg.langevin.init, cfg.langevin.tolerance) == ("inference", "uniform", 0.0)
    assert cfg.langevin.step_size == 0.25
    assert "gaussian" in cfg.eval.pr_distributions


@pytest.mark.parametrize(
    "text",
    [
        '{"dataset": "cifar10", "mod',
        "[1, 2]",
        "",
        "not json",
        '{"langevin": 5}',
        '{"eval": {"pr_samples": "many"}, "batch_size": null}',
    ],
)
def test_a_damaged_config_is_one_line_naming_the_file(tmp_path, text):
    workdir = write_config(tmp_path, text)
    with pytest.raises(UserError) as error:
        workdir_lib.load_config(workdir)
    message = str(error.value)
    assert "config.json is damaged" in message and "\n" not in message


def test_a_folder_without_config_is_not_a_workdir(tmp_path):
    with pytest.raises(UserError, match="not a patjax workdir"):
        workdir_lib.load_config(str(tmp_path))


def test_a_runs_length_counts_whole_batches_of_the_training_split():
    cfg = config_lib.default_config()  # CIFAR-10's 50,000 images in batches of 256, 100 epochs
    settings = config_lib.train_settings(cfg)
    assert (settings.steps_per_epoch(), settings.total_steps()) == (195, 19_500)
    cfg.num_train_steps = 700
    assert config_lib.train_settings(cfg).total_steps() == 700


def step_config(steps, fractions=(0.75, 0.9)):
    cfg = config_lib.default_config()
    cfg.num_train_steps, cfg.lr_decay_fractions = steps, fractions
    return cfg


def learning_rates(cfg, upto):
    schedule = config_lib.train_settings(cfg).optimizer.schedule(steps_per_epoch=1)
    return np.array([float(schedule(s)) for s in range(upto + 1)])


@pytest.mark.parametrize(
    "step, steps, fractions, allowed",
    [
        (800, 1600, (0.75, 0.9), False),  # a finished run extended: milestones 600, 720 would move
        (800, 1600, (0.375, 0.45, 0.9), True),  # the same, keeping 600 and 720 and adding 1440
        (500, 1600, (0.75, 0.9), True),  # no milestone passed yet: a longer run simply decays later
        (650, 640, (0.75, 0.9), False),  # shortened: milestone 480 would fall before step 650 unapplied
    ],
)
def test_a_resume_keeps_the_learning_rates_the_run_had(tmp_path, step, steps, fractions, allowed):
    saved, resumed = step_config(800), step_config(steps, fractions)
    # Independently of the check: did the learning rate up to the checkpoint stay as it was?
    same_history = np.array_equal(learning_rates(saved, step), learning_rates(resumed, step))
    assert same_history == allowed
    if allowed:
        workdir_lib._check_passed_milestones(
            config_lib.train_settings(saved).optimizer, config_lib.train_settings(resumed), step
        )
    else:
        with pytest.raises(UserError, match="learning-rate milestones"):
            workdir_lib._check_passed_milestones(
                config_lib.train_settings(saved).optimizer, config_lib.train_settings(resumed), step
            )
