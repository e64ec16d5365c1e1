"""Every registered name has its docs entry and a test that names it, where the recipes of
docs/architecture.md ("Adding an attack, a method, an evaluator or a model") put them; the
PyTorch name map covers exactly the networks with a PyTorch twin."""

import ast
import re

import pytest
from conftest import REPO

from patjax import evaluators
from patjax.compute import methods, models
from patjax.run import torch_weights

# kind: (its registry's names, the docs file whose table has a row per name, the test files one
# of which must name it in quotes).
KINDS = {
    "model": (tuple(models.MODELS), "docs/api.md", ("tests/test_models.py",)),
    "method": (tuple(methods.METHODS), "docs/baselines.md", ("tests/test_baselines.py", "tests/test_methods.py")),
    "evaluator": (evaluators.NAMES, "docs/evaluation.md", ("tests/test_evaluation.py",)),
}
CASES = [(kind, name) for kind, (names, _, _) in KINDS.items() for name in names]


def first_cells(doc: str) -> str:
    """The first cells of the doc's table rows, where a row names what it documents."""
    rows = [line for line in (REPO / doc).read_text().splitlines() if line.startswith("| ")]
    return "\n".join(row.split("|")[1] for row in rows)


@pytest.mark.parametrize("kind,name", CASES, ids=[f"{k}:{n}" for k, n in CASES])
def test_every_registered_name_has_its_docs_row_and_a_test(kind, name):
    _, doc, test_files = KINDS[kind]
    assert f"`{name}`" in first_cells(doc), f"{doc} has no table row for the {kind} `{name}`"
    quoted = re.compile(rf"[\"']{re.escape(name)}[\"']")
    assert any(quoted.search((REPO / f).read_text()) for f in test_files), f"no test in {test_files} names {name!r}"


def test_the_pytorch_name_map_covers_exactly_the_networks_with_a_pytorch_twin():
    """patjax_torch/models.py's MODELS keys, read from its source (it needs torch to import)."""
    tree = ast.parse((REPO / "patjax_torch" / "models.py").read_text())
    (twins,) = [node.value for node in tree.body if isinstance(node, ast.Assign) and node.targets[0].id == "MODELS"]
    assert set(torch_weights.MODULE_NAMES) == {key.value for key in twins.keys}
    assert set(torch_weights.MODULE_NAMES) <= set(models.MODELS)
