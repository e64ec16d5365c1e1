"""A run's workdir: its config, its checkpoints, and the lock that gives it one writer.

Layout:
  config.json        the config of the run (checked on resume, read by every command)
  checkpoints/       Orbax CheckpointManager; a step directory appears only once complete
  damaged_checkpoints/  step directories that could not be restored, moved aside on resume
  metrics.jsonl      one JSON line per logging point (also in tensorboard/)
  tensorboard/       event files
  eval/per_image.npz per-image outcomes of the latest evaluation, with its identity (meta.*)
  eval/results.json  its figures (written last: the evaluation's commit marker)
  models/            kept models: parameters and BatchNorm statistics of chosen steps (`kept_models`)
  curve/step_N/      the evaluation of the kept model of step N (a learning curve's point), as eval/
  .lock              held (flock) by the process that writes the workdir
  .claim             held (flock) by the suite worker working on the run (patjax.runner)
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import shutil
import socket
import sys
import time
from typing import Any, Callable, Optional

import jax
import numpy as np
import orbax.checkpoint as ocp

from patjax import config as config_lib
from patjax import data, kept_models, sharding
from patjax import state as state_lib
from patjax.errors import UserError


def config_path(workdir: str) -> str:
    return os.path.join(workdir, "config.json")


def load_config(workdir: str):
    """The run's config (config.json completed by `config.upgrade`), checked as a new one is."""
    saved = read_json(config_path(workdir), "restore it from the run's records or start a new --workdir")
    if saved is None:
        raise UserError(f"{workdir!r} is not a patjax workdir (no config.json)")
    try:
        cfg = config_lib.upgrade(saved)
        config_lib.train_settings(cfg)  # every config read from a workdir is checked here
    except (AttributeError, KeyError, TypeError, ValueError) as error:  # JSON, but not a config's shape
        raise UserError(
            f"{config_path(workdir)} is damaged ({type(error).__name__}: "
            f"{' '.join(str(error).split())[:100]}); restore it or start a new --workdir"
        ) from None
    return cfg


def _flatten(d, prefix=""):
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = list(v) if isinstance(v, tuple) else v
    return out


def check_resume_compatible(settings: config_lib.TrainSettings, workdir: str) -> None:
    """Refuses to resume a checkpoint with a config that changes what a step computes."""
    saved_cfg = load_config(workdir)
    saved = _flatten(json.loads(saved_cfg.to_json()))
    current = _flatten(settings.record)
    differing = sorted(
        k
        for k in set(saved) | set(current)
        if k.split(".")[0] not in config_lib.RESUMABLE_FIELDS and saved.get(k) != current.get(k)
    )
    if differing:
        shown = ", ".join(f"{k}: {saved.get(k)!r} -> {current.get(k)!r}" for k in differing[:4])
        raise UserError(
            f"config does not match the checkpoint in {workdir!r} ({shown}); use a new --workdir or the saved config"
        )
    step = latest_step(workdir)
    if step is not None:
        _check_passed_milestones(config_lib.optimizer_settings(saved_cfg), settings, step)


def _check_passed_milestones(saved: state_lib.OptimizerSettings, settings: config_lib.TrainSettings, step: int):
    """A longer (or shorter) run moves MultiStepLR's milestones, which are fractions of the run;
    one the run has passed must stay where it was, or the resumed run would go back to a higher
    learning rate (or skip a decay it has not had)."""
    steps_per_epoch = data.NUM_TRAIN[settings.dataset] // settings.batch_size
    passed = [b for b in saved.lr_milestones(steps_per_epoch) if b <= step]
    now = [b for b in settings.optimizer.lr_milestones(steps_per_epoch) if b <= step]
    if passed != now:
        total = settings.optimizer.total_steps(steps_per_epoch)
        keep = ", ".join(f"{b / total:.6g}" for b in passed)
        raise UserError(
            f"resuming at step {step} would move the learning-rate milestones the run has passed "
            f"(steps {passed} -> {now}); keep them with lr_decay_fractions starting ({keep}) for "
            f"{total} steps, or use a new --workdir"
        )


def save_config(record: dict, workdir: str) -> None:
    """config.json from a run's config as a JSON dict (`config.TrainSettings.record`)."""
    os.makedirs(workdir, exist_ok=True)
    tmp = config_path(workdir) + ".tmp"
    with open(tmp, "w") as f:
        f.write(json.dumps(record, indent=2))
    os.replace(tmp, config_path(workdir))  # atomic: a kill never leaves half a config


