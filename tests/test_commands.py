"""Every command line runs its main path once on a tiny run, the four at once in their own
processes: the fast tier's touch of each door. Each command's own test file runs it at length."""

import dataclasses
import json
import os
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest
from conftest import REPO, train_run
from helpers import tiny_config
from safetensors.numpy import load_file

from patjax import evaluators
from patjax.data import cifar
from patjax.run import config as config_lib
from patjax.run import evaluation
from patjax.run import workdir as workdir_lib

NUM_EXAMPLES = 16  # tiny_config's eval.num_examples
# Settings of a run's eval block other than the defaults, one block (None: the shared fields) at a time.
NON_DEFAULT_EVAL = {
    None: {"seed": 3, "confidence": 0.9, "bootstrap_resamples": 300},
    "attack": {"eps": 0.02},
    "cw": {"kappa": 1.0},
    "apgd": {"steps": 7},
    "aa": {"fab_steps": 9},
    "pr": {"epsilons": [0.05, 0.1], "prob_acc_q": [0.3]},
    "certify": {"sigma": 0.5},
    "rare_pr": {"rho": 0.2},
}


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory, data_dir):
    # clean: the cheapest step to compile; the run is only a model for the commands to act on.
    cfg = tiny_config(data_dir=data_dir, method="clean", num_train_steps=2)
    workdir = str(tmp_path_factory.mktemp("tiny") / "run")
    train_run(cfg, workdir)
    return workdir


def start(module, *flags):
    return subprocess.Popen(
        [sys.executable, "-m", module, *flags], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def finish(proc):
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-2000:]
    return out


def test_evaluate_export_diagnose_and_experiments_each_do_their_job_on_a_tiny_run(tiny_run, tmp_path, data_dir):
    exported, diagnosed, suite = tmp_path / "new" / "model.safetensors", tmp_path / "diagnose", tmp_path / "suite"
    suite.mkdir()
    procs = {
        "evaluate": start(
            "patjax.evaluate", f"--workdir={tiny_run}", f"--num_examples={NUM_EXAMPLES}", "--evaluators=clean"
        ),
        "export": start("patjax.export", f"--workdir={tiny_run}", f"--out={exported}"),
        "diagnose": start(
            "patjax.diagnose",
            f"--workdir={tiny_run}",
            "--num_examples=2",
            "--steps=3",
            "--chains=2",
            f"--out={diagnosed}",
            "--progress_bars=false",
        ),
        "experiments": start("patjax.experiments", "--suite=smoke_cpu", f"--workdir={suite}", "--report_only"),
    }
    out = {name: finish(proc) for name, proc in procs.items()}

    # evaluate: the clean accuracy is numpy's argmax of the restored model's logits on the same images.
    _, model_fns, state = workdir_lib.restore(tiny_run)
    split = cifar.load_split("cifar10", "test", data_dir)
    logits = np.asarray(model_fns.infer(state.params, state.batch_stats, cifar.to_float(split.images[:NUM_EXAMPLES])))
    results = json.load(open(os.path.join(tiny_run, "eval", "results.json")))
    assert results["clean_accuracy"] == np.mean(logits.argmax(-1) == split.labels[:NUM_EXAMPLES])

    # export: every parameter and statistic of the restored state, the same numbers (the reference
    # definitions' state_dict adds the input normalization, mu and sigma, and a num_batches_tracked
    # counter per BatchNorm, which patjax's state does not hold).
    arrays = {
        k: v for k, v in load_file(exported).items() if k not in ("mu", "sigma") and "num_batches_tracked" not in k
    }
    leaves = jax.tree_util.tree_leaves((state.params, state.batch_stats))
    # The same values, element for element up to the layout (PyTorch's OIHW against Flax's HWIO).
    exported_values = np.sort(np.concatenate([a.ravel() for a in arrays.values()]))
    state_values = np.sort(np.concatenate([np.asarray(a, np.float32).ravel() for a in leaves]))
    np.testing.assert_array_equal(exported_values, state_values)

    # diagnose: the chain's energy at its start and after each of the 3 steps.
    report = json.load(open(diagnosed / "sampler_diagnostic_uniform.json"))
    assert report["settings"]["steps"] == 3 and len(report["curves"]["energy"]) == 4

    # experiments: the smoke suite's report before any run, 2 methods x 2 seeds all pending.
    assert "wrote" in out["experiments"] and json.load(open(suite / "results.json"))["num_done"] == 0
    pending = [line.split("|")[1].strip() for line in open(suite / "results.md") if "| pending |" in line]
    assert pending == [f"cifar10_small_cnn/{m}_s{s}" for s in (0, 1) for m in ("clean", "pat")]


