"""Training: one compiled step (batch assembly, inner sampler/attack, loss, update) and the loop.

`train_step` is a single `jax.jit` function with the train state donated: it gathers the
batch from the device-resident uint8 training set, augments it, runs the configured
method (for PAT: the Langevin sampler of Algorithm 1 and the SNIS-weighted loss of
Algorithm 2), takes the gradient, applies the optimizer and updates BatchNorm statistics.
It is written on global-batch arrays; the batch is sharded over a 1-D 'data' mesh, so
batch reductions (the SNIS softmax included) still run over the whole global batch.
"""

from __future__ import annotations

import functools
import json
import os
import shlex
import time
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
from absl import logging
from tqdm import tqdm

from patjax import methods
from patjax.core import files, sharding
from patjax.core.errors import INT32_MAX, UserError, integer
from patjax.data import cifar, download
from patjax.evaluators import clean as clean_evaluator
from patjax.models import networks
from patjax.run import checkpoints
from patjax.run import optimizer as optimizer_lib
from patjax.run import settings as settings_lib
from patjax.run import state as state_lib
from patjax.run import workdir as workdir_lib


def train_step(
    state: state_lib.TrainState,
    images,
    labels,
    permutation,
    *,
    model_fns,
    loss_fn,
    batch_size: int,
    steps_per_epoch: int,
    tx: optax.GradientTransformation,
    schedule,
    batch_sharding,
):
    """One step of Algorithm 2 (or of the configured method) on the step's global batch.
    loss_fn: `methods.make_method(settings)`."""
    position = state.step % steps_per_epoch
    indices = jax.lax.dynamic_slice_in_dim(permutation, position * batch_size, batch_size)
    step_key = jax.random.fold_in(jax.random.fold_in(state.rng, 1), state.step)
    augment_key, method_key = jax.random.split(step_key)
    x = cifar.augment(augment_key, images[indices])
    y = labels[indices]
    if batch_sharding is not None:
        x = jax.lax.with_sharding_constraint(x, batch_sharding)
        y = jax.lax.with_sharding_constraint(y, batch_sharding)

    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
    (_, (batch_stats, metrics)), grads = grad_fn(state.params, model_fns, state.batch_stats, x, y, method_key)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics = dict(metrics, learning_rate=schedule(state.step), grad_norm=optax.tree.norm(grads))
    new_state = state.replace(step=state.step + 1, params=params, batch_stats=batch_stats, opt_state=opt_state)
    return new_state, metrics


def create_step(settings: settings_lib.TrainSettings, steps_per_epoch: int, mesh, model=None):
    """(model_fns, initial state, jitted step): SGD with MultiStepLR as in PyTorch (Algorithm 2
    line 20 / Appendix E), the state initialized from the seed (or a user's module and its own
    variables, `state.user_model`), and the step with the batch sharded over `mesh`."""
    schedule = settings.optimizer.schedule(steps_per_epoch)
    tx = optimizer_lib.make_optimizer(settings.optimizer, schedule)
    if model is None:
        model_fns, state = state_lib.create_train_state(settings.model, settings.seed, tx)
    else:
        model_fns, params, batch_stats, _ = state_lib.user_model(model)
        state = state_lib.user_train_state(params, batch_stats, settings.seed, tx)
    step_fn = make_train_step(
        methods.make_method(settings.method),
        model_fns,
        tx,
        schedule,
        steps_per_epoch,
        settings.batch_size,
        sharding.batch_sharding_for(mesh),
    )
    return model_fns, state, step_fn


def make_train_step(loss_fn, model_fns, tx, schedule, steps_per_epoch: int, batch_size: int, batch_sharding=None):
    step = functools.partial(
        train_step,
        model_fns=model_fns,
        loss_fn=loss_fn,
        batch_size=batch_size,
        steps_per_epoch=steps_per_epoch,
        tx=tx,
        schedule=schedule,
        batch_sharding=batch_sharding,
    )
    return jax.jit(step, donate_argnums=(0,))


