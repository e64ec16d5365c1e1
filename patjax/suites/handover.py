"""Carrying a suite's unfinished runs to another machine in git (`python -m patjax.experiments
--handover`): each run keeps what it resumes or is evaluated from, and nothing else, while no
worker, trainer or evaluation holds it. docs/cluster.md has the details.
"""

from __future__ import annotations

import contextlib
import os

from patjax.core import locks
from patjax.core.errors import UserError
from patjax.run import checkpoints, config
from patjax.run import workdir as workdir_lib
from patjax.suites import Suite, plan
from patjax.suites.run_outcomes import run_dir
from patjax.suites.run_status import curve_steps, trained
from patjax.suites.workers import CLAIM_FILE


@contextlib.contextmanager
def _held_for_handover(directory: str):
    """The run's claim and its workdir lock, as a worker that trains the run holds them; a
    one-line UserError naming the holder if another process holds either."""
    remedy = "wait for it to finish or stop it, then hand over again"
    with locks.lock(os.path.join(directory, CLAIM_FILE), "a handover") as claim:
        if not claim.held:
            raise UserError(f"{directory!r} is claimed by {claim.holder}; {remedy}")
        with locks.exclusive(directory, "a handover", remedy=remedy):
            yield


def handover(suite: Suite, workdir: str) -> list[str]:
    """Prepares the suite's unfinished runs to be carried to another machine in git. A run that
    has finished training keeps its final model and its curve steps' models
    (`workdir.keep_models`), which is all its evaluation needs. A run still training keeps the
    models of its curve steps so far and its newest checkpoint only, which it resumes from
    bitwise. Returns those checkpoints' paths, which the suite's .gitignore leaves out:
    `git add -f` them with the rest of the suite.

    It first takes the claim and the workdir lock of every run with checkpoints, as a worker
    training the run holds them, and keeps them until it is done: if a worker (or a trainer,
    an evaluation) holds any of them, it refuses in one line before it changes anything."""
    with contextlib.ExitStack() as held:
        touched = []
        for run in plan(suite):
            directory = run_dir(workdir, run)
            if os.path.isdir(os.path.join(directory, "checkpoints")):
                held.enter_context(_held_for_handover(directory))
                touched.append((run, directory))
        paths = []
        for run, directory in touched:
            step = checkpoints.latest_step(directory)
            if step is None:
                continue
            final = config.train_settings(run.config).total_steps()
            curve = set(curve_steps(suite, run, final))
            if trained(run, directory) is not None:
                if suite.keep_models:
                    workdir_lib.keep_models(directory, curve | {final})
                continue
            workdir_lib.keep_models(directory, curve)
            paths.append(checkpoints.prune_checkpoints(directory, keep=step))
        return paths
