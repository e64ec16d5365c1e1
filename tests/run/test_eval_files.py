"""A workdir keeps its evaluations side by side, each under its name (`eval_files`): a new one
never replaces another, --overwrite only the one of its name, a saved one whose settings and
images match is reused instead of evaluated again, a reader picks one by name; a workdir of one
eval/ folder reads as before."""

import dataclasses
import json
import os
import re
import shutil
import subprocess

import pytest
from helpers import eval_config, tiny_setup

from patjax import evaluators
from patjax.core.errors import UserError
from patjax.data import cifar
from patjax.evaluators import batches
from patjax.pat import laws
from patjax.run import checkpoints, comparison, eval_files, eval_settings, evaluation
from patjax.run import config as config_lib
from patjax.run import workdir as workdir_lib

L2 = {"attack.norm": "l2", "attack.eps": 0.5, "attack.step_size": 0.125}
PRBENCH = {"pr.epsilons": (0.03, 0.08, 0.1, 0.12), "pr.distributions": ("uniform",)}


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """A workdir whose 'checkpoint' is the tiny linear model of step 3 (restore and data patched),
    with every call of the evaluators counted."""
    model_fns, state, split = tiny_setup()
    workdir = str(tmp_path / "run")
    workdir_lib.save_config(eval_config(pr={"distributions": ()}).to_dict(), workdir)
    monkeypatch.setattr(checkpoints, "latest_step", lambda w: 3)
    monkeypatch.setattr(workdir_lib, "restore", lambda w, step=None: (workdir_lib.load_settings(w), model_fns, state))
    monkeypatch.setattr(cifar, "load_split", lambda *a: split)
    calls = []
    evaluate_state = evaluation.evaluate_state
    monkeypatch.setattr(evaluation, "evaluate_state", lambda *a, **k: calls.append(1) or evaluate_state(*a, **k))
    return workdir, calls


def keep(workdir, overrides=None, **kwargs):
    arguments = {"num_examples": 7, "batch_size": 4, "evaluators": "clean,pgd20,pr", "overwrite": False, **kwargs}
    return evaluation.evaluate_workdir(workdir, progress=False, overrides=overrides, keep=True, **arguments)


def folder_bytes(folder):
    return {f: open(os.path.join(folder, f), "rb").read() for f in sorted(os.listdir(folder))}


@pytest.mark.slow
def test_three_threat_models_are_kept_side_by_side_and_each_is_reused(workdir):
    workdir, calls = workdir
    first, l2, prbench = keep(workdir), keep(workdir, L2), keep(workdir, PRBENCH)
    # Each under the name its settings give, the first in eval/ where older readers look.
    assert [(k.name, os.path.relpath(k.folder, workdir), k.reused) for k in (first, l2, prbench)] == [
        ("linf-0.05.table1-N6.n7", "eval", False),
        ("l2-0.5.table1-N6.n7", "evals/l2-0.5.table1-N6.n7", False),
        ("linf-0.05.prbench-N6.n7", "evals/linf-0.05.prbench-N6.n7", False),
    ]
    assert len(calls) == 3
    for k in (first, l2, prbench):
        assert eval_files.load_results(workdir, name=k.name)[0]["eval_name"] == k.name
    assert eval_files.load_results(workdir, name=l2.name)[0]["settings"]["attack"]["norm"] == "l2"
    assert eval_files.load_results(workdir, name=prbench.name)[0]["settings"]["pr"]["epsilons"] == [
        0.03,
        0.08,
        0.1,
        0.12,
    ]
    before = {k.name: folder_bytes(k.folder) for k in (first, l2, prbench)}
    # The same settings again, or fewer evaluators, or another batch size: the saved one, not evaluated again.
    again = [keep(workdir, L2), keep(workdir, PRBENCH, batch_size=2), keep(workdir)]
    fewer = keep(workdir, evaluators="clean,pr")
    assert [(k.name, k.reused) for k in (*again, fewer)] == [
        (l2.name, True),
        (prbench.name, True),
        (first.name, True),
        (first.name, True),
    ]
    assert len(calls) == 3
    assert again[0].results == eval_files.load_results(workdir, name=l2.name)[0]
    # The listing: every name with what tells them apart.
    listed = eval_files.evaluations(workdir)
    assert [(n, os.path.relpath(f, workdir)) for n, f, _ in listed] == [
        (first.name, "eval"),
        (l2.name, os.path.join("evals", l2.name)),
        (prbench.name, os.path.join("evals", prbench.name)),
    ]
    # --overwrite evaluates again the one of its name and leaves the others byte for byte.
    keep(workdir, L2, overwrite=True)
    assert len(calls) == 4
    after = {k.name: folder_bytes(k.folder) for k in (first, l2, prbench)}
    assert after[first.name] == before[first.name] and after[prbench.name] == before[prbench.name]
    assert after[l2.name]["results.json"] != before[l2.name]["results.json"]  # its wall times differ


