"""The tables: what a comparison says it measured (threat model, radius, PR law and its radii, N,
the image set), written out by hand from results dicts made by hand."""

import re

from helpers import hand_made_results

from patjax.reporting import plots, report
from patjax.run import eval_files, evaluation


def test_the_comparison_says_which_images_marks_a_vacuous_bound_and_names_every_worst_attack():

    a = hand_made_results(40, (0.95, 0.9), (0.38, 0.36), (-1.5454, 0.25), ["pgd20", "cw20", "aa"])
    b = hand_made_results(55, (0.9, 0.8), (0.5, 0.44), (0.125, -0.001), ["pgd20", "cw20"])
    text = report.comparison(["A", "B"], [a, b])
    lines = text.splitlines()
    assert lines[0] == (
        "Images: the first 100 CIFAR-10 test images; accuracies and attacks over all 100 of them; PR(eps) over "
        "the images each run classifies correctly (A 40, B 55) unless a table says all images."
    )
    # The last table: the worst case names its attacks per run; a bound <= 0 is vacuous, a
    # positive one printed as a percentage.
    header = next(i for i, line in enumerate(lines) if "worst of" in line)
    cells = [re.split(r"\s{2,}", line.strip()) for line in lines[header : header + 3]]
    # APGD was run by neither, so it has no column; AutoAttack by A alone, so B's cell is a dash.
    assert cells[0] == ["run", "AutoAttack %", "worst %", "worst of", "LB(0.1) %", "LB(0.2) %"]
    assert cells[1] == ["A", "15.00 [14.00, 16.00]", "14.00 [13.00, 15.00]", "PGD, CW, AutoAttack"] + [
        "≤ 0 (vacuous)",
        "25.00 [24.00, 26.00]",
    ]
    assert cells[2] == ["B", "-", "14.00 [13.00, 15.00]", "PGD, CW", "12.50 [11.50, 13.50]", "≤ 0 (vacuous)"]
    assert "-154.54" not in text
    # Neither ran AutoAttack nor CW: no column names them.
    for r in (a, b):
        r["figures"].pop("aa", None)
        r["figures"].pop("cw20")
    text = report.comparison(["A", "B"], [a, b])
    assert "AutoAttack %" not in text and "CW %" not in text and "PGD %" in text


def test_every_table_names_its_threat_model_and_pr_law():
    """The attacks' columns carry their norm and radius (L-inf as k/255), a caption says the
    step and the PR law with its radii and N; PRBench's radii are named PRBench's protocol, in the
    table, the paired differences and the plot."""
    a = hand_made_results(40, (0.95, 0.9), (0.38, 0.36), (0.1, 0.1), ["pgd20", "cw20"])
    a["settings"]["attack"] = {"norm": "linf", "eps": 8 / 255, "step_size": 2 / 255, "steps": 20}
    a["settings"]["pr"]["epsilons"] = [0.1, 0.12, 0.15, 0.2]
    lines = report.comparison(["A"], [a]).splitlines()
    assert lines[1] == "Attacks: L∞, ε = 8/255 = 0.0314; PGD and CW 20 steps of 2/255, APGD and AutoAttack their own."
    assert lines[2] == "PR: uniform law at ε = 0.1, 0.12, 0.15, 0.2 (the Table-1 protocol), N = 100 per image."
    assert re.split(r"\s{2,}", lines[4].strip())[:4] == [
        "run",
        "Acc %",
        "PGD (L∞, ε = 8/255) %",
        "CW (L∞, ε = 8/255) %",
    ]
    a["settings"]["attack"].update(norm="l2", eps=0.5, step_size=0.125)
    a["settings"]["pr"]["epsilons"] = [0.03, 0.08, 0.1, 0.12]
    lines = report.comparison(["A"], [a]).splitlines()
    assert lines[1] == "Attacks: L2, ε = 0.5; PGD and CW 20 steps of 0.125, APGD and AutoAttack their own."
    assert lines[2] == "PR: uniform law at ε = 0.03, 0.08, 0.1, 0.12 (PRBench's protocol), N = 100 per image."
    assert "PGD (L2, ε = 0.5) %" in lines[4] and "L∞" not in "\n".join(lines)
    diffs = [{"run": "B", "baseline": "A", "distributions": {"uniform": {"0.03": {}}}}]
    assert report.differences(diffs, a["settings"]).splitlines()[0] == (
        "Paired PR differences: uniform law at ε = 0.03, 0.08, 0.1, 0.12 (PRBench's protocol), N = 100 per image."
    )
    assert plots.plot_pr(["A"], [a]).axes[0].get_title() == "uniform noise (PRBench's protocol), N=100 per image"
    assert evaluation.protocol_text("uniform", 100, (0.03, 0.08, 0.1, 0.12)).startswith("PRBench's protocol")
    assert evaluation.protocol_text("uniform", 100, (0.1, 0.12, 0.15, 0.2)).startswith("Table-1 protocol:")


def test_a_radius_is_written_as_published():
    assert [report.radius(e) for e in (8 / 255, 2 / 255, 16 / 255, 0.03, 0)] == [
        "8/255",
        "2/255",
        "16/255",
        "0.03",
        "0",
    ]
    assert report.radius(8 / 255, "l2") == f"{8 / 255:g}" and report.radius(0.5, "l2") == "0.5"


