"""Every command of the README's command table and of benchmarks/README.md's main commands runs
in a test with its documented flags, at tiny size: here (tiny flags appended, which win), or in the
test named for it. The commands are read out of the docs, so a command added or changed there
without a test fails here (the fast check); running them is slow (the README's, about 4.5 minutes
at load average 9, 3 at a time) or, for benchmarks/README.md's, a `reference` test."""

import json
import os
import re
import shlex
import shutil
import subprocess
import sys

import pytest
from conftest import REPO, train_run
from helpers import tiny_config

# What each command needs to run at tiny size, appended to its documented flags.
TRAIN = [
    "--config.model=small_cnn",
    "--config.batch_size=8",
    "--config.langevin.steps=1",
    "--config.num_train_steps=2",
    "--config.checkpoint_every_steps=2",
    "--config.progress_bar=False",
    "--config.eval.num_examples=8",
    "--config.eval.batch_size=8",
]
EVALUATE = ["--num_examples=4", "--batch_size=4", "--eval.pr.samples=2", "--eval.pr.chunk_size=2"]
AA = ["--eval.apgd.steps=2", "--eval.aa.target_classes=1", "--eval.aa.fab_steps=2", "--eval.aa.square_queries=8"]
RESNET = ["--width", "4"]

README_HERE = {
    "python main.py --config=configs/pat_cifar10.py --workdir=runs/pat_c10": TRAIN,
    "python -m patjax.evaluate --workdir=runs/pat_c10 [--full] [--num_examples=1000] [--evaluators=clean,pgd20,pr] "
    "[--step=N]": EVALUATE,
    "python -m patjax.evaluate --workdir=runs/pat_c10 --evaluators=clean,pgd20,pr,aa": [*EVALUATE, *AA],
    "python main.py --config=configs/pat_cifar10.py --config.method=pgd --config.attack.norm=l2 "
    "--workdir=runs/pgd_l2": [*TRAIN, "--config.attack.steps=1"],
    "python -m patjax.evaluate --workdir=runs/pgd_l2 --evaluators=clean,pgd20,cw20,aa,pr --attack_norm=l2": [
        *EVALUATE,
        *AA,
    ],
    "python -m patjax.evaluate --workdir=runs/pat_c10 --evaluators=clean,pr,rare_pr [--num_examples=100]": [
        *EVALUATE,
        "--eval.rare_pr.epsilons=0.1",
        "--eval.rare_pr.particles=8",
        "--eval.rare_pr.mh_steps=1",
        "--eval.rare_pr.depth=3",
        "--eval.rare_pr.decades=2",
        "--eval.rare_pr.max_levels=30",
    ],
    "python -m patjax.experiments --suite=table1_cpu --workdir=suites/table1": ["--dry_run"],
    "python benchmarks/speed/epoch_throughput.py --model resnet18 --batch 32 --langevin-steps 10": [
        *RESNET,
        "--iters",
        "1",
    ],
}
ONE_WORKDIR = (
    "tests/test_commands.py::"
    "test_one_workdir_keeps_linf_l2_and_prbench_evaluations_and_a_comparison_with_its_export_reuses_them"
)
GAUSS = (
    "tests/evaluators/test_certify.py::"
    "test_a_gaussian_augmentation_run_trains_and_is_certified_beside_pr_from_the_command_line"
)
README_ELSEWHERE = {
    "python -m patjax.evaluate --torch_checkpoint=model.safetensors --model=wrn28_10 --normalize=none": (
        "tests/interop/test_torch_weights.py"
    ),
    "python -m patjax.export --workdir=runs/pat_c10 --out=pat_c10.safetensors": (
        "tests/test_commands.py::test_evaluate_export_diagnose_and_experiments_each_do_their_job_on_a_tiny_run"
    ),
    "python -m patjax.evaluate --robustbench=Carmon2019Unlabeled [--robustbench_dir=models]": (
        "tests/interop/test_zoo.py::test_the_command_line_evaluates_an_entry"
    ),
    "python -m patjax.evaluate --workdir=runs/A --workdir=runs/B [--compare_only]": "tests/test_commands.py",
    "python -m patjax.evaluate --workdir=runs/quickstart": ONE_WORKDIR,
    "python main.py --config=configs/pat_cifar10.py --config.method=gaussian --config.gaussian.sigma=0.25 "
    "--workdir=runs/gauss": GAUSS,
    "python -m patjax.evaluate --workdir=runs/gauss --evaluators=clean,certify --certify_sigma=0.25 "
    "[--certify_samples=100000]": GAUSS,
    "python -m patjax.evaluate --workdir=runs/A --torch_checkpoint=theirs.safetensors "
    "--robustbench=Carmon2019Unlabeled": "tests/interop/test_zoo.py",
    "python -m patjax.diagnose --workdir=runs/A [--init=clean]": (
        "tests/pat/test_diagnose.py::test_command_line_writes_json_and_plot_from_a_checkpoint"
    ),
    "PATJAX_COORDINATOR=host:port PATJAX_NUM_PROCESSES=N PATJAX_PROCESS_ID=i python main.py ...": (
        "tests/run/test_multiprocess.py::test_two_processes_train_as_one_and_checkpoints_move_between_process_counts"
    ),
}
BENCHMARKS_HERE = {
    "python benchmarks/speed/epoch_throughput.py --model resnet18 --batch 32 --langevin-steps 10 --iters 3 "
    "--peak-gflops 310 --json": [*RESNET, "--iters", "1"],
    "python benchmarks/speed/epoch_throughput.py --model resnet18 --batch 32 --langevin-steps $T --iters 0 "
    "--json": RESNET,
    "python benchmarks/speed/compare_torch.py --model resnet18 --batch 32 --langevin-steps 10 --iters 2 --rounds 3 "
    "--peak-gflops 310": [*RESNET, "--iters", "1", "--rounds", "1", "--force"],
    "python benchmarks/speed/compare_torch.py --model small_cnn --batch 128 --langevin-steps 20 --iters 3 --rounds 3": [
        "--batch",
        "8",
        "--langevin-steps",
        "1",
        "--iters",
        "1",
        "--rounds",
        "1",
        "--force",
    ],
    "python benchmarks/speed/compare_torch.py --model resnet18 --batch 32 --langevin-steps 10 --iters 2 --rounds 3 "
    "--cpus 0": [*RESNET, "--iters", "1", "--rounds", "1", "--force"],
    "python benchmarks/speed/eval_throughput.py --model resnet18 --batch 500 --batches 1 5 --json": [
        *RESNET,
        "--batch",
        "4",
        "--batches",
        "1",
        "2",
    ],
    "python benchmarks/speed/pr_speed.py --images 100 --rounds 3 --json": [
        "--images",
        "4",
        "--batch",
        "4",
        "--rounds",
        "1",
        "--force",
    ],
    "python -m patjax.export --workdir=$RUN --out=/tmp/pat_s0.safetensors": [],
    "python benchmarks/crosscheck/autoattack_reference.py --workdir=$RUN --num_examples=100 --norm=Linf --individual "
    "--only=patjax": ["--num_examples=2", "--attacks=apgd_ce"],
    "python benchmarks/crosscheck/autoattack_reference.py --workdir=$RUN --num_examples=100 --norm=Linf --individual "
    "--only=reference --torch_weights=/tmp/pat_s0.safetensors": ["--num_examples=2", "--attacks=apgd_ce"],
}
BENCHMARKS_ELSEWHERE = {
    "python benchmarks/speed/ratios.py --out docs/results/speed_quiet/": (
        "tests/test_timing.py::test_the_ratios_command_measures_and_writes_its_table_at_tiny_size"
    ),
}
GPU_ONLY = {  # a GPU window's commands: their CPU dry runs are tests/test_gpu_*.py
    "python benchmarks/speed/epoch_throughput.py --model resnet18 --batch 256 --langevin-steps 100 --iters 5 --json",
    "OUT=gpu_out bash benchmarks/gpu/gpu_measurements.sh",
}


