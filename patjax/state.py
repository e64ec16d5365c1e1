"""The train state (one pytree that checkpoints whole), the optimizer, and the workdir.

Workdir layout:
  config.json        the config of the run (checked on resume, read by evaluate)
  checkpoints/       Orbax CheckpointManager; a step directory appears only once complete
  metrics.jsonl      one JSON line per logging point (also in tensorboard/)
  tensorboard/       event files
  eval/results.json  written by `python -m patjax.evaluate`
"""
from __future__ import annotations

import json
import os
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import ml_collections
import optax
import orbax.checkpoint as ocp

from patjax import data, models
from patjax.config import RESUMABLE_FIELDS
from patjax.errors import UserError
from patjax.methods import ModelFns


@flax.struct.dataclass
class TrainState:
    step: jax.Array
    params: Any
    batch_stats: Any
    opt_state: Any
    rng: jax.Array  # raw uint32 key; the step key is fold_in(fold_in(rng, 1), step)


def compute_dtype(cfg):
    return jnp.bfloat16 if cfg.compute_dtype == "bfloat16" else jnp.float32


def build_model(cfg):
    kwargs = {} if cfg.model == "small_cnn" else {"width": int(cfg.model_width)}
    return models.create_model(cfg.model, cfg.dataset, data.NUM_CLASSES[cfg.dataset],
                               dtype=compute_dtype(cfg), **kwargs)


def total_steps(cfg, steps_per_epoch: int) -> int:
    return int(cfg.num_train_steps) if cfg.num_train_steps > 0 else int(cfg.num_epochs) * steps_per_epoch


def learning_rate_schedule(cfg, steps_per_epoch: int) -> optax.Schedule:
    """MultiStepLR (Appendix E): lr x decay at the given fractions of the run.

    With epoch-based runs the milestones fall on epoch boundaries (epochs 75 and 90 of 100).
    """
    if cfg.num_train_steps > 0:
        boundaries = [int(round(f * cfg.num_train_steps)) for f in cfg.lr_decay_fractions]
    else:
        boundaries = [int(round(f * cfg.num_epochs)) * steps_per_epoch for f in cfg.lr_decay_fractions]
    scales = {}
    for b in boundaries:  # coinciding milestones multiply, as in MultiStepLR
        scales[b] = scales.get(b, 1.0) * float(cfg.lr_decay_factor)
    return optax.piecewise_constant_schedule(float(cfg.learning_rate), scales)


def make_optimizer(cfg, schedule: optax.Schedule) -> optax.GradientTransformation:
    """PyTorch SGD(momentum, nesterov, weight_decay): g += wd*p; b = m*b + g; step = g + m*b."""
    return optax.chain(
        optax.add_decayed_weights(float(cfg.weight_decay)),
        optax.sgd(schedule, momentum=float(cfg.momentum), nesterov=bool(cfg.nesterov)),
    )


def create_train_state(cfg, tx: optax.GradientTransformation):
    """(model, ModelFns, TrainState) for the config, initialized from cfg.seed."""
    model = build_model(cfg)
    root = jax.random.PRNGKey(int(cfg.seed))
    init_key, rng = jax.random.split(root)
    params, batch_stats = models.init_variables(model, init_key)
    state = TrainState(step=jnp.zeros((), jnp.int32), params=params, batch_stats=batch_stats,
                       opt_state=tx.init(params), rng=rng)
    return model, ModelFns(model.apply), state


# ---------------------------------------------------------------------------------------
# Workdir: config and checkpoints.

def config_path(workdir: str) -> str:
    return os.path.join(workdir, "config.json")


def load_workdir_config(workdir: str) -> ml_collections.ConfigDict:
    path = config_path(workdir)
    if not os.path.isfile(path):
        raise UserError(f"{workdir!r} is not a patjax workdir (no config.json)")
    with open(path) as f:
        return ml_collections.ConfigDict(json.load(f))


def _flatten(d, prefix=""):
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = list(v) if isinstance(v, tuple) else v
    return out


def check_resume_compatible(cfg, workdir: str) -> None:
    """Refuses to resume a checkpoint with a config that changes what a step computes."""
    saved = _flatten(json.loads(load_workdir_config(workdir).to_json()))
    current = _flatten(json.loads(cfg.to_json()))
    differing = sorted(
        k for k in set(saved) | set(current)
        if k.split(".")[0] not in RESUMABLE_FIELDS and saved.get(k) != current.get(k))
    if differing:
        shown = ", ".join(f"{k}: {saved.get(k)!r} -> {current.get(k)!r}" for k in differing[:4])
        raise UserError(f"config does not match the checkpoint in {workdir!r} ({shown}); "
                        "use a new --workdir or the saved config")


def save_config(cfg, workdir: str) -> None:
    os.makedirs(workdir, exist_ok=True)
    tmp = config_path(workdir) + ".tmp"
    with open(tmp, "w") as f:
        f.write(cfg.to_json(indent=2))
    os.replace(tmp, config_path(workdir))  # atomic: a kill never leaves half a config


def checkpoint_manager(workdir: str, max_to_keep: int = 3, create: bool = True) -> ocp.CheckpointManager:
    # Orbax writes each step to a temporary directory and renames it when complete, so a
    # checkpoint a kill interrupted is never listed or restored.
    options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=create,
                                           enable_async_checkpointing=False)
    return ocp.CheckpointManager(os.path.join(os.path.abspath(workdir), "checkpoints"), options=options)


def restore_latest(manager: ocp.CheckpointManager, abstract_state: TrainState):
    step = manager.latest_step()
    if step is None:
        return None
    return manager.restore(step, args=ocp.args.StandardRestore(abstract_state))
