"""benchmarks/timing.py, the discipline every cross-tool benchmark is timed by, on trivial arms:
the load gate, the alternation, cold and warm arms, the minimum and median."""

import json
import sys

import pytest
from conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
import timing  # noqa: E402


class FakeRunner:
    """Each call returns the next wall of its arm; records the order and the environments."""

    def __init__(self, walls):
        self.walls, self.calls = {k: list(v) for k, v in walls.items()}, []

    def __call__(self, arm, env):
        self.calls.append((arm.name, dict(env)))
        return {"wall_s": self.walls[arm.name].pop(0), "compile_s": 0.5 if arm.compiles else None}


def loads(*values):
    it = iter(values)
    return lambda: next(it)


def test_a_start_above_the_stated_load_is_refused_or_marked_not_a_figure():
    arms = [timing.Arm("a", ("true",))]
    with pytest.raises(timing.NotQuiet, match="1.50, above 1.0"):
        timing.measure(arms, max_load=1.0, run=FakeRunner({"a": [1, 1, 1]}), load=lambda: 1.5)
    forced = timing.measure(
        arms, max_load=1.0, force=True, run=FakeRunner({"a": [1, 1, 1]}), load=lambda: 1.5, log=None
    )
    assert forced["figure"] is False and forced["start_load"] == 1.5
    quiet = timing.measure(arms, max_load=1.0, run=FakeRunner({"a": [1, 1, 1]}), load=lambda: 0.4)
    assert quiet["figure"] is True
    # Only the start is gated: the arms' own processes load the machine once they run.
    busy_later = timing.measure(arms, max_load=1.0, run=FakeRunner({"a": [1, 1, 1]}), load=loads(0.2, *[3.0] * 6))
    assert busy_later["figure"] is True
    assert [r["load_before"] for r in busy_later["arms"]["a"]["records"]] == [3.0, 3.0, 3.0]


def test_fewer_than_three_rounds_are_not_a_figure():
    arms = [timing.Arm("a", ("true",))]
    assert not timing.measure(arms, rounds=2, run=FakeRunner({"a": [1, 1]}), load=lambda: 0.0)["figure"]


def test_arms_alternate_round_by_round_and_a_compiling_arm_runs_cold_and_warm():
    arms = [timing.Arm("ref", ("true",)), timing.Arm("patjax", ("true",), env=(("X", "1"),), compiles=True)]
    runner = FakeRunner({"ref": [3, 1, 2], "patjax cold": [9, 8, 7], "patjax warm": [0.9, 5, 2, 1]})
    measured = timing.measure(arms, run=runner, load=lambda: 0.0, log=None)
    names = ["ref", "patjax cold", "patjax warm"]
    assert measured["order"] == names * 3
    # The warm arm's cache is filled once, untimed, before the rounds; the cold arm has none.
    assert [name for name, _ in runner.calls] == ["patjax warm"] + names * 3
    warm_dirs = {env[timing.CACHE_DIR_VARIABLE] for name, env in runner.calls if name == "patjax warm"}
    assert len(warm_dirs) == 1
    for name, env in runner.calls:
        assert (env.get("PATJAX_COMPILATION_CACHE") == "off") == (name == "patjax cold")
        assert (timing.CACHE_DIR_VARIABLE in env) == (name == "patjax warm")
        assert name == "ref" or env["X"] == "1"
    assert [r["round"] for r in measured["arms"]["ref"]["records"]] == [1, 2, 3]


def test_minimum_median_compile_and_run_seconds_and_the_ratio():
    arms = [timing.Arm("ref", ("true",)), timing.Arm("patjax", ("true",), compiles=True)]
    runner = FakeRunner({"ref": [3, 1, 2], "patjax cold": [9, 8, 7], "patjax warm": [0, 5, 2, 1]})
    measured = timing.measure(arms, run=runner, load=lambda: 0.0, log=None)
    assert measured["arms"]["ref"]["wall_s"] == {"min": 1, "median": 2} and measured["arms"]["ref"]["compile_s"] == {}
    warm = measured["arms"]["patjax warm"]
    assert warm["wall_s"] == {"min": 1, "median": 2} and warm["compile_s"] == {"min": 0.5, "median": 0.5}
    assert warm["run_s"] == {"min": 0.5, "median": 1.5}
    assert timing.ratio(measured, "patjax cold", "ref") == {"median": 4.0, "min": 7.0}


def test_an_arm_times_its_parts_and_they_are_summarized_apart():
    def run(arm, env):
        return {"wall_s": 3, "parts": {"x": {"wall_s": 1}, "y": {"wall_s": 2, "compile_s": 1}}}

    measured = timing.measure([timing.Arm("a", ("true",)), timing.Arm("b", ("true",))], run=run, load=lambda: 0.0)
    assert measured["arms"]["a"]["parts"]["y"]["run_s"] == {"min": 1, "median": 1}
    assert timing.ratio(measured, "a", "b", part="x") == {"median": 1.0, "min": 1.0}


def test_an_arm_is_a_process_whose_last_json_line_counts_and_one_framework_is_its_limit():
    line = json.dumps({"wall_s": 1.25, "frameworks": ["jax"]})
    arm = timing.Arm("a", (sys.executable, "-c", f"print('progress'); print({line!r})"))
    record = timing.run_arm(arm, {})
    assert record["wall_s"] == 1.25 and record["process_s"] > 0
    both = json.dumps({"wall_s": 1, "frameworks": ["jax", "torch"]})
    with pytest.raises(RuntimeError, match="JAX and PyTorch in one process"):
        timing.run_arm(timing.Arm("b", (sys.executable, "-c", f"print({both!r})")), {})
    with pytest.raises(RuntimeError, match="exit 3"):
        timing.run_arm(timing.Arm("c", (sys.executable, "-c", "raise SystemExit(3)")), {})
    # An indented JSON object as the whole output is read too (autoattack_reference.py's).
    assert timing.last_json('{\n "wall_s": 2\n}') == {"wall_s": 2}