@pytest.mark.slow
def test_a_name_made_otherwise_is_refused_and_a_given_name_keeps_both(workdir):
    workdir, calls = workdir
    first = keep(workdir)
    kept = folder_bytes(first.folder)
    # Another seed keeps the derived name: it would replace the first, so it is refused in one line.
    with pytest.raises(UserError) as error:
        keep(workdir, {"seed": 1})
    message = str(error.value)
    assert "seed 0 there, 1 now" in message and "--eval_name" in message and "--overwrite" in message
    assert "\n" not in message and folder_bytes(first.folder) == kept and len(calls) == 1
    # Under a name of its own it is kept beside the first.
    seeded = keep(workdir, {"seed": 1}, eval_name="seed1")
    assert seeded.folder == os.path.join(workdir, "evals", "seed1") and not seeded.reused
    assert folder_bytes(first.folder) == kept
    # A given name is reused only where its evaluation matches.
    assert keep(workdir, {"seed": 1}, eval_name="seed1").reused and len(calls) == 2


@pytest.mark.slow
def test_a_reader_picks_an_evaluation_by_name_and_says_which_exist(workdir):
    workdir, _ = workdir
    first = keep(workdir)
    # One evaluation in eval/ alone: the layout before names, read as before.
    assert eval_files.chosen(workdir) is None
    table = comparison.compare([workdir], str(os.path.join(os.path.dirname(workdir), "a.png")))
    l2 = keep(workdir, L2)
    assert eval_files.chosen(workdir, first.name) == first.name
    assert (
        comparison.compare([workdir], str(os.path.join(os.path.dirname(workdir), "a.png")), evals=[first.name]) == table
    )
    with pytest.raises(UserError) as error:
        eval_files.chosen(workdir)
    assert str(error.value) == (f"{workdir} holds 2 evaluations ({first.name}, {l2.name}): name one with --eval_name")
    with pytest.raises(UserError) as error:
        eval_files.chosen(workdir, "l2")
    assert str(error.value) == f"{workdir} holds no evaluation named 'l2'; it holds {first.name}, {l2.name}"
    with pytest.raises(UserError, match="a folder's name"):
        eval_files.check_name("../elsewhere")


def test_an_old_eval_folder_reads_as_before_and_a_new_evaluation_goes_beside_it(tmp_path):
    """A committed run's eval/ (written before evaluations had names): its table is the same
    read by name, and nothing is written into it."""
    committed = os.path.join("docs", "results", "table1_cpu", "runs", "cifar10_small_cnn", "pat_s0")
    old = str(tmp_path / "old")
    shutil.copytree(os.path.join(committed, "eval"), os.path.join(old, "eval"))
    table = comparison.compare([old], str(tmp_path / "a.png"))
    name = eval_files.derived_name(eval_files.read_results(old)["settings"])
    assert eval_files.evaluations(old)[0][:2] == (name, os.path.join(old, "eval"))
    os.makedirs(os.path.join(old, "evals", "other"))
    assert comparison.compare([old], str(tmp_path / "a.png"), evals=[eval_files.chosen(old)]) == table