METRICS_FILE = "metrics.jsonl"  # in a run's workdir: one JSON line per logging window


class _MetricWriter:
    """metrics.jsonl (for scripts) and TensorBoard event files (for people)."""

    def __init__(self, workdir: str):
        path = os.path.join(workdir, METRICS_FILE)
        # A line cut short by a sitting that died mid-write: its window is lost either way (the
        # sitting resumes from a checkpoint no later than that line's step).
        files.drop_cut_line(path)
        self._jsonl = open(path, "a")
        # Imported here, not at the top: tensorboardX imports PyTorch whenever it is installed
        # (about 2 s), which every command importing this module would pay, a refused one included;
        # only a training run's writer needs it.
        from tensorboardX import SummaryWriter

        self._tb = SummaryWriter(os.path.join(workdir, "tensorboard"))

    def write(self, step: int, scalars: dict):
        self._jsonl.write(json.dumps({"step": step, **scalars}) + "\n")
        self._jsonl.flush()
        for name, value in scalars.items():
            self._tb.add_scalar(name, value, step)
        self._tb.flush()

    def close(self):
        self._jsonl.close()
        self._tb.close()


def logged_training(workdir: str, batch_size: int, in_progress: bool = False) -> Optional[tuple[int, float]]:
    """The last logged step and the seconds spent in training steps, summed over metrics.jsonl's
    logging windows (each window's steps times the batch over its images per second), or None
    before a first logged window.

    The log is the one record that spans every sitting of a run stopped and resumed on other
    machines, so this is a run's training time; it includes each sitting's compilation (inside its
    first window) and leaves out restoring and the per-window test-accuracy check. Lines without
    `window_steps` count the steps since the previous line. `in_progress`: the run may be
    training, so a last line without its newline is one being written, not counted yet; in a
    finished run's log it is damage.
    """
    path = os.path.join(workdir, METRICS_FILE)
    if not os.path.isfile(path):
        return None
    total, previous, windows = 0.0, 0, 0
    with open(path) as f:
        for number, line in enumerate(f, 1):
            try:
                if not line.endswith("\n") and in_progress:
                    break
                entry = json.loads(line)
                step, rate = int(entry["step"]), float(entry["images_per_s"])
                steps = int(entry.get("window_steps", step - previous))
            except (ValueError, KeyError, TypeError):
                raise UserError(f"{path} line {number} is not a metrics line; repair or remove it") from None
            if steps <= 0 or rate <= 0:
                raise UserError(
                    f"{path} line {number}: step {step} after step {previous} and no window_steps; repair or remove it"
                )
            total += steps * batch_size / rate
            previous, windows = step, windows + 1
    return (previous, total) if windows else None


def check_collectives_pair_across_processes(method: methods.MethodSettings) -> None:
    """Refuses CPU multi-process runs whose step may pair all-reduces wrongly.

    XLA:CPU's cross-process collectives (gloo) carry no tag: two all-reduces in flight at once
    are paired in the order each process reaches them. An inner attack that runs BatchNorm on
    batch statistics holds all-reduces inside its loop, beside those of the passes that do not
    wait for it (ALP's clean forward pass), so the processes can pair different all-reduces:
    measured for ALP on 2 processes, gloo aborted on mismatched sizes; equal sizes would add
    the wrong numbers silently (docs/multiprocess.md). GPUs order collectives in one stream.
    """
    if jax.process_count() == 1 or jax.default_backend() != "cpu":
        return
    if method.sampler is not None:
        where, mode, setting = "sampler", method.sampler.bn_mode, "langevin.bn_mode"
    elif method.attack is not None:
        where, mode, setting = "attack", method.attack.bn_mode, "attack.bn_mode"
    else:
        return
    if mode == "train":
        raise UserError(
            f"{method.name}'s {where} runs BatchNorm on batch statistics, whose all-reduces several "
            f"CPU processes can pair wrongly (docs/multiprocess.md); run one process, or set "
            f"--config.{setting}=inference"
        )