def certify_only(correct=60):
    """A clean-and-certify evaluation's results.json as written, figures by hand (sigma 0.25,
    n = 1,000, alpha 0.001: no radius above 0.616 certifiable)."""
    fig = lambda v: {"value": v, "interval": [v - 0.01, v + 0.01], "n": 100}
    own = {"sigma": 0.25, "radii": [0.0, 0.5, 0.75], "selection_samples": 100, "samples": 1000, "alpha": 0.001}
    return {
        "figures": {
            "clean_accuracy": fig(correct / 100),
            "certify": {
                "certified_accuracy": {"0.0": fig(0.5), "0.5": fig(0.25), "0.75": fig(0.0)},
                "smoothed_accuracy": fig(0.55),
                "abstained": fig(0.1),
                "settings": own,
            },
        },
        "settings": {
            "evaluators": ["clean", "certify"],
            "num_examples": 100,
            "num_clean_correct": correct,
            "dataset": "cifar10",
            "attack": {"norm": "linf", "eps": 8 / 255, "step_size": 2 / 255, "steps": 20},
            "pr": {"distribution": "uniform", "distributions": ["uniform"], "epsilons": [0.1, 0.2], "samples": 100},
            "certify": own,
            "seed": 0,
            "confidence": 0.95,
        },
    }


def test_a_certify_only_evaluation_is_named_listed_and_tabled_as_certification():
    """Named for sigma and n, listed with sigma, n0, n, alpha and the largest certifiable radius;
    its table has no attack, PR or worst-case caption or column, and a radius above the largest
    certifiable one is marked, not printed as 0.00; no paired PR table, a plot named for it."""
    a, b = certify_only(60), certify_only(50)
    assert eval_files.derived_name(a["settings"]) == "certify-sigma0.25-N1000.n100"
    listed = report.evaluation_list("run", [("certify-sigma0.25-N1000.n100", "run/eval", a)])
    assert (
        "| clean,certify | 100 | certified accuracy (randomized smoothing) sigma = 0.25, n0 = 100, n = 1000, "
        "alpha = 0.001: radii up to 0.616 certifiable |" in listed
    )
    assert "ε" not in listed and "PR" not in listed
    text = report.comparison(["A", "B"], [a, b])
    for absent in ("Attacks:", "PR(", "PR:", "worst", "N=100", "bootstrap", "Theorem 2", "0.00 [-1.00"):
        assert absent not in text, absent
    row = next(line for line in text.splitlines() if line.strip().startswith("A ") and "55.00" in line)
    assert text.splitlines()[0] == "Images: the first 100 CIFAR-10 test images; accuracies over all 100 of them."
    assert re.split(r"\s{2,}", row.strip())[1:4] == ["50.00 [49.00, 51.00]", "25.00 [24.00, 26.00]", report.BEYOND]
    assert "sigma = 0.25, n0 = 100, n = 1000, alpha = 0.001, so that no radius above 0.616 can be certified" in text
    diffs = [{"run": "B", "baseline": "A", "distributions": {}, "certified_accuracy": {"0.0": None}}]
    assert "Paired PR differences" not in report.differences(diffs, a["settings"])
    assert plots.plot_file([a, b]) == "certified_accuracy.png"
    fig = plots.plot_pr(["A", "B"], [a, b])
    assert fig._suptitle.get_text() == (
        "First 100 CIFAR-10 test images;\ncertified accuracy of the smoothed classifiers over all images"
    )
    assert list(fig.axes[0].lines[0].get_xdata()) == [0.0, 0.5]  # 0.75 is beyond n: not drawn as a 0


def test_an_evaluation_is_named_for_the_evaluators_that_ran():
    """Clean and PGD-20 under L2 is not named after a PR law it never ran; a PR at Table 1's
    radii with another N says its N."""
    settings = certify_only()["settings"]
    settings.update(evaluators=["clean", "pgd20"], attack={"norm": "l2", "eps": 0.5, "step_size": 0.125})
    settings["pr"].update(distribution="gaussian")
    assert eval_files.derived_name(settings) == "l2-0.5.n100"
    settings["evaluators"] = ["clean", "pgd20", "pr"]
    settings["pr"].update(distribution="uniform", epsilons=[0.1, 0.12, 0.15, 0.2], samples=20)
    assert eval_files.derived_name(settings) == "l2-0.5.table1-N20.n100"
    settings["evaluators"] = ["clean"]
    assert eval_files.derived_name(settings) == "clean.n100"


def test_a_column_names_a_radius_as_it_is_published_and_never_as_another_number():
    # 0.2 is 51/255 exactly; it is published as 0.2. 8/255 has no short decimal; 'c1=0.3' is a
    # law's own level, not a number.
    labels = [report.level_label(k) for k in ("0.2", "0.1", repr(8 / 255), repr(2 / 255), "1.0", "c1=0.3")]
    assert labels == ["0.2", "0.1", "8/255", "2/255", "1", "c1=0.3"]