@pytest.mark.slow
def test_a_model_trained_again_to_the_same_step_is_evaluated_again_not_reused(workdir, monkeypatch):
    """The weights decide reuse (their sha256 in results.json), not the step: a run trained again
    in its folder to the same step has the same settings and other figures."""
    workdir, calls = workdir
    first = keep(workdir)
    model_fns, other, _ = tiny_setup(model_seed=1)
    monkeypatch.setattr(workdir_lib, "restore", lambda w, step=None: (workdir_lib.load_settings(w), model_fns, other))
    again = keep(workdir)
    assert (again.name, again.folder, again.reused, len(calls)) == (first.name, first.folder, False, 2)
    assert again.results["weights_sha256"] != first.results["weights_sha256"]
    assert keep(workdir).reused and len(calls) == 2


# Every evaluator setting, from the settings classes: (block or None for the shared ones, field).
SETTINGS_FIELDS = [(None, f.name) for f in dataclasses.fields(evaluators.common.SharedSettings)] + [
    (block, f.name) for block, cls in evaluators.blocks().items() for f in dataclasses.fields(cls)
]
# Those that change no figure (randomness is keyed by image and sample, not by chunk), and the
# laws, of which two evaluations compare those both computed.
NOT_COMPARED = {("pr", "chunk_size"), ("certify", "chunk_size"), ("pr", "distributions")}


@pytest.mark.parametrize("block, field", SETTINGS_FIELDS, ids=[f"{b or 'shared'}.{f}" for b, f in SETTINGS_FIELDS])
def test_two_evaluations_differing_in_any_one_setting_are_not_compared(block, field):
    """An evaluation whose record differs from another's in one evaluator setting (each setting of
    each block in turn, the entropic lambda included) is refused beside it, but for the settings
    that change no figure."""
    record = evaluation.settings_record(config_lib.default_evaluation_settings("cifar10"), 10, 0)
    name = f"{block}.{field}" if block else field
    if block:
        other = {**record, block: {**record[block], field: ["changed", record[block][field]]}}
    else:
        other = {**record, field: ["changed", record[field]]}
    if (block, field) in NOT_COMPARED:
        eval_settings.check_comparable(record, other, "a", "b")
    else:
        with pytest.raises(UserError, match=rf"\({re.escape(name)}\): not comparable"):
            eval_settings.check_comparable(record, other, "a", "b")


def test_two_evaluations_of_other_images_are_not_compared_but_of_other_batches_and_models_are():
    record = evaluation.settings_record(config_lib.default_evaluation_settings("cifar10"), 10, 0)
    for key in ("num_examples", "dataset"):
        with pytest.raises(UserError, match=rf"\({key}\): not comparable"):
            eval_settings.check_comparable(record, {**record, key: "other"}, "a", "b")
    eval_settings.check_comparable(record, {**record, "batch_size": 3, "devices": 4, "step": 9}, "a", "b")


# What results.json's "settings" holds beside the evaluator settings: the evaluation's own record
# fields and each PR law's definition (`evaluation.settings_record`).
RECORD_FIELDS = {"evaluators", "num_examples", "batch_size", "num_clean_correct", "dataset", "split", "devices", "step"}


def test_every_committed_results_json_reads_in_the_nested_shape_with_known_settings():
    """Every evaluation's results.json in the repository (written with flat names or nested), read
    through the one reader, has each evaluator setting in its block of `eval` under a field of that
    block's settings class (p_dis's sigma beside PR's), and nothing else but the shared settings,
    the record's fields and the laws' definitions at the top."""
    listed = subprocess.run(["git", "ls-files", "*results.json"], capture_output=True, text=True, check=True)
    paths = listed.stdout.split()
    blocks = {b: {f.name for f in dataclasses.fields(cls)} for b, cls in evaluators.blocks().items()}
    blocks["pr"].add("pdis_sigma")
    top = RECORD_FIELDS | {f.name for f in dataclasses.fields(evaluators.common.SharedSettings)} | set(laws.REGISTRY)
    read = 0
    for path in paths:
        results = eval_files.read_results_file(path)
        if "settings" not in results:  # a suite's report (results.md's figures), not an evaluation
            assert "groups" in results, path
            continue
        settings = results["settings"]
        assert not any(k in eval_settings.FLAT_NAMES for k in settings), path
        for key, value in settings.items():
            if isinstance(value, dict):
                assert key in blocks and set(value) <= blocks[key], (path, key, set(value) - blocks.get(key, set()))
            else:
                assert key in top, (path, key)
        assert settings["attack"]["norm"] in ("linf", "l2"), path
        assert settings["pr"]["samples"] >= 1 and isinstance(settings["pr"]["epsilons"], list), path
        read += 1
    assert read >= 100  # the committed suites' runs and their curve points


