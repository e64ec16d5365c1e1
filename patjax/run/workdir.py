"""A run's workdir: its config (config.json, the resume check) and the model a command reads
from it (`restore`). Its checkpoints are `patjax.run.checkpoints`', its lock `patjax.core.locks`', an
evaluation's files `patjax.run.eval_files`'.

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
  .claim             held (flock) by the suite worker working on the run (patjax.suites.runner)
"""

from __future__ import annotations

import json
import os
from typing import Optional

import jax
import orbax.checkpoint as ocp

from patjax.core import files, sharding
from patjax.core.errors import UserError, one_line
from patjax.models import networks
from patjax.run import checkpoints, kept_models
from patjax.run import config as config_lib
from patjax.run import optimizer as optimizer_lib
from patjax.run import settings as settings_lib
from patjax.run import state as state_lib


def config_path(workdir: str) -> str:
    return os.path.join(workdir, "config.json")


def load_config(workdir: str):
    """The run's config (config.json completed by `config.upgrade`), checked as a new one is;
    a damaged file is one line naming it."""
    saved = files.read_json(config_path(workdir), "restore it from the run's records or start a new --workdir")
    if saved is None:
        raise UserError(f"{workdir!r} is not a patjax workdir (no config.json)")
    try:
        cfg = config_lib.upgrade(saved)
        config_lib.train_settings(cfg)  # every config read from a workdir is checked here
    except (AttributeError, KeyError, TypeError, ValueError, UserError) as error:  # JSON, but not a config
        # A check's own refusal is one line already and says what to set: it is kept whole; any
        # other exception's text is cut to a line of its start.
        detail = one_line(error) if isinstance(error, UserError) else one_line(error)[:160]
        raise UserError(
            f"{config_path(workdir)} is damaged ({type(error).__name__}: {detail}); restore it or start a new --workdir"
        ) from None
    return cfg


def load_settings(workdir: str) -> settings_lib.TrainSettings:
    """The run's settings from its config.json."""
    return config_lib.train_settings(load_config(workdir))


def sampler_settings(workdir: str):
    """The sampler of the run's config (its `langevin` block, `methods.common.SamplerSettings`),
    what a diagnostic of its model measures, whether or not its method runs the sampler."""
    return config_lib.block_settings(load_config(workdir))["langevin"]


def evaluation_settings(workdir: str, overrides: Optional[dict] = None, **kwargs) -> settings_lib.EvaluationSettings:
    """The run's evaluation settings (its config's `eval` block) with `overrides` and `kwargs`
    (`config.evaluation_settings`)."""
    return config_lib.evaluation_settings(load_config(workdir), overrides, **kwargs)


def _flatten(d, prefix=""):
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = list(v) if isinstance(v, tuple) else v
    return out


def check_resume_compatible(settings: settings_lib.TrainSettings, workdir: str) -> None:
    """Refuses to resume a checkpoint with a config that changes what a step computes."""
    saved_settings = load_settings(workdir)
    saved = _flatten(saved_settings.record)
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
    step = checkpoints.latest_step(workdir)
    if step is not None:
        _check_passed_milestones(saved_settings.optimizer, settings, step)


def _check_passed_milestones(saved: optimizer_lib.OptimizerSettings, settings: settings_lib.TrainSettings, step: int):
    """A longer (or shorter) run moves MultiStepLR's milestones, which are fractions of the run;
    one the run has passed must stay where it was, or the resumed run would go back to a higher
    learning rate (or skip a decay it has not had)."""
    steps_per_epoch = settings.steps_per_epoch()
    passed = [b for b in saved.lr_milestones(steps_per_epoch) if b <= step]
    now = [b for b in settings.optimizer.lr_milestones(steps_per_epoch) if b <= step]
    if passed != now:
        total = settings.total_steps()
        keep = ", ".join(f"{b / total:.6g}" for b in passed)
        raise UserError(
            f"resuming at step {step} would move the learning-rate milestones the run has passed "
            f"(steps {passed} -> {now}); keep them with lr_decay_fractions starting ({keep}) for "
            f"{total} steps, or use a new --workdir"
        )


