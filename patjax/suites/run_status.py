"""How far a suite's run has come, read from its directory: trained to the end of its config
(suite_run.json), evaluated with the suite's current settings, its models and curve points
kept and evaluated. The runner and the handover decide from these what is left to do; a run
whose evaluation was made under other settings counts as not evaluated, and is evaluated again.
"""

from __future__ import annotations

from typing import Optional

from patjax import evaluators
from patjax.core.errors import UserError
from patjax.pat import laws
from patjax.run import config, eval_files, eval_settings, kept_models
from patjax.run import workdir as workdir_lib
from patjax.suites import Run, Suite
from patjax.suites.run_outcomes import read_record


def trained(run: Run, directory: str) -> Optional[dict]:
    """The run's suite_run.json if it finished training with this config, else None."""
    record = read_record(directory)
    if record is None or record.get("step") != config.train_settings(run.config).total_steps():
        return None
    workdir_lib.check_resume_compatible(config.train_settings(run.config), directory)  # a changed suite is refused
    return record


def evaluation_settings(suite: Suite, curve: bool) -> tuple:
    """(evaluators, eval overrides) of the suite's final evaluation, or of its curve points; the
    overrides always name the headline law, so that a run's config (whose law may differ from
    the suite's) never decides it."""
    chosen, overrides = (
        (suite.curve_evaluators, suite.curve_eval_overrides) if curve else (suite.evaluators, suite.eval_overrides)
    )
    return chosen, {"pr.distribution": suite.pr_distribution, **overrides}


def eval_matches(suite: Suite, step: int, directory: str, curve: bool = False) -> bool:
    """Whether eval/results.json (curve/step_N/ for a curve point) was written for this step with
    the suite's settings, and per_image.npz by the same evaluation (a kill between the two writes
    leaves a pair that does not match, an unreadable file is no evaluation: the run is then
    evaluated again)."""
    where = step if curve else None
    if not eval_files.has_evaluation(directory, where):
        return False
    try:
        results, _ = eval_files.load_results(directory, where)
    except (UserError, OSError, ValueError):
        return False
    s = results.get("settings", {})
    chosen, overrides = evaluation_settings(suite, curve)
    wanted = {"evaluators": list(evaluators.parse(list(chosen))), "step": step}
    if suite.num_eval_examples > 0:
        wanted["num_examples"] = suite.num_eval_examples
    # Each setting the suite gives, where results.json records it (by its path in `eval`).
    for path, value in config.eval_paths(overrides).items():
        if eval_settings.setting(s, path) is not None:
            wanted[path] = list(value) if isinstance(value, (tuple, list)) else value
    # Results made under another definition of a law they computed are stale.
    wanted.update(laws.definitions(eval_settings.recorded_laws(s)))
    return all(eval_settings.setting(s, k) == v for k, v in wanted.items())


def curve_steps(suite: Suite, run: Run, final_step: int) -> list[int]:
    """The steps of the run's learning-curve points before its final step (none if it has no curve)."""
    if suite.curve_every_steps <= 0 or (suite.curve_methods and run.method not in suite.curve_methods):
        return []
    return list(range(suite.curve_every_steps, final_step, suite.curve_every_steps))


def models_and_curve_done(suite: Suite, run: Run, step: int, directory: str) -> bool:
    """Whether the run's kept models (its final one; its curve points') and curve evaluations exist."""
    if not suite.keep_models:
        return True
    curve = curve_steps(suite, run, step)
    kept = set(kept_models.steps(directory))
    return step in kept and set(curve) <= kept and all(eval_matches(suite, c, directory, curve=True) for c in curve)


def finished(suite: Suite, run: Run, directory: str) -> bool:
    """Whether the run was trained and evaluated with the suite's current settings, and its
    models and curve points kept and evaluated."""
    record = trained(run, directory)
    return (
        record is not None
        and eval_matches(suite, record["step"], directory)
        and models_and_curve_done(suite, run, record["step"], directory)
    )