def readme_commands():
    """The commands (backquoted, starting with python) of the README's command table."""
    text = (REPO / "README.md").read_text()
    table = text.split("\n## Commands\n", 1)[1].split("\n## ", 1)[0]
    out = []
    for line in table.splitlines():
        if line.startswith("| ") and not line.startswith("| what"):
            cell = line.split(" | ", 1)[1]
            out += [s for s in re.findall(r"`([^`]+)`", cell) if re.match(r"([A-Z_]+=\S+ )*python ", s)]
    return out


def benchmark_commands():
    """The command lines of benchmarks/README.md's code blocks before its first section: loops
    unrolled to their one command, comments and `cmd && cmd` split off."""
    text = (REPO / "benchmarks" / "README.md").read_text().split("\n## ", 1)[0]
    out = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()
            line = re.sub(r";? *done$", "", re.sub(r"^for .*?; do ", "", line)).strip()
            out += [" ".join(p.split()) for p in line.split(" && ") if re.match(r"([A-Z_]+=\S+ )*(python|bash) ", p)]
    return out


def normalized(command):
    return " ".join(command.split())


def test_every_documented_command_is_run_by_a_test():
    mapped = {normalized(c) for c in [*README_HERE, *README_ELSEWHERE, *BENCHMARKS_HERE, *BENCHMARKS_ELSEWHERE]}
    documented = [normalized(c) for c in readme_commands() + benchmark_commands()]
    assert len(readme_commands()) >= 15 and len(benchmark_commands()) >= 10
    missing = [c for c in documented if c not in mapped and c not in GPU_ONLY]
    assert not missing, f"documented commands no test runs (add them to a table here): {missing}"
    stale = mapped - set(documented)
    assert not stale, f"commands here that the docs no longer give: {stale}"
    for where in {**README_ELSEWHERE, **BENCHMARKS_ELSEWHERE}.values():
        path, _, name = where.partition("::")
        source = (REPO / path).read_text()
        assert not name or re.search(rf"^def {name}\(", source, re.M), where


