"""AT-PR's search (`methods.atpr`) against wellzline/AT-PR's `pick_best_ae` transcribed to numpy,
and its candidates' ranges against attack_algorithms.py's `PR`."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import linear_batch, np_softmax

from patjax.methods import atpr

EPS = 0.1


def np_pick_best_ae(candidates, y, predict, grad_fn, step_size, max_iters, fraction=0.1):
    """wellzline/AT-PR pick_best_ae, transcribed to numpy (with the 40-iteration style cap)."""
    best = candidates[0].copy()
    max_distance = np.zeros(len(y))
    choice = np.zeros(len(y), int)
    for c, x_adv in enumerate(candidates):
        z = x_adv.copy()
        is_ae = predict(z) != y
        count = 0
        while is_ae.sum() > len(y) * fraction:
            if count >= max_iters:
                break
            count += 1
            g = grad_fn(z)
            z[is_ae] = np.clip(z[is_ae] - step_size * np.sign(g[is_ae]), 0, 1)
            is_ae = predict(z) != y
        distance = np.abs(x_adv - z).reshape(len(y), -1).max(axis=1)
        better = distance > max_distance
        best[better] = x_adv[better]
        choice[better] = c
        max_distance[better] = distance[better]
    return best, choice


@pytest.mark.slow
def test_atpr_search_returns_per_example_one_of_its_candidates_chosen_as_the_reference_does():
    logits_fn, x, y, W, b = linear_batch(batch=8, k=3, seed=4)
    settings = atpr.AtprSettings(
        eps=EPS,
        step_size=0.02,
        steps=3,
        num_candidates=4,
        eps_spread=0.05,
        step_size_spread=0.01,
        steps_above=3,
        refine_max_iters=6,
    )
    result = atpr.atpr_search(logits_fn, jax.random.PRNGKey(8), x, y, settings)
    candidates = np.asarray(result.candidates, np.float64)
    x_sel, choice = np.asarray(result.x_adv), np.asarray(result.choice)
    # Per example, the selected point is one of the candidates (the one `choice` names).
    for i in range(len(y)):
        assert any(np.array_equal(x_sel[i], candidates[c, i].astype(np.float32)) for c in range(4))
        np.testing.assert_array_equal(x_sel[i], candidates[choice[i], i].astype(np.float32))
    # The choice is the reference's, recomputed in numpy from the same candidates.
    yn = np.asarray(y)
    flat = lambda z: z.reshape(len(z), -1)
    predict = lambda z: np.argmax(flat(z) @ W + b, axis=1)
    grad = lambda z: ((np_softmax(flat(z) @ W + b) - np.eye(3)[yn]) @ W.T).reshape(z.shape)
    expected, expected_choice = np_pick_best_ae(candidates, yn, predict, grad, 0.02, 6)
    np.testing.assert_array_equal(choice, expected_choice)
    np.testing.assert_allclose(x_sel, expected, atol=1e-6)
    assert len(set(choice.tolist())) > 1  # several candidates are picked: the test can fail


def test_atpr_falls_back_to_the_standard_pgd_point_and_caps_the_refinement():
    model_bias = lambda label: lambda z: jnp.zeros((z.shape[0], 3)).at[:, label].set(5.0)
    x = jax.random.uniform(jax.random.PRNGKey(0), (6, 2, 2, 3))
    y = jnp.zeros((6,), jnp.int32)
    settings = atpr.AtprSettings(eps=EPS, step_size=0.02, steps=2, num_candidates=3, refine_max_iters=7)
    # Always correct: every distance is 0, so the standard PGD point (candidate 0) is kept.
    correct = atpr.atpr_search(model_bias(0), jax.random.PRNGKey(1), x, y, settings)
    np.testing.assert_array_equal(correct.choice, 0)
    np.testing.assert_array_equal(correct.x_adv, correct.candidates[0])
    np.testing.assert_array_equal(correct.refine_iters, 0)
    # Always wrong: the refinement never succeeds and stops at the cap.
    wrong = atpr.atpr_search(model_bias(1), jax.random.PRNGKey(1), x, y, settings)
    np.testing.assert_array_equal(wrong.refine_iters, 7)


def test_atpr_candidate_settings_lie_in_the_reference_ranges():
    s = atpr.AtprSettings()
    eps, alpha, steps = atpr.atpr_candidate_settings(jax.random.PRNGKey(0), dataclasses.replace(s, num_candidates=400))
    eps, alpha, steps = np.asarray(eps), np.asarray(alpha), np.asarray(steps)
    assert (eps[0], alpha[0], steps[0]) == (np.float32(8 / 255), np.float32(2 / 255), 10)
    assert np.all((eps[1:] >= 8 / 255 - 0.02 - 1e-7) & (eps[1:] <= 8 / 255 + 1e-7))
    assert np.all((alpha[1:] >= 2 / 255 - 0.003 - 1e-7) & (alpha[1:] <= 2 / 255 + 0.003 + 1e-7))
    assert steps[1:].min() == 8 and steps[1:].max() == 20  # randint(steps - 2, steps + 10) inclusive
