"""Every registered name has its docs entry and a test that uses it, where the recipes of
docs/architecture.md ("Adding an attack, a method, an evaluator, a model or a noise law") put them; the
PyTorch name map covers exactly the networks with a PyTorch twin."""

import ast

import pytest
from conftest import REPO

from patjax import evaluators, methods
from patjax.interop import torch_names
from patjax.models import networks
from patjax.pat import laws

# kind: (its registry's names, the docs file whose table has a row per name, the test files one
# of which must have a test that uses it, the module whose attributes the registered objects are).
KINDS = {
    "model": (tuple(networks.MODELS), "docs/api.md", ("tests/models/test_models.py",), "models"),
    "method": (
        tuple(methods.REGISTRY),
        "docs/baselines.md",
        ("tests/methods/test_baselines.py", "tests/methods/test_methods.py"),
        "methods",
    ),
    "evaluator": (
        evaluators.NAMES,
        "docs/evaluation.md",
        (
            "tests/run/test_evaluation.py",
            *sorted(str(p.relative_to(REPO)) for p in (REPO / "tests" / "evaluators").glob("test_*.py")),
        ),
        "evaluators",
    ),
    "law": (laws.names(), "docs/evaluation.md", ("tests/pat/test_robustness.py",), "laws"),
}
CASES = [(kind, name) for kind, (names, *_) in KINDS.items() for name in names]


def first_cells(doc: str) -> str:
    """The first cells of the doc's table rows, where a row names what it documents."""
    rows = [line for line in (REPO / doc).read_text().splitlines() if line.startswith("| ")]
    return "\n".join(row.split("|")[1] for row in rows)


def uses_of_tests(source: str, module: str) -> dict[str, set[str]]:
    """For each test function of a test file's source: the names it uses, i.e. the strings in its
    body and its decorators (a parametrize list), also those of the module-level constants that
    they read (a list of cases), and the attributes of `module` it reads (`methods.pat.pat(...)`
    calls the registered function by its name). A comment, a docstring, a helper function or a
    list that no test reads is no test's."""
    tree = ast.parse(source)
    constants = {
        target.id: node.value
        for node in tree.body
        if isinstance(node, ast.Assign)
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    uses = {}
    for node in tree.body:
        if not (isinstance(node, ast.FunctionDef) and node.name.startswith("test")):
            continue
        body = node.body[1:] if ast.get_docstring(node) is not None else node.body
        todo, seen, used = [*body, *node.decorator_list], set(), set()
        while todo:
            for sub in ast.walk(todo.pop()):
                if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
                    used.add(sub.value)
                elif isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name) and sub.value.id == module:
                    used.add(sub.attr)
                elif isinstance(sub, ast.Name) and sub.id in constants and sub.id not in seen:
                    seen.add(sub.id)
                    todo.append(constants[sub.id])
        uses[node.name] = used
    return uses


def users_of(name: str, names, uses: dict[str, set[str]]) -> list[str]:
    """The tests (of `uses`) that use `name`, leaving out a test that uses every registered name
    at once: it checks the registry's list, not what any one of them does."""
    return [test for test, used in uses.items() if name in used and not set(names) <= used]


@pytest.mark.parametrize("kind,name", CASES, ids=[f"{k}:{n}" for k, n in CASES])
def test_every_registered_name_has_its_docs_row_and_a_test(kind, name):
    names, doc, test_files, module = KINDS[kind]
    assert f"`{name}`" in first_cells(doc), f"{doc} has no table row for the {kind} `{name}`"
    uses = {f"{f}::{t}": u for f in test_files for t, u in uses_of_tests((REPO / f).read_text(), module).items()}
    assert users_of(name, names, uses), f"no test in {test_files} uses the {kind} {name!r}"


CHECKED = '''
CASES = [("b", 1)]
UNREAD = ["e", "f"]
MORE = CASES + [("h", 2)]
# "f": a comment is no test


def reference(name):
    return name == "g"


@pytest.mark.parametrize("name,n", MORE)
def test_one(name, n):
    """f"""
    assert run("a") and models.c(1) and other.i


def test_the_list():
    assert set(models.MODELS) == {"a", "b", "c", "e", "g"}
'''


def test_a_name_counts_in_a_tests_body_or_cases_not_in_a_comment_a_helper_or_the_registrys_list():
    uses = uses_of_tests(CHECKED, "models")
    assert uses["test_one"] == {"name,n", "a", "b", "c", "h"}  # not i: another module's attribute
    assert uses["test_the_list"] == {"MODELS", "a", "b", "c", "e", "g"}
    assert not any("f" in used for used in uses.values())  # an unread list, a comment, a docstring
    # e is in the unread list and the registry's test alone, g in the registry's test and a helper.
    registry = ("a", "b", "c", "e", "g")
    assert {n: users_of(n, registry, uses) for n in registry} == {
        "a": ["test_one"],
        "b": ["test_one"],
        "c": ["test_one"],
        "e": [],
        "g": [],
    }


def test_the_pytorch_name_map_covers_exactly_the_networks_with_a_pytorch_twin():
    """patjax_torch/models.py's MODELS keys, read from its source (it needs torch to import)."""
    tree = ast.parse((REPO / "patjax_torch" / "models.py").read_text())
    (twins,) = [node.value for node in tree.body if isinstance(node, ast.Assign) and node.targets[0].id == "MODELS"]
    assert set(torch_names.MODULE_NAMES) == {key.value for key in twins.keys}
    assert set(torch_names.MODULE_NAMES) <= set(networks.MODELS)