def train_run(
    settings: settings_lib.TrainSettings,
    workdir: str,
    stop_after_steps: Optional[int] = None,
    stop_at: Optional[float] = None,
    model=None,
):
    """Trains (or resumes) the run in `workdir`; returns the final train state.

    model: a user's module trained instead of the network settings.model names: a flax.nnx.Module
      or a (linen module, variables) pair, from its own variables (`state.user_model`); the
      workdir records its class and variable shapes (USER_MODEL_FILE), and resuming takes the
      same module. Its checkpoints and training log are a run's; its evaluation is
      `patjax.api.evaluate` on the trained module (`patjax.api.train_model` returns it).

    settings: `config.train_settings(cfg)`, built where the config enters (the command line, the
      suite runner); it has checked the run's evaluation settings too.
    stop_after_steps: leave after this many steps of this invocation (with a checkpoint), as
      a preempted job would; running again resumes exactly where it stopped.
    stop_at: the same once the wall clock (`time.time()`) passes this time, after the step that
      passes it: a session or job with a time limit ends with a checkpoint, not a lost epoch.
    """
    if stop_after_steps is not None:
        integer("--stop_after_steps", stop_after_steps, 1, INT32_MAX)
    check_collectives_pair_across_processes(settings.method)
    mesh = sharding.make_mesh(settings.batch_size)
    # Process 0 writes the workdir's files and holds its lock for the run's processes.
    with sharding.writer_lock(workdir, "a trainer"):
        return _train(settings, workdir, mesh, stop_after_steps, stop_at, model)


USER_MODEL_FILE = workdir_lib.USER_MODEL_FILE  # the user's module a run trains (`state.user_model`)


def _check_user_model(workdir: str, model, resuming: bool) -> Optional[dict]:
    """The user's module's description, checked against the one the workdir records: a run
    resumes with the module it started with, and a run of a registry network without one."""
    path = os.path.join(workdir, USER_MODEL_FILE)
    description = None if model is None else state_lib.user_model(model)[3]
    saved = files.read_json(path, "use a new workdir") if resuming else None
    if resuming and saved != description:
        if description is None:
            raise UserError(f"{workdir!r} trains a {saved['class']} of the user's; resume with train_run(..., model=)")
        if saved is None:
            raise UserError(f"{workdir!r} trains a network of patjax's registry, not a module of the user's")
        raise UserError(
            f"{workdir!r} trains a {saved['class']} whose variables differ from the {description['class']} "
            f"passed; resume with the same module, or use a new workdir"
        )
    return description


