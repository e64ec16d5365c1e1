"""Experiment suites: train a list of (method, seed) runs, evaluate them on common random
numbers, and write the paper's Tables 1 and 2 with intervals.

  python -m patjax.experiments --suite=ablation_cpu --workdir=runs/ablation_cpu
  python -m patjax.experiments --suite=paper_full --workdir=runs/paper_full [--groups=cifar10_resnet18]
  python -m patjax.experiments --suite=paper_full --workdir=DIR --dry_run   # the plan, nothing run
  python -m patjax.experiments --suite=smoke_cpu --workdir=DIR   # 4 tiny runs: try the machinery

Every run of a suite shares one base config; a run changes only `method` and `seed` (and
the method's own settings, listed in the suite). Each run lives in
DIR/runs/GROUP/METHOD_sSEED (an ordinary patjax workdir: `python -m patjax.evaluate` and
`main.py` work on it). The runner

- trains the run with `patjax.train.train_and_evaluate` (which resumes from the latest
  checkpoint: an interrupted suite resumes inside the run it stopped in),
- marks it trained (`suite_run.json`) and evaluates it with `patjax.evaluate.run` with the
  suite's evaluation settings. Every run is evaluated on the same test images with the same
  evaluation seed, so run A's and run B's PR samples use the same noise (common random
  numbers), and differences between runs are paired image by image,
- reuses every run already trained and evaluated with the same settings,
- rewrites DIR/results.md, DIR/results.json and DIR/pr_vs_eps.png after every run (pending
  runs are listed as such), and prints one progress line per stage.

Workers: any number of processes may run the same suite on the same DIR at once (a SLURM
job array, several machines on a shared filesystem, several processes on one machine;
docs/cluster.md).
- Dynamic claims: a worker holds an flock on the run's DIR/runs/GROUP/METHOD_sSEED/.claim for
  as long as it trains and evaluates the run; another worker skips a claimed run (its progress
  line names the holder: pid, host, since when) and goes on to the next. The kernel drops the
  claim of a worker that dies (kill -9 included), so the next worker to look takes the run
  over and resumes it from its latest checkpoint. After a pass over its runs a worker looks
  again at the ones it skipped, and leaves once each is finished or held by a live worker.
- Static partition: --num_workers=K --worker_index=i (default: the SLURM job array's
  SLURM_ARRAY_TASK_COUNT and SLURM_ARRAY_TASK_ID - SLURM_ARRAY_TASK_MIN, else 1 and 0) makes
  worker i consider only the runs at positions p of the plan with p % K == i. The claims
  still hold, e.g. for two workers given the same index.
- The report is rebuilt by one worker at a time (an flock on DIR/.report.lock) from whatever
  has finished; `--report_only` rebuilds it without running anything.

Intervals (95 % by default, `eval.confidence`):
- one run: Clopper-Pearson for accuracies; percentile bootstrap over test images for PR;
- the mean over seeds and every difference between two methods: percentile bootstrap over
  test images, resampling the same images for every run (paired). These intervals cover the
  evaluation's sampling error (which images, which noise draws) for the trained models at
  hand; they do not cover seed-to-seed training variance, which the per-seed rows show.
"""
from __future__ import annotations

import copy
import dataclasses
import json
import os
import socket
import sys
import time
from typing import Callable, Optional, Sequence

import ml_collections
import numpy as np

from patjax import cli as cli_lib
from patjax import config as config_lib, data, evaluate, train
from patjax import state as state_lib
from patjax import stats
from patjax import workdir as workdir_lib
from patjax.errors import UserError

# The paper's row order (Table 1, then the ablation variants of Table 2) and names.
METHOD_ORDER = ("clean", "fgsm", "fgsm_cor", "pgd", "pgd_cor", "alp", "clp", "trades", "mart",
                "atpr", "pat_wos", "pat")
DISPLAY_NAMES = {"clean": "Clean", "fgsm": "FGSM", "fgsm_cor": "FGSM-COR", "pgd": "PGD",
                 "pgd_cor": "PGD-COR", "alp": "ALP", "clp": "CLP", "trades": "TRADES", "mart": "MART",
                 "atpr": "AT-PR", "pat_wos": "PAT(WOS)", "pat": "PAT"}
TABLE1_METHODS = ("clean", "fgsm", "pgd", "alp", "clp", "trades", "mart", "atpr", "pat")
# Table 2: pairs (baseline, variant) of the ablation.
TABLE2_PAIRS = (("fgsm", "fgsm_cor"), ("pgd", "pgd_cor"), ("pat_wos", "pat"))
# Paired differences reported (A - B), when both methods are in the suite.
COMPARISONS = (("pat", "pgd"), ("pat", "pat_wos"), ("pgd_cor", "pgd"), ("fgsm_cor", "fgsm"),
               ("pat", "trades"), ("pat", "mart"), ("pat", "atpr"), ("pat", "clean"), ("pgd", "clean"))
PR_DISTRIBUTION = "gaussian"


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
    # Keyword arguments of patjax.evaluate.run: num_examples, batch_size, evaluators, overrides.
    num_eval_examples: int
    eval_batch_size: int
    evaluators: Sequence[str]
    eval_overrides: dict
    scaled_down: Sequence[str] = ()  # human-readable list of what differs from the paper


@dataclasses.dataclass(frozen=True)
class Run:
    group: str
    method: str
    seed: int
    config: ml_collections.ConfigDict

    @property
    def name(self) -> str:
        return f"{self.group}/{self.method}_s{self.seed}"


def set_field(cfg: ml_collections.ConfigDict, dotted: str, value) -> None:
    target = cfg
    *path, last = dotted.split(".")
    for p in path:
        target = target[p]
    if last not in target:
        raise UserError(f"unknown config field {dotted!r}")
    target[last] = value


def plan(suite: Suite, groups: Optional[Sequence[str]] = None,
         methods: Optional[Sequence[str]] = None) -> list[Run]:
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
            for method in _ordered(group.methods):
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


def _ordered(methods):
    return sorted(methods, key=lambda m: (METHOD_ORDER.index(m) if m in METHOD_ORDER else len(METHOD_ORDER), m))


# ---------------------------------------------------------------------------------------
# Suites.

