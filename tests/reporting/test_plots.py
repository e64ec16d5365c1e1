"""The PR plot: its lines are the figures of results dicts made by hand, its labels say the estimand."""

import numpy as np
from helpers import hand_made_results

from patjax.reporting import plots


def test_the_pr_plot_shows_the_headline_estimand_and_says_so():

    a = hand_made_results(40, (0.95, 0.9), (0.38, 0.36), (0.1, 0.1), ["pgd20"])
    b = hand_made_results(55, (0.9, 0.8), (0.5, 0.44), (0.1, 0.1), ["pgd20"])
    assert (
        plots.plot_pr(["A", "B"], [a, b]).axes[0].get_title() == "uniform noise, N=100 per image"
    )  # not Table 1's radii
    a["settings"]["pr"]["epsilons"] = [0.1, 0.12, 0.15, 0.2]
    fig = plots.plot_pr(["A", "B"], [a, b])
    (ax,) = fig.axes
    # The lines are PR over each run's clean-correct images (the tables' headline), in percent.
    np.testing.assert_allclose(ax.lines[0].get_ydata(), [95, 90])
    np.testing.assert_allclose(ax.lines[1].get_ydata(), [90, 80])
    assert ax.get_title() == "uniform noise (the Table-1 protocol), N=100 per image"
    assert ax.get_ylabel() == "PR % over clean-correct images\n(95 % bootstrap interval)"
    assert ax.get_xlabel() == "eps (L-inf radius)"
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["A (over 40 images)", "B (over 55 images)"]
    assert fig._suptitle.get_text() == (
        "First 100 CIFAR-10 test images;\nPR over the images each run classifies correctly"
    )
    fig = plots.plot_pr(["A", "B"], [a, b], over="all")
    (ax,) = fig.axes
    np.testing.assert_allclose(ax.lines[0].get_ydata(), [38, 36])
    assert ax.get_title() == "uniform noise, N=100 per image"  # not the Table-1 protocol's estimand
    assert ax.get_ylabel().startswith("PR % over all images")
    assert fig._suptitle.get_text().endswith("PR over all images")


def test_the_pr_plot_gains_certified_accuracy_against_radius_where_a_run_was_certified():
    """A run with certify figures adds a panel of certified accuracy (in percent) against the L2
    radius, with its interval band; a run without them draws nothing there."""
    a = hand_made_results(40, (0.95, 0.9), (0.38, 0.36), (0.1, 0.1), ["pgd20"])
    b = hand_made_results(55, (0.9, 0.8), (0.5, 0.44), (0.1, 0.1), ["pgd20"])
    accuracy = {"0.0": 0.5, "0.25": 0.3, "0.5": 0.125}
    a["figures"]["certify"] = {
        "certified_accuracy": {r: {"value": v, "interval": [v - 0.05, v + 0.05]} for r, v in accuracy.items()},
        "settings": {"sigma": 0.25, "samples": 1000, "alpha": 0.001},
    }
    fig = plots.plot_pr(["A", "B"], [a, b])
    pr_ax, certified_ax = fig.axes
    assert len(pr_ax.lines) == 2 and len(certified_ax.lines) == 2  # A's line, the largest certifiable radius
    np.testing.assert_allclose(certified_ax.lines[0].get_xdata(), [0.0, 0.25, 0.5])
    np.testing.assert_allclose(certified_ax.lines[0].get_ydata(), [50, 30, 12.5])
    assert certified_ax.get_xlabel() == "L2 radius"
    assert certified_ax.get_title() == "randomized smoothing, sigma=0.25: n=1000, alpha=0.001"
    assert [t.get_text() for t in certified_ax.get_legend().get_texts()] == ["A", "largest certifiable radius, 0.616"]
    a["figures"].pop("pr"), b["figures"].pop("pr")  # certified, not evaluated under PR: no empty PR panel
    (only,) = plots.plot_pr(["A", "B"], [a, b]).axes
    assert only.get_xlabel() == "L2 radius"