@pytest.fixture(scope="module")
def tiny_workdir(tmp_path_factory, data_dir):
    cfg = tiny_config(data_dir=data_dir, method="clean", num_train_steps=2)
    workdir = str(tmp_path_factory.mktemp("documented") / "run")
    train_run(cfg, workdir)
    return workdir


def tiny(command, extra, tmp_path, workdir, data_dir):
    """The documented command with its placeholders filled and the tiny flags appended."""
    run_value = re.search(r"^RUN=(\S+)", (REPO / "benchmarks" / "README.md").read_text(), re.M).group(1)
    text = command.replace("[", "").replace("]", "").replace("\\|pt", "")
    text = text.replace("$RUN", run_value).replace("$T", "1").replace("/tmp/pat_s0", str(tmp_path / "pat_s0"))
    text = text.replace("=DIR", f"={data_dir}").replace("--step=N", "--step=2")
    fresh = " main.py " in f" {text} " or "patjax.experiments" in text  # writes a new workdir
    text = re.sub(r"(?<==)(?:runs|suites)/(\w+)", lambda m: str(tmp_path / m.group(1)) if fresh else workdir, text)
    text = re.sub(r"--out=(\w+\.safetensors)", lambda m: f"--out={tmp_path / m.group(1)}", text)
    argv = shlex.split(text)
    argv[0] = sys.executable
    return argv + list(extra)


def run_all(commands, at_once=3):
    """Runs the command lines, `at_once` at a time (each is mostly one thread compiling), and
    fails naming every one that failed; returns their outputs."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    waiting, running, outputs, failed = list(commands), [], {}, []
    while waiting or running:
        while waiting and len(running) < at_once:
            argv = waiting.pop(0)
            proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            running.append((argv, proc))
        argv, proc = running.pop(0)
        out, err = proc.communicate(timeout=900)
        outputs[shlex.join(argv)] = out
        if proc.returncode:
            failed.append(f"{shlex.join(argv)}\n{err[-2000:]}")
    assert not failed, "\n\n".join(failed)
    return outputs


@pytest.mark.slow
def test_the_readme_commands_run_at_tiny_size(tiny_workdir, tmp_path, data_dir):
    commands = []
    for i, (command, extra) in enumerate(README_HERE.items()):
        workdir = str(tmp_path / f"workdir{i}")
        shutil.copytree(tiny_workdir, workdir)
        commands.append(tiny(command, extra, tmp_path / str(i), workdir, data_dir))
    outputs = run_all(commands)
    # The README's benchmark command counts the FLOPs of its 10 sampler steps (PAT from the
    # uniform start, which refuses 0 steps: tests/test_benchmarks.py).
    throughput = next(out for argv, out in outputs.items() if "epoch_throughput" in argv)
    assert float(re.search(r"flops_per_image: (\S+)", throughput).group(1)) > 0


# 12 minutes at load average 9-12 (its own ResNet-18 compilations, PyTorch peers and reference
# AutoAttack arms): with the reference cross-checks, outside the default run.
@pytest.mark.reference
@pytest.mark.slow
def test_the_benchmarks_readme_commands_run_at_tiny_size(tmp_path, data_dir):
    pytest.importorskip("torch")
    pytest.importorskip("pyautoattack")
    export, *rest = sorted(BENCHMARKS_HERE, key=lambda c: "patjax.export" not in c)
    run_all([tiny(export, [], tmp_path, "", data_dir)])  # the file the reference's arm reads
    outputs = run_all([tiny(c, BENCHMARKS_HERE[c], tmp_path, "", data_dir) for c in rest])
    for argv, out in outputs.items():
        if "epoch_throughput" in argv:
            assert json.loads(out.strip().splitlines()[-1])["flops_per_image"] > 0