@pytest.mark.slow
def test_a_workdir_and_its_own_model_exported_to_pytorch_compare_in_one_command_as_one_model(tiny_run, tmp_path):
    """One table over a workdir and a PyTorch checkpoint: the checkpoint is evaluated with the
    workdir's settings (its config's PR chunk of 2, not the default 5, and a value other than the
    default in every block, p_dis's c1 and the entropic lambda as the run resolves them), on the
    same images and the same noise, so the workdir's own model, exported, gives the same outcome on every image and a
    paired PR difference of exactly 0 at every radius. The file, exported beside the run under its
    name, is labelled by its file name, and its evaluation goes beside the run, not into it."""
    workdir = str(tmp_path / "run")
    shutil.copytree(tiny_run, workdir, ignore=shutil.ignore_patterns("eval", "*.lock"))
    exported = str(tmp_path / "run.safetensors")
    finish(start("patjax.export", f"--workdir={workdir}", f"--out={exported}"))
    # A value other than the default in every block of the run's eval, and a sampler and beta
    # from which p_dis's c1 and the entropic lambda resolve otherwise than the default config's.
    config = json.load(open(workdir_lib.config_path(workdir)))
    config["langevin"].update(c1=0.2, c2=0.5)
    config["pat"]["beta"] = 0.01
    for block, values in NON_DEFAULT_EVAL.items():
        (config["eval"][block] if block else config["eval"]).update(values)
    with open(workdir_lib.config_path(workdir), "w") as f:
        json.dump(config, f)
    out = finish(
        start(
            "patjax.evaluate",
            f"--workdir={workdir}",
            f"--torch_checkpoint={exported}",
            "--evaluators=clean,pr",
            "--num_examples=12",
            "--pr_distributions=uniform",
        )
    )
    run_results = json.load(open(os.path.join(workdir, "eval", "results.json")))
    file_results = json.load(open(tmp_path / "run_safetensors" / "eval" / "results.json"))
    assert file_results["model"]["torch_checkpoint"] == "run.safetensors"
    assert file_results["settings"]["pr"]["chunk_size"] == run_results["settings"]["pr"]["chunk_size"] == 2
    # The file is evaluated with the run's settings, as the run's config resolved them, every
    # block's: none of them the default config's, which a file alone would be evaluated with.
    default = evaluation.settings_record(config_lib.default_evaluation_settings("cifar10"), 12, 0)
    shared = [f.name for f in dataclasses.fields(evaluators.common.SharedSettings)]
    keys = (*shared, *evaluators.blocks(), "evaluators", "num_examples", "batch_size", "uniform")
    handed = {k: run_results["settings"][k] for k in keys}
    assert {k: file_results["settings"][k] for k in handed} == handed
    assert any(handed[k] != default[k] for k in shared)
    for block in evaluators.blocks():
        assert handed[block] != default[block], block
    assert handed["pr"]["pdis_c1"] == 0.2 and handed["pr"]["entropic_lambda"] == pytest.approx(0.5 - 0.01)
    run_images, file_images = (
        np.load(os.path.join(d, "eval", "per_image.npz")) for d in (workdir, tmp_path / "run_safetensors")
    )
    for key in ("clean.correct", "pr_uniform.counts"):
        np.testing.assert_array_equal(run_images[key], file_images[key])
    differences = json.load(open(os.path.join(workdir, "eval", "pr_vs_eps_paired_differences.json")))
    assert [(row["baseline"], row["run"]) for row in differences] == [("run", "run.safetensors")]
    for level in differences[0]["distributions"]["uniform"].values():
        assert level["clean_correct"]["value"] == 0.0
    paired = [line.split() for line in out.splitlines() if line.strip().startswith("run.safetensors ") and "+0" in line]
    assert paired and all(cell in ("run.safetensors", "+0.00", "[+0.00,", "+0.00]") for row in paired for cell in row)
    assert out.splitlines()[-1] == (
        f"evaluations: run in {workdir}/eval, run.safetensors in {tmp_path}/run_safetensors/eval"
    )


