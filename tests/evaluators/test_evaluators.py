"""The evaluator registry: names, aliases, canonical order, worst-case membership, and what an
evaluation runs when an evaluator needs another's pass."""

import numpy as np
import pytest
from helpers import eval_config, evaluate, tiny_setup

from patjax import evaluators
from patjax.core.errors import UserError
from patjax.data import cifar
from patjax.evaluators import common
from patjax.run import config as config_lib


def test_the_headline_law_comes_first_and_the_others_keep_their_order():
    assert common.headline_first("gaussian", ("uniform", "gaussian", "pdis")) == ("gaussian", "uniform", "pdis")
    assert common.headline_first("uniform", ()) == ("uniform",)


def test_names_aliases_and_order():
    assert evaluators.parse("pr,apgd,clean") == ("clean", "apgd_ce", "apgd_dlr", "pr")
    assert evaluators.parse(["cw20", "pgd20", ""]) == ("pgd20", "cw20")
    assert evaluators.parse("all") == ("clean", "pgd20", "cw20", "apgd_ce", "apgd_dlr", "pr")  # not aa: run when named
    assert evaluators.parse("certify,clean") == ("clean", "certify")  # nor certify: n0 + n passes an image
    assert evaluators.parse("aa,clean") == ("clean", "aa")
    assert evaluators.WORST_CASE == ("pgd20", "cw20", "apgd_ce", "apgd_dlr", "aa")
    for spec, message in (("pgd", "unknown evaluator 'pgd'; choose from clean, pgd20"), (",", "no evaluator chosen")):
        with pytest.raises(UserError, match=message):
            evaluators.parse(spec)


def test_pr_alone_runs_the_clean_pass_for_its_subset_and_reports_it():
    model_fns, state, split = tiny_setup()
    results = evaluate(
        eval_config(pr={"distribution": "gaussian", "distributions": ()}),
        model_fns,
        state,
        split,
        batch_size=4,
        progress=False,
        evaluators="pr",
    )
    logits = np.asarray(model_fns.infer(state.params, {}, cifar.to_float(split.images)))
    correct = logits.argmax(1) == split.labels
    assert results["settings"]["evaluators"] == ["pr"]
    assert list(results["evaluator_wall_time_s"]) == ["pr_gaussian", "clean"]  # clean runs last, only for PR
    assert results["clean_accuracy"] == pytest.approx(correct.mean())
    assert results["settings"]["num_clean_correct"] == int(correct.sum())
    assert results["figures"]["pr"]["gaussian"]["0.1"]["clean_correct"]["n"] == int(correct.sum())
    assert "worst_case" not in results["figures"] and "pgd20" not in results["figures"]


def test_worst_case_is_the_conjunction_of_the_attacks_run_and_clean():
    model_fns, state, split = tiny_setup(scale=0.3)
    results = evaluate(
        eval_config(), model_fns, state, split, batch_size=4, progress=False, evaluators="clean,pgd20,cw20"
    )
    per_image = {}
    evaluate(
        eval_config(),
        model_fns,
        state,
        split,
        batch_size=4,
        progress=False,
        evaluators="clean,pgd20,cw20",
        per_image_out=per_image,
    )
    both = per_image["clean.correct"] & per_image["pgd20.robust"] & per_image["cw20.robust"]
    worst = results["figures"]["worst_case"]
    assert worst["attacks"] == ["pgd20", "cw20"] and worst["value"] == pytest.approx(both.mean())
    assert worst["value"] <= min(results["figures"][a]["value"] for a in ("pgd20", "cw20"))


def test_each_evaluator_is_handed_its_own_block_the_shared_settings_and_the_threat_model_only():
    s = config_lib.evaluation_settings(eval_config()).evaluator_settings
    pr_view = s.view(evaluators.REGISTRY["pr"])
    assert (pr_view.shared, pr_view.threat, pr_view.own) == (s.shared, s["attack"], s["pr"])
    assert s.view(evaluators.REGISTRY["cw20"]).own == s["cw"]  # a block named apart from the evaluator
    assert s.view(evaluators.REGISTRY["apgd_dlr"]).own == s["apgd"]
    assert s.view(evaluators.REGISTRY["pgd20"]).own is None  # the threat model only
    assert s.view(evaluators.REGISTRY["aa"])["apgd"] == s["apgd"]  # declared in its entry: reads=("apgd",)
    with pytest.raises(LookupError, match=r"evaluator 'pr' reads eval.apgd, a block its registry entry does not"):
        pr_view["apgd"]


def test_a_registered_evaluator_reading_a_block_it_does_not_declare_fails_before_it_runs(monkeypatch):
    """The registry line is what an evaluator depends on: one that reads PR's block without
    declaring it is refused at its first read, not evaluated with a hidden dependency."""
    sneaky = common.Evaluator(
        "sneaky",
        passes=lambda s: tuple(f"sneaky_{d}" for d in s["pr"].distributions),
        make_batch_fn=lambda model_fns, s, pass_name: None,
        figures=lambda per_image, s: {},
    )
    registry = {**evaluators.REGISTRY, "sneaky": sneaky}
    monkeypatch.setattr(evaluators, "REGISTRY", registry)
    for name, value in evaluators.derived_names(registry).items():
        monkeypatch.setattr(evaluators, name, value)
    model_fns, state, split = tiny_setup()
    with pytest.raises(LookupError, match="evaluator 'sneaky' reads eval.pr"):
        evaluate(eval_config(), model_fns, state, split, evaluators="sneaky", batch_size=4, progress=False)