def default_data_dir() -> Optional[str]:
    """../shared/data next to the checkout (or $PATJAX_DATA_DIR) when it holds CIFAR-10."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for candidate in (os.environ.get("PATJAX_DATA_DIR"), os.path.join(here, "..", "shared", "data"),
                      os.path.join(os.getcwd(), "..", "shared", "data")):
        if candidate and os.path.isfile(os.path.join(candidate, "cifar-10-batches-bin", "test_batch.bin")):
            return os.path.abspath(candidate)
    return None


# The CPU suite's scale (see ablation_cpu_suite and docs/reproduction.md).
CPU_TRAIN_STEPS = 100
CPU_BATCH_SIZE = 128
CPU_LANGEVIN_STEPS = 5
CPU_PGD_STEPS = 5
CPU_EVAL_EXAMPLES = 500


def _cpu_config(data_dir: Optional[str], *, batch_size: int, train_steps: int, langevin_steps: int,
                eval_examples: int, eval_batch_size: int) -> ml_collections.ConfigDict:
    """The base config of the CPU suites: real CIFAR-10, the small CNN, lr 0.05 with the paper's
    MultiStepLR shape, PR with the suite's distribution only."""
    cfg = config_lib.default_config()
    cfg.dataset = "cifar10"
    cfg.data_dir = data_dir
    cfg.model = "small_cnn"
    cfg.batch_size = batch_size
    cfg.num_train_steps = train_steps
    cfg.learning_rate = 0.05
    cfg.langevin.steps = langevin_steps
    cfg.eval.num_examples = eval_examples
    cfg.eval.batch_size = eval_batch_size
    cfg.eval.pr_distributions = (PR_DISTRIBUTION,)
    return cfg


def ablation_cpu_suite(data_dir: Optional[str]) -> Suite:
    """Real CIFAR-10, small CNN, T = 5, a fraction of an epoch; 5 methods x 2 seeds."""
    cfg = _cpu_config(data_dir, batch_size=CPU_BATCH_SIZE, train_steps=CPU_TRAIN_STEPS,
                      langevin_steps=CPU_LANGEVIN_STEPS, eval_examples=CPU_EVAL_EXAMPLES, eval_batch_size=250)
    cfg.attack.steps = CPU_PGD_STEPS  # PGD / PGD-COR: the same number of inner gradient steps as T
    cfg.checkpoint_every_steps = 25
    cfg.log_every_steps = CPU_TRAIN_STEPS  # each log also measures accuracy on the 10,000 test images
    group = Group("cifar10_small_cnn", cfg, methods=("clean", "pgd", "pgd_cor", "pat_wos", "pat"),
                  seeds=(0, 1))
    return Suite(
        name="ablation_cpu",
        description="CPU-scale test of Tables 1-2 on real CIFAR-10 (small CNN, scaled-down training)",
        groups=(group,),
        num_eval_examples=CPU_EVAL_EXAMPLES, eval_batch_size=250,
        evaluators=("clean", "pgd20", "cw20", "pr"),
        eval_overrides={"pr_distributions": (PR_DISTRIBUTION,), "seed": 0},
        scaled_down=(
            "model: small CNN (3 conv stages 32/64/128) instead of ResNet-18 / WRN-50-2",
            f"training: {CPU_TRAIN_STEPS} steps of batch {CPU_BATCH_SIZE} "
            f"({CPU_TRAIN_STEPS * CPU_BATCH_SIZE} images, {CPU_TRAIN_STEPS * CPU_BATCH_SIZE / 50000:.2f} epochs of "
            f"the full 50,000-image training set) instead of 100 epochs of batch 256; lr 0.05 (paper 0.01) "
            f"with the paper's MultiStepLR shape (x0.1 at 75 % and 90 % of the run)",
            f"PAT / PAT(WOS): T = {CPU_LANGEVIN_STEPS} Langevin steps instead of 100 (other sampler settings as the paper)",
            f"PGD / PGD-COR training attack: {CPU_PGD_STEPS} steps (paper: 10) of alpha 2/255 in the 8/255 "
            f"L-inf ball, so that PGD and PAT take the same number of inner gradient steps",
            f"evaluation: the first {CPU_EVAL_EXAMPLES} CIFAR-10 test images instead of 10,000; PGD-20 and CW-20 "
            f"as the paper (eps 8/255, alpha 2/255); PR with Gaussian noise, N = 100, eps 0.1/0.12/0.15/0.2",
            "seeds: 2 per method",
        ))


# The smoke suite (smoke_cpu_suite): seconds per run, for tests and for trying out workers.
SMOKE_TRAIN_STEPS = 4
SMOKE_BATCH_SIZE = 32
SMOKE_EVAL_EXAMPLES = 16


def smoke_cpu_suite(data_dir: Optional[str]) -> Suite:
    """Real CIFAR-10, small CNN, 4 steps of batch 32, T = 2; clean and PAT x 2 seeds, evaluated
    on 16 images: every piece of a suite (claims, resume, report) in seconds per run."""
    # eval batch: also the batch of the training log's test accuracy: one batch
    cfg = _cpu_config(data_dir, batch_size=SMOKE_BATCH_SIZE, train_steps=SMOKE_TRAIN_STEPS, langevin_steps=2,
                      eval_examples=SMOKE_EVAL_EXAMPLES, eval_batch_size=500)
    cfg.attack.steps = 2
    cfg.checkpoint_every_steps = 2
    cfg.log_every_steps = SMOKE_TRAIN_STEPS
    cfg.log_test_examples = 500
    cfg.progress_bar = False
    group = Group("cifar10_small_cnn", cfg, methods=("clean", "pat"), seeds=(0, 1))
    return Suite(
        name="smoke_cpu",
        description="smoke test of the suite machinery on real CIFAR-10 (a few steps; the figures mean nothing)",
        groups=(group,),
        num_eval_examples=SMOKE_EVAL_EXAMPLES, eval_batch_size=SMOKE_EVAL_EXAMPLES,
        evaluators=("clean", "pgd20", "pr"),
        eval_overrides={"pr_distributions": (PR_DISTRIBUTION,), "seed": 0, "pr_samples": 4, "pr_chunk_size": 4,
                        "attack_steps": 2, "bootstrap_resamples": 200},
        scaled_down=(
            "model: small CNN (3 conv stages 32/64/128)",
            f"training: {SMOKE_TRAIN_STEPS} steps of batch {SMOKE_BATCH_SIZE}; PAT with T = 2",
            f"evaluation: the first {SMOKE_EVAL_EXAMPLES} test images; PGD with 2 steps; PR with N = 4",
        ))


# The stationary CPU suite (stationary_cpu_suite): 2 epochs of CIFAR-10, the sampler at stationarity.
STATIONARY_TRAIN_STEPS = 800          # 2.05 epochs of batch 128
STATIONARY_LANGEVIN_STEPS = 35        # the diagnostic: the uniform-start chain is at its endpoint by step 32
STATIONARY_EVAL_EXAMPLES = 1000
STATIONARY_T_SWEEP = (5, 10, 25, 100)  # plus STATIONARY_LANGEVIN_STEPS from the main group
# The cheaper sampler: a chain started at x is at its endpoint by step 19 (the diagnostic), so T = 20
# caps it; the tolerance alone saves no batched compute (one chain of a batch runs to T).
STATIONARY_CHEAP_SAMPLER = {"langevin.init": "clean", "langevin.tolerance": 3e-4, "langevin.steps": 20}