@pytest.mark.slow
@pytest.mark.long
def test_the_no_data_error_gives_advice_that_works_in_each_command_that_prints_it(tmp_path, data_dir):
    """From a checkout with no data beside it, an empty cache and no network, training and
    evaluation each end in one line whose advice names a flag or variable; each piece of advice,
    followed in the command that printed it, runs."""
    from patjax.interop import torch_weights
    from patjax.models import networks

    checkout = tmp_path / "elsewhere" / "checkout"
    shutil.copytree(REPO / "patjax", checkout / "patjax", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "configs", checkout / "configs")
    shutil.copy(REPO / "main.py", checkout / "main.py")
    model = networks.create_model("small_cnn", "cifar10", 10)
    params, batch_stats = networks.init_variables(model, jax.random.PRNGKey(0))
    file = str(tmp_path / "model.safetensors")
    torch_weights.export(
        file, "small_cnn", params, batch_stats, networks.DATASET_STATS["cifar10"], {"dataset": "cifar10"}
    )
    env = {k: v for k, v in os.environ.items() if k != "PATJAX_DATA_DIR" and "proxy" not in k.lower()}
    # Port 9 (discard): nothing listens on the loopback address there, as with no network.
    env.update(
        PATJAX_CACHE_DIR=str(tmp_path / "cache"), PATJAX_CIFAR_MIRROR="http://127.0.0.1:9", PYTHONPATH=str(checkout)
    )
    env.update(PATJAX_CPU_DEVICES="1", no_proxy="*")
    evaluate = [sys.executable, "-m", "patjax.evaluate", f"--torch_checkpoint={file}", "--evaluators=clean"]
    evaluate += ["--num_examples=4", "--batch_size=4", "--overwrite"]
    train = [sys.executable, "main.py", "--config=configs/quickstart.py", f"--workdir={tmp_path}/run"]
    train += ["--config.num_train_steps=1", "--config.batch_size=8", "--config.log_test_examples=4"]
    train += ["--config.langevin.steps=1", "--config.progress_bar=false", "--config.eval.batch_size=4"]

    def run(command, extra_env=None):
        return subprocess.run(
            command, cwd=checkout, env={**env, **(extra_env or {})}, capture_output=True, text=True, timeout=300
        )

    for command, flag in ((evaluate, "--data_dir=DIR"), (train, "--config.data_dir=DIR")):
        refused = run(command)
        assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
        (line,) = [x for x in refused.stderr.splitlines() if x.startswith("error:")]
        assert line.startswith("error: could not download CIFAR-10"), line
        assert flag in line and "PATJAX_DATA_DIR=DIR" in line, line
        followed = run([*command, flag.replace("DIR", data_dir)])
        assert followed.returncode == 0, followed.stderr[-2000:]
        by_variable = run(command, {"PATJAX_DATA_DIR": data_dir})
        assert by_variable.returncode == 0, by_variable.stderr[-2000:]


