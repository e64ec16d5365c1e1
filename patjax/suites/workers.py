"""Which runs of a suite's plan each worker takes: K workers (a SLURM job array, or
--num_workers / --worker_index) share the plan by position, so that they need no coordinator;
the run claims (CLAIM_FILE, held by the runner) keep two workers off one run when the shares
overlap."""

from __future__ import annotations

import os
from typing import Optional, Sequence

from patjax.core.errors import UserError
from patjax.suites import Run

CLAIM_FILE = ".claim"  # in each run's directory; held (flock) by the worker on the run


def worker_slot(num_workers: Optional[int] = None, worker_index: Optional[int] = None, environ=None) -> tuple[int, int]:
    """(K, i): this worker takes the runs at positions p of the plan with p % K == i.

    The values given; when neither is given, a SLURM job array's (K = SLURM_ARRAY_TASK_COUNT,
    i = SLURM_ARRAY_TASK_ID - SLURM_ARRAY_TASK_MIN, so an array need not start at 0); else
    (1, 0). Bad values are a UserError.
    """
    environ = os.environ if environ is None else environ
    if num_workers is None and worker_index is None and environ.get("SLURM_ARRAY_TASK_ID"):
        values = {}
        for name in ("SLURM_ARRAY_TASK_COUNT", "SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_MIN"):
            try:
                values[name] = int(environ.get(name, ""))
            except ValueError:
                raise UserError(
                    f"{name} must be an integer in a SLURM job array, got "
                    f"{environ.get(name)!r}; or give --num_workers and --worker_index"
                ) from None
        num_workers = values["SLURM_ARRAY_TASK_COUNT"]
        worker_index = values["SLURM_ARRAY_TASK_ID"] - values["SLURM_ARRAY_TASK_MIN"]
        source = (
            f"from SLURM_ARRAY_TASK_ID {values['SLURM_ARRAY_TASK_ID']} - SLURM_ARRAY_TASK_MIN "
            f"{values['SLURM_ARRAY_TASK_MIN']} of SLURM_ARRAY_TASK_COUNT {num_workers}; an array with "
            f"a step or gaps needs --num_workers and --worker_index"
        )
    else:
        source = "from --num_workers and --worker_index"
        num_workers = 1 if num_workers is None else num_workers
        if worker_index is None:
            if num_workers != 1:
                raise UserError(f"--num_workers={num_workers} needs --worker_index (0 to {num_workers - 1})")
            worker_index = 0
    if num_workers < 1:
        raise UserError(f"the number of workers must be at least 1, got {num_workers} ({source})")
    if not 0 <= worker_index < num_workers:
        raise UserError(
            f"worker index {worker_index} is not in 0..{num_workers - 1} for {num_workers} worker(s) ({source})"
        )
    return num_workers, worker_index


def partition(runs: Sequence[Run], num_workers: int, worker_index: int) -> list[tuple[int, Run]]:
    """(position, run) of this worker's share of the plan: positions p with p % K == i."""
    return [(p, r) for p, r in enumerate(runs) if p % num_workers == worker_index]
