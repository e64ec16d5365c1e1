"""The experiment suites: which runs reproduce which table, at which scale (`get_suite`).

- `paper_full`: Tables 1 and 2 at the paper's settings (Appendix E).
- `stationary_cpu`: the CPU-scale test of the paper's claim with PAT's sampler at
  stationarity (docs/reproduction.md).
- `table1_cpu`: stationary_cpu's clean, PGD-10 and PAT runs and the cheaper sampler under the
  Table-1 PR protocol, with learning curves for the comparison at matched clean accuracy.
- `convergence_cpu`: PAT against PGD near convergence (30 epochs, the paper's optimizer),
  carried across machines in git.
- `table1_gpu`: PAT against PGD-10 on ResNet-18 for 30 epochs (the paper's optimizer), one
  GPU, prepared by tools/gpu/gpu_paper_scale.py.
- `ablation_cpu`: a fraction of an epoch with T = 5, kept as an example of an unconverged sampler.
- `smoke_cpu`: seconds per run, for tests and for trying out workers.

These are experiment descriptions, shipped beside the training configs and apart from the
library: the CPU suites are defined in `cpu`, the paper-scale ones in `gpu`, the settings they
share in `protocols`; a suite's shape, its plan of runs and the machinery that runs and reports
it are the library's (`patjax.suites`).
"""

from __future__ import annotations

from typing import Callable, Optional

from patjax.configs.suites.cpu import (
    ablation_cpu_suite,
    convergence_cpu_suite,
    smoke_cpu_suite,
    stationary_cpu_suite,
    table1_cpu_suite,
)
from patjax.configs.suites.gpu import paper_full_suite, table1_gpu_suite
from patjax.core.errors import UserError
from patjax.suites import Suite

SUITES: dict[str, Callable[[Optional[str]], Suite]] = {
    "ablation_cpu": ablation_cpu_suite,
    "stationary_cpu": stationary_cpu_suite,
    "table1_cpu": table1_cpu_suite,
    "paper_full": paper_full_suite,
    "smoke_cpu": smoke_cpu_suite,
    "convergence_cpu": convergence_cpu_suite,
    "table1_gpu": table1_gpu_suite,
}


def get_suite(name: str, data_dir: Optional[str]) -> Suite:
    if name not in SUITES:
        raise UserError(f"unknown suite {name!r}; choose one of {sorted(SUITES)}")
    return SUITES[name](data_dir)