def test_jax_compile_spans_are_counted_once_where_they_nest():
    assert timing.union_length([(0, 2), (1, 3), (5, 6)]) == 4
    import jax
    import jax.numpy as jnp

    result, wall, compile_s = timing.timed_jax_call(jax.jit(lambda x: jnp.sin(x) * 3.0 + 1.0), jnp.arange(7.0))
    assert result.shape == (7,) and 0 < compile_s <= wall
    assert timing.frameworks()[0] == "jax"


def _ratios():
    sys.path.insert(0, str(REPO / "benchmarks" / "speed"))
    import ratios

    return ratios


def test_the_ratio_table_has_a_row_per_attack_and_per_peer_and_says_whether_it_is_a_figure():
    ratios = _ratios()

    def run(arm, env):
        if arm.name.startswith("patjax"):
            parts = {"apgd_ce": {"wall_s": 2.0, "compile_s": 1.0}, "square": {"wall_s": 4.0, "compile_s": 1.0}}
            return {"wall_s": 6.0, "compile_s": 2.0, "parts": parts}
        return {"wall_s": 9.0, "parts": {"apgd_ce": {"wall_s": 1.0}, "square": {"wall_s": 8.0}}}

    arms = ratios.aa_arms("pat_s0", "x.safetensors", "Linf", 4, True, ("apgd_ce", "square"))
    aa = timing.measure(arms, run=run, load=lambda: 0.0)
    steps = timing.measure(
        ratios.train_arms("small_cnn", 8, 1, 1), run=lambda arm, env: {"wall_s": 2.0}, load=lambda: 0.0
    )
    report = {"date": "d", "machine": "m", "command": "c", "start_load": 0.5, "max_load": 1.0, "rounds": 3}
    report.update(figure=True, items={"aa_individual": {"size": "4", "measured": aa}})
    report["items"]["train_step"] = {"size": "8", "measured": steps}
    text = ratios.markdown(report)
    assert "**a figure**" in text
    # Reference over patjax: APGD-CE 1 s against 2 s, Square 8 against 4.
    assert "| aa_individual: apgd_ce | 4 | 1.00 (1.00) | 2.00 (2.00), compiling 1.00 |" in text
    assert "| **0.50** (0.50) | **0.50** (0.50) |" in text and "| **2.00** (2.00) | **2.00** (2.00) |" in text
    assert text.count("| train_step against the ") == 2
    # The reference arm is told to read the export, so that its process starts no JAX.
    assert "--torch_weights=x.safetensors" in aa["arms"]["reference"]["command"]
    assert aa["arms"]["patjax cold"]["command"].startswith("PATJAX_COMPILATION_CACHE=off ")


@pytest.mark.slow
def test_the_ratios_command_measures_and_writes_its_table_at_tiny_size(tmp_path):
    import os
    import subprocess

    out = tmp_path / "ratios"
    # JAX keeps only executables that took a second to compile; these tiny ones take less, so the
    # threshold is lowered for the warm arm to have something to load.
    env = {**os.environ, "PYTHONPATH": str(REPO), "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}
    flags = ["--items=certify", "--certify-images=2", "--certify-n=100", "--rounds=1", "--force"]
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "speed" / "ratios.py"), f"--out={out}", *flags],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads((out / "ratios.json").read_text())
    assert report["figure"] is False and set(report["items"]) == {"certify"}
    arms = report["items"]["certify"]["measured"]["arms"]
    assert set(arms) == {"theirs", "patjax cold", "patjax warm"}
    # Each arm started one framework: PyTorch for the authors' loop, JAX for patjax's.
    assert arms["theirs"]["records"][0]["frameworks"] == ["torch"]
    assert arms["patjax warm"]["records"][0]["frameworks"] == ["jax"]
    # The warm arm loads what its untimed first run compiled; the cold arm loads nothing. (Their
    # compile seconds are not compared: at this size they differ by less than a shared CI
    # machine's noise.)
    assert arms["patjax warm"]["records"][0]["cache_hits"] > 0
    assert arms["patjax cold"]["records"][0]["cache_hits"] == 0
    assert "| certify |" in (out / "ratios.md").read_text()


def run_script(name, flags):
    import os
    import subprocess

    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "speed" / name), *flags, "--rounds=1", "--force", "--json"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.long
def test_the_amls_speed_arms_each_start_one_framework_and_estimate_the_same_images():
    out = run_script("amls_speed.py", ["--images=1", "--eps=0.1", "--particles=16", "--mh-steps=1"])
    assert out["figure"] is False and out["images"] == 1 and len(out["indices"]) == 1
    assert set(out["walls_s"]) == {"theirs", "patjax cold", "patjax warm"}
    assert set(out["median_log10_p"]) == set(out["walls_s"])


@pytest.mark.slow
@pytest.mark.long
def test_the_own_loop_step_benchmark_times_both_steps_under_the_discipline():
    flags = ["--batch=8", "--steps=1", "--langevin_steps=1"]
    out = run_script("own_loop_step.py", flags)
    assert out["figure"] is False and set(out["median_step_s"]) == {"own", "main"}
    assert out["own_over_main"] == pytest.approx(out["median_step_s"]["own"] / out["median_step_s"]["main"], rel=1e-2)