def stationary_cpu_suite(data_dir: Optional[str]) -> Suite:
    """Real CIFAR-10, small CNN, 2 epochs, PAT's sampler at stationarity (T = 35 and 100),
    PGD with the paper's 10 steps; a T-sweep and the opt-in cheaper sampler, one seed each."""
    cfg = _cpu_config(data_dir, batch_size=CPU_BATCH_SIZE, train_steps=STATIONARY_TRAIN_STEPS,
                      langevin_steps=STATIONARY_LANGEVIN_STEPS, eval_examples=STATIONARY_EVAL_EXAMPLES,
                      eval_batch_size=250)
    cfg.checkpoint_every_steps = 50
    cfg.log_every_steps = 200
    cfg.progress_bar = False
    groups = [Group("cifar10_small_cnn", cfg, methods=("clean", "pgd", "pgd_cor", "pat_wos", "pat"), seeds=(0, 1))]
    for steps in STATIONARY_T_SWEEP:
        swept = copy.deepcopy(cfg)
        swept.langevin.steps = steps
        groups.append(Group(f"pat_T{steps}", swept, methods=("pat",), seeds=(0,)))
    cheap = copy.deepcopy(cfg)
    for key, value in STATIONARY_CHEAP_SAMPLER.items():
        set_field(cheap, key, value)
    groups.append(Group("pat_clean_start_T20", cheap, methods=("pat",), seeds=(0,)))
    return Suite(
        name="stationary_cpu",
        description="CPU-scale test of the paper's claim with PAT's sampler at stationarity "
                    "(small CNN, 2 epochs of CIFAR-10)",
        groups=tuple(groups),
        num_eval_examples=STATIONARY_EVAL_EXAMPLES, eval_batch_size=250,
        evaluators=("clean", "pgd20", "cw20", "pr"),
        eval_overrides={"pr_distributions": (PR_DISTRIBUTION,), "seed": 0},
        scaled_down=(
            "model: small CNN (3 conv stages 32/64/128) instead of ResNet-18 / WRN-50-2",
            f"training: {STATIONARY_TRAIN_STEPS} steps of batch {CPU_BATCH_SIZE} "
            f"({STATIONARY_TRAIN_STEPS * CPU_BATCH_SIZE / 50000:.2f} epochs) instead of 100 epochs of batch 256; "
            "lr 0.05 (paper 0.01) with the paper's MultiStepLR shape",
            f"PAT / PAT(WOS): T = {STATIONARY_LANGEVIN_STEPS} (the chain is at its endpoint by then: "
            "docs/sampler_convergence.md); T = 5, 10, 25, 100 and the cheaper sampler (start at x, "
            "T = 20, tolerance 3e-4) in single-seed groups",
            "PGD / PGD-COR: the paper's 10 steps of alpha 2/255 in the 8/255 L-inf ball",
            f"evaluation: the first {STATIONARY_EVAL_EXAMPLES} CIFAR-10 test images; PGD-20, CW-20; "
            "PR with Gaussian noise, N = 100, eps 0.1/0.12/0.15/0.2",
            "seeds: 2 per method in the main group, 1 in the T-sweep groups",
        ))


PAPER_GROUPS = (("cifar10", "resnet18"), ("cifar10", "wrn50_2"), ("cifar100", "resnet18"),
                ("cifar100", "wrn50_2"))


def paper_full_suite(data_dir: Optional[str]) -> Suite:
    """Tables 1 and 2 at the paper's settings (Appendix E): every method, 4 dataset x model blocks."""
    groups = []
    for dataset, model in PAPER_GROUPS:
        cfg = config_lib.default_config()  # Appendix E: T = 100, 100 epochs, batch 256, ...
        cfg.dataset = dataset
        cfg.model = model
        cfg.data_dir = data_dir
        cfg.progress_bar = True
        groups.append(Group(f"{dataset}_{model}", cfg, methods=METHOD_ORDER, seeds=(0,)))
    return Suite(
        name="paper_full",
        description="Tables 1 and 2 of the paper at its settings (ResNet-18 / WRN-50-2, CIFAR-10/100, "
                    "T = 100, 100 epochs, every method)",
        groups=tuple(groups),
        num_eval_examples=-1, eval_batch_size=500,
        evaluators=("clean", "pgd20", "cw20", "pr"),
        eval_overrides={"pr_distributions": (PR_DISTRIBUTION,), "seed": 0},
        scaled_down=())


SUITES: dict[str, Callable[[Optional[str]], Suite]] = {
    "ablation_cpu": ablation_cpu_suite,
    "stationary_cpu": stationary_cpu_suite,
    "paper_full": paper_full_suite,
    "smoke_cpu": smoke_cpu_suite,
}


def get_suite(name: str, data_dir: Optional[str]) -> Suite:
    if name not in SUITES:
        raise UserError(f"unknown suite {name!r}; choose one of {sorted(SUITES)}")
    return SUITES[name](data_dir)


# ---------------------------------------------------------------------------------------
# Running.

def run_dir(workdir: str, run: Run) -> str:
    return os.path.join(workdir, "runs", run.group, f"{run.method}_s{run.seed}")


