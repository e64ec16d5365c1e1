"""The layering of docs/architecture.md: imports go downward only and sit at module top."""

import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "patjax"

LAYERS = {  # lower number = lower layer; a module may import its own layer or below
    "errors": 0,
    "files": 0,
    "locks": 0,
    "cli": 0,
    "provenance": 0,
    "logits": 0,
    "ops": 1,
    "stats": 1,
    "download": 1,
    "data": 1,
    "samplers": 1,
    "attacks": 1,
    "square": 1,
    "fab": 1,
    "robustness": 1,
    "models": 2,
    "methods": 2,
    "sampler_diagnostic": 2,
    "state": 4,
    "sharding": 4,
    "kept_models": 4,
    "torch_weights": 4,
    "zoo": 4,
    "checkpoints": 4,
    "eval_files": 4,
    "evaluators": 5,
    "evaluators.common": 5,
    "evaluators.clean": 5,
    "evaluators.attack": 5,
    "evaluators.apgd": 5,
    "evaluators.autoattack": 5,
    "plots": 5,
    "evaluators.pr": 5,
    "report": 5,
    "config": 6,
    "workdir": 6,
    "evaluation": 7,
    "api": 7,
    "train": 8,
    "suites": 9,
    "suite_catalog": 9,
    "suite_results": 9,
    "suite_report": 9,
    "suite_outcomes": 9,
    "suite_curves": 9,
    "runner": 9,
    "workers": 9,
    "evaluate": 10,
    "experiments": 10,
    "diagnose": 10,
    "export": 10,
    "main": 10,
    # The shipped config files: where a config is built, read by the command line that names them.
    "configs": 10,
    "configs.quickstart": 10,
    "configs.pat_cifar10": 10,
    "configs.pat_cifar100": 10,
}
COMMAND_LINES = ("evaluate", "experiments", "diagnose", "export", "main")


def module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_imports(tree):
    """(module imported, at module top?) for every patjax import in the tree."""
    top = {id(node) for node in tree.body}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "patjax":
            package = node.module.split(".")[1:]
            if not package or package == ["evaluators"]:  # from patjax[.evaluators] import NAME
                prefix = ".".join(package)
                names = [f"{prefix}.{a.name}" if prefix else a.name for a in node.names]
            else:
                names = [".".join(package)]
            for name in names:
                yield name, id(node) in top
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("patjax."):
                    yield a.name.split(".", 1)[1], id(node) in top


def modules():
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py")) if module_name(p)}


def test_every_module_is_placed_in_a_layer():
    assert set(modules()) == set(LAYERS), set(modules()) ^ set(LAYERS)


def test_imports_go_downward_and_sit_at_module_top():
    problems = []
    for name, path in modules().items():
        for imported, at_top in project_imports(ast.parse(path.read_text())):
            if not at_top:
                problems.append(f"{name} imports {imported} inside a function")
            if LAYERS[imported] > LAYERS[name]:
                problems.append(f"{name} (layer {LAYERS[name]}) imports {imported} (layer {LAYERS[imported]})")
    assert not problems, "\n".join(problems)


def test_evaluators_and_below_import_no_files_reports_or_command_lines():
    """An evaluator is arrays and settings in, figures out: it reads no config or workdir,
    formats nothing and knows no command line; nothing below it does either."""
    problems = []
    for name, path in modules().items():
        if name.startswith("evaluators"):
            forbidden = {"config", "workdir", "report", *COMMAND_LINES}
        elif LAYERS[name] <= LAYERS["evaluators"] and name not in ("report", "plots"):
            forbidden = {"report", *COMMAND_LINES}
        else:
            continue
        problems += [
            f"{name} imports {imported}"
            for imported, _ in project_imports(ast.parse(path.read_text()))
            if imported in forbidden
        ]
    assert not problems, "\n".join(problems)


def test_the_import_checker_sees_every_import_form():
    tree = ast.parse(
        "from patjax import a, b as c\nfrom patjax.evaluators import pr\nimport patjax.x\n"
        "from patjax.workdir import f\ndef g():\n    from patjax import late\n"
    )
    assert sorted(project_imports(tree)) == sorted(
        [("a", True), ("b", True), ("evaluators.pr", True), ("x", True), ("workdir", True), ("late", False)]
    )


def test_only_the_config_and_the_layers_that_take_it_in_import_ml_collections():
    """The config enters at the command lines and the suites, and `config` defines it; below
    them typed settings travel (config.TrainSettings, config.EvaluationSettings)."""
    importers = set()
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            if any(n.split(".")[0] == "ml_collections" for n in names):
                importers.add(name)
    assert importers, "the checker found no importer at all"
    assert {n for n in importers if n != "config" and LAYERS[n] < LAYERS["runner"]} == set()


def test_below_the_runner_only_config_and_workdir_hold_a_config():
    """`config` turns a ConfigDict into settings and `workdir` reads a run's config.json; every
    other module below the suites takes typed settings: it names no `cfg`, builds no config
    and reads none from a workdir."""
    problems = []
    for name, path in modules().items():
        if name in ("config", "workdir") or LAYERS[name] >= LAYERS["runner"]:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Name) and node.id == "cfg" or isinstance(node, ast.arg) and node.arg == "cfg":
                problems.append(f"{name}:{node.lineno} holds a config (cfg)")
            if isinstance(node, ast.Attribute) and node.attr in ("load_config", "default_config", "upgrade"):
                problems.append(f"{name}:{node.lineno} calls {node.attr}")
    assert not problems, "\n".join(problems)