def test_a_damaged_evaluation_is_said_in_one_line_and_skipped_unless_it_is_the_one_asked_for(workdir, capsys):
    """One results.json cut short does not block the workdir: listing, a new evaluation under
    another name and a comparison of another go on, each saying it in one warning line; the
    damaged one, asked for by name, is refused; nothing of it is changed."""
    workdir, calls = workdir
    small = dict(evaluators="clean,pgd20")
    first, l2 = keep(workdir, **small), keep(workdir, L2, **small)
    # Attacks alone: a comparison draws no plot and says none.
    text = comparison.compare([workdir], evals=[first.name])
    assert "plot:" not in text and not any(f.endswith(".png") for f in os.listdir(first.folder))
    damaged = os.path.join(l2.folder, "results.json")
    with open(damaged, "r+b") as f:
        f.truncate(40)
    kept = folder_bytes(l2.folder)
    eval_files._SKIPPED.clear()
    capsys.readouterr()
    assert [name for name, _, _ in eval_files.evaluations(workdir)] == [first.name]
    assert eval_files.evaluations(workdir) and capsys.readouterr().err.splitlines() == [
        f"warning: skipped: {damaged} is damaged ({_json_error(damaged)}); {eval_files.RESULTS_REMEDY}"
    ]
    other = keep(workdir, {"seed": 1}, eval_name="seed1", **small)
    assert not other.reused and len(calls) == 3
    assert eval_files.chosen(workdir, "seed1") == "seed1"
    for asked in (lambda: eval_files.chosen(workdir, l2.name), lambda: keep(workdir, L2, **small)):
        with pytest.raises(UserError, match=f"^{re.escape(damaged)} is damaged"):
            asked()
    assert folder_bytes(l2.folder) == kept and len(calls) == 3


def _json_error(path):
    try:
        json.load(open(path))
    except ValueError as error:
        return str(error)[:120]


@pytest.mark.slow
def test_each_evaluator_is_reused_from_any_evaluation_of_the_same_model_images_and_view(workdir, monkeypatch):
    """An L2 evaluation after an L-inf one runs PGD-20 alone (PR and clean accuracy read no threat
    model); PRBench's radii then run PR alone (PGD-20 at L-inf is the first's); the figures and
    per-image outcomes are those of an evaluation made whole; --overwrite runs everything."""
    workdir, _ = workdir
    ran = []
    evaluate_pass = batches.evaluate_pass
    monkeypatch.setattr(batches, "evaluate_pass", lambda *a, **k: ran.append(a[5]) or evaluate_pass(*a, **k))
    keep(workdir)
    assert ran == ["clean", "pgd20", "pr_uniform"]
    ran.clear()
    l2 = keep(workdir, L2)
    assert ran == ["pgd20"] and l2.results["reused_from"] == {
        "clean": "linf-0.05.table1-N6.n7",
        "pr": "linf-0.05.table1-N6.n7",
    }
    assert comparison.kept_line("run", l2, None).endswith("; clean, pr taken from linf-0.05.table1-N6.n7)")
    ran.clear()
    prbench = keep(workdir, PRBENCH)
    assert ran == ["pr_uniform"] and set(prbench.results["reused_from"]) == {"clean", "pgd20"}
    ran.clear()
    whole = keep(workdir, L2, overwrite=True, eval_name="l2_whole")
    assert ran == ["clean", "pgd20", "pr_uniform"] and "reused_from" not in whole.results
    assert whole.results["figures"] == l2.results["figures"]
    reused, made = (eval_files.load_results(workdir, name=n)[1] for n in (l2.name, "l2_whole"))
    assert sorted(reused) == sorted(made)
    for key in made:
        assert (reused[key] == made[key]).all(), key
