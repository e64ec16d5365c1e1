"""An evaluation's files in a run's workdir: eval/per_image.npz, then eval/results.json (and
curve/step_N/ for a learning curve's points), their identity, and the check that two
evaluations share their images and noise; the evaluations a workdir keeps side by side, each
under its name (eval/, then evals/NAME/), and the saved one a new evaluation may reuse. The rest
of a workdir is `patjax.run.workdir`."""

from __future__ import annotations

import os
import re
import sys
from typing import Optional

import numpy as np

from patjax import evaluators
from patjax.core.errors import UserError
from patjax.core.files import atomic, read_json, read_npz, sha256, write_json
from patjax.pat import laws, robustness
from patjax.reporting import plots
from patjax.run import eval_settings
from patjax.run import workdir as workdir_lib


def read_results_file(path: str, remedy: str = "") -> Optional[dict]:
    """A results.json (an evaluation's) with its settings in the current shape (`nested_settings`),
    or None if there is none; an unreadable one is a UserError."""
    results = read_json(path, remedy or RESULTS_REMEDY)
    if isinstance(results, dict) and isinstance(results.get("settings"), dict):
        results = {**results, "settings": eval_settings.nested_settings(results["settings"])}
    return results


# Settings that identify an evaluation, stored in per_image.npz as META_PREFIX + path and
# checked against results.json's settings wherever the two are paired (`check_per_image`).
META_PREFIX = "meta."
IDENTITY_FIELDS = (
    "step",
    "seed",
    "num_examples",
    "pr.samples",
    "pr.epsilons",
    "pr.distributions",
    "evaluators",
    "dataset",
)


def identity(settings: dict) -> dict:
    """The per_image.npz entries that tie it to the results.json of its evaluation."""
    return {META_PREFIX + k: np.asarray(eval_settings.setting(settings, k)) for k in IDENTITY_FIELDS}


def _stored_identity(per_image: dict, path: str):
    """per_image.npz's identity entry for `path`: meta.pr.samples, or meta.pr_samples in a file
    written before the settings were nested (`eval_settings.FLAT_NAMES`)."""
    flat = {v: k for k, v in eval_settings.FLAT_NAMES.items()}.get(tuple(path.split(".")), path)
    return per_image.get(META_PREFIX + path, per_image.get(META_PREFIX + flat))


def check_per_image(results: dict, per_image: dict, where: str) -> None:
    """Raises UserError unless `per_image` (per_image.npz in the folder `where`) was written by
    the evaluation that wrote `results` (results.json) and holds the per-image outcomes its
    evaluators write: a kill between the two writes, a copied or replaced file, would otherwise
    pair one evaluation's figures with another's per-image outcomes, or with none.

    Files without a stored identity are checked on their number of images and their arrays.
    """
    settings = results["settings"]  # read_results checked that it is there
    n = settings["num_examples"]
    if META_PREFIX + "step" not in per_image:
        held = len(per_image.get("image_index", ()))
        if held != n:
            raise UserError(f"{where}: per_image.npz holds {held} images but results.json {n}; re-run the evaluation")
    else:
        differing = []
        for k in IDENTITY_FIELDS:
            stored = np.asarray(_stored_identity(per_image, k))
            expected = np.asarray(eval_settings.setting(settings, k))
            if stored.shape != expected.shape or not np.array_equal(stored, expected):
                differing.append(f"{k} {stored.tolist()!r} vs {expected.tolist()!r}")
        if differing:
            raise UserError(
                f"{where}: per_image.npz does not belong to results.json ({'; '.join(differing)}); "
                f"re-run the evaluation"
            )
    wrong = [k for k in per_image_arrays(settings) if k not in per_image or np.shape(per_image[k])[:1] != (n,)]
    if wrong:
        raise UserError(
            f"{where}: per_image.npz lacks {', '.join(wrong)} for the {n} images that results.json's evaluators "
            f"wrote; re-run the evaluation"
        )


def per_image_arrays(settings: dict) -> list[str]:
    """The per-image arrays an evaluation with these settings (results.json's) writes and its
    readers index: the clean pass's outcome (PR's subset needs it), each attack's, each PR law's
    counts (`evaluation._flatten_per_image`)."""
    names = settings["evaluators"]
    out = ["clean.correct"] if "clean" in names or "pr" in names else []
    out += [f"{e}.robust" for e in names if e in evaluators.WORST_CASE]
    if "certify" in names:
        out += ["certify.class", "certify.radius"]
    if "pr" in names:
        out += [f"pr_{d}.counts" for d in settings["pr"]["distributions"]]
    return out