def _expected_steps(cfg) -> int:
    train_size = data.NUM_TRAIN[cfg.dataset]
    return state_lib.total_steps(cfg, train_size // int(cfg.batch_size))


def _read_json(path):
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        return json.load(f)


def _write_text(path, text):
    # Atomic: whoever reads the file (a person, another worker) sees the old or the new one whole.
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def _trained(run: Run, directory: str) -> Optional[dict]:
    """The run's suite_run.json if it finished training with this config, else None."""
    record = _read_json(os.path.join(directory, "suite_run.json"))
    if record is None or record.get("step") != _expected_steps(run.config):
        return None
    workdir_lib.check_resume_compatible(run.config, directory)  # a changed suite is refused
    return record


def _eval_matches(suite: Suite, results: Optional[dict], step: int, directory: str) -> bool:
    """Whether eval/results.json was written for this checkpoint with the suite's settings, and
    eval/per_image.npz by the same evaluation (a kill between the two writes leaves a pair that
    does not match: the run is then evaluated again)."""
    if results is None:
        return False
    npz = os.path.join(directory, "eval", "per_image.npz")
    if not os.path.isfile(npz):
        return False
    try:
        evaluate.check_per_image(results, dict(np.load(npz)), directory)
    except UserError:
        return False
    s = results.get("settings", {})
    wanted = {"evaluators": list(evaluate.parse_evaluators(list(suite.evaluators))), "step": step}
    if suite.num_eval_examples > 0:
        wanted["num_examples"] = suite.num_eval_examples
    for key, value in suite.eval_overrides.items():
        if key in s:
            wanted[key] = list(value) if isinstance(value, (tuple, list)) else value
    if s.get("pr_distribution") != PR_DISTRIBUTION:
        return False
    wanted.update(evaluate.PR_DISTRIBUTION_DEFINITIONS)  # results of an earlier definition are stale
    return all(s.get(k) == v for k, v in wanted.items())


class _Progress:
    def __init__(self, total: int, stream=None):
        self.start = time.perf_counter()
        self.total = total
        self.stream = stream or sys.stdout

    def __call__(self, index: int, run: Run, message: str):
        elapsed = time.perf_counter() - self.start
        stamp = time.strftime("%H:%M:%S")
        print(f"[{stamp} +{elapsed / 60:5.1f} min] run {index}/{self.total} {run.name}: {message}",
              file=self.stream, flush=True)


CLAIM_FILE = ".claim"   # in each run's directory; held (flock) by the worker on the run
REPORT_LOCK = ".report.lock"  # in the suite's directory; held while the report is rebuilt


def worker_slot(num_workers: Optional[int] = None, worker_index: Optional[int] = None,
                environ=None) -> tuple[int, int]:
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
                raise UserError(f"{name} must be an integer in a SLURM job array, got "
                                f"{environ.get(name)!r}; or give --num_workers and --worker_index") from None
        num_workers = values["SLURM_ARRAY_TASK_COUNT"]
        worker_index = values["SLURM_ARRAY_TASK_ID"] - values["SLURM_ARRAY_TASK_MIN"]
        source = (f"from SLURM_ARRAY_TASK_ID {values['SLURM_ARRAY_TASK_ID']} - SLURM_ARRAY_TASK_MIN "
                  f"{values['SLURM_ARRAY_TASK_MIN']} of SLURM_ARRAY_TASK_COUNT {num_workers}; an array with "
                  f"a step or gaps needs --num_workers and --worker_index")
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
        raise UserError(f"worker index {worker_index} is not in 0..{num_workers - 1} for {num_workers} "
                        f"worker(s) ({source})")
    return num_workers, worker_index


def partition(runs: Sequence[Run], num_workers: int, worker_index: int) -> list[tuple[int, Run]]:
    """(position, run) of this worker's share of the plan: positions p with p % K == i."""
    return [(p, r) for p, r in enumerate(runs) if p % num_workers == worker_index]


def _finished(suite: Suite, run: Run, directory: str) -> bool:
    """Whether the run was trained and evaluated with the suite's current settings."""
    record = _trained(run, directory)
    results = _read_json(os.path.join(directory, "eval", "results.json"))
    return record is not None and _eval_matches(suite, results, record["step"], directory)


def run_suite(suite: Suite, workdir: str, *, groups=None, methods=None, max_runs: Optional[int] = None,
              progress_bars: bool = False, stream=None, num_workers: int = 1, worker_index: int = 0) -> dict:
    """Trains and evaluates this worker's runs of the suite (reusing finished ones) and writes the report.

    Any number of workers may run at once on one workdir: a worker claims a run (an flock on
    the run's .claim file) for as long as it trains and evaluates it, and skips runs another
    worker holds. After a pass over its runs it looks again at the ones it skipped (their
    worker may have finished or died), until every one is finished or held by a live worker.
    num_workers, worker_index: the static partition (`partition`); the dynamic claims hold
      within and across shares.
    max_runs: leave after this many runs were trained or evaluated in this invocation (as an
      interrupted suite would); running again continues with the next run.
    Returns the suite's results (as written to DIR/results.json).
    """
    num_workers, worker_index = worker_slot(num_workers, worker_index, environ={})
    runs = plan(suite, groups, methods)
    os.makedirs(workdir, exist_ok=True)
    out = stream or sys.stdout
    progress = _Progress(len(runs), stream)
    invocation_start = time.perf_counter()
    provenance = _provenance()  # the code this process runs: taken now, before anything can change it
    role = f"suite worker {worker_index} of {num_workers}"
    todo = partition(runs, num_workers, worker_index)
    if num_workers > 1:
        print(f"{role} (pid {os.getpid()} on {socket.gethostname()}): {len(todo)} of the {len(runs)} runs "
              f"(positions p with p % {num_workers} == {worker_index})", file=out, flush=True)
    worked = 0
    leaving = False
    while todo:
        held_elsewhere = []
        for position, run in todo:
            index = position + 1
            directory = run_dir(workdir, run)
            if _finished(suite, run, directory):
                progress(index, run, "reused (trained and evaluated earlier)")
                continue
            if max_runs is not None and worked >= max_runs:
                progress(index, run, f"left for the next invocation (--max_runs={max_runs})")
                leaving = True
                break
            os.makedirs(directory, exist_ok=True)
            with workdir_lib.lock(os.path.join(directory, CLAIM_FILE), role) as claim:
                if not claim.held:
                    progress(index, run, f"skipped: claimed by {claim.holder}")
                    held_elsewhere.append((position, run))
                    continue
                if _finished(suite, run, directory):  # by the worker that held it a moment ago
                    progress(index, run, "reused (finished by another worker)")
                    continue
                worked += 1
                _train_and_evaluate(suite, run, directory, lambda message: progress(index, run, message),
                                    progress_bars)
            report = write_report(suite, workdir)
            progress(index, run, f"report updated ({report['num_done']}/{report['num_runs']} runs done)")
        if leaving or held_elsewhere == todo:  # nothing changed since the last look: others hold the rest
            break
        todo = held_elsewhere
        if todo:
            print(f"{role}: looking again at {len(todo)} run(s) other workers held", file=out, flush=True)
    wall = time.perf_counter() - invocation_start
    _record_invocation(workdir, {
        "finished_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "wall_s": round(wall, 1),
        "runs_worked_on": worked, **provenance, "groups": list(groups or []), "methods": list(methods or []),
        "num_workers": num_workers, "worker_index": worker_index, "host": socket.gethostname(),
        "pid": os.getpid()})
    report = write_report(suite, workdir)  # after the record: the report counts this invocation too
    print(f"suite {suite.name}: {report['num_done']}/{report['num_runs']} runs done; "
          f"{role if num_workers > 1 else 'this invocation'} worked on {worked} run(s) in {wall / 60:.1f} min; "
          f"wrote {os.path.join(workdir, 'results.md')}", file=out, flush=True)
    return report


def _train_and_evaluate(suite: Suite, run: Run, directory: str, say: Callable[[str], None],
                        progress_bars: bool) -> None:
    """Trains the run (resuming from its latest checkpoint) unless trained, then evaluates it."""
    cfg = copy.deepcopy(run.config)
    cfg.progress_bar = bool(progress_bars)
    record_path = os.path.join(directory, "suite_run.json")
    record = _trained(run, directory)
    if record is None:
        config_lib.validate(cfg)
        existing = _read_json(record_path) or {}
        say(f"training {_expected_steps(cfg)} steps"
            + (" (resuming from its latest checkpoint)" if os.path.isdir(os.path.join(directory, "checkpoints"))
               else ""))
        t0 = time.perf_counter()
        state = train.train_and_evaluate(cfg, directory)
        train_wall = time.perf_counter() - t0
        record = {"step": int(state.step),
                  "train_wall_s": round(existing.get("train_wall_s", 0.0) + train_wall, 1),
                  "train_segments_s": existing.get("train_segments_s", []) + [round(train_wall, 1)]}
        del state
        workdir_lib.write_json(record_path, record)
        say(f"trained in {train_wall / 60:.1f} min")
    elif "eval_wall_s" in record:
        # A stale evaluation is about to be replaced: until the new one is complete, the run is
        # not evaluated (a report built meanwhile, by another worker, leaves it out).
        del record["eval_wall_s"]
        workdir_lib.write_json(record_path, record)
    say(f"evaluating ({', '.join(suite.evaluators)})")
    t0 = time.perf_counter()
    evaluate.run(directory, num_examples=suite.num_eval_examples, batch_size=suite.eval_batch_size,
                 progress=progress_bars, evaluators=list(suite.evaluators), overrides=dict(suite.eval_overrides))
    record["eval_wall_s"] = round(time.perf_counter() - t0, 1)
    workdir_lib.write_json(record_path, record)
    say(f"evaluated in {record['eval_wall_s'] / 60:.1f} min")


def _record_invocation(workdir: str, entry: dict) -> None:
    """Appends the invocation to DIR/invocations.jsonl, one writer at a time (see write_report)."""
    with workdir_lib.lock(os.path.join(workdir, REPORT_LOCK), "invocation log writer", wait=True):
        with open(os.path.join(workdir, "invocations.jsonl"), "a") as f:
            f.write(json.dumps(entry) + "\n")


def _provenance() -> dict:
    """The code the invocation ran: git commit and files changed since it (if any)."""
    import subprocess

    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True,
                                timeout=10).stdout.strip()
        changed = subprocess.run(["git", "status", "--porcelain", "--", "patjax", "configs"], cwd=repo,
                                 capture_output=True, text=True, timeout=10).stdout.split("\n")
    except (OSError, subprocess.SubprocessError):
        return {}
    return {"git_commit": commit, "uncommitted_changes": [line[3:] for line in changed if line.strip()],
            "command": " ".join(sys.argv)}


