"""The one timing discipline of every benchmark that sets patjax against another tool.

A figure a reviewer can rerun needs the arms apart and the machine quiet: PyTorch's OpenMP pool
loses one to two orders of magnitude when other processes hold the cores, XLA's much less, so a
ratio measured under load flatters whichever side suffers less, and two frameworks in one
process share (and fight over) the cores. Hence:

- each arm runs in a fresh process of its own, one after the other, never two at once, and a
  script that times both sides never runs PyTorch and JAX in one process;
- at least three rounds (`MIN_ROUNDS`), alternating the arms (A B A B ...), so that a drift of
  the machine shows up in every arm alike;
- the 1-minute load average is recorded before and after every arm; a measurement that starts
  above `max_load` (default: half the usable cores, 1.0 on 2 cores) is refused, or with `force`
  run and marked "not a figure"; so is one of fewer rounds (the arms' own processes raise the load once they run, which
  is why only the start is gated: what is excluded is somebody else's work);
- the minimum and the median of each arm's walls, and of its compile time apart where the arm
  reports one (`compile_s`: JAX's own compile spans, `jax_compile_seconds`);
- an arm that compiles (`Arm.compiles`) is measured twice: cold (no persistent compilation
  cache, as a first evaluation runs) and warm (a cache the arm filled in an untimed run first,
  as every later evaluation runs).

An arm is a command line whose last line of output is one JSON object holding `wall_s` (the
seconds of the work compared; process start-up and loading are outside it) and, optionally,
`compile_s`; `Arm.extract` reads other layouts. Used by benchmarks/speed/ratios.py (every
published ratio in one run), pr_speed.py, certify_speed.py, compare_torch.py and
crosscheck/autoattack_reference.py.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Callable, Optional

DEFAULT_MAX_LOAD = len(os.sched_getaffinity(0)) / 2
MIN_ROUNDS = 3
# Environment of a cold arm (patjax's persistent compilation cache off) and the variable a warm
# arm's cache directory goes in (patjax.core.compile_cache reads both).
COLD_ENV = {"PATJAX_COMPILATION_CACHE": "off"}
CACHE_DIR_VARIABLE = "PATJAX_COMPILATION_CACHE_DIR"
# JAX's own time spans of tracing, lowering and compiling (jax._src.dispatch's event names): their
# union while an arm runs is its compilation, the rest its running.
COMPILE_EVENTS = (
    "/jax/core/compile/jaxpr_trace_duration",
    "/jax/core/compile/jaxpr_to_mlir_module_duration",
    "/jax/core/compile/backend_compile_duration",
)
# JAX's event for an executable loaded from the persistent cache instead of compiled
# (jax._src.compiler): a warm arm's count shows that it ran warm, whatever its compile seconds.
CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"
_COMPILE_SPANS: list = []
_CACHE_HITS = [0]
_LISTENING = []


class NotQuiet(SystemExit):
    """The machine was busier than the stated load when the measurement was to start."""


@dataclasses.dataclass(frozen=True)
class Arm:
    name: str
    argv: tuple  # the command; its last output line is a JSON object
    env: tuple = ()  # (name, value) pairs added to the environment
    compiles: bool = False  # measured cold and warm
    extract: Optional[Callable[[dict], dict]] = None  # the arm's JSON -> {"wall_s", "compile_s"?, ...}


def current_load() -> float:
    return os.getloadavg()[0]


def union_length(spans) -> float:
    """Seconds covered by the (start, end) spans: a jit traced inside another's trace has its own span."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(spans):
        total += max(0.0, end - max(start, reach))
        reach = max(reach, end)
    return total


def _keep_compile_span(event, start, end, **_):
    if event in COMPILE_EVENTS:
        _COMPILE_SPANS.append((start, end))


def _count_cache_hit(event, **_):
    if event == CACHE_HIT_EVENT:
        _CACHE_HITS[0] += 1


