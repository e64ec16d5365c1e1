"""The finished runs of a suite as the figures see them: where a run lives, its record
(suite_run.json), its per-image outcomes (clean, attacks, PR counts of every law) and the
bootstrap pairing that runs evaluated on the same images and noise share.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Optional, Sequence

import numpy as np

from patjax import evaluators
from patjax.core.files import read_json
from patjax.evaluators.common import headline_first
from patjax.pat import laws, robustness
from patjax.run import comparison, eval_files, train
from patjax.suites import Run

ATTACKS = evaluators.TABLE_ATTACKS
RECORD_FILE = "suite_run.json"  # in each run's directory: its training step and its sittings' wall times


def run_dir(workdir: str, run: Run) -> str:
    return os.path.join(workdir, "runs", *run.name.split("/"))


@dataclasses.dataclass
class RunOutcome:
    """Per-image outcomes of one evaluated run (arrays over the same test images)."""

    run: Run
    correct: np.ndarray  # (n,) bool, clean
    robust: dict  # {'pgd20': (n,) bool, 'cw20': ...}
    pr_counts: dict  # {law: (n, levels) non-adversarial samples}, the headline law first
    results: dict  # eval/results.json
    record: dict  # suite_run.json
    train_s: Optional[float]  # time in training steps over every sitting (`logged_progress`)

    @property
    def settings(self) -> dict:
        return self.results["settings"]

    @property
    def eps_keys(self) -> list:
        return [robustness.level_key(e) for e in self.settings["pr"]["epsilons"]]


def read_record(directory: str) -> Optional[dict]:
    """A run's suite_run.json, or None before its training finished."""
    return read_json(
        os.path.join(directory, RECORD_FILE),
        "delete it and run the suite again (training resumes from the run's checkpoints)",
    )


def logged_progress(directory: str, run: Run, in_progress: bool = False) -> dict:
    """{'step': last logged step, 'train_s': seconds in training steps over every sitting} from the
    run's metrics.jsonl (`train.logged_training`), or {} before its first logged window."""
    logged = train.logged_training(directory, run.config.batch_size, in_progress)
    return {} if logged is None else {"step": logged[0], "train_s": round(logged[1], 1)}


def load_outcome(workdir: str, run: Run, pr_distribution: str) -> Optional[RunOutcome]:
    """The run's outcomes if it was trained and evaluated (its record says so), else None; PR
    counts for `pr_distribution` (the suite's headline law) and every other law with levels eps."""
    directory = run_dir(workdir, run)
    record = read_record(directory)
    if record is None or "eval_wall_s" not in record or not eval_files.has_evaluation(directory):
        return None
    results, per_image = eval_files.load_results(directory)  # the two files of one evaluation
    robust = {a: per_image[f"{a}.robust"].astype(bool) for a in ATTACKS if f"{a}.robust" in per_image}
    computed = headline_first(pr_distribution, laws.of_eps())
    counts = {d: per_image[f"pr_{d}.counts"].astype(np.int64) for d in computed if f"pr_{d}.counts" in per_image}
    return RunOutcome(
        run=run,
        correct=per_image["clean.correct"].astype(bool),
        robust=robust,
        pr_counts=counts,
        results=results,
        record=record,
        train_s=logged_progress(directory, run).get("train_s"),
    )


def figure(value, interval, method, n):
    return {"value": value, "interval": list(interval), "interval_method": method, "n": int(n)}


# The entropic risk's lambda defaults to the run's own langevin.c2 - pat.beta (Proposition 10,
# `pr.PRSettings.resolve`): runs trained with different beta report their entropic risk each at
# its own lambda, a figure of the run alone that the suite's tables neither show nor pair.
OWN_FIGURE_FIELDS = ("pr.entropic_lambda",)


def pairing(outcomes: Sequence[RunOutcome]):
    """(bootstrap indices, confidence) shared by runs that may be paired (`comparison.pairing`);
    raises if they were not evaluated on the same images with the same noise. Each run of a suite
    is evaluated with its own config, so a setting resolved from its training (`OWN_FIGURE_FIELDS`)
    may differ between runs: it changes only that run's own figure, never a per-image outcome
    the suite pairs (PR counts, robust and correct flags)."""
    return comparison.pairing([o.settings for o in outcomes], [o.run.name for o in outcomes], aside=OWN_FIGURE_FIELDS)