def check_results(results: dict, path: str, remedy: str) -> None:
    """Raises UserError unless `results` (results.json at `path`) holds what its readers index:
    the settings that identify the evaluation and, for each of its evaluators, its figures (PR's
    under each law and level)."""
    settings = results.get("settings")
    if not isinstance(settings, dict):
        raise UserError(f"{path} is damaged (no settings); {remedy}")
    missing = [k for k in (*IDENTITY_FIELDS, "pr.distribution") if eval_settings.setting(settings, k) is None]
    if missing:
        raise UserError(f"{path} is damaged (its settings lack {', '.join(missing)}); {remedy}")
    mistyped = [
        k
        for k in ("evaluators", "pr.distributions", "pr.epsilons")
        if not isinstance(eval_settings.setting(settings, k), list)
    ]
    if isinstance(settings["num_examples"], bool) or not isinstance(settings["num_examples"], int):
        mistyped.append("num_examples")
    if mistyped:
        raise UserError(f"{path} is damaged (its settings' {', '.join(mistyped)} are not what it writes); {remedy}")
    figures = results.get("figures")
    if not isinstance(figures, dict):
        raise UserError(f"{path} is damaged (no figures); {remedy}")
    names = settings["evaluators"]
    missing = [("clean_accuracy" if e == "clean" else e) for e in names if e != "pr"]
    missing = [k for k in missing if not isinstance(figures.get(k), dict)]
    if "pr" in names:
        pr = figures.get("pr") if isinstance(figures.get("pr"), dict) else {}
        eps_keys = [robustness.level_key(e) for e in settings["pr"]["epsilons"]]
        for d in settings["pr"]["distributions"]:
            law = pr.get(d)
            # The laws of eps have one figure per level of pr.epsilons; pdis has its own level.
            levels = eps_keys if d in laws.of_eps() else list(law or ())
            if not isinstance(law, dict) or not levels or not all(isinstance(law.get(e), dict) for e in levels):
                missing.append(f"pr.{d}")
    if missing:
        raise UserError(f"{path} is damaged (no figures {', '.join(missing)}); {remedy}")


# An evaluated weights file as results.json records it: its name, to show, and its sha256, which
# alone says which weights were evaluated. The same file moved, copied or renamed is the same
# evaluation, and another file under the same name is not (`check_replaceable`).
CHECKPOINT_NAME = "torch_checkpoint"


def checkpoint_record(path: str) -> dict:
    """What identifies the weights file `path` portably: its file name and its sha256 (no path of
    this machine), for the "model" entry of results.json."""
    return {CHECKPOINT_NAME: os.path.basename(path), "sha256": sha256(path)}


def recorded_differences(previous: dict, record: dict) -> list[str]:
    """How `record`'s entries (e.g. the evaluated file and network) depart from `previous` (a
    results.json), entry by entry within a dict; a file's name is not compared, its sha256 is
    (`checkpoint_record`)."""
    differing = []
    for key, new in record.items():
        old = previous.get(key)
        if isinstance(new, dict) and isinstance(old, dict):
            fields = [*new, *(k for k in old if k not in new)]
            differing += [
                f"{key}.{k} {old.get(k)!r} there, {new.get(k)!r} now"
                for k in fields
                if k != CHECKPOINT_NAME and old.get(k) != new.get(k)
            ]
        elif old != new:
            differing.append(f"{key} {old!r} there, {new!r} now")
    return differing


def check_replaceable(
    directory: str,
    planned: dict,
    record: Optional[dict] = None,
    step: Optional[int] = None,
    name: Optional[str] = None,
) -> None:
    """Raises UserError if eval/ (curve/step_N/ with a step, the evaluation named `name` with one)
    holds an evaluation that one with `planned` settings (and `record`'s entries, e.g. the
    evaluated file) would replace with other figures: results are never replaced without a word.
    The same settings, or more evaluators or laws beside the same ones, may replace it (its
    figures come back identical)."""
    previous = read_results(directory, step, name)
    if previous is None:
        return
    differing = eval_settings.lost_settings(previous.get("settings", {}), planned)
    differing += recorded_differences(previous, record or {})
    if differing:
        keep = (
            "pass --eval_name=ANOTHER_NAME to keep both"
            if name is not None
            else f"move {eval_dir(directory, step)} aside to keep it"
        )
        raise UserError(
            f"{results_path(directory, step, name)} holds an evaluation made otherwise ({'; '.join(differing)}), "
            f"which this one would replace: {keep}, or pass --overwrite to replace it"
        )