# ---------------------------------------------------------------------------------------
# Loading per-image outcomes and computing figures.

@dataclasses.dataclass
class RunOutcome:
    """Per-image outcomes of one evaluated run (arrays over the same test images)."""

    run: Run
    correct: np.ndarray                 # (n,) bool, clean
    robust: dict                        # {'pgd20': (n,) bool, 'cw20': ...}
    pr_counts: np.ndarray               # (n, levels) non-adversarial samples
    pr_samples: int
    eps_keys: list
    settings: dict
    summary: dict                       # eval/results.json top-level figures
    record: dict                        # suite_run.json


def load_outcome(workdir: str, run: Run) -> Optional[RunOutcome]:
    directory = run_dir(workdir, run)
    record = _read_json(os.path.join(directory, "suite_run.json"))
    results = _read_json(os.path.join(directory, "eval", "results.json"))
    npz = os.path.join(directory, "eval", "per_image.npz")
    if record is None or results is None or "eval_wall_s" not in record or not os.path.isfile(npz):
        return None
    per_image = dict(np.load(npz))
    evaluate.check_per_image(results, per_image, directory)  # the two files of one evaluation
    settings = results["settings"]
    eps_keys = [repr(float(e)) for e in settings["pr_epsilons"]]
    robust = {a: per_image[f"{a}.robust"].astype(bool) for a in ("pgd20", "cw20") if f"{a}.robust" in per_image}
    return RunOutcome(run=run, correct=per_image["clean.correct"].astype(bool), robust=robust,
                      pr_counts=per_image[f"pr_{PR_DISTRIBUTION}.counts"].astype(np.int64),
                      pr_samples=int(settings["pr_samples"]), eps_keys=eps_keys, settings=settings,
                      summary={k: results.get(k) for k in ("clean_accuracy", "pr", "pr_clean_correct")},
                      record=record)


def _check_common_random_numbers(outcomes: Sequence[RunOutcome]) -> None:
    keys = ("num_examples", "pr_samples", "seed", "pr_epsilons", "dataset", "pr_distribution")
    first = outcomes[0]
    for o in outcomes[1:]:
        differing = [k for k in keys if o.settings.get(k) != first.settings.get(k)]
        if differing:
            raise UserError(f"{o.run.name} and {first.run.name} were evaluated with different settings "
                            f"({', '.join(differing)}): not on common random numbers")


def _figure(value, interval, method, n):
    return {"value": value, "interval": list(interval), "interval_method": method, "n": int(n)}


def run_figures(o: RunOutcome, indices, confidence) -> dict:
    """Acc, PGD-20, CW-20 (Clopper-Pearson) and PR per eps over all / clean-correct images (bootstrap)."""
    n = o.correct.size
    out = {}
    for name, hits in [("clean_accuracy", o.correct)] + [(a, o.robust[a]) for a in ("pgd20", "cw20") if a in o.robust]:
        lo, hi = stats.clopper_pearson(int(hits.sum()), n, confidence)
        out[name] = _figure(float(hits.mean()), (float(lo), float(hi)), "clopper-pearson", n)
    pr = o.pr_counts / o.pr_samples
    ones = np.ones((1, n))
    out["pr_all"], out["pr_clean_correct"] = {}, {}
    for j, eps in enumerate(o.eps_keys):
        v, ci = stats.ratio_interval(pr[None, :, j], ones, indices, confidence)
        out["pr_all"][eps] = _figure(v, ci, "bootstrap over images", n)
        v, ci = stats.ratio_interval((pr[:, j] * o.correct)[None], o.correct[None], indices, confidence)
        out["pr_clean_correct"][eps] = _figure(v, ci, "bootstrap over images", int(o.correct.sum()))
    return out