def _train(
    settings: settings_lib.TrainSettings,
    workdir: str,
    mesh,
    stop_after_steps: Optional[int],
    stop_at: Optional[float],
    model=None,
):
    s = settings
    resuming = os.path.isfile(workdir_lib.config_path(workdir))
    if resuming:
        workdir_lib.check_resume_compatible(s, workdir)
    elif os.path.isdir(os.path.join(workdir, "checkpoints")):
        raise UserError(f"{workdir!r} has checkpoints but no config.json; use a new --workdir")
    description = _check_user_model(workdir, model, resuming)

    # Everything that can fail on bad input happens before the workdir is written.
    train_split = cifar.load_split(s.dataset, "train", s.data_dir)
    test_split = cifar.load_split(s.dataset, "test", s.data_dir)
    steps_per_epoch = len(train_split) // s.batch_size  # the last partial batch is dropped
    if steps_per_epoch == 0:
        raise UserError(f"batch_size {s.batch_size} exceeds the {len(train_split)} training images")
    num_steps = s.optimizer.total_steps(steps_per_epoch)
    model_fns, state, step_fn = create_step(s, steps_per_epoch, mesh, model)

    if sharding.is_writer():
        workdir_lib.save_config(s.record, workdir)
        if description is not None:
            files.write_json(os.path.join(workdir, USER_MODEL_FILE), description)
    manager = checkpoints.checkpoint_manager(workdir, s.max_checkpoints_to_keep)
    moved = []

    def move_aside(step):
        moved.append(step)
        return checkpoints.move_aside(workdir, step)

    # Restored straight onto this run's mesh: a checkpoint written on any device count resumes.
    restored, restored_step = checkpoints.restore_newest_intact(
        manager, sharding.replicated_target(state, mesh), on_damaged=move_aside
    )
    if moved:
        manager.reload()  # the moved steps may be saved again
    if restored is not None:
        state = restored
        logging.info("resumed from step %d", restored_step)

    state, train_images, train_labels = sharding.place_on_mesh(mesh, state, train_split.images, train_split.labels)
    permute = jax.jit(cifar.epoch_permutation, static_argnums=2)
    data_key = jax.random.fold_in(state.rng, 0)
    test_accuracy_fn = clean_evaluator.accuracy_fn(model_fns, s.evaluation.batch_size)

    checkpoint_every = s.checkpoint_every_steps if s.checkpoint_every_steps > 0 else steps_per_epoch
    log_every = s.log_every_steps if s.log_every_steps > 0 else steps_per_epoch
    start = int(state.step)
    end = num_steps if stop_after_steps is None else min(num_steps, start + stop_after_steps)
    writer = _MetricWriter(workdir) if sharding.is_writer() else None
    progress = tqdm(
        total=num_steps,
        initial=start,
        unit="step",
        dynamic_ncols=True,
        desc=f"train {s.method.name}",
        disable=not (s.progress_bar and sharding.is_writer()),
    )
    pending, window_start, window_steps = [], time.perf_counter(), 0
    checked = start  # the last step whose loss and gradient are known to be finite
    permutation, permutation_epoch = None, None
    try:
        for step in range(start, end):
            epoch = step // steps_per_epoch
            if epoch != permutation_epoch:
                permutation, permutation_epoch = permute(data_key, epoch, len(train_split)), epoch
            state, metrics = step_fn(state, train_images, train_labels, permutation)
            pending.append(metrics)
            window_steps += 1
            if len(pending) > 2:  # bound run-ahead so the progress bar shows real throughput
                jax.block_until_ready(pending[-3]["loss"])
            progress.update(1)
            done = step + 1
            if stop_at is not None and done < end and sharding.process0_decides(time.time() >= stop_at):
                end = done  # logged and checkpointed below as the last step of this invocation
            if done % log_every == 0 or done == end:
                summary = _summarize(pending)
                elapsed = time.perf_counter() - window_start
                summary["images_per_s"] = window_steps * s.batch_size / max(elapsed, 1e-9)
                # The window's own length: a resumed run's first window starts at its checkpoint, which
                # may precede the last logged step (`logged_training`).
                summary["window_steps"] = window_steps
                summary["epoch"] = done / steps_per_epoch
                summary["devices"] = mesh.size
                summary["test_clean_accuracy"] = test_accuracy_fn(state, test_split, s.log_test_examples)
                if writer is not None:
                    writer.write(done, summary)
                progress.set_postfix(
                    loss=f"{summary['loss']:.3f}",
                    test_acc=f"{summary['test_clean_accuracy']:.3f}",
                    img_s=f"{summary['images_per_s']:.1f}",
                )
                logging.info("step %d: %s", done, summary)
                pending, window_start, window_steps = [], time.perf_counter(), 0
                _refuse_non_finite(summary, checked, done, manager)
                checked = done
            if done % checkpoint_every == 0 or done == end:
                if checked != done:  # steps since the last log, checked before their state is saved
                    _refuse_non_finite(_summarize(pending), checked, done, manager)
                    checked = done
                _refuse_non_finite_model(state, done, manager)
                manager.save(done, args=ocp.args.StandardSave(state))
            if done == end:
                break
        manager.wait_until_finished()
    finally:
        if writer is not None:
            writer.close()
        manager.close()
        progress.close()
    return state