def default_out_dir(path: str) -> str:
    """Where the evaluation of a model file (a PyTorch checkpoint, a RobustBench entry's) goes when
    no folder is named: beside the file, its path without the suffix (model.safetensors ->
    model/), unless that folder is a run's workdir (the run exported beside itself:
    quickstart.safetensors next to quickstart/), whose own evaluation it would mix with; then
    the path with the suffix's dot as an underscore (quickstart_safetensors/)."""
    stem, suffix = os.path.splitext(path)
    if suffix and os.path.isfile(workdir_lib.config_path(stem)):
        return f"{stem}_{suffix[1:]}"
    return stem


def eval_dir(workdir: str, step: Optional[int] = None, name: Optional[str] = None) -> str:
    """eval/ (the evaluation of the newest model), curve/step_N/ (that of the kept model of step
    N), or the folder of the evaluation named `name` (`named_dir`)."""
    if step is not None:
        return os.path.join(workdir, "curve", f"step_{int(step):06d}")
    return os.path.join(workdir, "eval") if name is None else named_dir(workdir, name)


def curve_steps(workdir: str) -> list[int]:
    """The steps with an evaluation in curve/, ascending."""
    directory = os.path.join(workdir, "curve")
    names = os.listdir(directory) if os.path.isdir(directory) else []
    return sorted(int(n[len("step_") :]) for n in names if n.startswith("step_") and n[len("step_") :].isdigit())


def results_path(workdir: str, step: Optional[int] = None, name: Optional[str] = None) -> str:
    return os.path.join(eval_dir(workdir, step, name), "results.json")


def plot_path(workdir: str, name: Optional[str] = None, file: str = plots.PLOT_FILES[("pr",)]) -> str:
    """The comparison plot in the folder of the evaluation named `name`, as `file` (`plots.plot_file`)."""
    return os.path.join(eval_dir(workdir, name=name), file)


def per_image_path(workdir: str, step: Optional[int] = None, name: Optional[str] = None) -> str:
    return os.path.join(eval_dir(workdir, step, name), "per_image.npz")


def has_evaluation(workdir: str, step: Optional[int] = None) -> bool:
    """Whether both files of an evaluation exist (whether they belong together: `load_results`)."""
    return os.path.isfile(results_path(workdir, step)) and os.path.isfile(per_image_path(workdir, step))


def write_results(
    workdir: str, results: dict, per_image: dict, step: Optional[int] = None, name: Optional[str] = None
) -> dict:
    """Writes eval/per_image.npz, then eval/results.json (in the folder of the evaluation named
    `name` with one, the name recorded), each atomically (temp file + rename).

    results.json is the commit marker: a kill never leaves a new results.json beside an older
    per_image.npz, and per_image.npz carries its evaluation's identity (`check_per_image`).
    Returns the results as written (non-finite numbers as None).
    """
    folder = eval_dir(workdir, step, name)
    if name is not None:
        results = {**results, NAME_KEY: name}
    os.makedirs(folder, exist_ok=True)
    entries = {**per_image, **identity(results["settings"])}
    atomic(os.path.join(folder, "per_image.npz"), lambda tmp: np.savez_compressed(tmp, **entries), suffix=".tmp.npz")
    written = write_json(os.path.join(folder, "results.json"), results)
    for file in plots.PLOT_FILES.values():  # drawn from the previous results; the command line draws it anew
        stale_plot = os.path.join(folder, file)
        if step is None and os.path.isfile(stale_plot):
            os.remove(stale_plot)
    return written


# Said by every command that reads evaluations (evaluate, and experiments, which takes no
# --overwrite and evaluates again a run whose evaluation is missing): each can follow it.
RESULTS_REMEDY = "move it away and evaluate again (patjax-evaluate --overwrite replaces it)"
PER_IMAGE_REMEDY = "evaluate the run again"