def mean_figures(outcomes: Sequence[RunOutcome], indices, confidence) -> dict:
    """Means over seeds of the same figures, with paired bootstrap intervals over images."""
    n = outcomes[0].correct.size
    ones = np.ones((len(outcomes), n))
    method = f"bootstrap over images, mean of {len(outcomes)} seeds"
    out = {}
    metrics = [("clean_accuracy", np.stack([o.correct for o in outcomes]))]
    for a in ("pgd20", "cw20"):
        if all(a in o.robust for o in outcomes):
            metrics.append((a, np.stack([o.robust[a] for o in outcomes])))
    for name, hits in metrics:
        v, ci = stats.ratio_interval(hits, ones, indices, confidence)
        out[name] = _figure(v, ci, method, n)
    correct = np.stack([o.correct for o in outcomes]).astype(np.float64)
    out["pr_all"], out["pr_clean_correct"] = {}, {}
    for j, eps in enumerate(outcomes[0].eps_keys):
        pr = np.stack([o.pr_counts[:, j] / o.pr_samples for o in outcomes])
        v, ci = stats.ratio_interval(pr, ones, indices, confidence)
        out["pr_all"][eps] = _figure(v, ci, method, n)
        v, ci = stats.ratio_interval(pr * correct, correct, indices, confidence)
        out["pr_clean_correct"][eps] = _figure(v, ci, method, n)
    return out


def paired_difference(a: Sequence[RunOutcome], b: Sequence[RunOutcome], indices, confidence) -> dict:
    """A - B per metric, on the same images and noise; a[k] and b[k] share the seed.

    pr_all: mean over all images of PR_A,i - PR_B,i; pr_common_correct: the same over the
    images both models classify correctly (the paper's clean-correct convention, on one
    common set so the difference stays paired). With several seeds: the mean over seeds of
    the per-seed differences, bootstrapped with the same image resamples for every seed.
    """
    n = a[0].correct.size
    ones = np.ones((len(a), n))
    method = f"paired bootstrap over images, mean of {len(a)} seed(s)"
    out = {"seeds": [o.run.seed for o in a]}
    metrics = [("clean_accuracy", [o.correct for o in a], [o.correct for o in b])]
    for attack in ("pgd20", "cw20"):
        if all(attack in o.robust for o in list(a) + list(b)):
            metrics.append((attack, [o.robust[attack] for o in a], [o.robust[attack] for o in b]))
    for name, ha, hb in metrics:
        diff = np.stack(ha).astype(np.float64) - np.stack(hb).astype(np.float64)
        v, ci = stats.ratio_interval(diff, ones, indices, confidence)
        out[name] = _figure(v, ci, method, n)
    both = np.stack([oa.correct & ob.correct for oa, ob in zip(a, b)]).astype(np.float64)
    out["pr_all"], out["pr_common_correct"] = {}, {}
    for j, eps in enumerate(a[0].eps_keys):
        diff = np.stack([oa.pr_counts[:, j] - ob.pr_counts[:, j] for oa, ob in zip(a, b)]) / a[0].pr_samples
        v, ci = stats.ratio_interval(diff, ones, indices, confidence)
        out["pr_all"][eps] = _figure(v, ci, method, n)
        v, ci = stats.ratio_interval(diff * both, both, indices, confidence)
        out["pr_common_correct"][eps] = _figure(v, ci, method + ", images both classify correctly",
                                                int(both.sum(axis=1).min()))
    return out


# ---------------------------------------------------------------------------------------
# Report: results.json, results.md, pr_vs_eps.png.

def write_report(suite: Suite, workdir: str) -> dict:
    """Rebuilds DIR/results.json, results.md and pr_vs_eps.png from the runs finished so far.

    One writer at a time (an flock on DIR/.report.lock, waited for): workers that finish runs
    at once take turns, and each reads the runs' files only once it holds the lock, so the
    last report written has seen every run finished before it.
    """
    with workdir_lib.lock(os.path.join(workdir, REPORT_LOCK), "report writer", wait=True):
        return _write_report(suite, workdir)


def _write_report(suite: Suite, workdir: str) -> dict:
    runs = plan(suite)
    outcomes = {r.name: load_outcome(workdir, r) for r in runs}
    done = [o for o in outcomes.values() if o is not None]
    report = {"suite": suite.name, "description": suite.description, "scaled_down": list(suite.scaled_down),
              "num_runs": len(runs), "num_done": len(done), "groups": {}}
    invocations = []
    inv_path = os.path.join(workdir, "invocations.jsonl")
    if os.path.isfile(inv_path):
        invocations = [json.loads(line) for line in open(inv_path) if line.strip()]
    report["invocations"] = invocations
    for group in suite.groups:
        group_runs = [r for r in runs if r.group == group.name]
        group_done = [outcomes[r.name] for r in group_runs if outcomes[r.name] is not None]
        g = {"runs": [], "methods": {}, "differences": []}
        report["groups"][group.name] = g
        for r in group_runs:
            o = outcomes[r.name]
            g["runs"].append({"name": r.name, "method": r.method, "seed": r.seed, "status": "done" if o else "pending",
                              "workdir": os.path.relpath(run_dir(workdir, r), workdir),
                              **({"train_wall_s": o.record.get("train_wall_s"),
                                  "eval_wall_s": o.record.get("eval_wall_s"),
                                  "step": o.record.get("step")} if o else {})})
        if not group_done:
            continue
        _check_common_random_numbers(group_done)
        s = group_done[0].settings
        n = group_done[0].correct.size
        confidence = float(s["confidence"])
        indices = stats.bootstrap_indices(n, int(s["bootstrap_resamples"]), int(s["seed"]))
        g["evaluation"] = {k: s.get(k) for k in ("num_examples", "pr_samples", "pr_epsilons", "pr_distribution",
                                                 "seed", "confidence", "bootstrap_resamples", "attack_eps",
                                                 "attack_step_size", "attack_steps", "cw_kappa", "dataset")}
        by_method = {}
        for o in group_done:
            by_method.setdefault(o.run.method, {})[o.run.seed] = o
        for entry in g["runs"]:
            o = outcomes[entry["name"]]
            if o is not None:
                entry["figures"] = run_figures(o, indices, confidence)
        for method in _ordered(by_method):
            seeds = sorted(by_method[method])
            g["methods"][method] = {"seeds": seeds,
                                    "mean": mean_figures([by_method[method][k] for k in seeds], indices, confidence)}
        for ma, mb in COMPARISONS:
            if ma not in by_method or mb not in by_method:
                continue
            common = sorted(set(by_method[ma]) & set(by_method[mb]))
            if not common:
                continue
            entry = {"a": ma, "b": mb, "seeds": common,
                     "mean": paired_difference([by_method[ma][k] for k in common],
                                               [by_method[mb][k] for k in common], indices, confidence),
                     "per_seed": {str(k): paired_difference([by_method[ma][k]], [by_method[mb][k]], indices,
                                                            confidence) for k in common}}
            g["differences"].append(entry)
    workdir_lib.write_json(os.path.join(workdir, "results.json"), report)
    _write_text(os.path.join(workdir, "results.md"), format_markdown(report))
    if done:
        plot_report(report, os.path.join(workdir, "pr_vs_eps.png"))
    return report