def _refuse_non_finite(summary: dict, first: int, last: int, manager: ocp.CheckpointManager) -> None:
    """A one-line UserError if the loss or the gradient norm of steps first+1..last (their means
    in `summary`) is not finite; the newest checkpoint then precedes them.

    The values are read where the loop already brings metrics to the host (each logging window)
    and once more before each checkpoint, never per step: a step's NaN is found at most one
    window late, and no checkpoint is saved after a step that was not checked. The state a finite
    step produced is checked too, before it is saved (`_refuse_non_finite_model`).
    """
    bad = {k: summary[k] for k in ("loss", "grad_norm") if k in summary and not np.isfinite(summary[k])}
    if not bad:
        return
    kept = manager.latest_step()
    what = " and ".join(f"{k} {v}" for k, v in bad.items())
    steps = f"step {last}" if last == first + 1 else f"steps {first + 1}-{last}"
    raise UserError(
        f"training stopped: {what} at {steps}; "
        + (f"the newest checkpoint, step {kept}, precedes them" if kept is not None else "no checkpoint was saved")
    )


def _refuse_non_finite_model(state, step: int, manager: ocp.CheckpointManager) -> None:
    """A one-line UserError if the parameters or BatchNorm statistics after `step` hold a NaN or
    an infinity. A finite loss and gradient do not make a finite update when the learning rate
    times the gradient overflows float32 (a rate near float32's largest), so the state itself is
    checked before it is saved: one reduction per checkpoint, beside Orbax's copy."""
    kept = manager.latest_step()
    networks.check_finite(
        {"params": state.params, "batch_stats": state.batch_stats},
        f"training stopped: the model after step {step}",
        f"the newest checkpoint, step {kept}, precedes it" if kept is not None else "no checkpoint was saved",
    )


def closing_message(settings: settings_lib.TrainSettings, workdir: str, step: int) -> str:
    """What training says last (`main.py`): where the model of `step` is, its clean accuracy on
    which test images (the training log's check at that step), and the command to run next."""
    total = settings.total_steps()
    where = os.path.join(workdir, "checkpoints", str(step))
    lines = [
        f"trained {settings.method.name} to step {step} of {total}: {where}"
        if step >= total
        else f"stopped at step {step} of {total} (checkpoint {where}); run the same command again to resume"
    ]
    accuracy = None
    try:  # the model is saved; a damaged log only loses this line of the message
        for entry in files.read_json_lines(os.path.join(workdir, METRICS_FILE), "repair or remove that line"):
            accuracy = entry.get("test_clean_accuracy") if entry.get("step") == step else accuracy
    except UserError as error:
        lines.append(f"no clean accuracy to report: {error}")
    if accuracy is not None:
        dataset = download.DISPLAY_NAMES[settings.dataset]
        k = settings.log_test_examples
        images = f"the whole {dataset} test split" if k <= 0 else f"the first {k} {dataset} test images"
        lines.append(
            f"clean accuracy {100 * accuracy:.1f} % on {images} (the training log's check; {METRICS_FILE}), "
            f"not an evaluation"
        )
    ev = settings.evaluation
    images = "all" if ev.num_examples == settings_lib.WHOLE_SPLIT else f"the first {ev.num_examples}"
    lines.append(
        f"{'next' if step >= total else 'then'}: python -m patjax.evaluate --workdir={shlex.quote(workdir)}   "
        f"({', '.join(ev.evaluators)} on {images} test images, with intervals)"
    )
    return "\n".join(lines)


def _summarize(step_metrics: list) -> dict:
    """Means over the logging window (maxima for *_max, the last learning rate), one transfer."""
    stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *step_metrics)
    reduced = {
        k: (jnp.max(v) if k.endswith("_max") else v[-1] if k == "learning_rate" else jnp.mean(v))
        for k, v in stacked.items()
    }
    return {k: float(v) for k, v in jax.device_get(reduced).items()}
