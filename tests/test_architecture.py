"""The layering of docs/architecture.md: the folders under patjax/ are the layers, imports go
downward only (between folders and between modules) and sit at module top."""

import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "patjax"

# A folder may import its own folder and the folders below it; the doors sit above them all.
FOLDERS = ("core", "data", "models", "attacks", "pat", "methods", "evaluators", "reporting", "run", "interop", "suites")
DOORS = ("api", "main", "evaluate", "experiments", "diagnose", "export", "configs")  # patjax.X as users name it
LEVEL = {**{f: i for i, f in enumerate(FOLDERS)}, **{d: len(FOLDERS) for d in DOORS}}


def module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def unit(module: str) -> str:
    """The folder (or door) a module belongs to."""
    return module.split(".")[0]


def package_of(path: pathlib.Path) -> str:
    """The absolute package a module's relative imports start from (`patjax.data` for
    patjax/data/cifar.py and patjax/data/__init__.py alike)."""
    return ".".join(("patjax",) + path.parent.relative_to(PACKAGE).parts)


def absolute_module(node: ast.ImportFrom, package: str) -> str | None:
    """The module `from ... import` names, its dots resolved against the importing module's
    package as Python does: `from ..run import x` in patjax.data is `patjax.run`."""
    if not node.level:
        return node.module
    parts = package.split(".") if package else []
    if node.level - 1 >= len(parts):  # above patjax itself: Python refuses it, and so does the check
        return "patjax.<above the package>"
    base = parts[: len(parts) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else [])) or None


def project_imports(tree, package: str = ""):
    """(module imported, at module top?) for every patjax import in the tree, relative imports
    of a module in `package` included."""
    top = {id(node) for node in tree.body}
    for node in ast.walk(tree):
        absolute = absolute_module(node, package) if isinstance(node, ast.ImportFrom) else None
        if absolute and absolute.split(".")[0] == "patjax":
            package_name = ".".join(absolute.split(".")[1:])
            for a in node.names:
                # `from patjax.P import N` names module P.N when P.N is a module, else P's attribute N.
                name = f"{package_name}.{a.name}" if package_name else a.name
                yield (name if name in MODULES or not package_name else package_name), id(node) in top
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("patjax."):
                    yield a.name.split(".", 1)[1], id(node) in top


def modules():
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py")) if module_name(p)}


MODULES = modules()


def import_graph():
    return {
        name: sorted({i for i, _ in project_imports(ast.parse(path.read_text()), package_of(path)) if i != name})
        for name, path in MODULES.items()
    }


def test_the_top_of_the_package_is_the_layers_and_the_doors():
    entries = {p.stem for p in PACKAGE.iterdir() if p.name != "__init__.py" and p.name != "__pycache__"}
    assert entries == set(FOLDERS) | set(DOORS), entries ^ (set(FOLDERS) | set(DOORS))
    for folder in FOLDERS + ("configs",):
        assert (PACKAGE / folder).is_dir(), folder
    for door in DOORS[:-1]:
        assert (PACKAGE / f"{door}.py").is_file(), door


def test_each_folder_says_in_two_lines_what_it_holds_and_what_it_may_import():
    for folder in FOLDERS:
        doc = ast.get_docstring(ast.parse((PACKAGE / folder / "__init__.py").read_text()))
        first = doc.split("\n\n")[0].splitlines()
        assert len(first) == 2, (folder, first)
        below, above = FOLDERS[: FOLDERS.index(folder)], FOLDERS[FOLDERS.index(folder) + 1 :]
        said = " ".join(first)
        assert "Import" in said, folder
        assert [f for f in below if f"`{f}`" not in said] == [], (folder, said)  # every folder it may import
        assert [f for f in above if f"`{f}`" in said] == [], (folder, said)  # and none it may not


def test_imports_go_downward_between_folders_and_sit_at_module_top():
    problems = []
    for name, path in MODULES.items():
        for imported, at_top in project_imports(ast.parse(path.read_text()), package_of(path)):
            if not at_top:
                problems.append(f"{name} imports {imported} inside a function")
            if imported not in MODULES:
                problems.append(f"{name} imports {imported}, which is not a module of patjax")
            elif LEVEL[unit(imported)] > LEVEL[unit(name)]:
                problems.append(f"{name} ({unit(name)}) imports {imported} ({unit(imported)}), a layer above")
            elif unit(name) in DOORS and unit(imported) in DOORS and unit(name) != unit(imported):
                # The doors stand side by side; they may read the shipped descriptions (configs: the
                # training configs, the suites) and the library's API, not one another.
                if unit(imported) not in ("configs", "api"):
                    problems.append(f"the door {name} imports the door {imported}")
    assert not problems, "\n".join(problems)