def read_results(workdir: str, step: Optional[int] = None, name: Optional[str] = None) -> Optional[dict]:
    """eval/results.json (curve/step_N/ with a step, the evaluation named `name` with one), or
    None if there is none; an unreadable one is a UserError. What it holds is checked where its
    figures are read (`load_results`): the replacement check reads older files too, comparing the
    settings they record."""
    return read_results_file(results_path(workdir, step, name))


def load_results(workdir: str, step: Optional[int] = None, name: Optional[str] = None):
    """(results dict, per-image arrays) of the workdir's evaluation (of step `step`'s kept model;
    the one named `name`), each file read defensively and checked to hold what its readers index,
    and the two checked to belong together: whatever is wrong with them is one line naming the file."""
    folder = eval_dir(workdir, step, name)
    results = read_results(workdir, step, name)
    if results is None:
        raise UserError(
            f"no evaluation in {folder!r}; run python -m patjax.evaluate --workdir={workdir}"
            + (f" --step={step}" if step is not None else "")
        )
    check_results(results, os.path.join(folder, "results.json"), RESULTS_REMEDY)
    npz = os.path.join(folder, "per_image.npz")
    per_image = read_npz(npz, PER_IMAGE_REMEDY)
    if per_image is None:
        raise UserError(f"{npz}: no such file (results.json's per-image outcomes); {PER_IMAGE_REMEDY}")
    check_per_image(results, per_image, folder)
    return results, per_image


# ---------------------------------------------------------------------------------------
# Evaluations kept side by side. The first evaluation of a folder (a workdir, a model file's
# out_dir) goes to eval/, where the suites, the learning curves and earlier versions read it;
# every evaluation under another name to evals/NAME/. A name is the user's (--eval_name) or
# one derived from the settings that tell evaluations of one model apart (`derived_name`);
# results.json records it.
NAME_KEY = "eval_name"
NAMED_DIR = "evals"
# results.json's sha256 of the evaluated parameters (`evaluation.weights_digest`): a saved
# evaluation is reused only for the same weights.
WEIGHTS_KEY = "weights_sha256"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._=+-]{0,99}")


def check_name(name: str) -> str:
    """Returns `name` if it can name an evaluation's folder, else raises UserError."""
    if not _NAME.fullmatch(name):
        raise UserError(f"--eval_name={name!r}: a name is at most 100 letters, digits and . _ = + - (a folder's name)")
    return name


def derived_name(settings: dict) -> str:
    """An evaluation's name from its settings (results.json's): the part of each evaluator that
    ran, from the settings it reads (`evaluators.labels`: the attacks' threat model and radius,
    an L-inf one as k_255; the headline PR's preset, or its law and radii; CERTIFY's sigma and
    n), then the number of images: linf-8_255.table1.n500, l2-0.5.n500 (clean and PGD-20),
    certify-sigma0.25-N100000.n500; the evaluators' names where none of them has a part."""
    parts = evaluators.labels(settings)[0] or ["-".join(settings.get("evaluators") or ())]
    if "num_examples" in settings:
        parts.append(f"n{settings['num_examples']}")
    return ".".join(p for p in parts if p) or "eval"


def name_of(results: dict) -> str:
    """The name of the evaluation results.json holds: the one it records, else its settings'."""
    recorded = results.get(NAME_KEY)
    settings = results.get("settings")
    return recorded if isinstance(recorded, str) else derived_name(settings if isinstance(settings, dict) else {})


def evaluations(directory: str, asked: Optional[str] = None) -> list:
    """(name, folder, results.json) of every evaluation kept in `directory`: eval/'s, then those
    of evals/ by name. A damaged results.json (cut short, not JSON) is said in one warning line and
    skipped, its files left as they are, so that one bad evaluation does not block the others;
    the one `asked` for by name (evals/ASKED/) is refused in that line instead."""
    named = os.path.join(directory, NAMED_DIR)
    found = []
    first = _readable(os.path.join(directory, "eval", "results.json"))
    if first is not None:
        found.append((name_of(first), os.path.join(directory, "eval"), first))
    for name in sorted(os.listdir(named)) if os.path.isdir(named) else ():
        results = _readable(os.path.join(named, name, "results.json"), refuse=name == asked)
        if results is not None and not any(name == n for n, _, _ in found):
            found.append((name, os.path.join(named, name), results))
    return found


_SKIPPED: set = set()  # the damaged files already said, each said once a process