def compile_spans() -> list:
    """JAX's compile spans so far in this process (a list that grows; slice it to time a part);
    from the first call on, the persistent cache's hits are counted too (`arm_line` reports them)."""
    if not _LISTENING:
        import jax

        jax.monitoring.register_event_time_span_listener(_keep_compile_span)
        jax.monitoring.register_event_listener(_count_cache_hit)
        _LISTENING.append(True)
    return _COMPILE_SPANS


def timed_jax_call(fn, *args, **kwargs):
    """(fn's result, its wall seconds, the seconds of it JAX spent compiling)."""
    spans = compile_spans()
    before, start = len(spans), time.perf_counter()
    result = fn(*args, **kwargs)
    wall = time.perf_counter() - start
    return result, wall, union_length(spans[before:])


def frameworks() -> list:
    """The frameworks this process has started: JAX once a backend is initialized, PyTorch once
    imported (its thread pool starts with its first operation, which its import is for)."""
    started = []
    if "jax" in sys.modules:
        from jax._src import xla_bridge

        if xla_bridge.backends_are_initialized():
            started.append("jax")
    if "torch" in sys.modules:
        started.append("torch")
    return started


def arm_line(wall_s: float, compile_s: Optional[float] = None, **outputs) -> str:
    """The JSON line an arm prints last, with the frameworks it started (`measure` refuses an
    arm that started both) and, for an arm that timed JAX, the executables it loaded from the
    persistent compilation cache (`cache_hits`: 0 in a cold arm)."""
    out = {"wall_s": round(wall_s, 3), **({"compile_s": round(compile_s, 3)} if compile_s is not None else {})}
    if _LISTENING:
        out["cache_hits"] = _CACHE_HITS[0]
    return json.dumps({**out, **outputs, "frameworks": frameworks()}, default=float)


