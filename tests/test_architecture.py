"""The layering of docs/architecture.md: imports go downward only and sit at module top."""
import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "patjax"

LAYERS = {  # lower number = lower layer; a module may import its own layer or below
    "errors": 0, "cli": 0,
    "ops": 1, "stats": 1, "data": 1, "samplers": 1, "attacks": 1, "robustness": 1,
    "models": 2, "methods": 2,
    "config": 3,
    "state": 4, "sharding": 4, "workdir": 4,
    "evaluate": 5, "diagnose": 6, "train": 6,
    "experiments": 7,
}


def project_imports(tree):
    """(module imported, at module top?) for every patjax import in the tree."""
    top = {id(node) for node in tree.body}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "patjax":
            names = [a.name for a in node.names] if node.module == "patjax" else [node.module.split(".")[1]]
            for name in names:
                yield name, id(node) in top
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("patjax."):
                    yield a.name.split(".")[1], id(node) in top


def test_every_module_is_placed_in_a_layer():
    modules = {p.stem for p in PACKAGE.glob("*.py")} - {"__init__"}
    assert modules == set(LAYERS), modules ^ set(LAYERS)


def test_imports_go_downward_and_sit_at_module_top():
    problems = []
    for path in sorted(PACKAGE.glob("*.py")):
        if path.stem == "__init__":
            continue
        for name, at_top in project_imports(ast.parse(path.read_text())):
            if not at_top:
                problems.append(f"{path.stem} imports {name} inside a function")
            if LAYERS[name] > LAYERS[path.stem]:
                problems.append(f"{path.stem} (layer {LAYERS[path.stem]}) imports {name} (layer {LAYERS[name]})")
    assert not problems, "\n".join(problems)