def save_config(record: dict, workdir: str) -> None:
    """config.json from a run's config as a JSON dict (`settings.TrainSettings.record`); atomic, so
    a kill never leaves half a config."""
    os.makedirs(workdir, exist_ok=True)
    files.write_text(config_path(workdir), json.dumps(record, indent=2))


USER_MODEL_FILE = "user_model.json"  # a run of a user's module (`train.train_run(model=)`) writes it


def restore(workdir: str, mesh=None, step: Optional[int] = None):
    """(settings, model_fns, state) from a workdir's config and a model, for evaluation.

    step None: the newest step there is a model of: the newest intact checkpoint (a newest one
    that cannot be restored is skipped with a one-line warning; the workdir is not changed), or
    the kept model (`kept_models`) of a later step, as in a suite's committed results, which
    keep no checkpoints. A given step: its kept model, else its checkpoint. A state restored
    from a kept model has the step, parameters and BatchNorm statistics only (no optimizer state).
    The state is replicated over `mesh` (default: every device), so a model saved on any number
    of devices restores here. A NaN or an infinity in its parameters or BatchNorm statistics is a
    one-line UserError naming the array (`networks.check_finite`).
    """
    settings = load_settings(workdir)
    if os.path.isfile(os.path.join(workdir, USER_MODEL_FILE)):
        raise UserError(
            f"{workdir!r} trained a module of the user's, which its config cannot rebuild; evaluate the module "
            f"patjax.api.train_model returns (patjax.evaluate_model)"
        )
    newest = checkpoints.require_checkpoint(workdir)
    optimizer = settings.optimizer
    tx = optimizer_lib.make_optimizer(optimizer, optimizer.schedule(1))
    model_holder = {}

    def init():
        fns, st = state_lib.create_train_state(settings.model, settings.seed, tx)
        model_holder["fns"] = fns
        return st

    abstract = jax.eval_shape(init)
    if mesh is None:
        mesh = sharding.make_mesh(jax.device_count())  # a batch of one image per device spans every device
    wanted = newest if step is None else int(step)
    if wanted in kept_models.steps(workdir) and (step is not None or checkpoints.latest_step(workdir) != wanted):
        params, batch_stats, _ = kept_models.load(workdir, wanted, abstract.params, abstract.batch_stats)
        (state,) = sharding.place_on_mesh(mesh, state_lib.inference_state(params, batch_stats, wanted))
    else:
        state = _restore_checkpoint(workdir, step, wanted, sharding.replicated_target(abstract, mesh))
    # Every evaluation, export, kept model and diagnosis of a run comes through here.
    networks.check_finite(
        {"params": state.params, "batch_stats": state.batch_stats},
        f"the model of step {int(state.step)} restored from {workdir}",
        "no figure or file is made from it",
    )
    return settings, model_holder["fns"], state


def _restore_checkpoint(workdir: str, step: Optional[int], wanted: int, target):
    """The state of checkpoint `wanted` (the newest intact one if `step` is None) onto `target`."""
    manager = checkpoints.checkpoint_manager(workdir, create=False)
    try:
        if step is None:
            return checkpoints.restore_newest_intact(manager, target)[0]
        if wanted in manager.all_steps():
            return manager.restore(wanted, args=ocp.args.StandardRestore(target))
        raise UserError(
            f"{workdir!r} has no model of step {wanted} (kept models: "
            f"{kept_models.steps(workdir) or 'none'}; checkpoints: {sorted(manager.all_steps()) or 'none'})"
        )
    finally:
        manager.close()


def keep_models(workdir: str, steps_to_keep=None) -> list[int]:
    """Writes the kept model (`kept_models.save`) of every checkpoint step in `steps_to_keep`
    (default: every checkpoint) that has none yet; returns the steps written. The caller holds
    the workdir's lock (`locks.exclusive`), so no trainer prunes a checkpoint being read."""
    if checkpoints.latest_step(workdir) is None:
        return []
    settings = load_settings(workdir)
    manager = checkpoints.checkpoint_manager(workdir, create=False)
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
            {
                "model": settings.model.name,
                "dataset": settings.dataset,
                "method": settings.method.name,
                "seed": settings.seed,
            },
        )
        written.append(step)
    return written