def _pct(fig, digits=1) -> str:
    if not fig or fig.get("value") is None:
        return "-"
    lo, hi = fig["interval"]
    return f"{100 * fig['value']:.{digits}f} [{100 * lo:.{digits}f}, {100 * hi:.{digits}f}]"


def _signed(fig, digits=2) -> str:
    if not fig or fig.get("value") is None:
        return "-"
    lo, hi = fig["interval"]
    return f"{100 * fig['value']:+.{digits}f} [{100 * lo:+.{digits}f}, {100 * hi:+.{digits}f}]"


def _md_table(header, rows) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _figure_row(label, figs, eps_keys, pr_key):
    return [label, _pct(figs.get("clean_accuracy")), _pct(figs.get("pgd20")), _pct(figs.get("cw20"))] + \
           [_pct(figs[pr_key].get(e)) for e in eps_keys]


def format_markdown(report: dict) -> str:
    out = [f"# Suite `{report['suite']}`: {report['description']}", "",
           f"{report['num_done']} of {report['num_runs']} runs trained and evaluated."]
    if report["scaled_down"]:
        out += ["", "Scaled down from the paper (Appendix E):", ""] + [f"- {line}" for line in report["scaled_down"]]
    for gname, g in report["groups"].items():
        out += ["", f"## {gname}", ""]
        if "evaluation" not in g:
            out += ["No run evaluated yet.", ""]
        else:
            ev = g["evaluation"]
            eps_keys = [repr(float(e)) for e in ev["pr_epsilons"]]
            conf = int(round(100 * ev["confidence"]))
            pr_cols = [f"PR(·, {e}) %" for e in eps_keys]
            head = ["Method", "Acc. %", "PGD %", "CW %"] + pr_cols
            out += [f"{ev['num_examples']} test images of {ev['dataset']}; PGD-20 / CW-20 at eps "
                    f"{ev['attack_eps']:.4f} (8/255), alpha {ev['attack_step_size']:.4f}; PR: {ev['pr_distribution']} "
                    f"noise, N = {ev['pr_samples']} per image, evaluation seed {ev['seed']} for every run (common "
                    f"random numbers). Cells: value [{conf} % interval].", ""]
            t1 = [m for m in g["methods"] if m in TABLE1_METHODS or m not in sum(TABLE2_PAIRS, ())]
            if t1:
                out += ["### Table 1 layout (mean over seeds; PR over clean-correct images, the paper's convention)", "",
                        _md_table(head, [_figure_row(_label(m, g), g["methods"][m]["mean"], eps_keys, "pr_clean_correct")
                                         for m in _ordered(t1)]), ""]
            pairs = [p for p in TABLE2_PAIRS if p[0] in g["methods"] or p[1] in g["methods"]]
            if pairs:
                rows = []
                for base, variant in pairs:
                    for m in (base, variant):
                        if m in g["methods"]:
                            rows.append(_figure_row(_label(m, g), g["methods"][m]["mean"], eps_keys, "pr_clean_correct"))
                out += ["### Table 2 layout (ablation; mean over seeds; PR over clean-correct images)", "",
                        _md_table(head, rows), ""]
            out += ["### PR over all test images (misclassified images count with their PR, mostly ~0)", "",
                    _md_table(["Method"] + pr_cols,
                              [[_label(m, g)] + [_pct(g["methods"][m]["mean"]["pr_all"].get(e)) for e in eps_keys]
                               for m in g["methods"]]), ""]
            if g["differences"]:
                dhead = ["A − B", "seeds", "ΔAcc pp", "ΔPGD pp", "ΔCW pp"] + [f"ΔPR({e}) pp" for e in eps_keys]
                for key, title in (("pr_all", "all test images"),
                                   ("pr_common_correct", "images both runs classify correctly")):
                    rows = []
                    for d in g["differences"]:
                        name = f"{DISPLAY_NAMES.get(d['a'], d['a'])} − {DISPLAY_NAMES.get(d['b'], d['b'])}"
                        for label, fig in [("mean", d["mean"])] + [(f"seed {k}", v) for k, v in d["per_seed"].items()]:
                            rows.append([name if label == "mean" else "", label, _signed(fig.get("clean_accuracy")),
                                         _signed(fig.get("pgd20")), _signed(fig.get("cw20"))]
                                        + [_signed(fig[key].get(e)) for e in eps_keys])
                    out += [f"### Paired differences A − B (percentage points; PR over {title})", "", _md_table(dhead, rows), ""]
                out += [f"Paired: run A and run B of a seed are evaluated on the same images with the same noise "
                        f"draws; the interval is a percentile bootstrap over images ({ev['bootstrap_resamples']} "
                        f"resamples, the same resamples for every seed). It covers evaluation sampling only, not "
                        f"training-seed variance: compare the seed rows for that.", ""]
            out += ["### Every run (PR over clean-correct images)", "",
                    _md_table(["Run"] + head[1:],
                              [_figure_row(e["name"], e["figures"], eps_keys, "pr_clean_correct")
                               for e in g["runs"] if e["status"] == "done"]), "",
                    "Per-run intervals: Clopper-Pearson for accuracies, bootstrap over images for PR.", ""]
        out += ["### Runs", "", _md_table(
            ["Run", "status", "steps", "train min", "eval min"],
            [[e["name"], e["status"], e.get("step", ""),
              f"{e['train_wall_s'] / 60:.1f}" if e.get("train_wall_s") is not None else "",
              f"{e['eval_wall_s'] / 60:.1f}" if e.get("eval_wall_s") is not None else ""] for e in g["runs"]]), ""]
    if report.get("invocations"):
        total = sum(i["wall_s"] for i in report["invocations"])
        out += [f"Time of the suite's invocations so far: {total / 60:.1f} min summed over "
                f"{len(report['invocations'])} invocation(s) (workers that ran at once each count).", ""]
    return "\n".join(out)


