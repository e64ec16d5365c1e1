"""PyTorch weights files in and out (patjax.interop.torch_weights): a training script's .pt
checkpoint loads with weights_only; a file without its normalization, of another width or of
an unknown network, a damaged or foreign file, an export over an existing file or into a
missing folder is one line; an exported run gives patjax's logits in PyTorch and records the run
portably; results name the file by its sha256. The names and layouts, network by network, are
tests/interop/test_torch_names.py's."""

import hashlib
import json
import os
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest
import torch
from conftest import REPO
from helpers import abstract_variables, cut_short, random_images, run_module, torch_logits, trained_looking
from safetensors import safe_open

from patjax import api
from patjax.core import files
from patjax.core.errors import UserError
from patjax.interop import torch_names, torch_weights
from patjax.models import networks
from patjax.run import checkpoints, eval_files
from patjax.run import workdir as workdir_lib

CIFAR10 = networks.DATASET_STATS["cifar10"]


@pytest.fixture(scope="module")
def images():
    return random_images()


@pytest.mark.slow
def test_a_pt_file_loads_with_weights_only(images, tmp_path):
    from patjax_torch import models as torch_models

    torch.manual_seed(0)
    net = trained_looking(torch, torch_models.create_model("small_cnn", 10, CIFAR10), seed=2)
    file = str(tmp_path / "ckpt.pt")
    torch.save({"epoch": 3, "state_dict": net.state_dict()}, file)  # a training script's checkpoint dict
    model_fns, state = torch_weights.load_model(file, "small_cnn", "cifar10")
    got = np.asarray(model_fns.infer(state.params, state.batch_stats, images))
    np.testing.assert_allclose(got, torch_logits(torch, net, images), rtol=0, atol=1e-4)


def test_a_file_without_its_normalization_needs_one_named(tmp_path):
    params, batch_stats = jax.tree.map(lambda a: np.ones(a.shape, a.dtype), abstract_variables("small_cnn"))
    raw = str(tmp_path / "raw.safetensors")
    torch_weights.export(raw, "small_cnn", params, batch_stats, normalize=None)
    with pytest.raises(UserError, match="does not record its input normalization"):
        torch_weights.load_model(raw, "small_cnn", "cifar10")
    _, state = torch_weights.load_model(raw, "small_cnn", "cifar10", normalize="none")
    np.testing.assert_array_equal(state.params["Dense_0"]["kernel"], params["Dense_0"]["kernel"])
    normalized = str(tmp_path / "normalized.safetensors")
    torch_weights.export(normalized, "small_cnn", params, batch_stats, normalize=CIFAR10)
    torch_weights.load_model(normalized, "small_cnn", "cifar10", normalize="cifar10")  # agrees: accepted
    with pytest.raises(UserError, match="normalizes its inputs with mu="):
        torch_weights.load_model(normalized, "small_cnn", "cifar10", normalize="none")


def test_a_narrower_resnet_loads_with_its_width_named(tmp_path):
    params, batch_stats = jax.tree.map(lambda a: np.ones(a.shape, a.dtype), abstract_variables("resnet18", width=16))
    file = str(tmp_path / "narrow.safetensors")
    torch_weights.export(file, "resnet18", params, batch_stats, normalize=CIFAR10)
    with pytest.raises(UserError, match="does not fit resnet18"):
        torch_weights.load_model(file, "resnet18", "cifar10")
    _, state = torch_weights.load_model(file, "resnet18", "cifar10", width=16)
    assert state.params["Dense_0"]["kernel"].shape == params["Dense_0"]["kernel"].shape
    small = str(tmp_path / "small.safetensors")
    params, batch_stats = jax.tree.map(lambda a: np.ones(a.shape, a.dtype), abstract_variables("small_cnn"))
    torch_weights.export(small, "small_cnn", params, batch_stats, normalize=CIFAR10)
    with pytest.raises(UserError, match="width is taken by"):
        torch_weights.load_model(small, "small_cnn", "cifar10", width=16)


def test_an_unknown_network_is_one_line_before_the_file_is_read(tmp_path):
    with pytest.raises(UserError, match="unknown model 'resnet1000'; choose one of"):
        torch_weights.load_model(str(tmp_path / "absent.safetensors"), "resnet1000", "cifar10")


