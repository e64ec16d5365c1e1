"""patjax's PR under PRBench's protocol (`--pr_preset=prbench`) against PRBench's own loop
(tests/prbench_reference.py, a transcription of wellzline/PRBenchmark's `evaluate_PR`), on the same
network and the same images, through benchmarks/speed/pr_speed.py's two arms: the same law drawn by two
generators (JAX's keys, torch's global generator), so the per-image counts agree in distribution,
not sample by sample."""

import importlib.util
import sys

import numpy as np
import pytest
from conftest import REPO

from patjax.interop.torch_weights import export_run

# The reference loop runs one forward pass per image and radius, PyTorch beside JAX: seconds.
pytestmark = pytest.mark.slow
IMAGES = 64


def load_pr_speed():
    spec = importlib.util.spec_from_file_location("pr_speed", REPO / "benchmarks" / "speed" / "pr_speed.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_the_prbench_preset_counts_agree_in_distribution_with_prbenchs_loop(data_dir, tmp_path):
    torch = pytest.importorskip("torch")
    pr_speed = load_pr_speed()
    torch.manual_seed(0)  # as PRBench's evaluate.py
    arms = pr_speed.torch_arms
    model_fns, state = arms.committed_small_cnn()
    split = arms.first_test_images(IMAGES)
    exported = str(tmp_path / "clean_s0.safetensors")
    export_run(arms.KEPT_RUN, exported)
    ours = pr_speed.patjax_counts(model_fns, state, split, batch=IMAGES, chunk=5)
    theirs = pr_speed.prbench_counts(arms.torch_small_cnn(exported), split)
    radii = (0.03, 0.08, 0.1, 0.12)  # PRBench's: round(8/255, 2), 0.08, 0.1, 0.12
    assert tuple(ours) == tuple(theirs) == radii
    for e in radii:
        kept = ours[e][1] >= 0
        # Both keep the images the model classifies correctly (they differ only on exact ties).
        np.testing.assert_array_equal(kept, theirs[e][1] >= 0)
        assert 10 < kept.sum() < IMAGES
        a, b = ours[e][1][kept], theirs[e][1][kept]
        assert a.max() <= 100 and b.max() <= 100 and (a < 100).any()  # N = 100, and some samples broke
        # Paired over images: the summed difference of counts against its binomial standard error,
        # about N(0, 1) under one law; 4 standard errors: a false alarm once in 16,000 runs.
        assert abs(pr_speed.paired_z(a, b, 100)) < 4, e
        assert ours[e][0] == pytest.approx(np.mean(a) / 100) and theirs[e][0] == pytest.approx(np.mean(b) / 100)
    # The check tells laws apart: PRBench's counts at the next radius are rejected against ours.
    kept = ours[0.03][1] >= 0
    assert abs(pr_speed.paired_z(ours[0.03][1][kept], theirs[0.08][1][kept], 100)) > 4
