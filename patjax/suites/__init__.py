"""Layer 10, experiment suites: their plan of runs, runner, workers, tables over seeds; the doors import it.
Imports `interop`, `run`, `reporting`, `evaluators`, `methods`, `pat`, `attacks`, `models`, `data`, `core`.

A suite is groups of runs; a group is one block of the paper's tables (a dataset x model)
whose runs share one base config and differ only in `method` and `seed` (and the method's own
settings, listed in the group). Every run of a suite is evaluated with the suite's evaluators
on the same test images with the same evaluation seed (common random numbers). The suites
themselves, which runs reproduce which table at which scale, are experiment descriptions
shipped with the configs (`patjax.configs.suites`), not library code.

`patjax.suites.runner` runs a suite; `python -m patjax.experiments` is its command line.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Optional, Sequence

import ml_collections

from patjax import methods as methods_lib
from patjax.core.errors import UserError
from patjax.run import config as config_lib


@dataclasses.dataclass(frozen=True)
class Group:
    """Runs sharing one base config: one block of the paper's tables (a dataset x model)."""

    name: str
    base_config: ml_collections.ConfigDict
    methods: Sequence[str]
    seeds: Sequence[int]
    # Settings of individual methods on top of the base config: {method: {"a.b": value}}.
    method_overrides: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Suite:
    name: str
    description: str
    groups: Sequence[Group]
    # How every run is evaluated (patjax.run.evaluation.evaluate_workdir): images, batch, evaluators, eval settings.
    num_eval_examples: int
    eval_batch_size: int
    evaluators: Sequence[str]
    eval_overrides: dict
    scaled_down: Sequence[str] = ()  # human-readable list of what differs from the paper
    sweeps: Sequence["Sweep"] = ()  # runs of several groups lined up along one setting
    # Learning curves: every `curve_every_steps` steps of training (0: none) a checkpoint is kept;
    # the runner evaluates each with `curve_evaluators` on the suite's images and keeps its model.
    curve_every_steps: int = 0
    curve_evaluators: Sequence[str] = ("clean", "pr")
    curve_eval_overrides: dict = dataclasses.field(default_factory=dict)
    curve_methods: Sequence[str] = ()  # the methods whose runs have curves (empty: every run's)
    # Comparisons at matched clean accuracy: ((group, method) A, (group, method) B), seed by seed:
    # A's learning curve interpolated at the clean accuracy of B's final model (learning_curves).
    matched: Sequence[tuple] = ()
    # Whether each run keeps its final model (and its curve points') in DIR/.../models/, so that it
    # can be evaluated again without retraining; False for ablation_cpu and stationary_cpu, whose
    # committed runs hold no kept models.
    keep_models: bool = True

    @property
    def pr_distribution(self) -> str:
        """The law of the suite's headline PR (its tables lead with it; the others are beside it)."""
        return self.eval_overrides.get("pr.distribution", config_lib.default_config().eval.pr.distribution)


def run_name(group: str, method: str, seed: int) -> str:
    """A run's name in a suite, and its directory under runs/: group/method_sSEED."""
    return f"{group}/{method}_s{seed}"


@dataclasses.dataclass(frozen=True)
class SweepPoint:
    """One run of a sweep, named by group, method and seed, and where it sits on the sweep's axis."""

    label: str
    group: str
    method: str
    seed: int = 0
    value: Optional[float] = None  # position on the axis; None for a baseline
    series: str = ""  # points of one series are joined by a line in the plot

    @property
    def run_name(self) -> str:
        return run_name(self.group, self.method, self.seed)


@dataclasses.dataclass(frozen=True)
class Sweep:
    """Runs from several groups along one setting (e.g. PAT's T), each set against baseline runs.

    Every run of a suite is evaluated on the same images with the same noise, so a point and a
    baseline are paired even when they come from different groups (aggregate checks this).
    """

    name: str
    axis: str  # what the points' values are, for the table and the plot
    points: Sequence[SweepPoint]
    baselines: Sequence[SweepPoint]  # each point's paired difference to each baseline is reported
    epsilon: float = 0.2  # the PR level shown


@dataclasses.dataclass(frozen=True)
class Run:
    group: str
    method: str
    seed: int
    config: ml_collections.ConfigDict

    @property
    def name(self) -> str:
        return run_name(self.group, self.method, self.seed)


def set_field(cfg: ml_collections.ConfigDict, dotted: str, value) -> None:
    target = cfg
    *path, last = dotted.split(".")
    for p in path:
        target = target[p]
    if last not in target:
        raise UserError(f"unknown config field {dotted!r}")
    target[last] = value


def plan(suite: Suite, groups: Optional[Sequence[str]] = None, methods: Optional[Sequence[str]] = None) -> list[Run]:
    """The suite's runs in order (group, seed, method in the paper's order), optionally filtered."""
    known_groups = [g.name for g in suite.groups]
    for name in groups or ():
        if name not in known_groups:
            raise UserError(f"suite {suite.name!r} has no group {name!r}; choose from {', '.join(known_groups)}")
    runs = []
    for group in suite.groups:
        if groups and group.name not in groups:
            continue
        # Seed-major order: an interrupted suite has every method of the first seed(s).
        for seed in group.seeds:
            for method in methods_lib.ordered(group.methods):
                if methods and method not in methods:
                    continue
                cfg = copy.deepcopy(group.base_config)
                cfg.method = method
                cfg.seed = int(seed)
                for key, value in group.method_overrides.get(method, {}).items():
                    set_field(cfg, key, value)
                runs.append(Run(group.name, method, int(seed), cfg))
    for name in methods or ():
        if not any(r.method == name for r in runs):
            raise UserError(f"method {name!r} is not in suite {suite.name!r}")
    return runs