def test_modules_import_one_another_without_a_cycle():
    graph, state, cycles = import_graph(), {}, []

    def visit(node, path):
        state[node] = "open"
        for nxt in graph.get(node, []):
            if state.get(nxt) == "open":
                cycles.append(" -> ".join(path[path.index(nxt) :] + [nxt]) if nxt in path else f"{node} -> {nxt}")
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = "done"

    for node in graph:
        if node not in state:
            visit(node, [node])
    assert not cycles, "\n".join(cycles)


def test_the_checker_sees_every_import_form_and_a_cycle():
    tree = ast.parse(
        "from patjax import api, b as c\nfrom patjax.evaluators import pr\nimport patjax.x\n"
        "from patjax.run.workdir import f\nfrom patjax.data import cifar\ndef g():\n    from patjax import late\n"
    )
    assert sorted(project_imports(tree)) == sorted(
        [
            ("api", True),
            ("b", True),
            ("evaluators.pr", True),
            ("x", True),
            ("run.workdir", True),
            ("data.cifar", True),
            ("late", False),
        ]
    )


def test_the_checker_resolves_relative_imports_as_python_does():
    """A relative import is held to the layers as its absolute spelling is: `from ..run import
    config` in patjax/data/ reaches up to run as `from patjax.run import config` does."""
    tree = ast.parse(
        "from ..run import config\nfrom . import cifar\nfrom .download import f\nfrom .. import api\n"
        "from ..evaluators.pr import g\nimport numpy\nfrom .. import numpy_thing as n\n"
    )
    # In patjax/data/: `.` is patjax.data and `..` is patjax, the package's top.
    assert sorted(project_imports(tree, "patjax.data")) == sorted(
        [
            ("run.config", True),
            ("data.cifar", True),
            ("data.download", True),
            ("api", True),
            ("evaluators.pr", True),
            ("numpy_thing", True),
        ]
    )
    # In patjax/run/ the same dots land one folder over.
    assert ("run.config", True) in list(project_imports(ast.parse("from . import config"), "patjax.run"))
    # Three dots from patjax/data/ leave the package: Python refuses it and so does the check.
    beyond = list(project_imports(ast.parse("from ...elsewhere import x"), "patjax.data"))
    assert [m for m, _ in beyond if m in MODULES] == [] and len(beyond) == 1
    # The packages the real modules import from: a module and its folder's __init__ share one.
    assert package_of(PACKAGE / "evaluators" / "stats.py") == "patjax.evaluators"
    assert package_of(PACKAGE / "evaluators" / "__init__.py") == "patjax.evaluators"
    assert package_of(PACKAGE / "api.py") == "patjax"


def test_evaluators_and_below_import_no_files_reports_or_command_lines():
    """An evaluator is arrays and settings in, figures out: it reads no config or workdir,
    formats nothing and knows no command line; nothing below it does either (the folders say
    so); and no module but a door imports the doors' shared flags."""
    problems = []
    for name, path in MODULES.items():
        for imported, _ in project_imports(ast.parse(path.read_text()), package_of(path)):
            if LEVEL[unit(name)] <= LEVEL["evaluators"] and unit(imported) not in FOLDERS[: LEVEL["evaluators"] + 1]:
                problems.append(f"{name} imports {imported}")
            if imported == "core.cli" and unit(name) not in DOORS:
                problems.append(f"{name} imports the command lines' core.cli")
    assert not problems, "\n".join(problems)


def test_only_the_config_and_the_layers_that_take_it_in_import_ml_collections():
    """The config enters at the command lines and the suites, and `run.config` defines it;
    below them typed settings travel (settings.TrainSettings, settings.EvaluationSettings)."""
    importers = set()
    for name, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            if any(n.split(".")[0] == "ml_collections" for n in names):
                importers.add(name)
    assert importers, "the checker found no importer at all"
    assert {n for n in importers if n != "run.config" and LEVEL[unit(n)] < LEVEL["suites"]} == set()


def test_below_the_suites_only_config_and_workdir_hold_a_config():
    """`run.config` turns a ConfigDict into settings and `run.workdir` reads a run's
    config.json; every other module below the suites takes typed settings: it names no `cfg`,
    builds no config and reads none from a workdir."""
    problems = []
    for name, path in MODULES.items():
        if name in ("run.config", "run.workdir") or LEVEL[unit(name)] >= LEVEL["suites"]:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Name) and node.id == "cfg" or isinstance(node, ast.arg) and node.arg == "cfg":
                problems.append(f"{name}:{node.lineno} holds a config (cfg)")
            if isinstance(node, ast.Attribute) and node.attr in ("load_config", "default_config", "upgrade"):
                problems.append(f"{name}:{node.lineno} calls {node.attr}")
    assert not problems, "\n".join(problems)


def test_each_command_line_door_is_at_most_250_lines():
    """A door parses flags and hands off: its work belongs in the layers, where it is tested and reused."""
    doors = [PACKAGE / f"{d}.py" for d in DOORS if d != "api" and (PACKAGE / f"{d}.py").is_file()]
    lengths = {path.stem: len(path.read_text().splitlines()) for path in doors}
    assert {door: n for door, n in lengths.items() if n > 250} == {}
