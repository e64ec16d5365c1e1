"""Reading a workdir's config.json: older workdirs upgraded in one place, damaged ones refused."""

import json

import numpy as np
import pytest
from conftest import REPO

from patjax import methods
from patjax.core.errors import UserError
from patjax.run import config as config_lib
from patjax.run import eval_settings
from patjax.run import workdir as workdir_lib


def write_config(tmp_path, saved) -> str:
    (tmp_path / "config.json").write_text(json.dumps(saved) if not isinstance(saved, str) else saved)
    return str(tmp_path)


COMMITTED = REPO / "docs" / "results" / "convergence_cpu" / "runs" / "cifar10_small_cnn" / "pat_s0" / "config.json"


def test_an_older_config_reads_with_the_behaviour_its_code_had(tmp_path):
    saved = json.loads(COMMITTED.read_text())  # version 1: no config_version
    assert "config_version" not in saved
    saved["langevin"]["step_size"] = 0.25  # a value the run chose stays
    for field in ("bn_mode", "init", "tolerance"):  # fields newer than the first runs
        saved["langevin"].pop(field, None)
    saved["eval"].pop("pr_distributions", None)
    cfg = workdir_lib.load_config(write_config(tmp_path, saved))
    config_lib.train_settings(cfg)
    # What the code before each field did (hand-written, not read from default_config): the
    # sampler ran BatchNorm in inference mode, started uniformly in the eps-ball, ran all T steps.
    assert (cfg.langevin.bn_mode, cfg.langevin.init, cfg.langevin.tolerance) == ("inference", "uniform", 0.0)
    assert cfg.langevin.step_size == 0.25
    assert "gaussian" in cfg.eval.pr.distributions


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


def test_a_config_a_check_refuses_is_one_line_with_the_checks_whole_reason(tmp_path):
    """A readable config.json whose settings a check refuses (here a PAT run with T = 0 from the
    uniform start) names the file and keeps the check's whole line, what to set included."""
    workdir = write_config(tmp_path, {"method": "pat", "langevin": {"steps": 0}})
    with pytest.raises(UserError) as error:
        workdir_lib.load_config(workdir)
    message = str(error.value)
    assert message.startswith(f"{workdir_lib.config_path(workdir)} is damaged (UserError: pat trains on Algorithm 1")
    assert "set langevin.steps > 0 (Appendix E: 100) or langevin.init = 'clean')" in message and "\n" not in message


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


# The methods' blocks: written from their settings classes' defaults, read back field by field, under
# the names committed workdirs and scripts use (--config.trades.beta=...).
METHOD_BLOCKS = {
    "langevin": {"steps", "step_size", "noise_scale", "grad_clip", "c1", "c2", "init", "tolerance", "bn_mode"},
    "pat": {"beta"},
    "attack": {"epsilon", "step_size", "steps", "bn_mode", "norm"},
    "fgsm": {"random_start"},
    "alp": {"weight"},
    "clp": {"weight"},
    "trades": {"beta", "step_size", "init_noise"},
    "mart": {"beta", "step_size", "init_noise"},
    "gaussian": {"sigma"},
    "atpr": {
        "num_candidates",
        "eps_spread",
        "step_size_spread",
        "steps_below",
        "steps_above",
        "refine_max_iters",
        "refine_stop_fraction",
    },
}


def test_the_methods_blocks_keep_their_fields_and_every_committed_workdir_reads_them():
    cfg = config_lib.default_config()
    assert {block: set(cfg[block]) for block in METHOD_BLOCKS} == METHOD_BLOCKS
    assert set(methods.blocks()) == set(METHOD_BLOCKS)
    # The paper's and the references' values (Appendix E, TRADES, MART, AT-PR), written by hand.
    assert (cfg.pat.beta, cfg.langevin.steps, cfg.langevin.c2, cfg.langevin.bn_mode) == (0.001, 100, 0.42, "inference")
    assert (cfg.attack.epsilon, cfg.attack.step_size, cfg.attack.steps, cfg.attack.bn_mode, cfg.attack.norm) == (
        8 / 255,
        2 / 255,
        10,
        "auto",
        "linf",
    )
    assert (cfg.trades.beta, cfg.trades.step_size, cfg.mart.beta, cfg.alp.weight, cfg.clp.weight) == (
        6.0,
        0.007,
        -1.0,
        0.01,
        0.3,
    )
    assert (cfg.fgsm.random_start, cfg.atpr.num_candidates, cfg.atpr.refine_stop_fraction) == (False, 10, 0.1)
    assert cfg.gaussian.sigma == 0.25  # Cohen et al.'s CIFAR-10 noise levels: 0.12, 0.25, 0.50, 1.00
    runs = sorted(REPO.glob("docs/results/**/config.json"))
    assert runs
    for path in runs:
        saved = workdir_lib.load_config(str(path.parent))
        found = config_lib.block_settings(saved)
        for block, fields in METHOD_BLOCKS.items():
            for field in fields:
                assert getattr(found[block], field) == saved[block][field] or (block, field) == ("mart", "beta")


