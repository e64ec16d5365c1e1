"""patjax's `aa` against the reference AutoAttack (Croce & Hein's code, `pyautoattack`) on the same
weights and images: a small version of benchmarks/crosscheck/autoattack_reference.py's cross-check, run
only where the `[bench]` extra installed the reference (PyTorch comes with the test extra)."""

import importlib.util
import pathlib
import sys

import pytest

pytestmark = pytest.mark.reference  # slow (README.md has the time): python -m pytest -q -m reference tests

REPO = pathlib.Path(__file__).resolve().parents[2]
RUN = REPO / "docs/results/table1_cpu/runs/cifar10_small_cnn/pgd_s0"  # a committed PGD-trained model


def load_benchmark():
    spec = importlib.util.spec_from_file_location(
        "autoattack_reference", REPO / "benchmarks/crosscheck/autoattack_reference.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_aa_agrees_with_the_reference_image_for_image(tmp_path, capsys):
    # Here, not at the module's top: a run that deselects the reference tier (the default) then
    # reports no skip.
    pytest.importorskip("pyautoattack", reason="needs the reference AutoAttack (pip install -e '.[bench]')")
    # 16 images of a PGD-trained model: some survive APGD-CE, so every attack of the sequence runs
    # on real images in both implementations.
    n = 16
    out = load_benchmark().main(
        [f"--workdir={RUN}", f"--num_examples={n}", f"--batch_size={n}", "--only=patjax", "--only=reference"]
    )
    capsys.readouterr()
    assert out["max_logit_difference"] < 1e-4
    # The reference logs its accuracies as percentages with two decimals.
    assert out["patjax"]["after"]["clean"] == pytest.approx(out["reference"]["after"]["clean"], abs=1e-4)
    assert out["patjax"]["after"]["clean"] > out["patjax"]["robust_accuracy"] > 0
    # Random starts are keyed differently (per image here, per batch there): one image may differ.
    assert len(out["robust_in_patjax_only"]) + len(out["robust_in_reference_only"]) <= 1
    for stage in ("apgd_ce", "apgd_t", "fab_t", "square"):
        assert abs(out["patjax"]["after"][stage] - out["reference"]["after"][stage]) <= 1 / n + 1e-4


def test_aa_l2_agrees_with_the_reference_attack_by_attack(capsys):
    """The L2 version, each attack alone on every image (`--individual`): FAB-T and Square rarely
    find anything after APGD-T in the sequence, so only this compares them on real images."""
    pytest.importorskip("pyautoattack", reason="needs the reference AutoAttack (pip install -e '.[bench]')")
    n = 16
    out = load_benchmark().main(
        [f"--workdir={RUN}", f"--num_examples={n}", f"--batch_size={n}", "--norm=L2", "--individual"]
    )
    capsys.readouterr()
    assert out["norm"] == "L2" and out["eps"] == 0.5
    for stage in ("apgd_ce", "apgd_t", "fab_t", "square"):
        figures = out["individual"][stage]
        assert figures["images_disagreeing"] <= 1, (stage, figures)
    # Some image is robust and some is not under each attack alone, so the comparison is not vacuous.
    assert 0 < out["individual"]["apgd_ce"]["patjax"] < 1