def _readable(path: str, refuse: bool = False) -> Optional[dict]:
    """`read_results_file`, or None (said once on stderr) for a damaged file, unless `refuse`."""
    try:
        return read_results_file(path)
    except UserError as error:
        if refuse:
            raise
        if path not in _SKIPPED:
            _SKIPPED.add(path)
            print(f"warning: skipped: {error}", file=sys.stderr, flush=True)
        return None


def named_dir(directory: str, name: str) -> str:
    """The folder of the evaluation named `name` in `directory`, or where a new one goes: eval/
    while no evaluation is there, else evals/NAME/."""
    for kept, folder, _ in evaluations(directory, asked=name):
        if kept == name:
            return folder
    free = not os.path.isfile(os.path.join(directory, "eval", "results.json"))
    return os.path.join(directory, "eval") if free else os.path.join(directory, NAMED_DIR, name)


def reusable(directory: str, planned: dict, record: Optional[dict] = None, name: Optional[str] = None):
    """The name of a saved evaluation in `directory` (the one named `name` with one) that holds
    what an evaluation with `planned` settings of the model `record` describes would compute
    (`covers`), with both its files; else None."""
    for kept, folder, results in evaluations(directory, asked=name):
        settings = results.get("settings")
        if (
            (name is None or kept == name)
            and isinstance(settings, dict)
            and eval_settings.covers(settings, planned)
            and not recorded_differences(results, record or {})
            and os.path.isfile(os.path.join(folder, "per_image.npz"))
        ):
            return kept
    return None


# results.json's {evaluator: the saved evaluation whose per-image outcomes it took}.
REUSED_KEY = "reused_from"


def ran(settings: dict) -> list:
    """The evaluators an evaluation with these settings (results.json's) ran: those it lists,
    and the clean pass that PR's clean-correct subset made it run beside them."""
    names = list(settings.get("evaluators") or ())
    needs_clean = any(evaluators.REGISTRY[e].needs_clean for e in names if e in evaluators.REGISTRY)
    return names + (["clean"] if needs_clean and "clean" not in names else [])


def reusable_evaluators(directory: str, planned: dict, record: dict, wanted) -> dict:
    """{evaluator: name of a saved evaluation in `directory` whose outcomes of it this one may
    take}: for each evaluator of `wanted`, the first evaluation (`evaluations`' order) of the same
    model (`record`'s entries, its weights' sha256 among them), with both files, that ran it on
    the same images with the same view of the settings (`eval_settings.same_view` on its
    `view_paths`). An L2 evaluation after an L-inf one takes PR and clean accuracy from it;
    PRBench's radii take PGD-20."""
    found = {}
    for kept, folder, results in evaluations(directory):
        settings = results.get("settings")
        if (
            not isinstance(settings, dict)
            or recorded_differences(results, record)
            or not os.path.isfile(os.path.join(folder, "per_image.npz"))
        ):
            continue
        for name in wanted:
            view = evaluators.REGISTRY[name].view_paths()
            if name not in found and name in ran(settings) and eval_settings.same_view(settings, planned, view):
                found[name] = kept
    return found


def evaluator_outcomes(per_image: dict, evaluator, passes) -> dict:
    """{pass: {output: per-image array}} of `evaluator`'s passes, from per_image.npz's arrays
    (`load_results`), as `evaluation.evaluate_state` holds them before combining."""
    out = {}
    for name in passes:
        prefix = f"{name}."
        out[name] = {k[len(prefix) :]: v for k, v in per_image.items() if k.startswith(prefix)}
    return out


def chosen(directory: str, name: Optional[str] = None) -> Optional[str]:
    """The name of the evaluation of `directory` a reader takes: the one named `name`, else its
    only one; None where evals/ does not exist (eval/ alone, as before evaluations had names).
    Raises UserError, naming those there are, where the name is not there or several are."""
    if name is None and not os.path.isdir(os.path.join(directory, NAMED_DIR)):
        return None
    names = [kept for kept, _, _ in evaluations(directory, asked=name)]
    if name is None and len(names) <= 1:
        return names[0] if names else None
    if name in names:
        return name
    if name is None:
        raise UserError(f"{directory} holds {len(names)} evaluations ({', '.join(names)}): name one with --eval_name")
    raise UserError(f"{directory} holds no evaluation named {name!r}; it holds {', '.join(names) or 'none'}")