def method_of(name, **fields):
    cfg = config_lib.default_config()
    cfg.method = name
    for key, value in fields.items():
        block, field = key.split(".")
        cfg[block][field] = value
    return config_lib.method_settings(cfg)


def test_attack_bn_mode_auto_is_each_methods_reference_mode_and_a_forced_mode_wins():
    """MadryLab and AT-PR attack on batch statistics, TRADES and MART on running ones."""
    expected = {n: "train" for n in ("fgsm", "fgsm_cor", "pgd", "pgd_cor", "alp", "clp", "atpr")}
    expected.update(trades="inference", mart="inference")
    assert {n: method_of(n).attack.bn_mode for n in methods.REGISTRY if method_of(n).attack} == expected
    assert {n: method_of(n, **{"attack.bn_mode": "inference"}).attack.bn_mode for n in expected} == dict.fromkeys(
        expected, "inference"
    )


def test_pat_beta_reaches_pat_and_the_cor_variants_and_no_other_method():
    readers = {n for n in methods.REGISTRY if method_of(n, **{"pat.beta": 0.25}).snis is not None}
    assert readers == {"pat", "pgd_cor", "fgsm_cor"}
    assert all(method_of(n, **{"pat.beta": 0.25}).snis.beta == 0.25 for n in readers)
    assert method_of("fgsm_cor", **{"fgsm.random_start": True}).own.random_start  # fgsm's block too


def test_atpr_searches_around_the_attack_blocks_pgd_and_its_spread_is_checked_for_every_method():
    s = method_of("atpr", **{"attack.epsilon": 0.05, "attack.step_size": 0.01, "attack.steps": 7}).own
    assert (s.eps, s.step_size, s.steps, s.num_candidates) == (0.05, 0.01, 7, 10)
    with pytest.raises(UserError, match="atpr.step_size_spread must not exceed attack.step_size"):
        method_of("pat", **{"atpr.step_size_spread": 0.01, "attack.step_size": 0.005})


# Version 1's evaluator settings, at the top of `eval` under their flat names, and the block and
# field version 2 keeps each in: written out by hand.
VERSION_1_EVAL_FIELDS = {
    "pr_distribution": ("pr", "distribution"),
    "pr_distributions": ("pr", "distributions"),
    "pr_epsilons": ("pr", "epsilons"),
    "pr_samples": ("pr", "samples"),
    "pr_chunk_size": ("pr", "chunk_size"),
    "pdis_c1": ("pr", "pdis_c1"),
    "entropic_lambda": ("pr", "entropic_lambda"),
    "prob_acc_q": ("pr", "prob_acc_q"),
    "attack_eps": ("attack", "eps"),
    "attack_step_size": ("attack", "step_size"),
    "attack_steps": ("attack", "steps"),
    "cw_kappa": ("cw", "kappa"),
    "apgd_steps": ("apgd", "steps"),
    "apgd_rho": ("apgd", "rho"),
    "aa_target_classes": ("aa", "target_classes"),
    "aa_fab_steps": ("aa", "fab_steps"),
    "aa_square_queries": ("aa", "square_queries"),
    "aa_masking_eps_factors": ("aa", "masking_eps_factors"),
}
COMMITTED_CONFIGS = sorted((REPO / "docs" / "results").rglob("config.json"))


def test_the_upgrade_is_tested_on_committed_version_1_configs():
    assert sum("config_version" not in json.loads(p.read_text()) for p in COMMITTED_CONFIGS) >= 20


@pytest.mark.parametrize("path", COMMITTED_CONFIGS, ids=lambda p: str(p.parent.relative_to(REPO / "docs" / "results")))
def test_every_committed_config_reads_with_each_eval_setting_in_its_block(path):
    """Version 1 (flat eval names) is upgraded into the blocks; version 2 is read as written."""
    saved = json.loads(path.read_text())["eval"]
    cfg = workdir_lib.load_config(str(path.parent))
    assert cfg.config_version == 2 and not set(VERSION_1_EVAL_FIELDS) & set(cfg.eval)
    moved = 0
    for flat, (block, field) in VERSION_1_EVAL_FIELDS.items():
        written = saved[block].get(field) if isinstance(saved.get(block), dict) else saved.get(flat)
        if written is not None:
            value = cfg.eval[block][field]
            assert (list(value) if isinstance(value, tuple) else value) == written, flat
            moved += 1
    assert moved >= 12  # the fields every committed run wrote
    for field in ("seed", "confidence", "bootstrap_resamples", "num_examples", "batch_size"):
        assert cfg.eval[field] == saved[field]