def test_export_into_a_missing_folder_is_one_line_and_writes_nothing(tmp_path):
    params, batch_stats = jax.tree.map(lambda a: np.ones(a.shape, a.dtype), abstract_variables("small_cnn"))
    with pytest.raises(UserError, match="does not exist"):
        torch_weights.export(str(tmp_path / "missing" / "m.safetensors"), "small_cnn", params, batch_stats, None)
    assert os.listdir(tmp_path) == []


@pytest.mark.slow
def test_the_command_line_refuses_a_file_that_does_not_fit_in_one_line(tmp_path):
    params, batch_stats = jax.tree.map(lambda a: np.ones(a.shape, a.dtype), abstract_variables("small_cnn"))
    file = str(tmp_path / "small.safetensors")  # written by another tool: no metadata names the network
    torch_weights.write_state_dict(file, torch_names.to_state_dict("small_cnn", params, batch_stats, CIFAR10))
    run = subprocess.run(
        [sys.executable, "-m", "patjax.evaluate", f"--torch_checkpoint={file}", "--model=resnet18"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert run.returncode == 2, run.stderr
    assert run.stderr.strip().count("\n") == 0 and "does not fit resnet18" in run.stderr, run.stderr
    run = subprocess.run(
        [sys.executable, "-m", "patjax.evaluate", f"--torch_checkpoint={file}"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert run.returncode == 2, run.stderr
    assert run.stderr.strip() == f"error: {file} does not name its network (no metadata): pass the model " + (
        f"({', '.join(networks.MODELS)})"
    )


@pytest.mark.slow
def test_an_exported_file_evaluates_without_model_from_its_metadata(tmp_path, data_dir):
    """The metadata `patjax.export` writes names the network, its width and dataset: no --model
    needed, and a --model that contradicts it is refused in one line before the weights are read."""
    params, batch_stats = jax.tree.map(lambda a: np.ones(a.shape, a.dtype), abstract_variables("resnet18", width=4))
    file = str(tmp_path / "narrow.safetensors")
    torch_weights.export(
        file, "resnet18", params, batch_stats, CIFAR10, metadata={"dataset": "cifar10", "num_classes": 10, "width": 4}
    )
    assert torch_weights.network(file) == ("resnet18", "cifar10", 4)
    command = [sys.executable, "-m", "patjax.evaluate", f"--torch_checkpoint={file}", "--evaluators=clean"]
    run = subprocess.run(command + ["--num_examples=4", "--batch_size=4"], capture_output=True, text=True, cwd=REPO)
    assert run.returncode == 0, run.stderr
    results = json.load(open(tmp_path / "narrow" / "eval" / "results.json"))
    assert results["model"]["model"] == "resnet18" and results["model"]["width"] == 4
    assert results["settings"]["num_examples"] == 4
    for flag, message in (
        ("--model=wrn28_10", "holds a model 'resnet18' (its metadata), not 'wrn28_10'"),
        ("--model_width=8", "holds a width 4 (its metadata), not 8"),
    ):
        run = subprocess.run(command + [flag], capture_output=True, text=True, cwd=REPO, timeout=120)
        assert run.returncode == 2 and run.stderr.strip() == f"error: {file} {message}", run.stderr


@pytest.mark.slow
def test_an_exported_run_gives_patjax_logits_in_torch(images, tmp_path):
    """A committed patjax-trained model, exported by the command line as .pt, in PyTorch."""
    from patjax_torch import models as torch_models

    workdir = str(REPO / "docs" / "results" / "table1_cpu" / "runs" / "cifar10_small_cnn" / "pgd_s0")
    out = str(tmp_path / "pgd.pt")
    run = subprocess.run(
        [sys.executable, "-m", "patjax.export", f"--workdir={workdir}", f"--out={out}", "--format=pt"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    _, model_fns, state = workdir_lib.restore(workdir)
    expected = np.asarray(model_fns.infer(state.params, state.batch_stats, images))
    net = torch_models.create_model("small_cnn", 10, CIFAR10)
    net.load_state_dict(torch.load(out, weights_only=True), strict=True)
    np.testing.assert_allclose(torch_logits(torch, net.eval(), images), expected, rtol=0, atol=1e-4)


def export_command(workdir, out, *flags):
    return run_module("patjax.export", f"--workdir={workdir}", f"--out={out}", *flags)


@pytest.mark.slow
def test_export_replaces_a_file_only_with_overwrite_and_names_the_model_it_holds(tmp_path):
    params, batch_stats = jax.tree.map(lambda a: np.ones(a.shape, a.dtype), abstract_variables("small_cnn"))
    out = str(tmp_path / "model.safetensors")
    torch_weights.export(out, "small_cnn", params, batch_stats, None, metadata={"dataset": "cifar10", "step": 7})
    with open(out, "rb") as f:
        before = f.read()
    expected = (
        f"{out} exists (it holds model=small_cnn, dataset=cifar10, step=7); pass --overwrite to replace it, "
        "or choose another --out"
    )
    with pytest.raises(UserError) as error:
        torch_weights.export(out, "small_cnn", params, batch_stats, None)
    assert str(error.value) == expected
    pt = tmp_path / "model.pt"
    pt.write_bytes(b"not ours")
    with pytest.raises(UserError, match=r"model.pt exists \(a .pt file, which does not record which model it holds\)"):
        torch_weights.write_state_dict(str(pt), {})
    # The command line: refused in one line before the run is read, the file left as it was.
    workdir = str(REPO / "docs" / "results" / "table1_cpu" / "runs" / "cifar10_small_cnn" / "pgd_s0")
    refused = export_command(workdir, out)
    assert refused.returncode == 2 and refused.stderr == f"error: {expected}\n", refused.stderr
    with open(out, "rb") as f:
        assert f.read() == before
    replaced = export_command(workdir, out, "--overwrite")
    assert replaced.returncode == 0, replaced.stderr
    with safe_open(out, framework="numpy") as f:
        metadata = f.metadata()
    assert metadata["model"] == "small_cnn" and metadata["step"] == str(checkpoints.require_checkpoint(workdir))
    assert sorted(os.listdir(tmp_path)) == ["model.pt", "model.safetensors"]  # no temporary file left


@pytest.mark.slow
def test_an_exported_file_records_the_run_portably_and_no_local_path(tmp_path):
    workdir = str(REPO / "docs" / "results" / "table1_cpu" / "runs" / "cifar10_small_cnn" / "pgd_s0")
    out = str(tmp_path / "pgd.safetensors")
    command = [sys.executable, "-m", "patjax.export", f"--workdir={workdir}", f"--out={out}"]
    run = subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=120)
    assert run.returncode == 0, run.stderr
    with safe_open(out, framework="numpy") as f:
        metadata = f.metadata()
    assert metadata == {
        "model": "small_cnn",
        "dataset": "cifar10",
        "num_classes": "10",
        "width": "",
        "step": "800",
        "run": "pgd_s0",
        "method": "pgd",
        "seed": "0",
    }


PGD_RUN = str(REPO / "docs" / "results" / "table1_cpu" / "runs" / "cifar10_small_cnn" / "pgd_s0")
OVERWRITE_REMEDY = "pass --overwrite to replace it, or choose another --out"


@pytest.mark.slow
def test_a_damaged_or_foreign_weights_file_is_one_line_wherever_it_is_read(tmp_path):
    """One reader of a .safetensors file (`files.read_safetensors`): a file cut short gives the
    same line through the library, `evaluate --torch_checkpoint` and `export --out` (kept models:
    tests/run/test_kept_models.py), and a file without patjax metadata says so."""
    params, batch_stats = jax.tree.map(lambda a: np.ones(a.shape, a.dtype), abstract_variables("small_cnn"))
    damaged = str(tmp_path / "damaged.safetensors")
    torch_weights.export(damaged, "small_cnn", params, batch_stats, CIFAR10)
    reason = cut_short(damaged)
    with open(damaged, "rb") as f:
        before = f.read()
    line = f"{damaged} is not a readable safetensors file ({reason})"
    for read in (torch_weights.read_state_dict, torch_weights.read_metadata, torch_weights.network):
        with pytest.raises(UserError) as error:
            read(damaged)
        assert str(error.value) == line, read
    evaluated = run_module("patjax.evaluate", f"--torch_checkpoint={damaged}", "--evaluators=clean")
    assert (evaluated.returncode, evaluated.stderr) == (2, f"error: {line}\n")
    exported = export_command(PGD_RUN, damaged)
    assert (exported.returncode, exported.stderr) == (2, f"error: {line}; {OVERWRITE_REMEDY}\n")
    # A file another tool wrote, whose metadata does not name a patjax network.
    foreign = str(tmp_path / "foreign.safetensors")
    torch_weights.write_state_dict(foreign, torch_names.to_state_dict("small_cnn", params, batch_stats))
    exported = export_command(PGD_RUN, foreign)
    expected = f"error: {foreign} exists (its metadata does not say which model it holds); {OVERWRITE_REMEDY}\n"
    assert (exported.returncode, exported.stderr) == (2, expected)
    with open(damaged, "rb") as f:
        assert f.read() == before  # refused, not replaced
    assert sorted(os.listdir(tmp_path)) == ["damaged.safetensors", "foreign.safetensors"]


@pytest.mark.slow
def test_results_name_the_file_by_name_and_sha256_so_the_same_file_anywhere_is_the_same_evaluation(
    tmp_path, monkeypatch, data_dir
):
    """results.json records the evaluated file portably (its name and sha256, no path of this
    machine); an evaluation of the same bytes from another folder or under another name may
    replace it, one of other weights under the same name is refused unless --overwrite. The
    file's metadata is read once (`torch_weights.network`), then its arrays."""
    for folder in ("a", "b", "c"):
        (tmp_path / folder).mkdir()
    model = networks.create_model("small_cnn", "cifar10", 10, normalize=networks.NO_NORMALIZATION)
    for folder, seed in (("a", 0), ("c", 1)):
        params, batch_stats = networks.init_variables(model, jax.random.PRNGKey(seed))
        torch_weights.export(str(tmp_path / folder / "net.safetensors"), "small_cnn", params, batch_stats, CIFAR10)
    first, other = str(tmp_path / "a" / "net.safetensors"), str(tmp_path / "c" / "net.safetensors")
    shutil.copy(first, tmp_path / "b" / "net.safetensors")
    shutil.copy(first, tmp_path / "b" / "renamed.safetensors")
    digest = {f: hashlib.sha256(open(f, "rb").read()).hexdigest() for f in (first, other)}
    assert digest[first] != digest[other]
    out = str(tmp_path / "out")
    reads = []
    reader = files.read_safetensors
    monkeypatch.setattr(
        files, "read_safetensors", lambda path, arrays=True: reads.append(arrays) or reader(path, arrays)
    )

    def evaluate(path, overwrite=False):
        return api.evaluate_torch_checkpoint(
            path, None, None, None, out, evaluators=["clean"], num_examples=4, batch_size=4, overwrite=overwrite
        )

    evaluate(first)
    assert reads == [False, True]  # the header for the network, then the arrays
    results_file = eval_files.results_path(out)
    with open(results_file) as f:
        text = f.read()
    assert json.loads(text)["model"] == {
        "torch_checkpoint": "net.safetensors",
        "sha256": digest[first],
        "model": "small_cnn",
        "width": None,
        "normalize": "the file's mu and sigma",
    }
    assert str(tmp_path) not in text
    for same in (tmp_path / "b" / "net.safetensors", tmp_path / "b" / "renamed.safetensors"):
        assert evaluate(str(same))["model"]["sha256"] == digest[first]
    with open(results_file, "rb") as f:
        kept = f.read()
    refused = run_module(
        "patjax.evaluate", f"--torch_checkpoint={other}", f"--out_dir={out}", "--evaluators=clean", "--num_examples=4"
    )
    expected = (
        f"error: {results_file} holds an evaluation made otherwise (model.sha256 {digest[first]!r} there, "
        f"{digest[other]!r} now), which this one would replace: pass --eval_name=ANOTHER_NAME to keep both, "
        "or pass --overwrite to replace it\n"
    )
    assert (refused.returncode, refused.stderr) == (2, expected)
    with open(results_file, "rb") as f:
        assert f.read() == kept
    assert evaluate(other, overwrite=True)["model"]["sha256"] == digest[other]


def test_a_previous_record_without_a_sha256_is_another_evaluation():
    """results.json written with a path and no sha256 cannot show it holds the same file."""
    previous = {"model": {"torch_checkpoint": "/elsewhere/net.safetensors", "model": "small_cnn"}, "settings": {}}
    record = {"model": {"torch_checkpoint": "net.safetensors", "sha256": "ab", "model": "small_cnn"}}
    assert eval_files.recorded_differences(previous, record) == ["model.sha256 None there, 'ab' now"]
    assert eval_files.recorded_differences({"model": {**record["model"], "torch_checkpoint": "x.pt"}}, record) == []
    assert eval_files.recorded_differences({}, {"robustbench": "A"}) == ["robustbench None there, 'A' now"]