@pytest.mark.slow
def test_the_quickstart_command_run_again_resumes_its_workdir_named_like_the_config(tmp_path, data_dir):
    """`--config=quickstart --workdir=quickstart`, stopped and run again as the README says: the
    folder the first run made does not stand for the config, and the second run resumes it."""
    command = [sys.executable, "-m", "patjax.main", "--config=quickstart", "--workdir=quickstart"]
    command += [f"--config.data_dir={data_dir}", "--config.num_train_steps=2", "--config.batch_size=8"]
    command += ["--config.log_test_examples=4", "--config.langevin.steps=1", "--config.progress_bar=false"]
    env = dict(os.environ, PYTHONPATH=str(REPO), PATJAX_CPU_DEVICES="1")
    run = lambda *extra: subprocess.run(
        [*command, *extra], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    first = run("--stop_after_steps=1")
    assert first.returncode == 0, first.stderr[-2000:]
    assert os.listdir(tmp_path / "quickstart" / "checkpoints") == ["1"]
    again = run()
    assert again.returncode == 0, again.stderr[-2000:]
    assert "trained pat to step 2 of 2: quickstart/checkpoints/2" in again.stdout


def test_an_exported_model_read_back_into_a_workdir_restores_bit_for_bit(tiny_run, tmp_path):
    """benchmarks/crosscheck/kept_model_from_export.py: the workdir it builds from a run's export and config
    restores the run's own parameters and BatchNorm statistics exactly, with the config's
    compute_dtype replaced; it refuses a workdir that exists."""
    exported, rebuilt = str(tmp_path / "model.safetensors"), str(tmp_path / "rebuilt")
    finish(start("patjax.export", f"--workdir={tiny_run}", f"--out={exported}"))
    script = str(REPO / "benchmarks" / "crosscheck" / "kept_model_from_export.py")
    flags = (f"--export={exported}", f"--config={os.path.join(tiny_run, 'config.json')}", f"--workdir={rebuilt}")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, script, *flags, "--compute_dtype=bfloat16"], capture_output=True, text=True, env=env
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    _, _, original = workdir_lib.restore(tiny_run)
    _, _, restored = workdir_lib.restore(rebuilt)
    assert int(restored.step) == int(original.step)
    assert json.load(open(os.path.join(rebuilt, "config.json")))["compute_dtype"] == "bfloat16"
    for a, b in zip(*(jax.tree.leaves((s.params, s.batch_stats)) for s in (original, restored))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    again = subprocess.run([sys.executable, script, *flags], capture_output=True, text=True, env=env)
    assert again.returncode != 0 and "exists" in again.stderr


@pytest.mark.slow
def test_evaluate_step_reproduces_a_suite_curve_point_and_leaves_eval_alone(tmp_path):
    """`--step=400` on a copy of a committed table1_cpu run evaluates its kept model of step 400
    into curve/step_000400/: the clean outcomes and uniform PR counts of its first 50 images are
    those the suite runner's curve point committed (same model, images, seed and noise), and the
    run's final evaluation in eval/ is untouched. Two workdirs with --step are refused."""
    source = REPO / "docs" / "results" / "table1_cpu" / "runs" / "cifar10_small_cnn" / "pgd_s0"
    run = tmp_path / "pgd_s0"
    shutil.copytree(source, run, ignore=shutil.ignore_patterns("curve"))
    final_eval = (run / "eval" / "results.json").read_bytes()
    flags = ("--evaluators=clean,pr", "--pr_distribution=uniform", "--pr_distributions=uniform", "--seed=0")
    out = finish(start("patjax.evaluate", f"--workdir={run}", "--step=400", "--num_examples=50", *flags))
    assert "pgd_s0 step 400" in out
    new = np.load(run / "curve" / "step_000400" / "per_image.npz")
    committed = np.load(source / "curve" / "step_000400" / "per_image.npz")
    assert int(new["meta.step"]) == 400
    for key in ("image_index", "clean.correct", "pr_uniform.counts"):
        np.testing.assert_array_equal(new[key], committed[key][:50])
    assert (run / "eval" / "results.json").read_bytes() == final_eval
    proc = start("patjax.evaluate", f"--workdir={run}", f"--workdir={run}", "--step=400")
    proc.communicate(timeout=300)
    assert proc.returncode == 2


@pytest.mark.slow
@pytest.mark.long
def test_one_workdir_keeps_linf_l2_and_prbench_evaluations_and_a_comparison_with_its_export_reuses_them(
    tiny_run, tmp_path
):
    """The new user's path at tiny scale, in separate processes: one workdir evaluated at L-inf,
    L2 and PRBench's radii keeps all three (listed with their settings); the comparison against
    its exported file evaluates the file only, and reruns evaluate nothing (the files stay byte
    for byte); --compare_only reads the evaluation --eval_name names, and says which exist."""
    workdir = str(tmp_path / "run")
    shutil.copytree(tiny_run, workdir, ignore=shutil.ignore_patterns("eval", "*.lock"))
    flags = ("--evaluators=clean,pgd20,pr", "--num_examples=8")
    runs = [(), ("--attack_norm=l2",), ("--pr_preset=prbench", "--pr_samples=4")]
    outs = [finish(start("patjax.evaluate", f"--workdir={workdir}", *flags, *extra)) for extra in runs]
    # The config's N = 4, not the presets' 100: each name says it.
    names = ["linf-8_255.table1-N4.n8", "l2-0.5.table1-N4.n8", "linf-8_255.prbench-N4.n8"]
    folders = [os.path.join(workdir, "eval")] + [os.path.join(workdir, "evals", n) for n in names[1:]]
    for out, name, folder in zip(outs, names, folders):
        assert f"run: wrote {folder}/results.json ({name};" in out
    settings = [json.load(open(os.path.join(f, "results.json")))["settings"] for f in folders]
    assert [(s["attack"]["norm"], s["attack"]["eps"]) for s in settings] == [
        ("linf", 8 / 255),
        ("l2", 0.5),
        ("linf", 8 / 255),
    ]
    assert settings[2]["pr"]["epsilons"] == [0.03, 0.08, 0.1, 0.12] and settings[0]["pr"]["epsilons"] == [
        0.1,
        0.12,
        0.15,
        0.2,
    ]
    listed = finish(start("patjax.evaluate", f"--workdir={workdir}", "--list"))
    rows = [line.split("|")[1:3] for line in listed.splitlines() if line.startswith("| ") and "folder" not in line]
    assert [(n.strip(), f.strip()) for n, f in rows] == list(zip(names, folders))
    assert "attacks L2, ε = 0.5" in listed and "PR uniform law at ε = 0.03, 0.08, 0.1, 0.12, N = 4" in listed
    kept = [open(os.path.join(f, "results.json"), "rb").read() for f in folders]

    exported = str(tmp_path / "run.safetensors")
    finish(start("patjax.export", f"--workdir={workdir}", f"--out={exported}"))
    compare = ("patjax.evaluate", f"--workdir={workdir}", f"--torch_checkpoint={exported}", "--attack_norm=l2", *flags)
    first, again = finish(start(*compare)), finish(start(*compare))
    assert f"run: reused {folders[1]}/results.json ({names[1]}:" in first
    file_results = os.path.join(tmp_path, "run_safetensors", "eval", "results.json")
    assert f"run.safetensors: wrote {file_results} ({names[1]};" in first
    assert "reused" in again and "wrote" not in again
    assert [open(os.path.join(f, "results.json"), "rb").read() for f in folders] == kept
    assert "Attacks: L2, ε = 0.5" in again and first.splitlines()[-1] == again.splitlines()[-1]

    chosen = finish(start("patjax.evaluate", f"--workdir={workdir}", "--compare_only", f"--eval_name={names[2]}"))
    assert "PR: uniform law at ε = 0.03, 0.08, 0.1, 0.12, N = 4 per image." in chosen
    proc = start("patjax.evaluate", f"--workdir={workdir}", "--compare_only")
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 2
    assert err == f"error: {workdir} holds 3 evaluations ({', '.join(names)}): name one with --eval_name\n"
    # A name that is no folder's, and a name for a learning-curve point: one line each, nothing written.
    bad = [
        start("patjax.evaluate", f"--workdir={workdir}", *extra)
        for extra in (["--eval_name=../x"], ["--eval_name=x", "--step=2"])
    ]
    errors = [proc.communicate(timeout=300)[1] for proc in bad]
    assert [proc.returncode for proc in bad] == [2, 2]
    assert (
        errors[0]
        == "error: --eval_name='../x': a name is at most 100 letters, digits and . _ = + - (a folder's name)\n"
    )
    assert errors[1] == "error: --eval_name names an evaluation of the newest model; --step's goes to curve/step_N/\n"
    assert sorted(os.listdir(os.path.join(workdir, "evals"))) == sorted(names[1:])