def last_json(text: str) -> dict:
    """The last line of the output that is a JSON object; else the whole output as one."""
    for line in reversed(text.strip().splitlines()):
        if line.startswith("{") and line.endswith("}"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                break
    return json.loads(text)


def run_arm(arm: Arm, env: dict) -> dict:
    """Runs the arm's command once in a fresh process: its JSON (through `extract`) and the
    process's own wall seconds. A failing arm raises, with the end of its stderr."""
    start = time.perf_counter()
    done = subprocess.run(list(arm.argv), capture_output=True, text=True, env={**os.environ, **env})
    process_s = time.perf_counter() - start
    if done.returncode:
        raise RuntimeError(f"arm {arm.name!r} failed (exit {done.returncode}): {done.stderr[-1500:]}")
    result = last_json(done.stdout)
    if {"jax", "torch"} <= set(result.get("frameworks", ())):
        raise RuntimeError(f"arm {arm.name!r} ran JAX and PyTorch in one process: its timing would be of both")
    return {**(arm.extract(result) if arm.extract else result), "process_s": round(process_s, 2)}


def expand(arms) -> list:
    """Each arm that compiles as a cold and a warm arm, in that order; the rest unchanged."""
    out = []
    for arm in arms:
        if arm.compiles:
            out.append(dataclasses.replace(arm, name=f"{arm.name} cold", env=(*arm.env, *COLD_ENV.items())))
            out.append(dataclasses.replace(arm, name=f"{arm.name} warm"))
        else:
            out.append(arm)
    return out


def _summary(values) -> dict:
    return {"min": round(min(values), 3), "median": round(statistics.median(values), 3)} if values else {}


def check_quiet(max_load: float = DEFAULT_MAX_LOAD, force: bool = False, load: Callable = current_load) -> dict:
    """The gate at a measurement's start: {"figure", "start_load", "max_load"}; NotQuiet if the
    load is above max_load and not forced."""
    start_load = load()
    quiet = start_load <= max_load
    if not quiet and not force:
        raise NotQuiet(
            f"refused: the 1-minute load average is {start_load:.2f}, above {max_load} (other work on the machine "
            "would be timed with the arms); wait for a quiet machine, or --force to run it marked 'not a figure'"
        )
    return {"figure": quiet, "start_load": round(start_load, 2), "max_load": max_load}


def measure(
    arms,
    rounds: int = MIN_ROUNDS,
    max_load: float = DEFAULT_MAX_LOAD,
    force: bool = False,
    gate: Optional[dict] = None,
    run: Callable = run_arm,
    load: Callable = current_load,
    log=sys.stderr,
) -> dict:
    """Times the arms in alternating rounds under the discipline above; `gate`: the result of a
    `check_quiet` already made by the caller (a driver measuring several things in a row gates
    once, at its start), else the gate is checked here. Returns the gate, the order the arms ran
    in, and per arm its records (walls, compile and run seconds, loads before and after, what
    it printed) and their minimum and median."""
    gate = gate or check_quiet(max_load, force, load)
    figure = gate["figure"] and rounds >= MIN_ROUNDS
    arms = expand(arms)
    records = {arm.name: [] for arm in arms}
    order, caches = [], {}
    try:
        for arm in arms:
            if arm.name.endswith(" warm"):
                caches[arm.name] = tempfile.mkdtemp(prefix="patjax-warm-cache-")
                run(arm, {**dict(arm.env), CACHE_DIR_VARIABLE: caches[arm.name]})  # fills the cache, untimed
        for r in range(rounds):
            for arm in arms:
                env = dict(arm.env)
                if arm.name in caches:
                    env[CACHE_DIR_VARIABLE] = caches[arm.name]
                before = load()
                record = run(arm, env)
                record.update(load_before=round(before, 2), load_after=round(load(), 2), round=r + 1)
                records[arm.name].append(record)
                order.append(arm.name)
                print(
                    f"round {r + 1} {arm.name}: {record['wall_s']:.2f} s"
                    + (f" (compiling {record['compile_s']:.2f})" if record.get("compile_s") is not None else "")
                    + f", load {record['load_before']:.2f} -> {record['load_after']:.2f}",
                    file=log,
                    flush=True,
                )
    finally:
        for path in caches.values():
            shutil.rmtree(path, ignore_errors=True)
    summary = {}
    for name, rs in records.items():
        arm = next(a for a in arms if a.name == name)
        summary[name] = {**_timings(rs), "command": shlex.join([f"{k}={v}" for k, v in arm.env] + list(arm.argv))}
        summary[name]["records"] = rs
        parts = rs[0].get("parts") or {}
        if parts:
            summary[name]["parts"] = {part: _timings([r["parts"][part] for r in rs]) for part in parts}
    return {**gate, "figure": figure, "rounds": rounds, "order": order, "arms": summary}


def _timings(records) -> dict:
    """Minimum and median of the walls, and of the compile and run seconds where reported."""
    compiled = [r for r in records if r.get("compile_s") is not None]
    return {
        "wall_s": _summary([r["wall_s"] for r in records]),
        "compile_s": _summary([r["compile_s"] for r in compiled]),
        "run_s": _summary([r["wall_s"] - r["compile_s"] for r in compiled]),
    }


def ratio(measured: dict, slower: str, faster: str, part: Optional[str] = None) -> dict:
    """How many times faster `faster` ran than `slower` (over one part of their work, if given:
    an arm's JSON may time its parts, `parts`): the ratio of their medians, and of their minimums."""
    a, b = (measured["arms"][arm] if part is None else measured["arms"][arm]["parts"][part] for arm in (slower, faster))
    a, b = a["wall_s"], b["wall_s"]
    return {"median": round(a["median"] / b["median"], 3), "min": round(a["min"] / b["min"], 3)}


def add_arguments(parser, rounds: int = MIN_ROUNDS) -> None:
    """The discipline's flags, the same in every script that uses it."""
    parser.add_argument(
        "--rounds", type=int, default=rounds, help=f"alternating rounds (fewer than {MIN_ROUNDS}: not a figure)"
    )
    parser.add_argument(
        "--max-load",
        type=float,
        default=DEFAULT_MAX_LOAD,
        help="refuse to start above this 1-minute load average (default: half the usable cores, %(default)s)",
    )
    parser.add_argument("--force", action="store_true", help="run above --max-load even so, marked 'not a figure'")
