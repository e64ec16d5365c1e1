"""The sampler diagnostic against the closed form of Algorithm 1 with c2 = 0, sigma = 0."""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest
from conftest import REPO, train_run
from helpers import linear_setup, tiny_config

from patjax.pat import langevin_diagnostic
from patjax.pat.langevin import LangevinSettings


def test_curves_follow_the_closed_form_contraction():
    logits_fn, x, y, _, _ = linear_setup()
    T, chains, rate = 30, 3, 1 - 2 * 0.3 * 0.3  # (1 - 2 eta c1) = 0.82 with the defaults
    settings = LangevinSettings(steps=T, c2=0.0, noise_scale=0.0)
    curves = jax.jit(lambda k: langevin_diagnostic.chain_curves(logits_fn, k, x, y, settings, chains))(
        jax.random.PRNGKey(0)
    )
    c = {k: np.asarray(v, np.float64) for k, v in curves.items()}
    t = np.arange(T + 1)
    m0 = c["mean_abs_delta"][0]  # mean |u - x| of the uniform starts
    np.testing.assert_allclose(c["mean_abs_delta"], rate**t * m0, rtol=1e-4)
    np.testing.assert_allclose(c["max_abs_delta"], rate**t * c["max_abs_delta"][0], rtol=1e-4)
    np.testing.assert_allclose(c["l2_delta"], rate**t * c["l2_delta"][0], rtol=1e-4)
    np.testing.assert_allclose(c["distance_to_last"], np.abs(rate**t - rate**T) * m0, rtol=1e-3, atol=1e-7)
    np.testing.assert_allclose(c["drift"][1:], (1 - rate) * rate ** (t[1:] - 1) * m0, rtol=1e-4)
    assert np.isnan(c["drift"][0])
    # c2 = 0: the energy is c1 ||x_t - x||^2 = c1 rate^(2t) ||u - x||^2.
    np.testing.assert_allclose(c["energy"], rate ** (2 * t) * c["energy"][0], rtol=1e-4)
    # Chains of one image differ only by their start: the spread contracts at the same rate.
    np.testing.assert_allclose(c["chain_spread"], rate**t * c["chain_spread"][0], rtol=1e-4)
    assert 0.1 < m0 < 0.6 and c["chain_spread"][0] > 0.1


def test_first_step_within_is_the_step_from_which_the_distance_stays_below():
    d = np.array([0.5, 0.2, 0.05, 0.2, 0.04, 0.03, 0.0])
    assert langevin_diagnostic.first_step_within(d, 0.1) == 4
    assert langevin_diagnostic.first_step_within(d, 1.0) == 0
    assert langevin_diagnostic.first_step_within(d, 0.01) is None  # only the last step itself


@pytest.mark.slow
@pytest.mark.long
def test_command_line_writes_json_and_plot_from_a_checkpoint(tmp_path, data_dir):

    workdir = str(tmp_path / "run")
    train_run(tiny_config(data_dir=data_dir, num_train_steps=2), workdir)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "patjax.diagnose",
            f"--workdir={workdir}",
            "--num_examples=4",
            "--steps=12",
            "--chains=2",
            "--init=clean",
            "--compare_tolerance=1e-12",
            "--compare_steps=3",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.load(open(os.path.join(workdir, "diagnose", "sampler_diagnostic_clean.json")))
    assert os.path.isfile(os.path.join(workdir, "diagnose", "sampler_diagnostic_clean.png"))
    assert result["settings"]["init"] == "clean" and result["settings"]["steps"] == 12
    assert len(result["curves"]["energy"]) == 13 and result["curves"]["mean_abs_delta"][0] == 0.0
    assert "the chain stays within 1.1 x of it from step" in proc.stdout
    # Progress on stderr: every step of the two passes over the chains, then the three samplers compared.
    assert "4 images x 2 chains, 2 passes: 100%" in proc.stderr and " 24/24 " in proc.stderr, proc.stderr[-2000:]
    assert "compare samplers: reference, floor, candidate: 100%" in proc.stderr and " 3/3 " in proc.stderr
    # The compared sampler runs to its own cap (no chain's drift is below 1e-12), the reference to --steps.
    comparison = result["sampler_comparison"]
    assert comparison["candidate_steps_max"] == 3 and comparison["candidate_steps_mean"] == 3
    assert comparison["reference_steps"] == 12 and comparison["reference"]["init"] == "uniform"
    assert comparison["candidate"]["steps"] == 3 and comparison["candidate"]["init"] == "clean"
    for bad_flag in ("--chains=1", "--compare_steps=3"):  # the second lacks --compare_tolerance
        bad = subprocess.run(
            [sys.executable, "-m", "patjax.diagnose", f"--workdir={workdir}", bad_flag],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert bad.returncode == 2 and bad.stderr.strip().startswith("error: ") and "Traceback" not in bad.stderr


def test_sampler_comparison_against_the_closed_form():
    logits_fn, x, y, _, _ = linear_setup()
    rate = 1 - 2 * 0.3 * 0.3
    reference = LangevinSettings(steps=20, c2=0.0, noise_scale=0.0)
    candidate = LangevinSettings(steps=20, c2=0.0, noise_scale=0.0, init="clean", tolerance=1e-6)
    f = jax.device_get(
        jax.jit(lambda k: langevin_diagnostic.compare_samplers(logits_fn, k, x, y, reference, candidate))(
            jax.random.PRNGKey(4)
        )
    )
    # The clean start is the fixed point: one step of zero drift, the sample stays x; the
    # reference sits at x + rate^20 (u - x).
    assert float(f["candidate_steps_mean"]) == 1.0 and float(f["candidate_distance_to_x"]) == 0.0
    np.testing.assert_allclose(f["distance_to_reference"], f["reference_distance_to_x"], rtol=1e-6)
    assert 0.1 * rate**20 < float(f["reference_distance_to_x"]) < 0.6 * rate**20
    assert 0 < float(f["floor"]) < 0.7 * rate**20  # two uniform starts contracted alike
