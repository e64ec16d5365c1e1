"""A run's checkpoints (Orbax's CheckpointManager under WORKDIR/checkpoints/): the newest
intact one, damaged ones moved aside, and the newest step there is a model of."""

from __future__ import annotations

import os
import shutil
import sys
import time
from typing import Any, Callable, Optional

import orbax.checkpoint as ocp

from patjax.core.errors import UserError, one_line
from patjax.run import kept_models


def checkpoint_manager(workdir: str, max_to_keep: int = 3, create: bool = True) -> ocp.CheckpointManager:
    # Orbax writes each step to a temporary directory and renames it when complete, so a
    # checkpoint a kill interrupted is never listed or restored.
    options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=create, enable_async_checkpointing=False)
    return ocp.CheckpointManager(os.path.join(os.path.abspath(workdir), "checkpoints"), options=options)


def latest_step(workdir: str) -> Optional[int]:
    """The newest complete checkpoint's step, or None (no checkpoints/ or none complete)."""
    if not os.path.isdir(os.path.join(workdir, "checkpoints")):
        return None
    manager = checkpoint_manager(workdir, create=False)
    try:
        step = manager.latest_step()
    finally:
        manager.close()
    return None if step is None else int(step)


def restore_newest_intact(
    manager: ocp.CheckpointManager, target: Any, *, on_damaged: Optional[Callable[[int], str]] = None
):
    """(state, step) from the newest checkpoint that restores onto `target`, or (None, None).

    A step that fails to restore (a truncated or missing file: a full disk, a copy cut short)
    is skipped with a one-line warning on stderr naming it and the step used instead;
    `on_damaged(step)` may move it aside and returns what the warning should say it did.
    If no checkpoint restores, a UserError names the newest one and its error: never a silent
    restart from step 0.
    """
    steps = sorted(manager.all_steps(), reverse=True)
    failures = []
    for step in steps:
        try:
            state = manager.restore(step, args=ocp.args.StandardRestore(target))
        except Exception as error:  # Orbax and TensorStore raise many types for damaged files
            detail = one_line(error)[:200]
            failures.append((step, f"{type(error).__name__}: {detail}"))
            continue
        for bad, why in failures:
            done = on_damaged(bad) if on_damaged is not None else "skipped"
            print(
                f"warning: checkpoint step {bad} in {manager.directory} could not be restored "
                f"({why}); {done}; restored step {step}",
                file=sys.stderr,
            )
        return state, int(step)
    if failures:
        step, why = failures[0]
        raise UserError(
            f"no checkpoint in {manager.directory} could be restored (newest: step {step}, "
            f"{why}); move the damaged step directories away to start over"
        )
    return None, None


def move_aside(workdir: str, step: int) -> str:
    """Moves checkpoint `step` to damaged_checkpoints/ so a resumed run can save that step again
    (by the trainer, which holds the workdir's lock)."""
    source = os.path.join(os.path.abspath(workdir), "checkpoints", str(step))
    target_dir = os.path.join(os.path.abspath(workdir), "damaged_checkpoints")
    os.makedirs(target_dir, exist_ok=True)
    target = os.path.join(target_dir, f"{step}.{time.strftime('%Y%m%d-%H%M%S')}")
    shutil.move(source, target)
    return f"moved to {target}"


def require_checkpoint(workdir: str) -> int:
    """The newest step there is a model of (a checkpoint, or a kept model), or a one-line UserError."""
    found = [s for s in (latest_step(workdir), kept_models.newest(workdir)) if s is not None]
    if not found:
        raise UserError(f"no checkpoint and no kept model in {workdir!r}; train first")
    return max(found)


def prune_checkpoints(workdir: str, keep: int) -> str:
    """Removes every checkpoint of the workdir but step `keep`; returns the kept step's directory.
    The caller holds the workdir's lock (`locks.exclusive`), so no trainer is writing them."""
    root = os.path.join(os.path.abspath(workdir), "checkpoints")
    kept = os.path.join(root, str(int(keep)))
    if not os.path.isdir(kept):
        raise UserError(f"{workdir!r} has no checkpoint of step {keep}")
    for name in os.listdir(root):
        if name != str(int(keep)) and os.path.isdir(os.path.join(root, name)):
            shutil.rmtree(os.path.join(root, name))
    return kept
