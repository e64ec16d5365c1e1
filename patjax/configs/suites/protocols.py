"""The settings several suites share, pinned here rather than taken from the config defaults so
that a suite's runs and evaluations do not change with them: the Table-1 evaluation protocol,
the Gaussian-only one of the early CPU suites, the cheaper sampler and Appendix E's epoch.
"""

from __future__ import annotations

# The Table-1 protocol (evaluation.PROTOCOL): its law first, the others beside it; CW-20 with
# the AT-PR evaluation's margin.
TABLE1_PR_DISTRIBUTIONS = ("uniform", "gaussian", "pdis")
TABLE1_EVAL = {"pr.distribution": "uniform", "pr.distributions": TABLE1_PR_DISTRIBUTIONS, "cw.kappa": 2.0}
# A suite's evaluations under it (every run on the same noise: seed 0), and its learning curves'
# (the headline law alone).
TABLE1_SUITE_EVAL = {**TABLE1_EVAL, "seed": 0}
TABLE1_CURVE_EVAL = {**TABLE1_EVAL, "pr.distributions": ("uniform",), "seed": 0}
# stationary_cpu and ablation_cpu are evaluated with Gaussian noise only and CW's kappa = 50, the
# settings their committed evaluations hold, so that the runner does not find those stale and redo them.
GAUSSIAN_ONLY = {"pr.distribution": "gaussian", "pr.distributions": ("gaussian",), "cw.kappa": 50.0}

# The cheaper sampler: a chain started at x is at its endpoint by step 19 (the diagnostic), so T = 20
# caps it; the tolerance alone saves no batched compute (one chain of a batch runs to T).
CHEAP_SAMPLER = {"langevin.init": "clean", "langevin.tolerance": 3e-4, "langevin.steps": 20}
STEPS_PER_EPOCH = 50_000 // 256  # Appendix E's batch 256; the last partial batch is dropped