def test_a_model_no_run_trained_is_evaluated_with_the_default_configs_settings_without_building_one(monkeypatch):
    """The settings of a PyTorch file or an API call: by path or nested, with a value other than
    the default in every block, what the default config's eval block gives on that dataset (p_dis's c1
    and the entropic lambda resolved alike), with no training config built."""
    overrides = {"seed": 3, "attack.norm": "l2", "cw": {"kappa": 1.0}, "apgd.steps": 7, "aa.fab_steps": 9}
    overrides.update({"pr.epsilons": (0.05,), "pr.samples": 7, "certify.sigma": 0.5, "data_dir": "/tmp"})
    cfg = config_lib.default_config()
    cfg.dataset = "cifar100"
    expected = config_lib.evaluation_settings(cfg, overrides, batch_size=7)
    assert expected.evaluator_settings["attack"].eps == 0.5 and expected.evaluator_settings["pr"].samples == 7
    monkeypatch.setattr(config_lib, "default_config", lambda: pytest.fail("a training config was built"))
    assert config_lib.default_evaluation_settings("cifar100", overrides, batch_size=7) == expected


def test_an_evaluation_records_its_settings_in_the_shape_committed_results_read_as():
    """results.json's "settings" nest each evaluator setting in its block of `eval`; a committed one,
    written with flat names, reads in that shape (`eval_settings.nested_settings`), so that a new
    evaluation is compared with it setting by setting (`eval_settings.check_comparable`)."""
    from patjax.run import evaluation

    flat = json.loads((COMMITTED.parent / "eval" / "results.json").read_text())["settings"]
    committed = eval_settings.nested_settings(flat)
    settings = config_lib.evaluation_settings(workdir_lib.load_config(str(COMMITTED.parent)))
    record = evaluation.settings_record(settings, committed["num_examples"], committed["step"])
    # The settings recorded since: the certify and rare_pr evaluators' blocks.
    assert set(record) == set(committed) | {"certify", "rare_pr"}
    for block in committed:
        if isinstance(committed[block], dict):
            assert set(record[block]) == set(committed[block]), block
    # Written out by hand from the committed file's flat names.
    pairs = [("pr_samples", ("pr", "samples")), ("pr_epsilons", ("pr", "epsilons")), ("seed", ("seed",))]
    pairs += [("pdis_c1", ("pr", "pdis_c1")), ("cw_kappa", ("cw", "kappa")), ("attack_eps", ("attack", "eps"))]
    for name, path in pairs:
        value = record
        for part in path:
            value = value[part]
        assert value == flat[name], name
    eval_settings.check_comparable(committed, record, "committed", "new")


def test_a_config_of_an_unknown_version_is_refused(tmp_path):
    saved = config_lib.default_config().to_dict()
    saved["config_version"] = 3
    with pytest.raises(UserError, match="config_version 3 is not one this patjax reads"):
        workdir_lib.load_config(write_config(tmp_path, saved))


@pytest.mark.parametrize(
    "field, message",
    [
        ("eval.pr_samples", "eval.pr_samples is not a config field; it is eval.pr.samples since config version 2"),
        ("eval.pr.sample", "eval.pr.sample is not a config field"),
        ("langevin.stepz", "langevin.stepz is not a config field"),
    ],
)
def test_a_field_the_config_does_not_have_is_refused_not_ignored(field, message):
    """A ConfigDict takes any new field; a config file written for version 1 (cfg.eval.pr_samples =
    20) or with a typo would otherwise run with the default."""
    cfg = config_lib.default_config()
    *blocks, name = field.split(".")
    target = cfg
    for block in blocks:
        target = target[block]
    target[name] = 20
    for read in (config_lib.train_settings, config_lib.evaluation_settings):
        with pytest.raises(UserError) as error:
            read(cfg)
        assert str(error.value) == message


def test_the_pr_defaults_that_depend_on_the_sampler_are_resolved_from_it():
    """p_dis's c1 is the sampler's unless eval.pr.pdis_c1 > 0 sets it; the entropic risk's lambda is
    c2 - beta (Proposition 10), never below 0, unless eval.pr.entropic_lambda >= 0 sets it."""
    cfg = config_lib.default_config()
    cfg.langevin.c1, cfg.langevin.c2, cfg.pat.beta = 0.7, 0.5, 0.2
    pr = config_lib.evaluation_settings(cfg).evaluator_settings["pr"]
    assert (pr.pdis_c1, pr.entropic_lambda) == (0.7, pytest.approx(0.3))
    assert pr.pdis_sigma == pytest.approx(1 / np.sqrt(2 * 0.7))
    cfg.pat.beta = 0.9  # c2 - beta < 0: lambda 0, the plain expected loss
    assert config_lib.evaluation_settings(cfg).evaluator_settings["pr"].entropic_lambda == 0.0
    cfg.eval.pr.pdis_c1, cfg.eval.pr.entropic_lambda = 2.0, 0.0
    pr = config_lib.evaluation_settings(cfg).evaluator_settings["pr"]
    assert (pr.pdis_c1, pr.entropic_lambda) == (2.0, 0.0)