def json_safe(obj):
    """obj with NaN and +-inf (also as numpy scalars) replaced by None, for strict JSON."""
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    if isinstance(obj, (float, np.floating)):
        return float(obj) if np.isfinite(obj) else None
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.bool_):
        return bool(obj)
    return obj


def _atomic(path: str, write: Callable[[str], None], suffix: str = ".tmp") -> None:
    """write(temporary path), then rename it to path: a reader (a person, another worker) sees
    the old file or the new one whole, never a half-written one."""
    tmp = path + suffix
    write(tmp)
    os.replace(tmp, path)


def read_json(path: str, remedy: str) -> Optional[dict]:
    """The JSON object in `path`, or None if there is no such file. A damaged file (truncated,
    not JSON, not an object, unreadable) is one line naming it and `remedy`."""
    if not os.path.isfile(path):
        return None
    try:
        with open(path) as f:
            obj = json.load(f)
    except (OSError, ValueError) as error:
        raise UserError(f"{path} is damaged ({' '.join(str(error).split())[:120]}); {remedy}") from None
    if not isinstance(obj, dict):
        raise UserError(f"{path} is damaged (not a JSON object); {remedy}")
    return obj


def write_json(path: str, obj) -> Any:
    """Writes strict JSON (NaN/inf as null) atomically; returns what it wrote."""
    obj = json_safe(obj)

    def write(tmp):
        with open(tmp, "w") as f:
            json.dump(obj, f, indent=2, allow_nan=False)

    _atomic(path, write)
    return obj


def write_text(path: str, text: str) -> None:
    def write(tmp):
        with open(tmp, "w") as f:
            f.write(text)

    _atomic(path, write)


def save_figure(fig, path: str, dpi: int = 120) -> None:
    """Saves a matplotlib figure as PNG atomically and closes it."""
    import matplotlib.pyplot as plt

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    _atomic(path, lambda tmp: fig.savefig(tmp, dpi=dpi, format="png"), suffix=".tmp.png")
    plt.close(fig)


# ---------------------------------------------------------------------------------------
# Locks: one writer per workdir, one worker per suite run, one writer of a suite's report.


@dataclasses.dataclass(frozen=True)
class Lock:
    held: bool  # whether this process holds the lock
    holder: str  # who holds it: `role (pid P on HOST, since TIME)` as its holder wrote it


@contextlib.contextmanager
def lock(path: str, role: str, *, wait: bool = False):
    """Yields a `Lock` on the file `path` (created if missing; `lock` never removes it).

    The lock is an flock on an open file, which the kernel releases when its process ends
    however it ends (kill -9 included), so a lock left by a dead process never blocks anyone;
    the file itself stays. Two opens of the file conflict even within one process.
    wait=False: does not wait; if another holds the lock, yields held=False and the holder's
    line. wait=True: waits until the lock is free. The holder writes its line into the file
    after locking, so that those it turns away can say who holds it.
    Removing the file would be unsafe (a process holding the old file and one locking a new
    file of the same name would both hold "the" lock), hence it stays.
    """
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 4096, 0).decode(errors="replace").strip() or "another process"
            yield Lock(held=False, holder=holder)
            return
        except OSError as error:  # e.g. Lustre mounted without flock support
            raise UserError(
                f"cannot lock {path}: {error.strerror or error}; the filesystem must support flock (docs/cluster.md)"
            ) from None
        os.ftruncate(fd, 0)
        me = f"{role} (pid {os.getpid()} on {socket.gethostname()}, since {time.strftime('%Y-%m-%d %H:%M:%S')})"
        os.pwrite(fd, (me + "\n").encode(), 0)
        yield Lock(held=True, holder=me)
    finally:
        os.close(fd)  # releases the flock


@contextlib.contextmanager
def exclusive(workdir: str, role: str):
    """Holds `workdir`/.lock for a process that writes the workdir (a trainer, an evaluation).

    A second writer is refused in one line naming the holder; a lock left by a dead process
    never blocks the resume (`lock`).
    """
    created = not os.path.isdir(workdir)
    os.makedirs(workdir, exist_ok=True)
    path = os.path.join(workdir, ".lock")
    with lock(path, role) as held:
        if not held.held:
            raise UserError(f"{workdir!r} is in use by {held.holder}; wait for it to finish, or use another --workdir")
        try:
            yield
        finally:
            if created and os.listdir(workdir) == [".lock"]:  # failed before writing anything
                os.remove(path)
                os.rmdir(workdir)