def _label(method, g):
    seeds = g["methods"][method]["seeds"]
    return f"{DISPLAY_NAMES.get(method, method)} ({len(seeds)} seed{'s' if len(seeds) > 1 else ''})"


def _percent(value) -> float:
    return float("nan") if value is None else 100.0 * value


def plot_report(report: dict, path: str) -> None:
    """PR vs eps: one panel per group and PR convention; seed means with bands, seeds as thin lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = [(n, g) for n, g in report["groups"].items() if g.get("methods")]
    if not groups:
        return
    fig, axes = plt.subplots(len(groups), 2, figsize=(11, 4.2 * len(groups)), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for row, (gname, g) in zip(axes, groups):
        eps_keys = [repr(float(e)) for e in g["evaluation"]["pr_epsilons"]]
        eps = [float(e) for e in eps_keys]
        for ax, key, title in ((row[0], "pr_clean_correct", "clean-correct images"), (row[1], "pr_all", "all images")):
            for i, method in enumerate(g["methods"]):
                color = colors[i % len(colors)]
                mean = g["methods"][method]["mean"][key]
                ax.plot(eps, [_percent(mean[e]["value"]) for e in eps_keys], marker="o", color=color,
                        label=_label(method, g))
                ax.fill_between(eps, [_percent(mean[e]["interval"][0]) for e in eps_keys],
                                [_percent(mean[e]["interval"][1]) for e in eps_keys], color=color, alpha=0.2)
                for entry in g["runs"]:
                    if entry["method"] == method and entry["status"] == "done":
                        ax.plot(eps, [_percent(entry["figures"][key][e]["value"]) for e in eps_keys],
                                color=color, lw=0.8, ls=":", alpha=0.8)
            ev = g["evaluation"]
            ax.set_title(f"{gname}: PR over {title}\n({ev['pr_distribution']}, N={ev['pr_samples']}, "
                         f"{ev['num_examples']} images; dotted: single seeds)", fontsize=9)
            ax.set_xlabel("eps")
            ax.set_ylabel(f"PR % ({int(round(100 * ev['confidence']))} % bootstrap band)")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
    fig.tight_layout()
    tmp = path + ".tmp.png"
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    os.replace(tmp, path)


# ---------------------------------------------------------------------------------------
# Command line.

def main(argv):
    from absl import flags, logging

    FLAGS = flags.FLAGS
    if len(argv) > 1:
        raise UserError(f"unexpected arguments: {' '.join(argv[1:])}")
    if not FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)
    if not FLAGS.workdir:
        raise UserError("--workdir is required")
    data_dir = FLAGS.data_dir if FLAGS.data_dir is not None else default_data_dir()
    suite = get_suite(FLAGS.suite, data_dir or None)
    groups = [g for g in (FLAGS.groups or "").split(",") if g] or None
    methods = [m for m in (FLAGS.methods or "").split(",") if m] or None
    runs = plan(suite, groups, methods)
    num_workers, worker_index = worker_slot(FLAGS.num_workers, FLAGS.worker_index)
    if FLAGS.dry_run:
        mine = partition(runs, num_workers, worker_index)
        print(f"suite {suite.name}: {len(runs)} runs; data: {data_dir or 'tensorflow-datasets'}"
              + (f"; worker {worker_index} of {num_workers} takes {len(mine)}" if num_workers > 1 else ""))
        for position, r in mine:
            c = r.config
            print(f"  run {position + 1}/{len(runs)} {r.name}: {c.dataset} {c.model} batch {c.batch_size} "
                  f"{'steps ' + str(c.num_train_steps) if c.num_train_steps > 0 else str(c.num_epochs) + ' epochs'} "
                  f"T={c.langevin.steps} -> {run_dir(FLAGS.workdir, r)}")
        return
    if FLAGS.report_only:
        if not os.path.isdir(FLAGS.workdir):
            raise UserError(f"no suite directory {FLAGS.workdir!r} to report on")
        report = write_report(suite, FLAGS.workdir)
        print(f"wrote {os.path.join(FLAGS.workdir, 'results.md')} ({report['num_done']}/{report['num_runs']} runs done)")
        return
    if FLAGS.compilation_cache:
        import jax

        # Runs of one method differ only in the seed, and every run of a group is evaluated by the
        # same functions: XLA's persistent cache compiles each once per suite.
        jax.config.update("jax_compilation_cache_dir", os.path.join(os.path.abspath(FLAGS.workdir), "jax_cache"))
    run_suite(suite, FLAGS.workdir, groups=groups, methods=methods, max_runs=FLAGS.max_runs,
              progress_bars=FLAGS.progress_bars, num_workers=num_workers, worker_index=worker_index)


def _define_flags():
    from absl import flags

    flags.DEFINE_string("suite", "ablation_cpu", f"One of {sorted(SUITES)}.")
    flags.DEFINE_string("workdir", None, "Suite directory (runs/, results.md, results.json, pr_vs_eps.png).")
    flags.DEFINE_string("data_dir", None, "CIFAR binary archives directory (default: ../shared/data when it "
                        "exists, else tensorflow-datasets); '' forces tensorflow-datasets.")
    flags.DEFINE_string("groups", None, "Comma-separated groups of the suite to run (default: all).")
    flags.DEFINE_string("methods", None, "Comma-separated methods of the suite to run (default: all).")
    flags.DEFINE_integer("max_runs", None, "Leave after working on this many runs; rerun to continue.")
    flags.DEFINE_bool("dry_run", False, "Print the runs and leave.")
    flags.DEFINE_bool("report_only", False, "Rewrite results.md/json/png from finished runs only.")
    flags.DEFINE_bool("progress_bars", True, "tqdm bars for training and evaluation (stderr).")
    flags.DEFINE_bool("compilation_cache", True, "Persistent XLA compilation cache in DIR/jax_cache.")
    flags.DEFINE_integer("num_workers", None, "Static partition: K workers share the suite; this one takes "
                         "the runs at positions p with p % K == --worker_index (default: SLURM_ARRAY_TASK_COUNT "
                         "in a SLURM job array, else 1).")
    flags.DEFINE_integer("worker_index", None, "This worker's index i, 0 to K-1 (default: SLURM_ARRAY_TASK_ID - "
                         "SLURM_ARRAY_TASK_MIN in a SLURM job array, else 0).")


def cli():
    from absl import app

    _define_flags()
    app.run(cli_lib.guarded(main), flags_parser=cli_lib.parse_flags)


if __name__ == "__main__":
    cli()