# ---------------------------------------------------------------------------------------
# Checkpoints.


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
            detail = " ".join(str(error).split())[:200]
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
    """Moves checkpoint `step` to damaged_checkpoints/ so a resumed run can save that step again."""
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


def restore(workdir: str, mesh=None, step: Optional[int] = None):
    """(cfg, model_fns, state) from a workdir's config and a model, for evaluation.

    step None: the newest step there is a model of: the newest intact checkpoint (a newest one
    that cannot be restored is skipped with a one-line warning; the workdir is not changed), or
    the kept model (`kept_models`) of a later step, as in a suite's committed results, which
    keep no checkpoints. A given step: its kept model, else its checkpoint. A state restored
    from a kept model has the step, parameters and BatchNorm statistics only (no optimizer state).
    The state is replicated over `mesh` (default: every device), so a model saved on any number
    of devices restores here.
    """
    cfg = load_config(workdir)
    newest = require_checkpoint(workdir)
    optimizer = config_lib.optimizer_settings(cfg)
    tx = state_lib.make_optimizer(optimizer, optimizer.schedule(1))
    model_holder = {}

    def init():
        fns, st = state_lib.create_train_state(config_lib.model_settings(cfg), int(cfg.seed), tx)
        model_holder["fns"] = fns
        return st

    abstract = jax.eval_shape(init)
    if mesh is None:
        mesh = jax.make_mesh((jax.device_count(),), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
    wanted = newest if step is None else int(step)
    if wanted in kept_models.steps(workdir) and (step is not None or latest_step(workdir) != wanted):
        params, batch_stats, _ = kept_models.load(workdir, wanted, abstract.params, abstract.batch_stats)
        replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
        params, batch_stats = jax.device_put((params, batch_stats), replicated)
        state = state_lib.TrainState(
            step=jax.numpy.asarray(wanted, jax.numpy.int32),
            params=params,
            batch_stats=batch_stats,
            opt_state=None,
            rng=None,
        )
        return cfg, model_holder["fns"], state
    manager = checkpoint_manager(workdir, create=False)
    try:
        if step is None:
            state, _ = restore_newest_intact(manager, sharding.replicated_target(abstract, mesh))
        elif wanted in manager.all_steps():
            state = manager.restore(wanted, args=ocp.args.StandardRestore(sharding.replicated_target(abstract, mesh)))
        else:
            raise UserError(
                f"{workdir!r} has no model of step {wanted} (kept models: "
                f"{kept_models.steps(workdir) or 'none'}; checkpoints: {sorted(manager.all_steps()) or 'none'})"
            )
    finally:
        manager.close()
    return cfg, model_holder["fns"], state


def prune_checkpoints(workdir: str, keep: int) -> str:
    """Removes every checkpoint of the workdir but step `keep` (no trainer may be running);
    returns the kept step's directory."""
    root = os.path.join(os.path.abspath(workdir), "checkpoints")
    kept = os.path.join(root, str(int(keep)))
    if not os.path.isdir(kept):
        raise UserError(f"{workdir!r} has no checkpoint of step {keep}")
    for name in os.listdir(root):
        if name != str(int(keep)) and os.path.isdir(os.path.join(root, name)):
            shutil.rmtree(os.path.join(root, name))
    return kept


def keep_models(workdir: str, steps_to_keep=None) -> list[int]:
    """Writes the kept model (`kept_models.save`) of every checkpoint step in `steps_to_keep`
    (default: every checkpoint) that has none yet; returns the steps written."""
    if latest_step(workdir) is None:
        return []
    cfg = load_config(workdir)
    manager = checkpoint_manager(workdir, create=False)
    try:
        available = sorted(manager.all_steps())
    finally:
        manager.close()
    written = []
    for step in available:
        if (steps_to_keep is not None and step not in steps_to_keep) or step in kept_models.steps(workdir):
            continue
        _, _, state = restore(workdir, step=step)
        kept_models.save(
            workdir,
            step,
            jax.device_get(state.params),
            jax.device_get(state.batch_stats),
            {"model": cfg.model, "dataset": cfg.dataset, "method": cfg.method, "seed": cfg.seed},
        )
        written.append(step)
    return written
